"""The FP8 GEMM accumulation lab: its rounding against ml_dtypes / numpy, its loop against real
float16/float32 arithmetic, and the error growing with K unless the sums are promoted."""

import math

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from labkit.formats import gemm


def _normal_values(rng, n, lo_exp, hi_exp):
    """Random values spread over binades [lo_exp, hi_exp), both signs, plus exact ties of the target."""
    return rng.choice([-1, 1], n) * np.exp2(rng.uniform(lo_exp, hi_exp, n))


@pytest.mark.parametrize("bits, dtype, lo, hi", [
    (7, ml_dtypes.bfloat16, -120, 120),  # bfloat16's normal range (float32's exponent)
    (10, np.float16, -14, 15),           # float16's normal range
    (23, np.float32, -120, 120),
])
def test_round_mantissa_is_the_format_rounding_inside_its_normal_range(bits, dtype, lo, hi):
    rng = np.random.default_rng(bits)
    x = _normal_values(rng, 20000, lo, hi)
    if dtype is ml_dtypes.bfloat16:  # ml_dtypes rounds float32 -> bf16 once: give it float32 inputs
        x = x.astype(np.float32).astype(np.float64)
    # exact ties: a value of the format plus half its ulp, which round-to-nearest-even must settle
    grid = np.asarray(x).astype(dtype).astype(np.float64)
    ties = grid + np.spacing(grid.astype(dtype)).astype(np.float64) / 2
    for values in (x, ties):
        want = values.astype(dtype).astype(np.float64)
        np.testing.assert_array_equal(gemm.round_mantissa(values, bits), want)


def test_round_mantissa_passes_zero_inf_nan_and_truncates_toward_zero():
    got = gemm.round_mantissa([0.0, -0.0, math.inf, -math.inf, math.nan], 13)
    assert got[:4].tolist() == [0.0, 0.0, math.inf, -math.inf] and math.isnan(got[4])
    x = _normal_values(np.random.default_rng(1), 5000, -14, 15)  # float16's normal range
    t = gemm.round_mantissa(x, 10, rounding="toward_zero")
    assert (np.abs(t) <= np.abs(x)).all() and (np.sign(t) == np.sign(x)).all()
    # toward zero is the float16 value next to x on zero's side: nearest, or one step back
    n = x.astype(np.float16).astype(np.float64)
    back = np.where(np.abs(n) > np.abs(x), np.nextafter(n.astype(np.float16), np.float16(0)).astype(np.float64), n)
    np.testing.assert_array_equal(t, back)


def _operands(seed, m, k, n, fmt="fp8_e4m3"):
    rng = np.random.default_rng(seed)
    f = lf.get(fmt)
    return f.round(rng.standard_normal((m, k)), saturate=True), f.round(rng.standard_normal((k, n)), saturate=True)


@pytest.mark.parametrize("bits, dtype", [(23, np.float32), (10, np.float16)])
def test_fp8_matmul_without_promotion_is_a_sequential_sum_in_that_float(bits, dtype):
    a, b = _operands(bits, 3, 300, 4)
    acc = np.zeros((3, 4), dtype)
    for k in range(a.shape[1]):  # real float32 / float16 arithmetic, one add at a time
        acc = (acc + np.outer(a[:, k], b[k]).astype(dtype)).astype(dtype)
    np.testing.assert_array_equal(gemm.fp8_matmul(a, b, mantissa_bits=bits, promote_every=None), acc)


def test_promotion_adds_each_chunk_to_a_float32_register():
    a, b = _operands(5, 2, 300, 3)
    out = np.zeros((2, 3), np.float32)
    for start in range(0, 300, 128):  # chunks of 128, 128, 44: float16 inside, float32 across
        acc = np.zeros((2, 3), np.float16)
        for k in range(start, min(start + 128, 300)):
            acc = (acc + np.outer(a[:, k], b[k]).astype(np.float16)).astype(np.float16)
        out = (out + acc.astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(gemm.fp8_matmul(a, b, mantissa_bits=10, promote_every=128), out)


def test_with_53_bits_the_gemm_is_exact():
    a, b = _operands(7, 4, 200, 5)
    exact = np.array([[math.fsum(a[i] * b[:, j]) for j in range(5)] for i in range(4)])
    np.testing.assert_array_equal(gemm.fp8_matmul(a, b, mantissa_bits=52, promote_every=None), exact)


def test_operands_are_rounded_to_the_fp8_format_first():
    a, b = np.array([[0.3, 1000.0]]), np.array([[1.0], [1.0]])
    e4m3 = lf.get("fp8_e4m3")
    want = e4m3.round(0.3) + e4m3.max  # 1000 saturates at 448
    assert gemm.fp8_matmul(a, b, mantissa_bits=52)[0, 0] == want


def test_error_grows_with_k_without_promotion_and_stays_flat_with_it():
    ks = (128, 2048)
    s = gemm.sweep(ks, m=12, n=12, seed=0)
    narrow, promoted, fp32 = (s[k] for k in s if k != "ks")
    growth, flat = narrow[1] / narrow[0], promoted[1] / promoted[0]
    expected = math.sqrt(ks[1] / ks[0])  # round-to-nearest errors add like a random walk
    assert growth > expected / 2, (growth, expected)
    assert flat < 2 < growth
    assert narrow[0] == promoted[0]  # the first 128 products: the same single chunk
    assert max(fp32) < min(promoted)  # 24 bits beat 14, promoted or not
    # truncation errors all point one way: they add up faster than rounded ones
    trunc = gemm.sweep(ks, m=12, n=12, seed=0, rounding="toward_zero")
    assert trunc["14-bit accumulator"][1] > narrow[1]


def test_accumulation_error_table_and_plot():
    t = gemm.accumulation_error(ks=(256, 128), promote_every=64, seed=1)
    assert t.column("K") == ["128", "256"]
    assert t.columns[2] == "14-bit, fp32 every 64"
    fig = gemm.plot_accumulation_error(ks=(128, 256))
    assert len(fig.axes[0].lines) == 3
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.parametrize("call, error", [
    (lambda: gemm.round_mantissa([1.0], 0), ValueError),
    (lambda: gemm.round_mantissa([1.0], 2.5), TypeError),
    (lambda: gemm.round_mantissa(["a"], 3), TypeError),
    (lambda: gemm.round_mantissa([1.0], 3, rounding="up"), ValueError),
    (lambda: gemm.fp8_matmul(np.ones(3), np.ones((3, 1))), ValueError),
    (lambda: gemm.fp8_matmul(np.ones((1, 3)), np.ones((2, 1))), ValueError),
    (lambda: gemm.fp8_matmul(np.ones((1, 2)), np.full((2, 1), np.nan)), ValueError),
    (lambda: gemm.fp8_matmul(np.ones((1, 2)), np.ones((2, 1)), promote_every=0), ValueError),
    (lambda: gemm.fp8_matmul(np.ones((1, 2)), np.ones((2, 1)), fmt="fp99"), ValueError),
    (lambda: gemm.sweep([]), ValueError),
    (lambda: gemm.sweep("128"), TypeError),
    (lambda: gemm.sweep([0]), ValueError),
    (lambda: gemm.sweep([128], distribution="cauchy"), ValueError),
    (lambda: gemm.accumulation_error(ks=[128], promote_every=None), TypeError),
])
def test_bad_input_is_refused_with_a_message(call, error):
    with pytest.raises(error):
        call()
