"""One rank of a PyTorch DDP / FSDP2 run; ``torchrun`` starts one of these per process.

    python -m torch.distributed.run --nproc-per-node=2 ... -m labkit.train.torch.worker spec.json

`labkit.train.torch.distributed.run` writes ``spec.json`` (``{"config": RunConfig.to_dict(),
"out": path}``) and launches this module. Every rank builds the same model from
`labkit.train.models.init_params`, wraps it in the framework's own engine and takes its slice
of each global batch; rank 0 writes the JSON-lines log that `RunResult.load` reads back.

=========  ====================================================================================
parallel   what each rank holds and what moves
=========  ====================================================================================
``dp``     ``DistributedDataParallel``: every rank holds all fp32 weights (they are the master
           weights; autocast casts them for the matmuls). After backward, gradients are summed
           in buckets with one all-reduce per bucket, in the gradients' dtype (fp32), or in
           bf16/fp16 with a communication hook (``bf16_compress_hook``/``fp16_compress_hook``)
           that casts each bucket down, divides it by the world size (in the 16-bit dtype),
           all-reduces the sum and copies it back into the fp32 bucket (``default_hooks.py``,
           ``_compress_hook``: ``buffer.to(dtype).div_(world_size)``). On a CPU the bf16 hook
           runs as `bf16_compress_hook_gloo` (DDP refuses the stock one by name there).
``fsdp``   FSDP2 ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``: each
           rank keeps 1/N of every fp32 weight (a ``DTensor`` shard, dim 0). Before a layer
           runs its shards are all-gathered *in param_dtype* (bf16: half the bytes) and the
           layer computes in that dtype; gradients are reduce-scattered in ``reduce_dtype``
           (None: param_dtype) and land in fp32 on the shard, where Adam updates them.
=========  ====================================================================================

Loss scaling (fp16). ``dp`` uses ``torch.amp.GradScaler``: every rank checks its own grads,
but after the all-reduce the grads *are* the same on every rank (an inf on one rank becomes
inf in the sum), so every rank sees the overflow. ``fsdp`` uses ``ShardedGradScaler``: a rank
sees only its shard, which may be finite while another rank's is not, so ``unscale_``
all-reduces ``found_inf`` and every rank skips together. An injected overflow
(``config.inject_overflow``) sets one gradient entry to inf on the *last rank only*, before
the reduction, and the per-rank decisions are recorded in ``extra["skipped_by_rank"]`` next
to ``extra["local_grads_finite_by_rank"]`` (was this rank's own gradient finite?).

Collectives are counted, not guessed: one step (the third, or the last if fewer) runs under
``torch.profiler`` and every ``c10d::`` collective it launched is listed in
``extra["collectives"]`` with its dtype and element count, the size a collective moves
counted as nccl-tests does (the full buffer: all-reduce input, all-gather output,
reduce-scatter input). ``extra["comm_bytes_per_step"]`` is their sum.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.train import models
from labkit.train.config import RunConfig
from labkit.train.loop import StepOut, train
from labkit.train.torch.models import build
from labkit.train.torch.stepper import (COMPUTE_DTYPES, batch_tensors, describe_cpu, make_optimizer, make_scaler,
                                      matmul_precision)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64",
               "int": "int32", "long int": "int64", "unsigned char": "uint8", "bool": "bool"}
ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "int32": 4, "int64": 8, "uint8": 1, "bool": 1}
# dispatcher-level collectives; (index of the argument whose size is the "size" moved)
COLLECTIVES = {"c10d::allreduce_": 0, "c10d::allreduce_coalesced_": 0, "c10d::_allgather_base_": 0,
               "c10d::allgather_": 0, "c10d::allgather_into_tensor_coalesced_": 0,
               "c10d::_reduce_scatter_base_": 1, "c10d::reduce_scatter_": 1,
               "c10d::reduce_scatter_tensor_coalesced_": 1, "c10d::broadcast_": 0, "c10d::reduce_": 0}


def _name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype).replace("torch.", ""))


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of `t` this rank holds (a DTensor's shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards one by one (then the root): the MLP's Linears, the transformer's blocks."""
    if hasattr(model, "blocks"):
        return list(model.blocks)
    return [m for m in model.children() if isinstance(m, torch.nn.Linear)]


