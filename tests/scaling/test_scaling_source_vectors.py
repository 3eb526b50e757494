"""Presets of libraries that do not install here (DeepSpeed, Apex, tf-keras).

Two kinds of check: short vectors worked out by hand from each source file (the
derivation is in the comments), and random sequences through the library's own
update rule copied into ``scaling_sources.py``.
"""

import numpy as np
import pytest

from labkit import scaling

import scaling_sources as sources

X, _ = True, False  # overflow, clean


# -- hand-derived vectors ---------------------------------------------------------------

def test_deepspeed_hysteresis_vector():
    # DeepSpeed 0.19.8 deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale,
    # config {"initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2}:
    # step 0 X: hysteresis 2 -> 1, scale stays 16      step 1 X: hysteresis is 1 -> 16/2 = 8
    # step 2 X: hysteresis still 1 (restored only at a growth) -> 4
    # steps 3-5 clean: stable_interval = it - 2 - 1 = 0, 1, 2   step 6 clean: 3 % 3 == 0 -> 8, hysteresis 2
    # step 7 X: hysteresis 2 -> 1, scale stays 8
    t = scaling.simulate("deepspeed", [X, X, X, _, _, _, _, X], initial_scale_power=4, loss_scale_window=3)
    assert t.scales.tolist() == [16, 16, 8, 4, 4, 4, 4, 8]
    assert t.hysteresis.tolist() == [1, 1, 1, 1, 1, 1, 2, 1]
    assert t.applied.tolist() == [False, False, False, True, True, True, True, False]
    assert t.final_scale == 8


def test_deepspeed_consecutive_hysteresis_vector():
    # consecutive_hysteresis=True: every clean step restores the hysteresis, so isolated
    # overflows never halve the scale: X _ X _ keeps 16; X X halves once.
    t = scaling.simulate("deepspeed", [X, _, X, _, X, X], init_scale=16, loss_scale_window=100,
                         consecutive_hysteresis=True)
    assert t.scales.tolist() == [16, 16, 16, 16, 16, 16]
    assert t.final_scale == 8


def test_deepspeed_raises_at_the_floor_and_the_trace_stops_there():
    # min_loss_scale 2, init 4, no hysteresis: X -> 2 (the floor); X at the floor -> raise
    t = scaling.simulate("deepspeed", [X, X, _, _], init_scale=4, min_loss_scale=2, hysteresis=1)
    assert t.stopped_at == 1 and len(t) == 2 and t.scales.tolist() == [4, 2]
    assert "Exiting run" in t.stop_reason
    kept = scaling.simulate("deepspeed", [X, X, _, _], init_scale=4, min_loss_scale=2, hysteresis=1,
                            raise_error_at_min_scale=False)
    assert kept.stopped_at is None and kept.scales.tolist() == [4, 2, 2, 2]


def test_both_deepspeed_rules_grow_one_step_later_than_torch():
    # DeepSpeed 0.19.8: fused_optimizer.py / unfused_optimizer.py _update_scale and
    # loss_scaler.py DynamicLossScaler.update_scale both use
    # stable_interval = (cur_iter - last_overflow_iter) - 1, grow if > 0 and % window == 0.
    # From the start (last = -1): stable_interval = cur_iter, grows at cur_iter = window = 2,
    # i.e. on the 3rd clean step; then every 2 steps (cur_iter 4, 6).
    for name in ("deepspeed-fp16-optimizer", "deepspeed"):
        t = scaling.simulate(name, [_] * 7, init_scale=1, loss_scale_window=2)
        assert t.scales.tolist() == [1, 1, 1, 2, 2, 4, 4]
        assert t.final_scale == 8
    # torch's GradScaler grows on the 2nd clean step
    torch_rule = scaling.simulate("torch", [_] * 7, init_scale=1, growth_interval=2)
    assert torch_rule.scales.tolist() == [1, 1, 2, 2, 4, 4, 8]


