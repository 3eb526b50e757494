"""PyTorch runs: the `Stepper` that `labkit.train.run` drives for ``framework="torch"``.

Each precision is a few lines of standard PyTorch (compare nanoGPT's ``train.py``)::

    fp32       torch.set_float32_matmul_precision("highest")     # TF32 off
    tf32       torch.set_float32_matmul_precision("high")        # TF32 matmuls (Ampere+ GPUs)
    fp16       with torch.amp.autocast(dev, dtype=torch.float16): loss = ...
               scaler = torch.amp.GradScaler(dev)               # fp32 weights, dynamic scaling
               scaler.scale(loss).backward()
               scaler.unscale_(opt)                              # clip the *unscaled* grads
               torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
               scaler.step(opt)                                  # skipped if a grad is inf/nan
               scaler.update()                                   # halve on overflow, else grow
    bf16       with torch.amp.autocast(dev, dtype=torch.bfloat16): loss = ...
               loss.backward(); clip; opt.step()                 # fp32 weights, no scaler
    bf16-pure  model.to(torch.bfloat16); inputs in bf16; the optimizer over bf16 weights
               (Adam's moments are bf16 too); the logits go to fp32 for the loss only.
    fp8-*,     the model's nn.Linear layers swapped for torchao's Float8Linear / MXFP8Linear
    mxfp8      (`labkit.train.torch.fp8.convert`); fp32 weights, no autocast; each step's scales
               recorded (`labkit.train.torch.fp8.ScaleRecorder`) into RunResult.extra["fp8"].

Autocast keeps the weights in fp32 and casts them to fp16/bf16 on the fly for the ops on
its lower-precision list (``linear``, ``matmul``, ...): the fp32 weights *are* the master
weights, and ``optimizer.step`` updates them in fp32. ``model.to(torch.bfloat16)`` has no
fp32 copy at all, which is why small updates are rounded away
(`labkit.train.torch.lessons.stalled_updates`).

Global state. The matmul precision (and, on a CPU, ``torch.use_deterministic_algorithms``)
is set around every call into the stepper and restored on the way out, so a run leaks
nothing into the learner's session, even when it fails. Nothing in a run draws from
torch's random generator (weights come from `labkit.train.models.init_params`, batches
from numpy), so seeded runs are reproducible without touching ``torch.manual_seed``.

A step whose loss is not finite ends the run (the shared loop stops on it); its update
is not applied, so that `TorchStepper.nonfinite_layer` can replay the forward pass on the
very weights that overflowed and name the first module whose output is inf/NaN.

One stepper, several engines. `TorchStepper.step` is written once; its `Engine` says how the
model is held and the update applied. The default is one device; `labkit.train.torch.worker`
gives each ``torchrun`` process DDP or FSDP2 (`labkit.train.torch.parallel`) or DeepSpeed ZeRO
(`labkit.train.torch.deepspeed_engine`), which change only the pieces that differ (the rank's
slice of the batch, the wrapped model, the global loss, the records of a distributed run).

>>> from labkit.train import RunConfig, data
>>> cfg = RunConfig("torch", "bf16-pure", width=16, progress=False)
>>> stepper = make_stepper(cfg, data.load(cfg.dataset, seed=0))
>>> w = stepper.params()
>>> w["dense1/kernel"].shape, w["dense1/kernel"].dtype
((64, 16), dtype('float32'))
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

from labkit.memory import MemoryReport
from labkit.train import models
from labkit.train.config import TORCH_PRECISIONS, RunConfig
from labkit.train.data import Dataset
from labkit.train.loop import StepOut
from labkit.train.torch import fp8
from labkit.train.torch.devices import check_precision, resolve_device, xla_model
from labkit.train.torch.engine import Engine, local
from labkit.train.torch.memory import measure_memory
from labkit.train.torch.models import build, module_params

COMPUTE_DTYPES = {"fp32": None, "tf32": None, "fp16": torch.float16, "bf16": torch.bfloat16,
                  "bf16-pure": torch.bfloat16,
                  # torchao's fp8 / MX layers cast their own operands; the rest of the model runs in fp32,
                  # without autocast (labkit.train.torch.fp8 says why)
                  **dict.fromkeys(TORCH_PRECISIONS)}


def make_stepper(config: RunConfig, data: Dataset) -> "TorchStepper":
    """Build model, optimizer and scaler for `config`; refuse before any work what cannot run here."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "torch":
        raise ValueError(f"the torch runner runs framework='torch', got {config.framework!r}")
    device, description = resolve_device(config.device)
    check_precision(config.precision, device)
    if config.precision in TORCH_PRECISIONS:
        fp8.check_sizes(config, device)
        if device.type == "cpu":
            description += "; fp8 emulated on CPU by torchao (fp8 values, fp32 matmuls): right in value, not in speed"
    return TorchStepper(config, data, device, description)


