"""Accumulation precision in an FP8 GEMM: a ~14-bit accumulator, with and without promotion to fp32.

An FP8 tensor-core GEMM multiplies e4m3 (or e5m2) operands; each product is exact (two
4-bit significands give at most 8 bits), but the products are summed in an accumulator.
DeepSeek-V3's technical report (arXiv 2412.19437, §3.3.2 "Increasing Accumulation
Precision") measured that on NVIDIA Hopper "the accumulation precision of FP8 GEMM on
NVIDIA H800 GPUs is limited to retaining around 14 bits, which is significantly lower than
FP32 accumulation precision", and reports a maximum relative error of nearly 2% for K = 4096
in its own test. Its fix: every N_C = 128 products (four WGMMAs), copy the partial sum to an
FP32 register on the CUDA cores and add it there ("promotion").

The emulation here, in float64 numpy (vectorised over the M*N outputs, a loop over K)::

    acc = 0                                     # the tensor core's accumulator
    out = 0                                     # fp32 register (used with promotion)
    for k in range(K):
        acc = round_p(acc + a[:, k] * b[k, :])  # exact product, one rounding per add
        if promote_every and (k + 1) % promote_every == 0:
            out = fp32(out + acc); acc = 0      # promotion: the partial sum moves to fp32
    result = fp32(out + acc) if promote_every else acc

``round_p`` keeps ``mantissa_bits + 1`` significant bits (13 stored mantissa bits: 14
significant) with a wide exponent (no overflow, no subnormals), rounding to nearest, ties
to even (`round_mantissa`). What this model is *not*: Hopper's real accumulation details
(the order products are added in, whether products are aligned to a shared exponent and
truncated, per group of several products) are not public. ``rounding="toward_zero"``
(truncation) is offered as the other plausible bound; round-to-nearest errors partly
cancel (they grow like sqrt(K)), truncation errors add up (like K).

Why every format in this course accumulates in fp32: an fp16/bf16/fp8 matmul's products
are summed in an fp32 accumulator on every tensor core and CPU kernel, because with p
significant bits each add costs a relative error of up to 2**-p and K adds accumulate
it. With 24 bits (fp32) K = 16384 stays below 1e-6; with 14 bits it reaches a few 1e-3 ..
1e-2 unless the partial sums are promoted to fp32 every 128 products. Compare notebook 02's
running sums (`labkit.formats.compare_accumulation`).

>>> round_mantissa([1 + 2**-14, 1 + 3 * 2**-14], mantissa_bits=13).tolist()   # ties to even
[1.0, 1.000244140625]

An 8-bit accumulator (7 stored bits, bfloat16's precision) adding 512 ones stalls at 256,
where the next 1 is half an ulp (a tie, rounded to the even 256); promotion every 128 saves it:

>>> ones = np.ones((1, 512))
>>> float(fp8_matmul(ones, ones.T, mantissa_bits=7, promote_every=None)[0, 0])
256.0
>>> float(fp8_matmul(ones, ones.T, mantissa_bits=7, promote_every=128)[0, 0])
512.0
"""

from __future__ import annotations

import numpy as np

from labkit._validate import choice, integer, shown
from labkit.formats.spec import get

ROUNDINGS = ("nearest", "toward_zero")
DISTRIBUTIONS = ("normal", "uniform")
N_C = 128  # DeepSeek-V3 §3.3.2: promotion interval, 128 elements (4 WGMMAs)
ACCUMULATOR_BITS = 13  # stored mantissa bits of a "~14-bit" accumulator
DEFAULT_KS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_K = 2**16


def _bits(mantissa_bits) -> int:
    return integer("mantissa_bits", mantissa_bits, minimum=1, maximum=52)


def _real(name: str, x) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError, OverflowError):
        arr = None
    if arr is None or arr.dtype.kind not in "biuf" or arr.dtype.kind == "b":
        raise TypeError(f"{name} must be an array of real numbers; got {type(x).__name__} {shown(x)}")
    return arr.astype(np.float64)


