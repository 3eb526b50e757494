"""What only the TensorFlow / Keras runner does: real TensorFlow on the CPU, no mocks.

What every runner does (forward pass against the float64 reference, every precision, loss
scaling, pure bf16, divergence, Adam's memory, refusals) is tested once for all three
frameworks in test_runners.py, with the tiny configs of conftest.py. TensorFlow's float16 has
no arithmetic units on an x86 CPU, so the fp16 runs here are a handful of steps of a narrow MLP.
"""

import functools
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from labkit.train import RunConfig, run
from labkit.train import models as M
from labkit.train.tf import models as TM
from labkit.train.tf import stepper as tf_runner
from labkit.train.loop import train
from labkit.train.tf.models import keras, tf
from labkit.train.tf.stepper import make_stepper


@pytest.fixture
def framework():
    return "tf"


# -- the Keras models ----------------------------------------------------------------------
def test_load_params_refuses_params_of_another_model():
    keras_model = TM.build("mlp", "fp32", width=16)
    with pytest.raises(ValueError, match="parameter names differ"):
        TM.load_params(keras_model, M.init_params("transformer", width=16))
    with pytest.raises(ValueError, match="dense1/kernel: model shape"):
        TM.load_params(keras_model, M.init_params("mlp", width=8))


def test_gelu_is_the_exact_erf_form_not_the_tanh_approximation():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    exact = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(np.asarray(TM.gelu_exact(x)), exact, atol=1e-6)
    tanh_form = np.asarray(keras.activations.gelu(x, approximate=True))
    assert np.abs(tanh_form - exact).max() > 1e-4  # the test above can tell them apart


@pytest.mark.parametrize(
    "precision, body, head_variables",
    [("fp32", "float32", "float32"), ("fp16", "float16", "float32"), ("bf16", "bfloat16", "float32"),
     ("bf16-pure", "bfloat16", "bfloat16")],
)
def test_policies_put_the_body_in_low_precision_and_keep_the_head_in_float32(precision, body, head_variables):
    model = TM.build("transformer", precision, width=16)
    layers = {layer.name: layer for layer in model.layers}
    assert layers["block0_fc1"].compute_dtype == body
    assert layers["block0_fc1"].variable_dtype == ("bfloat16" if precision == "bf16-pure" else "float32")
    assert layers["head"].compute_dtype == head_variables and layers["head"].variable_dtype == head_variables
    assert model.output.dtype == head_variables
    assert keras.mixed_precision.global_policy().name == "float32"  # per layer, never global


# -- real steps ----------------------------------------------------------------------------------
def test_the_first_loss_is_the_loss_of_the_reference_model(tiny, first_batch):
    cfg = tiny(steps=1)
    x, y = first_batch(cfg)
    logits = M.reference_logits("mlp", M.init_params("mlp", cfg.seed, cfg.width), x)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    assert run(cfg).losses[0] == pytest.approx(-logp[np.arange(len(y)), y].mean(), abs=1e-5)


def test_xla_compiled_step_gives_the_plain_steps_losses(tiny):
    cfg = tiny(steps=3)
    plain = run(cfg)
    xla = train(cfg, functools.partial(make_stepper, jit_compile=True))
    np.testing.assert_allclose(xla.losses, plain.losses, rtol=1e-5)


# -- loss scaling ----------------------------------------------------------------------------------
def test_clipping_acts_on_the_unscaled_gradients(tiny, first_batch, digits):
    # SGD with lr 1 and a gradient norm far above clip_norm: the update has norm clip_norm,
    # not clip_norm / 2**15 (what clipping the scaled gradients would leave).
    for precision in ("fp32", "fp16"):
        cfg = tiny(precision=precision, optimizer="sgd", lr=1.0, clip_norm=0.1, steps=1)
        x, y = first_batch(cfg)
        stepper = make_stepper(cfg, digits)
        before = stepper.params()
        out = stepper.step(x, y, inject_overflow=False)
        after = stepper.params()
        moved = math.sqrt(sum(float(np.sum((after[k].astype(np.float64) - before[k]) ** 2)) for k in before))
        assert out.grad_norm > 1.0 and moved == pytest.approx(0.1, rel=1e-3), precision


