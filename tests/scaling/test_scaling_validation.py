"""Bad input gets a ValueError or TypeError that names what is allowed."""

import numpy as np
import pytest

from labkit import scaling


@pytest.mark.parametrize("bad, error", [("pytorch", ValueError), ("", ValueError), (None, TypeError), (3, TypeError)])
def test_unknown_preset_lists_the_presets(bad, error):
    with pytest.raises(error, match="presets are: torch, keras, tf-keras"):
        scaling.simulate(bad, [False])


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                                        ("10", TypeError)])
def test_growth_interval_must_be_a_positive_integer(bad, error):
    with pytest.raises(error, match="growth_interval must be an integer"):
        scaling.simulate("torch", [False], growth_interval=bad)
    with pytest.raises(error, match=r"dynamic_growth_steps must be an integer.*\(given as growth_interval\)"):
        scaling.simulate("keras", [False], growth_interval=bad)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), True])
def test_backoff_must_lie_strictly_between_0_and_1(bad):
    error, allowed = (TypeError, "a number") if bad is True else (ValueError, "a finite number > 0 and < 1")
    with pytest.raises(error, match=f"backoff_factor must be {allowed}"):
        scaling.simulate("torch", [True], backoff_factor=bad)


@pytest.mark.parametrize("bad", [1, 0.5, 0, float("inf")])
def test_growth_must_exceed_1(bad):
    with pytest.raises(ValueError, match="growth_factor must be a finite number > 1"):
        scaling.simulate("torch", [False], growth_factor=bad)
    with pytest.raises(ValueError, match="factor must be a finite number > 1"):
        scaling.simulate("jmp", [False], factor=bad)


@pytest.mark.parametrize("bad", [[0, 1], [True, 1], np.array([0, 1]), np.array([0.0]), [None], ["x"]])
def test_overflows_must_be_booleans(bad):
    with pytest.raises(TypeError, match="booleans"):
        scaling.simulate("torch", bad)


def test_overflows_reject_strings_and_other_shapes():
    with pytest.raises(TypeError, match="overflow_pattern"):
        scaling.simulate("torch", "..x")
    with pytest.raises(TypeError, match="sequence of booleans"):
        scaling.simulate("torch", 5)
    with pytest.raises(ValueError, match="one-dimensional"):
        scaling.simulate("torch", np.zeros((2, 2), bool))


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), 10**400])
def test_init_scale_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="init_scale must be a finite number > 0"):
        scaling.simulate("torch", [False], init_scale=bad)


@pytest.mark.parametrize("bad", ["2**16", True, None, [1.0]])
def test_init_scale_must_be_a_number(bad):
    # None is "not given" (the default); any other non-number is a TypeError
    if bad is None:
        assert scaling.simulate("torch", [False], init_scale=bad).scales[0] == 2**16
        return
    with pytest.raises(TypeError, match="init_scale must be a number"):
        scaling.simulate("torch", [False], init_scale=bad)


def test_unknown_option_names_the_presets_options():
    with pytest.raises(ValueError, match="has no option 'hysteresis'; its options are: init_scale, growth_factor"):
        scaling.simulate("torch", [False], hysteresis=2)


def test_options_a_rule_does_not_have_are_refused():
    with pytest.raises(ValueError, match="preset 'optax' has no init_scale"):
        scaling.simulate("optax", [False], init_scale=4, max_consecutive_errors=1)
    with pytest.raises(ValueError, match="preset 'static' has no growth_interval"):
        scaling.simulate("static", [False], growth_interval=4)
    with pytest.raises(ValueError, match="optax has no default"):
        scaling.simulate("optax", [False])


def test_generic_and_specific_names_together_are_refused():
    with pytest.raises(ValueError, match="either init_scale or initial_scale"):
        scaling.simulate("keras", [False], init_scale=4, initial_scale=8)
    with pytest.raises(ValueError, match="either init_scale or initial_scale_power"):
        scaling.simulate("deepspeed", [False], init_scale=4, initial_scale_power=3)
    with pytest.raises(TypeError, match="initial_scale_power must be an integer"):
        scaling.simulate("deepspeed", [False], initial_scale_power=1.5)


