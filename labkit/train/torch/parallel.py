"""DDP and FSDP2 as engines of the one `TorchStepper`: what each rank holds and what moves.

`labkit.train.torch.worker` (one per process, started by ``torchrun``) builds
``TorchStepper(config, None, device, description, engine=DDP(rank, world))`` (or ``FSDP2``).
Every rank builds the same model from `labkit.train.models.init_params`, wraps it in the
framework's own engine and takes its slice of each global batch.

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

Collectives are counted, not guessed (`labkit.train.torch.collectives`): one step (the third,
or the last if fewer) runs under ``torch.profiler`` and every ``c10d::`` collective it launched
is listed in ``extra["collectives"]``; ``extra["comm_bytes_per_step"]`` is their sum.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from labkit.memory import MemoryReport
from labkit.train.loop import StepOut
from labkit.train.torch.collectives import DTYPES, dtype_name, gradient_reduce_dtype, profile, read_collectives
from labkit.train.torch.engine import Engine, local, make_optimizer, make_scaler
from labkit.train.torch.stepper import TorchStepper


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards one by one (then the root): the MLP's Linears, the transformer's blocks."""
    if hasattr(model, "blocks"):
        return list(model.blocks)
    return [m for m in model.children() if isinstance(m, torch.nn.Linear)]


def with_inf(grad: torch.Tensor) -> torch.Tensor:
    """A tensor hook: `grad` with its last entry set to inf (an injected overflow)."""
    grad = grad.clone()
    grad.view(-1)[-1] = math.inf
    return grad


class PerProcess(Engine):
    """What every per-process engine shares: the rank's slice, the hooks that watch the compute
    dtypes and inject an overflow on the last rank, the profiled step, the per-rank records."""

    deterministic = False
    replays = False
    name = ""  # the engine, as the run's device line names it

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.collectives: list[dict] = []
        self.compute_dtypes: dict[str, str] = {}
        self.skipped: list[bool] = []
        self.local_finite: list[bool] = []
        self.shard_note = f" (rank {rank}'s shard)"
        self._trace = None

    def module(self, stepper: TorchStepper) -> torch.nn.Module:
        """The model as built, inside the engine's wrapper."""
        return stepper.model

    def profile_step(self, stepper: TorchStepper) -> int:
        # DDP rebuilds its buckets in the second step (a one-off broadcast of their order): count the third
        return min(2, stepper.config.steps - 1)

    def batch(self, x, y):
        b = len(x) // self.world
        return x[self.rank * b:(self.rank + 1) * b], y[self.rank * b:(self.rank + 1) * b]

    def hooks(self, stepper: TorchStepper, inject_overflow: bool) -> list:
        handles = self.watch_compute(stepper) if stepper.steps == 0 else []
        if inject_overflow and self.rank == self.world - 1:
            self.inject(stepper, handles)
        return handles

    def watch_compute(self, stepper: TorchStepper) -> list:
        """Forward hooks that record the dtype each Linear really computed in (first step only)."""
        names = {m: n for n, m in stepper.model.named_modules()}

        def hook(module, args, output):
            self.compute_dtypes.setdefault(names[module].removeprefix("module."), dtype_name(output.dtype))

        return [m.register_forward_hook(hook) for m in names if isinstance(m, torch.nn.Linear)]

    def inject(self, stepper: TorchStepper, handles: list) -> None:
        """On the last rank: a tensor hook on the head's weight, as the forward uses it (the
        unsharded weight under FSDP2), sets its last gradient entry to inf before the reduction.
        The hooks go into `handles`, which the step removes after its backward pass."""

        def on_forward(module, args):
            handles.append(module.weight.register_hook(with_inf))

        handles.append(self.head(stepper).register_forward_pre_hook(on_forward))

    def head(self, stepper: TorchStepper) -> torch.nn.Module:
        return [m for m in self.module(stepper).modules() if isinstance(m, torch.nn.Linear)][-1]

    def recording(self, stepper: TorchStepper):
        return _Recording(self, profile(stepper.steps == self.profile_step(stepper)))

    def after_backward(self, stepper: TorchStepper, inject_overflow: bool) -> None:
        grads = [local(p.grad) for p in stepper.model.parameters() if p.grad is not None]
        self.local_finite.append(all(bool(torch.isfinite(g).all()) for g in grads))

    def finish(self, stepper: TorchStepper, loss: torch.Tensor, out: StepOut) -> StepOut:
        """Record the step (and the profiled step's collectives); the global batch's loss for the log."""
        if self._trace is not None:
            self.collectives, self._trace = read_collectives(self._trace), None
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # the global batch's loss: the mean of equal-sized slices
        self.skipped.append(out.skipped)
        return StepOut(loss=float(total) / self.world, grad_norm=out.grad_norm, scale=out.scale,
                       skipped=out.skipped)

    def memory(self, stepper: TorchStepper) -> MemoryReport:
        """This rank's bytes, from its own tensors (under FSDP2: its shards)."""
        params = [local(p) for p in stepper.model.parameters()]
        state = [local(v) for s in stepper.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        out = {"parameter_bytes": sum(t.numel() * t.element_size() for t in params),
               "gradient_bytes": sum(local(p.grad).numel() * p.grad.element_size()
                                     for p in stepper.model.parameters() if p.grad is not None),
               "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state)}
        return self.with_cuda_peak(stepper, out)

    def with_cuda_peak(self, stepper: TorchStepper, out: dict) -> MemoryReport:
        """`out`'s bytes, with the CUDA allocator's peak on a GPU."""
        if stepper.torch_device.type == "cuda":
            out.update(device="cuda", peak_bytes=int(torch.cuda.max_memory_allocated(stepper.torch_device)))
        return MemoryReport("torch", **out)

    def extra(self, stepper: TorchStepper) -> dict:
        """What the run adds to RunResult.extra, gathered from every rank (a collective: the
        shared loop calls it on every rank at the same point)."""
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, {"skipped": self.skipped, "finite": self.local_finite,
                                          "memory": stepper.memory().to_dict(), "sharding": self.sharding(stepper)})
        sharding = [dict(p, local_shape=[r["sharding"][i]["local_shape"] for r in per_rank])
                    for i, p in enumerate(per_rank[0]["sharding"])]
        return {"comm_bytes_per_step": sum(c["bytes"] for c in self.collectives),
                "reduce_dtype": gradient_reduce_dtype(self.collectives),
                "collectives": self.collectives, "profiled_step": self.profile_step(stepper),
                "parallel": stepper.config.parallel, "world_size": self.world,
                "skipped_by_rank": [r["skipped"] for r in per_rank],
                "local_grads_finite_by_rank": [r["finite"] for r in per_rank],
                "overflow_rank": self.world - 1 if stepper.config.inject_overflow else None,
                "memory_by_rank": [r["memory"] for r in per_rank],
                "sharding": sharding, "compute_dtypes": self.compute_dtypes}

    def sharding(self, stepper: TorchStepper) -> list[dict]:
        """Each parameter: full shape, this rank's local shape, the dtype it is stored in."""
        return [{"name": n.removeprefix("module."), "shape": list(p.shape), "local_shape": list(local(p).shape),
                 "dtype": dtype_name(p.dtype)} for n, p in stepper.model.named_parameters()]


class _Recording:
    """The profiled step's context: keeps the trace on the engine for `PerProcess.finish`."""

    def __init__(self, engine: PerProcess, context):
        self.engine, self.context = engine, context

    def __enter__(self):
        self.engine._trace = self.context.__enter__()

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)


