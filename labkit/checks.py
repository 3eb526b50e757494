"""Verdicts: the course's claims, checked on the reader's machine.

A seeded loss, an accuracy, a gradient maximum or a timing depends on the floating-point
kernels of the machine that ran it -- its instruction set, its thread count, its library
build, even the alignment of its arrays -- so the same notebook prints different figures on
different machines. What the course *teaches* from them must not differ. So a notebook shows
such a figure (an output nbval ignores) and then a check: labkit tests the claim on this
machine and prints one line per claim that reads the same wherever the claim holds::

    ✓ bf16 autocast ends within 5% of fp32's loss  (here: 0.0542 vs 0.0536)
    ✗ expected: pure bf16 ends at least 1.5x above fp32's loss; saw: 1.02x

The figures after ``here:`` and ``saw:`` belong to this machine; the notebooks' nbval
sanitize file (``notebooks/nbval_sanitize.cfg``, `SANITIZE`) masks them, so a stored notebook
is compared on the mark and the claim alone. A claim that fails is printed with ✗ and the
figures, never hidden -- and nbval then fails, because the course said something that is not
true here.

>>> print(close("the two runs end at the same loss, within 1%", 0.5005, 0.5, rel=0.01))
✓ the two runs end at the same loss, within 1%  (here: 0.5005 vs 0.5)
>>> print(at_least("pure bf16 ends at least 1.5x above fp32's loss", 1.02, 1.5, unit="x"))
✗ expected: pure bf16 ends at least 1.5x above fp32's loss; saw: 1.02x
>>> print(report(that("a scale is a power of two", True), equal("every skip halved the scale", [2, 1], [2, 1])))
✓ a scale is a power of two
✓ every skip halved the scale  (here: [2, 1])
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from labkit._validate import integer, shown

PASS, FAIL = "✓", "✗"

SANITIZE = (
    (r"(?m)^(✓ .*?)  \(here: .*\)$", r"\1  (here: …)"),
    (r"(?m)^(✗ expected: .*?); saw: .*$", r"\1; saw: …"),
)
"""The (regex, replacement) pairs that mask a check's figures; notebooks/nbval_sanitize.cfg
holds the same pairs, and a test keeps the two in step."""


@dataclass(frozen=True)
class Check:
    """One claim and whether it holds here. ``seen`` is what was measured, as text."""

    claim: str
    holds: bool
    seen: str = ""

    def __post_init__(self):
        if not isinstance(self.claim, str):
            raise TypeError(f"a check's claim must be one line of text, got {type(self.claim).__name__} "
                            f"{shown(self.claim)}")
        if not self.claim.strip() or "\n" in self.claim:
            raise ValueError(f"a check's claim must be one non-empty line of text, got {shown(self.claim)}")
        if not isinstance(self.holds, (bool, np.bool_)):
            raise TypeError(f"holds must be True or False, got {type(self.holds).__name__} {shown(self.holds)}")
        object.__setattr__(self, "holds", bool(self.holds))
        if not isinstance(self.seen, str):
            raise TypeError(f"seen must be one line of text, got {type(self.seen).__name__} {shown(self.seen)}")
        if "\n" in self.seen:
            raise ValueError(f"seen must be one line of text, got {shown(self.seen)}")

    def __str__(self) -> str:
        if self.holds:
            return f"{PASS} {self.claim}" + (f"  (here: {self.seen})" if self.seen else "")
        return f"{FAIL} expected: {self.claim}" + (f"; saw: {self.seen}" if self.seen else "")

    def __bool__(self) -> bool:
        return self.holds

    def _repr_pretty_(self, p, cycle):  # IPython shows the line itself
        p.text(str(self))


class Report(tuple):
    """Several checks, shown one per line; ``all_hold`` says whether every claim held."""

    @property
    def all_hold(self) -> bool:
        return all(c.holds for c in self)

    def __str__(self) -> str:
        return "\n".join(map(str, self))

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def report(*checks: Check) -> Report:
    """The checks, to show together (a notebook cell's last line)."""
    if not checks or not all(isinstance(c, Check) for c in checks):
        raise TypeError("report() takes one or more Check values (from that, close, at_most, ...)")
    return Report(checks)


def that(claim: str, holds, seen: str = "") -> Check:
    """A claim and the truth of it, computed by the caller; ``seen`` says what was measured."""
    return Check(claim, holds, seen)


def _number(name: str, value) -> float:
    """A real number as a float; NaN and inf are kept (they never hold)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be within float64's range (|x| < 1.8e308), got {shown(value)}") from None


def _tolerance(name: str, value) -> float:
    tol = _number(name, value)
    if not tol >= 0:  # NaN too
        raise ValueError(f"{name} must be a tolerance >= 0, got {shown(value)}")
    return tol


def _fmt(value: float, digits: int) -> str:
    return f"{value:.{digits}g}"


def _seen(seen, unit: str = "") -> None:
    if seen is not None and not isinstance(seen, str):
        raise TypeError(f"seen must be one line of text or None, got {type(seen).__name__} {shown(seen)}")
    if not isinstance(unit, str):
        raise TypeError(f"unit must be a string (e.g. 'x' or ' s'), got {type(unit).__name__} {shown(unit)}")


def _digits(digits) -> int:
    return integer("digits", digits, minimum=1, maximum=17)


def close(claim: str, value, reference, *, rel: float | None = None, abs: float | None = None,
          digits: int = 4, seen: str | None = None) -> Check:
    """Holds when ``value`` is within ``rel`` (relative to the reference) or ``abs`` of
    ``reference``; at least one tolerance must be given. NaN and inf never hold. ``seen``
    replaces the default "value vs reference" text."""
    v, r = _number("value", value), _number("reference", reference)
    digits = _digits(digits)
    _seen(seen)
    if rel is None and abs is None:
        raise ValueError("close() needs a tolerance: rel=0.05 (5%) or abs=0.01")
    tol = max(_tolerance("rel", rel) * math.fabs(r) if rel is not None else 0.0,
              _tolerance("abs", abs) if abs is not None else 0.0)
    holds = math.isfinite(v) and math.isfinite(r) and math.fabs(v - r) <= tol
    return Check(claim, holds, f"{_fmt(v, digits)} vs {_fmt(r, digits)}" if seen is None else seen)


def at_most(claim: str, value, limit, *, unit: str = "", digits: int = 3, seen: str | None = None) -> Check:
    """Holds when ``value <= limit`` (NaN never holds)."""
    v, lim = _number("value", value), _number("limit", limit)
    digits = _digits(digits)
    _seen(seen, unit)
    return Check(claim, v <= lim, f"{_fmt(v, digits)}{unit}" if seen is None else seen)


def at_least(claim: str, value, limit, *, unit: str = "", digits: int = 3, seen: str | None = None) -> Check:
    """Holds when ``value >= limit`` (NaN never holds)."""
    v, lim = _number("value", value), _number("limit", limit)
    digits = _digits(digits)
    _seen(seen, unit)
    return Check(claim, v >= lim, f"{_fmt(v, digits)}{unit}" if seen is None else seen)


def equal(claim: str, value, expected) -> Check:
    """Holds when ``value == expected`` (lists, tuples and arrays compared element by element)."""
    def plain(x):
        if isinstance(x, np.ndarray):
            return x.tolist()
        return list(x) if isinstance(x, tuple) else x

    v, e = plain(value), plain(expected)
    try:
        holds = bool(v == e)
    except (TypeError, ValueError):  # == gave something that is not one truth value
        raise TypeError(f"value and expected must compare as a whole (numbers, strings, lists, arrays); got "
                        f"{type(value).__name__} and {type(expected).__name__}") from None
    text = str(v).replace("\n", " ")
    return Check(claim, holds, text if len(text) <= 200 else text[:197] + "...")


__all__ = ["FAIL", "PASS", "SANITIZE", "Check", "Report", "at_least", "at_most", "close", "equal", "report", "that"]
