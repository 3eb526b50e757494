"""What every runner must do, checked in PyTorch, JAX/Flax and TensorFlow/Keras alike.

Each test runs once per framework (the `framework` fixture of tests/train/conftest.py; a
framework that is not installed is skipped). Real training on the CPU, no mocks; the tiny
configs keep each run to a fraction of a second. Where the frameworks honestly differ (which
library's loss scaler, which counters an optimizer keeps), the difference is a table below,
next to the library it comes from. What only one framework does lives in test_<framework>_runner.py.
"""

import functools
import importlib
import math

import numpy as np
import pytest

from labkit import scaling
from labkit.train import PRECISIONS, RunConfig, moved_fraction, run, run_in_turns
from labkit.train import data as D
from labkit.train import models as M

# the library whose dynamic loss scaling each runner uses, and its initial scale
SCALER = {"torch": ("torch", 2.0**16), "jax": ("jmp", 2.0**15), "tf": ("keras", 2.0**15)}
# bytes an optimizer keeps beyond its per-weight state: torch, a float32 "step" per Adam
# parameter tensor (6 in the MLP); jax, optax's int32 count; Keras, an int64 iteration counter
# and a float32 learning-rate variable (for SGD too)
ADAM_COUNTERS = {"torch": 4 * 6, "jax": 4, "tf": 8 + 4}
SGD_STATE = {"torch": 0, "jax": 0, "tf": 8 + 4}
# how each names itself in RunResult.device, and how each says where a run diverged
NAME_IN_DEVICE = {"torch": "torch ", "jax": "jax ", "tf": "tensorflow "}
DIVERGED_IN = {"torch": "output", "jax": "(activation)", "tf": "output of layer"}
# how each refuses a GPU it does not have, and another framework's config
NO_GPU = {"torch": r"torch.cuda.is_available\(\) is False", "jax": "device '{device}' was requested",
          "tf": "TensorFlow sees no GPU"}
NOT_MINE = {"torch": "framework='torch'", "jax": "framework='jax'", "tf": "config.framework is 'torch'"}
STORED_BYTES = {"fp32": 4, "tf32": 4, "fp16": 4, "bf16": 4, "bf16-pure": 2}  # per parameter


def runner(framework: str):
    """The framework's stepper module (labkit.train.<framework>.stepper), imported now."""
    return importlib.import_module(f"labkit.train.{framework}.stepper")


def has_gpu(framework: str) -> bool:
    if framework == "torch":
        import torch

        return torch.cuda.is_available()
    if framework == "jax":
        import jax

        try:
            return bool(jax.devices("gpu"))
        except RuntimeError:
            return False
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


@functools.lru_cache(maxsize=None)
def run_once(cfg: RunConfig):
    """One real run per distinct config in this module (the tests only read the result)."""
    return run(cfg)


def n_params(cfg: RunConfig) -> int:
    return M.count_params(M.init_params(cfg.model, width=cfg.width))


