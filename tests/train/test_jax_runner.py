"""The JAX/Flax runner: real Flax, optax and jmp on the CPU; no mocks."""

import functools
import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("jmp")

import jax.numpy as jnp  # noqa: E402

from labkit import scaling  # noqa: E402
from labkit.train import PRECISIONS, RunConfig, models, run  # noqa: E402
from labkit.train.jax import models as jax_models  # noqa: E402
from labkit.train.jax import stepper as jax_runner
from labkit.train.data import batches, load  # noqa: E402
from labkit.train.jax.lessons import moved_fraction  # noqa: E402

SMALL = dict(framework="jax", width=32, batch_size=32, progress=False)
TINY_TRANSFORMER = dict(framework="jax", model="transformer", width=8, batch_size=8, progress=False)
BYTES = {"fp32": 4, "tf32": 4, "fp16": 4, "bf16": 4, "bf16-pure": 2}  # bytes per stored parameter


def config(**changes):
    return RunConfig(**{**SMALL, **changes})


@pytest.fixture(scope="module")
def digits():
    return load("digits", seed=0)


@pytest.fixture(scope="module")
def batch(digits):
    return next(batches(digits, 32, seed=0))


def stepper_for(digits, **changes):
    return jax_runner.make_stepper(config(**changes), digits)


# -- the models -------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_flax_tree_has_exactly_the_names_and_shapes_of_init_params(model):
    module = jax_models.build(model, width=16)
    created = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((2, 64), jnp.float32))["params"]
    loaded = jax_models.to_flax(models.init_params(model, seed=0, width=16))
    assert jax.tree_util.tree_structure(created) == jax.tree_util.tree_structure(loaded)
    assert jax.tree_util.tree_map(lambda a: a.shape, created) == jax.tree_util.tree_map(lambda a: a.shape, loaded)
    assert [name for name, _ in jax_models.named_leaves(loaded)] == sorted(models.init_params(model, width=16))


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_fp32_forward_at_init_matches_the_float64_reference(model, digits):
    flat = models.init_params(model, seed=3)
    x = digits.x_test[:32]
    with jax.default_matmul_precision("highest"):
        logits = jax.jit(jax_models.build(model).apply)({"params": jax_models.to_flax(flat)}, x)
    np.testing.assert_allclose(np.asarray(logits), models.reference_logits(model, flat, x), atol=1e-5, rtol=1e-5)


# -- every precision, real steps -------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def run_once(cfg: RunConfig):
    """One real run per distinct config in this module (tests only read the result)."""
    return run(cfg)


# tf32 is the fp32 program with another matmul precision attribute; on a transformer it adds
# only compile time, so it runs on the MLP (and against fp32 in test_tf32_changes_nothing...).
EVERY_PRECISION = [(SMALL, p) for p in PRECISIONS] + [(TINY_TRANSFORMER, p) for p in PRECISIONS if p != "tf32"]


@pytest.mark.parametrize("shape,precision", EVERY_PRECISION,
                         ids=[f"{s.get('model', 'mlp')}-{p}" for s, p in EVERY_PRECISION])
def test_every_precision_trains_a_few_real_steps(shape, precision):
    cfg = RunConfig(**{**shape, "precision": precision, "steps": 3})
    res = run_once(cfg)
    assert res.status == "ok" and len(res.losses) == 3
    assert all(math.isfinite(v) for v in res.losses + res.grad_norms)
    assert 0.0 <= res.metric["value"] <= 1.0 and res.metric["name"] == "accuracy"
    assert res.skipped == [False] * 3
    assert res.scales == ([2.0**15] * 3 if precision == "fp16" else [])
    n = models.count_params(models.init_params(cfg.model, width=cfg.width))
    assert res.memory["parameter_bytes"] == BYTES[precision] * n
    assert res.device.startswith(jax.default_backend())


@pytest.mark.parametrize("precision,compute,stored", [
    ("fp32", "float32", "float32"), ("fp16", "float16", "float32"),
    ("bf16", "bfloat16", "float32"), ("bf16-pure", "bfloat16", "bfloat16")])
def test_params_and_adam_moments_keep_the_stored_dtype_and_the_model_computes_in_the_compute_dtype(
        digits, batch, precision, compute, stored):
    s = stepper_for(digits, precision=precision)
    s.step(*batch, False)
    assert {a.dtype.name for a in jax.tree_util.tree_leaves(s.params)} == {stored}
    adam = s.opt_state[1][0]  # chain(clip, adam) -> adam's ScaleByAdamState
    assert {a.dtype.name for a in jax.tree_util.tree_leaves((adam.mu, adam.nu))} == {stored}
    logits = jax.eval_shape(s.module.apply, {"params": s.params}, batch[0])
    assert logits.dtype.name == compute


