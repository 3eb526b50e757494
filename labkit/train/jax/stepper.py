"""JAX/Flax runs: Flax ``dtype``/``param_dtype``, optax, and jmp's dynamic loss scaling.

In JAX nothing about mixed precision is automatic; each piece is explicit, and one jitted
``train_step`` holds them all::

    scaled, loss = loss_scale.scale(cross_entropy(logits.astype(float32))), loss
    grads   = jax.grad(scaled)(params)             # w.r.t. params: float32 if they are
    grads   = loss_scale.unscale(grads)            # jmp: multiply by 1 / scale
    finite  = jmp.all_finite(grads)
    loss_scale = loss_scale.adjust(finite)         # halve on inf/NaN, double every 2000
    updates = optax.chain(clip_by_global_norm(c), adam(lr)).update(grads)   # unscaled
    params, opt_state = jmp.select_tree(finite, (new params, new state), (old, old))

What each precision means here (see `labkit.train.config`):

=============  ==============  ===============  ===================  =====================
precision      Flax ``dtype``  ``param_dtype``  loss scale           matmul precision
=============  ==============  ===============  ===================  =====================
``fp32``       float32         float32          none                 "highest"
``tf32``       float32         float32          none                 "tensorfloat32" (GPU;
                                                                     no effect on a CPU)
``fp16``       float16         float32          jmp.DynamicLossScale "default"
``bf16``       bfloat16        float32          none                 "default"
``bf16-pure``  bfloat16        bfloat16         none (optax state    "default"
                                                in bfloat16 too)
=============  ==============  ===============  ===================  =====================

LayerNorm statistics, the attention softmax and the loss stay in float32 in every mode
(`labkit.train.jax.models`). The matmul precision is set with ``jax.default_matmul_precision``
only while the step is traced and compiled, so no global JAX setting changes.

The step is compiled ahead of time on the first call (``jax.jit(step).lower(...).compile()``):
the first step's time includes the compilation (the loop's median skips it), and the same
compiled object answers ``memory_analysis()`` for `JaxStepper.memory`.

Overflow injection (``inject_overflow``) is a traced boolean argument of the compiled step:
when true, one entry of the *scaled* gradient becomes inf, as a real fp16 overflow would make
it, and the real ``jmp.all_finite`` / ``adjust`` / ``select_tree`` do the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import jmp
import numpy as np
import optax
from flax import traverse_util

from labkit.hardware import detect_cpu
from labkit.train import models
from labkit.train.jax import models as jax_models
from labkit.train.config import RunConfig
from labkit.train.data import Dataset
from labkit.train.loop import StepOut

DEFAULT_LOSS_SCALE = 2.0**15  # jmp has no default; its docstring and seed 000 use 2**15


@dataclass(frozen=True)
class Plan:
    """How one precision is run in JAX: compute dtype, parameter dtype, scaling, matmul precision."""

    dtype: Any
    param_dtype: Any
    loss_scaling: bool
    matmul_precision: str


PLANS = {
    "fp32": Plan(jnp.float32, jnp.float32, False, "highest"),
    "tf32": Plan(jnp.float32, jnp.float32, False, "tensorfloat32"),
    "fp16": Plan(jnp.float16, jnp.float32, True, "default"),
    "bf16": Plan(jnp.bfloat16, jnp.float32, False, "default"),
    "bf16-pure": Plan(jnp.bfloat16, jnp.bfloat16, False, "default"),
}


def select_device(requested: str):
    """The JAX device for a config's ``device``; ValueError if that kind is not present.

    "auto" takes JAX's default backend (TPU, then GPU, then CPU); "cuda" needs an NVIDIA GPU,
    "gpu" any GPU JAX can use, "tpu" a TPU.
    """
    if requested == "auto":
        return jax.devices()[0]
    backend = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}.get(requested)
    if backend is None:
        raise ValueError(f"unknown device {requested!r}; choose one of auto, cpu, cuda, gpu, tpu")
    try:
        devices = jax.devices(backend)
    except RuntimeError:
        devices = []
    if requested == "cuda":  # any GPU but an AMD one (JAX's ROCm build also says "gpu")
        devices = [d for d in devices if "rocm" not in str(getattr(d.client, "platform_version", "")).lower()]
    if not devices:
        present = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise ValueError(f"device {requested!r} was requested but JAX sees no {requested.upper()} here "
                         f"(JAX {jax.__version__} has: {present}); use device='auto' or 'cpu'")
    return devices[0]


def describe_device(device) -> str:
    """E.g. "cpu (Intel(R) Xeon(R) ..., 2 cores, jax 0.10.2)" or "gpu (NVIDIA H100 ..., jax ...)"."""
    versions = f"jax {jax.__version__}"
    if device.platform == "cpu":
        cpu = detect_cpu()
        cores = f"{cpu.cores} core" + ("s" if cpu.cores != 1 else "")
        return f"cpu ({cpu.model}, {cores}, {versions})"
    kind = getattr(device, "device_kind", device.platform)
    cc = getattr(device, "compute_capability", None)
    extra = f", compute capability {cc}" if cc else ""
    return f"{device.platform} ({kind}{extra}, {versions})"


def _compute_capability(device) -> tuple[int, ...]:
    """An NVIDIA GPU's compute capability, e.g. (8, 0); (99,) for any other device."""
    cc = getattr(device, "compute_capability", None) if device.platform == "gpu" else None
    try:
        return tuple(int(part) for part in str(cc).split("."))
    except ValueError:
        return (99,)