# -- the models ------------------------------------------------------------------------------
def logits_at_init(framework, model, params, x):
    """The framework's fp32 forward pass of `params` (labkit's names) on `x`, as float64."""
    if framework == "torch":
        import torch

        from labkit.train.torch.models import build

        xin = torch.from_numpy(D.Dataset.tokens(x)).long() if model == "transformer" else torch.from_numpy(x)
        with torch.no_grad():
            return build(model, params)(xin).double().numpy()
    if framework == "jax":
        import jax

        from labkit.train.jax import models as JM

        width = params["dense1/kernel" if model == "mlp" else "embed/embedding"].shape[1]
        with jax.default_matmul_precision("highest"):
            logits = jax.jit(JM.build(model, width=width).apply)({"params": JM.to_flax(params)}, x)
        return np.asarray(logits, np.float64)
    from labkit.train.tf import models as TM

    width = params["dense1/kernel" if model == "mlp" else "embed/embedding"].shape[1]
    keras_model = TM.build(model, "fp32", width=width)
    TM.load_params(keras_model, params)
    return np.asarray(keras_model(TM.model_inputs(model, x)), np.float64)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_fp32_forward_at_init_matches_the_float64_reference(framework, model, tiny, digits):
    cfg = tiny(model=model)
    params = M.init_params(model, seed=1, width=cfg.width)
    x = digits.x_test[:24]
    got = logits_at_init(framework, model, params, x)
    np.testing.assert_allclose(got, M.reference_logits(model, params, x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_every_init_param_lands_in_the_steppers_weights(framework, model, tiny, digits):
    # bf16: the weights the optimizer updates are float32 masters, exact copies of init_params
    params = M.init_params(model, seed=0, width=tiny(model=model).width)
    weights = runner(framework).make_stepper(tiny(model=model, precision="bf16"), digits).params()
    assert sorted(weights) == sorted(params)  # nothing left out, nothing extra
    for name, value in params.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


# -- every precision, real steps -------------------------------------------------------------
# tf32 is the fp32 program with another matmul precision; on JAX's transformer it only adds
# compile time, so JAX runs it on the MLP (and against fp32 in test_tf32_changes_nothing...)
EVERY_PRECISION = [(f, m, p) for f in ("torch", "jax", "tf") for m in ("mlp", "transformer") for p in PRECISIONS
                   if (f, m, p) != ("jax", "transformer", "tf32")]


@pytest.mark.parametrize("framework, model, precision", EVERY_PRECISION, indirect=["framework"])
def test_every_precision_trains_a_few_real_steps(framework, model, precision, tiny):
    res = run_once(tiny(model=model, precision=precision, steps=3))
    assert res.status == "ok" and res.steps_done == 3
    assert all(math.isfinite(v) for v in res.losses + res.step_times)
    assert 0.0 <= res.metric["value"] <= 1.0 and res.metric["name"] == "accuracy"
    assert res.device.startswith("cpu (") and NAME_IN_DEVICE[framework] in res.device
    if precision == "fp16":
        # the scaler starts high and may overflow while it calibrates (the transformer's first
        # scaled gradients exceed 65504): such a step is skipped, as the library's rule says
        preset, init = SCALER[framework]
        assert res.scales[0] == init
        assert res.scales == scaling.simulate(preset, overflows=res.skipped, init_scale=init).scales.tolist()
        assert [not math.isfinite(g) for g in res.grad_norms] == res.skipped and not res.skipped[-1]
    else:
        assert res.scales == [] and res.skipped == [False] * 3
        assert all(math.isfinite(g) for g in res.grad_norms)
    stored = STORED_BYTES[precision] * n_params(res.config)
    assert res.memory["parameter_bytes"] == stored
    assert res.memory.get("gradient_bytes", stored) == stored  # a gradient has its weight's dtype


# bf16 on JAX only adds compile time: its determinism is XLA's, as fp16's is
SAME_CONFIG = [(f, "fp16") for f in ("torch", "jax", "tf")] + [("torch", "bf16"), ("tf", "bf16")]


@pytest.mark.parametrize("framework, precision", SAME_CONFIG, indirect=["framework"])
def test_the_same_config_gives_the_same_losses_grad_norms_and_scales(framework, precision, tiny):
    cfg = tiny(precision=precision, steps=6, inject_overflow=(2,) if precision == "fp16" else ())
    a, b = run(cfg), run(cfg)
    assert a.losses == b.losses and a.grad_norms == b.grad_norms and a.scales == b.scales
    if precision == "fp16":
        assert run(cfg.replace(seed=1)).losses != a.losses


def test_runs_in_turns_give_the_losses_of_runs_one_after_the_other(framework, tiny):
    # one step of each in turn: only the step times are measured differently
    configs = [tiny(precision=p, steps=4, inject_overflow=(1,) if p == "fp16" else ()) for p in ("fp32", "fp16")]
    alone, turns = [run(c) for c in configs], run_in_turns(configs)
    for a, b in zip(alone, turns):
        assert b.status == "ok" and b.config == a.config and b.device == a.device
        assert b.losses == a.losses and b.grad_norms == a.grad_norms and b.scales == a.scales
        assert b.skipped == a.skipped and b.metric == a.metric and len(b.step_times) == 4


def test_tf32_changes_nothing_on_a_cpu(framework, tiny):
    if has_gpu(framework):
        pytest.skip("TF32 exists on GPUs; the claim is about a CPU")
    fp32, tf32 = run_once(tiny(precision="fp32", steps=3)), run_once(tiny(precision="tf32", steps=3))
    assert fp32.losses == tf32.losses and fp32.grad_norms == tf32.grad_norms


def test_bf16_trains_to_nearly_the_fp32_loss(framework):
    cfg = RunConfig(framework, width=64, steps=60, progress=False)
    fp32, bf16 = run(cfg), run(cfg.replace(precision="bf16"))
    late32, late16 = np.mean(fp32.losses[-10:]), np.mean(bf16.losses[-10:])
    assert late32 < 0.5 * fp32.losses[0]  # it learned
    assert abs(late16 - late32) < 0.02 * late32
    assert bf16.losses != fp32.losses  # and bf16 really computed in bf16
    assert abs(bf16.metric["value"] - fp32.metric["value"]) <= 0.02


# -- loss scaling ----------------------------------------------------------------------------
def test_grad_norm_is_the_unscaled_norm_before_clipping(framework, tiny):
    cfg = tiny(steps=1, clip_norm=1e-3)
    fp32, fp16 = run(cfg), run(cfg.replace(precision="fp16"))
    assert fp32.grad_norms[0] > 100 * cfg.clip_norm  # reported before clipping
    assert fp16.grad_norms[0] == pytest.approx(fp32.grad_norms[0], rel=1e-2)  # not times the scale


def test_fp16_skips_the_overflowed_steps_and_halves_the_scale(framework, tiny):
    res = run(tiny(precision="fp16", steps=8, inject_overflow=(2, 3, 6), init_scale=2.0**10))
    assert res.skipped == [False, False, True, True, False, False, True, False]
    assert res.scales == [1024.0, 1024.0, 1024.0, 512.0, 256.0, 256.0, 256.0, 128.0]
    assert [not math.isfinite(g) for g in res.grad_norms] == res.skipped
    assert res.status == "ok" and all(math.isfinite(v) for v in res.losses)
    # the same rule as labkit's replay of the library's scaler
    replay = scaling.simulate(SCALER[framework][0], overflows=res.skipped, init_scale=2.0**10)
    assert replay.scales.tolist() == res.scales and replay.applied.tolist() == [not s for s in res.skipped]


def test_a_skipped_step_leaves_the_weights_alone(framework, tiny, digits, first_batch):
    cfg = tiny(precision="fp16", steps=3, init_scale=2.0**10)
    x, y = first_batch(cfg)
    stepper = runner(framework).make_stepper(cfg, digits)
    weights = [stepper.params()]
    for inject in (False, True, False):
        out = stepper.step(x, y, inject_overflow=inject)
        weights.append(stepper.params())
        assert out.skipped == inject and out.scale == (2.0**9 if len(weights) == 4 else 2.0**10)
        assert math.isfinite(out.grad_norm) is not inject and math.isfinite(out.loss)
    unchanged = [all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(weights, weights[1:])]
    assert unchanged == [False, True, False]  # the skipped step changed not one entry


# -- pure bf16: small updates are rounded away --------------------------------------------------
def test_pure_bf16_rounds_small_sgd_updates_away_where_fp32_master_weights_keep_them(framework, tiny):
    changed = {p: moved_fraction(tiny(precision=p, optimizer="sgd", lr=1e-4, clip_norm=None), steps=1,
                                 names=["dense2/kernel"])["dense2/kernel"] for p in ("bf16", "bf16-pure")}
    assert changed["bf16"] > 0.5 and changed["bf16-pure"] < 0.05, changed


# -- divergence ---------------------------------------------------------------------------------
def test_an_fp16_overflow_in_the_forward_pass_stops_the_run_and_names_the_layer(framework):
    cfg = RunConfig(framework, "fp16", optimizer="sgd", lr=5.0, clip_norm=None, steps=40, progress=False)
    res = run(cfg)
    assert res.status == "diverged" and res.diverged_step == res.steps_done - 1 < 40
    assert not math.isfinite(res.losses[-1]) and all(math.isfinite(v) for v in res.losses[:-1])
    assert res.diverged_where.split(" ")[0] in ("dense1", "dense2", "out")  # a layer, not a weight
    assert DIVERGED_IN[framework] in res.diverged_where and res.metric is None
    # the same run in fp32 stays finite: the overflow is fp16's 65504 limit
    assert run(cfg.replace(precision="fp32")).status == "ok"


def test_a_healthy_run_names_no_nonfinite_layer(framework, tiny, digits, first_batch):
    cfg = tiny(steps=1)
    stepper = runner(framework).make_stepper(cfg, digits)
    assert stepper.nonfinite_layer() is None
    stepper.step(*first_batch(cfg), inject_overflow=False)
    assert stepper.nonfinite_layer() is None


# -- memory ---------------------------------------------------------------------------------------
def test_memory_counts_the_weights_and_adams_two_moments_as_stored(framework, tiny):
    for precision in ("fp32", "bf16-pure"):
        cfg = tiny(precision=precision, steps=3)  # the runs of test_every_precision_trains_a_few_real_steps
        mem, per_param = run_once(cfg).memory, STORED_BYTES[precision]
        assert mem["parameter_bytes"] == per_param * n_params(cfg), precision
        assert mem["optimizer_state_bytes"] == 2 * per_param * n_params(cfg) + ADAM_COUNTERS[framework], precision


def test_sgd_keeps_no_per_weight_state(framework, tiny):
    assert run(tiny(optimizer="sgd", steps=1)).memory["optimizer_state_bytes"] == SGD_STATE[framework]


# -- bad configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_an_absent_gpu_is_refused_before_any_work(framework, device, tiny, tmp_path):
    if has_gpu(framework):
        pytest.skip("this machine has a GPU")
    out = tmp_path / "run.jsonl"
    with pytest.raises(ValueError, match=NO_GPU[framework].format(device=device)):
        run(tiny(device=device, out=str(out)))
    assert not out.exists()


def test_the_runner_refuses_another_frameworks_config(framework, digits):
    other = "jax" if framework == "torch" else "torch"
    with pytest.raises(ValueError, match=NOT_MINE[framework]):
        runner(framework).make_stepper(RunConfig(other, steps=1), digits)
    with pytest.raises(TypeError, match="make_stepper takes a RunConfig, got dict"):
        runner(framework).make_stepper({"framework": framework}, digits)
