"""JAX across devices: one jitted step over a ``jax.sharding.Mesh``, with explicit collectives.

Here a CPU pretends to be N devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set
in a fresh subprocess because JAX fixes its device count when it starts); on N GPUs or a TPU
slice the same code runs in-process on the real devices. The step is the single-device step of
`labkit.train.jax.stepper` with the gradient computed per device inside ``jax.shard_map``::

    mesh = Mesh(devices, ("data",))                  # a 1-D mesh: every device is a data shard
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

What the collectives move is read from the programs themselves (`collectives`): the lowered
HLO shows what the program asks for (``bf16[...] all-reduce`` when ``reduce_dtype="bf16"``);
the compiled HLO shows what this backend runs. XLA:CPU has no bf16 all-reduce or
reduce-scatter, so its compiler promotes them to f32 (the values are still rounded to bf16
first, so the numerics are bf16's, but the bytes are f32's); GPU and TPU backends keep them
in bf16.

>>> from labkit.train import RunConfig, run
>>> res = run(RunConfig("jax", "bf16", devices=4, parallel="fsdp", steps=3, progress=False))  # doctest: +SKIP
>>> res.extra["comm_bytes_per_step"], res.extra["reduce_dtype"]                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from labkit.train.launch import check_engine
from labkit.train import launch as _wait
from labkit.train.config import RunConfig
from labkit.train.loop import RunFailed, StepOut
from labkit.train.result import LogWriteFailed, RunResult, append_end_line

AXIS = "data"
REDUCE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
              "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


# -- reading collectives out of a program -------------------------------------------------
class Collective(NamedTuple):
    """One array moved by a collective: op ("all-reduce", ...), HLO dtype ("f32", "bf16",
    "pred"), shape, and bytes: the full array the collective reduces or gathers (an
    all-reduce's buffer, an all-gather's gathered result, a reduce-scatter's input)."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int


_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_COMMENT = re.compile(r"/\*.*?\*/")  # e.g. /*index=5*/ inside long tuple shapes
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|[a-z]+[0-9]*\S*\[[0-9,]*\]\S*)\s+([\w\-]+)\((.*)$")


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(text)]


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    if dtype not in _HLO_BYTES and not dtype.startswith("f8"):
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return _HLO_BYTES.get(dtype, 1) * math.prod(shape)


def hlo_text(program) -> str:
    """HLO text of a ``jax.stages.Compiled`` (after XLA's passes), a ``jax.stages.Lowered``
    (before them: what the program asks for), or a string already."""
    if isinstance(program, str):
        return program
    if type(program).__name__ == "Lowered":
        return program.as_text(dialect="hlo")
    if hasattr(program, "as_text"):
        return program.as_text()
    raise TypeError(f"collectives() takes a jax Compiled or Lowered program or HLO text, got {type(program).__name__}")