@pytest.mark.parametrize("precision", ["fp16", "bf16", "bf16-pure"])
def test_gradients_have_the_parameters_dtype_and_no_silent_upcast_in_the_model_or_loss(digits, batch, precision):
    # Seed 000 says the gradients come out in the compute dtype; they have the params' dtype.
    s = stepper_for(digits, precision=precision)
    x, y = jnp.asarray(batch[0]), jnp.asarray(batch[1])
    with jax.numpy_dtype_promotion("strict"):  # any implicit promotion in model or loss raises
        loss, grads = jax.jit(jax.value_and_grad(s.loss))(s.params, x, y)
    assert loss.dtype == jnp.float32
    assert jax.tree_util.tree_map(lambda g: g.dtype, grads) == jax.tree_util.tree_map(lambda p: p.dtype, s.params)


# -- reproducibility ---------------------------------------------------------------------------
def test_the_same_config_gives_the_same_losses_grad_norms_and_scales():
    cfg = config(precision="fp16", steps=6, inject_overflow=(2,))
    a, b = run(cfg), run(cfg)
    assert a.losses == b.losses and a.grad_norms == b.grad_norms and a.scales == b.scales
    assert run_once(cfg.replace(seed=1)).losses != a.losses


# -- loss scaling --------------------------------------------------------------------------------
def test_an_injected_overflow_skips_the_update_and_halves_the_jmp_scale(digits, batch):
    s = stepper_for(digits, precision="fp16")
    s.step(*batch, False)
    before = (s.params, s.opt_state)
    out = s.step(*batch, True)
    assert out.skipped and out.grad_norm == math.inf and out.scale == 2.0**15 and math.isfinite(out.loss)
    assert moved_fraction(before, (s.params, s.opt_state)) == 0.0  # not one entry changed
    assert float(s.loss_scale.loss_scale) == 2.0**14 and int(s.loss_scale.counter) == 0
    after = s.step(*batch, False)
    assert not after.skipped and after.scale == 2.0**14
    assert moved_fraction(before[0], s.params) > 0.5


def test_the_run_records_skips_and_scales_as_jmp_and_labkit_scaling_replay_them():
    res = run(config(precision="fp16", steps=7, inject_overflow=(1, 4, 5)))
    assert res.skipped == [False, True, False, False, True, True, False]
    assert res.scales == [2.0**15, 2.0**15, 2.0**14, 2.0**14, 2.0**14, 2.0**13, 2.0**12]
    assert [g == math.inf for g in res.grad_norms] == res.skipped
    replay = scaling.simulate("jmp", res.skipped, init_scale=2.0**15)
    assert replay.scales.tolist() == res.scales and replay.applied.tolist() == [not s for s in res.skipped]


def test_a_real_fp16_overflow_is_skipped_until_jmp_has_halved_the_scale_enough():
    # No injection: a scale of 2**40 overflows float16's backward pass by itself.
    res = run(config(precision="fp16", steps=40, init_scale=2.0**40))
    n = res.skipped.index(False)
    assert n > 5 and all(res.skipped[:n]) and not any(res.skipped[n:])
    assert res.scales[: n + 1] == [2.0 ** (40 - i) for i in range(n + 1)]
    assert res.status == "ok" and all(math.isfinite(v) for v in res.losses)


# -- what mixed precision should and should not change --------------------------------------------
def test_bf16_reaches_a_loss_close_to_fp32():
    fp32, bf16 = (run(config(precision=p, steps=60, width=64)) for p in ("fp32", "bf16"))
    late = lambda r: float(np.mean(r.losses[-10:]))  # noqa: E731
    assert late(fp32) < fp32.losses[0] - 1.0  # it really learns
    assert abs(late(bf16) - late(fp32)) < 0.05
    assert bf16.losses != fp32.losses  # and bf16 really computed differently


def test_bf16_pure_rounds_away_updates_that_fp32_master_weights_keep(digits, batch):
    # Adam moves each weight by about lr = 1e-4 a step, less than half a bf16 ulp of most
    # weights (|w| > 256 * 1e-4): pure bf16 drops those updates, an fp32 master copy keeps them.
    runs = {}
    for precision in ("bf16", "bf16-pure"):
        s = stepper_for(digits, precision=precision, lr=1e-4, width=64)
        start = s.params
        losses = [s.step(*batch, False).loss for _ in range(8)]
        runs[precision] = (moved_fraction(start, s.params), losses[0] - losses[-1])
    (moved_mixed, learned_mixed), (moved_pure, learned_pure) = runs["bf16"], runs["bf16-pure"]
    assert moved_mixed > 0.5 and moved_pure < 0.25 * moved_mixed
    assert learned_mixed > 3 * learned_pure > 0


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="TF32 exists on GPUs; the claim is about a CPU")
def test_tf32_changes_nothing_on_a_cpu():
    a, b = run_once(config(precision="fp32", steps=3)), run_once(config(precision="tf32", steps=3))
    assert a.losses == b.losses and a.grad_norms == b.grad_norms


