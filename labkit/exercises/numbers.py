"""Exercises on rounding, overflow, underflow and loss scales (notebooks 01, 02, 03, 10).

Every key is computed from `labkit.formats` (whose values come from ml_dtypes) or
`labkit.scaling`; the hints compute their numbers the same way.

>>> from labkit.exercises import check
>>> print(check("fp16_of_65520", 65504.0).message)   # doctest: +ELLIPSIS
65520 lies exactly halfway between fp16's largest value and the next step up...
"""

from __future__ import annotations

import math

import numpy as np

from labkit import formats as lf
from labkit._validate import integer
from labkit.exercises._common import final_scale, is_pow2
from labkit.exercises.core import Exercise, Hint, register

_bf16, _fp16, _fp32, _e4m3 = (lf.get(n) for n in ("bf16", "fp16", "fp32", "fp8_e4m3"))


def _round(fmt, x: float) -> float:
    """x after a round trip through `fmt`'s ml_dtypes/numpy dtype (one rounding from float64, to nearest even)."""
    with np.errstate(over="ignore"):  # an overflow to inf is the lesson, not an accident
        return float(np.asarray(x, np.float64).astype(fmt.dtype).astype(np.float64))


def _spacing(fmt, x: float) -> float:
    """The gap between `fmt`'s values at x > 0: 2^(max(e, emin) - mantissa bits), e = floor(log2 x)."""
    return 2.0 ** (max(math.floor(math.log2(x)), fmt.emin) - fmt.mantissa_bits)


def _is_value_of(fmt):
    """Is `a` a value of `fmt` (finite, and unchanged by a round trip)?"""
    return lambda a, key: math.isfinite(a) and float(_round(fmt, a)) == a


# -- 01: float formats --------------------------------------------------------------------------------
register(Exercise(
    "bf16_of_257", ("01",),
    "Predict the value 257.0 becomes when it is stored in bf16 (labkit.formats.get('bf16').round checks you).",
    "number", lambda: float(_round(_bf16, 257.0)),
    hints=(
        Hint(lambda a, key: a == 257.0,
             f"bf16 has {_bf16.mantissa_bits + 1} significant bits ({_bf16.mantissa_bits} stored, 1 implicit): "
             "257 = 2^8 + 1 needs 9, so bf16 cannot hold it."),
        Hint(lambda a, key: a == key + _spacing(_bf16, key) and a > 257,
             "258 is what round-half-up would give: 257 lies exactly halfway between two bf16 neighbours, and "
             "bf16 (like every IEEE format, and ml_dtypes) rounds a tie to the neighbour with an *even* mantissa."),
        Hint(lambda a, key: not _is_value_of(_bf16)(a, key),
             lambda a, key: f"{a:g} is not a bf16 value: in [2^8, 2^9) bf16 values are "
                            f"{_spacing(_bf16, 2.0**8):g} apart (2^8 / 2^7)."),
    ),
    otherwise="That is a bf16 value, but not the nearest one to 257: round to nearest, ties to even.",
    why="257 is a tie between 256 and 258; ties go to the even mantissa, 1.0000000 x 2^8."))

register(Exercise(
    "fp16_of_65520", ("01",),
    "Predict the value 65520.0 becomes in fp16 (numpy.float16(65520.0) checks you).",
    "number", lambda: float(_round(_fp16, 65520.0)),
    hints=(
        Hint(lambda a, key: a == _fp16.max,
             "65520 lies exactly halfway between fp16's largest value and the next step up (which would need "
             "exponent 16, which fp16 lacks). A tie goes to the neighbour with an even mantissa, and 65504's "
             "mantissa, 1111111111, is odd."),
        Hint(lambda a, key: math.isnan(a),
             "IEEE round-to-nearest never turns a finite number into NaN (NaN comes from 0/0 and the like): what "
             "does an overflow give?"),
        Hint(lambda a, key: a == -key, "Rounding keeps the sign."),
        Hint(lambda a, key: a == 65520.0,
             f"fp16 cannot hold 65520: above 2^15 its values are {_spacing(_fp16, 2.0**15):g} apart, and 65520 "
             "sits exactly halfway between the max and the next step up. Which way does a tie go?"),
        Hint(lambda a, key: math.isfinite(a),
             lambda a, key: f"{a:g} is finite; 65520 = max + ulp/2 is where round-to-nearest leaves fp16's finite "
                            "range."),
    ),
    why="65520 = max + ulp/2 is a tie; the even neighbour is past the max, so the cast overflows to inf."))


