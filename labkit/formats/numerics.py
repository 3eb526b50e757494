"""Arithmetic in a narrow format: what happens when every result is rounded.

A format is more than a range and an ``eps``: every operation rounds its result to the
nearest value of the format. Repeated, that rounding is what makes a low-precision
running sum stall:

    s = 0
    for v in values:                  # e.g. 10,000 values in [0, 1)
        s = round_to_bf16(s + v)      # once s reaches 256, bf16's spacing there is 2,
                                      # so s + v rounds back to s for every v < 1

This is why mixed precision keeps *accumulations* (sums, means, variances, the loss)
in float32 even when the values themselves are 16-bit.

How numpy behaves, checked in ``tests/formats/test_numerics.py``:
  * ``np.add.accumulate`` and ``np.cumsum`` on an ml_dtypes bfloat16 / float8 array or
    a numpy float16 array round after every add (ml_dtypes adds in float32 and rounds
    the result; float32 has enough bits, 24 >= 2 * 11 + 2, that this double rounding
    equals a single correct rounding);
  * ``np.sum`` on float16 does *not*: numpy adds a float16 array pairwise with a float32
    accumulator and rounds at the end, so it hides the stall a real fp16 accumulator shows.

>>> import numpy as np
>>> acc = compare_accumulation(np.full(10_000, 0.01), "bf16", accumulator="fp32")
>>> float(acc.naive[-1]), round(float(acc.wide_total), 1), acc.stall_step
(4.0, 100.0, 350)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labkit._validate import integer, number, shown
from labkit.formats import bits as _bits
from labkit.formats.spec import FloatFormat, format_arg, get

_MAX_VALUES = 10_000_000


def _as_values(values, what: str = "values") -> np.ndarray:
    """A 1-d float64 array of real numbers, or a clear TypeError / ValueError."""
    arr = _bits.real_array(values, what)
    if arr.ndim > 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size > _MAX_VALUES:
        raise ValueError(f"{what}: at most {_MAX_VALUES:,} values, got {arr.size:,}")
    return np.atleast_1d(arr).astype(np.float64, copy=False)


def running_sum(values, fmt: str | FloatFormat) -> np.ndarray:
    """Partial sums with every input and every partial sum rounded to `fmt`.

    ``out[k] = round(out[k-1] + round(values[k]))`` -- what an accumulator *stored in*
    `fmt` computes. Returned as float64 (each entry is a value of `fmt`).

    >>> running_sum([1.0, 2.0**-8, 2.0**-8], "bf16").tolist()   # 1 + 2^-8 is a tie: stays 1
    [1.0, 1.0, 1.0]
    >>> running_sum([1.0, 2.0**-8, 2.0**-8], "fp16").tolist()
    [1.0, 1.00390625, 1.0078125]
    """
    f = format_arg("fmt", fmt)
    return _accumulate(_as_values(values), f)


def _accumulate(x: np.ndarray, f: FloatFormat, stored: bool = False) -> np.ndarray:
    """running_sum of the float64 array `x` (`stored`: its values are already values of `f`)."""
    if f.dtype is not None:
        # numpy's add.accumulate in the format's own dtype rounds after every add
        # (checked against the plain loop in the tests).
        with np.errstate(over="ignore", invalid="ignore"):
            narrow = x.astype(np.float32).astype(f.dtype) if f.via_float32 else x.astype(f.dtype)
            return np.add.accumulate(narrow).astype(np.float64)
    x = x if stored else np.asarray(f.round(x), np.float64)
    if f.mantissa_bits == _HALF_MANT:  # tf32
        return _running_sum_scaled(x, f)
    return _running_sum_loop(x, f)  # a FloatFormat made by hand


def _running_sum_loop(stored: np.ndarray, f: FloatFormat) -> np.ndarray:
    """The definition, one add at a time (the tests hold tf32's fast route to it)."""
    out = np.empty_like(stored)
    s = 0.0
    for i, v in enumerate(stored.tolist()):
        s = float(f.round(s + v)) if i else v
        out[i] = s
    return out


_HALF = np.dtype(np.float16)
_HALF_MAX = float(np.finfo(np.float16).max)
_HALF_MIN_EXP = -14  # float16's smallest normal is 2^-14
_HALF_MANT = int(np.finfo(np.float16).nmant)  # 10, as tf32's


def _running_sum_scaled(stored: np.ndarray, f: FloatFormat) -> np.ndarray:
    """The running sum of `stored` (values of `f`) in a format with no numpy dtype (tf32).

    tf32 keeps float16's 11 significant bits; only its exponent range is wider. Scaled by a
    power of two 2^c, a stretch of values and partial sums that fits float16's window (every
    value a multiple of 2^-24, none above 65504) adds in float16 exactly as it would in tf32:
    scaling is exact, both round the exact sum to nearest-even on the same 11-bit grid, and a
    sum too small for float16's normal range is a multiple of 2^-24 below 2^-14, which both
    hold exactly. So the sum runs on numpy's float16 ``add.accumulate`` a chunk at a time,
    choosing c for each chunk; a chunk that does not fit is halved, and a single add that does
    not fit (an overflow, an inf, magnitudes too far apart) is done by the definition.
    """
    n = stored.size
    out = np.empty(n)
    i, size, s = 0, n, None
    while i < n:
        if s is not None and not math.isfinite(s):  # inf or NaN stays so, or becomes NaN: as float64 adds
            with np.errstate(invalid="ignore"):
                out[i:] = np.add.accumulate(np.concatenate(([s], stored[i:])))[1:]
            break
        if size == 1:  # misfits: a few adds one at a time, then chunks again
            for v in stored[i:i + 32].tolist():
                s = _one_add(s, v, f)
                out[i] = s
                i += 1
                if not math.isfinite(s):
                    break
            size = 2
            continue
        if s and size < 64:  # after a misfit: skip the values too small to move s
            small = np.abs(stored[i:i + 4096]) <= abs(s) * _NEGLIGIBLE
            run = small.size if small.all() else int(np.argmin(small))
            out[i:i + run] = s
            i += run
            if i == n:
                break
        size = min(size, n - i)
        sums = _half_sums(s, stored[i:i + size], f)
        if sums is not None:
            out[i:i + size] = sums
            s, i, size = float(sums[-1]), i + size, 2 * size
        else:
            size //= 2
    return out


_NEGLIGIBLE = 2.0**-13
"""|v| <= |s| * 2^-13 is below a quarter of s's spacing (2^(e - 10) > |s| * 2^-11) in tf32: s + v rounds to s."""


def _one_add(s: float | None, v: float, f: FloatFormat) -> float:
    """round(s + v) in `f` for one add that float16's window may not hold."""
    if s is None:
        return v
    if math.isfinite(s) and math.isfinite(v):
        if v and abs(s) <= abs(v) * _NEGLIGIBLE:
            return v  # s is too small to move v
        if s and abs(v) <= abs(s) * _NEGLIGIBLE:
            return s
        t = s + v
        b = t - s
        if (s - (t - b)) + (v - b) == 0 and _holds(f, t):  # float64 added exactly (TwoSum), and f holds it
            return t
        sums = _half_sums(s, np.array([v]), f)
        if sums is not None:
            return float(sums[0])
    return float(f.round(s + v))  # the definition: an overflow, an inf or a NaN


def _holds(f: FloatFormat, t: float) -> bool:
    """Is the finite float64 `t` a value of `f`? (a multiple of f's spacing at t, within its range)"""
    if t == 0:
        return True
    k = math.frexp(t)[1] - 1  # 2^k <= |t| < 2^(k+1)
    return abs(t) <= f.max and math.ldexp(t, f.mantissa_bits - max(k, f.emin)).is_integer()


def _half_sums(s: float | None, chunk: np.ndarray, f: FloatFormat) -> np.ndarray | None:
    """The running sums of `chunk` after `s` (None: from the start), computed in float16 at a
    power-of-two scale -- or None when the chunk does not fit float16's window."""
    if s and ((chunk >= 0).all() if s > 0 else (chunk <= 0).all()):
        # no value can shrink |s| here, so one below |s| * 2^-13 never moves it: drop it from the window
        chunk = np.where(np.abs(chunk) <= abs(s) * _NEGLIGIBLE, 0.0, chunk)
    vals = chunk if s is None else np.concatenate(([s], chunk))
    if not np.isfinite(vals).all():
        return None
    mags = np.abs(vals)
    smallest = float(mags.min(initial=math.inf, where=mags != 0))
    # f keeps M + 1 bits, so a value in [2^k, 2^(k+1)) is a multiple of 2^(k - M): scale the smallest
    # to float16's smallest normal, 2^-14, and every value is a multiple of 2^-24 (for tf32, M = 10)
    c = 0 if smallest == math.inf else _HALF_MIN_EXP - (math.frexp(smallest)[1] - 1)
    scaled = np.ldexp(vals, c)
    if np.abs(scaled).max() > _HALF_MAX:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        sums = np.add.accumulate(scaled.astype(_HALF))
    if not np.isfinite(sums).all():
        return None
    sums = np.ldexp(sums.astype(np.float64), -c)
    if np.abs(sums).max() > f.max:  # f overflows to inf here: leave it to the definition
        return None
    return sums if s is None else sums[1:]


@dataclass(frozen=True)
class Accumulation:
    """One sum computed three ways.

    inputs:  the values as stored in `format` (what a 16-bit tensor holds).
    naive:   running sum with the accumulator in `format` too (rounded every add).
    wide:    running sum with the accumulator in `accumulator` (e.g. fp32), every add
             rounded to that wider format; the result is rounded to `format` once.
    reference: float64 running sum of the same inputs (the "true" partial sums).
    """

    format: str
    accumulator: str
    inputs: np.ndarray
    naive: np.ndarray
    wide: np.ndarray
    reference: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "format", format_arg("format", self.format).name)
        object.__setattr__(self, "accumulator", format_arg("accumulator", self.accumulator).name)
        sizes = set()
        for name in ("inputs", "naive", "wide", "reference"):
            arr = _as_values(getattr(self, name), name)
            object.__setattr__(self, name, arr)
            sizes.add(arr.size)
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(f"inputs, naive, wide and reference must hold one value per step, the same number "
                             f"(at least one) in each; got lengths {sorted(sizes)}")

    @property
    def exact_total(self) -> float:
        """The exact sum of the stored inputs (math.fsum), rounded to float64."""
        return math.fsum(self.inputs.tolist())

    @property
    def naive_total(self) -> float:
        return float(self.naive[-1])

    @property
    def wide_total(self) -> float:
        """The wide accumulator's sum, rounded once to `format` at the end."""
        return float(get(self.format).round(self.wide[-1]))

    @property
    def naive_rel_error(self) -> float:
        return _rel(self.naive_total, self.exact_total)

    @property
    def wide_rel_error(self) -> float:
        return _rel(self.wide_total, self.exact_total)

    @property
    def stall_step(self) -> int | None:
        """First step from which the naive sum never changes again (None if it never stalls).

        Counted from 0; ``None`` also when the sum is still changing at the last step.
        """
        changed = np.flatnonzero(np.diff(self.naive) != 0)
        last_change = int(changed[-1]) + 1 if changed.size else 0
        return last_change + 1 if last_change + 1 < self.naive.size else None

    def __str__(self) -> str:
        n = self.inputs.size
        rows = [
            ("exact sum of the stored values", self.exact_total, None),
            (f"{self.format} accumulator", self.naive_total, self.naive_rel_error),
            (f"{self.accumulator} accumulator, rounded once", self.wide_total, self.wide_rel_error),
        ]
        lines = [f"sum of {n:,} {self.format} values"]
        for label, value, err in rows:
            tail = "" if err is None else f"   relative error {err:.2g}"
            lines.append(f"  {label:<36}{value:>12.6g}{tail}")
        if self.stall_step is not None:
            lines.append(f"  the {self.format} sum stops changing at step {self.stall_step:,} of {n:,}")
        return "\n".join(lines)


