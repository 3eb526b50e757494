"""Every preset: the facts in the preset table (floor, ceiling, what happens on overflow) hold
when replayed. (Each replay is pinned, and checked against ``adjust``, in test_scaling_replays.py.)"""

import math

import numpy as np
import pytest

from labkit import scaling
from labkit.scaling.deepspeed import CONFIG_DEFAULTS

NAMES = list(scaling.PRESETS)
REQUIRED = {"optax": {"max_consecutive_errors": 2}}


# -- the table's facts, replayed ----------------------------------------------------------

def final_after(name, overflow, steps, **opts):
    opts = {**REQUIRED.get(name, {}), **opts}
    return scaling.simulate(name, [overflow] * steps, **opts).final_scale


@pytest.mark.parametrize("name, floor", [
    ("torch", 0.0), ("keras", 0.0), ("tf-keras", 1.0), ("jmp", 1.0), ("apex", 0.0),
    ("deepspeed-fp16-optimizer", 1.0), ("seed004", 0.0), ("dynamic", 0.0),
])
def test_after_many_overflows_the_scale_ends_at_the_documented_floor(name, floor):
    assert final_after(name, True, 1200) == floor


def test_float32_scales_reach_zero_in_166_halvings_float64_in_1091():
    assert final_after("torch", True, 166) == 0.0 and final_after("torch", True, 165) > 0
    assert final_after("apex", True, 1091) == 0.0 and final_after("apex", True, 1090) > 0


def test_deepspeed_stops_training_at_its_floor():
    t = scaling.simulate("deepspeed", [True] * 100)
    # hysteresis 2 forgives step 0; steps 1..16 halve 2**16 down to 1; step 17 arrives at the floor: raise
    assert t.stopped_at == 17 and t.scales[-1] == 1 and len(t) == 18


@pytest.mark.parametrize("name, ceiling", [
    ("torch", 2.0**127), ("tf-keras", 2.0**127), ("jmp", 2.0**127), ("keras", math.inf), ("apex", 2.0**24),
])
def test_after_many_clean_steps_the_scale_ends_at_the_documented_ceiling(name, ceiling):
    p = scaling.PRESETS[name]
    assert final_after(name, False, 200, **{p.interval_option: 1}) == ceiling


def test_python_number_scales_grow_past_float32():
    # DeepSpeed 0.19.8 grows from the 2nd clean step on (stable_interval = cur_iter - last - 1 > 0)
    assert final_after("deepspeed", False, 200, loss_scale_window=1) == 2.0**215
    assert final_after("seed004", False, 200, growth_interval=1) == 2.0**216


@pytest.mark.parametrize("name", NAMES)
def test_on_overflow_the_update_is_skipped_or_applied_as_documented(name):
    t = scaling.simulate(name, [True], **REQUIRED.get(name, {}))
    applies = "applied" in scaling.PRESETS[name].on_overflow
    assert bool(t.applied[0]) is applies
    assert bool(t.poisoned[0]) is applies


def test_deepspeed_preset_defaults_are_the_fp16_config_defaults():
    d = scaling.PRESETS["deepspeed"].defaults
    assert d["init_scale"] == 2 ** CONFIG_DEFAULTS["initial_scale_power"]
    assert d["loss_scale_window"] == CONFIG_DEFAULTS["loss_scale_window"]
    assert d["hysteresis"] == CONFIG_DEFAULTS["hysteresis"]
    assert d["consecutive_hysteresis"] == CONFIG_DEFAULTS["consecutive_hysteresis"]
    assert d["min_loss_scale"] == CONFIG_DEFAULTS["min_loss_scale"]


