"""Every public labkit callable, fed bad values: it returns, or says clearly what is wrong (issue 12).

Each public function, constructor and method (found from the ``__all__`` of each module: see
tests/_fuzz.py) is called once with known-good arguments, then once per (parameter, bad value) with
one argument replaced by a value from a shared set: None, object(), strings ('x', '', 'no-such-name')
where a number is meant and a number where a string is meant, True/False (not for a bool parameter),
nan, inf, -inf, 1e308, -1, 0, 2.5, 10**400, -10**400, [], [1, 2], a dict, a ragged nested list, an
over-long list (10**5 elements where a sequence is meant, 10**3 elsewhere); and an unknown keyword for
each ``**options``. A callable that draws a figure, builds a widget or runs a model (`_fuzz.HEAVY`) gets
one value of each kind (`_fuzz.QUICK`), to keep the file near a minute.

A call passes when it

* returns -- except that a parameter meaning a size or a count (batch_size, width, steps, bins, n,
  growth_interval, ...: `_fuzz.COUNT`) given 0, a negative, 2.5, nan or a bool must be refused, unless
  `_fuzz.COUNT_OK` says why that value is right there; an unknown keyword must be refused; and a
  callable that starts real work (`_fuzz.BAD_ONLY`) must refuse every bad value; a labkit value it
  returns (a Table) must also print;
* or raises ValueError or TypeError (a subclass is fine) whose message names the parameter: its name
  as written, with spaces or hyphens for underscores, without a plural s, or the word an abbreviation
  stands for (fmt -> format); for a callable of one parameter, a message that says what is allowed
  ("must", "expected", "one of", "choose", "valid", ...) or quotes the string it got is enough
  (`_fuzz.names_param`); and the message is at most `_fuzz.MESSAGE_MAX` characters (not the whole
  over-long value).

Anything else fails: OverflowError, KeyError, AttributeError, ZeroDivisionError, IndexError,
struct.error, MemoryError, RuntimeError, ..., a message that does not name the parameter, or a call
that runs longer than `_fuzz.TIME_LIMIT` seconds. Each call runs in a scratch folder, with output
captured, warnings recorded rather than raised, and figures closed. A call stuck in C code, where the
alarm cannot reach, ends the run after `_fuzz.HARD_LIMIT` seconds: the call is named in
labkit-fuzz-hang.txt in the scratch folder (/tmp/pytest-of-$USER/pytest-current/fuzz0/).

One test per callable; its failure lists every bad call: ``callable(param=value): what is wrong at
file:line -- Exception: message``. For the whole picture (calls made, failures by exception type and
by module, what is not fuzzed and why):

    .venv/bin/python tests/test_public_api_fuzz.py [--out report.txt] [-k substring]

or ``pytest tests/test_public_api_fuzz.py -s``, whose last test prints the same summary (and writes it to
the file named by the environment variable LABKIT_FUZZ_REPORT, if set).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

import _fuzz

TARGETS = _fuzz.discover()
OUTCOMES: list[_fuzz.Outcome] = []


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    return _fuzz.Ctx(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_public_callable_answers_bad_input_with_a_clear_value_or_type_error(target, ctx):
    outcomes = _fuzz.fuzz(target, ctx)
    OUTCOMES.extend(outcomes)
    bad = [o for o in outcomes if o.failed]
    if bad:
        pytest.fail(f"FUZZ: {target.id} handled {len(bad)} of {len(outcomes)} calls badly (the rules: "
                    "tests/test_public_api_fuzz.py):\n  " + "\n  ".join(o.line() for o in bad), pytrace=False)


def test_every_public_callable_is_fuzzed_or_listed_with_a_reason(ctx):
    missing = {k: v for k, v in _fuzz.uncovered(TARGETS, ctx).items() if k not in _fuzz.NOT_CALLED}
    if missing:
        pytest.fail("FUZZ: public callables the fuzz cannot call (give them good values in tests/_fuzz.py, or list "
                    "them in NOT_CALLED with a reason):\n  " + "\n  ".join(f"{k}: {v}" for k, v in sorted(missing.items())),
                    pytrace=False)


def test_the_fuzz_lists_name_only_callables_that_exist():
    ids = {t.id for t in TARGETS}
    named = (set(_fuzz.NOT_CALLED) | set(_fuzz.BAD_ONLY) | set(_fuzz.OTHER_ALLOWED)
             | {k[0] for k in _fuzz.OVERRIDES} | {k[0] for k in _fuzz.COUNT_OK})
    assert named <= ids, f"FUZZ: tests/_fuzz.py names callables that are gone: {sorted(named - ids)}"
    assert TARGETS and all(t.id.startswith("labkit.") for t in TARGETS)


def test_zz_print_the_fuzz_summary(ctx):
    """Last in the file: with -s, prints what the fuzz saw (when the per-callable tests ran before it);
    with LABKIT_FUZZ_REPORT=path in the environment, also writes it there."""
    if not OUTCOMES:
        pytest.skip("no fuzz test ran before this one")
    text = _fuzz.summary(OUTCOMES, TARGETS, _fuzz.uncovered(TARGETS, ctx))
    print("\n" + text)
    if os.environ.get("LABKIT_FUZZ_REPORT"):
        Path(os.environ["LABKIT_FUZZ_REPORT"]).write_text(text + "\n")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the public API fuzz and print its summary.")
    parser.add_argument("--out", help="also write the summary to this file")
    parser.add_argument("-k", default="", help="fuzz only the callables whose id contains this")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    ctx = _fuzz.Ctx(Path(tempfile.mkdtemp(prefix="labkit-fuzz-")))
    targets = [t for t in TARGETS if args.k in t.id]
    outcomes = []
    for t in targets:
        outcomes += _fuzz.fuzz(t, ctx)
    text = _fuzz.summary(outcomes, targets, _fuzz.uncovered(targets, ctx), time.perf_counter() - start)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if any(o.failed for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
