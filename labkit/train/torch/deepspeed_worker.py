"""One rank of a DeepSpeed ZeRO stage 1 / 2 run; ``torchrun`` starts one of these per process.

    python -m torch.distributed.run --nproc-per-node=2 ... -m labkit.train.torch.deepspeed_worker spec.json

`labkit.train.torch.distributed.run` launches this module for ``parallel="zero1"`` / ``"zero2"``,
the same way it launches DDP and FSDP2 (DeepSpeed reads torchrun's RANK / WORLD_SIZE / MASTER_*
variables). Every rank builds the same model from `labkit.train.models.init_params` and hands it
to ``deepspeed.initialize`` with the config `labkit.train.torch.deepspeed_config.engine_config`
writes (the seed's ``fp16`` / ``bf16`` block, the ZeRO stage, the batch, the optimizer).

What DeepSpeed does with it (``deepspeed/runtime/engine.py``, ``zero/stage_1_and_2.py``):

* the engine casts the model to bf16 (or fp16): every rank holds **all** the 16-bit working
  weights -- ZeRO 1/2 do not shard parameters (stage 3 does);
* ``DeepSpeedZeroOptimizer`` flattens them and gives each rank one 1/N partition in **fp32**:
  the master weights, and Adam's m and v for them (stage 1 and 2 alike);
* after backward the 16-bit gradients are reduced in ``communication_data_type`` (default: the
  training dtype), in buckets; with ``use_multi_rank_bucket_allreduce`` (default True) a bucket
  is all-reduced and each rank keeps its partition. Stage 2 keeps only that gradient partition;
* before the update the overflow flag is all-reduced (fp16 -- and bf16, whose
  ``check_grad_overflow`` defaults to True in DeepSpeed 0.19.8), so every rank skips together;
  each rank updates its fp32 partition and the new 16-bit weights are all-gathered.

The run's collectives are counted with `torch_worker.read_collectives` (the profiler's c10d
ops), and each rank's bytes are read from DeepSpeed's own buffers (`DeepSpeedStepper.memory`).
"""

from __future__ import annotations

import datetime
import logging
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.train import models
from labkit.train.config import RunConfig
from labkit.train.loop import StepOut, train
from labkit.train.torch.models import build
from labkit.train.torch.stepper import batch_tensors
from labkit.train.torch.worker import DistStepper, _name, _profile, _with_inf, exit_after, rank_main, where


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class DeepSpeedStepper(DistStepper):
    """The Stepper protocol of `labkit.train.loop` for one rank of a DeepSpeed ZeRO 1/2 run."""

    def __init__(self, config: RunConfig, rank: int, world: int, device: torch.device):
        import deepspeed

        from labkit.train.torch.deepspeed_config import engine_config

        self.config, self.rank, self.world, self.torch_device = config, rank, world, device
        model = build(config.model, models.init_params(config.model, seed=config.seed, width=config.width))
        self.target = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]  # the head
        self.ds_config = engine_config(config)
        optimizer = None
        if config.optimizer == "sgd":  # DeepSpeed builds no SGD from its config: hand it torch's
            optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), optimizer=optimizer, config=self.ds_config)
        self.param_dtype = next(self.model.module.parameters()).dtype
        self.autocast = False  # the engine casts the model itself; inputs are cast in _inputs
        stage = self.ds_config["zero_optimization"]["stage"]
        self.device = (f"{world} processes, DeepSpeed {deepspeed.__version__} ZeRO stage {stage}, "
                       f"{dist.get_backend()}; each on {where(device)}")
        self._start_records()

    def _inputs(self, x: np.ndarray, y: np.ndarray):  # the engine's model is in bf16/fp16: so must its inputs be
        return batch_tensors(self.config, x, y, self.torch_device, self.param_dtype)

    def _finiteness_hooks(self, seen: list) -> list:
        """Tensor hooks that note whether each gradient this rank produced is finite -- before
        DeepSpeed's own hooks reduce it (they run after the gradient is accumulated)."""
        return [p.register_hook(lambda g: seen.append(bool(torch.isfinite(g).all())))
                for p in self.model.module.parameters() if p.requires_grad]

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        b = len(x) // self.world
        xb, yb = self._inputs(x[self.rank * b:(self.rank + 1) * b], y[self.rank * b:(self.rank + 1) * b])
        handles = self._watch_compute() if self.steps == 0 else []
        profiling, seen = self.steps == self.profile_step, []
        skipped_before = self.model.skipped_steps
        scale = self._scale()
        with _profile(profiling) as trace:
            loss = F.cross_entropy(self.model(xb).float(), yb)
            if inject_overflow and self.rank == self.world - 1:  # the injected inf, then the check
                handles.append(self.target.weight.register_hook(_with_inf))
            handles += self._finiteness_hooks(seen)  # tensor hooks run in the order they were added
            self.model.backward(loss)  # scales the loss (fp16), reduces the gradients in buckets
            for h in handles:
                h.remove()
            self.model.step()  # all-reduces the overflow flag; updates the fp32 partition; all-gathers
        skipped = self.model.skipped_steps > skipped_before
        norm = self.model.get_global_grad_norm()
        norm = math.inf if skipped or norm is None else float(norm)
        return self._finish_step(trace if profiling else None, loss, norm, scale, skipped, all(seen))

    def _scale(self) -> float | None:
        """The loss scale this step's backward uses (fp16 only; DeepSpeed's ``cur_scale``)."""
        if self.config.precision != "fp16":
            return None
        return float(self.optimizer.loss_scale)

    def memory(self) -> dict:
        """This rank's bytes, read from DeepSpeed's buffers: the 16-bit working weights (all of
        them), the fp32 master partition, and the optimizer states (for the partition only)."""
        opt = self.optimizer
        state = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
        out = {"parameter_bytes": _nbytes(self.model.module.parameters()),
               "master_weight_bytes": _nbytes(getattr(opt, "single_partition_of_fp32_groups", [])),
               "optimizer_state_bytes": _nbytes(state)}
        return self._with_cuda_peak(out)

    def sharding(self) -> list[dict]:
        """Each parameter as the engine holds it: full shape on every rank (ZeRO 1/2 shard the
        fp32 master copy and the optimizer states, not the working weights), in bf16/fp16."""
        return [{"name": n, "shape": list(p.shape), "local_shape": list(p.shape), "dtype": _name(p.dtype)}
                for n, p in self.model.module.named_parameters()]

    def extra(self) -> dict:
        out = super().extra()
        out.update(engine="deepspeed",
                   zero_stage=self.ds_config["zero_optimization"]["stage"], ds_config=self.ds_config,
                   communication_data_type=_name(self.model.communication_data_type))
        return out

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        with torch.no_grad():
            xb, yb = self._inputs(x, y)
            pred = self.model(xb).argmax(dim=-1)
        return float((pred == yb).float().mean())


def train_rank(config: RunConfig, out: str | None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mine = config.replace(out=out if rank == 0 else None, progress=False)
    train(mine, lambda cfg, data: DeepSpeedStepper(cfg, rank, world, device))


def _init(backend: str, timeout: datetime.timedelta) -> None:
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its per-step INFO lines go nowhere useful
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)


def main(argv: list[str]) -> int:
    return rank_main(argv, "labkit.train.torch.deepspeed_worker", _init, train_rank)


if __name__ == "__main__":
    exit_after(main)
