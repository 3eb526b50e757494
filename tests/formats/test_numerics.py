"""Arithmetic in a narrow format: running sums, normalisation statistics, the loss, spacing."""

import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from labkit.formats.numerics import (
    Accumulation,
    binade_counts,
    compare_accumulation,
    normalization_stats,
    representable_values,
    running_sum,
    softmax_cross_entropy,
)

ALL = list(lf.FORMATS)


def loop_sum(values, name):
    """The definition: round every input, then round after every single add."""
    f = lf.get(name)
    out, s = [], None
    for v in values:
        v = f.round(float(v))
        s = v if s is None else f.round(s + v)
        out.append(s)
    return np.array(out)


@pytest.mark.parametrize("name", ALL)
def test_running_sum_rounds_after_every_add_in_every_format(name):
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.random(1500), -rng.random(200) * 3, rng.random(300) * 1e-3])
    np.testing.assert_array_equal(running_sum(values, name), loop_sum(values, name))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2])
def test_numpy_cumsum_in_a_narrow_dtype_rounds_every_step(dtype):
    # The claim in numerics' docstring: cumsum / add.accumulate do not widen.
    values = np.random.default_rng(2).random(3000).astype(dtype)
    name = lf.get(np.dtype(dtype)).name
    expected = loop_sum(values.astype(np.float64), name)
    np.testing.assert_array_equal(np.cumsum(values).astype(np.float64), expected)
    np.testing.assert_array_equal(np.add.accumulate(values).astype(np.float64), expected)


def test_numpy_sum_of_float16_is_not_a_float16_running_sum():
    values = np.random.default_rng(0).random(10_000).astype(np.float16)
    stalled = loop_sum(values.astype(np.float64), "fp16")[-1]
    assert stalled == 2048.0
    assert abs(float(np.sum(values)) - math.fsum(values.astype(np.float64))) < 8  # pairwise, in float32


def test_bf16_running_sum_of_10000_values_stalls_and_fp32_does_not():
    values = np.random.default_rng(0).random(10_000)
    acc = compare_accumulation(values, "bf16", accumulator="fp32")
    assert acc.naive_total == 256.0  # bf16's spacing at 256 is 2: every v < 1 rounds away
    assert acc.naive_rel_error > 0.9
    assert acc.stall_step is not None and acc.stall_step < 1000
    assert np.all(acc.naive[acc.stall_step:] == 256.0)
    assert acc.naive[acc.stall_step - 1] != acc.naive[acc.stall_step - 2]  # the last change
    # fp32 accumulation, rounded to bf16 once: within half a bf16 spacing of the truth
    assert abs(acc.wide_total - acc.exact_total) <= lf.get("bf16").ulp(acc.exact_total) / 2
    assert acc.wide_rel_error < 2e-3


def test_accumulation_inputs_are_the_stored_values():
    acc = compare_accumulation([0.1, 0.2], "bf16")
    assert acc.inputs.tolist() == [lf.get("bf16").round(0.1), lf.get("bf16").round(0.2)]
    assert acc.exact_total == acc.inputs.sum()
    assert acc.reference.tolist() == [acc.inputs[0], acc.inputs[0] + acc.inputs[1]]


def test_stall_step_is_none_when_the_sum_keeps_changing():
    acc = compare_accumulation(np.ones(100), "bf16")
    assert acc.stall_step is None and acc.naive_total == 100.0


def test_stall_step_points_at_the_first_step_that_changed_nothing():
    acc = compare_accumulation([1.0, 1.0, 2.0**-9, 2.0**-9, 2.0**-9], "bf16")
    assert acc.naive.tolist() == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert acc.stall_step == 2


def test_accumulation_text_names_both_accumulators():
    text = str(compare_accumulation(np.full(10_000, 0.01), "bf16"))
    assert "bf16 accumulator" in text and "fp32 accumulator" in text and "stops changing" in text


def test_fp16_normalization_statistics_overflow_and_fp32_do_not():
    x = np.linspace(-400, 400, 64)
    mean16, var16 = normalization_stats(x, "fp16")
    mean32, var32 = normalization_stats(x, "fp32")
    assert var16 == math.inf
    assert var32 == pytest.approx(np.var(x), rel=1e-6)
    assert abs(mean32) < 1e-3


