"""What to run: one frozen `RunConfig`, checked before any work starts.

Precisions mean the same thing in every framework:

=============  ==========================  ==============  ==================
precision      compute (matmuls, activ.)   weights kept    loss scaling
=============  ==========================  ==============  ==================
``fp32``       fp32 (TF32 off)             fp32            none
``tf32``       fp32, matmuls in TF32       fp32            none
``fp16``       fp16                        fp32 master     dynamic, the
                                                           framework's own
``bf16``       bf16                        fp32 master     none
``bf16-pure``  bf16                        bf16 only       none
=============  ==========================  ==============  ==================

``bf16-pure`` is what ``model.to(torch.bfloat16)`` gives: there is no fp32 copy, so an
update smaller than half a bf16 ulp of the weight is rounded away.

>>> RunConfig("torch", "bf16", steps=20).precision
'bf16'
>>> RunConfig("torch", "fp8")
Traceback (most recent call last):
...
ValueError: unknown precision 'fp8'; choose one of fp32, tf32, fp16, bf16, bf16-pure
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

FRAMEWORKS = ("torch", "jax", "tf")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "bf16-pure")
MODELS = ("mlp", "transformer")
DATASETS = ("digits", "synthetic")
OPTIMIZERS = ("adam", "sgd")
PARALLEL = ("dp", "fsdp", "zero1", "zero2")
ZERO_PRECISIONS = ("fp32", "bf16", "fp16")  # what DeepSpeed's engine offers (no tf32 / pure-bf16 mode here)
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda", "gpu", "tpu")


def _choice(field: str, value, allowed) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"unknown {field} {value!r}; choose one of {', '.join(allowed)}")


def _positive_int(field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{field} must be a whole number, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{field} must be at least 1, got {value}")


@dataclass(frozen=True)
class RunConfig:
    """One training run.

    Args:
      framework: "torch" | "jax" | "tf".
      precision: "fp32" | "tf32" | "fp16" | "bf16" | "bf16-pure" (see the module docstring).
      model: "mlp" (64 -> width -> width -> 10) or "transformer" (the 8x8 digit as a
        sequence of 64 pixel tokens: embedding, LayerNorm, softmax attention, MLP).
      dataset: "digits" (scikit-learn's 8x8 handwritten digits, shipped with the package)
        or "synthetic" (random inputs and labels of the same shapes, for throughput).
      steps: optimizer steps (each one batch).
      batch_size, lr, seed: as usual; the same seed gives the same initial weights and
        batch order in every framework.
      device: "auto" (the best accelerator present, else the CPU), "cpu", "cuda"/"gpu", "tpu".
      optimizer: "adam" (AdamW without weight decay) or "sgd".
      clip_norm: clip the global gradient norm to this (None: no clipping). Clipping
        happens on the unscaled gradients, as GradScaler's ``unscale_`` order requires.
      width: hidden width of the MLP / model width of the transformer (None: default).
      init_scale: the initial loss scale for fp16 (None: the framework's default).
      inject_overflow: steps (0-based) at which one gradient is set to inf, to watch the
        scaler skip the step and back off. fp16 only -- and bf16 under DeepSpeed (zero1/zero2),
        whose bf16 optimizer also checks for overflow and skips the step.
      devices: how many devices (or, for PyTorch, processes) share each step; > 1 runs the
        framework's own distributed engine (labkit.distributed): torch DDP / FSDP2 under torchrun
        (gloo on CPUs, nccl on GPUs), a jax.sharding mesh (virtual CPU devices here), a
        tf.distribute strategy. The batch is the global batch, split across devices.
      parallel: "dp" (every device holds all parameters; gradients are all-reduced),
        "fsdp" (parameters, gradients and optimizer states sharded across devices), or
        "zero1" / "zero2" (PyTorch with DeepSpeed's ZeRO stage 1 / 2: fp32 master weights and
        optimizer states -- stage 2: also gradients -- sharded; needs ``labkit[deepspeed]``).
      reduce_dtype: the dtype gradients are reduced in across devices (None: the
        framework's default for the precision): "fp32", "bf16", "fp16".
      out: a path; every finished step is appended to it as a JSON line as the run goes.
      progress: show a tqdm progress bar (tqdm.auto: a widget in notebooks, text in terminals).
    """

    framework: str
    precision: str = "fp32"
    model: str = "mlp"
    dataset: str = "digits"
    steps: int = 100
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    device: str = "auto"
    optimizer: str = "adam"
    clip_norm: float | None = 1.0
    width: int | None = None
    init_scale: float | None = None
    inject_overflow: tuple[int, ...] = ()
    devices: int = 1
    parallel: str = "dp"
    reduce_dtype: str | None = None
    out: str | None = None
    progress: bool = True

    def __post_init__(self):
        _choice("framework", self.framework, FRAMEWORKS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("model", self.model, MODELS)
        _choice("dataset", self.dataset, DATASETS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("device", self.device, DEVICES)
        _positive_int("steps", self.steps)
        _positive_int("batch_size", self.batch_size)
        _positive_int("devices", self.devices)
        _choice("parallel", self.parallel, PARALLEL)
        if self.reduce_dtype is not None:
            _choice("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        if self.batch_size % self.devices:
            raise ValueError(f"batch_size {self.batch_size} must divide evenly over {self.devices} devices")
        if self.width is not None:
            _positive_int("width", self.width)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, got {self.seed!r}")
        for field in ("lr", "clip_norm", "init_scale"):
            value = getattr(self, field)
            if value is None and field != "lr":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{field} must be a number, got {type(value).__name__} {value!r}")
            if not value > 0 or value == float("inf"):
                raise ValueError(f"{field} must be a finite number > 0, got {value!r}")
        steps = tuple(self.inject_overflow)
        if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < self.steps for s in steps):
            raise ValueError(f"inject_overflow must list step numbers in 0 .. {self.steps - 1}, got {steps!r}")
        object.__setattr__(self, "inject_overflow", steps)
        zero = self.parallel.startswith("zero")
        if zero and self.framework != "torch":
            raise ValueError(f"parallel={self.parallel!r} is DeepSpeed ZeRO, which runs PyTorch models; "
                             f"for {self.framework} use parallel='dp' or 'fsdp'")
        if zero and self.devices < 2:
            raise ValueError(f"parallel={self.parallel!r} shards across processes: set devices >= 2")
        if zero and self.precision not in ZERO_PRECISIONS:
            raise ValueError(f"DeepSpeed's engine runs precision {', '.join(ZERO_PRECISIONS)}; "
                             f"got {self.precision!r}")
        if steps and not (self.precision == "fp16" or (zero and self.precision == "bf16")):
            raise ValueError("inject_overflow needs precision='fp16' (a loss scaler to skip steps), or 'bf16' "
                             "with parallel='zero1'/'zero2' (DeepSpeed's bf16 optimizer also skips on overflow)")

    def replace(self, **changes) -> "RunConfig":
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["inject_overflow"] = list(self.inject_overflow)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown RunConfig fields {sorted(unknown)}; known: {', '.join(sorted(known))}")
        d = dict(d)
        d["inject_overflow"] = tuple(d.get("inject_overflow", ()))
        return cls(**d)
