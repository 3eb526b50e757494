"""Teaching helpers for the JAX/Flax notebook (06): seed 000's claims, run and checked.

Seed 000's own code is in `labkit.train.jax.seeds`; the compiled-HLO reading in
`labkit.train.jax.hlo`; the lessons every framework shares (``moved_fraction``,
``gradient_error``) in `labkit.train.lessons`.

* `dtypes_of` (a table), `dtype_tree` (the tree itself), `ops_by_dtype`: which dtype each
  parameter has, and in which dtype each traced operation computes (from ``jax.make_jaxpr``).
* `scaled_gradients`: gradients through fp16 with a *real* jmp loss scale, unscaled, and
  whether they are finite (compare them with float32 gradients by
  ``labkit.train.lessons.gradient_error(models.named(grads), models.named(reference))``).
* `jmp_and_flax_scales`: jmp's and Flax's own dynamic loss scales on one overflow pattern;
  `jmp_and_flax_limits`: where each stops (floor, ceiling); `jmp_under_jit`: jmp's traps under jit.

>>> import jax.numpy as jnp
>>> dtype_tree({"dense_layer": {"bias": jnp.zeros(5), "kernel": jnp.zeros((10, 5))}})
{'dense_layer': {'bias': 'float32', 'kernel': 'float32'}}"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import jmp

from labkit._validate import integer, number
from labkit.table import Table
from labkit.train.jax.models import named_leaves


# -- dtypes --------------------------------------------------------------------------------
def dtypes_of(tree) -> Table:
    """Which dtype each leaf of a parameter (or gradient, or optimizer-state) tree holds: a table
    of name ("dense_layer/kernel") and dtype, in the tree's order. `dtype_tree` keeps the tree.

    >>> print(dtypes_of({"dense": {"bias": jnp.zeros(2), "kernel": jnp.zeros((2, 2), jnp.bfloat16)}}))
    name          dtype
    ------------  --------
    dense/bias    float32
    dense/kernel  bfloat16
    """
    return Table(("name", "dtype"), tuple((name, str(jnp.asarray(leaf).dtype)) for name, leaf in named_leaves(tree)))


def dtype_tree(tree):
    """The same tree with each array replaced by its dtype's name (`dtypes_of` as a table)."""
    return jax.tree_util.tree_map(lambda a: str(jnp.asarray(a).dtype), tree)


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


_STRUCTURE = {"pjit", "jit", "custom_jvp_call", "custom_vjp_call", "closed_call", "remat", "checkpoint"}


def ops_by_dtype(fn: Callable, *args) -> dict[str, list[str]]:
    """Trace ``fn(*args)`` and group its float operations by the dtype they compute in.

    Returns {dtype name: sorted names of the primitives producing that dtype}; a
    ``convert_element_type`` is listed under the dtype it converts *to*. Only floating
    outputs count (integer index arithmetic is left out), and the wrappers that only
    structure a jaxpr (pjit, custom_jvp_call) are skipped in favour of what they contain.
    """
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    found: dict[str, set] = {}
    for eqn in _equations(jaxpr):
        if eqn.primitive.name in _STRUCTURE:
            continue
        for var in eqn.outvars:
            dtype = getattr(var.aval, "dtype", None)
            if dtype is not None and jnp.issubdtype(dtype, jnp.floating):
                found.setdefault(str(dtype), set()).add(eqn.primitive.name)
    return {k: sorted(v) for k, v in sorted(found.items())}


# -- loss scaling --------------------------------------------------------------------------
def scaled_gradients(loss_fn: Callable, params, loss_scale) -> tuple[Any, bool]:
    """Gradients of ``loss_fn(params)`` with a jmp loss scale, as seed 000's four steps say.

    1. scale the loss (``loss_scale.scale``), 2. differentiate, 3. unscale the gradients
    (``loss_scale.unscale``); then check them with ``jmp.all_finite``. Returns
    ``(grads, finite)``; step 4, the update, is the caller's (skip it when not finite).
    ``loss_scale`` is any jmp scale: ``jmp.NoOpLossScale()``, ``jmp.StaticLossScale(S)``,
    ``jmp.DynamicLossScale(S)``.
    """
    grads = jax.grad(lambda p: loss_scale.scale(loss_fn(p)))(params)
    grads = loss_scale.unscale(grads)
    return grads, bool(jmp.all_finite(grads))


def adjust(loss_scale, finite):
    """``loss_scale.adjust(finite)`` of a jmp scale, under JAX's standard dtype promotion: jmp
    0.0.4's ``DynamicLossScale.adjust`` multiplies its int32 counter by the bool `finite`, which
    ``jax_numpy_dtype_promotion="strict"`` refuses."""
    with jax.numpy_dtype_promotion("standard"):
        return loss_scale.adjust(finite)


