"""Transformer Engine's per-tensor FP8 scaling, against vectors worked out from its source
(transformer_engine/common/recipe/delayed_scaling.cu and recipe_common.cuh)."""

import math

import numpy as np
import pytest

import labkit.formats as lf
from labkit.scaling import fp8


def seq(*amaxes):
    return [np.array([a], np.float32) for a in amaxes]


def test_delayed_scaling_uses_the_max_of_the_last_history_len_amaxes_one_step_late():
    # scale at step t = 448 / max(amax[t-L .. t-1]); step 0 uses TE's initial scale 1
    t = fp8.delayed_scaling(seq(1, 2, 4, 1, 1, 1), "fp8_e4m3", amax_history_len=3)
    assert t.scales.tolist() == [1, 448, 224, 112, 112, 112]
    # step 1: 2 * 448 = 896 is past e4m3's max: clipped (TE casts with __NV_SATFINITE)
    assert t.saturated.tolist() == [0, 1, 1, 0, 0, 0]
    recent = fp8.delayed_scaling(seq(1, 2, 4, 1, 1, 1), "fp8_e4m3", amax_compute_algo="most_recent")
    assert recent.scales.tolist() == [1, 448, 224, 112, 448, 448]


def test_history_len_one_equals_most_recent():
    amaxes = seq(*np.random.default_rng(0).uniform(0.1, 10, 30))
    a = fp8.delayed_scaling(amaxes, "fp8_e5m2", amax_history_len=1)
    b = fp8.delayed_scaling(amaxes, "fp8_e5m2", amax_compute_algo="most_recent", amax_history_len=7)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_margin_divides_the_scale_by_a_power_of_two():
    t = fp8.delayed_scaling(seq(1, 1), "fp8_e5m2", margin=2)
    assert t.scales.tolist() == [1, 57344 / 4]


def test_an_all_zero_step_keeps_the_scale_and_the_history():
    # kernel_bulk skips the roll when the recorded amax is 0; amax 0 keeps the old scale
    t = fp8.delayed_scaling(seq(4, 0, 0, 1), "fp8_e4m3", amax_history_len=2)
    assert t.scales.tolist() == [1, 112, 112, 112]
    t = fp8.delayed_scaling(seq(4, 0, 1, 1), "fp8_e4m3", amax_history_len=2)
    assert t.scales.tolist() == [1, 112, 112, 112]  # window after step 2: (4, 1): still 4


def test_a_tiny_amax_gives_float32_max_not_inf():
    tiny = float(np.float32(1e-45))
    t = fp8.delayed_scaling(seq(tiny, 1), "fp8_e4m3")
    assert t.scales[1] == np.finfo(np.float32).max
    assert fp8.current_scale(tiny, "fp8_e4m3") == np.finfo(np.float32).max


def test_scales_are_float32_quotients():
    t = fp8.delayed_scaling(seq(3, 3), "fp8_e4m3")
    assert t.scales[1] == float(np.float32(448) / np.float32(3))
    assert fp8.current_scale(3.0, "fp8_e5m2") == float(np.float32(57344) / np.float32(3))


def test_current_scale_special_cases():
    assert fp8.current_scale(0.0, "fp8_e4m3") == 1.0
    assert fp8.current_scale(math.inf, "fp8_e4m3") == 1.0
    assert fp8.current_scale(math.nan, "fp8_e4m3") == 1.0
    assert fp8.current_scale(1e-3, "fp8_e4m3", amax_epsilon=1.0) == 448.0
    assert fp8.current_scale(3.0, "fp8_e4m3", power_2_scale=True) == 128.0


def test_current_scaling_never_saturates():
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(256).astype(np.float32) * 10.0 ** rng.uniform(-3, 3) for _ in range(20)]
    for name in ("fp8_e4m3", "fp8_e5m2"):
        t = fp8.current_scaling(xs, name)
        assert (t.saturated == 0).all()
        assert all(math.isclose(s * a, lf.get(name).max, rel_tol=1e-6) for s, a in zip(t.scales, t.amax))


def test_cast_rounds_like_ml_dtypes_inside_the_range_and_saturates_outside():
    f = lf.get("fp8_e4m3")
    x = np.random.default_rng(3).uniform(-400, 400, 2000).astype(np.float32)
    q, sat, und = fp8.cast(x, f, 1.0)
    np.testing.assert_array_equal(q, x.astype(f.dtype).astype(np.float64))
    assert sat == 0
    q, sat, _ = fp8.cast(np.array([460, 470, -1000, 2.0**-11], np.float32), f, 1.0)
    assert q.tolist() == [448, 448, -448, 0] and sat == 2
    assert fp8.cast(np.array([2.0**-11, 0.0], np.float32), f, 1.0)[2] == 1  # flushed; the 0 does not count


