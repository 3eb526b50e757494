"""Bad input gets a ValueError or TypeError that names what is allowed."""

import numpy as np
import pytest

from labkit import scaling


@pytest.mark.parametrize("bad", ["pytorch", "", None, 3])
def test_unknown_preset_lists_the_presets(bad):
    with pytest.raises(ValueError, match="presets are: torch, keras, tf-keras"):
        scaling.simulate(bad, [False])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_growth_interval_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="growth_interval must be an integer >= 1"):
        scaling.simulate("torch", [False], growth_interval=bad)
    with pytest.raises(ValueError, match="dynamic_growth_steps must be an integer >= 1"):
        scaling.simulate("keras", [False], growth_interval=bad)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), True])
def test_backoff_must_lie_strictly_between_0_and_1(bad):
    with pytest.raises(ValueError, match=r"backoff_factor must be a number in \(0, 1\)"):
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


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "2**16", True])
def test_init_scale_must_be_a_finite_positive_number(bad):
    with pytest.raises(ValueError, match="init_scale must be a finite number > 0"):
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
    with pytest.raises(ValueError, match="initial_scale_power must be an integer"):
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
    with pytest.raises(ValueError, match="engine must be 'fast' or 'adjust'"):
        scaling.simulate("torch", [True], engine="numba")


def test_overflow_pattern_input_checks():
    with pytest.raises(ValueError, match=r"'\.' \(clean step\) and 'x' \(overflow\)"):
        scaling.overflow_pattern("..o..")
    with pytest.raises(ValueError, match="kind"):
        scaling.overflow_pattern("")
    with pytest.raises(ValueError, match="probability"):
        scaling.overflow_pattern("random", 10, p=1.5)
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        scaling.overflow_pattern("every", 10, every=0)
    with pytest.raises(ValueError, match="steps must be an integer >= 0"):
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