def _tree_bytes(tree) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree)))


class JaxStepper:
    """One model, optimizer and loss scale on one JAX device (the shared loop drives it).

    Attributes:
      params: the Flax parameter tree (float32 master weights, or bfloat16 for bf16-pure).
      opt_state: the optax state (its moments have the params' dtype).
      loss_scale: a ``jmp.DynamicLossScale`` for fp16, else ``jmp.NoOpLossScale()``.
      module: the Flax module; plan: the `Plan`; device: a description of the device.
    """

    def __init__(self, config: RunConfig, data: Dataset):
        self.config = config
        self.plan = PLANS[config.precision]
        self._device = select_device(config.device)
        self.device = describe_device(self._device)
        if self.plan.dtype == jnp.bfloat16 and _compute_capability(self._device) < (8, 0):
            self.device += "; bf16 is emulated in float32 below compute capability 8.0"  # XLA runs it, slowly
        self.module = jax_models.build(config.model, config.width, self.plan.dtype, self.plan.param_dtype)
        flat = models.init_params(config.model, seed=config.seed, width=config.width)
        self.params = self._put(jax_models.to_flax(flat, self.plan.param_dtype))
        base = optax.adam(config.lr) if config.optimizer == "adam" else optax.sgd(config.lr)
        # Clipping sees the unscaled gradients: the loss scale is divided out before optax runs.
        self.optimizer = base if config.clip_norm is None else optax.chain(
            optax.clip_by_global_norm(config.clip_norm), base)
        self.opt_state = self._put(self.optimizer.init(self.params))
        if self.plan.loss_scaling:
            scale = DEFAULT_LOSS_SCALE if config.init_scale is None else config.init_scale
            # (loss_scale, counter): DynamicLossScale's pytree leaves, rebuilt inside the step.
            self._scale_state = self._put((np.asarray(scale, np.float32), np.zeros([], np.int32)))
        else:
            self._scale_state = ()
        self._compiled = None
        self._predict = jax.jit(lambda p, x: jnp.argmax(self.module.apply({"params": p}, x), axis=-1))
        self._last_x = None

    @property
    def loss_scale(self):
        """The current jmp loss scale: a ``jmp.DynamicLossScale`` for fp16, else ``NoOpLossScale``."""
        return self._jmp_scale(self._scale_state)

    def _jmp_scale(self, state):
        # The step takes the scale as plain arrays: jmp 0.0.4's DynamicLossScale.__post_init__
        # calls jax.eval_shape on its fields, which fails on the placeholders that
        # jax.jit(f).lower(...) passes through pytrees (jax 0.10). Built here from arrays or
        # tracers, it is the real jmp object.
        if not self.plan.loss_scaling:
            return jmp.NoOpLossScale()
        return jmp.DynamicLossScale(loss_scale=state[0], counter=state[1])

    # -- the step ------------------------------------------------------------------------
    def _put(self, tree):
        return jax.device_put(tree, self._device)

    def loss(self, params, x, y):
        """The mean cross-entropy of a batch, computed in float32 from the model's logits."""
        logits = self.module.apply({"params": params}, x)
        # The loss in float32, whatever the compute dtype (seed 000's advice).
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

    def _train_step(self, params, opt_state, scale_state, x, y, inject):
        loss_scale = self._jmp_scale(scale_state)

        def scaled_loss(p):
            loss = self.loss(p, x, y)
            return loss_scale.scale(loss), loss

        grads, loss = jax.grad(scaled_loss, has_aux=True)(params)
        grads = _inject_inf(grads, inject)  # into the scaled gradient, as a real overflow
        grads = loss_scale.unscale(grads)
        finite = jmp.all_finite(grads)
        grad_norm = optax.tree.norm(jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads))
        updates, new_opt_state = self.optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if self.plan.loss_scaling:  # skip the update on inf/NaN, as jmp's README does
            new_params, new_opt_state = jmp.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
        used = jnp.asarray(loss_scale.loss_scale, jnp.float32)
        new_scale = loss_scale.adjust(finite)
        new_state = (new_scale.loss_scale, new_scale.counter) if self.plan.loss_scaling else ()
        return new_params, new_opt_state, new_state, (loss, grad_norm, used, finite)

    def compile(self, x, y, inject=False):
        """Compile the train step for batches shaped like (x, y) (done by the first `step`)."""
        with jax.default_matmul_precision(self.plan.matmul_precision):
            lowered = jax.jit(self._train_step).lower(*self._args(x, y, inject))
            self._compiled = lowered.compile()
        return self._compiled

    def _args(self, x, y, inject):
        batch = self._put((np.asarray(x, np.float32), np.asarray(y, np.int32), np.bool_(inject)))
        return (self.params, self.opt_state, self._scale_state, *batch)

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        if self._compiled is None:
            self.compile(x, y, inject_overflow)
        self._last_x = x
        self.params, self.opt_state, self._scale_state, stats = self._compiled(*self._args(x, y, inject_overflow))
        loss, grad_norm, scale, finite = jax.device_get(stats)  # waits for the device
        return StepOut(loss=float(loss), grad_norm=float(grad_norm),
                       scale=float(scale) if self.plan.loss_scaling else None,
                       skipped=bool(self.plan.loss_scaling and not finite))

    # -- after the steps ---------------------------------------------------------------
    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        with jax.default_matmul_precision(self.plan.matmul_precision):
            predicted = self._predict(self.params, self._put(np.asarray(x, np.float32)))
        return float(np.mean(np.asarray(predicted) == np.asarray(y)))

    def nonfinite_layer(self) -> str | None:
        """Where a divergence shows first: the first parameter (in `models.init_params`
        order) that is not finite, e.g. "dense2/kernel"; else the first module, in call
        order, whose output on the last batch is not finite, e.g. "block0/attn/qkv
        (activation)"; else None."""
        leaves = dict(jax_models.named_leaves(self.params))
        for name in models.init_params(self.config.model, seed=0, width=self.config.width):
            if not bool(jnp.all(jnp.isfinite(leaves[name]))):
                return name
        if self._last_x is None:
            return None
        with jax.default_matmul_precision(self.plan.matmul_precision):
            _, state = self.module.apply({"params": self.params}, self._put(np.asarray(self._last_x, np.float32)),
                                         capture_intermediates=True, mutable=["intermediates"])
        # flatten_dict keeps insertion order, which is the order the modules returned in.
        for path, outputs in traverse_util.flatten_dict(state["intermediates"]).items():
            if not all(bool(jnp.all(jnp.isfinite(o))) for o in jax.tree_util.tree_leaves(outputs)):
                module = "/".join(path[:-1]) or "logits"
                return f"{module} (activation)"
        return None

    def memory(self) -> dict:
        """Bytes counted from the arrays, the compiled step's own estimate, and device stats."""
        out = {"parameter_bytes": _tree_bytes(self.params), "optimizer_state_bytes": _tree_bytes(self.opt_state)}
        stats = self._compiled.memory_analysis() if self._compiled is not None else None
        if stats is not None:
            for key in ("argument", "output", "alias", "temp", "generated_code"):
                out[f"step_{key}_bytes"] = int(getattr(stats, f"{key}_size_in_bytes"))
        # The device allocator's figures cover the whole process (JAX never resets its peak),
        # so the names say so: they are not this run's alone.
        device_stats = self._device.memory_stats() or {}
        for key in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit"):
            if key in device_stats:
                out[f"process_device_{key}"] = int(device_stats[key])
        return out


def _inject_inf(grads, inject):
    """Set the first entry of the first gradient to inf when the traced bool `inject` is true."""
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    first = leaves[0].reshape(-1)
    first = first.at[0].set(jnp.where(inject, jnp.asarray(jnp.inf, first.dtype), first[0]))
    leaves[0] = first.reshape(leaves[0].shape)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def make_stepper(config: RunConfig, data: Dataset) -> JaxStepper:
    """Build the JAX stepper for `config`; raises ValueError before any work if it cannot run."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "jax":
        raise ValueError(f"the JAX runner runs framework='jax' configs, got framework={config.framework!r}")
    return JaxStepper(config, data)


__all__ = ["DEFAULT_LOSS_SCALE", "PLANS", "JaxStepper", "Plan", "describe_device", "make_stepper", "select_device"]
