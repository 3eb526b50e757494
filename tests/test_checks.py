"""labkit.checks: the one place the notebooks state and check a claim on this machine."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from labkit import checks

CFG = Path(__file__).resolve().parents[1] / "notebooks" / "nbval_sanitize.cfg"


def sanitize(text: str) -> str:
    """What nbval does with the notebooks' sanitize file (its own parser and re.sub)."""
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns(CFG.read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_a_check_that_holds_and_one_that_fails_read_differently():
    ok, bad = checks.that("x is small", True, "0.1"), checks.that("x is small", False, "9")
    assert str(ok) == "✓ x is small  (here: 0.1)" and bool(ok)
    assert str(bad) == "✗ expected: x is small; saw: 9" and not bad
    assert str(checks.that("no figures", True)) == "✓ no figures"
    assert str(checks.that("no figures", False)) == "✗ expected: no figures"


@pytest.mark.parametrize("value, reference, kw, holds", [
    (1.04, 1.0, dict(rel=0.05), True), (1.06, 1.0, dict(rel=0.05), False), (0.0, 0.005, dict(abs=0.01), True),
    (-1.0, -1.02, dict(rel=0.05), True), (math.nan, 1.0, dict(rel=1.0), False), (math.inf, math.inf, dict(rel=1), False),
    (1.5, 1.0, dict(rel=0.1, abs=0.6), True),
])
def test_close_uses_the_larger_tolerance_and_refuses_non_finite_values(value, reference, kw, holds):
    c = checks.close("c", value, reference, **kw)
    assert c.holds is holds and " vs " in c.seen


def test_bounds_and_equality():
    assert checks.at_most("m", 0.5, 0.55).holds and not checks.at_most("m", 0.56, 0.55).holds
    assert checks.at_least("l", 2, 2).holds and not checks.at_least("l", math.nan, 0).holds
    assert checks.at_least("l", 3.14159, 2, unit="x").seen == "3.14x"
    assert checks.equal("e", np.array([1.0, 2.0]), [1.0, 2.0]).holds
    assert checks.equal("e", (True, False), [True, False]).holds and not checks.equal("e", [1], [2]).holds
    assert checks.that("numpy bools count", np.bool_(True)).holds is True


def test_a_report_shows_one_line_per_check_and_knows_whether_all_hold():
    r = checks.report(checks.that("a", True, "1"), checks.that("b", False, "2"))
    assert str(r) == "✓ a  (here: 1)\n✗ expected: b; saw: 2" and not r.all_hold
    assert checks.report(checks.that("a", True)).all_hold


def test_the_sanitize_file_masks_the_figures_and_keeps_the_verdict():
    here = str(checks.report(checks.close("same loss", 0.0542, 0.0536, rel=0.05), checks.that("fails", False, "3 x")))
    there = str(checks.report(checks.close("same loss", 0.0519, 0.0531, rel=0.05), checks.that("fails", False, "2")))
    assert here != there and sanitize(here) == sanitize(there)
    assert sanitize(here) == "✓ same loss  (here: …)\n✗ expected: fails; saw: …"
    # a claim that holds on one machine and not on another is *not* masked: nbval sees the difference
    assert sanitize(str(checks.close("c", 1.0, 1.0, rel=0.1))) != sanitize(str(checks.close("c", 2.0, 1.0, rel=0.1)))
    # the text of other outputs is left alone
    assert sanitize("loss 0.0542 (here: 3)") == "loss 0.0542 (here: 3)"


def test_the_sanitize_file_holds_the_module_s_patterns():
    from nbval.plugin import get_sanitize_patterns

    assert set(checks.SANITIZE) <= set(get_sanitize_patterns(CFG.read_text()))


@pytest.mark.parametrize("call, error, words", [
    (lambda: checks.that("", True), ValueError, "non-empty"),
    (lambda: checks.that("two\nlines", True), ValueError, "one non-empty line"),
    (lambda: checks.that("c", "yes"), TypeError, "True or False"),
    (lambda: checks.that("c", True, 3), TypeError, "one line of text"),
    (lambda: checks.close("c", "1", 1.0, rel=0.1), TypeError, "value must be a number"),
    (lambda: checks.close("c", 1.0, 1.0), ValueError, "needs a tolerance"),
    (lambda: checks.at_most("c", None, 1), TypeError, "value must be a number"),
    (lambda: checks.report(), TypeError, "one or more Check"),
    (lambda: checks.report("✓ a"), TypeError, "one or more Check"),
])
def test_bad_input_names_what_is_allowed(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_the_sanitize_file_masks_repr_addresses_but_compares_bit_patterns():
    assert sanitize("<Foo object at 0x7f3a2b1c9d10>") == sanitize("<Foo object at 0x55d0c0ffee00>")
    assert sanitize("<function f at 0x7f3a2b1c9d10>") == "<function f at 0xADDRESS>"
    # an fp32 bit pattern is an answer, not an address: 0x33800000 (2^-24) must not pass for 0x33000000
    assert sanitize("fp32 bits 0x33800000") != sanitize("fp32 bits 0x33000000")