def _e4m3_in_1_2() -> int:
    values = np.arange(2**_e4m3.bits, dtype=np.uint8).view(_e4m3.dtype).astype(np.float64)
    return int(np.count_nonzero((values >= 1.0) & (values < 2.0)))


register(Exercise(
    "e4m3_values_in_1_2", ("01",),
    "How many fp8_e4m3 values lie in [1, 2)? (Decode all 256 bit patterns to check.)",
    "integer", _e4m3_in_1_2,
    hints=(
        Hint(lambda a, key: a == 2 ** (_e4m3.mantissa_bits + 1),
             f"That counts {_e4m3.mantissa_bits + 1} mantissa bits: e4m3 stores {_e4m3.mantissa_bits}, "
             "and the leading 1 is implicit."),
        Hint(lambda a, key: a == key - 1, "One short: [1, 2) includes 1.0 itself (mantissa 000)."),
        Hint(lambda a, key: a == key + 1, "One too many: [1, 2) stops before 2.0, which starts the next binade."),
        Hint(lambda a, key: a in (2**_e4m3.bits, 2 ** (_e4m3.bits - 1)),
             "That counts bit patterns of the whole format; [1, 2) is one binade, one exponent."),
    ),
    otherwise="Within one binade [2^e, 2^(e+1)) a format has one value per mantissa bit pattern.",
    why="One binade, one value per mantissa pattern: 2^3, spaced 2^-3 apart."))

# -- 02: underflow ------------------------------------------------------------------------------------
register(Exercise(
    "fp16_smallest_subnormal", ("02",),
    "What is the smallest positive number fp16 can store? (A float within 1% is right.)",
    "number", lambda: float(_fp16.smallest_subnormal), rel_tol=0.01,
    hints=(
        Hint(lambda a, key: math.isclose(a, _fp16.smallest_normal, rel_tol=0.01),
             "That is fp16's smallest *normal* number, 2^-14. Below it fp16 has subnormals, which give up one "
             f"mantissa bit per binade: {_fp16.mantissa_bits} more binades."),
        Hint(lambda a, key: math.isclose(a, key / 2, rel_tol=0.01),
             "That is the rounding threshold: values at or below it round to 0 (a tie there goes to 0, the even "
             "neighbour), values just above it round up. fp16 does not store it."),
        Hint(lambda a, key: any(math.isclose(a, lf.get(n).smallest_subnormal, rel_tol=0.01) for n in ("fp32", "bf16")),
             "That is fp32's or bf16's smallest subnormal (8 exponent bits); fp16 has 5."),
        Hint(lambda a, key: a <= 0, "A positive number, please: the smallest magnitude above zero."),
        Hint(lambda a, key: a > key,
             "fp16 stores smaller numbers than that: think of the subnormals below 2^-14."),
    ),
    otherwise="fp16 cannot store a positive number that small: it rounds to 0 or up.",
    why="2^-24 (about 5.96e-8): 2^-14 (smallest normal) x 2^-10 (the last mantissa bit)."))

register(Exercise(
    "fp16_of_5e_8", ("02",),
    "What does 5e-8 become in fp16? (Below 2^-14 fp16 is subnormal; a float within 1% is right.)",
    "number", lambda: float(_round(_fp16, 5e-8)), rel_tol=0.01,
    hints=(
        Hint(lambda a, key: a == 0,
             "5e-8 is below the smallest subnormal but above half of it, so round-to-nearest rounds it *up*, "
             "not to zero."),
        Hint(lambda a, key: math.isclose(a, 5e-8, rel_tol=0.01),
             "fp16 cannot hold 5e-8: the subnormals are multiples of the smallest one, 2^-24."),
    ),
    otherwise="Not an fp16 subnormal near 5e-8: the subnormals are multiples of 2^-24.",
    why="5e-8 rounds up to 2^-24 ~ 5.96e-8: kept, but with a 19% error -- one significant bit."))