def jmp_trajectory(loss_fn: Callable, params, loss_scale, steps: int) -> list[dict]:
    """Repeat `scaled_gradients` on the same loss, adjusting a real jmp scale after each.

    Each row: step, the scale used, whether the gradients were finite, and so whether the
    update would be applied (``jmp.select_tree(finite, new, old)``). With a
    ``jmp.DynamicLossScale`` that starts too high this shows it halving until the
    gradients fit in float16.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    rows = []
    for i in range(steps):
        _, finite = scaled_gradients(loss_fn, params, loss_scale)
        rows.append({"step": i, "scale": float(loss_scale.loss_scale), "finite": finite, "applied": finite})
        loss_scale = adjust(loss_scale, jnp.asarray(finite))
    return rows


def jmp_and_flax_scales(overflows, init_scale: float = 2.0**15, period: int = 2000) -> list[dict]:
    """Replay an overflow pattern through jmp's and Flax's dynamic loss scales, side by side.

    Both are the real objects: ``jmp.DynamicLossScale(init_scale, period=period)`` adjusted
    with each step's finiteness, and ``flax.training.dynamic_scale.DynamicScale(scale=init_scale,
    growth_interval=period)`` whose ``value_and_grad`` differentiates a function that yields an
    inf gradient on the steps marked True. Each row: step, overflow, and the scale each used.

    Both halve on an overflow and reset their count; they differ in when they grow: jmp
    doubles after ``period`` finite steps in a row, Flax after ``period + 1`` (it grows when
    its count of finite steps *equals* ``growth_interval``, then resets it).
    """
    from flax.training.dynamic_scale import DynamicScale

    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError(f"period must be a whole number >= 1, got {period!r}")
    flags = [bool(o) for o in overflows]
    jmp_scale = jmp.DynamicLossScale(jnp.float32(init_scale), period=period)
    flax_scale = DynamicScale(growth_interval=period, scale=float(init_scale))
    grad_fn = jax.jit(lambda ds, bad: ds.value_and_grad(lambda p: p * jnp.where(bad, jnp.inf, 1.0))(
        jnp.float32(1)))
    rows = []
    for step, bad in enumerate(flags):
        rows.append({"step": step, "overflow": bad,
                     "jmp": float(jmp_scale.loss_scale), "flax": float(flax_scale.scale)})
        flax_scale, finite, _, _ = grad_fn(flax_scale, jnp.asarray(bad))
        jmp_scale = adjust(jmp_scale, jnp.asarray(not bad))
        if bool(finite) == bad:  # the premise of the replay: Flax sees exactly the marked overflows
            raise RuntimeError(f"step {step}: Flax's DynamicScale saw finite={bool(finite)} for overflow={bad}")
    return rows


def jmp_and_flax_limits(steps: int = 200) -> dict[str, dict[str, float]]:
    """Where the two real scalers stop, at the bottom and at the top (`jmp_and_flax_scales`,
    ``period=1``): `steps` overflows in a row from a scale of 4, and a few finite steps from
    2**127, the largest float32 power of two.

    * floor -- jmp's ``max(min_loss_scale, scale / factor)`` stops at ``min_loss_scale = 1``;
      Flax's ``maximum(scale * backoff_factor, minimum_scale)`` at its default
      ``minimum_scale = jnp.finfo(jnp.float32).tiny`` (1.18e-38)
      (flax/training/dynamic_scale.py: the ``minimum_scale`` field and ``inf_scale``);
    * ceiling -- jmp refuses a growth that is not finite (``first_finite``) and stays at 2**127;
      Flax grows to ``jnp.minimum(scale * growth_factor, jnp.finfo(jnp.float32).max)``:
      3.4028235e38, which is not a power of two.

    Returns ``{"floor": {"jmp": .., "flax": ..}, "ceiling": {"jmp": .., "flax": ..}}``.
    """
    steps = integer("steps (overflows in a row: 130 reach float32's tiny from 4)", steps, minimum=130, maximum=10_000)
    down = jmp_and_flax_scales([True] * steps, init_scale=4.0, period=1)[-1]
    up = jmp_and_flax_scales([False] * 4, init_scale=2.0**127, period=1)[-1]
    return {"floor": {"jmp": down["jmp"], "flax": down["flax"]},
            "ceiling": {"jmp": up["jmp"], "flax": up["flax"]}}


class JmpJitTrap(NamedTuple):
    """What `jmp_under_jit` found: the scale after one overflow at the floor, eagerly and under
    ``jax.jit``; the ``min_loss_scale`` the jitted function saw; and the error that
    ``jax.jit(f).lower(scale)`` raises (``None`` if it lowers)."""

    eager_scale: float
    jit_scale: float
    jit_min_loss_scale: float
    lower_error: str | None


def jmp_under_jit(min_loss_scale: float = 256.0) -> JmpJitTrap:
    """Two traps of the real ``jmp.DynamicLossScale`` (jmp 0.0.4) passed to ``jax.jit`` as an argument.

    1. ``tree_flatten`` keeps ``(loss_scale, counter)`` as data and ``(period, factor)`` as
       metadata, and ``tree_unflatten`` rebuilds it from those alone: inside the jitted function
       ``min_loss_scale`` is the default 1, so a scale sitting at a custom floor halves below it.
    2. ``__post_init__`` calls ``warn_if_not_floating``, i.e. ``jax.eval_shape`` on each field;
       ``jax.jit(f).lower(...)`` unflattens its argument pytrees with placeholders that are not
       arrays (``jax._src.stages.ArgInfo`` in jax 0.10), so lowering fails with a TypeError.
       (labkit's jax runner passes the scale as plain arrays and builds the jmp object inside.)
    """
    floor = number("min_loss_scale (above 1, the default it falls back to)", min_loss_scale, minimum=1.0,
                   maximum=2.0**126, inclusive=False)
    scale = jmp.DynamicLossScale(jnp.float32(floor), min_loss_scale=jnp.float32(floor))

    def overflow(ls):
        return adjust(ls, jnp.asarray(False))

    eager = overflow(scale)
    jitted = jax.jit(overflow)(scale)
    try:
        jax.jit(overflow).lower(scale)
        error = None
    except TypeError as exc:
        first = re.sub(r" at \S+:\d+", "", str(exc).splitlines()[0])  # no install path in the message
        error = f"{type(exc).__name__}: {first}"
    return JmpJitTrap(float(eager.loss_scale), float(jitted.loss_scale), float(jitted.min_loss_scale), error)


__all__ = ["JmpJitTrap", "adjust", "dtype_tree", "dtypes_of", "jmp_and_flax_limits", "jmp_and_flax_scales", "jmp_trajectory",
           "jmp_under_jit", "ops_by_dtype", "scaled_gradients"]
