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

from labkit.formats import bits as _bits
from labkit.formats.spec import FloatFormat, get

_MAX_VALUES = 10_000_000


def _as_values(values, what: str = "values") -> np.ndarray:
    """A 1-d float64 array of real numbers, or a clear TypeError / ValueError."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a sequence or array of real numbers, got {type(values).__name__}")
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a sequence or array of real numbers") from exc
    if arr.dtype.kind == "V" and arr.dtype.itemsize <= 2:  # ml_dtypes bfloat16 / float8
        arr = arr.astype(np.float32)
    if arr.dtype.kind not in "iuf" or arr.dtype.kind == "b":
        raise TypeError(f"{what} must be real numbers, got an array of dtype {arr.dtype}")
    if arr.ndim > 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size > _MAX_VALUES:
        raise ValueError(f"{what}: at most {_MAX_VALUES:,} values, got {arr.size:,}")
    return np.atleast_1d(arr).astype(np.float64)


def running_sum(values, fmt: str | FloatFormat) -> np.ndarray:
    """Partial sums with every input and every partial sum rounded to `fmt`.

    ``out[k] = round(out[k-1] + round(values[k]))`` -- what an accumulator *stored in*
    `fmt` computes. Returned as float64 (each entry is a value of `fmt`).

    >>> running_sum([1.0, 2.0**-8, 2.0**-8], "bf16").tolist()   # 1 + 2^-8 is a tie: stays 1
    [1.0, 1.0, 1.0]
    >>> running_sum([1.0, 2.0**-8, 2.0**-8], "fp16").tolist()
    [1.0, 1.00390625, 1.0078125]
    """
    f = get(fmt)
    x = _as_values(values)
    if f.dtype is not None:
        # numpy's add.accumulate in the format's own dtype rounds after every add
        # (checked against the plain loop below in the tests).
        with np.errstate(over="ignore", invalid="ignore"):
            stored = x.astype(np.float32).astype(f.dtype) if f.via_float32 else x.astype(f.dtype)
            return np.add.accumulate(stored).astype(np.float64)
    return _running_sum_loop(x, f)


def _running_sum_loop(x: np.ndarray, f: FloatFormat) -> np.ndarray:
    """The definition, one add at a time (used for tf32, which has no numpy dtype)."""
    stored = np.asarray(f.round(x), np.float64)
    out = np.empty_like(stored)
    s = 0.0
    for i, v in enumerate(stored.tolist()):
        s = f.round(s + v) if i else v
        out[i] = s
    return out


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
    f, acc = get(fmt), get(accumulator)
    x = _as_values(values)
    if x.size == 0:
        raise ValueError("compare_accumulation() needs at least one value")
    stored = np.asarray(f.round(x), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        reference = np.cumsum(stored)
    return Accumulation(
        format=f.name,
        accumulator=acc.name,
        inputs=stored,
        naive=running_sum(stored, f),
        wide=running_sum(stored, acc),
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
    f = get(compute)
    acc = get(accumulate) if accumulate is not None else f
    v = np.asarray(f.round(_as_values(x, "x")), np.float64)
    if v.size == 0:
        raise ValueError("normalization_stats() needs at least one value")
    n = v.size
    with np.errstate(over="ignore", invalid="ignore"):
        mean = f.round(float(running_sum(v, acc)[-1]) / n)
        centred = np.asarray(f.round(v - mean), np.float64)
        squares = np.asarray(f.round(centred * centred), np.float64)
        var = f.round(float(running_sum(squares, acc)[-1]) / n)
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
    f = get(compute)
    z = np.asarray(f.round(_as_values(logits, "logits")), np.float64)
    if z.size == 0:
        raise ValueError("softmax_cross_entropy() needs at least one logit")
    if isinstance(target, (bool, np.bool_)) or not isinstance(target, (int, np.integer)):
        raise TypeError(f"target must be an integer class index, got {type(target).__name__}")
    if not 0 <= target < z.size:
        raise ValueError(f"target must be a class index in 0 .. {z.size - 1}, got {target}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.asarray(f.round(np.exp(f.round(z - z.max()))), np.float64)
        total = float(running_sum(e, f)[-1])
        p = f.round(e[target] / total)
        return float(f.round(-np.log(p)))


def representable_values(fmt: str | FloatFormat, lo: float, hi: float, limit: int = 100_000) -> np.ndarray:
    """Every finite value of `fmt` in [lo, hi], in increasing order (zero once).

    Positive bit patterns are ordered like their values, so the values in a window are
    a range of patterns. Raises ValueError if there are more than `limit` of them.

    >>> representable_values("fp8_e4m3", 1, 2).tolist()
    [1.0, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875, 2.0]
    """
    f = get(fmt)
    lo, hi = _window(lo, hi)
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
    for name, v in (("lo", lo), ("hi", hi)):
        if isinstance(v, (bool, np.bool_, str, bytes)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
        if math.isnan(v):
            raise ValueError(f"{name} must be a number, got nan")
    lo, hi = float(lo), float(hi)
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
    f = get(fmt)
    m = f.mantissa_bits
    k = np.arange(f.emin - m, f.emax + 1)
    counts = np.where(k < f.emin, 2.0 ** (k - f.emin + m), 2.0**m)
    top = (f.max - 2.0**f.emax) / (2.0 ** (f.emax - m)) + 1  # values in [2^emax, max]
    counts[-1] = top
    return k, counts.astype(np.int64)