def test_deepspeed_fp16_optimizer_scale_turns_float_at_its_first_change():
    # LossScaleConfig (loss_scaler.py) takes cur_scale = 2**initial_scale_power (an int) and
    # scale_factor = 2.0 from LOSS_SCALE_PROFILE_DEFAULTS: the first growth or halving gives a float.
    # step 0: stable_interval 0 (not > 0); step 1: 1 % 1 == 0 -> 2 * 2.0 = 4.0; step 2 X: 4.0 / 2.0 = 2.0
    t = scaling.simulate("deepspeed-fp16-optimizer", [_, _, X], init_scale=2, loss_scale_window=1)
    assert t.scales.tolist() == [2, 2, 4] and t.final_scale == 2.0
    s = scaling.PRESETS["deepspeed-fp16-optimizer"].create(init_scale=2, loss_scale_window=1)
    assert type(s.loss_scale) is int and type(s.adjust(True).adjust(True).loss_scale) is float


def test_apex_caps_at_2_24_and_clamps_the_initial_scale():
    # apex/amp/scaler.py: _loss_scale = min(max_loss_scale, init_scale); growth min(max, s*2.)
    t = scaling.simulate("apex", [_, _, X], init_scale=2.0**30, scale_window=1)
    assert t.scales.tolist() == [2.0**24, 2.0**24, 2.0**24]
    assert t.final_scale == 2.0**23


def test_apex_floor_is_tested_by_truthiness():
    # if(self._min_loss_scale): ... -- min_loss_scale=0 means "no floor"
    no_floor = scaling.simulate("apex", [X] * 4, init_scale=4.0, min_loss_scale=0)
    floor = scaling.simulate("apex", [X] * 4, init_scale=4.0, min_loss_scale=1.0)
    assert no_floor.final_scale == 0.25 and floor.final_scale == 1.0


def test_tf_keras_floor_of_one_and_counter_vector():
    # tf_keras/mixed_precision/loss_scale_optimizer.py, _DynamicLossScaleState.update,
    # initial 4, growth_steps 2: _ (counter 1) _ (1+1 >= 2: 8, counter 0) X 4 X 2 X 1 X max(0.5, 1) = 1
    t = scaling.simulate("tf-keras", [_, _, X, X, X, X, _, _], init_scale=4.0, growth_interval=2)
    assert t.scales.tolist() == [4, 4, 8, 4, 2, 1, 1, 1]
    assert t.counter.tolist() == [1, 0, 0, 0, 0, 0, 1, 0]
    assert t.final_scale == 2


# -- the libraries' own rules, copied, on random sequences ------------------------------

def random_flags(rng, n=200):
    return (rng.random(int(rng.integers(1, n))) < rng.choice([0.02, 0.2, 0.5])).tolist()


def test_deepspeed_preset_matches_dynamic_loss_scaler_source():
    rng = np.random.default_rng(10)
    for _ in range(200):
        opts = dict(init_scale=2 ** int(rng.integers(0, 20)), loss_scale_window=int(rng.integers(1, 8)),
                    hysteresis=int(rng.integers(1, 4)), consecutive_hysteresis=bool(rng.random() < 0.5),
                    min_loss_scale=float(rng.choice([1, 0.25, 4])))
        if opts["min_loss_scale"] > opts["init_scale"]:
            continue
        flags = random_flags(rng)
        ref = sources.DeepSpeedDynamicLossScaler(
            init_scale=opts["init_scale"], scale_window=opts["loss_scale_window"], min_scale=opts["min_loss_scale"],
            delayed_shift=opts["hysteresis"], consecutive_hysteresis=opts["consecutive_hysteresis"])
        scales, hyst, stopped = [], [], None
        for i, overflow in enumerate(flags):
            scales.append(ref.cur_scale)
            try:
                ref.update_scale(overflow)
            except Exception as e:  # DeepSpeed's own exception type
                assert "minimum" in str(e)
                stopped = i
            hyst.append(ref.cur_hysteresis)
            if stopped is not None:
                break
        ours = scaling.simulate("deepspeed", flags, **opts)
        assert ours.scales.tolist() == scales
        assert ours.hysteresis.tolist() == hyst
        assert ours.stopped_at == stopped
        assert ours.final_scale == ref.cur_scale


def test_deepspeed_fp16_optimizer_preset_matches_source():
    rng = np.random.default_rng(11)
    for _ in range(200):
        init, window, floor = 2 ** int(rng.integers(0, 20)), int(rng.integers(1, 8)), int(rng.choice([1, 2]))
        flags = random_flags(rng)
        ref = sources.DeepSpeedFP16Optimizer({"init_scale": init, "scale_window": window, "min_scale": floor})
        scales = []
        for overflow in flags:
            scales.append(ref.cur_scale)
            ref._update_scale(overflow)
        ours = scaling.simulate("deepspeed-fp16-optimizer", flags, init_scale=init, loss_scale_window=window,
                                min_loss_scale=floor)
        assert ours.scales.tolist() == scales and ours.final_scale == ref.cur_scale


