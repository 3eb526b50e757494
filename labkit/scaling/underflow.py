"""What a loss scale S saves: gradient values lost to zero, kept as subnormals, or overflowing.

Multiplying the loss by S multiplies every gradient by S (the chain rule is linear), so a
gradient g is stored as ``round_fmt(g * S)``. For a sample of real gradients (computed in
fp32) this module counts, for each format and S, the nonzero values that

* are **lost**: round to zero (underflow, "flushed to zero");
* are **subnormal**: survive with fewer significant bits;
* are **normal**: keep the format's full precision;
* **overflow**: round to inf/nan in a plain cast (an fp8 cast that saturates clips them).

and the range of S that loses nothing: ``S >= smallest_subnormal / min|g|`` keeps every
value nonzero and ``S <= max / max|g|`` keeps every value finite. Both bounds are
conservative: just outside them rounding can still save a value.

>>> g = [2.0**-30, 2.0**-10, 0.5]
>>> fractions(g, "fp16", scale=1.0).lost, fractions(g, "fp16", scale=2.0**10).lost
(0.3333333333333333, 0.0)
>>> r = safe_scale_range(g, "fp16")
>>> r.log2_lo, r.log2_hi
(6.0, 16.99929538702341)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labkit import formats as lf
from labkit._validate import integer, names, number
from labkit.scaling import _numbers as num

DEFAULT_FORMATS = ("fp16", "bf16", "fp8_e5m2", "fp8_e4m3")


def gradient_values(values) -> np.ndarray:
    """A float64 array of finite gradient values: an array, {name: array} or a GradientRecord."""
    if isinstance(values, dict):
        arrays = [num.real_array(f"values[{k!r}]", v).ravel() for k, v in values.items()]
        values = np.concatenate(arrays) if arrays else np.zeros(0)
    elif hasattr(values, "values") and not isinstance(values, np.ndarray) and not callable(values.values):
        values = values.values
    arr = num.real_array("values", values).ravel()
    if arr.size == 0:
        raise ValueError("values is empty: give at least one gradient value")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values must be finite: these are fp32 gradients before any scaling")
    return arr


def check_scale(scale) -> float:
    """A scale S: a finite number > 0 (ValueError otherwise)."""
    return float(num.check_scale("scale", scale))


@dataclass(frozen=True)
class Fractions:
    """Where the nonzero values of a gradient sample land in ``format`` after scaling by S.

    ``lost + subnormal + normal + overflow == 1`` (fractions of ``count`` nonzero values);
    ``zeros`` counts the values that were exactly 0 already (ReLU, unused inputs).
    """

    format: str
    scale: float
    count: int
    zeros: int
    lost: float
    subnormal: float
    normal: float
    overflow: float

    def __post_init__(self):
        lf.get(self.format)
        check_scale(self.scale)
        integer("count", self.count, minimum=0)
        integer("zeros", self.zeros, minimum=0)
        parts = [number(name, getattr(self, name), minimum=0, maximum=1)
                 for name in ("lost", "subnormal", "normal", "overflow")]
        if not math.isclose(sum(parts), 1.0 if self.count else 0.0, abs_tol=1e-9):
            raise ValueError(f"lost + subnormal + normal + overflow must be 1 (fractions of count={self.count} "
                             f"nonzero values; 0 when count is 0); got {sum(parts)!r}")


def fractions(values, fmt, scale=1.0) -> Fractions:
    """Classify ``round_fmt(values * scale)`` for the nonzero values (exact rounding via labkit.formats)."""
    f = lf.get(fmt)
    s = check_scale(scale)
    arr = gradient_values(values)
    nonzero = arr[arr != 0]
    n = nonzero.size
    if n == 0:
        return Fractions(f.name, s, 0, arr.size, 0.0, 0.0, 0.0, 0.0)
    kinds = f.classify(np.abs(nonzero) * s)
    frac = lambda *names: float(np.isin(kinds, names).sum()) / n  # noqa: E731
    return Fractions(f.name, s, n, arr.size - n, frac("zero"), frac("subnormal"), frac("normal"), frac("inf", "nan"))


@dataclass(frozen=True)
class ScaleRange:
    """The loss scales S for which a gradient sample loses nothing in ``format``.

    ``lo = smallest_subnormal / min|g|`` (nothing rounds to zero), ``lo_normal =
    smallest_normal / min|g|`` (nothing is even subnormal), ``hi = max / max|g|``
    (nothing overflows). ``pow2_lo`` / ``pow2_hi``: the powers of two inside [lo, hi]
    (loss scales are powers of two so that scaling is exact); None when the range is
    empty, i.e. the sample's own range is wider than the format's.
    """

    format: str
    min_abs: float
    max_abs: float
    lo: float
    lo_normal: float
    hi: float

    # A sample near float64's limits (1e308 in bf16) can push lo or hi past them (to 0 or
    # inf): then their log2 comes from the format's constants and the sample's extremes.
    @property
    def log2_lo(self) -> float:
        return _log2(self.lo, lf.get(self.format).smallest_subnormal, self.min_abs)

    @property
    def log2_lo_normal(self) -> float:
        return _log2(self.lo_normal, lf.get(self.format).smallest_normal, self.min_abs)

    @property
    def log2_hi(self) -> float:
        return _log2(self.hi, lf.get(self.format).max, self.max_abs)

    @property
    def empty(self) -> bool:
        if _normal(self.lo) and _normal(self.hi):
            return self.lo > self.hi
        return self.log2_lo > self.log2_hi

    @property
    def pow2_lo(self) -> float | None:
        e = math.ceil(self.log2_lo)
        if e > 1023:
            return None
        p = 2.0 ** max(e, -1074)  # float64's powers of two: 2**-1074 .. 2**1023
        return None if p > self.hi else p

    @property
    def pow2_hi(self) -> float | None:
        e = math.floor(self.log2_hi)
        if e < -1074:
            return None
        p = 2.0 ** min(e, 1023)
        return None if p < self.lo else p

    def contains(self, scale) -> bool:
        return self.lo <= check_scale(scale) <= self.hi


def _normal(x: float) -> bool:
    """A float64 that kept its full precision: not 0, subnormal or inf."""
    return 2.0**-1022 <= x < math.inf


def _log2(ratio: float, top: float, bottom: float) -> float:
    """log2(top / bottom), where ``ratio`` is that quotient as a float64 (exact unless it left the normal range)."""
    return math.log2(ratio) if _normal(ratio) else math.log2(top) - math.log2(bottom)


def safe_scale_range(values, fmt) -> ScaleRange:
    """The range of S that loses no nonzero gradient value of the sample in ``fmt``."""
    f = lf.get(fmt)
    arr = np.abs(gradient_values(values))
    nonzero = arr[arr != 0]
    if nonzero.size == 0:
        raise ValueError("values has no nonzero gradient: nothing to scale")
    lo_g, hi_g = float(nonzero.min()), float(nonzero.max())
    return ScaleRange(f.name, lo_g, hi_g, f.smallest_subnormal / lo_g, f.smallest_normal / lo_g, f.max / hi_g)


def fractions_table(values, scale=1.0, formats=DEFAULT_FORMATS):
    """Lost / subnormal / normal / overflow percentages per format at one scale, as a Table."""
    from labkit.table import Table

    rows = []
    for name in _format_names(formats):
        fr = fractions(values, name, scale)
        rows.append((fr.format, _pow2(fr.scale), f"{100 * fr.lost:.2f}%", f"{100 * fr.subnormal:.2f}%",
                     f"{100 * fr.normal:.2f}%", f"{100 * fr.overflow:.2f}%"))
    return Table(("format", "scale S", "lost to zero", "subnormal", "normal", "overflow"), tuple(rows),
                 "Where the nonzero gradient values land after scaling by S")


def safe_range_table(values, formats=DEFAULT_FORMATS):
    """For each format: the range of S that loses nothing, as a Table."""
    from labkit.table import Table

    rows = []
    for name in _format_names(formats):
        r = safe_scale_range(values, name)
        rows.append((r.format, f"2**{r.log2_lo:.1f}", f"2**{r.log2_hi:.1f}",
                     "empty" if r.empty else f"{_pow2(r.pow2_lo)} .. {_pow2(r.pow2_hi)}",
                     f"2**{r.log2_lo_normal:.1f}"))
    return Table(("format", "S >= (nothing lost)", "S <= (no overflow)", "powers of two that lose nothing",
                  "S >= (all normal)"), tuple(rows), "Loss scales that keep every gradient value")


def _format_names(formats) -> list[str]:
    """One format or a list of them (names or FloatFormats) as a list of names: 'fp16' is not 'f', 'p', ..."""
    if isinstance(formats, lf.FloatFormat):
        return [formats.name]
    if isinstance(formats, (list, tuple)):
        formats = [f.name if isinstance(f, lf.FloatFormat) else f for f in formats]
    return [lf.get(f).name for f in names("formats", formats)]


def _pow2(x) -> str:
    if x is None:
        return "-"
    m, e = math.frexp(x)
    return f"2**{e - 1}" if m == 0.5 else f"{x:.3g}"
