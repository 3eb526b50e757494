"""Teaching helpers for the JAX/Flax notebook (06): seed 000's code, runnable and checked.

* `SimpleDense` and `predict` are seed 000's two examples (a Flax module with
  ``param_dtype``/``dtype``; manual casting without a library), kept as the seed wrote them
  but with its comments corrected: a gradient taken w.r.t. float32 parameters is float32.
* `dtype_tree`, `ops_by_dtype`: which dtype each parameter has, and in which dtype each
  traced operation computes (from ``jax.make_jaxpr``).
* `scaled_gradients`: gradients through fp16 with a *real* jmp loss scale, unscaled, and
  whether they are finite; `gradient_error` compares them with float32 gradients.
* `jmp_and_flax_scales`: jmp's and Flax's own dynamic loss scales on one overflow pattern;
  `jmp_and_flax_limits`: where each stops (floor, ceiling); `jmp_under_jit`: jmp's traps under jit.
* `moved_fraction`: how much of a parameter tree an update really changed (the stalled
  updates of pure bf16).
* `hlo_summary`: the dots and converts in XLA's *compiled* HLO -- what really runs.

>>> import jax, jax.numpy as jnp
>>> model = SimpleDense(features=5)
>>> params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 10), jnp.bfloat16))["params"]
>>> dtype_tree(params)
{'dense_layer': {'bias': 'float32', 'kernel': 'float32'}}
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import jmp
import numpy as np

from labkit._validate import integer, number


# -- seed 000, as written (comments corrected) ----------------------------------------------
class SimpleDense(nn.Module):
    """Seed 000's module: float32 parameters (``param_dtype``), bfloat16 compute (``dtype``).

    ``nn.Dense(dtype=bfloat16)`` casts the input, the float32 kernel and the bias to bfloat16
    before the matmul, so the output is bfloat16 while the stored parameters stay float32.
    """

    features: int
    param_dtype: Any = jnp.float32  # master weights in float32
    dtype: Any = jnp.bfloat16  # computation in bfloat16

    @nn.compact
    def __call__(self, x):
        x = x.astype(self.dtype)  # the input is cast to the compute dtype
        y = nn.Dense(features=self.features, param_dtype=self.param_dtype, dtype=self.dtype,
                     name="dense_layer")(x)  # float32 kernel, bfloat16 matmul and result
        return nn.relu(y)  # still bfloat16


def predict(params_f32, inputs_bf16):
    """Seed 000's manual casting: a list of float32 (W, b) layers, computed in bfloat16.

    Gradients of a loss of this function w.r.t. ``params_f32`` are float32: the backward
    pass of ``astype(bfloat16)`` casts the cotangent back to the parameter's dtype.
    """
    activations = inputs_bf16
    for w_f32, b_f32 in params_f32:
        w_bf16 = w_f32.astype(jnp.bfloat16)  # cast the weights for the computation
        b_bf16 = b_f32.astype(jnp.bfloat16)
        outputs = jnp.dot(activations, w_bf16) + b_bf16  # bfloat16 matmul
        activations = jax.nn.relu(outputs)
    return activations  # bfloat16


# -- dtypes --------------------------------------------------------------------------------
def dtype_tree(tree):
    """The same tree with each array replaced by its dtype's name."""
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


@dataclass(frozen=True)
class GradientError:
    """How a low-precision gradient compares with a float32 reference, over all entries.

    underflow: the fraction of entries nonzero in the reference that came out exactly zero;
    nonfinite: the fraction of entries that are inf or NaN;
    max_rel_error: the largest |g - ref| / |ref| over entries nonzero in the reference.
    """

    dtype: str
    underflow: float
    nonfinite: float
    max_rel_error: float


def gradient_error(grads, reference) -> GradientError:
    """Compare gradient tree `grads` with `reference` (same structure), entry by entry."""
    g = np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree_util.tree_leaves(grads)])
    r = np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree_util.tree_leaves(reference)])
    if g.shape != r.shape:
        raise ValueError(f"grads and reference differ in size: {g.size} vs {r.size} entries")
    nonzero = r != 0
    with np.errstate(invalid="ignore", over="ignore"):
        rel = np.abs(g[nonzero] - r[nonzero]) / np.abs(r[nonzero])
    rel = np.where(np.isnan(rel), np.inf, rel)
    dtypes = sorted({str(jnp.asarray(a).dtype) for a in jax.tree_util.tree_leaves(grads)})
    return GradientError(
        dtype="/".join(dtypes),
        underflow=float(np.mean(g[nonzero] == 0)) if nonzero.any() else 0.0,
        nonfinite=float(np.mean(~np.isfinite(g))),
        max_rel_error=float(rel.max()) if rel.size else 0.0,
    )


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
        loss_scale = loss_scale.adjust(jnp.asarray(finite))
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
        jmp_scale = jmp_scale.adjust(jnp.asarray(not bad))
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
        return ls.adjust(jnp.asarray(False))

    eager = overflow(scale)
    jitted = jax.jit(overflow)(scale)
    try:
        jax.jit(overflow).lower(scale)
        error = None
    except TypeError as exc:
        first = re.sub(r" at \S+:\d+", "", str(exc).splitlines()[0])  # no install path in the message
        error = f"{type(exc).__name__}: {first}"
    return JmpJitTrap(float(eager.loss_scale), float(jitted.loss_scale), float(jitted.min_loss_scale), error)