def test_apex_preset_matches_loss_scaler_source():
    rng = np.random.default_rng(12)
    for _ in range(200):
        opts = dict(init_scale=float(2.0 ** rng.integers(-5, 30)), scale_window=int(rng.integers(1, 8)),
                    min_loss_scale=rng.choice([None, 0.5, 0]), max_loss_scale=float(rng.choice([2.0**24, 2.0**10])))
        flags = random_flags(rng)
        ref = sources.ApexLossScaler("dynamic", **opts)
        scales, applied, unskipped = [], [], []
        for overflow in flags:
            scales.append(ref.loss_scale())
            ref._has_overflow = overflow
            applied.append(not ref.update_scale())
            unskipped.append(ref._unskipped)
        ours = scaling.simulate("apex", flags, **opts)
        assert ours.scales.tolist() == scales
        assert ours.applied.tolist() == applied
        assert ours.unskipped.tolist() == unskipped


def test_tf_keras_preset_matches_the_tf_rule_on_real_tensorflow():
    pytest.importorskip("tensorflow")
    rng = np.random.default_rng(13)
    for _ in range(6):
        init, steps = float(rng.choice([2.0**15, 3.0, 2.0**126])), int(rng.integers(1, 5))
        flags = random_flags(rng, 40)
        ref = sources.TFKerasDynamicLossScaleState(init, steps, multiplier=2)
        scales, applied, counters = [], [], []
        for overflow in flags:
            scales.append(float(ref.current_loss_scale.numpy()))
            _, apply = ref.update([tf_grad(overflow)])
            applied.append(bool(apply))
            counters.append(int(ref.counter.numpy()))
        ours = scaling.simulate("tf-keras", flags, init_scale=init, growth_interval=steps)
        assert ours.scales.tolist() == scales
        assert ours.applied.tolist() == applied
        assert ours.counter.tolist() == counters


def tf_grad(overflow):
    return sources.tf.constant([np.inf if overflow else 1.0], dtype=sources.tf.float32)


def test_deepspeed_options_reproduce_the_config_parser():
    full = {"fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 500, "initial_scale_power": 12,
                     "hysteresis": 3, "min_loss_scale": 2}}
    assert scaling.deepspeed_options(full) == ("deepspeed", {
        "init_scale": 4096, "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": False,
        "min_loss_scale": 2})
    assert scaling.deepspeed_options(full, optimizer="fp16") == ("deepspeed-fp16-optimizer", {
        "init_scale": 4096, "loss_scale_window": 500, "min_loss_scale": 2})
    # one scaling key present: the others take the config defaults (power 16, window 1000, hysteresis 2)
    assert scaling.deepspeed_options({"fp16": {"enabled": True, "hysteresis": 1}})[1]["init_scale"] == 2**16
    # none present: the same defaults (DeepSpeed 0.19.8 DeepSpeedFP16Config.dynamic_loss_scale_args
    # always returns them; older DeepSpeed fell back to DynamicLossScaler's 2**32 and no hysteresis)
    name, opts = scaling.deepspeed_options({"enabled": True})
    assert name == "deepspeed" and opts["init_scale"] == 2**16 and opts["hysteresis"] == 2
    assert scaling.deepspeed_options({"enabled": True}, optimizer="fp16")[1] == {
        "init_scale": 2**16, "loss_scale_window": 1000, "min_loss_scale": 1}
    assert scaling.deepspeed_options({"fp16": {"enabled": True, "loss_scale": 128}}) == (
        "static", {"loss_scale": 128.0, "skip_nonfinite": True})
    # fp16 is off unless enabled (FP16_ENABLED_DEFAULT = False), or with no fp16 section at all
    assert scaling.deepspeed_options({"fp16": {"loss_scale": 0}}) == ("none", {})
    assert scaling.deepspeed_options({"train_batch_size": 8, "bf16": {"enabled": True}}) == ("none", {})
    # the seed 004 config runs as is
    seed = {"fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                     "hysteresis": 2, "min_loss_scale": 1}}
    name, opts = scaling.deepspeed_options(seed)
    assert scaling.simulate(name, [X, X], **opts).scales.tolist() == [65536, 65536]
