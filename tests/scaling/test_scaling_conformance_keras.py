"""labkit's "keras" preset against the real Keras 3 LossScaleOptimizer (TensorFlow backend).

Each step applies a gradient of 1.0 (or inf on an overflow step) to a variable reset to
0, reads ``dynamic_scale`` before and ``step_counter`` after, and sees whether the
variable moved. Keras steps are slower than torch's, so there are fewer sequences.
"""

import numpy as np
import pytest

from labkit import scaling

keras = pytest.importorskip("keras")


def run_keras(flags, **kwargs):
    v = keras.Variable(np.zeros(1, np.float32))
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0), **kwargs)
    opt.build([v])
    scales, applied, counters = [], [], []
    for overflow in flags:
        v.assign(np.zeros(1, np.float32))
        scales.append(float(opt.dynamic_scale.numpy()))
        grad = np.full(1, np.inf if overflow else 1.0, np.float32)
        opt.apply([keras.ops.convert_to_tensor(grad)], [v])
        applied.append(bool(v.numpy()[0] != 0))
        counters.append(int(opt.step_counter.numpy()))
    return np.array(scales), np.array(applied), np.array(counters), float(opt.dynamic_scale.numpy())


def test_keras_preset_matches_loss_scale_optimizer_on_random_sequences():
    rng = np.random.default_rng(1)
    for _ in range(8):
        kwargs = dict(initial_scale=float(rng.choice([2.0**15, 4.0, 3.3])),
                      dynamic_growth_steps=int(rng.integers(1, 6)))
        flags = rng.random(int(rng.integers(10, 50))) < rng.choice([0.1, 0.3, 0.6])
        ours = scaling.simulate("keras", flags, **kwargs)
        scales, applied, counters, final = run_keras(flags, **kwargs)
        np.testing.assert_array_equal(ours.scales, scales)
        np.testing.assert_array_equal(ours.applied, applied)
        np.testing.assert_array_equal(ours.step_counter, counters)
        assert ours.final_scale == final


def test_keras_has_no_floor_the_scale_falls_below_one():
    flags = [True] * 6
    ours = scaling.simulate("keras", flags, init_scale=4.0)
    scales, _, _, final = run_keras(flags, initial_scale=4.0)
    np.testing.assert_array_equal(ours.scales, scales)
    assert final == ours.final_scale == 2.0**-4


def test_keras_grows_the_scale_into_inf():
    flags = [False] * 3
    ours = scaling.simulate("keras", flags, init_scale=2.0**126, growth_interval=1)
    scales, _, _, final = run_keras(flags, initial_scale=2.0**126, dynamic_growth_steps=1)
    np.testing.assert_array_equal(ours.scales, scales)
    assert final == ours.final_scale == np.inf


def test_keras_preset_defaults_are_the_optimizers_defaults():
    import inspect

    real = inspect.signature(keras.optimizers.LossScaleOptimizer.__init__).parameters
    for name, value in scaling.PRESETS["keras"].defaults.items():
        assert real[name].default == value


def test_keras_scale_reaches_zero_and_the_next_finite_step_applies_nan():
    flags = [True] * 10
    ours = scaling.simulate("keras", flags, init_scale=2.0**-140)
    assert ours.final_scale == 0.0  # float32: 2**-149 is the last nonzero value
    v = keras.Variable(np.zeros(1, np.float32))
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0), initial_scale=2.0**-140)
    opt.build([v])
    for _ in flags:
        opt.apply([keras.ops.convert_to_tensor(np.full(1, np.inf, np.float32))], [v])
    assert float(opt.dynamic_scale.numpy()) == 0.0
    # a loss scaled by 0 gives gradients of 0: finite, so Keras divides them by the scale, 0 / 0
    opt.apply([keras.ops.convert_to_tensor(np.zeros(1, np.float32))], [v])
    assert np.isnan(v.numpy()[0])