def _rel(value: float, exact: float) -> float:
    if exact == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - exact) / abs(exact)


def compare_accumulation(
    values, fmt: str | FloatFormat = "bf16", accumulator: str | FloatFormat = "fp32"
) -> Accumulation:
    """Sum `values` (stored in `fmt`) with an accumulator in `fmt` and in `accumulator`."""
    f, acc = format_arg("fmt", fmt), format_arg("accumulator", accumulator)
    x = _as_values(values)
    if x.size == 0:
        raise ValueError("values: compare_accumulation() needs at least one value")
    stored = np.asarray(f.round(x), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        reference = np.cumsum(stored)
    return Accumulation(
        format=f.name,
        accumulator=acc.name,
        inputs=stored,
        naive=_accumulate(stored, f, stored=True),
        wide=_accumulate(stored, acc, stored=acc.name == f.name),
        reference=reference,
    )


def normalization_stats(x, compute: str | FloatFormat = "fp32", accumulate: str | FloatFormat | None = None):
    """Mean and variance of `x` as a LayerNorm / BatchNorm computes them, in `compute`.

    Every elementwise result (x - mean, its square, the divisions) is rounded to
    `compute`; the two sums run in `accumulate` (default: `compute` as well). Returns
    ``(mean, variance)`` as floats. This is why frameworks run normalisation layers in
    float32 under autocast: in fp16 a square overflows as soon as |x - mean| > 256, and
    a 16-bit running sum of thousands of squares stalls.

    >>> normalization_stats([300.0, -300.0], "fp16")      # 300^2 = 90000 > 65504
    (0.0, inf)
    >>> normalization_stats([300.0, -300.0], "fp32")
    (0.0, 90000.0)
    """
    f = format_arg("compute", compute)
    acc = format_arg("accumulate", accumulate) if accumulate is not None else f
    v = np.asarray(f.round(_as_values(x, "x")), np.float64)
    if v.size == 0:
        raise ValueError("x: normalization_stats() needs at least one value")
    n = v.size
    with np.errstate(over="ignore", invalid="ignore"):
        mean = f.round(float(_accumulate(v, acc, stored=acc is f)[-1]) / n)
        centred = np.asarray(f.round(v - mean), np.float64)
        squares = np.asarray(f.round(centred * centred), np.float64)
        var = f.round(float(_accumulate(squares, acc, stored=acc is f)[-1]) / n)
    return float(mean), float(var)


def softmax_cross_entropy(logits, target: int, compute: str | FloatFormat = "fp32") -> float:
    """-log(softmax(logits)[target]) with every intermediate rounded to `compute`.

    The textbook route -- subtract the max, exponentiate, sum, divide, take the log --
    done in a 16-bit format: a probability below the format's smallest subnormal becomes
    0 and the loss becomes inf. This is one reason the loss stays in float32.

    >>> softmax_cross_entropy([0.0, 20.0], target=0, compute="fp16")   # p = 2e-9
    inf
    >>> round(softmax_cross_entropy([0.0, 20.0], target=0, compute="fp32"), 3)
    20.0
    """
    f = format_arg("compute", compute)
    z = np.asarray(f.round(_as_values(logits, "logits")), np.float64)
    if z.size == 0:
        raise ValueError("logits: softmax_cross_entropy() needs at least one logit")
    if isinstance(target, (bool, np.bool_)) or not isinstance(target, (int, np.integer)):
        raise TypeError(f"target must be an integer class index, got {type(target).__name__} {shown(target)}")
    if not 0 <= target < z.size:
        raise ValueError(f"target must be a class index in 0 .. {z.size - 1} (one per logit: there are "
                         f"{z.size} logits), got {target}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.asarray(f.round(np.exp(f.round(z - z.max()))), np.float64)
        total = float(_accumulate(e, f, stored=True)[-1])
        p = f.round(e[target] / total)
        return float(f.round(-np.log(p)))


def representable_values(fmt: str | FloatFormat, lo: float, hi: float, limit: int = 100_000) -> np.ndarray:
    """Every finite value of `fmt` in [lo, hi], in increasing order (zero once).

    Positive bit patterns are ordered like their values, so the values in a window are
    a range of patterns. Raises ValueError if there are more than `limit` of them.

    >>> representable_values("fp8_e4m3", 1, 2).tolist()
    [1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 2.0]
    """
    f = format_arg("fmt", fmt)
    lo, hi = _window(lo, hi)
    limit = integer("limit", limit, minimum=1)
    lo, hi = max(lo, -f.max), min(hi, f.max)
    if lo > hi:
        return np.empty(0)
    first = lo if f.round(lo) == lo else f.next_up(lo)
    last = hi if f.round(hi) == hi else f.next_down(hi)
    if first > last:
        return np.empty(0)
    k0, k1 = (int(_bits._key(f, np.asarray(f.encode(v)))) for v in (first, last))
    count = k1 - k0 + 1
    if count > limit:
        raise ValueError(
            f"{count:,} {f.name} values lie in [{lo:g}, {hi:g}]; the limit is {limit:,}: "
            "narrow the window or raise `limit`"
        )
    keys = np.arange(k0, k1 + 1, dtype=np.int64)
    return np.asarray(f.decode(_bits._unkey(f, keys)), np.float64)


def _window(lo, hi) -> tuple[float, float]:
    lo, hi = (number(name, v, finite=False) for name, v in (("lo", lo), ("hi", hi)))
    if lo > hi:
        raise ValueError(f"the window is empty: lo={lo:g} > hi={hi:g}")
    return lo, hi


def binade_counts(fmt: str | FloatFormat) -> tuple[np.ndarray, np.ndarray]:
    """How many positive values `fmt` has in each binade [2^k, 2^(k+1)).

    Returns ``(k, count)``. Normal binades hold 2^M values each; below the smallest
    normal (2^emin) the subnormals are evenly spaced, so the binade [2^k, 2^(k+1))
    holds 2^(k - emin + M) of them, halving binade by binade down to the smallest
    subnormal. The top binade stops at max (fp8_e4m3 gives its last pattern to NaN).

    >>> k, n = binade_counts("fp8_e4m3")
    >>> list(zip(k.tolist(), n.tolist()))[:4], int(n.sum())
    ([(-9, 1), (-8, 2), (-7, 4), (-6, 8)], 126)
    """
    f = format_arg("fmt", fmt)
    m = f.mantissa_bits
    k = np.arange(f.emin - m, f.emax + 1)
    counts = np.where(k < f.emin, 2.0 ** (k - f.emin + m), 2.0**m)
    top = (f.max - 2.0**f.emax) / (2.0 ** (f.emax - m)) + 1  # values in [2^emax, max]
    counts[-1] = top
    return k, counts.astype(np.int64)
