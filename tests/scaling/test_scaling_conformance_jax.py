"""labkit's "jmp" and "optax" presets against the real jmp and optax packages."""

import numpy as np
import pytest

from labkit import scaling

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jmp = pytest.importorskip("jmp")
optax = pytest.importorskip("optax")


def standard_promotion():
    """jmp's own adjust multiplies an int32 counter by a bool (``counter * grads_finite``), which the
    suite's strict dtype promotion (the root conftest) refuses: run the real library as its users do."""
    return jax.numpy_dtype_promotion("standard")


def _body(state, finite):
    return state.adjust(finite), (state.loss_scale, state.counter)


_scan = jax.jit(lambda state, finite: jax.lax.scan(_body, state, finite))


def run_jmp_scan(flags, loss_scale, **kwargs):
    """The whole sequence in one jitted lax.scan (how a JAX training loop carries jmp)."""
    state = jmp.DynamicLossScale(jnp.float32(loss_scale), **kwargs)
    with standard_promotion():
        final, (scales, counters) = _scan(state, jnp.asarray(~np.asarray(flags)))
    # jmp's counter after each step is the next step's counter
    after = np.append(np.asarray(counters)[1:], int(final.counter))
    return np.asarray(scales, np.float64), after, float(final.loss_scale)


def run_jmp_eager(flags, loss_scale, **kwargs):
    state = jmp.DynamicLossScale(jnp.float32(loss_scale), **kwargs)
    scales, counters = [], []
    for overflow in flags:
        scales.append(float(state.loss_scale))
        with standard_promotion():
            state = state.adjust(jnp.asarray(not overflow))
        counters.append(int(state.counter))
    return np.array(scales), np.array(counters), float(state.loss_scale)


def test_jmp_preset_matches_dynamic_loss_scale_in_a_jitted_scan():
    rng = np.random.default_rng(2)
    for _ in range(25):
        kwargs = dict(period=int(rng.integers(1, 7)), factor=int(rng.choice([2, 3])))
        init = float(rng.choice([2.0**15, 5.0, 2.0**120]))
        flags = rng.random(64) < rng.choice([0.05, 0.3, 0.6])
        ours = scaling.simulate("jmp", flags, init_scale=init, under_jit=True, **kwargs)
        scales, counters, final = run_jmp_scan(flags, init, **kwargs)
        np.testing.assert_array_equal(ours.scales, scales)
        np.testing.assert_array_equal(ours.counter, counters)
        assert ours.final_scale == final
        np.testing.assert_array_equal(ours.applied, ~np.asarray(flags))  # jmp.select_tree(grads_finite, ...)


def test_jmp_preset_matches_dynamic_loss_scale_eagerly():
    rng = np.random.default_rng(4)
    for _ in range(3):
        kwargs = dict(period=int(rng.integers(1, 4)), factor=3, min_loss_scale=jnp.float32(0.5))
        flags = rng.random(30) < 0.5
        ours = scaling.simulate("jmp", flags, init_scale=5.0, period=kwargs["period"], factor=3, min_loss_scale=0.5)
        scales, counters, final = run_jmp_eager(flags, 5.0, **kwargs)
        np.testing.assert_array_equal(ours.scales, scales)
        np.testing.assert_array_equal(ours.counter, counters)
        assert ours.final_scale == final


def test_jmp_keeps_a_custom_floor_eagerly_but_drops_it_under_jit():
    flags = [True] * 5
    floor = jnp.float32(4.0)
    eager = scaling.simulate("jmp", flags, init_scale=32.0, min_loss_scale=4.0)
    np.testing.assert_array_equal(eager.scales, run_jmp_eager(flags, 32.0, min_loss_scale=floor)[0])
    jitted = scaling.simulate("jmp", flags, init_scale=32.0, min_loss_scale=4.0, under_jit=True)
    np.testing.assert_array_equal(jitted.scales, run_jmp_scan(flags, 32.0, min_loss_scale=floor)[0])
    assert eager.final_scale == 4.0 and jitted.final_scale == 1.0


def test_jmp_refuses_to_grow_into_inf():
    ours = scaling.simulate("jmp", [False] * 3, init_scale=2.0**126, period=1)
    scales, _, final = run_jmp_eager([False] * 3, 2.0**126, period=1)
    np.testing.assert_array_equal(ours.scales, scales)
    assert ours.final_scale == final == 2.0**127


def run_optax(flags, max_consecutive_errors):
    tx = optax.apply_if_finite(optax.sgd(1.0), max_consecutive_errors)
    params = jnp.zeros(1)
    state = tx.init(params)
    update = jax.jit(tx.update)
    applied, counts, totals = [], [], []
    for overflow in flags:
        updates, state = update(jnp.full(1, jnp.inf if overflow else 1.0), state, params)
        applied.append(bool(updates[0] != 0))
        counts.append(int(state.notfinite_count))
        totals.append(int(state.total_notfinite))
    return np.array(applied), np.array(counts), np.array(totals)


def test_optax_preset_matches_apply_if_finite():
    rng = np.random.default_rng(3)
    for _ in range(8):
        m = int(rng.integers(0, 4))
        flags = rng.random(40) < rng.choice([0.2, 0.5, 0.8])
        ours = scaling.simulate("optax", flags, max_consecutive_errors=m)
        applied, counts, totals = run_optax(flags, m)
        np.testing.assert_array_equal(ours.applied, applied)
        np.testing.assert_array_equal(ours.notfinite_count, counts)
        np.testing.assert_array_equal(ours.total_notfinite, totals)


def test_optax_gives_up_and_applies_the_nonfinite_update():
    ours = scaling.simulate("optax", [True] * 4, max_consecutive_errors=2)
    assert ours.applied.tolist() == [False, False, True, True]
    assert ours.poisoned.sum() == 2


def test_jmp_preset_defaults_are_jmps_defaults():
    real = jmp.DynamicLossScale(jnp.float32(1.0))
    defaults = scaling.PRESETS["jmp"].defaults
    assert (defaults["period"], defaults["factor"], defaults["min_loss_scale"]) == (
        real.period, real.factor, float(real.min_loss_scale))