def test_hybrid_uses_e4m3_forward_and_e5m2_backward():
    out = fp8.fp8_recipe(seq(1, 2), seq(1e-3, 1e-3), "current", "HYBRID")
    assert (out["forward"].format, out["backward"].format) == ("fp8_e4m3", "fp8_e5m2")
    out = fp8.fp8_recipe(seq(1, 2), seq(1e-3, 1e-3), "delayed", "E4M3", amax_history_len=4)
    assert (out["forward"].format, out["backward"].format) == ("fp8_e4m3", "fp8_e4m3")
    table = fp8.fp8_table({"fwd": out["forward"], "bwd": out["backward"]})
    assert table.column("format") == ["fp8_e4m3", "fp8_e4m3"]


def test_bad_input():
    with pytest.raises(ValueError, match="fp8 format"):
        fp8.delayed_scaling(seq(1), "fp16")
    with pytest.raises(ValueError, match="unknown amax_compute_algo 'mean'; choose one of 'max', 'most_recent'"):
        fp8.delayed_scaling(seq(1), amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len must be an integer >= 1"):
        fp8.delayed_scaling(seq(1), amax_history_len=0)
    with pytest.raises(ValueError, match="margin must be a finite number >= 0 and <= 30"):
        fp8.delayed_scaling(seq(1), margin=float("nan"))
    with pytest.raises(ValueError, match="empty"):
        fp8.current_scaling([])
    with pytest.raises(ValueError, match="finite"):
        fp8.current_scaling([np.array([np.inf])])
    with pytest.raises(ValueError, match="unknown fp8_format 'E5M2'; choose one of 'HYBRID', 'E4M3'"):
        fp8.fp8_recipe(seq(1), seq(1), fp8_format="E5M2")
    with pytest.raises(ValueError, match="unknown recipe 'jit'; choose one of 'delayed', 'current'"):
        fp8.fp8_recipe(seq(1), seq(1), recipe="jit")


def delayed_scales_by_the_roll(tensors, fmt, n, algo="max", margin=0):
    """The docstring's pseudocode, the history rolled as TE's kernel_bulk does: the reference."""
    f = lf.get(fmt)
    scaled_max = float(np.float32(f.max) * np.float32(2.0**-margin))
    history, scale, scales = [0.0] * n, 1.0, []
    for x in tensors:
        scales.append(scale)
        last = float(np.abs(x).max())
        history[0] = last
        window = 0.0
        if last != 0:
            window = max(history)
            history = [0.0] + history[2:] + [last] if n > 1 else [0.0]
        amax = last if algo == "most_recent" else window
        if amax > 0:
            scale = float(np.float32(scaled_max) / np.float32(amax))
        if math.isinf(scale):
            scale = float(np.finfo(np.float32).max)
    return scales


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1024, 10**400])
def test_the_sliding_window_gives_the_scales_of_the_rolled_history(n):
    rng = np.random.default_rng(n % 1000)
    amaxes = rng.uniform(0.01, 10, 200) * (rng.random(200) < 0.8)  # a fifth of the steps all zero
    xs = seq(*amaxes.astype(np.float32))
    for algo in ("max", "most_recent"):
        reference = delayed_scales_by_the_roll(xs, "fp8_e4m3", min(n, 201), algo, margin=1)
        t = fp8.delayed_scaling(xs, amax_history_len=n, amax_compute_algo=algo, margin=1)
        assert t.scales.tolist() == reference


def test_all_steps_cast_at_once_equal_one_cast_per_step():
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal(int(rng.integers(1, 40))).astype(np.float32) * 10.0 ** rng.uniform(-6, 3)
          for _ in range(30)]
    t = fp8.delayed_scaling(xs, "fp8_e4m3", amax_history_len=4)
    f = lf.get("fp8_e4m3")
    for i, (x, s) in enumerate(zip(xs, t.scales)):
        q, n_sat, n_und = fp8.cast(x, f, s)
        assert t.saturated[i] == n_sat / x.size and t.underflow[i] == n_und / max(int((x != 0).sum()), 1)
        ref = x.astype(np.float64)
        err = np.sqrt(((q / s - ref) ** 2).sum()) / np.sqrt((ref**2).sum())
        assert t.error[i] == pytest.approx(err, rel=1e-12) and t.amax[i] == np.abs(ref).max()
    assert (t.saturated > 0).any() and (t.underflow > 0).any()  # the comparison saw both


@pytest.mark.parametrize("bad, error", [(None, TypeError), ("a", TypeError), (float("nan"), ValueError),
                                        (float("inf"), ValueError), (0, ValueError), (-1.0, ValueError),
                                        (10**400, ValueError), (1e39, ValueError), (1e-46, ValueError),
                                        (True, TypeError), ([1.0], TypeError)])
def test_cast_refuses_a_scale_that_is_not_a_float32_number_above_zero(bad, error):
    with pytest.raises(error, match="scale must be"):
        fp8.cast([1.0], "fp8_e4m3", bad)


@pytest.mark.parametrize("bad, error", [(None, TypeError), ("a", TypeError), ([1.0], TypeError),
                                        (True, TypeError), (-1.0, ValueError), (10**400, ValueError)])
