"""DeepSpeed ZeRO stage 1 / 2 as an engine of the one `TorchStepper`, one per ``torchrun`` process.

`labkit.train.torch.worker` builds ``TorchStepper(config, None, device, description,
engine=DeepSpeedZero(rank, world))`` for ``parallel="zero1"`` / ``"zero2"`` (DeepSpeed reads
torchrun's RANK / WORLD_SIZE / MASTER_* variables). Every rank builds the same model from
`labkit.train.models.init_params` and hands it to ``deepspeed.initialize`` with the config
`labkit.train.torch.deepspeed_config.engine_config` writes (the seed's ``fp16`` / ``bf16``
block, the ZeRO stage, the batch, the optimizer).

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

The run's collectives are counted as DDP's and FSDP2's are (`labkit.train.torch.collectives`),
and each rank's bytes are read from DeepSpeed's own buffers (`DeepSpeedZero.memory`).
"""

from __future__ import annotations

import math

import torch

from labkit.memory import MemoryReport
from labkit.train.torch.collectives import dtype_name
from labkit.train.torch.parallel import PerProcess, with_inf
from labkit.train.torch.stepper import TorchStepper


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class DeepSpeedZero(PerProcess):
    """``parallel="zero1"`` / ``"zero2"``: ``deepspeed.initialize`` holds the model and applies the update."""

    autocast = False  # the engine casts the model itself; inputs are cast to its dtype

    @property
    def name(self) -> str:
        import deepspeed

        return f"DeepSpeed {deepspeed.__version__} ZeRO stage {self.ds_config['zero_optimization']['stage']}"

    def setup(self, stepper: TorchStepper, model: torch.nn.Module) -> None:
        import deepspeed

        from labkit.train.torch.deepspeed_config import engine_config

        self.ds_config = engine_config(stepper.config)
        optimizer = None
        if stepper.config.optimizer == "sgd":  # DeepSpeed builds no SGD from its config: hand it torch's
            optimizer = torch.optim.SGD(model.parameters(), lr=stepper.config.lr)
        stepper.model, stepper.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), optimizer=optimizer, config=self.ds_config)
        stepper.scaler = None
        stepper.input_dtype = next(stepper.model.module.parameters()).dtype  # bf16/fp16 model: inputs too
        self.seen: list[bool] = []

    def module(self, stepper: TorchStepper) -> torch.nn.Module:
        return stepper.model.module

    def hooks(self, stepper: TorchStepper, inject_overflow: bool) -> list:
        handles = self.watch_compute(stepper) if stepper.steps == 0 else []
        if inject_overflow and self.rank == self.world - 1:  # the injected inf, then the check
            handles.append(self.head(stepper).weight.register_hook(with_inf))
        # tensor hooks run in the order they were added, and before DeepSpeed's own hooks reduce
        # the gradient (they run after it is accumulated): whether this rank's gradient was finite
        self.seen = []
        handles += [p.register_hook(lambda g: self.seen.append(bool(torch.isfinite(g).all())))
                    for p in stepper.model.module.parameters() if p.requires_grad]
        return handles

    def zero_grad(self, stepper: TorchStepper) -> None:
        """Nothing: the engine's step zeroes the gradients itself."""

    def update(self, stepper: TorchStepper, loss: torch.Tensor, inject_overflow: bool,
               handles: list) -> tuple[float, float | None, bool]:
        model = stepper.model
        skipped_before = model.skipped_steps
        # the loss scale this step's backward uses (fp16 only; DeepSpeed's ``cur_scale``)
        scale = float(stepper.optimizer.loss_scale) if stepper.config.precision == "fp16" else None
        model.backward(loss)  # scales the loss (fp16), reduces the gradients in buckets
        for h in handles:
            h.remove()
        self.local_finite.append(all(self.seen))
        model.step()  # all-reduces the overflow flag; updates the fp32 partition; all-gathers
        skipped = model.skipped_steps > skipped_before
        norm = model.get_global_grad_norm()
        return (math.inf if skipped or norm is None else float(norm)), scale, bool(skipped)

    def memory(self, stepper: TorchStepper) -> MemoryReport:
        """This rank's bytes, read from DeepSpeed's buffers: the 16-bit working weights (all of
        them), the fp32 master partition, and the optimizer states (for the partition only)."""
        opt = stepper.optimizer
        state = [v for s in opt.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
        out = {"parameter_bytes": _nbytes(stepper.model.module.parameters()),
               "master_weight_bytes": _nbytes(getattr(opt, "single_partition_of_fp32_groups", [])),
               "optimizer_state_bytes": _nbytes(state)}
        return self.with_cuda_peak(stepper, out)

    def sharding(self, stepper: TorchStepper) -> list[dict]:
        """Each parameter as the engine holds it: full shape on every rank (ZeRO 1/2 shard the
        fp32 master copy and the optimizer states, not the working weights), in bf16/fp16."""
        return [{"name": n, "shape": list(p.shape), "local_shape": list(p.shape), "dtype": dtype_name(p.dtype)}
                for n, p in stepper.model.module.named_parameters()]

    def extra(self, stepper: TorchStepper) -> dict:
        out = super().extra(stepper)
        out.update(engine="deepspeed",
                   zero_stage=self.ds_config["zero_optimization"]["stage"], ds_config=self.ds_config,
                   communication_data_type=dtype_name(stepper.model.communication_data_type))
        return out
