"""How the one `labkit.train.torch.stepper.TorchStepper` holds its model and applies an update.

`Engine` is one device, and the base of the per-process engines (`labkit.train.torch.parallel`:
DDP, FSDP2; `labkit.train.torch.deepspeed_engine`: DeepSpeed ZeRO), which change only what differs.

>>> from labkit.train import RunConfig
>>> make_scaler(RunConfig("torch", "fp16"), "cpu").get_scale(), make_scaler(RunConfig("torch", "bf16"), "cpu")
(65536.0, None)
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from labkit.memory import MemoryReport
from labkit.train.config import TORCH_OPTIMIZERS, RunConfig
from labkit.train.loop import StepOut

if TYPE_CHECKING:
    from labkit.train.torch.stepper import TorchStepper


def make_optimizer(config: RunConfig, parameters, fused: bool) -> torch.optim.Optimizer:
    """Adam without weight decay, or SGD, at ``config.lr``; the `TORCH_OPTIMIZERS` (``adam-sr``,
    ``adam-8bit`` ...) from their libraries (`labkit.train.torch.optimizers.make`, imported only
    for them: an ImportError naming ``labkit[lowp]`` if the library is missing).

    The fused Adam kernel updates every tensor in one pass: on this course's 2-core CPU it cut
    Adam's step for the 4.3M-parameter MLP from 11.7 ms to 1.4 ms, which is what lets bf16's
    faster matmuls show in the step time (2.4x -> 3.3x over fp32).
    """
    if config.optimizer in TORCH_OPTIMIZERS:
        from labkit.train.torch import optimizers  # torchao / optimi / bitsandbytes only when asked for

        return optimizers.make(config.optimizer, parameters, config.lr, seed=config.seed)
    parameters = list(parameters)
    if config.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=config.lr, weight_decay=0.0, fused=fused)
    return torch.optim.SGD(parameters, lr=config.lr)


def make_scaler(config: RunConfig, device_type: str, scaler_class=None):
    """fp16's loss scaler (``torch.amp.GradScaler`` unless `scaler_class` says otherwise),
    starting at ``config.init_scale`` if given; None for the other precisions."""
    if config.precision != "fp16":
        return None
    kwargs = {} if config.init_scale is None else {"init_scale": float(config.init_scale)}
    return (scaler_class or torch.amp.GradScaler)(device_type, **kwargs)


# -- the engine: what one device does; DDP, FSDP2 and DeepSpeed change some of it -------------
class Engine:
    """How `TorchStepper` holds its model and applies an update: on one device, as it is.

    The per-process engines (`labkit.train.torch.parallel.DDP` and ``FSDP2``,
    `labkit.train.torch.deepspeed_engine.DeepSpeedZero`) subclass it and change only what
    differs: how the model is wrapped, which slice of a batch this rank takes, where an injected
    overflow goes, how the loss of the global batch is read, what is recorded. The step itself
    (`TorchStepper.step`) is written once.
    """

    rank, world = 0, 1
    autocast = True  # the stepper's autocast applies (FSDP2 and DeepSpeed cast the model themselves)
    deterministic = True  # deterministic kernels on a CPU (a per-process run leaves the flag as it is)
    replays = True  # nonfinite_layer replays the forward pass on the batch that overflowed
    shard_note = ""  # how nonfinite_layer qualifies a parameter (a rank's shard)

    def setup(self, stepper: "TorchStepper", model: torch.nn.Module) -> None:
        """Put `model` (fp32, on the CPU) on the device and give `stepper` its model, optimizer, scaler."""
        device = stepper.torch_device
        stepper.model = self.place(stepper, model)
        stepper.optimizer = make_optimizer(stepper.config, stepper.model.parameters(),
                                           fused=device.type in ("cpu", "cuda"))
        stepper.scaler = make_scaler(stepper.config, device.type)

    def place(self, stepper: "TorchStepper", model: torch.nn.Module) -> torch.nn.Module:
        """`model` on the stepper's device, in bf16 for pure bf16; the inputs' dtype to match; for the
        fp8 / MX precisions, its linear layers swapped for torchao's (`labkit.train.torch.fp8.convert`)
        and a `ScaleRecorder` on ``stepper.fp8``."""
        from labkit.train.torch import fp8

        model = model.to(stepper.torch_device)
        if stepper.pure:
            model.to(torch.bfloat16)  # pure bf16: no fp32 copy of anything
        stepper.input_dtype = torch.bfloat16 if stepper.pure else None
        if stepper.config.precision in fp8.RECIPES:  # before the optimizer: the same fp32 Parameters, swapped layers
            stepper.fp8 = fp8.ScaleRecorder(model, fp8.convert(model, stepper.config.precision, stepper.torch_device))
        return model

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The part of the global batch this process trains on (here: all of it)."""
        return x, y

    def hooks(self, stepper: "TorchStepper", inject_overflow: bool) -> list:
        """Hooks to install before the forward pass (removed after the backward pass)."""
        return []

    def recording(self, stepper: "TorchStepper"):
        """A context around forward, backward and update (a per-process run profiles one step)."""
        return contextlib.nullcontext()

    def zero_grad(self, stepper: "TorchStepper") -> None:
        stepper.optimizer.zero_grad(set_to_none=True)

    def update(self, stepper: "TorchStepper", loss: torch.Tensor, inject_overflow: bool,
               handles: list) -> tuple[float, float | None, bool]:
        """(Scaled) backward, unscale, clip, step, update: ``(grad norm, scale used, skipped)``."""
        scaler, optimizer = stepper.scaler, stepper.optimizer
        (scaler.scale(loss) if scaler is not None else loss).backward()
        for h in handles:
            h.remove()
        self.after_backward(stepper, inject_overflow)
        if scaler is not None:
            scaler.unscale_(optimizer)  # grads / scale; records found_inf (ShardedGradScaler: all-reduces it)
        norm = stepper.grad_norm()
        scale = None
        if scaler is not None:
            scale = scaler.get_scale()  # the scale this backward used
            scaler.step(optimizer)  # skips optimizer.step() if found_inf
            scaler.update()  # backoff on found_inf: a smaller scale means skipped
            skipped = scaler.get_scale() < scale
        elif math.isfinite(float(loss.detach())):  # waits for the forward and backward
            optimizer.step()
            skipped = False
        else:
            skipped = True  # the run stops here; keep the weights that overflowed
        return norm, scale, bool(skipped)

    def after_backward(self, stepper: "TorchStepper", inject_overflow: bool) -> None:
        """Make one gradient entry inf, as an fp16 overflow in the backward pass would."""
        if inject_overflow:
            with torch.no_grad():
                first = next(p for p in stepper.model.parameters() if p.grad is not None)
                first.grad.view(-1)[0] = math.inf

    def finish(self, stepper: "TorchStepper", loss: torch.Tensor, out: StepOut) -> StepOut:
        """The step's result as the log records it (a per-process run: the global batch's loss)."""
        return out

    def after_evaluate(self, stepper: "TorchStepper") -> None:
        """Called after an evaluation's forward pass (FSDP2 reshards its root)."""

    def memory(self, stepper: "TorchStepper") -> MemoryReport | None:
        """This process's bytes, where the engine reads them itself; None: `measure_memory`."""
        return None

    def extra(self, stepper: "TorchStepper") -> dict:
        """What the run adds to RunResult.extra."""
        return {}


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of `t` this rank holds (a DTensor's shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t
