"""The clinic's two records: an `Entry` (one error, how to make it happen, how to fix it) and the
`Case` that running it returns (what the library really printed, and what the fix printed).

Where the library raises or warns, the message is never a copy: the trigger calls the real library and
catches what it raises or warns, so a ``Case`` shows the text of the torch (or DeepSpeed) installed here.
A quiet failure's message is labkit's summary of what the run did.
"""

from __future__ import annotations

import html
import textwrap
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from labkit._validate import shown
from labkit.train.torch.threads import one_thread

NO_ERROR = "(no error: the library did not raise)"
"""What `raised` returns when the call went through: a Case whose message says this did not reproduce."""


@dataclass(frozen=True)
class Case:
    """What one clinic entry printed here: the trigger, the library's own `message`, the fix and
    its `fixed_output`, and `why`. ``reproduced``: the message holds the entry's stable substring
    (False means this library version no longer fails that way). ``versions``: the libraries that
    printed it (kept out of ``str()``, so the printed case reads the same on every machine).
    ``verdict``: for an entry whose figures are this machine's (``Entry.portable`` False), the
    `labkit.checks` line(s) that read the same wherever the lesson holds; None otherwise.

    It prints as labelled lines (``str()``) and renders in a notebook as a table (``_repr_html_``),
    the message and the fix's output kept verbatim, line breaks and all."""

    name: str
    trigger: str
    message: str
    fix: str
    fixed_output: str
    why: str
    reproduced: bool = True
    versions: str = ""
    verdict: object = None

    def __post_init__(self):
        from labkit.checks import Check, Report

        _texts(self, ("name", "trigger", "message", "fix", "fixed_output", "why", "versions"))
        _flag("reproduced", self.reproduced)
        if self.verdict is not None and not isinstance(self.verdict, (Check, Report)):
            raise TypeError(f"verdict must be None or a labkit.checks Check or Report; got "
                            f"{type(self.verdict).__name__} {shown(self.verdict)}")

    def __str__(self) -> str:
        def block(label: str, text: str) -> str:
            lines = text.splitlines() or [""]
            return "\n".join([f"{label:<9}{lines[0]}"] + [" " * 9 + ln for ln in lines[1:]])

        why = textwrap.fill(self.why, width=91)
        mark = "" if self.reproduced else "  (did not reproduce with this version)"
        return "\n".join([f"{self.name}{mark}", block("trigger", self.trigger), block("message", self.message),
                          block("fix", self.fix), block("output", self.fixed_output), block("why", why)])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        left = "text-align:left;vertical-align:top;padding:2px 8px"
        pre = "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;margin:0;padding:2px 6px;" \
              "border-left:3px solid {}"

        def row(label: str, body: str) -> str:
            return f'<tr><th style="{left}">{label}</th><td style="{left}">{body}</td></tr>'

        mark = " <i>(did not reproduce with this version)</i>" if not self.reproduced else ""
        return (f'<div><b><code>{esc(self.name)}</code></b>{mark}<table style="margin-left:0">'
                + row("trigger", f"<code>{esc(self.trigger)}</code>")
                + row("message", f'<pre style="{pre.format("#cf222e")}">{esc(self.message)}</pre>')
                + row("fix", f"<code>{esc(self.fix)}</code>")
                + row("output", f'<pre style="{pre.format("#1a7f37")}">{esc(self.fixed_output)}</pre>')
                + row("why", esc(self.why)) + "</table></div>")


@dataclass(frozen=True)
class Entry:
    """One error of the clinic: `symptom` (what a learner sees), `expect` (the stable part of the
    library's message, which the trigger's message must hold), the `trigger` and `fix` as one line of
    code each, and `why`. ``portable``: False when the printed figures depend on this machine's
    kernels or clock (a notebook tags that cell ``nbval-ignore-output``); such an entry has a
    `verdict`, a function of no arguments that returns the `labkit.checks` line(s) checking its
    lesson on the figures the run just printed (the notebook's next cell shows ``case.verdict``).
    ``run()`` calls the real library and returns the `Case`."""

    name: str
    symptom: str
    expect: str
    trigger: str
    fix: str
    why: str
    run_trigger: Callable[[], str] = field(repr=False, compare=False)
    run_fix: Callable[[], str] = field(repr=False, compare=False)
    portable: bool = True
    verdict: Callable[[], object] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        _texts(self, ("name", "symptom", "expect", "trigger", "fix", "why"))
        for name in ("run_trigger", "run_fix"):
            if not callable(getattr(self, name)):
                raise TypeError(f"{name} must be a function of no arguments returning text; got "
                                f"{type(getattr(self, name)).__name__} {shown(getattr(self, name))}")
        _flag("portable", self.portable)
        if self.verdict is not None and not callable(self.verdict):
            raise TypeError(f"verdict must be None or a function of no arguments returning a labkit.checks Check "
                            f"or Report; got {type(self.verdict).__name__} {shown(self.verdict)}")
        if not self.portable and self.verdict is None:
            raise ValueError(f"entry {self.name!r} is not portable (its figures are this machine's): give it a "
                             "verdict, the check that reads the same wherever its lesson holds")

    def run(self) -> Case:
        """Trigger, then fix, then (for an entry that is not portable) the verdict on what they printed,
        all on one thread (`labkit.train.torch.threads.one_thread`: the clinic's tensors are tiny)."""
        with one_thread():
            message = self.run_trigger()
            fixed = self.run_fix()
            verdict = None if self.verdict is None else self.verdict()
        return Case(self.name, self.trigger, message, self.fix, fixed, self.why, self.expect in message, versions(),
                    verdict)


def _texts(record, fields) -> None:
    for name in fields:
        value = getattr(record, name)
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string (text); got {type(value).__name__} {shown(value)}")


def _flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {shown(value)}")


def versions() -> str:
    """The libraries whose messages the clinic shows, as installed here (DeepSpeed when it is)."""
    import importlib.metadata as md

    out = [f"torch {torch.__version__}"]
    try:
        out.append(f"deepspeed {md.version('deepspeed')}")
    except md.PackageNotFoundError:
        pass
    return ", ".join(out)


def raised(call: Callable[[], object]) -> str:
    """``"Type: text"`` of the exception `call` raises (stripped), or `NO_ERROR` when it raises none."""
    try:
        call()
    except Exception as err:  # noqa: BLE001 -- the clinic shows whatever the library raises
        return f"{type(err).__name__}: {str(err).strip()}"
    return NO_ERROR


def warned(call: Callable[[], object], contains: str) -> tuple[object, list[str]]:
    """`call`'s result and the texts of the warnings it emitted that contain `contains` (every
    warning is recorded, none printed: pytest's warnings-as-errors and a notebook stay quiet)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in seen if contains in str(w.message)]


def linear(n_in: int, n_out: int, gen: torch.Generator, *, bias: bool = True, std: float | None = None) -> nn.Linear:
    """An ``nn.Linear`` initialised from `gen` (normal, std 1/sqrt(n_in) unless told): the learner's
    global RNG is left alone, and every run of a case starts from the same weights."""
    layer = nn.Linear(n_in, n_out, bias=bias, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=gen) * (n_in ** -0.5 if std is None else std))
        if bias:
            layer.bias.zero_()
    return layer


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

__all__ = ["NO_ERROR", "Case", "Entry"]