# -- 03: loss scaling ---------------------------------------------------------------------------------
def gradient_sample(seed: int = 0, n: int = 10_000) -> np.ndarray:
    """The gradients of the loss-scale exercise: `n` float32 values, log2|g| ~ Normal(-20, 3.5), random signs.

    Deterministic for a seed (numpy's PCG64 ``default_rng``): plot it with
    ``labkit.scaling.plot_gradient_histogram(gradient_sample())``.

    >>> g = gradient_sample()
    >>> g.dtype, g.shape
    (dtype('float32'), (10000,))
    """
    seed = integer("seed", seed, minimum=0, maximum=2**63 - 1)
    n = integer("n", n, minimum=2, maximum=10**7)
    rng = np.random.default_rng(seed)
    mag = np.exp2(rng.normal(-20.0, 3.5, n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def _scale_key():
    from labkit.scaling import safe_scale_range

    r = safe_scale_range(gradient_sample(), "fp16")  # lo_normal = 2^-14 / min|g|, hi = 65504 / max|g|
    return r.lo_normal, r.hi, r.min_abs, r.max_abs


register(Exercise(
    "loss_scale_for_sample", ("03",),
    "gradient_sample() holds one step's gradients. Pick a static loss scale S (a power of two) with which, "
    "in fp16, no gradient overflows and even the smallest |g| of the sample is a normal number (>= 2^-14).",
    "number", _scale_key, accepts=lambda a, k: is_pow2(a) and k[0] <= a <= k[1],
    hints=(
        Hint(lambda a, k: not is_pow2(a),
             "Use a power of two: multiplying and dividing by 2^k changes only the exponent, so scaling and "
             "unscaling are exact (and S must be > 0)."),
        Hint(lambda a, k: a * k[3] > _fp16.max,
             lambda a, k: f"max|g| x S = {k[3] * a:.4g} > {_fp16.max:g}: the largest gradients overflow to inf "
                          "(a dynamic scaler would skip the step and halve S)."),
        Hint(lambda a, k: a in (2.0**15, 2.0**16),
             lambda a, k: f"{a:g} is a common default (static 2^15; GradScaler starts at 2^16), but here min|g| "
                          f"x S = {k[2] * a:.3g} < 2^-14: the smallest gradients stay subnormal or vanish."),
        Hint(lambda a, k: a * k[2] < _fp16.smallest_normal,
             lambda a, k: f"min|g| x S = {k[2] * a:.3g} < 2^-14 ~ 6.1e-5: the smallest gradients stay subnormal "
                          "(fewer bits) or flush to zero. Scale up."),
    ),
    why="In range: max|g| x S stays below 65504 and min|g| x S is normal."))


register(Exercise(
    "gradscaler_after_2_overflows", ("03", "04"),
    "torch.amp.GradScaler starts at 2^16 (growth_interval=2000). Steps 0 and 1 overflow, then 2000 steps are "
    "clean. What is the scale after the last of them? (labkit.scaling.simulate('torch', ...) replays it.)",
    "number", lambda: final_scale("torch", 2, 2000, init_scale=2**16, growth_interval=2000),
    hints=(
        Hint(lambda a, key: a == 2.0**16, "Each overflow halves the scale (backoff_factor=0.5) and skips the step."),
        Hint(lambda a, key: a == 2.0**14,
             "After growth_interval (2000) clean steps in a row GradScaler doubles the scale (growth_factor=2)."),
        Hint(lambda a, key: a > 2.0**16,
             "Growth is once per 2000 clean steps, and it starts from where the overflows left the scale."),
    ),
    why="2^16 -> 2^15 -> 2^14 on the overflows, then one doubling after 2000 clean steps."))


# -- 10: pure bf16 updates ----------------------------------------------------------------------------
register(Exercise(
    "bf16_update_1e_3", ("10",),
    "A weight w = 1.0 is kept in bf16 (pure bf16, no fp32 master copy). The optimizer adds 1e-3 and the "
    "result is stored back in bf16. What is w now?",
    "number", lambda: float(_round(_bf16, 1.0 + 1e-3)),
    hints=(
        Hint(lambda a, key: math.isclose(a, 1.001, rel_tol=1e-6),
             f"bf16 cannot hold 1.001: just above 1 its values are 2^-7 = {_spacing(_bf16, 1.0):g} apart."),
        Hint(lambda a, key: a == 1.0 + _spacing(_bf16, 1.0) and a != key,
             "That is the next bf16 value above 1, but 1e-3 is less than half the gap to it: round to nearest "
             "goes the other way."),
    ),
    otherwise="Round 1 + 1e-3 to the nearest bf16 value.",
    why="The update is rounded away: the weight stalls. Stochastic rounding or Kahan summation (notebook 10) "
        "or an fp32 master copy keep it."))

__all__ = ["gradient_sample"]