def test_library_defaults_named_in_the_issue():
    defaults = {n: scaling.PRESETS[n].defaults for n in scaling.LIBRARY_PRESETS}
    assert (defaults["torch"]["init_scale"], defaults["torch"]["growth_interval"]) == (2**16, 2000)
    assert (defaults["torch"]["growth_factor"], defaults["torch"]["backoff_factor"]) == (2.0, 0.5)
    assert (defaults["keras"]["initial_scale"], defaults["keras"]["dynamic_growth_steps"]) == (2**15, 2000)
    assert defaults["apex"]["max_loss_scale"] == 2**24
    assert set(scaling.LIBRARY_PRESETS) <= set(scaling.PRESETS)


def test_generic_names_map_to_each_librarys_own_option():
    for name in scaling.LIBRARY_PRESETS:
        p = scaling.PRESETS[name]
        t = scaling.simulate(name, [False] * 3, init_scale=8, growth_interval=3)
        assert t.options[p.init_option] == 8 and t.options[p.interval_option] == 3


def test_preset_table_has_a_row_per_preset_with_its_source():
    table = scaling.preset_table()
    assert table.column("preset") == NAMES
    assert table.column("init scale")[0] == "2**16"
    assert table.column("init scale") == ["2**16", "2**15", "2**15", "2**16", "2**16", "2**15", "2**16", "-",
                                          "2**16", "2**15", "2**15", "-"]
    assert all(src for src in table.column("source"))
    assert "<table>" in table._repr_html_()


def test_trace_reads_extras_as_attributes_and_summarises():
    t = scaling.simulate("deepspeed", [True, False], init_scale=4)
    assert t.hysteresis.tolist() == [1, 1]
    assert t.counter is None and scaling.simulate("torch", [False]).counter.tolist() == [1]
    with pytest.raises(AttributeError, match="tracked here: hysteresis"):
        t.growth_tracker
    assert t.summary()["skipped"] == 1 and "1 skipped" in repr(t)


def test_overflow_patterns():
    assert scaling.overflow_pattern("x..x").tolist() == [True, False, False, True]
    assert scaling.overflow_pattern("burst", 5, start=1, length=2).tolist() == [False, True, True, False, False]
    assert scaling.overflow_pattern("none", 3).tolist() == [False] * 3
    r = scaling.overflow_pattern("random", 10000, p=0.1, seed=1)
    assert r.dtype == bool and 800 < r.sum() < 1200
    np.testing.assert_array_equal(r, scaling.overflow_pattern("random", 10000, p=0.1, seed=1))


def test_closed_loop_scale_settles_under_fmt_max_over_amax():
    amax = np.full(400, 0.5)
    t = scaling.simulate_closed_loop("torch", amax, "fp16", growth_interval=10)
    # fp16 max 65504: 0.5 * 2**17 = 65536 rounds to inf, 0.5 * 2**16 = 32768 does not
    assert t.scales[~t.overflows].max() == 2.0**16
    assert (t.scales[t.overflows] == 2.0**17).all() and t.overflows.sum() == 36
    high = scaling.simulate_closed_loop("keras", amax, "fp16", init_scale=2.0**20)
    assert high.overflows[:5].tolist() == [True] * 4 + [False] and high.scales[4] == 2.0**16


def test_traces_table_has_a_row_per_trace():
    flags = scaling.overflow_pattern("xxxx.")
    table = scaling.traces_table({n: scaling.simulate(n, flags, init_scale=4) for n in ("torch", "tf-keras")})
    assert table.column("final scale") == ["0.25", "1"] and table.column("skipped") == ["4", "4"]
    stopped = scaling.traces_table(scaling.simulate("deepspeed", [True] * 5, init_scale=2, hysteresis=1))
    assert stopped.column("stopped") == ["step 1"]
    with pytest.raises(TypeError, match="Trace objects"):
        scaling.traces_table({"a": 1})


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "tf32", "fp32"])
def test_the_overflow_threshold_is_where_rounding_to_the_format_turns_non_finite(fmt):
    from labkit import formats as lf
    from labkit.scaling.trace import overflow_threshold

    f = lf.get(fmt)
    t = overflow_threshold(f)
    assert not math.isfinite(float(f.round(t))) and math.isfinite(float(f.round(np.nextafter(t, 0))))
    x = np.random.default_rng(0).uniform(0.5, 2.0, 2000) * f.max  # around max: both sides of the threshold
    np.testing.assert_array_equal(x >= t, ~np.isfinite(f.round(x)))