def test_other_option_checks():
    with pytest.raises(ValueError, match="hysteresis must be an integer >= 1"):
        scaling.simulate("deepspeed", [True], hysteresis=0)
    with pytest.raises(TypeError, match="consecutive_hysteresis must be True or False"):
        scaling.simulate("deepspeed", [True], consecutive_hysteresis=1)
    with pytest.raises(ValueError, match="min_scale .* must not exceed max_scale"):
        scaling.simulate("dynamic", [True], min_scale=4.0, max_scale=2.0)
    with pytest.raises(ValueError, match="min_loss_scale must be a finite number >= 0"):
        scaling.simulate("apex", [True], min_loss_scale=-1)
    with pytest.raises(ValueError, match="unknown engine 'numba'; choose one of 'fast', 'adjust'"):
        scaling.simulate("torch", [True], engine="numba")


def test_overflow_pattern_input_checks():
    with pytest.raises(ValueError, match=r"'\.' \(clean step\) and 'x' \(overflow\)"):
        scaling.overflow_pattern("..o..")
    with pytest.raises(ValueError, match="kind"):
        scaling.overflow_pattern("")
    with pytest.raises(ValueError, match="p must be a finite number >= 0 and <= 1"):
        scaling.overflow_pattern("random", 10, p=1.5)
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        scaling.overflow_pattern("every", 10, every=0)
    with pytest.raises(ValueError, match="steps must be an integer from 1 to 10000000"):
        scaling.overflow_pattern("every", -1, every=2)
    with pytest.raises(TypeError, match="drawing"):
        scaling.overflow_pattern(3)


def test_deepspeed_options_input_checks():
    with pytest.raises(TypeError, match="dict"):
        scaling.deepspeed_options("fp16")
    with pytest.raises(ValueError, match="'zero' .* or 'fp16'"):
        scaling.deepspeed_options({"fp16": {}}, optimizer="zero3")
    with pytest.raises(ValueError, match="unknown fp16 config keys \\['loss_window'\\]"):
        scaling.deepspeed_options({"fp16": {"loss_window": 3}})
    # DeepSpeedFP16Config's own checks (DeepSpeed 0.19.8 precision_config.py)
    with pytest.raises(ValueError, match="min_loss_scale must be an integer"):
        scaling.deepspeed_options({"fp16": {"enabled": True, "min_loss_scale": 0.5}})
    with pytest.raises(ValueError, match="initial_scale_power must be an integer"):
        scaling.deepspeed_options({"fp16": {"enabled": True, "initial_scale_power": 8.5}})
    with pytest.raises(ValueError, match="loss_scale_window must be > 0 when dynamic"):
        scaling.deepspeed_options({"fp16": {"enabled": True, "loss_scale_window": 0}})
    with pytest.raises(ValueError, match="loss_scale must be a finite number >= 0"):
        scaling.deepspeed_options({"fp16": {"enabled": True, "loss_scale": True}})
    assert scaling.deepspeed_options({"fp16": {"enabled": True, "loss_scale": 4, "loss_scale_window": 0}})[0] == "static"
    assert scaling.deepspeed_options({"fp16": {"enabled": True, "initial_scale_power": 8.0}})[1]["init_scale"] == 256


def test_closed_loop_input_checks():
    with pytest.raises(ValueError, match="amax must be a 1-D sequence of finite numbers >= 0"):
        scaling.simulate_closed_loop("torch", [1.0, -1.0])
    with pytest.raises(ValueError, match="unknown float format"):
        scaling.simulate_closed_loop("torch", [1.0], fmt="fp12")


# -- huge numbers: a ValueError that says what is allowed, never an OverflowError ---------------

SCALE_OPTIONS = [(name, opt) for name, p in scaling.PRESETS.items()
                 for opt in ("init_scale", "max_scale", "min_scale", "min_loss_scale", "max_loss_scale", "factor",
                             "growth_factor") if opt == "init_scale" and p.init_option or opt in p.defaults]


@pytest.mark.parametrize("name, option", SCALE_OPTIONS)
@pytest.mark.parametrize("huge", [10**400, -10**400, 2**1024])
def test_a_number_too_large_for_a_float64_is_a_value_error_naming_the_option(name, option, huge):
    with pytest.raises(ValueError, match=option if option != "init_scale" else scaling.PRESETS[name].init_option):
        scaling.simulate(name, [True, False], **{option: huge})


