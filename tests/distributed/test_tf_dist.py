"""tf.distribute.MirroredStrategy runs: real TensorFlow over logical CPU devices, in subprocesses.

Each distributed run starts a fresh Python (logical devices must exist before TensorFlow
initialises), so the runs here are few, tiny (a width-32 MLP, 3 steps) and shared between tests.
"""

import functools

import numpy as np
import pytest

from labkit.train.tf import distributed as tf_dist
from labkit.train import RunConfig, run

BASE = RunConfig("tf", "bf16", width=32, batch_size=16, steps=3, progress=False)
N_PARAMS = 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10  # the width-32 MLP


@functools.cache
def two_replicas(**changes):
    return run(BASE.replace(devices=2, **changes))


@functools.cache
def one_device(**changes):
    return run(BASE.replace(**changes))


def test_two_replica_bf16_run_matches_the_one_device_run_within_bf16_tolerance():
    multi, single = two_replicas(), one_device()
    assert multi.status == single.status == "ok"
    assert multi.device.startswith("MirroredStrategy over 2 replicas")
    np.testing.assert_allclose(multi.losses, single.losses, rtol=2 ** -7)
    np.testing.assert_allclose(multi.grad_norms, single.grad_norms, rtol=2 ** -6)
    assert multi.extra["replica_weight_max_diff"] == 0.0


def test_mixed_bfloat16_gradients_are_reduced_in_float32_by_default():
    ex = two_replicas().extra
    grads = [c for c in ex["collectives"] if c["reduces"] == "gradients"]
    assert grads and {c["dtype"] for c in grads} == {"float32"}
    assert ex["reduce_dtype"] == ["float32"]
    assert ex["comm_bytes_per_step"] == 4 * N_PARAMS  # every fp32 gradient, once per replica


def test_reduce_dtype_bf16_puts_a_bfloat16_all_reduce_in_the_program_and_halves_the_bytes():
    bf16, fp32 = two_replicas(reduce_dtype="bf16"), two_replicas()
    assert bf16.extra["reduce_dtype"] == ["bfloat16"]
    assert any(c["op"].startswith("Collective") and c["dtype"] == "bfloat16" for c in bf16.extra["collectives"])
    assert bf16.extra["comm_bytes_per_step"] * 2 == fp32.extra["comm_bytes_per_step"]
    np.testing.assert_allclose(bf16.losses, one_device().losses, rtol=2 ** -6)


def test_fp16_overflow_on_one_replica_skips_the_step_on_all_and_halves_the_scale():
    res = two_replicas(precision="fp16", inject_overflow=(1,), init_scale=1024.0)
    assert res.status == "ok"
    assert res.extra["overflow_replica"] == 1
    assert res.extra["local_overflow"] == [[], [1], []]  # only replica 1 saw the inf ...
    assert res.skipped == [False, True, False]           # ... and the step was skipped
    assert res.scales == [1024.0, 1024.0, 512.0]
    assert res.extra["replica_weight_max_diff"] == 0.0    # ... on every replica alike
    assert all(np.isfinite(res.losses))


def test_keras_own_aggregation_checks_only_the_first_replica_for_overflow():
    demo = tf_dist.keras_local_check_demo(devices=2)
    keras_way, labkit_way = demo["keras"], demo["labkit"]
    assert keras_way["applied"][1] and keras_way["scales"][1] == 4.0   # replica 1's inf applied
    assert not np.isfinite(keras_way["weights"][1])
    assert labkit_way["applied"] == [True, False, True] and labkit_way["scales"] == [4.0, 2.0, 2.0]
    assert labkit_way["weights"][1] == labkit_way["weights"][0]


@pytest.mark.parametrize("changes, message", [
    (dict(framework="torch"), "TensorFlow engine"),
    (dict(parallel="fsdp"), "parallel='dp' only"),
    (dict(devices=1), "devices >= 2"),
])
def test_configs_tf_distribute_cannot_run_are_refused_before_any_work(changes, message):
    with pytest.raises(ValueError, match=message):
        tf_dist.run(BASE.replace(**{"devices": 2, **changes}))


def test_overflow_replica_must_name_a_replica():
    with pytest.raises(ValueError, match="0 .. 1"):
        tf_dist.check_config(BASE.replace(devices=2), overflow_replica=2)
    with pytest.raises(TypeError, match="int"):
        tf_dist.check_config(BASE.replace(devices=2), overflow_replica=1.0)


def test_a_device_that_is_not_there_is_a_value_error_from_the_subprocess():
    with pytest.raises(ValueError, match="device='tpu' asked for"):
        tf_dist.run(BASE.replace(devices=2, device="tpu"))
