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
"""

from __future__ import annotations

import contextlib
import importlib.util
import math

import numpy as np
import torch
import torch.nn.functional as F

from labkit.hardware import detect_cpu
from labkit.train import models
from labkit.train.config import RunConfig
from labkit.train.data import Dataset
from labkit.train.loop import StepOut
from labkit.train.torch.models import build

COMPUTE_DTYPES = {"fp32": None, "tf32": None, "fp16": torch.float16, "bf16": torch.bfloat16,
                  "bf16-pure": torch.bfloat16}


def make_stepper(config: RunConfig, data: Dataset) -> "TorchStepper":
    """Build model, optimizer and scaler for `config`; refuse before any work what cannot run here."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "torch":
        raise ValueError(f"the torch runner runs framework='torch', got {config.framework!r}")
    device, description = resolve_device(config.device)
    check_precision(config.precision, device)
    return TorchStepper(config, data, device, description)


# -- devices ---------------------------------------------------------------------------
def resolve_device(requested: str) -> tuple[torch.device, str]:
    """The torch.device for a RunConfig device name, and a description of it.

    "auto" takes CUDA if ``torch.cuda.is_available()``, else an XLA device (a TPU through
    ``torch_xla``) if ``torch_xla`` is installed, else the CPU.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "tpu" if _has_torch_xla() else "cpu"
    if requested == "cpu":
        return torch.device("cpu"), describe_cpu()
    if requested in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} asked for, but torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                             "use device='cpu' or 'auto'")
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        return torch.device("cuda", index), (f"cuda:{index} ({name}, compute capability {major}.{minor}, "
                                             f"torch {torch.__version__}, CUDA {torch.version.cuda})")
    if requested == "tpu":
        if not _has_torch_xla():
            raise ValueError("device 'tpu' needs torch_xla (pip install torch_xla on a TPU VM); "
                             "it is not installed here. Use device='cpu' or 'auto'")
        import torch_xla

        device = torch_xla.device() if hasattr(torch_xla, "device") else _xla_model().xla_device()
        kind = _xla_model().xla_device_hw(device)
        return device, f"xla ({kind}, torch {torch.__version__}, torch_xla {torch_xla.__version__})"
    raise ValueError(f"unknown device {requested!r}; choose one of auto, cpu, cuda, gpu, tpu")


def check_precision(precision: str, device: torch.device) -> None:
    """Raise ValueError if `precision` cannot run natively on `device`."""
    if device.type == "cuda" and precision in ("bf16", "bf16-pure"):
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(f"{precision} needs a GPU with native bf16 (compute capability >= 8.0, "
                             f"Ampere or newer); {torch.cuda.get_device_name(device)} is {major}.{minor}. "
                             "Use precision='fp16' (with loss scaling) or 'fp32'")
    if device.type == "xla" and precision == "fp16":
        raise ValueError("fp16 is not a TPU format (the MXU multiplies in bf16); use precision='bf16'")


def _has_torch_xla() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def _xla_model():
    import torch_xla.core.xla_model as xm

    return xm


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


def make_optimizer(config: RunConfig, parameters, fused: bool) -> torch.optim.Optimizer:
    """Adam without weight decay, or SGD, at ``config.lr``.

    The fused Adam kernel updates every tensor in one pass: on this course's 2-core CPU it cut
    Adam's step for the 4.3M-parameter MLP from 11.7 ms to 1.4 ms, which is what lets bf16's
    faster matmuls show in the step time (2.4x -> 3.3x over fp32).
    """
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


def describe_cpu() -> str:
    cpu = detect_cpu()
    bf16, fp16 = sorted(cpu.bf16_instructions), sorted(cpu.fp16_instructions)
    capped = f"; instruction set capped: {cpu.caps_text}" if cpu.isa_caps else ""
    return (f"cpu ({cpu.model}, {torch.get_num_threads()} threads, native bf16: {', '.join(bf16) or 'no'}, "
            f"native fp16: {', '.join(fp16) or 'no'}{capped}; torch {torch.__version__}; TF32 is a GPU format: "
            "tf32 runs as fp32 here)")


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
    """One model, optimizer and (for fp16) GradScaler; see the module docstring."""

    def __init__(self, config: RunConfig, data: Dataset, device: torch.device, description: str):
        self.config = config
        self.device = description
        self.torch_device = device
        self.compute_dtype = COMPUTE_DTYPES[config.precision]
        self.pure = config.precision == "bf16-pure"
        params = models.init_params(config.model, seed=config.seed, width=config.width)
        self.model = build(config.model, params).to(device)
        if self.pure:
            self.model.to(torch.bfloat16)  # pure bf16: no fp32 copy of anything
        self.optimizer = make_optimizer(config, self.model.parameters(), fused=device.type in ("cpu", "cuda"))
        self.scaler = make_scaler(config, device.type)
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
        exact = deterministic(True) if self.torch_device.type == "cpu" else contextlib.nullcontext()
        with matmul_precision(precision), exact:
            yield

    def _autocast(self):
        if self.compute_dtype is None or self.pure:
            return contextlib.nullcontext()
        return torch.amp.autocast(self.torch_device.type, dtype=self.compute_dtype)

    def _inputs(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_tensors(self.config, x, y, self.torch_device, torch.bfloat16 if self.pure else None)

    def _loss(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            logits = self.model(xb)
            # autocast runs cross_entropy in fp32 by itself; pure bf16 casts the logits
            return F.cross_entropy(logits.float() if self.pure else logits, yb)

    def _grad_norm(self) -> torch.Tensor:
        """Global norm of the (unscaled) gradients before clipping; clips if config.clip_norm."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.config.clip_norm is None:
            return torch.nn.utils.get_total_norm(grads)
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)

    def _inject_overflow(self) -> None:
        """Make one gradient entry inf, as an fp16 overflow in the backward pass would."""
        with torch.no_grad():
            first = next(p for p in self.model.parameters() if p.grad is not None)
            first.grad.view(-1)[0] = math.inf

    def _sync(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.torch_device.type == "xla":
            import torch_xla

            xm = _xla_model()
            if hasattr(torch_xla, "sync"):  # run the traced graph (older torch_xla: mark_step)
                torch_xla.sync()
            else:
                xm.mark_step()
            xm.wait_device_ops()

    # the Stepper protocol --------------------------------------------------------------
    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        """One optimizer step: forward, (scaled) backward, unscale, clip, step, update."""
        with self._flags():
            xb, yb = self._inputs(x, y)
            self._last_batch = (xb, yb)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self._loss(xb, yb)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            if inject_overflow:
                self._inject_overflow()
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # grads / scale; records found_inf
            norm = self._grad_norm()
            loss_value = float(loss.detach())  # waits for the forward and backward
            scale = None
            if self.scaler is not None:
                scale = self.scaler.get_scale()  # the scale this backward used
                self.scaler.step(self.optimizer)  # skips optimizer.step() if found_inf
                self.scaler.update()  # backoff on found_inf: a smaller scale means skipped
                skipped = self.scaler.get_scale() < scale
            elif math.isfinite(loss_value):
                self.optimizer.step()
                skipped = False
            else:
                skipped = True  # the run stops here; keep the weights that overflowed
            if not math.isfinite(loss_value):
                self._bad_batch = (xb, yb)
            self._sync()
            return StepOut(loss=loss_value, grad_norm=float(norm), scale=scale, skipped=bool(skipped))

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accuracy on (x, y), computed in the run's precision."""
        with self._flags(), torch.no_grad():
            xb, yb = self._inputs(x, y)
            with self._autocast():
                pred = self.model(xb).argmax(dim=-1)
            return float((pred == yb).float().mean())

    def nonfinite_layer(self) -> str | None:
        """After a non-finite loss: the first parameter, or else the first module (in the order
        the forward pass runs them) whose output is inf/NaN on the batch that overflowed."""
        if self._bad_batch is None:
            return None
        for name, p in self.model.named_parameters():
            if not bool(torch.isfinite(p).all()):
                return f"parameter {name}"
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

    def memory(self) -> dict:
        """Bytes measured from the real tensors (see `measure_memory`)."""
        with self._flags():
            out = measure_memory(self.model, self.optimizer, self._last_batch, self._loss)
        if self.torch_device.type == "cuda":
            out["cuda_max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.torch_device))
        return out


def _storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return int(sum(seen.values()))


def measure_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, loss_fn) -> dict:
    """What a training step holds, in bytes, counted from the tensors themselves.

    * ``parameter_bytes`` -- the weights (fp32 under autocast: they are the master weights;
      bf16 after ``model.to(torch.bfloat16)``);
    * ``gradient_bytes`` -- ``p.grad`` (same dtype as the weights);
    * ``optimizer_state_bytes`` -- everything in ``optimizer.state`` (Adam: ``exp_avg``,
      ``exp_avg_sq`` and a ``step`` counter per tensor; plain SGD: nothing);
    * ``saved_activation_bytes`` -- what autograd keeps from one forward pass on `batch`
      for the backward pass (found with ``torch.autograd.graph.saved_tensors_hooks``,
      counted once per storage): the activations. This is the part that autocast halves.
    * ``saved_weight_copy_bytes`` -- also kept for the backward pass: the fp16/bf16 copies
      of the weights that autocast made for the matmuls (a saved tensor whose autograd
      history leads, through casts and views only, to a parameter). Zero in fp32 and in
      pure bf16, where the saved weight *is* the parameter and is already counted.
    """
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out = {
        "parameter_bytes": _storage_bytes(params),
        "gradient_bytes": _storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": _storage_bytes(state),
    }
    if batch is not None:
        own = {p.untyped_storage().data_ptr() for p in params}
        saved = {"saved_activation_bytes": {}, "saved_weight_copy_bytes": {}}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in own:
                kind = "saved_weight_copy_bytes" if _copy_of_parameter(t) else "saved_activation_bytes"
                saved[kind][s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            loss = loss_fn(*batch)
        del loss
        out.update({kind: int(sum(sizes.values())) for kind, sizes in saved.items()})
    return out


# autograd nodes that only cast or re-view a tensor: a weight seen through these is a copy
_CAST_OR_VIEW = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0", "UnsafeViewBackward0",
                 "PermuteBackward0", "ExpandBackward0", "AliasBackward0", "UnsqueezeBackward0",
                 "SqueezeBackward0", "SqueezeBackward1"}


def _copy_of_parameter(t: torch.Tensor) -> bool:
    """Is `t` a parameter seen through casts and views only (ToCopy, T, View ... -> the leaf)?"""
    fn = t.grad_fn
    while fn is not None and fn.name() in _CAST_OR_VIEW:
        parents = [f for f, _ in fn.next_functions if f is not None]
        if len(parents) != 1:
            return False
        fn = parents[0]
    return fn is not None and t.grad_fn is not fn and hasattr(fn, "variable")  # AccumulateGrad of a leaf
