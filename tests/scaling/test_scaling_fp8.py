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
    with pytest.raises(ValueError, match="amax_compute_algo must be one of max, most_recent"):
        fp8.delayed_scaling(seq(1), amax_compute_algo="mean")
    with pytest.raises(ValueError, match="amax_history_len must be an integer >= 1"):
        fp8.delayed_scaling(seq(1), amax_history_len=0)
    with pytest.raises(ValueError, match="margin must be a finite number"):
        fp8.delayed_scaling(seq(1), margin=float("nan"))
    with pytest.raises(ValueError, match="empty"):
        fp8.current_scaling([])
    with pytest.raises(ValueError, match="finite"):
        fp8.current_scaling([np.array([np.inf])])
    with pytest.raises(ValueError, match="HYBRID, E4M3"):
        fp8.fp8_recipe(seq(1), seq(1), fp8_format="E5M2")
    with pytest.raises(ValueError, match="'delayed' or 'current'"):
        fp8.fp8_recipe(seq(1), seq(1), recipe="jit")
