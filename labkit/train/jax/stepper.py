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

Across devices the step is the same code with a ``jax.sharding.Mesh`` (`labkit.train.jax.devices`)::

    x, y : NamedSharding(mesh, P("data"))            # each device gets batch_size / N rows
    "dp":   params, optimizer state: P()             # replicated on every device
    "fsdp": params, optimizer state: P(.., "data")   # each leaf split along its largest
                                                     # dimension divisible by N (else replicated)
    per device (shard_map):
        full  = all_gather(param shards)             # fsdp only: f32 master weights gathered
        g     = grad(loss_scale.scale(local loss))(full)     # bf16 compute, f32 gradients
        g     = g.astype(reduce_dtype)               # the dtype the collective moves
        g     = pmean(g) (dp)  |  psum_scatter(g) / N (fsdp)     # all-reduce | reduce-scatter
    outside (GSPMD, global view): unscale, jmp.all_finite, clip, optax update, select_tree

The finite check is global: an inf on one device enters the reduction, so the reduced
gradient is inf wherever that entry lives; for fsdp, where each device holds only a shard,
``jmp.all_finite`` over the global array makes XLA add an all-reduce of the ``pred`` flag.
Every device then skips the step together, as torch's GradScaler does by all-reducing
``found_inf``.
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from labkit.memory.report import STEP_KINDS, MemoryReport
from labkit.train import models
from labkit.train.jax import models as jax_models
from labkit.train.jax.hlo import collectives, total_bytes
from labkit.train.jax.devices import (AXIS, REDUCE_NAMES, compute_capability, describe_device, make_mesh,
                                      partition_spec, reduce_name, select_device)
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


def _tree_bytes(tree) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree)))


