"""Seed 003's Keras code through model.fit(), set_jit's effect and the bf16 "fallback", against real Keras."""

import math

import pytest

pytest.importorskip("tensorflow")

from labkit.train.tf import fit as F  # noqa: E402
from labkit.train.tf.models import keras, tf  # noqa: E402

SMALL = dict(epochs=2, samples=256, batch_size=64)  # 4 batches an epoch


@pytest.fixture(scope="module")
def fp16_runs():
    """The seed's model under mixed_float16, its head float16 (as written) and float32; the scale is made
    to move: 2**20 overflows at first, and it grows after every 2 clean steps."""
    return {last32: F.fit_seed("mixed_float16", output_float32=last32, initial_scale=2.0**20, growth_steps=2, **SMALL)
            for last32 in (False, True)}


def test_fit_under_mixed_bfloat16_trains_with_a_plain_adam_and_bfloat16_logits():
    run = F.fit_seed("mixed_bfloat16", **SMALL)
    assert run.optimizer == "Adam" and run.initial_scale is None  # no LossScaleOptimizer for bfloat16
    assert run.batch_scales == () and run.epoch_scales == ()
    assert run.output_dtype == "bfloat16" and run.loss_dtype == "float32"
    assert len(run.losses) == 2 and all(math.isfinite(v) for v in run.losses)
    assert run.losses[-1] < run.losses[0]
    assert run.policy_after == "float32"


def test_compile_wraps_adam_for_mixed_float16_and_the_callback_sees_the_scale_move(fp16_runs):
    for run in fp16_runs.values():
        assert (run.optimizer, run.inner_optimizer) == ("LossScaleOptimizer", "Adam")
        assert run.initial_scale == 2.0**20 and run.growth_steps == 2
        assert len(run.batch_scales) == 8 and len(run.epoch_scales) == 2
        assert run.epoch_scales[-1] == run.batch_scales[-1]
        steps = [b / a for a, b in zip((run.initial_scale,) + run.batch_scales, run.batch_scales)]
        assert set(steps) <= {0.5, 1.0, 2.0}  # halved on an overflow, doubled after 2 clean steps, else kept
        assert 2.0 in steps  # growth happened inside fit()
        assert all(math.isfinite(v) for v in run.losses)
    assert keras.mixed_precision.global_policy().name == "float32"


def test_the_float32_head_decides_the_logits_dtype_but_the_loss_is_float32_either_way(fp16_runs):
    as_written, head32 = fp16_runs[False], fp16_runs[True]
    assert (as_written.output_dtype, as_written.head_compute_dtype, as_written.softmax_dtype) == ("float16",) * 3
    assert (head32.output_dtype, head32.head_compute_dtype, head32.softmax_dtype) == ("float32",) * 3
    assert as_written.loss_dtype == head32.loss_dtype == "float32"  # keras/src/losses/loss.py converts y_pred
    assert head32.softmax_zeros == head32.softmax_subnormal == 0 < head32.softmax_min  # float32 reaches 1e-38
    assert as_written.softmax_min >= 0 and (as_written.softmax_min > 0 or as_written.softmax_zeros > 0)


def test_jit_compile_auto_resolves_by_the_devices_keras_sees(fp16_runs):
    accelerator = any(d.device_type != "CPU" for d in tf.config.list_physical_devices())
    assert fp16_runs[False].jit_compile is accelerator


def test_fit_seed_refuses_bad_arguments_and_leaves_the_global_policy_alone():
    with pytest.raises(ValueError, match="choose one of 'auto'"):
        F.fit_seed("mixed_float16", jit_compile="yes")
    with pytest.raises(TypeError, match="jit_compile must be"):
        F.fit_seed("mixed_float16", jit_compile=1.0)
    with pytest.raises(TypeError, match="jit must be"):
        F.autoclustering(None)
    with pytest.raises(ValueError, match="choose one of"):
        F.fit_seed("mixed_fp8")
    keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(ValueError, match="samples"):
        F.fit_seed(samples=10, batch_size=64)
    assert keras.mixed_precision.global_policy().name == "float32"


def test_set_jit_clusters_only_where_autoclustering_works_and_is_restored():
    before = tf.config.optimizer.get_jit()
    on, off = F.autoclustering(True), F.autoclustering(False)
    assert on.get_jit == "autoclustering" and off.get_jit == ""
    assert on.restored == off.restored == before
    assert not off.clustered and "MatMul" in "".join(off.ops)
    works = on.devices != ("CPU",) or "--tf_xla_cpu_global_jit" in on.tf_xla_flags
    assert on.clustered is works
    if on.clustered:
        assert {"_XlaCompile", "_XlaRun"} <= set(on.xla_ops)


def test_mixed_bfloat16_has_no_fallback_to_float16():
    seen = F.bf16_fallback()
    assert "回退FP16" in seen.seed_comment
    assert (seen.policy, seen.compute_dtype, seen.variable_dtype) == ("mixed_bfloat16", "bfloat16", "float32")
    assert seen.output_dtype == "bfloat16"  # it ran here, whatever the CPU has
    assert seen.policy_after == "float32"
    with pytest.raises(ValueError, match="choose one of"):
        F.bf16_fallback("mixed_fp8")


def test_scale_log_reads_a_loss_scale_optimizers_dynamic_scale_and_ignores_other_optimizers():
    logs = []
    for optimizer in (keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0),
                      keras.optimizers.SGD()):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        optimizer.build(model.trainable_variables)
        log = F.ScaleLog()
        log.set_model(model)
        log.on_train_batch_end(0)
        if hasattr(optimizer, "dynamic_scale"):
            optimizer.dynamic_scale.assign(4.0)  # read live, each time
        log.on_train_batch_end(1)
        log.on_epoch_end(0)
        logs.append(log)
    assert (logs[0].batches, logs[0].epochs) == ([8.0, 4.0], [4.0])
    assert (logs[1].batches, logs[1].epochs) == ([], [])