def test_bf16_variance_of_many_values_is_wrong_unless_accumulated_in_fp32():
    x = np.random.default_rng(3).normal(0.0, 1.0, 8192)
    _, var_bf16 = normalization_stats(x, "bf16")
    _, var_mixed = normalization_stats(x, "bf16", accumulate="fp32")
    true = np.var(lf.get("bf16").round(x))
    assert abs(var_bf16 - true) / true > 0.5  # the 16-bit sum of squares stalls
    assert abs(var_mixed - true) / true < 0.01


def test_cross_entropy_underflows_to_inf_in_fp16_but_not_in_fp32():
    assert softmax_cross_entropy([0.0, 20.0], 0, "fp16") == math.inf
    assert softmax_cross_entropy([0.0, 20.0], 0, "fp32") == pytest.approx(20.0, rel=1e-6)
    assert softmax_cross_entropy([2.0, 1.0, 0.1], 0, "fp32") == pytest.approx(0.4170, abs=1e-4)


@pytest.mark.parametrize("bad, error", [(["a", "b"], TypeError), ("12", TypeError), ([[1.0], [2.0]], ValueError)])
def test_bad_values_are_refused_with_a_clear_error(bad, error):
    with pytest.raises(error, match="values"):
        running_sum(bad, "bf16")


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="valid names"):
        running_sum([1.0], "fp12")
    with pytest.raises(ValueError, match="at least one"):
        compare_accumulation([], "bf16")
    with pytest.raises(ValueError, match="class index in 0 .. 1"):
        softmax_cross_entropy([0.0, 1.0], 2)
    with pytest.raises(TypeError, match="integer class index"):
        softmax_cross_entropy([0.0, 1.0], 0.5)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_representable_values_match_an_enumeration_of_every_pattern(name):
    f = lf.get(name)
    values = np.asarray(f.decode(np.arange(1 << f.bits, dtype=np.uint64)))
    finite = np.unique(values[np.isfinite(values)])  # -0 and +0 collapse into one zero
    for lo, hi in [(-3.0, 5.0), (0.0, 1.0), (1e-6, 2e-3), (-f.max * 2, -f.max / 3), (0.3, 0.3)]:
        window = finite[(finite >= lo) & (finite <= hi)]
        if window.size > 100_000:
            continue
        np.testing.assert_array_equal(representable_values(f, lo, hi), window)


def test_representable_values_refuse_a_window_too_large():
    with pytest.raises(ValueError, match="narrow the window"):
        representable_values("fp32", 0.0, 1.0)
    with pytest.raises(ValueError, match="lo=2 > hi=1"):
        representable_values("fp16", 2, 1)
    with pytest.raises(TypeError, match="lo must be a number"):
        representable_values("fp16", "0", 1)


@pytest.mark.parametrize("name", ALL)
def test_binade_counts_add_up_to_every_positive_finite_value(name):
    f = lf.get(name)
    k, counts = binade_counts(f)
    m, e = f.mantissa_bits, f.exponent_bits
    # minus zero (e8m0 has none), minus the patterns of inf and NaN (all-ones exponent: every mantissa;
    # all-ones pattern: one; fnuz's NaN is the negative zero's pattern, fp4/fp6 have none)
    special = {"ieee": 1 << m, "all-ones": 1}.get(f.nan_encoding, 0)
    positive_finite = (1 << (e + m)) - f.has_zero - special
    assert counts.sum() == positive_finite
    assert 2.0 ** k[0] == f.smallest_subnormal and 2.0 ** k[-1] <= f.max < 2.0 ** (k[-1] + 1)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_binade_counts_match_an_enumeration(name):
    f = lf.get(name)
    values = np.asarray(f.decode(np.arange(1 << (f.bits - 1), dtype=np.uint64)))
    values = values[np.isfinite(values) & (values > 0)]
    k, counts = binade_counts(f)
    observed = np.bincount(np.floor(np.log2(values)).astype(int) - k[0], minlength=k.size)
    np.testing.assert_array_equal(observed, counts)


def test_accumulation_is_a_value():
    acc = compare_accumulation([1.0, 2.0], "fp16")
    assert isinstance(acc, Accumulation)
    with pytest.raises(AttributeError):
        acc.format = "bf16"