class JaxStepper:
    """One model, optimizer and loss scale on one JAX device, or on a mesh (the shared loop drives it).

    Attributes:
      flax_params: the Flax parameter tree (float32 master weights, or bfloat16 for bf16-pure);
        `params` gives it as numpy arrays under labkit's names.
      opt_state: the optax state (its moments have the params' dtype).
      loss_scale: a ``jmp.DynamicLossScale`` for fp16, else ``jmp.NoOpLossScale()``.
      module: the Flax module; plan: the `Plan`; device: a description of the device(s).
      mesh: the ``jax.sharding.Mesh`` (None: one device); with a mesh also reduce_dtype (the jnp
        dtype of the gradient collective), inject_device (the one device whose local gradient an
        injected overflow hits, the last by default) and overflow_devices (per step, the devices
        whose own gradients were not finite before the reduction).
      lowered / compiled: the step's programs, once the first step compiled them.
    """

    def __init__(self, config: RunConfig, data: Dataset, mesh: Mesh | None = None):
        if mesh is not None and (not isinstance(mesh, Mesh) or mesh.axis_names != (AXIS,)):
            raise TypeError(f"mesh must be a 1-D jax.sharding.Mesh with the axis {AXIS!r} "
                            f"(labkit.train.jax.devices.make_mesh), or None for one device; got {mesh!r}")
        self.config = config
        self.plan = PLANS[config.precision]
        self.mesh = mesh
        self._n = 1 if mesh is None else int(mesh.devices.size)
        self._device = select_device(config.device) if mesh is None else mesh.devices.flat[0]
        # where whole arrays (scale, flags) and batches go: the device, or the mesh's shardings
        self._whole = self._device if mesh is None else NamedSharding(mesh, P())
        self._batch = self._device if mesh is None else NamedSharding(mesh, P(AXIS))
        self.device = describe_device(self._device)
        if self.plan.dtype == jnp.bfloat16 and compute_capability(self._device) < (8, 0):
            self.device += "; bf16 is emulated in float32 below compute capability 8.0"  # XLA runs it, slowly
        if mesh is not None:
            self.device = f"{self._n} x {self.device}, mesh {dict(mesh.shape)}, {config.parallel}"
        self.reduce_name = reduce_name(config)
        self.reduce_dtype = jnp.dtype(REDUCE_NAMES[self.reduce_name])
        self.inject_device = self._n - 1
        self.overflow_devices: list[list[int]] = []
        self.module = jax_models.build(config.model, config.width, self.plan.dtype, self.plan.param_dtype)
        flat = models.init_params(config.model, seed=config.seed, width=config.width)
        tree = jax_models.to_flax(flat, self.plan.param_dtype)
        self.param_specs = jax.tree_util.tree_map(lambda a: self._spec(a.shape), tree)
        self.flax_params = self._place(tree)
        base = optax.adam(config.lr) if config.optimizer == "adam" else optax.sgd(config.lr)
        # Clipping sees the unscaled gradients: the loss scale is divided out before optax runs.
        self.optimizer = base if config.clip_norm is None else optax.chain(
            optax.clip_by_global_norm(config.clip_norm), base)
        self.opt_state = self._place(self.optimizer.init(self.flax_params))
        if self.plan.loss_scaling:
            scale = DEFAULT_LOSS_SCALE if config.init_scale is None else config.init_scale
            # (loss_scale, counter): DynamicLossScale's pytree leaves, rebuilt inside the step.
            self._scale_state = self._put((np.asarray(scale, np.float32), np.zeros([], np.int32)))
        else:
            self._scale_state = ()
        self.lowered = self._compiled = None
        self._predict = jax.jit(lambda p, x: jnp.argmax(self.module.apply({"params": p}, x), axis=-1))
        self._last_x = None

    @property
    def loss_scale(self):
        """The current jmp loss scale: a ``jmp.DynamicLossScale`` for fp16, else ``NoOpLossScale``."""
        return self._jmp_scale(self._scale_state)

    @property
    def compiled(self):
        """The compiled step (``jax.stages.Compiled``), None before the first step."""
        return self._compiled

    def params(self) -> dict[str, np.ndarray]:
        """The current weights under labkit's parameter names, as numpy (in their own dtype)."""
        return jax_models.named(self.flax_params)

    def _jmp_scale(self, state):
        # The step takes the scale as plain arrays: jmp 0.0.4's DynamicLossScale.__post_init__
        # calls jax.eval_shape on its fields, which fails on the placeholders that
        # jax.jit(f).lower(...) passes through pytrees (jax 0.10). Built here from arrays or
        # tracers, it is the real jmp object.
        if not self.plan.loss_scaling:
            return jmp.NoOpLossScale()
        return jmp.DynamicLossScale(loss_scale=state[0], counter=state[1])

    # -- where arrays live -----------------------------------------------------------------
    def _spec(self, shape) -> P:
        return partition_spec(shape, self._n, self.config.parallel if self.mesh is not None else "dp")

    def _put(self, tree):
        """`tree` whole on the device (or on every mesh device)."""
        return jax.device_put(tree, self._whole)

    def _shardings(self, tree):
        return jax.tree_util.tree_map(lambda a: NamedSharding(self.mesh, self._spec(a.shape)), tree)

    def _place(self, tree):
        """Parameters or optimizer state: on the device, or laid out on the mesh (dp / fsdp)."""
        return self._put(tree) if self.mesh is None else jax.device_put(tree, self._shardings(tree))

    # -- the step ------------------------------------------------------------------------
    def loss(self, params, x, y):
        """The mean cross-entropy of a batch, computed in float32 from the model's logits."""
        logits = self.module.apply({"params": params}, x)
        # The loss in float32, whatever the compute dtype (seed 000's advice).
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

    def _scaled_grads(self, params, loss_scale, x, y, inject):
        def scaled_loss(p):
            loss = self.loss(p, x, y)
            return loss_scale.scale(loss), loss

        grads, loss = jax.grad(scaled_loss, has_aux=True)(params)
        return _inject_inf(grads, inject), loss  # into the scaled gradient, as a real overflow

    def _local_grads(self, params, scale_state, x, y, inject):
        """Per mesh device (inside shard_map): gather the param shards, take this shard's
        gradient, reduce it in ``reduce_dtype``."""
        dims = jax.tree_util.tree_map(lambda s: s.index(AXIS) if AXIS in s else None, self.param_specs,
                                      is_leaf=lambda s: isinstance(s, P))
        full = jax.tree_util.tree_map(
            lambda p, d: p if d is None else jax.lax.all_gather(p, AXIS, axis=d, tiled=True), params, dims)
        here = inject & (jax.lax.axis_index(AXIS) == self.inject_device)
        grads, loss = self._scaled_grads(full, self._jmp_scale(scale_state), x, y, here)
        local_finite = jmp.all_finite(grads)[None]

        def reduce(g, d):
            moved = g.astype(self.reduce_dtype)
            moved = jax.lax.psum(moved, AXIS) if d is None else jax.lax.psum_scatter(
                moved, AXIS, scatter_dimension=d, tiled=True)
            return moved.astype(g.dtype) / self._n

        grads = jax.tree_util.tree_map(reduce, grads, dims)
        return grads, jax.lax.pmean(loss, AXIS), local_finite

    def _train_step(self, params, opt_state, scale_state, x, y, inject):
        loss_scale = self._jmp_scale(scale_state)
        if self.mesh is None:
            grads, loss = self._scaled_grads(params, loss_scale, x, y, inject)
            local = ()
        else:
            per_device = jax.shard_map(self._local_grads, mesh=self.mesh,
                                       in_specs=(self.param_specs, P(), P(AXIS), P(AXIS), P()),
                                       out_specs=(self.param_specs, P(), P(AXIS)), check_vma=False)
            grads, loss, local_finite = per_device(params, scale_state, x, y, inject)
            local = (local_finite,)
        grads = loss_scale.unscale(grads)
        finite = jmp.all_finite(grads)  # on a mesh, over the global arrays: every device gets one answer
        grad_norm = optax.tree.norm(jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads))
        with jax.numpy_dtype_promotion("standard"):  # optax 0.2.8's Adam computes 1 - b1**count: float ** int32
            updates, new_opt_state = self.optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        if self.plan.loss_scaling:  # skip the update on inf/NaN, as jmp's README does
            new_params, new_opt_state = jmp.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
        used = jnp.asarray(loss_scale.loss_scale, jnp.float32)
        with jax.numpy_dtype_promotion("standard"):  # jmp 0.0.4's adjust: counter * grads_finite (int32 * bool)
            new_scale = loss_scale.adjust(finite)
        new_state = (new_scale.loss_scale, new_scale.counter) if self.plan.loss_scaling else ()
        return new_params, new_opt_state, new_state, (loss, grad_norm, used, finite, *local)

    def _jit_shardings(self) -> dict:
        if self.mesh is None:
            return {}
        whole, batch = self._whole, self._batch
        ps, os_ = self._shardings(self.flax_params), self._shardings(self.opt_state)
        return {"in_shardings": (ps, os_, whole, batch, batch, whole),
                "out_shardings": (ps, os_, whole, (whole, whole, whole, whole, batch))}

    def compile(self, x, y, inject=False):
        """Compile the train step for batches shaped like (x, y) (done by the first `step`)."""
        step = jax.jit(self._train_step, **self._jit_shardings())
        with jax.default_matmul_precision(self.plan.matmul_precision):
            self.lowered = step.lower(*self._args(x, y, inject))
            self._compiled = self.lowered.compile()
        return self._compiled

    def _args(self, x, y, inject):
        x = jax.device_put(np.asarray(x, np.float32), self._batch)
        y = jax.device_put(np.asarray(y, np.int32), self._batch)
        return (self.flax_params, self.opt_state, self._scale_state, x, y, self._put(np.bool_(inject)))

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        if self._compiled is None:
            self.compile(x, y, inject_overflow)
        self._last_x = x
        self.flax_params, self.opt_state, self._scale_state, stats = self._compiled(
            *self._args(x, y, inject_overflow))
        loss, grad_norm, scale, finite, *local = jax.device_get(stats)  # waits for every device
        if local:
            self.overflow_devices.append([int(i) for i in np.flatnonzero(~np.asarray(local[0]))])
        return StepOut(loss=float(loss), grad_norm=float(grad_norm),
                       scale=float(scale) if self.plan.loss_scaling else None,
                       skipped=bool(self.plan.loss_scaling and not finite))

    # -- after the steps ---------------------------------------------------------------
    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        with jax.default_matmul_precision(self.plan.matmul_precision):
            predicted = self._predict(self.flax_params, self._put(np.asarray(x, np.float32)))
        return float(np.mean(np.asarray(predicted) == np.asarray(y)))

    def nonfinite_layer(self) -> str | None:
        """Where a divergence shows first: the first parameter (in `models.init_params`
        order) that is not finite, e.g. "dense2/kernel"; else the first module, in call
        order, whose output on the last batch is not finite, e.g. "block0/attn/qkv
        (activation)"; else None."""
        leaves = dict(jax_models.named_leaves(self.flax_params))
        for name in models.init_params(self.config.model, seed=0, width=self.config.width):
            if not bool(jnp.all(jnp.isfinite(leaves[name]))):
                return name
        if self._last_x is None:
            return None
        with jax.default_matmul_precision(self.plan.matmul_precision):
            _, state = self.module.apply({"params": self.flax_params}, self._put(np.asarray(self._last_x, np.float32)),
                                         capture_intermediates=True, mutable=["intermediates"])
        # flatten_dict keeps insertion order, which is the order the modules returned in.
        for path, outputs in traverse_util.flatten_dict(state["intermediates"]).items():
            if not all(bool(jnp.all(jnp.isfinite(o))) for o in jax.tree_util.tree_leaves(outputs)):
                module = "/".join(path[:-1]) or "logits"
                return f"{module} (activation)"
        return None

    def device_bytes(self, tree) -> list[int]:
        """Bytes of `tree` held on each device (one entry without a mesh; fsdp: about 1/N of
        the total on each)."""
        devices = [self._device] if self.mesh is None else list(self.mesh.devices.flat)
        per = {d: 0 for d in devices}
        for leaf in jax.tree_util.tree_leaves(tree):
            for shard in leaf.addressable_shards:
                per[shard.device] += shard.data.nbytes
        return [int(per[d]) for d in devices]

    def extra(self) -> dict:
        """What a mesh run adds to RunResult.extra: mesh, sharding, reduce dtype, collectives
        (`labkit.train.jax.hlo.collectives` of the compiled and the lowered step); {} on one
        device or before a step was compiled."""
        if self.mesh is None or self._compiled is None:
            return {}
        done, asked = collectives(self._compiled), collectives(self.lowered)
        names = [name for name, _ in jax_models.named_leaves(self.flax_params)]
        specs = jax.tree_util.tree_leaves(self.param_specs, is_leaf=lambda s: isinstance(s, P))
        return {
            "parallel": self.config.parallel, "mesh": {k: int(v) for k, v in self.mesh.shape.items()},
            "reduce_dtype": self.reduce_name,
            "comm_bytes_per_step": total_bytes(done), "comm_bytes_per_step_requested": total_bytes(asked),
            "collectives": [c._asdict() for c in done], "collectives_requested": [c._asdict() for c in asked],
            "param_sharding": {name: str(spec) for name, spec in zip(names, specs)},
            "overflow_devices": self.overflow_devices,
        }

    def memory(self) -> MemoryReport:
        """Bytes counted from the arrays, the compiled step's own estimate, and device stats."""
        out = {"parameter_bytes": _tree_bytes(self.flax_params), "optimizer_state_bytes": _tree_bytes(self.opt_state)}
        stats = self._compiled.memory_analysis() if self._compiled is not None else None
        if stats is not None:
            for key in STEP_KINDS:
                out[f"step_{key}_bytes"] = int(getattr(stats, f"{key}_size_in_bytes"))
        # The device allocator's figures cover the whole process (JAX never resets its peak),
        # so the names say so: they are not this run's alone.
        device_stats = self._device.memory_stats() or {}
        for key in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit"):
            if key in device_stats:
                out[f"process_device_{key}"] = int(device_stats[key])
        if self.mesh is not None:
            out["parameter_bytes_per_device"] = self.device_bytes(self.flax_params)
            out["optimizer_state_bytes_per_device"] = self.device_bytes(self.opt_state)
        return MemoryReport("jax", **out)


def _inject_inf(grads, inject):
    """Set the first entry of the first gradient to inf when the traced bool `inject` is true."""
    leaves, treedef = jax.tree_util.tree_flatten(grads)
    first = leaves[0].reshape(-1)
    first = first.at[0].set(jnp.where(inject, jnp.asarray(jnp.inf, first.dtype), first[0]))
    leaves[0] = first.reshape(leaves[0].shape)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def make_stepper(config: RunConfig, data: Dataset) -> JaxStepper:
    """Build the JAX stepper for `config`; raises ValueError before any work if it cannot run.

    ``config.devices > 1`` builds it on a mesh of that many devices of this process
    (`labkit.train.jax.devices.make_mesh`; `labkit.train.jax.distributed.run` makes virtual
    CPU devices in a child process when there are too few)."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "jax":
        raise ValueError(f"the JAX runner runs framework='jax' configs, got framework={config.framework!r}")
    return JaxStepper(config, data, make_mesh(config.device, config.devices) if config.devices > 1 else None)


__all__ = ["DEFAULT_LOSS_SCALE", "PLANS", "JaxStepper", "Plan", "make_stepper"]