# -- pure bf16 -------------------------------------------------------------------------------
def moved_fraction(before, after) -> float:
    """The fraction of parameter entries that an update changed at all (0.0 .. 1.0)."""
    b = jax.tree_util.tree_leaves(before)
    a = jax.tree_util.tree_leaves(after)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError("before and after must be parameter trees of the same structure and shapes")
    changed = sum(int(np.sum(np.asarray(x) != np.asarray(y))) for x, y in zip(a, b))
    total = sum(int(np.size(x)) for x in b)
    return changed / total if total else 0.0


# -- compiled HLO ----------------------------------------------------------------------------
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\([^=]*?\)|\S+)\s+"
                    r"(?P<op>[\w\-]+)\((?P<rest>.*)$")
_ELEMENT = re.compile(r"\(?\s*(\w+)\[")  # f32[64,64]{1,0} -> f32; (bf16[..], s8[..]) -> bf16
_LIBRARY_MATMUL = re.compile(r"gemm|matmul|dot", re.IGNORECASE)


@dataclass(frozen=True)
class HloSummary:
    """The matrix multiplies and dtype conversions in an optimised (compiled) HLO module.

    dots: Counter of "lhs x rhs -> result" element types of every ``dot``, e.g.
      {"f32 x f32 -> f32": 8}; a matmul the backend hands to a library (a ``custom-call``
      such as GPU's ``__cublas$gemm``) is listed with its target in brackets.
    converts: Counter of "from->to", e.g. {"bf16->f32": 40}.
    """

    dots: Counter = field(default_factory=Counter)
    converts: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        dots = ", ".join(f"{n} x ({k})" for k, n in sorted(self.dots.items())) or "none"
        conv = ", ".join(f"{n} x {k}" for k, n in sorted(self.converts.items())) or "none"
        return f"dots: {dots}; converts: {conv}"


def hlo_summary(hlo_text: str) -> HloSummary:
    """Read the dots and converts out of ``compiled.as_text()`` (optimised HLO text).

    Use the *compiled* text (``jax.jit(f).lower(*args).compile().as_text()``), not the
    lowered StableHLO: only the compiled module shows what the backend does with a bf16
    dot (on XLA:CPU it converts both operands to f32, multiplies in f32, converts back).
    """
    if not isinstance(hlo_text, str):
        raise TypeError(f"hlo_summary takes HLO text (compiled.as_text()), got {type(hlo_text).__name__}")
    types: dict[str, str] = {}
    ops = []
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        element = _ELEMENT.match(m["type"]) if m else None
        if element:
            types[m["name"]] = element.group(1)
            operands = re.findall(r"%([\w.\-]+)", m["rest"].split(")", 1)[0])
            target = re.search(r'custom_call_target="([^"]+)"', m["rest"])
            ops.append((element.group(1), m["op"], operands, target.group(1) if target else ""))
    dots, converts = Counter(), Counter()
    for etype, opcode, operands, target in ops:
        library = opcode == "custom-call" and _LIBRARY_MATMUL.search(target)
        if (opcode == "dot" or library) and len(operands) >= 2:
            lhs, rhs = (types.get(o, "?") for o in operands[:2])
            dots[f"{lhs} x {rhs} -> {etype}" + (f" ({target})" if library else "")] += 1
        elif opcode == "convert" and operands:
            converts[f"{types.get(operands[0], '?')}->{etype}"] += 1
    return HloSummary(dots, converts)


__all__ = ["GradientError", "HloSummary", "JmpJitTrap", "SimpleDense", "dtype_tree", "gradient_error", "hlo_summary",
           "jmp_and_flax_limits", "jmp_and_flax_scales", "jmp_trajectory", "jmp_under_jit", "moved_fraction",
           "ops_by_dtype", "predict", "scaled_gradients"]