@pytest.mark.parametrize("name", ["deepspeed", "deepspeed-fp16-optimizer"])
@pytest.mark.parametrize("power", [2000, 1024, -1075, 10**400])
def test_initial_scale_power_is_one_whose_scale_a_float64_holds(name, power):
    with pytest.raises(ValueError, match="initial_scale_power must be an integer from -1074 to 1023"):
        scaling.simulate(name, [False], initial_scale_power=power)
    with pytest.raises(ValueError, match="fp16.initial_scale_power must be an integer from -1074 to 1023"):
        scaling.deepspeed_options({"fp16": {"enabled": True, "initial_scale_power": power}},
                                  optimizer="zero" if name == "deepspeed" else "fp16")


def test_deepspeed_config_numbers_too_large_for_a_float64_are_refused():
    for key in ("loss_scale", "min_loss_scale"):
        with pytest.raises(ValueError, match=f"fp16.{key} must be a finite number >= 0"):
            scaling.deepspeed_options({"fp16": {"enabled": True, key: 10**400}})
    assert scaling.deepspeed_options({"fp16": {"enabled": True, "loss_scale_window": 10**400}})[0] == "deepspeed"
    with pytest.raises(ValueError, match=r"unknown fp16 config keys \[1, 'x'\]"):
        scaling.deepspeed_options({"fp16": {1: 2, "x": 3}})
    with pytest.raises(TypeError, match="optimizer must be 'zero'"):
        scaling.deepspeed_options({"fp16": {}}, optimizer=None)


@pytest.mark.parametrize("name", ["torch", "keras", "tf-keras", "jmp"])
@pytest.mark.parametrize("scale", [1e39, 2.0**-150])
def test_a_float32_library_refuses_a_scale_float32_would_store_as_inf_or_0(name, scale):
    with pytest.raises(ValueError, match="that float32 holds"):
        scaling.simulate(name, [False], init_scale=scale)
    assert scaling.simulate(name, [False], init_scale=2.0**-149).scales[0] == 2.0**-149


# -- the scaler values: checked when built by hand, and adjust takes a bool -------------------------

CLASSES = [scaling.NoOpLossScale, scaling.StaticLossScale, scaling.DynamicLossScale, scaling.TorchGradScaler,
           scaling.ApexLossScaler, scaling.KerasLossScale, scaling.TFKerasLossScale, scaling.JmpLossScale,
           scaling.OptaxApplyIfFinite, scaling.DeepSpeedLossScaler, scaling.DeepSpeedFP16OptimizerScaler,
           scaling.SeedLossScale]
BAD_FIELDS = {  # field: (bad values, error)
    "loss_scale": ([-8.0, 0, float("nan"), float("inf"), 10**400], ValueError),
    "growth_interval": ([0, -1], ValueError), "scale_window": ([0], ValueError), "period": ([0], ValueError),
    "dynamic_growth_steps": ([0], ValueError), "loss_scale_window": ([0], ValueError),
    "growth_factor": ([1.0, 0.5, float("inf")], ValueError), "factor": ([1, 0.5, 1e39], ValueError),
    "backoff_factor": ([2.0, 1.0, 0.0, -0.5], ValueError),
    "min_scale": ([-1.0, float("inf")], ValueError), "max_scale": ([0.0, -1.0], ValueError),
    "min_loss_scale": ([-1.0, float("nan")], ValueError), "max_loss_scale": ([0.0], ValueError),
    "counter": ([-1, 10**9], ValueError), "growth_tracker": ([-1, 2000], ValueError),
    "step_counter": ([-1, 2000], ValueError), "unskipped": ([2000], ValueError),
    "steps_since_last_overflow": ([-1], ValueError), "max_consecutive_errors": ([-1, 2**31], ValueError),
    "notfinite_count": ([-1], ValueError), "cur_iter": ([-1], ValueError), "last_overflow_iter": ([-2, 0], ValueError),
    "hysteresis": ([0, 3], ValueError), "delayed_shift": ([0], ValueError),
}
TYPE_BAD = ["x", None, True, 2.5, [1]]
REAL_FIELDS = {"loss_scale", "factor", "growth_factor", "backoff_factor", "min_scale", "max_scale", "min_loss_scale",
               "max_loss_scale"}