class DDP(PerProcess):
    """``parallel="dp"``: DistributedDataParallel over fp32 weights, autocast inside (see the module docstring)."""

    name = "DDP"

    def setup(self, stepper: TorchStepper, model: torch.nn.Module) -> None:
        from torch.nn.parallel import DistributedDataParallel

        config, device = stepper.config, stepper.torch_device
        super().setup(stepper, model)  # on the device (bf16-pure: in bf16), Adam fused, GradScaler
        stepper.model = DistributedDataParallel(stepper.model,
                                                device_ids=[device.index] if device.type == "cuda" else None)
        if config.reduce_dtype in ("bf16", "fp16") and not (stepper.pure and config.reduce_dtype == "bf16"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
            hook = hook[config.reduce_dtype]
            if hook is default_hooks.bf16_compress_hook and device.type == "cpu":
                hook = bf16_compress_hook_gloo
            stepper.model.register_comm_hook(state=None, hook=hook)

    def module(self, stepper: TorchStepper) -> torch.nn.Module:
        return stepper.model.module


class FSDP2(PerProcess):
    """``parallel="fsdp"``: ``fully_shard`` with a MixedPrecisionPolicy and a ShardedGradScaler (module docstring)."""

    name = "FSDP2 fully_shard"
    autocast = False  # the policy casts the all-gathered weights to param_dtype itself

    def setup(self, stepper: TorchStepper, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        config, device = stepper.config, stepper.torch_device
        model = self.place(stepper, model)  # on the device; bf16-pure: in bf16
        policy = MixedPrecisionPolicy(param_dtype=None if stepper.pure else stepper.compute_dtype,
                                      reduce_dtype=DTYPES.get(config.reduce_dtype))
        for layer in layers(model):
            fully_shard(layer, mp_policy=policy)
        stepper.model = fully_shard(model, mp_policy=policy)
        stepper.optimizer = make_optimizer(config, stepper.model.parameters(), fused=False)  # DTensor shards
        stepper.scaler = make_scaler(config, device.type, ShardedGradScaler)

    def after_evaluate(self, stepper: TorchStepper) -> None:
        """FSDP2 leaves the root unsharded after a forward without backward: reshard it."""
        from torch.distributed.fsdp import FSDPModule

        for m in stepper.model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def bf16_compress_hook_gloo(state, bucket):
    """PyTorch's own ``bf16_compress_hook``, under another name: it calls it, so it does what
    it does -- cast the bucket to bf16, divide it by the world size in bf16, all-reduce the sum,
    copy the result back into the fp32 bucket.

    DDP refuses a hook *named* ``bf16_compress_hook`` unless torch was built with CUDA and
    NCCL >= 2.10 (or XPU and XCCL) -- a check on the build, not on the process group
    (``torch/nn/parallel/distributed.py``, ``_check_comm_hook``; `labkit.train.torch.distributed.ddp_bf16_hooks`
    shows it). gloo all-reduces bf16 on CPUs, so on a CPU the same hook runs under this name.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)