# -- tf32's running sum: float16 at a power-of-two scale, bit for bit the definition (issue 12) -------
def _tf32_inputs(kind, rng, n=240):
    if kind == "uniform":
        return rng.random(n)
    if kind == "signed, 80 decades":  # chunks that do not fit float16's window, and adds that round
        return rng.standard_normal(n) * 10.0 ** rng.integers(-40, 38, n)
    if kind == "huge and tiny, alternating":
        return np.tile([1e30, 1e-30, -1e30, 3.0], n // 4)
    if kind == "overflow to inf":
        return np.concatenate([np.full(n // 2, 3e37), -rng.random(n // 2)])
    if kind == "inf and nan inputs":
        return np.concatenate([rng.random(n // 3), [np.inf], rng.random(n // 3), [-np.inf], rng.random(n // 3)])
    if kind == "subnormal":
        return rng.standard_normal(n) * 1e-40
    if kind == "signed zeros and cancellation":
        return np.concatenate([[-0.0, -0.0, 0.0, -0.0], np.tile([1e20, -1e20, 2.0**-100, -(2.0**-100)], n // 4)])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["uniform", "signed, 80 decades", "huge and tiny, alternating", "overflow to inf",
                                  "inf and nan inputs", "subnormal", "signed zeros and cancellation"])
def test_tf32_running_sum_matches_the_one_add_at_a_time_loop(kind):
    values = _tf32_inputs(kind, np.random.default_rng(zlib.crc32(kind.encode())))
    fast, slow = running_sum(values, "tf32"), loop_sum(values, "tf32")
    np.testing.assert_array_equal(fast, slow)  # NaN where NaN
    np.testing.assert_array_equal(np.signbit(fast), np.signbit(slow))  # -0.0 where -0.0


def test_tf32_running_sum_of_the_report_s_100000_values_stalls_where_the_loop_does():
    # the report: compare_accumulation(np.full(10**5, 0.01), "tf32", "tf32") took 27 s (one f.round per add)
    acc = compare_accumulation(np.full(10**5, 0.01), "tf32", "tf32")
    stall = acc.stall_step
    assert stall is not None and stall < 4000
    np.testing.assert_array_equal(acc.naive[:stall + 2], loop_sum(np.full(stall + 2, 0.01), "tf32"))
    assert np.all(acc.naive[stall:] == acc.naive[-1]) and np.array_equal(acc.wide, acc.naive)


# -- what the numerics functions refuse (issue 12) ----------------------------------------------
@pytest.mark.parametrize("call, error, words", [
    (lambda: compare_accumulation([1.0], "bf16", "fp12"), ValueError, "accumulator: unknown float format 'fp12'"),
    (lambda: normalization_stats([1.0], "fp16", "fp12"), ValueError, "accumulate: unknown float format"),
    (lambda: normalization_stats([1.0], "fp12"), ValueError, "compute: unknown float format"),
    (lambda: softmax_cross_entropy([1.0], 0, "fp12"), ValueError, "compute: unknown float format"),
    (lambda: running_sum([10**400], "fp16"), ValueError, "values must lie within float64's range"),
    (lambda: running_sum([[1.0], [2.0, 3.0]], "fp16"), TypeError, "values must be real numbers"),
    (lambda: running_sum({"a": 1}, "fp16"), TypeError, "values must be real numbers"),
    (lambda: running_sum([1.0, None], "fp16"), TypeError, "values must be real numbers"),
    (lambda: representable_values("fp16", 0, 1, limit=float("nan")), TypeError, "limit must be an integer"),
    (lambda: representable_values("fp16", 0, 1, limit=0), ValueError, "limit must be an integer >= 1"),
    (lambda: representable_values("fp16", 10**400, 1), ValueError, "lo must be a number"),
    (lambda: representable_values("fp16", 0, float("nan")), ValueError, "hi must be a number"),
])
def test_numerics_refuse_bad_values_naming_the_parameter(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_an_accumulation_built_by_hand_is_checked():
    acc = compare_accumulation([0.5, 0.25], "fp16", "fp32")
    with pytest.raises(ValueError, match="format: unknown float format"):
        Accumulation("fp12", "fp32", acc.inputs, acc.naive, acc.wide, acc.reference)
    with pytest.raises(ValueError, match="the same number"):
        Accumulation("fp16", "fp32", acc.inputs, acc.naive[:1], acc.wide, acc.reference)
    assert str(Accumulation("half", "fp32", list(acc.inputs), acc.naive, acc.wide, acc.reference)) == str(acc)