def collectives(program) -> list[Collective]:
    """Every array moved by a collective in `program`, in program order.

    A combined collective (XLA merges small all-reduces into one tuple-shaped op) gives one
    row per array. Asynchronous pairs (``all-reduce-start`` / ``-done``) count once.

    >>> collectives("%ar = bf16[64,32]{1,0} all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%add")
    [Collective(op='all-reduce', dtype='bf16', shape=(64, 32), bytes=4096)]
    """
    shapes: dict[str, list] = {}
    found = []
    for line in hlo_text(program).splitlines():
        m = _INSTR.match(_COMMENT.sub("", line))
        if not m:
            continue
        name, result, opcode, rest = m.groups()
        shapes[name] = _arrays(result)
        base = opcode.removesuffix("-start")
        if base not in _COLLECTIVE_OPS:
            continue
        operands = rest.split(")", 1)[0]
        if base in ("reduce-scatter", "all-to-all", "collective-permute") or (base == "all-reduce" and opcode != base):
            moved = _arrays(operands) or [a for tok in re.findall(r"%?([\w.\-]+)", operands) for a in shapes.get(tok, [])]
        elif base == "all-gather" and opcode != base:  # all-gather-start: (operands..., results...)
            arrays = shapes[name]
            moved = arrays[len(arrays) // 2:]
        else:
            moved = shapes[name]
        found += [Collective(base, dt, shape, _nbytes(dt, shape)) for dt, shape in moved]
    return found


def total_bytes(found: list[Collective]) -> int:
    """The bytes of all `collectives` together: one step's communication payload."""
    return int(sum(c.bytes for c in found))


# -- the sharded stepper ------------------------------------------------------------------
def shard_dim(shape: tuple[int, ...], n: int) -> int | None:
    """The dimension fsdp splits a leaf of this shape along: the largest one divisible by n
    (the first such on ties); None (kept whole on every device) when none is.

    >>> shard_dim((64, 32), 4), shard_dim((10,), 4), shard_dim((), 4)
    (0, None, None)
    """
    best = None
    for dim, size in enumerate(shape):
        if size % n == 0 and size >= n and (best is None or size > shape[best]):
            best = dim
    return best


def _spec(shape, n: int, parallel: str):
    from jax.sharding import PartitionSpec as P

    dim = shard_dim(tuple(shape), n) if parallel == "fsdp" else None
    return P() if dim is None else P(*([None] * dim), AXIS)


def _make_stepper_class():
    import jax
    import jax.numpy as jnp
    import jmp
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from labkit.train.jax import models as jax_models
    from labkit.train.jax.stepper import JaxStepper, _inject_inf

    class ShardedStepper(JaxStepper):
        """`JaxStepper` on a 1-D mesh of ``config.devices`` devices (see the module docstring).

        Attributes beyond JaxStepper's: mesh; reduce_dtype (the jnp dtype of the gradient
        collective); inject_device (the one device whose local gradient an injected overflow
        hits, the last by default); lowered / compiled (the step's programs); overflow_devices
        (per step, the devices whose own gradients were not finite before the reduction).
        """

        def __init__(self, config: RunConfig, data):
            n = config.devices
            devices = _mesh_devices(config.device, n)
            self.mesh = Mesh(np.array(devices), (AXIS,))
            self.replicated = NamedSharding(self.mesh, P())
            super().__init__(config, data)
            self.device = f"{n} x {self.device}, mesh {dict(self.mesh.shape)}, {config.parallel}"
            self.reduce_name = _reduce_name(config)
            self.reduce_dtype = jnp.dtype(REDUCE_NAMES[self.reduce_name])
            self.inject_device = n - 1
            self.param_specs = jax.tree_util.tree_map(lambda a: _spec(a.shape, n, config.parallel), self.params)
            self.params = jax.device_put(self.params, self._shardings(self.params))
            self.opt_state = jax.device_put(self.opt_state, self._shardings(self.opt_state))
            self.lowered = None
            self.overflow_devices: list[list[int]] = []

        def _put(self, tree):
            return jax.device_put(tree, self.replicated)

        def _shardings(self, tree):
            n, parallel = self.config.devices, self.config.parallel
            return jax.tree_util.tree_map(lambda a: NamedSharding(self.mesh, _spec(a.shape, n, parallel)), tree)

        def _local_grads(self, params, scale_state, x, y, inject):
            """Per device: gather the param shards, take this shard's gradient, reduce it."""
            n = self.config.devices
            dims = jax.tree_util.tree_map(lambda s: s.index(AXIS) if AXIS in s else None, self.param_specs,
                                          is_leaf=lambda s: isinstance(s, P))
            full = jax.tree_util.tree_map(
                lambda p, d: p if d is None else jax.lax.all_gather(p, AXIS, axis=d, tiled=True), params, dims)
            loss_scale = self._jmp_scale(scale_state)

            def scaled_loss(p):
                loss = self.loss(p, x, y)
                return loss_scale.scale(loss), loss

            grads, loss = jax.grad(scaled_loss, has_aux=True)(full)
            grads = _inject_inf(grads, inject & (jax.lax.axis_index(AXIS) == self.inject_device))
            local_finite = jmp.all_finite(grads)[None]

            def reduce(g, d):
                moved = g.astype(self.reduce_dtype)
                moved = jax.lax.psum(moved, AXIS) if d is None else jax.lax.psum_scatter(
                    moved, AXIS, scatter_dimension=d, tiled=True)
                return moved.astype(g.dtype) / n

            grads = jax.tree_util.tree_map(reduce, grads, dims)
            return grads, jax.lax.pmean(loss, AXIS), local_finite

        def _train_step(self, params, opt_state, scale_state, x, y, inject):
            local = jax.shard_map(self._local_grads, mesh=self.mesh,
                                  in_specs=(self.param_specs, P(), P(AXIS), P(AXIS), P()),
                                  out_specs=(self.param_specs, P(), P(AXIS)), check_vma=False)
            grads, loss, local_finite = local(params, scale_state, x, y, inject)
            loss_scale = self._jmp_scale(scale_state)
            grads = loss_scale.unscale(grads)
            finite = jmp.all_finite(grads)  # over the global arrays: every device gets one answer
            grad_norm = optax.tree.norm(jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads))
            updates, new_opt_state = self.optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            if self.plan.loss_scaling:
                new_params, new_opt_state = jmp.select_tree(finite, (new_params, new_opt_state), (params, opt_state))
            used = jnp.asarray(loss_scale.loss_scale, jnp.float32)
            new_scale = loss_scale.adjust(finite)
            new_state = (new_scale.loss_scale, new_scale.counter) if self.plan.loss_scaling else ()
            return new_params, new_opt_state, new_state, (loss, grad_norm, used, finite, local_finite)

        def compile(self, x, y, inject=False):
            rep, data = self.replicated, NamedSharding(self.mesh, P(AXIS))
            ps, os_ = self._shardings(self.params), self._shardings(self.opt_state)
            step = jax.jit(self._train_step, in_shardings=(ps, os_, rep, data, data, rep),
                           out_shardings=(ps, os_, rep, (rep, rep, rep, rep, data)))
            with jax.default_matmul_precision(self.plan.matmul_precision):
                self.lowered = step.lower(*self._args(x, y, inject))
                self._compiled = self.lowered.compile()
            return self._compiled

        def _args(self, x, y, inject):
            data = NamedSharding(self.mesh, P(AXIS))
            x = jax.device_put(np.asarray(x, np.float32), data)
            y = jax.device_put(np.asarray(y, np.int32), data)
            return (self.params, self.opt_state, self._scale_state, x, y, self._put(np.bool_(inject)))

        def step(self, x, y, inject_overflow: bool = False) -> StepOut:
            if self._compiled is None:
                self.compile(x, y, inject_overflow)
            self._last_x = x
            self.params, self.opt_state, self._scale_state, stats = self._compiled(*self._args(x, y, inject_overflow))
            loss, grad_norm, scale, finite, local_finite = jax.device_get(stats)  # waits for every device
            self.overflow_devices.append([int(i) for i in np.flatnonzero(~np.asarray(local_finite))])
            return StepOut(loss=float(loss), grad_norm=float(grad_norm),
                           scale=float(scale) if self.plan.loss_scaling else None,
                           skipped=bool(self.plan.loss_scaling and not finite))

        def device_bytes(self, tree) -> list[int]:
            """Bytes of `tree` held on each mesh device (fsdp: about 1/N of the total each)."""
            per = {d: 0 for d in self.mesh.devices.flat}
            for leaf in jax.tree_util.tree_leaves(tree):
                for shard in leaf.addressable_shards:
                    per[shard.device] += shard.data.nbytes
            return [int(per[d]) for d in self.mesh.devices.flat]

        def memory(self) -> dict:
            out = super().memory()
            out["parameter_bytes_per_device"] = self.device_bytes(self.params)
            out["optimizer_state_bytes_per_device"] = self.device_bytes(self.opt_state)
            return out

        def extra(self) -> dict:
            """What the run adds to RunResult.extra: mesh, sharding, reduce dtype, collectives."""
            if self._compiled is None:  # no step was compiled: nothing to report
                return {}
            done, asked = collectives(self._compiled), collectives(self.lowered)
            names = [name for name, _ in jax_models.named_leaves(self.params)]
            specs = jax.tree_util.tree_leaves(self.param_specs, is_leaf=lambda s: isinstance(s, P))
            return {
                "parallel": self.config.parallel, "mesh": {k: int(v) for k, v in self.mesh.shape.items()},
                "reduce_dtype": self.reduce_name,
                "comm_bytes_per_step": total_bytes(done), "comm_bytes_per_step_requested": total_bytes(asked),
                "collectives": [c._asdict() for c in done], "collectives_requested": [c._asdict() for c in asked],
                "param_sharding": {name: str(spec) for name, spec in zip(names, specs)},
                "overflow_devices": self.overflow_devices,
            }

    return ShardedStepper