def bad_fields(cls):
    import dataclasses

    for f in dataclasses.fields(cls):
        values, error = BAD_FIELDS.get(f.name, ([], ValueError))
        for v in values:
            yield f.name, v, error
        integral = f.name not in REAL_FIELDS and not isinstance(f.default, bool)
        for v in TYPE_BAD:
            valid = (v is None and f.default is None) or (v == 2.5 and not integral) or (
                v is True and isinstance(f.default, bool))
            if not valid:
                yield f.name, v, TypeError


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_of_a_scaler_built_by_hand_is_checked(cls):
    base = {"max_consecutive_errors": 1} if cls is scaling.OptaxApplyIfFinite else {}
    cls(**base)  # the defaults are a valid state
    checked = 0
    for field, bad, error in bad_fields(cls):
        if cls in (scaling.NoOpLossScale, scaling.OptaxApplyIfFinite) and field == "loss_scale" and error is ValueError:
            bad = 2.0  # these scale by 1, always
        with pytest.raises(error, match=field):
            cls(**{**base, field: bad})
        checked += 1
    assert checked >= 5


def test_dynamic_loss_scale_refuses_the_issues_examples():
    with pytest.raises(ValueError, match=r"backoff_factor must be a finite number > 0 and < 1; got 2.0"):
        scaling.DynamicLossScale(backoff_factor=2.0)
    with pytest.raises(ValueError, match="loss_scale must be a finite number > 0; got -8.0"):
        scaling.DynamicLossScale(loss_scale=-8.0)
    with pytest.raises(ValueError, match="growth_interval must be an integer >= 1; got 0"):
        scaling.DynamicLossScale(growth_interval=0)
    with pytest.raises(ValueError, match=r"counter must be an integer from 0 to growth_interval - 1 \(1\)"):
        scaling.DynamicLossScale(growth_interval=2, counter=2)
    with pytest.raises(ValueError, match="min_scale .* must not exceed max_scale"):
        scaling.DynamicLossScale(min_scale=4.0, max_scale=2.0)
    with pytest.raises(ValueError, match="must not exceed max_loss_scale"):
        scaling.ApexLossScaler(loss_scale=2.0**25)
    with pytest.raises(ValueError, match="under_jit=True means min_loss_scale=1.0"):
        scaling.JmpLossScale(min_loss_scale=0.5, under_jit=True)


@pytest.mark.parametrize("name", list(scaling.PRESETS))
@pytest.mark.parametrize("bad", ["no", float("nan"), None, 0, 1, np.array(True), [True]])
def test_adjust_and_applies_take_the_finite_flag_as_a_bool_only(name, bad):
    state = scaling.PRESETS[name].create(**({"max_consecutive_errors": 1} if name == "optax" else {}))
    with pytest.raises(TypeError, match="finite must be True"):
        state.adjust(bad)
    with pytest.raises(TypeError, match="finite must be True"):
        state.applies(bad)
    assert state.adjust(np.bool_(True)) == state.adjust(True) and state.applies(np.bool_(False)) in (True, False)


# -- a single name is a list of one; settings are checked whatever the kind -------------------------

@pytest.mark.parametrize("table", [scaling.fractions_table, scaling.safe_range_table])
def test_the_format_tables_take_one_format_or_a_list(table):
    values = [1e-3, 0.5]
    assert table(values, formats="fp16").column("format") == ["fp16"]
    assert table(values, formats=["fp16", "bf16"]).column("format") == ["fp16", "bf16"]
    with pytest.raises(TypeError, match="formats must be a name or a list of names"):
        table(values, formats=16)
    with pytest.raises(ValueError, match="unknown float format 'fp12'"):
        table(values, formats=["fp16", "fp12"])


@pytest.mark.parametrize("setting, bad, error", [
    ("length", 0, ValueError), ("length", 2.5, TypeError), ("start", -1, ValueError), ("start", "x", TypeError),
    ("seed", -1, ValueError), ("seed", True, TypeError), ("p", float("nan"), ValueError), ("p", "x", TypeError),
    ("every", 0, ValueError), ("every", 2.5, TypeError),
])
def test_overflow_pattern_checks_every_setting_it_is_given(setting, bad, error):
    with pytest.raises(error, match=setting):
        scaling.overflow_pattern("none", 10, **{setting: bad})


