"""Real gradients of a small real model (PyTorch, sklearn digits), and what they say."""

import numpy as np
import pytest

from labkit import scaling
from labkit.scaling import fp8, underflow

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from labkit.scaling.gradients import record_gradients  # noqa: E402


@pytest.fixture(scope="module")
def record():
    return record_gradients(steps=30)


def test_record_holds_weight_and_activation_gradients_per_layer(record):
    assert {"fc1.weight", "fc2.bias", "fc3.weight", "grad(h1)", "grad(z2)"} <= set(record.layers)
    assert all(v.dtype == np.float32 for v in record.layers.values())
    assert record.sample_steps == (0, 15, 29)
    assert record.layers["fc1.weight"].size == 3 * 64 * 64
    assert len(record.amax) == len(record.losses) == len(record.activations) == len(record.output_grads) == 30
    assert record.activations[0].shape == record.output_grads[0].shape == (32, 64)
    assert record.amax[0] == max(float(np.abs(v[: v.size // 3]).max()) for v in record.layers.values())


def test_record_is_reproducible_and_leaves_the_thread_count_alone(record):
    threads = torch.get_num_threads()
    again = record_gradients(steps=30)
    assert torch.get_num_threads() == threads
    np.testing.assert_array_equal(again.values, record.values)
    np.testing.assert_array_equal(again.losses, record.losses)


def test_training_makes_progress():
    rec = record_gradients(steps=80)
    assert rec.losses[-10:].mean() < rec.losses[:10].mean() - 0.5


def test_what_the_real_gradients_say_about_each_format(record):
    # bf16 has fp32's exponent range: nothing is lost; e4m3 cannot hold them unscaled
    assert underflow.fractions(record, "bf16").lost == 0
    assert underflow.fractions(record, "fp8_e4m3").lost > 0.1
    fp16 = underflow.safe_scale_range(record, "fp16")
    assert not fp16.empty and fp16.contains(2.0**15)
    assert underflow.fractions(record, "fp16", fp16.pow2_lo).lost == 0


def test_dynamic_scales_settle_under_the_overflow_line_on_real_amax(record):
    amax = np.tile(record.amax, 10)
    for name in ("torch", "keras", "tf-keras", "jmp", "apex", "deepspeed-fp16-optimizer"):
        t = scaling.simulate_closed_loop(name, amax, "fp16", growth_interval=20)
        ok = ~t.overflows
        assert (t.scales[ok] * amax[ok] < 65520).all()
        assert t.overflows.mean() < 0.2


def test_fp8_on_the_real_tensor_sequence():
    rec = record_gradients(steps=80)
    delayed = fp8.fp8_recipe(rec.activations, rec.output_grads, "delayed")
    current = fp8.fp8_recipe(rec.activations, rec.output_grads, "current")
    assert (current["forward"].saturated == 0).all() and (current["backward"].saturated == 0).all()
    # the activations grow while the model learns: the delayed scale lags behind and clips
    assert (delayed["forward"].saturated > 0).sum() >= 5
    assert rec.activations[-1].max() > 2 * rec.activations[0].max()


def test_bad_input():
    with pytest.raises(ValueError, match="steps must be an integer from 1 to 10000"):
        record_gradients(steps=0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        record_gradients(steps=2, lr=-1)
    with pytest.raises(ValueError, match="sample_steps must be steps in"):
        record_gradients(steps=2, sample_steps=[5])


def test_the_batch_size_is_checked_against_the_data_set_before_training():
    from sklearn.datasets import load_digits

    from labkit.scaling.gradients import N_DIGITS

    assert len(load_digits().data) == N_DIGITS  # the largest batch drawn without replacement
    with pytest.raises(ValueError, match=f"batch_size must be an integer from 1 to {N_DIGITS}; got 1000000"):
        record_gradients(steps=2, batch_size=10**6)
    assert record_gradients(steps=1, batch_size=N_DIGITS, hidden=4).activations[0].shape == (N_DIGITS, 4)


@pytest.mark.parametrize("name, bad, error", [
    ("steps", 2.5, TypeError), ("steps", True, TypeError), ("steps", 10**400, ValueError),
    ("batch_size", 0, ValueError), ("hidden", -1, ValueError), ("hidden", 10**6, ValueError),
    ("lr", 10**400, ValueError), ("lr", float("nan"), ValueError), ("lr", "0.5", TypeError),
    ("seed", -1, ValueError), ("seed", 1.5, TypeError), ("sample_steps", [0.5], TypeError),
    ("sample_steps", "0", TypeError), ("sample_steps", [-1], ValueError),
])
def test_each_setting_is_refused_by_name(name, bad, error):
    with pytest.raises(error, match=name):
        record_gradients(**{"steps": 2, name: bad})


def test_one_sample_step_need_not_be_a_list():
    assert record_gradients(steps=2, sample_steps=1).sample_steps == (1,)