def test_a_skipped_step_leaves_adam_alone_and_halves_keras_default_scale(tiny, first_batch, digits):
    # the weights alone: test_runners.py
    cfg = tiny(precision="fp16", steps=2)
    x, y = first_batch(cfg)
    stepper = make_stepper(cfg, digits)
    out = stepper.step(x, y, inject_overflow=True)
    assert out.skipped and out.scale == 2.0**15
    inner = stepper.optimizer.inner_optimizer
    assert int(inner.iterations.numpy()) == 0 and float(stepper.optimizer.dynamic_scale.numpy()) == 2.0**14
    out = stepper.step(x, y, inject_overflow=False)
    assert not out.skipped and out.scale == 2.0**14 and int(inner.iterations.numpy()) == 1


# -- pure bf16 ------------------------------------------------------------------------------------------
def test_keras_adam_on_bfloat16_weights_never_moves_them(tiny, first_batch, digits):
    # Keras' Adam computes its bias correction in the variable's dtype: beta_2 = 0.999 is
    # 1.0 in bfloat16, so 1 - beta_2**t = 0 and the step size is exactly 0.
    assert float(keras.ops.cast(0.999, "bfloat16")) == 1.0
    cfg = tiny(precision="bf16-pure", optimizer="adam", lr=1e-2, steps=1)
    x, y = first_batch(cfg)
    stepper = make_stepper(cfg, digits)
    before = stepper.params()
    for _ in range(3):
        stepper.step(x, y, inject_overflow=False)
    assert all(np.array_equal(before[k], v) for k, v in stepper.params().items())
    assert str(stepper.optimizer.variables[-1].dtype) == "bfloat16"  # Adam's moments are bf16 too


# -- memory -----------------------------------------------------------------------------------------------
def test_memory_counts_float32_masters_their_gradients_and_the_loss_scale_optimizers_variables(tiny):
    # fp32 and pure bf16 weights and Adam's state: test_runners.py
    n = M.count_params(M.init_params("mlp", width=32))
    mem = {p: run(tiny(precision=p, steps=1)).memory for p in ("fp32", "bf16", "fp16")}
    extra = 8 + 4  # Keras' int64 iteration counter and float32 learning-rate variable
    assert mem["fp32"]["parameter_bytes"] == mem["bf16"]["parameter_bytes"] == 4 * n  # float32 masters
    assert mem["bf16"]["gradient_bytes"] == 4 * n  # gradients take their float32 variable's dtype
    assert mem["bf16"]["optimizer_state_bytes"] == 8 * n + extra  # Adam's two moments, in float32
    # the LossScaleOptimizer adds its own iteration and learning-rate variables, an int64
    # step_counter and the float32 dynamic_scale
    assert mem["fp16"]["optimizer_state_bytes"] == 8 * n + extra + extra + 8 + 4
    assert not any(k.startswith("gpu") for k in mem["fp32"])  # a CPU reports no allocator figures


# -- global state ---------------------------------------------------------------------------------------
def test_a_run_restores_tf32_determinism_and_the_global_policy(tiny):
    from tensorflow.python.framework import config as tf_config

    for user_tf32, precision in ((True, "fp32"), (False, "tf32")):
        tf.config.experimental.enable_tensor_float_32_execution(user_tf32)
        try:
            run(tiny(precision=precision, steps=1))
            assert tf.config.experimental.tensor_float_32_execution_enabled() is user_tf32
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(True)
    assert not tf_config.is_op_determinism_enabled()
    assert keras.mixed_precision.global_policy().name == "float32"