def _reduce_name(config: RunConfig) -> str:
    if config.reduce_dtype is not None:
        return config.reduce_dtype
    return "bf16" if config.precision == "bf16-pure" else "fp32"  # the gradients' own dtype


def _mesh_devices(requested: str, n: int):
    import jax

    from labkit.train.jax.stepper import select_device

    kind = select_device(requested).platform
    devices = jax.devices(kind)
    if len(devices) < n:
        raise ValueError(f"devices={n} needs {n} {kind} devices; JAX sees {len(devices)} "
                         f"(on a CPU, labkit.train.jax.distributed.run starts a process with {n} virtual ones)")
    return devices[:n]


def make_stepper(config: RunConfig, data):
    """A sharded stepper for the shared loop; needs `config.devices` devices in this process."""
    _check(config)
    return _make_stepper_class()(config, data)


def _check(config: RunConfig) -> None:
    check_engine(config, "jax", "JAX")


# -- running: in this process, or in a child with N virtual CPU devices --------------------
def run(config: RunConfig) -> RunResult:
    """Train `config` on a ``config.devices``-device mesh and return its RunResult.

    With enough devices of the requested kind here, it runs in this process. On a CPU with
    fewer, it runs ``python -m labkit.train.jax.distributed`` with
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (JAX fixes the count at start-up),
    reading the run back from its JSON lines. ``extra`` holds the mesh, the sharding of
    every parameter, the reduce dtype, the collectives of the compiled and the lowered step
    and their bytes, and which devices overflowed at each step.
    """
    _check(config)
    import jax

    from labkit.train.jax.stepper import select_device

    kind = select_device(config.device).platform  # ValueError for a device that is not here
    if len(jax.devices(kind)) >= config.devices:
        return _run_here(config)
    if kind != "cpu":
        _mesh_devices(config.device, config.devices)  # raises: not enough GPUs / TPU cores
    return _run_child(config)


