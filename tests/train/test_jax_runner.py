"""What only the JAX/Flax runner does: real Flax, optax and jmp on the CPU; no mocks.

What every runner does (forward pass against the float64 reference, every precision, loss
scaling, pure bf16, divergence, Adam's memory, refusals) is tested once for all three
frameworks in test_runners.py, with the tiny configs of conftest.py.
"""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("jmp")

import jax.numpy as jnp  # noqa: E402

from labkit.train import models, run  # noqa: E402
from labkit.train.jax import models as jax_models  # noqa: E402
from labkit.train.jax import stepper as jax_runner  # noqa: E402


@pytest.fixture
def framework():
    return "jax"


@pytest.fixture
def batch(tiny, first_batch):
    return first_batch(tiny())


@pytest.fixture
def stepper_for(tiny, digits):
    """``stepper_for(**changes)``: a JAX stepper of the tiny config with `changes`."""
    return lambda **changes: jax_runner.make_stepper(tiny(**changes), digits)


def changed(before: dict, after: dict) -> float:
    """The fraction of all weight entries that differ between two ``stepper.params()``."""
    return float(np.mean(np.concatenate([(after[k] != before[k]).ravel() for k in before])))


# -- the models -------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_flax_tree_has_exactly_the_names_and_shapes_of_init_params(model):
    module = jax_models.build(model, width=16)
    created = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((2, 64), jnp.float32))["params"]
    loaded = jax_models.to_flax(models.init_params(model, seed=0, width=16))
    assert jax.tree_util.tree_structure(created) == jax.tree_util.tree_structure(loaded)
    assert jax.tree_util.tree_map(lambda a: a.shape, created) == jax.tree_util.tree_map(lambda a: a.shape, loaded)
    assert [name for name, _ in jax_models.named_leaves(loaded)] == sorted(models.init_params(model, width=16))


# -- dtypes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision,compute,stored", [
    ("fp32", "float32", "float32"), ("fp16", "float16", "float32"),
    ("bf16", "bfloat16", "float32"), ("bf16-pure", "bfloat16", "bfloat16")])
def test_params_and_adam_moments_keep_the_stored_dtype_and_the_model_computes_in_the_compute_dtype(
        stepper_for, batch, precision, compute, stored):
    s = stepper_for(precision=precision)
    s.step(*batch, False)
    assert {a.dtype.name for a in jax.tree_util.tree_leaves(s.flax_params)} == {stored}
    adam = s.opt_state[1][0]  # chain(clip, adam) -> adam's ScaleByAdamState
    assert {a.dtype.name for a in jax.tree_util.tree_leaves((adam.mu, adam.nu))} == {stored}
    logits = jax.eval_shape(s.module.apply, {"params": s.flax_params}, batch[0])
    assert logits.dtype.name == compute


@pytest.mark.parametrize("precision", ["fp16", "bf16", "bf16-pure"])
def test_gradients_have_the_parameters_dtype_and_no_silent_upcast_in_the_model_or_loss(stepper_for, batch, precision):
    # Seed 000 says the gradients come out in the compute dtype; they have the params' dtype.
    s = stepper_for(precision=precision)
    x, y = jnp.asarray(batch[0]), jnp.asarray(batch[1])
    with jax.numpy_dtype_promotion("strict"):  # any implicit promotion in model or loss raises
        loss, grads = jax.jit(jax.value_and_grad(s.loss))(s.flax_params, x, y)
    assert loss.dtype == jnp.float32
    assert jax.tree_util.tree_map(lambda g: g.dtype, grads) == jax.tree_util.tree_map(lambda p: p.dtype, s.flax_params)


# -- loss scaling --------------------------------------------------------------------------------
def test_an_injected_overflow_leaves_adams_state_alone_and_resets_the_jmp_counter(stepper_for, batch):
    # the weights alone and the scale halved (from any init_scale): test_runners.py
    s = stepper_for(precision="fp16")
    s.step(*batch, False)
    before = jax.tree_util.tree_leaves(s.opt_state)
    out = s.step(*batch, True)
    assert out.skipped and out.grad_norm == math.inf and out.scale == 2.0**15  # jmp's default scale
    assert all(np.array_equal(a, b) for a, b in zip(before, jax.tree_util.tree_leaves(s.opt_state)))
    assert float(s.loss_scale.loss_scale) == 2.0**14 and int(s.loss_scale.counter) == 0


def test_a_real_fp16_overflow_is_skipped_until_jmp_has_halved_the_scale_enough(tiny):
    # No injection: a scale of 2**40 overflows float16's backward pass by itself.
    res = run(tiny(precision="fp16", steps=40, init_scale=2.0**40, batch_size=32))  # 16: a late overflow
    n = res.skipped.index(False)
    assert n > 5 and all(res.skipped[:n]) and not any(res.skipped[n:])
    assert res.scales[: n + 1] == [2.0 ** (40 - i) for i in range(n + 1)]
    assert res.status == "ok" and all(math.isfinite(v) for v in res.losses)