def test_the_state_is_set_while_the_stepper_works(tiny, first_batch, digits):
    cfg = tiny(precision="fp32", steps=1)
    x, y = first_batch(cfg)
    stepper = make_stepper(cfg, digits)
    with stepper._state():
        assert not tf.config.experimental.tensor_float_32_execution_enabled()
    assert tf.config.experimental.tensor_float_32_execution_enabled()


# -- bad configs, devices ---------------------------------------------------------------------------------
def test_a_tpu_that_is_not_there_is_refused_and_auto_falls_back(tiny):
    resolver, why = tf_runner.find_tpu()
    if resolver is not None:
        pytest.skip("this machine has a TPU")
    assert why.startswith("no TPU: the environment names none")
    with pytest.raises(ValueError, match="device='tpu' asked for"):
        make_stepper(tiny(device="tpu"))
    assert make_stepper(tiny(device="auto")).kind == ("gpu" if tf.config.list_physical_devices("GPU") else "cpu")


def test_a_tpu_named_by_the_environment_but_absent_is_reported_not_raised(monkeypatch, tiny):
    if tf.config.list_logical_devices("TPU"):
        pytest.skip("this machine has a TPU")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")  # what a Cloud TPU VM sets
    resolver, why = tf_runner.find_tpu()
    assert resolver is None and why.startswith("no usable TPU (environment (TPU_ACCELERATOR_TYPE))")
    assert "\n" not in why
    with pytest.raises(ValueError, match="no usable TPU"):
        make_stepper(tiny(device="tpu"))
    assert make_stepper(tiny(device="auto")).kind in ("cpu", "gpu")


def test_the_runner_refuses_bad_options_and_needs_no_dataset(tiny):
    # another framework's config, or no RunConfig: test_runners.py
    with pytest.raises(ValueError, match="config.framework is 'torch'"):
        make_stepper(RunConfig("torch"))  # data is optional here
    with pytest.raises(TypeError, match="jit_compile must be True or False"):
        make_stepper(tiny(), jit_compile="yes")
    with pytest.raises(TypeError, match="tf.distribute.Strategy"):
        make_stepper(tiny(), strategy="tpu")


# -- the replicated (TPUStrategy) path ----------------------------------------------------------------------
_REPLICATED = textwrap.dedent("""
    import functools, json
    from labkit.train.tf.models import tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from labkit.train import RunConfig
    from labkit.train.tf import stepper as tf_runner
    from labkit.train.loop import train
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    cfg = RunConfig("tf", "bf16", width=32, steps=4, batch_size=32, clip_norm=0.5, progress=False)
    two = train(cfg, functools.partial(tf_runner.make_stepper, strategy=strategy))
    one = train(cfg, tf_runner.make_stepper)
    try:
        tf_runner.make_stepper(cfg.replace(batch_size=31), strategy=strategy)
    except ValueError as exc:
        refused = str(exc)
    print(json.dumps({"two": two.losses, "one": one.losses, "n2": two.grad_norms, "n1": one.grad_norms,
                      "device": two.device, "status": two.status, "refused": refused}))
""")


def test_the_replicated_step_matches_one_device():
    """The code path a TPU takes (strategy.scope, strategy.run, cross-replica sums), run
    here with MirroredStrategy over two logical CPUs, in a fresh process. It also checks that
    importing labkit's TensorFlow modules leaves the runtime unstarted: the logical devices
    are configured after the import."""
    env = dict(os.environ, PYTHONWARNINGS="error")
    proc = subprocess.run([sys.executable, "-c", _REPLICATED], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok" and got["device"].startswith("MirroredStrategy over 2 replicas")
    np.testing.assert_allclose(got["two"], got["one"], rtol=2e-3)  # bf16 sums in another order
    np.testing.assert_allclose(got["n2"], got["n1"], rtol=2e-3)
    assert min(got["n1"]) > 0.5  # clip_norm 0.5 was active: clipping is global, as on one device
    assert "multiple of the 2 replicas" in got["refused"]