def test_closed_loop_agrees_with_rounding_each_step_through_the_format():
    from labkit import formats as lf

    fp16 = lf.get("fp16")
    amax = np.random.default_rng(1).uniform(0.2, 2.0, 300)
    for name in ("torch", "deepspeed", "jmp"):
        t = scaling.simulate_closed_loop(name, amax, "fp16", growth_interval=3)
        state, scales, overflows = scaling.PRESETS[name].create(growth_interval=3), [], []
        for a in amax:
            scales.append(float(state.loss_scale))
            overflows.append(not math.isfinite(float(fp16.round(a * state.loss_scale))))
            state = state.adjust(not overflows[-1])
        assert t.overflows.tolist() == overflows and t.scales.tolist() == scales
        assert 0 < t.overflows.sum() < len(amax)


def test_seed004s_int_scale_stops_where_python_cannot_halve_it():
    # the seed's scale stays an int while it only grows; past float64's range `scale /= 2` raises
    flags = [False] * 1010 + [True, False]
    for engine in ("fast", "adjust"):
        t = scaling.simulate("seed004", flags, growth_interval=1, engine=engine)
        assert t.stopped_at == 1010 and len(t) == 1011 and t.scales[-1] == math.inf
        assert "integer division result too large for a float" in t.stop_reason
    assert scaling.simulate("seed004", [False] * 1000 + [True], growth_interval=1).stopped_at is None


def test_deepspeed_int_scales_run_up_to_2_to_the_1023():
    t = scaling.simulate("deepspeed", [False, True, True], initial_scale_power=1023, hysteresis=1)
    assert type(t.options["init_scale"]) is int and t.scales.tolist() == [2.0**1023, 2.0**1023, 2.0**1022]
    with pytest.raises(ValueError, match="initial_scale_power must be an integer from -1074 to 1023; got 1024"):
        scaling.simulate("deepspeed", [False], initial_scale_power=1024)


def test_a_state_built_by_hand_is_checked_but_a_replayed_one_may_reach_0_or_inf():
    with pytest.raises(ValueError, match="loss_scale must be a finite number > 0"):
        scaling.TorchGradScaler(loss_scale=0.0)
    with pytest.raises(ValueError, match="loss_scale must be a number > 0 that float32 holds"):
        scaling.TorchGradScaler(loss_scale=1e39)
    s = scaling.TorchGradScaler(loss_scale=2.0**-149)
    assert s.adjust(False).loss_scale == 0.0 and s.adjust(False).adjust(True).loss_scale == 0.0
    k = scaling.KerasLossScale(loss_scale=2.0**127, dynamic_growth_steps=1)
    assert k.adjust(True).loss_scale == math.inf


def test_preset_table_takes_one_name_or_a_list():
    assert scaling.preset_table("torch").column("preset") == ["torch"]
    assert scaling.preset_table(("jmp", "apex")).column("preset") == ["jmp", "apex"]
    with pytest.raises(ValueError, match="unknown names 'pytorch'; choose one of 'torch'"):
        scaling.preset_table(["torch", "pytorch"])
    with pytest.raises(TypeError, match="names must be a name or a list of names"):
        scaling.preset_table(0)


def test_traces_table_wants_traces_and_tells_two_of_one_preset_apart_by_a_dict():
    a, b = scaling.simulate("torch", [True]), scaling.simulate("torch", [False])
    for bad in ([1], "torch", 1, [a, None]):
        with pytest.raises(TypeError, match="traces must be a Trace, a list of Traces or {label: Trace}"):
            scaling.traces_table(bad)
    with pytest.raises(ValueError, match="two 'torch' traces"):
        scaling.traces_table([a, b])
    assert scaling.traces_table({"a": a, "b": b}).column("rule") == ["a", "b"]