def round_mantissa(x, mantissa_bits: int = ACCUMULATOR_BITS, rounding: str = "nearest") -> np.ndarray:
    """``x`` rounded to ``mantissa_bits + 1`` significant bits, with an unbounded exponent (float64 out).

    Written with ``np.frexp``: ``x = m * 2**e`` with 0.5 <= |m| < 1, so ``m * 2**(p)`` with
    ``p = mantissa_bits + 1`` holds the p kept bits left of the point; ``np.rint`` rounds it
    to nearest, ties to even (``np.trunc``: toward zero), and ``np.ldexp`` puts the exponent
    back. Every step is exact in float64 for p <= 53, so this is one correct rounding. Zero,
    inf and nan pass through. Within a format's normal range it is that format's rounding:
    7 bits is bfloat16's, 10 float16's, 23 float32's (the tests check this against ml_dtypes).

    >>> round_mantissa(1 / 3, 7), float(np.float32(1 / 3).astype("bfloat16"))
    (array(0.33398438), 0.333984375)
    """
    p = _bits(mantissa_bits) + 1
    op = {"nearest": np.rint, "toward_zero": np.trunc}[choice("rounding", rounding, ROUNDINGS)]
    arr = _real("x", x)
    m, e = np.frexp(arr)
    with np.errstate(invalid="ignore"):
        out = np.ldexp(op(np.ldexp(m, p)), e - p)
    return np.where(np.isfinite(arr), out, arr)


def _promote(promote_every) -> int | None:
    return None if promote_every is None else integer("promote_every", promote_every, minimum=1, maximum=MAX_K)


def _matrix(name: str, x) -> np.ndarray:
    arr = _real(name, x)
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a non-empty 2-d array; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must hold finite numbers")
    return arr


def _accumulate(a, b, p, promote_every, rounding, snapshots=()) -> tuple[np.ndarray, dict]:
    """The loop of the module docstring; also the result after each k in `snapshots` (prefix sums)."""
    rnd = {"nearest": np.rint, "toward_zero": np.trunc}[rounding]
    acc = np.zeros((a.shape[0], b.shape[1]))
    out = np.zeros_like(acc)
    taken, want = {}, set(snapshots)
    for k in range(a.shape[1]):
        m, e = np.frexp(acc + np.outer(a[:, k], b[k]))  # the product is exact in float64
        acc = np.ldexp(rnd(np.ldexp(m, p)), e - p)
        if promote_every and (k + 1) % promote_every == 0:
            out, acc = (out + acc).astype(np.float32).astype(np.float64), np.zeros_like(acc)
        if k + 1 in want:
            taken[k + 1] = (out + acc).astype(np.float32).astype(np.float64) if promote_every else acc.copy()
    return ((out + acc).astype(np.float32).astype(np.float64) if promote_every else acc), taken


def fp8_matmul(a, b, fmt: str = "fp8_e4m3", *, mantissa_bits: int = ACCUMULATOR_BITS,
               promote_every: int | None = N_C, rounding: str = "nearest") -> np.ndarray:
    """``a @ b`` as an FP8 GEMM with a narrow accumulator (the module docstring's loop), float64 out.

    ``a`` (M, K) and ``b`` (K, N) are first rounded to ``fmt`` (saturating at +-max, as a
    scaled cast does; scale them yourself first, `labkit.scaling.recipes`). ``promote_every``:
    products per promotion to fp32 (DeepSeek-V3's N_C = 128), None for none (then the result
    is the accumulator itself). ``mantissa_bits``: 13 (~14-bit accumulator) by default.
    """
    f = get(fmt)
    p = _bits(mantissa_bits) + 1
    promote_every = _promote(promote_every)
    choice("rounding", rounding, ROUNDINGS)
    a, b = _matrix("a", a), _matrix("b", b)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a's columns ({a.shape[1]}) must match b's rows ({b.shape[0]})")
    if a.shape[1] > MAX_K:
        raise ValueError(f"K (a's columns) must be at most {MAX_K}; got {a.shape[1]}")
    return _accumulate(f.round(a, saturate=True), f.round(b, saturate=True), p, promote_every, rounding)[0]


def _ks(ks) -> list[int]:
    if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
        raise TypeError(f"ks must be a list of inner dimensions K (integers from 1 to {MAX_K}); got {shown(ks)}")
    out = sorted({integer("ks", k, minimum=1, maximum=MAX_K) for k in ks})
    if not out:
        raise ValueError("ks must hold at least one K")
    return out