def _run_here(config: RunConfig) -> RunResult:
    from labkit.train.loop import train

    made = []

    def make(cfg, data):
        made.append(make_stepper(cfg, data))
        return made[0]

    result = train(config, make)
    if made and made[0]._compiled is not None:
        result.extra = made[0].extra()
        if config.out:  # the log carries the extras too: RunResult.load reads them back
            try:
                append_end_line(config.out, result.status, result.extra)
            except LogWriteFailed as exc:
                raise RunFailed(f"the run finished, but {exc}", result) from exc
    return result


def _run_child(config: RunConfig) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="labkit-jax-dist-") as tmp:
        out = config.out or str(Path(tmp) / "run.jsonl")
        child = config.replace(out=out, progress=False)
        env = dict(os.environ)
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={config.devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "labkit.train.jax.distributed", json.dumps(child.to_dict())],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = _wait.wait(proc, config, out)  # a progress bar if config.progress
        except BaseException:
            _wait.stop(proc)
            raise
        result = RunResult.load(out) if Path(out).exists() and Path(out).stat().st_size else RunResult(config=config)
        result.config = config
        if proc.returncode != 0:
            tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise RunFailed(f"the {config.devices}-device JAX run failed (exit {proc.returncode}): {tail[0]}", result)
        return result


def main(argv: list[str]) -> int:
    """Child entry point: ``python -m labkit.train.jax.distributed '<RunConfig as JSON>'``."""
    _run_here(RunConfig.from_dict(json.loads(argv[0])))
    return 0


__all__ = ["AXIS", "Collective", "collectives", "hlo_text", "make_stepper", "run", "shard_dim", "total_bytes"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