def test_overflow_pattern_steps_are_counted_from_1_and_capped():
    for bad, error in [(0, ValueError), (10**400, ValueError), (2.5, TypeError), (True, TypeError), (None, TypeError)]:
        with pytest.raises(error, match="steps"):
            scaling.overflow_pattern("none", bad)
    with pytest.raises(ValueError, match="a drawing is as long as it is drawn"):
        scaling.overflow_pattern("..x", 5)
    with pytest.raises(TypeError, match="kind 'random' needs p="):
        scaling.overflow_pattern("random", 5)


def test_closed_loop_amax_must_be_real_numbers():
    for bad, error in [([True, False], TypeError), (["a"], TypeError), ([10**400], ValueError), (None, TypeError)]:
        with pytest.raises(error, match="amax"):
            scaling.simulate_closed_loop("torch", bad)
    assert len(scaling.simulate_closed_loop("torch", [])) == 0


def test_seed004_vs_gradscaler_checks_its_settings_before_importing_torch():
    for name, bad, error in [("initial_scale", 0, ValueError), ("initial_scale", 1e39, ValueError),
                             ("initial_scale", "x", TypeError), ("growth_interval", 0, ValueError),
                             ("growth_interval", 2.5, TypeError)]:
        with pytest.raises(error, match=name):
            scaling.seed004_vs_gradscaler([False], **{name: bad})
    with pytest.raises(ValueError, match="overflows must have at most 10000 steps"):
        scaling.seed004_vs_gradscaler([False] * 10_001)


# -- values returned by the package, built by hand: checked, so that they print ------------------

def test_a_trace_built_by_hand_must_hold_together():
    t = scaling.simulate("torch", [False, True])
    fields = dict(preset=t.preset, options=t.options, overflows=t.overflows, scales=t.scales, applied=t.applied,
                  final_scale=t.final_scale, extras=t.extras)
    assert repr(scaling.Trace(**{**fields, "overflows": [False, True], "final_scale": 10**400})).endswith(
        "final_scale=inf)")
    for field, bad, error in [("preset", "pytorch", ValueError), ("preset", None, TypeError),
                              ("options", None, TypeError), ("overflows", [0, 1], TypeError),
                              ("scales", [[1.0], [2.0, 3.0]], ValueError), ("scales", "x", TypeError),
                              ("applied", [True], ValueError), ("applied", None, TypeError),
                              ("final_scale", "x", TypeError), ("extras", [1, 2], TypeError),
                              ("extras", {"growth_tracker": [1]}, ValueError), ("stopped_at", 5, ValueError),
                              ("stopped_at", 0.5, TypeError), ("stop_reason", 3, TypeError)]:
        with pytest.raises(error, match=field):
            scaling.Trace(**{**fields, field: bad})


def test_a_gradient_record_built_by_hand_must_hold_together():
    ok = dict(layers={"w": [0.5, -0.25]}, amax=[0.5, 0.4], losses=[2.3, 2.2], activations=[[1.0], [2.0]],
              output_grads=[[0.1], [0.2]], sample_steps=(0,))
    rec = scaling.GradientRecord(**ok)
    assert rec.layers["w"].dtype == np.float32 and "2 steps" in repr(rec) and rec.values.tolist() == [0.5, -0.25]
    for field, bad, error in [("layers", None, TypeError), ("layers", {"w": ["x"]}, TypeError),
                              ("amax", [0.5], ValueError), ("amax", None, TypeError), ("losses", "x", TypeError),
                              ("activations", 3, TypeError), ("output_grads", [[1.0]], ValueError),
                              ("sample_steps", (5,), ValueError), ("sample_steps", 0, TypeError),
                              ("description", 3, TypeError)]:
        with pytest.raises(error, match=field):
            scaling.GradientRecord(**{**ok, field: bad})


def test_fractions_hold_together_and_a_sample_of_zeros_has_none():
    assert scaling.fractions([0.0, 0.0], "fp16") == scaling.Fractions("fp16", 1.0, 0, 2, 0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="must be 1"):
        scaling.Fractions("fp16", 1.0, 0, 2, 0.5, 0.0, 0.5, 0.0)
    with pytest.raises(ValueError, match="count must be an integer >= 0"):
        scaling.Fractions("fp16", 1.0, -1, 0, 0.0, 0.0, 1.0, 0.0)
    with pytest.raises(TypeError, match="count must be an integer"):
        scaling.Fractions("fp16", 1.0, 2.5, 0, 0.0, 0.0, 1.0, 0.0)