def sweep(ks=DEFAULT_KS, *, promote_every: int | None = N_C, mantissa_bits: int = ACCUMULATOR_BITS,
          seed: int = 0, m: int = 8, n: int = 8, distribution: str = "normal", rounding: str = "nearest",
          fmt: str = "fp8_e4m3") -> dict:
    """Relative error ``||C - C_exact||_F / ||C_exact||_F`` for each K, as {"ks", variant: errors}.

    One draw of ``a`` (m, max K) and ``b`` (max K, n), rounded to ``fmt``; the result for K is
    the first K products (one pass over max K, snapshots on the way). ``C_exact``: the float64
    dot of the same fp8-rounded operands (exact here: every product and partial sum of e4m3
    values of this size is a float64). ``distribution``: "normal" (mean 0, sums grow like
    sqrt(K)) or "uniform" on [0, 1) (all products >= 0: the sum grows like K). Variants:
    the narrow accumulator alone, with promotion every ``promote_every``, and fp32 (23 bits).
    """
    ks = _ks(ks)
    f = get(fmt)
    p = _bits(mantissa_bits) + 1
    promote_every = integer("promote_every", promote_every, minimum=1, maximum=MAX_K)
    rng = np.random.default_rng(integer("seed", seed, minimum=0))
    m, n = integer("m", m, minimum=1, maximum=256), integer("n", n, minimum=1, maximum=256)
    choice("rounding", rounding, ROUNDINGS)
    draw = {"normal": rng.standard_normal, "uniform": rng.random}[choice("distribution", distribution, DISTRIBUTIONS)]
    a, b = f.round(draw((m, ks[-1])), saturate=True), f.round(draw((ks[-1], n)), saturate=True)
    exact = np.cumsum(a[:, :, None] * b[None, :, :], axis=1)  # (m, K, n) prefix sums, exact in float64
    out = {"ks": ks}
    for label, bits, every in ((f"{p}-bit accumulator", p, None),
                               (f"{p}-bit, fp32 every {promote_every}", p, promote_every),
                               ("fp32 accumulator", 24, None)):
        taken = _accumulate(a, b, bits, every, rounding, ks)[1]
        out[label] = [float(np.linalg.norm(taken[k] - exact[:, k - 1]) / np.linalg.norm(exact[:, k - 1]))
                      for k in ks]
    return out


def accumulation_error(ks=DEFAULT_KS, promote_every: int = N_C, mantissa_bits: int = ACCUMULATOR_BITS,
                       seed: int = 0, **options):
    """`sweep` as a Table: one row per K, the relative error of each accumulator (options: `sweep`'s).

    >>> t = accumulation_error(ks=(128, 1024), seed=0)
    >>> t.columns
    ('K', '14-bit accumulator', '14-bit, fp32 every 128', 'fp32 accumulator')
    """
    from labkit.table import Table

    s = sweep(ks, promote_every=promote_every, mantissa_bits=mantissa_bits, seed=seed, **options)
    labels = [k for k in s if k != "ks"]
    rows = [(str(k), *(f"{s[label][i]:.2e}" for label in labels)) for i, k in enumerate(s["ks"])]
    return Table(("K", *labels), tuple(rows),
                 "FP8 GEMM: relative error of the sum of K exact products, by accumulator")


def plot_accumulation_error(ks=DEFAULT_KS, promote_every: int = N_C, mantissa_bits: int = ACCUMULATOR_BITS,
                            seed: int = 0, ax=None, **options):
    """`sweep` as a log-log figure: error against K, one line per accumulator; returns the Figure."""
    if ax is not None and not hasattr(ax, "loglog"):  # refused before the sweep runs
        raise TypeError(f"ax must be a matplotlib Axes to draw into, or None for a new figure; got {type(ax).__name__}")
    s = sweep(ks, promote_every=promote_every, mantissa_bits=mantissa_bits, seed=seed, **options)
    import matplotlib.pyplot as plt

    from matplotlib.axes import Axes

    if ax is None:  # a new figure, closed here: a notebook shows it as the cell's value
        fig = plt.figure(figsize=(6, 3.5), layout="constrained", dpi=90)
        ax = fig.add_subplot()
        plt.close(fig)
    elif isinstance(ax, Axes):
        fig = ax.figure
    else:
        raise TypeError(f"ax must be a matplotlib Axes to draw into, or None for a new figure; got {type(ax).__name__}")
    for label, errors in s.items():
        if label != "ks":
            ax.loglog(s["ks"], errors, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K (products summed)")
    ax.set_ylabel("relative error (Frobenius)")
    ax.set_title("FP8 GEMM accumulation")
    ax.legend()
    return fig


__all__ = ["ACCUMULATOR_BITS", "N_C", "accumulation_error", "fp8_matmul", "plot_accumulation_error",
           "round_mantissa", "sweep"]