def test_current_scale_refuses_an_amax_that_is_not_a_number_at_least_zero(bad, error):
    with pytest.raises(error, match="amax must be"):
        fp8.current_scale(bad, "fp8_e4m3")


@pytest.mark.parametrize("x", [[float("nan")], [float("inf")], [1e39], [10**400]])
def test_cast_refuses_values_beyond_float32(x):
    with pytest.raises(ValueError, match="x must hold finite numbers within float32's range|x holds a number too"):
        fp8.cast(x, "fp8_e4m3", 1.0)


@pytest.mark.parametrize("x", [None, "a", [True, False], [1.0, None], {"a": 1.0}])
def test_cast_refuses_what_is_not_real_numbers(x):
    with pytest.raises(TypeError, match="x must be an array of real numbers"):
        fp8.cast(x, "fp8_e4m3", 1.0)


def test_tensors_may_be_one_number_per_step_or_ragged_arrays():
    per_step = fp8.current_scaling([1.0, 2.0, 4.0], "fp8_e4m3")
    assert per_step.scales.tolist() == [448.0, 224.0, 112.0]
    ragged = fp8.current_scaling([np.ones(3), np.ones(5) * 2], "fp8_e4m3")
    assert ragged.scales.tolist() == [448.0, 224.0]
    for bad, error in [([np.ones(2), [True]], TypeError), ([[1.0], [10**400]], ValueError), ([[]], ValueError),
                       ("abc", TypeError), (5, TypeError)]:
        with pytest.raises(error, match="tensors"):
            fp8.current_scaling(bad)


def test_recipe_options_and_the_table_input_are_checked():
    with pytest.raises(TypeError, match="recipe 'current' has no option 'margin'; its options are: power_2_scale"):
        fp8.fp8_recipe(seq(1), seq(1), "current", margin=1)
    with pytest.raises(TypeError, match="recipe must be one of"):
        fp8.fp8_recipe(seq(1), seq(1), recipe=None)
    for bad in ([fp8.current_scaling(seq(1))], None, {"a": 1}):
        with pytest.raises(TypeError, match="traces must"):
            fp8.fp8_table(bad)
    assert fp8.fp8_table(fp8.current_scaling(seq(1))).column("tensor / recipe") == ["current"]


@pytest.mark.parametrize("name, bad, error", [
    ("margin", -1, ValueError), ("margin", 31, ValueError), ("margin", 10**400, ValueError), ("margin", "1", TypeError),
    ("amax_history_len", 0, ValueError), ("amax_history_len", 2.5, TypeError), ("amax_history_len", True, TypeError),
    ("amax_compute_algo", None, TypeError),
])
def test_delayed_scaling_options_are_refused_by_name(name, bad, error):
    with pytest.raises(error, match=name):
        fp8.delayed_scaling(seq(1, 2), **{name: bad})


@pytest.mark.parametrize("name, bad, error", [
    ("power_2_scale", 1, TypeError), ("power_2_scale", "yes", TypeError), ("amax_epsilon", -1.0, ValueError),
    ("amax_epsilon", float("nan"), ValueError), ("amax_epsilon", 1e39, ValueError), ("amax_epsilon", None, TypeError),
])
def test_current_scaling_options_are_refused_by_name(name, bad, error):
    with pytest.raises(error, match=name):
        fp8.current_scaling(seq(1, 2), **{name: bad})
    with pytest.raises(error, match=name):
        fp8.current_scale(1.0, "fp8_e4m3", **{name: bad})


def scale_from_amax_one_by_one(amax, fmt, power_2_scale=False, amax_epsilon=0.0):
    """recipe_common.cuh's compute_scale_from_amax, one float32 at a time: the reference."""
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    with np.errstate(over="ignore"):
        amax = f32(amax)
    if amax < amax_epsilon:
        amax = f32(amax_epsilon)
    if math.isinf(amax) or amax == 0 or math.isnan(amax):
        return 1.0
    with np.errstate(over="ignore"):
        scale = f32(np.float32(lf.get(fmt).max) / np.float32(amax))
    if math.isinf(scale):
        scale = float(np.finfo(np.float32).max)
    return 2.0 ** math.floor(math.log2(scale)) if power_2_scale else scale


def test_current_scales_equal_te_computed_one_amax_at_a_time():
    rng = np.random.default_rng(6)
    amaxes = np.concatenate([10.0 ** rng.uniform(-46, 39, 300), [0.0, 1e-45, 3.4e38, 1e300]])
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        for p2, eps in ((False, 0.0), (True, 0.0), (False, 1e-3), (True, 2.0**-20)):
            ref = [scale_from_amax_one_by_one(a, fmt, p2, eps) for a in amaxes]
            assert [fp8.current_scale(a, fmt, power_2_scale=p2, amax_epsilon=eps) for a in amaxes] == ref
            finite = amaxes[amaxes < 3e38]
            got = fp8.current_scaling(seq(*finite), fmt, power_2_scale=p2, amax_epsilon=eps).scales.tolist()
            assert got == [scale_from_amax_one_by_one(a, fmt, p2, eps) for a in np.float32(finite)]
