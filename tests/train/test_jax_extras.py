"""The teaching helpers of notebook 06, on real JAX, Flax and jmp."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nn = pytest.importorskip("flax.linen")
jmp = pytest.importorskip("jmp")
optax = pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from labkit import scaling  # noqa: E402
from labkit.train.jax import (  # noqa: E402
    HloSummary, SimpleDense, dtype_tree, dtypes_of, hlo_summary, jmp_and_flax_limits, jmp_and_flax_scales,
    jmp_trajectory, jmp_under_jit, named, ops_by_dtype, predict, scaled_gradients)
from labkit.train.lessons import gradient_error  # noqa: E402


def moved(before, after) -> float:
    """The fraction of all entries of two same-shaped trees that differ."""
    pairs = list(zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    return sum(int(np.sum(np.asarray(a) != np.asarray(b))) for a, b in pairs) / sum(np.size(a) for a, _ in pairs)

X = jnp.asarray(np.random.default_rng(0).uniform(0, 1, (32, 64)), jnp.float32)


def dense(dtype=jnp.bfloat16, features=16):
    model = SimpleDense(features=features, dtype=dtype)
    return model, model.init(jax.random.PRNGKey(0), X)["params"]


# -- seed 000's examples ---------------------------------------------------------------------
def test_simple_dense_prints_what_seed_000_expects():
    model = SimpleDense(features=5)
    x = jnp.zeros((1, 10), jnp.bfloat16)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    out = model.apply({"params": params}, x)
    assert (x.dtype, jax.tree.leaves(params)[0].dtype, out.dtype) == (jnp.bfloat16, jnp.float32, jnp.bfloat16)


def test_gradients_wrt_float32_params_are_float32_while_the_backward_pass_runs_in_bfloat16():
    model, params = dense()
    loss = lambda p, x: model.apply({"params": p}, x).astype(jnp.float32).sum()  # noqa: E731
    assert dtype_tree(jax.grad(loss)(params, X)) == {"dense_layer": {"bias": "float32", "kernel": "float32"}}
    assert jax.grad(loss, argnums=1)(params, X.astype(jnp.bfloat16)).dtype == jnp.bfloat16


def test_manual_casting_predict_computes_in_bfloat16_and_differentiates_to_float32():
    layers = [(jnp.ones((64, 8), jnp.float32) * 0.01, jnp.zeros(8, jnp.float32)),
              (jnp.ones((8, 3), jnp.float32) * 0.1, jnp.zeros(3, jnp.float32))]
    out = predict(layers, X.astype(jnp.bfloat16))
    assert out.dtype == jnp.bfloat16 and out.shape == (32, 3)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(X).sum(1, keepdims=True) * 0.008 * np.ones(3),
                               rtol=2e-2)
    grads = jax.grad(lambda p: predict(p, X.astype(jnp.bfloat16)).astype(jnp.float32).sum())(layers)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}


def test_optax_updates_float32_master_params_with_float32_gradients():
    model, params = dense()
    grads = jax.grad(lambda p: model.apply({"params": p}, X).astype(jnp.float32).sum())(params)
    opt = optax.adam(1e-3)
    with jax.numpy_dtype_promotion("standard"):  # optax 0.2.8's Adam: 1 - b1**count, float ** int32
        updates, _ = opt.update(grads, opt.init(params), params)
    new = optax.apply_updates(params, updates)
    assert dtype_tree(new) == dtype_tree(params) == {"dense_layer": {"bias": "float32", "kernel": "float32"}}
    assert moved(params, new) > 0.5


# -- dtypes of the traced operations ----------------------------------------------------------
def test_flax_layernorm_computes_its_statistics_in_float32_unless_told_not_to():
    x = jnp.asarray(8 + np.random.default_rng(1).standard_normal((4, 64)), jnp.bfloat16)
    default = nn.LayerNorm(dtype=jnp.bfloat16)
    low = nn.LayerNorm(dtype=jnp.bfloat16, force_float32_reductions=False)
    with jax.numpy_dtype_promotion("standard"):  # Flax 0.12's LayerNorm calls jnp.promote_types(bf16, f32)
        ops = ops_by_dtype(lambda v: default.apply(default.init(jax.random.PRNGKey(0), v), v), x)
        low_ops = ops_by_dtype(lambda v: low.apply(low.init(jax.random.PRNGKey(0), v), v), x)
    assert ops["bfloat16"] == ["convert_element_type"]  # only the output cast
    assert {"reduce_sum", "square", "sub", "rsqrt"} <= set(ops["float32"])
    assert {"square", "sub", "rsqrt"} <= set(low_ops["bfloat16"])


def test_ops_by_dtype_looks_inside_jit_and_custom_jvp_and_skips_integers():
    f = jax.jit(lambda x: jax.nn.relu(x.astype(jnp.float16)) + jnp.arange(3).sum().astype(jnp.float16))
    assert ops_by_dtype(f, jnp.ones(3, jnp.float32)) == {"float16": ["add", "convert_element_type", "max"]}


# -- loss scaling with the real jmp ------------------------------------------------------------
def tiny_loss(model, weight):
    return lambda p: weight * model.apply({"params": p}, X).astype(jnp.float32).sum()


def test_fp16_gradients_underflow_without_a_scale_and_survive_with_2_to_15():
    model16, params = dense(jnp.float16)
    model32, _ = dense(jnp.float32)
    reference = jax.grad(tiny_loss(model32, 1e-8))(params)
    grads, finite = scaled_gradients(tiny_loss(model16, 1e-8), params, jmp.NoOpLossScale())
    err = gradient_error(named(grads), named(reference))
    assert finite and err.dtype == "float32" and set(err.underflow.values()) == {1.0} and err.max_rel_error == 1.0
    grads, finite = scaled_gradients(tiny_loss(model16, 1e-8), params, jmp.StaticLossScale(jnp.float32(2**15)))
    err = gradient_error(named(grads), named(reference))
    assert finite and set(err.underflow.values()) == {0.0} and err.max_rel_error < 1e-2


def test_the_same_static_scale_overflows_a_larger_loss():
    model16, params = dense(jnp.float16)
    grads, finite = scaled_gradients(tiny_loss(model16, 1.0), params, jmp.StaticLossScale(jnp.float32(2**15)))
    err = gradient_error(named(grads), named(jax.grad(tiny_loss(dense(jnp.float32)[0], 1.0))(params)))
    assert not finite and err.nonfinite > 0 and err.max_rel_error == math.inf


def test_jmp_trajectory_halves_until_the_gradients_fit_as_labkit_scaling_replays_it():
    model16, params = dense(jnp.float16)
    rows = jmp_trajectory(tiny_loss(model16, 1.0), params, jmp.DynamicLossScale(jnp.float32(2**15)), steps=9)
    finite = [r["finite"] for r in rows]
    first = finite.index(True)
    assert first >= 2 and all(finite[first:]) and not any(finite[:first])
    replay = scaling.simulate("jmp", [not f for f in finite], init_scale=2**15)
    assert [r["scale"] for r in rows] == replay.scales.tolist()
    with pytest.raises(ValueError, match="steps"):
        jmp_trajectory(tiny_loss(model16, 1.0), params, jmp.NoOpLossScale(), steps=0)


def test_jmp_and_flax_halve_alike_but_flax_grows_one_finite_step_later():
    overflows = [False] * 5 + [True] + [False] * 4
    rows = jmp_and_flax_scales(overflows, init_scale=8, period=2)
    assert [r["overflow"] for r in rows] == overflows
    replay = scaling.simulate("jmp", overflows, init_scale=8, growth_interval=2)
    assert [r["jmp"] for r in rows] == replay.scales.tolist()
    assert [r["jmp"] for r in rows] == [8, 8, 16, 16, 32, 32, 16, 16, 32, 32]
    assert [r["flax"] for r in rows] == [8, 8, 8, 16, 16, 16, 8, 8, 8, 16]
    with pytest.raises(ValueError, match="period"):
        jmp_and_flax_scales([False], period=0)


def test_jmp_stops_at_1_and_below_inf_while_flax_stops_at_float32_tiny_and_max():
    limits = jmp_and_flax_limits()
    f32 = np.finfo(np.float32)
    assert limits["floor"] == {"jmp": 1.0, "flax": float(f32.tiny)}
    assert limits["ceiling"] == {"jmp": 2.0**127, "flax": float(f32.max)}
    with pytest.raises(ValueError, match="steps"):
        jmp_and_flax_limits(10)


def test_jmp_under_jit_drops_a_custom_floor_and_cannot_be_lowered_as_an_argument():
    trap = jmp_under_jit(256.0)
    assert trap.eager_scale == 256.0  # eagerly the floor holds
    assert trap.jit_scale == 128.0 and trap.jit_min_loss_scale == 1.0  # under jit it is the default 1
    assert trap.lower_error.startswith("TypeError:") and "ArgInfo" in trap.lower_error
    assert "/" not in trap.lower_error  # no install path
    with pytest.raises(ValueError, match="min_loss_scale"):
        jmp_under_jit(1.0)


def test_dtypes_of_names_every_leaf_with_its_dtype():
    _, params = dense()
    table = dtypes_of(params)
    assert table.columns == ("name", "dtype")
    assert table.rows == (("dense_layer/bias", "float32"), ("dense_layer/kernel", "float32"))


def test_a_bf16_weight_does_not_move_under_an_update_below_half_an_ulp():
    w32, w16 = jnp.float32(1.0), jnp.bfloat16(1.0)
    assert moved(w32, w32 + 1e-3) == 1.0 and moved(w16, w16 + jnp.bfloat16(1e-3)) == 0.0


# -- compiled HLO ----------------------------------------------------------------------------------
HANDMADE = """
%fused (param_0: f32[4,4], param_1: f32[4,4]) -> f32[4,4] {
  %param_0 = f32[4,4]{1,0} parameter(0)
  %param_1 = f32[4,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
ENTRY %main (a: bf16[4,4], b: bf16[4,4]) -> bf16[4,4] {
  %a = bf16[4,4]{1,0} parameter(0)
  %b = bf16[4,4]{1,0} parameter(1)
  %c.1 = f32[4,4]{1,0} convert(%a)
  %c.2 = f32[4,4]{1,0} convert(bf16[4,4]{1,0} %b)
  %d = bf16[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %g = (bf16[4,4]{1,0}, s8[64]{0}) custom-call(bf16[4,4]{1,0} %a, bf16[4,4]{1,0} %b), custom_call_target="__cublas$gemm"
  %t = f32[4,4]{1,0} custom-call(%c.1), custom_call_target="SomethingElse"
  ROOT %c.3 = bf16[4,4]{1,0} convert(%c.1)
}
"""


def test_hlo_summary_reads_dots_and_converts_from_hlo_text():
    s = hlo_summary(HANDMADE)
    assert s.dots == {"f32 x f32 -> f32": 1, "bf16 x bf16 -> bf16": 1, "bf16 x bf16 -> bf16 (__cublas$gemm)": 1}
    assert s.converts == {"bf16->f32": 2, "f32->bf16": 1}
    assert str(HloSummary()) == "dots: none; converts: none"
    with pytest.raises(TypeError, match="as_text"):
        hlo_summary(jax.jit(jnp.sin).lower(1.0).compile())


def test_hlo_summary_of_a_real_float32_dot_has_no_converts():
    a = jnp.ones((16, 16), jnp.float32)
    s = hlo_summary(jax.jit(jnp.dot).lower(a, a).compile().as_text())
    assert s.dots == {"f32 x f32 -> f32": 1} and not s.converts


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a fact about XLA:CPU")
def test_xla_cpu_runs_a_bfloat16_dot_as_a_float32_dot_between_converts():
    a = jnp.ones((16, 16), jnp.bfloat16)
    s = hlo_summary(jax.jit(jnp.dot).lower(a, a).compile().as_text())
    assert s.dots == {"f32 x f32 -> f32": 1} and s.converts == {"bf16->f32": 2, "f32->bf16": 1}