# -- what mixed precision should and should not change --------------------------------------------
def test_bf16_pure_adam_rounds_away_updates_that_fp32_master_weights_keep_and_learns_less(stepper_for, batch):
    # Adam moves each weight by about lr = 1e-4 a step, less than half a bf16 ulp of most
    # weights (|w| > 256 * 1e-4): pure bf16 drops those updates, an fp32 master copy keeps them.
    # (SGD's small updates, in every framework: test_runners.py)
    runs = {}
    for precision in ("bf16", "bf16-pure"):
        s = stepper_for(precision=precision, lr=1e-4, width=64)
        start = s.params()
        losses = [s.step(*batch, False).loss for _ in range(8)]
        runs[precision] = (changed(start, s.params()), losses[0] - losses[-1])
    (moved_mixed, learned_mixed), (moved_pure, learned_pure) = runs["bf16"], runs["bf16-pure"]
    assert moved_mixed > 0.5 and moved_pure < 0.25 * moved_mixed
    assert learned_mixed > 3 * learned_pure > 0


# -- bad input, divergence, global state -----------------------------------------------------------
def test_an_absent_tpu_is_refused_before_any_work(tmp_path, tiny):
    # an absent GPU ("cuda", "gpu"), in every framework: test_runners.py
    try:
        if jax.devices("tpu"):
            pytest.skip("this machine has a tpu")
    except RuntimeError:
        pass
    out = tmp_path / "run.jsonl"
    device = "tpu"
    with pytest.raises(ValueError, match=f"device '{device}' was requested"):
        run(tiny(device=device, out=str(out)))
    assert not out.exists()


def test_a_divergence_stops_the_run_and_names_the_first_nonfinite_parameter(tiny):
    res = run(tiny(optimizer="sgd", lr=1e38, clip_norm=None, steps=10))
    assert res.status == "diverged" and res.diverged_step == len(res.losses) - 1 < 10
    assert not math.isfinite(res.losses[-1]) and all(math.isfinite(v) for v in res.losses[:-1])
    assert res.diverged_where in models.init_params("mlp", width=32) or res.diverged_where.endswith("(activation)")


def test_nonfinite_layer_finds_a_nan_parameter_then_an_overflowing_activation(stepper_for, batch):
    s = stepper_for()
    assert s.nonfinite_layer() is None
    s.step(*batch, False)
    params = s.flax_params
    dense2 = params["dense2"]
    s.flax_params = {**params, "dense2": {**dense2, "bias": dense2["bias"].at[3].set(jnp.nan)}}
    assert s.nonfinite_layer() == "dense2/bias"
    s.flax_params = {**params, "dense2": {**dense2, "kernel": jnp.full_like(dense2["kernel"], 3e38)}}
    assert s.nonfinite_layer() == "dense2 (activation)"


def test_memory_reads_the_compiled_step_once_there_is_one(stepper_for, batch):
    # the weights and Adam's mu, nu and int32 count in fp32 and pure bf16: test_runners.py
    for precision in ("fp32", "bf16-pure"):
        s = stepper_for(precision=precision)
        assert set(s.memory().to_dict()) == {"parameter_bytes", "optimizer_state_bytes"}  # nothing compiled yet
        s.step(*batch, False)
        mem = s.memory().to_dict()
        assert mem["step_argument_bytes"] >= mem["parameter_bytes"] + mem["optimizer_state_bytes"] + batch[0].nbytes
        assert mem["step_temp_bytes"] > 0


def test_evaluate_is_the_accuracy_of_the_reference_models_predictions(stepper_for, digits):
    s = stepper_for()
    ref = models.reference_logits("mlp", models.init_params("mlp", width=32), digits.x_test).argmax(-1)
    assert s.evaluate(digits.x_test, digits.y_test) == pytest.approx(np.mean(ref == digits.y_test))
    assert s.evaluate(digits.x_test, ref) == 1.0


def test_runs_leave_jax_global_settings_as_they_were(tiny):
    keys = ("jax_default_matmul_precision", "jax_enable_x64", "jax_numpy_dtype_promotion", "jax_default_device")
    before = {k: getattr(jax.config, k) for k in keys}
    for precision in ("fp32", "tf32"):
        run(tiny(precision=precision, steps=2))
        assert {k: getattr(jax.config, k) for k in keys} == before
    with jax.default_matmul_precision("bfloat16"):  # the learner's own setting survives a run
        run(tiny(precision="fp32", steps=2))
        assert jax.config.jax_default_matmul_precision == "bfloat16"
    assert jax.config.jax_enable_x64 is False


def test_the_device_description_names_the_platform_and_the_jax_version(stepper_for):
    s = stepper_for(device="cpu")
    assert s.device.startswith("cpu (") and f"jax {jax.__version__}" in s.device