def batch_tensors(config: RunConfig, x: np.ndarray, y: np.ndarray, device: torch.device,
                  dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as the model takes it: the transformer's pixel tokens (int64) or the MLP's float32
    features, cast to `dtype` if given (a model held in bf16 needs bf16 inputs); int64 labels."""
    if config.model == "transformer":
        xb = torch.from_numpy(Dataset.tokens(x)).long()
    else:
        xb = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if dtype is not None:
            xb = xb.to(dtype)
    return xb.to(device), torch.from_numpy(np.asarray(y)).long().to(device)


# -- global flags, set around each call and restored -------------------------------------
@contextlib.contextmanager
def matmul_precision(value: str):
    """Set torch's fp32 matmul precision ("highest" | "high") for a block, then restore it.

    Uses the ``torch.set_float32_matmul_precision`` API (which also sets
    ``torch.backends.cuda.matmul.allow_tf32``). If the learner has set the per-backend API
    (``torch.backends.cuda.matmul.fp32_precision``), torch refuses to read the old one; then
    the per-backend values are saved and restored instead, never mixing the two.
    """
    try:
        old = torch.get_float32_matmul_precision()
    except RuntimeError:  # the learner uses the per-backend API
        backends = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)
        saved = [b.fp32_precision for b in backends]
        for b in backends:
            b.fp32_precision = "ieee" if value == "highest" else "tf32"
        try:
            yield
        finally:
            for b, v in zip(backends, saved):
                b.fp32_precision = v
        return
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@contextlib.contextmanager
def deterministic(enabled: bool):
    """``torch.use_deterministic_algorithms(enabled)`` for a block, then restore both flags."""
    old, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=warn_only)


# -- the stepper -----------------------------------------------------------------------
class TorchStepper:
    """One model, optimizer and (for fp16) GradScaler; see the module docstring.

    `engine` (default: one device, `Engine`) says how the model is held and the update applied:
    `labkit.train.torch.worker` passes DDP, FSDP2 or DeepSpeed ZeRO there, one per process.
    """

    def __init__(self, config: RunConfig, data: Dataset | None, device: torch.device, description: str,
                 engine: Engine | None = None):
        self.config = config
        self.device = description
        self.torch_device = device
        self.engine = engine if engine is not None else Engine()
        self.compute_dtype = COMPUTE_DTYPES[config.precision]
        self.pure = config.precision == "bf16-pure"
        self.fp8: fp8.ScaleRecorder | None = None  # an fp8 / MX run's scales (Engine.place converts the model)
        params = models.init_params(config.model, seed=config.seed, width=config.width)
        self.engine.setup(self, build(config.model, params))
        self.steps = 0  # steps taken
        self._last_batch = None  # the latest (x, y), for memory()
        self._bad_batch = None  # the batch whose loss was not finite, for nonfinite_layer()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    # the pieces of a step ------------------------------------------------------------
    @contextlib.contextmanager
    def _flags(self):
        precision = "high" if self.config.precision == "tf32" else "highest"
        # deterministic kernels cost nothing for these ops on a CPU; on CUDA they would need
        # CUBLAS_WORKSPACE_CONFIG, so there the learner's own setting is left as it is
        exact = (deterministic(True) if self.torch_device.type == "cpu" and self.engine.deterministic
                 else contextlib.nullcontext())
        with matmul_precision(precision), exact:
            yield

    def _autocasting(self) -> bool:
        return self.compute_dtype is not None and not self.pure and self.engine.autocast

    def _autocast(self):
        if not self._autocasting():
            return contextlib.nullcontext()
        return torch.amp.autocast(self.torch_device.type, dtype=self.compute_dtype)

    def _inputs(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_tensors(self.config, x, y, self.torch_device, self.input_dtype)

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            logits = self.model(xb)
            # autocast runs cross_entropy in fp32 by itself; without it the logits go to fp32
            return F.cross_entropy(logits if self._autocasting() else logits.float(), yb)

    def grad_norm(self) -> float:
        """Global norm of the (unscaled) gradients before clipping; clips if config.clip_norm."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.config.clip_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.clip_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _sync(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.torch_device.type == "xla":
            import torch_xla

            xm = xla_model()
            if hasattr(torch_xla, "sync"):  # run the traced graph (older torch_xla: mark_step)
                torch_xla.sync()
            else:
                xm.mark_step()
            xm.wait_device_ops()

    # the Stepper protocol --------------------------------------------------------------
    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        """One optimizer step: forward, (scaled) backward, unscale, clip, step, update."""
        with self._flags():
            xb, yb = self._inputs(*self.engine.batch(x, y))
            self._last_batch = (xb, yb)
            handles = self.engine.hooks(self, inject_overflow)
            scales = self.fp8.recording() if self.fp8 is not None else contextlib.nullcontext()
            with self.engine.recording(self), scales:
                self.engine.zero_grad(self)
                loss = self._loss(xb, yb)
                norm, scale, skipped = self.engine.update(self, loss, inject_overflow, handles)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                self._bad_batch = (xb, yb)
            out = self.engine.finish(self, loss, StepOut(loss=loss_value, grad_norm=norm, scale=scale,
                                                         skipped=skipped))
            self._sync()
            self.steps += 1
            return out

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accuracy on (x, y), computed in the run's precision."""
        with self._flags(), torch.no_grad():
            xb, yb = self._inputs(x, y)
            with self._autocast():
                pred = self.model(xb).argmax(dim=-1)
            self.engine.after_evaluate(self)
            return float((pred == yb).float().mean())

    def nonfinite_layer(self) -> str | None:
        """After a non-finite loss: the first parameter, or else the first module (in the order
        the forward pass runs them) whose output is inf/NaN on the batch that overflowed."""
        if self._bad_batch is None and self.engine.replays:
            return None
        for name, p in self.model.named_parameters():
            if not bool(torch.isfinite(local(p)).all()):
                return f"parameter {name}{self.engine.shard_note}"
        if not self.engine.replays:
            return None
        found: list[str] = []

        def hook(name, module, args, output):
            if not found and torch.is_tensor(output) and not bool(torch.isfinite(output).all()):
                found.append(f"{name} ({type(module).__name__} output)")

        handles = [m.register_forward_hook(lambda m, a, o, n=name: hook(n, m, a, o))
                   for name, m in self.model.named_modules() if name]
        try:
            with self._flags(), torch.no_grad():
                loss = self._loss(*self._bad_batch)
        finally:
            for h in handles:
                h.remove()
        if found:
            return found[0]
        return None if bool(torch.isfinite(loss)) else "loss (cross_entropy)"

    def params(self) -> dict[str, np.ndarray]:
        """The current weights under `labkit.train.models.init_params`' names, as stored (float32
        numpy arrays; bf16 values are exact in float32), kernels back in (fan_in, fan_out)."""
        return module_params(self.model)

    def extra(self) -> dict:
        """What the run adds to RunResult.extra (a per-process run: collectives, sharding, ranks;
        an fp8 / MX run: ``"fp8"``, the scales its casts used, `labkit.train.torch.fp8.ScaleRecorder`)."""
        extra = dict(self.engine.extra(self))
        if self.fp8 is not None:
            extra["fp8"] = self.fp8.to_dict()
        return extra

    def memory(self) -> MemoryReport:
        """Bytes measured from the real tensors (`labkit.train.torch.memory.measure_memory`)."""
        if (own := self.engine.memory(self)) is not None:  # a per-process engine reads its own
            return own
        with self._flags():
            return measure_memory(self.model, self.optimizer, self._last_batch, self._loss,
                                  self.torch_device)

