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

PyTorch alone, with ``labkit[lowp]`` (torchao), also runs the 8-bit recipes (`TORCH_PRECISIONS`):
``fp8-tensorwise``, ``fp8-rowwise`` and ``fp8-rowwise-gw-hp`` (torchao's
``convert_to_float8_training`` with that recipe) and ``mxfp8`` (torchao's MX training, blocks of
32 with an E8M0 scale). Their linear layers whose sizes are multiples of 16 (MX: 32) run their
matmuls on fp8 operands (the MLP's 10-wide head stays fp32); the weights stay fp32. On a CPU every
fp8 matmul is emulated: right in value, not in speed (`labkit.train.torch.fp8`).

The optimizers that make low precision work (`TORCH_OPTIMIZERS`, PyTorch with ``labkit[lowp]``):
``adam-sr`` (torchao's AdamW with stochastic rounding of bf16 weights), ``adam-kahan``
(torch-optimi's AdamW with Kahan-compensated summation), ``adam-8bit`` / ``adam-4bit``
(torchao's AdamW8bit / AdamW4bit: 8- and 4-bit optimizer states) and ``bnb-adam-8bit``
(bitsandbytes' AdamW8bit). Like ``adam``, none of them decays weights, and all take torch.optim.Adam's
betas and eps (`labkit.train.torch.optimizers`). Stochastic rounding and Kahan summation act on 16-bit
weights only, so under ``bf16-pure``; with the fp32 weights of every other precision they are Adam.

>>> RunConfig("torch", "bf16", steps=20).precision
'bf16'
>>> RunConfig("torch", "fp8")
Traceback (most recent call last):
...
ValueError: unknown precision 'fp8'; choose one of 'fp32', 'tf32', 'fp16', 'bf16', 'bf16-pure', 'fp8-tensorwise', 'fp8-rowwise', 'fp8-rowwise-gw-hp', 'mxfp8'
>>> RunConfig("jax", "mxfp8")
Traceback (most recent call last):
...
ValueError: precision 'mxfp8' runs in PyTorch only (torchao); for framework='jax' choose one of 'fp32', 'tf32', 'fp16', 'bf16', 'bf16-pure'
>>> RunConfig("tf", lr=10**400)
Traceback (most recent call last):
...
ValueError: lr must be a finite number > 0 and < 3.40282e+38; got an integer of 401 digits
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from labkit._validate import choice, integer, number, shown
from labkit.memory.shapes import MAX_BATCH_SIZE, MAX_WIDTH, MODELS, transformer_shape

FRAMEWORKS = ("torch", "jax", "tf")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "bf16-pure")
"""The precisions every framework runs."""
TORCH_PRECISIONS = ("fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp", "mxfp8")
"""PyTorch only, through torchao (``labkit[lowp]``): the fp8 and MX training recipes."""
DATASETS = ("digits", "synthetic")
OPTIMIZERS = ("adam", "sgd")
"""The optimizers every framework runs."""
TORCH_OPTIMIZERS = ("adam-sr", "adam-kahan", "adam-8bit", "adam-4bit", "bnb-adam-8bit")
"""PyTorch only, with ``labkit[lowp]`` (torchao, torch-optimi, bitsandbytes): see the module docstring."""
PARALLEL = ("dp", "fsdp", "zero1", "zero2")
ZERO_PRECISIONS = ("fp32", "bf16", "fp16")  # what DeepSpeed's engine offers (no tf32 / pure-bf16 mode here)
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda", "gpu", "tpu")


FLOAT32_MAX = float.fromhex("0x1.fffffeP127")  # 3.4e38: the frameworks hold lr and the loss scale in float32


def _positive(field: str, value, *, optional: bool = False) -> float | None:
    """A finite number > 0 that float32 can hold (None allowed if `optional`)."""
    if value is None and optional:
        return None
    return number(field, value, minimum=0, maximum=FLOAT32_MAX, inclusive=False)


def _steps(value, steps: int) -> tuple[int, ...]:
    """inject_overflow: a list of step numbers in 0 .. steps - 1 (a lone number is refused, not iterated)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise TypeError(f"inject_overflow must be a list of step numbers (0-based), e.g. (3,) or [3, 4]; "
                        f"got {type(value).__name__} {shown(value)}")
    return tuple(integer("inject_overflow step", s, minimum=0, maximum=steps - 1) for s in value)


@dataclass(frozen=True)
class RunConfig:
    """One training run.

    Args:
      framework: "torch" | "jax" | "tf".
      precision: "fp32" | "tf32" | "fp16" | "bf16" | "bf16-pure"; for PyTorch also
        `TORCH_PRECISIONS` (see the module docstring).
      model: "mlp" (64 -> width -> width -> 10) or "transformer" (the 8x8 digit as a
        sequence of 64 pixel tokens: embedding, LayerNorm, softmax attention, MLP).
      dataset: "digits" (scikit-learn's 8x8 handwritten digits, shipped with the package)
        or "synthetic" (random inputs and labels of the same shapes, for throughput).
      steps: optimizer steps (each one batch).
      batch_size, lr, seed: as usual (batch_size up to 2**20; lr, like init_scale, a finite
        number > 0 that float32 holds); the same seed gives the same initial weights and
        batch order in every framework.
      device: "auto" (the best accelerator present, else the CPU), "cpu", "cuda"/"gpu", "tpu".
      optimizer: "adam" (AdamW without weight decay) or "sgd"; for PyTorch also
        `TORCH_OPTIMIZERS` (see the module docstring).
      clip_norm: clip the global gradient norm to this (None: no clipping). Clipping
        happens on the unscaled gradients, as GradScaler's ``unscale_`` order requires.
      width: hidden width of the MLP / model width of the transformer (None: default; at most
        2**16; the transformer's a multiple of its 4 heads).
      init_scale: the initial loss scale for fp16 (None: the framework's default).
      inject_overflow: a list of steps (0-based), e.g. ``(3, 4)``, at which one gradient is
        set to inf, to watch the scaler skip the step and back off. fp16 only -- and bf16
        under DeepSpeed (zero1/zero2), whose bf16 optimizer also checks for overflow and
        skips the step.
      devices: how many devices (or, for PyTorch, processes) share each step; > 1 runs the
        framework's own distributed engine (labkit.train.launch): torch DDP / FSDP2 under torchrun
        (gloo on CPUs, nccl on GPUs), a jax.sharding mesh (virtual CPU devices here), a
        tf.distribute strategy. The batch is the global batch, split across devices.
      parallel: "dp" (every device holds all parameters; gradients are all-reduced),
        "fsdp" (parameters, gradients and optimizer states sharded across devices), or
        "zero1" / "zero2" (PyTorch with DeepSpeed's ZeRO stage 1 / 2: fp32 master weights and
        optimizer states -- stage 2: also gradients -- sharded; needs ``labkit[deepspeed]``).
      reduce_dtype: the dtype gradients are reduced in across devices (None: the
        framework's default for the precision): "fp32", "bf16", "fp16".
      out: a path (None: nothing written). The run checks it and writes the log's header
        there as it starts, before building the model; every finished step is then appended
        as a JSON line (see `labkit.train.result`). Missing folders are made.
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
        for field, allowed in (("framework", FRAMEWORKS), ("precision", PRECISIONS + TORCH_PRECISIONS),
                               ("model", MODELS), ("dataset", DATASETS), ("optimizer", OPTIMIZERS + TORCH_OPTIMIZERS),
                               ("device", DEVICES), ("parallel", PARALLEL)):
            choice(field, getattr(self, field), allowed)
        for field, portable in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS)):
            value = getattr(self, field)
            if self.framework != "torch" and value not in portable:
                raise ValueError(f"{field} {value!r} runs in PyTorch only (torchao); for "
                                 f"framework={self.framework!r} choose one of {', '.join(map(repr, portable))}")
        if self.reduce_dtype is not None:
            choice("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        values = {field: integer(field, getattr(self, field), minimum=1) for field in ("steps", "devices")}
        values["batch_size"] = integer("batch_size", self.batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
        values["seed"] = integer("seed", self.seed, minimum=0)
        if self.width is not None:
            values["width"] = integer("width", self.width, minimum=1, maximum=MAX_WIDTH)
            if self.model == "transformer":
                transformer_shape(self.width)  # its heads must divide it
        if values["batch_size"] % values["devices"]:
            raise ValueError(f"batch_size {self.batch_size} must divide evenly over {self.devices} devices")
        values.update(lr=_positive("lr", self.lr), clip_norm=_positive("clip_norm", self.clip_norm, optional=True),
                      init_scale=_positive("init_scale", self.init_scale, optional=True),
                      inject_overflow=_steps(self.inject_overflow, values["steps"]))
        if self.out is not None:  # only its type here: a log is loaded on machines where the path is not
            if not isinstance(self.out, (str, os.PathLike)) or not isinstance(os.fspath(self.out), str):
                raise TypeError(f"out must be None or a file path (str or os.PathLike); got "
                                f"{type(self.out).__name__} {shown(self.out)}")
            if not os.fspath(self.out).strip():
                raise ValueError(f"out must be None or a non-empty file path; got {self.out!r}")
            values["out"] = os.fspath(self.out)
        if not isinstance(self.progress, bool):
            raise TypeError(f"progress must be True or False; got {type(self.progress).__name__} "
                            f"{shown(self.progress)}")
        for field, value in values.items():
            object.__setattr__(self, field, value)
        steps = self.inject_overflow
        zero = self.parallel.startswith("zero")
        if zero and self.framework != "torch":
            raise ValueError(f"parallel={self.parallel!r} is DeepSpeed ZeRO, which runs PyTorch models; "
                             f"for {self.framework} use parallel='dp' or 'fsdp'")
        if zero and self.devices < 2:
            raise ValueError(f"parallel={self.parallel!r} shards across processes: set devices >= 2")
        if zero and self.precision not in ZERO_PRECISIONS:
            raise ValueError(f"DeepSpeed's engine runs precision {', '.join(ZERO_PRECISIONS)}; "
                             f"got {self.precision!r}")
        lowp = [f"{field}={getattr(self, field)!r}" for field, portable in (("precision", PRECISIONS),
                                                                              ("optimizer", OPTIMIZERS))
                if getattr(self, field) not in portable]
        if lowp and self.devices > 1:
            raise ValueError(f"{' and '.join(lowp)} run on one device here; set devices=1")
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
        """The config `to_dict` wrote (e.g. the header of a run log)."""
        if not isinstance(d, Mapping):
            raise TypeError(f"RunConfig.from_dict takes a dict of fields; got {type(d).__name__} {shown(d)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown RunConfig fields {sorted(map(str, unknown))}; known: {', '.join(sorted(known))}")
        if "framework" not in d:
            raise ValueError("RunConfig.from_dict: the dict has no 'framework' key (torch, jax or tf)")
        return cls(**d)