# -- bad input, divergence, global state -----------------------------------------------------------
@pytest.mark.parametrize("device,backend", [("cuda", "gpu"), ("gpu", "gpu"), ("tpu", "tpu")])
def test_an_absent_accelerator_is_refused_before_any_work(tmp_path, device, backend):
    try:
        if jax.devices(backend):
            pytest.skip(f"this machine has a {backend}")
    except RuntimeError:
        pass
    out = tmp_path / "run.jsonl"
    with pytest.raises(ValueError, match=f"device '{device}' was requested"):
        run(config(device=device, out=str(out)))
    assert not out.exists()


def test_make_stepper_refuses_a_config_for_another_framework(digits):
    with pytest.raises(ValueError, match="framework='jax'"):
        jax_runner.make_stepper(RunConfig("torch", "bf16"), digits)
    with pytest.raises(TypeError, match="make_stepper takes a RunConfig, got dict"):
        jax_runner.make_stepper({"framework": "jax"}, digits)


def test_a_divergence_stops_the_run_and_names_the_first_nonfinite_parameter():
    res = run(config(optimizer="sgd", lr=1e38, clip_norm=None, steps=10))
    assert res.status == "diverged" and res.diverged_step == len(res.losses) - 1 < 10
    assert not math.isfinite(res.losses[-1]) and all(math.isfinite(v) for v in res.losses[:-1])
    assert res.diverged_where in models.init_params("mlp", width=32) or res.diverged_where.endswith("(activation)")


def test_nonfinite_layer_finds_a_nan_parameter_then_an_overflowing_activation(digits, batch):
    s = stepper_for(digits)
    assert s.nonfinite_layer() is None
    s.step(*batch, False)
    params = s.params
    s.params = {**params, "dense2": {**params["dense2"], "bias": params["dense2"]["bias"].at[3].set(jnp.nan)}}
    assert s.nonfinite_layer() == "dense2/bias"
    s.params = {**params, "dense2": {**params["dense2"], "kernel": jnp.full_like(params["dense2"]["kernel"], 3e38)}}
    assert s.nonfinite_layer() == "dense2 (activation)"


def test_memory_counts_params_and_adam_state_and_reads_the_compiled_step(digits, batch):
    n = models.count_params(models.init_params("mlp", width=32))
    for precision, per_param in (("fp32", 4), ("bf16-pure", 2)):
        s = stepper_for(digits, precision=precision)
        assert set(s.memory()) == {"parameter_bytes", "optimizer_state_bytes"}  # nothing compiled yet
        s.step(*batch, False)
        mem = s.memory()
        assert mem["parameter_bytes"] == per_param * n
        assert mem["optimizer_state_bytes"] == 2 * per_param * n + 4  # mu, nu and an int32 count
        assert mem["step_argument_bytes"] >= mem["parameter_bytes"] + mem["optimizer_state_bytes"] + batch[0].nbytes
        assert mem["step_temp_bytes"] > 0


def test_evaluate_is_the_accuracy_of_the_reference_models_predictions(digits):
    s = stepper_for(digits)
    ref = models.reference_logits("mlp", models.init_params("mlp", width=32), digits.x_test).argmax(-1)
    assert s.evaluate(digits.x_test, digits.y_test) == pytest.approx(np.mean(ref == digits.y_test))
    assert s.evaluate(digits.x_test, ref) == 1.0


def test_runs_leave_jax_global_settings_as_they_were():
    keys = ("jax_default_matmul_precision", "jax_enable_x64", "jax_numpy_dtype_promotion", "jax_default_device")
    before = {k: getattr(jax.config, k) for k in keys}
    for precision in ("fp32", "tf32"):
        run(config(precision=precision, steps=2))
        assert {k: getattr(jax.config, k) for k in keys} == before
    with jax.default_matmul_precision("bfloat16"):  # the learner's own setting survives a run
        run(config(precision="fp32", steps=2))
        assert jax.config.jax_default_matmul_precision == "bfloat16"
    assert jax.config.jax_enable_x64 is False


def test_the_device_description_names_the_platform_and_the_jax_version(digits):
    s = stepper_for(digits, device="cpu")
    assert s.device.startswith("cpu (") and f"jax {jax.__version__}" in s.device