class DistStepper:
    """The Stepper protocol of `labkit.train.loop` for one rank of a DDP / FSDP2 run."""

    def __init__(self, config: RunConfig, rank: int, world: int, device: torch.device):
        self.config, self.rank, self.world, self.torch_device = config, rank, world, device
        self.compute_dtype = COMPUTE_DTYPES[config.precision]
        pure = config.precision == "bf16-pure"
        model = build(config.model, models.init_params(config.model, seed=config.seed, width=config.width))
        model = model.to(device)
        if pure:
            model.to(torch.bfloat16)
        self.target = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]  # the head
        self.autocast = config.parallel == "dp" and self.compute_dtype is not None and not pure
        if config.parallel == "dp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            if config.reduce_dtype in ("bf16", "fp16") and not (pure and config.reduce_dtype == "bf16"):
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
                hook = hook[config.reduce_dtype]
                if hook is default_hooks.bf16_compress_hook and device.type == "cpu":
                    hook = bf16_compress_hook_gloo
                self.model.register_comm_hook(state=None, hook=hook)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            param_dtype = None if pure else self.compute_dtype
            reduce = DTYPES.get(config.reduce_dtype)
            policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce)
            for layer in layers(model):
                fully_shard(layer, mp_policy=policy)
            self.model = fully_shard(model, mp_policy=policy)
        fused = config.parallel == "dp" and device.type in ("cpu", "cuda")  # DTensor shards: no fused Adam
        self.optimizer = make_optimizer(config, self.model.parameters(), fused=fused)
        scaler_class = None
        if config.parallel == "fsdp":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as scaler_class
        self.scaler = make_scaler(config, device.type, scaler_class)
        engine = "DDP" if config.parallel == "dp" else "FSDP2 fully_shard"
        self.device = f"{world} processes, {engine}, {dist.get_backend()}; each on {where(device)}"
        self._start_records()

    def _start_records(self) -> None:
        """What every step adds to: the step count, the profiled step's collectives, per-rank decisions."""
        self.steps = 0
        # DDP rebuilds its buckets in the second step (a one-off broadcast of their order): count the third
        self.profile_step = min(2, self.config.steps - 1)
        self.collectives: list[dict] = []
        self.compute_dtypes: dict[str, str] = {}
        self.skipped: list[bool] = []
        self.local_finite: list[bool] = []

    # -- pieces ---------------------------------------------------------------------------
    def _inputs(self, x: np.ndarray, y: np.ndarray):
        pure = self.config.precision == "bf16-pure"
        return batch_tensors(self.config, x, y, self.torch_device, torch.bfloat16 if pure else None)

    def _loss(self, xb, yb):
        ctx = (torch.amp.autocast(self.torch_device.type, dtype=self.compute_dtype) if self.autocast
               else contextlib.nullcontext())
        with ctx:
            logits = self.model(xb)
        return F.cross_entropy(logits.float(), yb)

    def _watch_compute(self):
        """Forward hooks that record the dtype each Linear really computed in (first step only)."""
        names = {m: n for n, m in self.model.named_modules()}

        def hook(module, args, output):
            self.compute_dtypes.setdefault(names[module].removeprefix("module."), _name(output.dtype))

        return [m.register_forward_hook(hook) for m in names if isinstance(m, torch.nn.Linear)]

    def _inject(self, handles: list) -> None:
        """On the last rank: a tensor hook on the head's weight, as the forward uses it (the
        unsharded weight under FSDP2), sets its last gradient entry to inf before the reduction.
        The hooks go into `handles`, which the step removes after its backward pass."""

        def on_forward(module, args):
            handles.append(module.weight.register_hook(_with_inf))

        handles.append(self.target.register_forward_pre_hook(on_forward))

    # -- Stepper protocol -----------------------------------------------------------------
    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False):
        b = len(x) // self.world
        xb, yb = self._inputs(x[self.rank * b:(self.rank + 1) * b], y[self.rank * b:(self.rank + 1) * b])
        handles = self._watch_compute() if self.steps == 0 else []
        if inject_overflow and self.rank == self.world - 1:
            self._inject(handles)
        profiling = self.steps == self.profile_step
        with _profile(profiling) as trace, matmul_precision("high" if self.config.precision == "tf32" else "highest"):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(xb, yb)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            for h in handles:
                h.remove()
            grads = [_local(p.grad) for p in self.model.parameters() if p.grad is not None]
            local_finite = all(bool(torch.isfinite(g).all()) for g in grads)
            scale = None
            if self.scaler:
                scale = self.scaler.get_scale()
                self.scaler.unscale_(self.optimizer)  # ShardedGradScaler: all-reduces found_inf
            norm = self._clip()
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                skipped = self.scaler.get_scale() < scale
            elif math.isfinite(float(loss)):
                self.optimizer.step()
                skipped = False
            else:
                skipped = True
        return self._finish_step(trace if profiling else None, loss, norm, scale, skipped, local_finite)

    def _finish_step(self, trace, loss, norm: float, scale, skipped: bool, local_finite: bool):
        """Record the step (and the profiled step's collectives); the global batch's loss for the log."""
        if trace is not None:
            self.collectives = read_collectives(trace)
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # the global batch's loss: the mean of equal-sized slices
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        self.steps += 1
        self.skipped.append(bool(skipped))
        self.local_finite.append(bool(local_finite))
        return StepOut(loss=float(total) / self.world, grad_norm=norm, scale=scale, skipped=bool(skipped))

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.config.clip_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.clip_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        with torch.no_grad():
            xb, yb = self._inputs(x, y)
            ctx = (torch.amp.autocast(self.torch_device.type, dtype=self.compute_dtype) if self.autocast
                   else contextlib.nullcontext())
            with ctx:
                pred = self.model(xb).argmax(dim=-1)
        if self.config.parallel == "fsdp":  # FSDP2 leaves the root unsharded after a forward without backward
            from torch.distributed.fsdp import FSDPModule

            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()
        return float((pred == yb).float().mean())

    def nonfinite_layer(self) -> str | None:
        for name, p in self.model.named_parameters():
            if not bool(torch.isfinite(_local(p)).all()):
                return f"parameter {name} (rank {self.rank}'s shard)"
        return None

    def memory(self) -> dict:
        """This rank's bytes, from its own tensors (under FSDP2: its shards)."""
        params = [_local(p) for p in self.model.parameters()]
        state = [_local(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        out = {"parameter_bytes": sum(t.numel() * t.element_size() for t in params),
               "gradient_bytes": sum(_local(p.grad).numel() * p.grad.element_size()
                                     for p in self.model.parameters() if p.grad is not None),
               "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state)}
        return self._with_cuda_peak(out)

    def _with_cuda_peak(self, out: dict) -> dict:
        if self.torch_device.type == "cuda":
            out["cuda_max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.torch_device))
        return out

    def extra(self) -> dict:
        """What the run adds to RunResult.extra, gathered from every rank (a collective: the
        shared loop calls it on every rank at the same point)."""
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, {"skipped": self.skipped, "finite": self.local_finite,
                                          "memory": self.memory(), "sharding": self.sharding()})
        sharding = [dict(p, local_shape=[r["sharding"][i]["local_shape"] for r in per_rank])
                    for i, p in enumerate(per_rank[0]["sharding"])]
        return {"comm_bytes_per_step": sum(c["bytes"] for c in self.collectives),
                "reduce_dtype": gradient_reduce_dtype(self.collectives),
                "collectives": self.collectives, "profiled_step": self.profile_step,
                "parallel": self.config.parallel, "world_size": self.world,
                "skipped_by_rank": [r["skipped"] for r in per_rank],
                "local_grads_finite_by_rank": [r["finite"] for r in per_rank],
                "overflow_rank": self.world - 1 if self.config.inject_overflow else None,
                "memory_by_rank": [r["memory"] for r in per_rank],
                "sharding": sharding, "compute_dtypes": self.compute_dtypes}

    def sharding(self) -> list[dict]:
        """Each parameter: full shape, this rank's local shape, the dtype it is stored in."""
        return [{"name": n.removeprefix("module."), "shape": list(p.shape), "local_shape": list(_local(p).shape), "dtype": _name(p.dtype)}
                for n, p in self.model.named_parameters()]


def bf16_compress_hook_gloo(state, bucket):
    """PyTorch's own ``bf16_compress_hook``, under another name: it calls it, so it does what
    it does -- cast the bucket to bf16, divide it by the world size in bf16, all-reduce the sum,
    copy the result back into the fp32 bucket.

    DDP refuses a hook *named* ``bf16_compress_hook`` unless torch was built with CUDA and
    NCCL >= 2.10 (or XPU and XCCL) -- a check on the build, not on the process group
    (``torch/nn/parallel/distributed.py``, ``_check_comm_hook``; `torch_dist.ddp_bf16_hooks`
    shows it). gloo all-reduces bf16 on CPUs, so on a CPU the same hook runs under this name.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _with_inf(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.clone()
    grad.view(-1)[-1] = math.inf
    return grad


@contextlib.contextmanager
def _profile(enabled: bool):
    """Profile the block (CPU ops, with input dtypes) and yield the path of its Chrome trace."""
    if not enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        box = [None]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            yield box
        prof.export_chrome_trace(path)
        with open(path) as f:
            box[0] = json.load(f)


def read_collectives(box) -> list[dict]:
    """The c10d collectives in a profiled step: op, dtype, elements, bytes (nccl-tests' size).

    A ``c10d::`` op that takes a list of tensors (DDP's bucket all-reduce) records its type as
    "TensorList"; its dtype is then read from the backend's own event for it ("gloo:all_reduce",
    "nccl:all_reduce": the same element count, started at or after it, on the worker thread).
    """
    events = sorted((box[0] or {}).get("traceEvents", []), key=lambda e: e.get("ts", 0))
    backend = [e for e in events if e.get("name", "").startswith(("gloo:", "nccl:"))]
    out = []
    for ev in events:
        idx = COLLECTIVES.get(ev.get("name"))
        args = ev.get("args", {})
        dims, types = args.get("Input Dims", []), args.get("Input type", [])
        if idx is None or idx >= len(dims):
            continue
        shape = dims[idx][0] if types[idx] == "TensorList" and dims[idx] else dims[idx]
        n = int(np.prod(shape)) if shape else 1
        dtype = types[idx]
        if dtype == "TensorList":
            match = next((b for b in backend if b.get("ts", 0) >= ev.get("ts", 0)
                          and int(np.prod(b["args"]["Input Dims"][0] or [1])) == n), None)
            dtype = match["args"]["Input type"][0] if match else "unknown"
            if match:
                backend.remove(match)
        dtype = DTYPE_NAMES.get(dtype, dtype)
        out.append({"op": ev["name"].removeprefix("c10d::").strip("_"), "dtype": dtype, "elements": n,
                    "bytes": n * ITEMSIZE.get(dtype, 0)})
    return out


def gradient_reduce_dtype(collectives: list[dict]) -> str | None:
    """The dtype of the largest reduction (all-reduce / reduce-scatter): the gradients'."""
    reductions = [c for c in collectives if c["op"].startswith(("allreduce", "reduce_scatter"))]
    return max(reductions, key=lambda c: c["elements"])["dtype"] if reductions else None


def where(device: torch.device) -> str:
    """What one rank runs on: the CPU (with its bf16/fp16 support) or the GPU's name."""
    return describe_cpu() if device.type == "cpu" else f"cuda ({torch.cuda.get_device_name(device)})"


def train_rank(config: RunConfig, out: str | None) -> None:
    """The shared loop (`labkit.train.loop.train`) on every rank; rank 0 records the run."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if dist.get_backend() == "nccl"
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mine = config.replace(out=out if rank == 0 else None, progress=False)
    train(mine, lambda cfg, data: DistStepper(cfg, rank, world, device))


def rank_main(argv: list[str], module: str, init_process_group, train_rank) -> int:
    """One rank: read the spec, ``init_process_group(backend, timeout)``, ``train_rank(config, out)``,
    then wait for every rank and tear the group down. Shared by the DDP/FSDP2 and DeepSpeed workers."""
    if len(argv) != 2:
        raise SystemExit(f"usage: torchrun ... -m {module} SPEC.json")
    with open(argv[1]) as f:
        spec = json.load(f)
    config = RunConfig.from_dict(spec["config"])  # a bad spec fails here, before any collective
    backend = "nccl" if spec.get("backend") == "nccl" else "gloo"
    init_process_group(backend, datetime.timedelta(seconds=spec.get("timeout_s", 300)))
    try:
        train_rank(config, spec.get("out"))
        dist.barrier()  # nobody tears gloo down while a peer still talks to it (that aborts the peer)
    finally:
        dist.destroy_process_group()
    return 0


def exit_after(main) -> None:
    """Run ``main(sys.argv)`` under torchrun's ``@record`` (an exception's traceback goes into the
    failure summary torchrun prints, which `torch_dist.run` passes on), then leave at once.

    Everything is written by then (the Recorder fsyncs each line) and the process group is gone.
    Leaving without C++ static destructors matters: after torch.profiler has run, its thread can
    still be joinable at interpreter exit, and its destructor then aborts the process
    ("terminate called without an active exception", SIGABRT) -- seen in about one launch in ten
    on this CPU, after the run had finished.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(main)(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def main(argv: list[str]) -> int:
    return rank_main(argv, "labkit.train.torch.worker",
                     lambda backend, timeout: dist.init_process_group(backend, timeout=timeout), train_rank)


if __name__ == "__main__":
    exit_after(main)