def test_a_safe_range_past_float64s_limits_is_computed_in_log2():
    # 1e308 in bf16: the lower bound 2**-133 / 1e308 is below float64's smallest value
    r = scaling.safe_scale_range([1e308], "bf16")
    assert r.lo == 0.0 and r.log2_lo == pytest.approx(-133 - np.log2(1e308))
    assert r.pow2_lo == 2.0**-1074 and r.pow2_hi == 2.0**-896 and not r.empty
    assert "2**-1156.2" in str(scaling.safe_range_table([1e308]))
    assert scaling.safe_scale_range([1.0], "fp16").log2_hi == np.log2(65504)  # unchanged where the bounds are normal


def test_the_verbatim_seed_class_checks_its_arguments_and_keeps_its_update():
    import inspect

    source = inspect.getsource(scaling.seeds.DynamicLossScaler.update)
    assert "self.scale /= 2" in source and "_check" not in source
    for name, bad, error in [("growth_interval", 0, ValueError), ("growth_interval", True, TypeError),
                             ("initial_scale", "x", TypeError), ("initial_scale", -1, ValueError)]:
        with pytest.raises(error, match=name):
            scaling.seeds.DynamicLossScaler(**{name: bad})
    seed = scaling.seeds.DynamicLossScaler()
    assert seed.scale_loss(2.0) == 2.0 * 2**16 and seed.scale_loss(np.ones(2)).tolist() == [2.0**16] * 2
    for bad in ([0.5] * 10**4, "x", None, True):
        with pytest.raises(TypeError, match="loss must be a number or a tensor"):
            seed.scale_loss(bad)
    with pytest.raises(TypeError, match="optimizer must be a torch optimizer"):
        seed.unscale_gradients(None)


def test_messages_name_what_the_caller_gave():
    with pytest.raises(TypeError, match="activations must be a sequence of arrays"):
        scaling.fp8_recipe(None, [[1.0]])
    with pytest.raises(ValueError, match="gradients is empty"):
        scaling.fp8_recipe([[1.0]], [])
    with pytest.raises(ValueError, match=r"total_notfinite \(0\) .* at least notfinite_count \(7\)"):
        scaling.OptaxApplyIfFinite(2, notfinite_count=7)
    with pytest.raises(TypeError) as e:
        scaling.overflow_pattern([0.5] * 10**4)
    assert len(str(e.value)) < 300
    with pytest.raises(ValueError, match="growth_interval must be an integer from 1 to 9223372036854775807"):
        scaling.simulate("torch", [False], growth_interval=2**63)  # torch's kernel takes an int64


@pytest.mark.parametrize("name, option, bad", [
    ("torch", "growth_interval", 0), ("torch", "backoff_factor", 2.0), ("keras", "dynamic_growth_steps", 0),
    ("tf-keras", "dynamic_growth_steps", 0), ("deepspeed", "loss_scale_window", 0),
    ("deepspeed-fp16-optimizer", "min_loss_scale", -1), ("jmp", "period", 0), ("apex", "scale_window", 0),
    ("optax", "max_consecutive_errors", -1), ("seed004", "growth_interval", 0), ("static", "skip_nonfinite", 1),
    ("dynamic", "backoff_factor", 2.0),
])
def test_a_scaler_built_directly_gets_the_checks_that_create_and_the_preset_give(name, option, bad):
    p = scaling.PRESETS[name]
    error = TypeError if isinstance(bad, int) and option == "skip_nonfinite" else ValueError
    others = {"max_consecutive_errors": 1} if name == "optax" and option != "max_consecutive_errors" else {}
    for build in (p.scaler, p.scaler.create, p.create):
        with pytest.raises(error, match=option):
            build(**{option: bad}, **others)
    with pytest.raises(ValueError, match="optax has no default"):
        scaling.OptaxApplyIfFinite()


def test_the_preset_table_reads_each_scalers_own_facts():
    for name, p in scaling.PRESETS.items():
        facts = p.scaler.FACTS
        assert (p.imitates, p.source, p.storage, p.floor, p.ceiling, p.on_overflow) == (
            facts.imitates, facts.source, facts.storage, facts.floor, facts.ceiling, facts.on_overflow)
        assert p.init_option in (None, *p.defaults) and p.interval_option in (None, *p.defaults)
