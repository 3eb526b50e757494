"""Which precision to train in: a pure function of a `HardwareReport`.

`advise()` reads nothing but the description it is given, so the same rule can be asked
about a T4 on a laptop without a GPU (see `example_report`).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from labkit import _validate
from labkit.hardware.report import BF16_FLAGS, FP16_FLAGS, CPUInfo, GPUInfo, HardwareReport, framework_name

PRECISIONS = ("bf16", "fp16", "fp32")
_RANK = {"fp32": 0, "fp16": 1, "bf16": 2}
ADVISED_FRAMEWORKS = ("torch", "jax", "tensorflow")


def wrap(text: str, indent: str = "", width: int = 80) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ")


@dataclass(frozen=True)
class Advice:
    """Which precision to train in here, why, and how to ask each framework for it.

    ``precision`` is ``"bf16"``, ``"fp16"`` or ``"fp32"``: what the device's units take;
    ``loss_scaling`` says whether gradients must be scaled (fp16 only); ``target`` is the
    device the advice is for; ``by_framework`` maps ``"torch"``, ``"jax"``, ``"tensorflow"``
    to the precision to train in with that framework, which is ``precision`` unless the
    framework cannot use the units here (JAX on a CPU: XLA:CPU runs bf16 dots as fp32 dots
    between conversions, so bf16 gains nothing there); ``frameworks`` maps the same
    names to how to ask for it.
    """

    precision: str
    loss_scaling: bool
    reason: str
    target: str
    frameworks: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    by_framework: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"Advice.precision must be one of {', '.join(PRECISIONS)}, "
                             f"not {_validate.shown(self.precision)}")
        if not isinstance(self.loss_scaling, bool):
            raise TypeError(f"Advice.loss_scaling must be True or False, not {_validate.shown(self.loss_scaling)}")
        for name in ("reason", "target"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Advice.{name} must be a str, not {_validate.shown(getattr(self, name))}")
        if not isinstance(self.frameworks, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.frameworks.items()):
            raise TypeError("Advice.frameworks must map framework names to how to ask for the precision (str to "
                            f"str), not {_validate.shown(self.frameworks)}")
        if isinstance(self.notes, str) or not isinstance(self.notes, (tuple, list)) or not all(
                isinstance(n, str) for n in self.notes):
            raise TypeError(f"Advice.notes must be a tuple of str, not {_validate.shown(self.notes)}")
        object.__setattr__(self, "notes", tuple(self.notes))
        if not isinstance(self.by_framework, Mapping) or not all(
                isinstance(k, str) and v in PRECISIONS for k, v in self.by_framework.items()):
            raise TypeError(f"Advice.by_framework must map framework names to one of {', '.join(PRECISIONS)}, "
                            f"not {_validate.shown(self.by_framework)}")
        object.__setattr__(self, "by_framework", {name: self.by_framework.get(name, self.precision)
                                                  for name in (*ADVISED_FRAMEWORKS, *self.by_framework)})

    def for_framework(self, name: str) -> str:
        """The headline for one framework: ``advice.for_framework("jax")`` -> ``"fp32"``."""
        return _headline(self.by_framework[framework_name(name)])

    @property
    def headline(self) -> str:
        """``"bf16"``, ``"fp16 + loss scaling"`` or ``"fp32"`` where every framework trains the
        same way; else per framework, e.g. ``"bf16 (torch, tensorflow), fp32 (jax)"``."""
        groups: dict[str, list[str]] = {}
        for name, precision in self.by_framework.items():
            groups.setdefault(precision, []).append(name)
        if len(groups) == 1:
            return _headline(self.precision) if self.precision in groups else _headline(next(iter(groups)))
        order = sorted(groups, key=lambda p: -_RANK[p])
        return ", ".join(f"{_headline(p)} ({', '.join(groups[p])})" for p in order)

    def __str__(self) -> str:
        lines = [f"{self.headline}  (for {self.target})", *wrap(self.reason, "  ")]
        lines += [line for name, how in self.frameworks.items() for line in wrap(f"{name}: {how}", "  ")]
        lines += [line for note in self.notes for line in wrap("note: " + note, "  ")]
        return "\n".join(lines)


def _headline(precision: str) -> str:
    return precision + (" + loss scaling" if precision == "fp16" else "")


_HOW = {  # (precision, where) -> framework -> how to ask for it
    ("bf16", "gpu"): {
        "torch": 'torch.autocast("cuda", dtype=torch.bfloat16) around forward and loss; no GradScaler',
        "jax": "Flax layers with dtype=jnp.bfloat16, param_dtype=jnp.float32; no loss scaling",
        "tensorflow": 'keras.mixed_precision.set_global_policy("mixed_bfloat16"); no LossScaleOptimizer',
    },
    ("fp16", "gpu"): {
        "torch": 'torch.autocast("cuda", dtype=torch.float16) + torch.amp.GradScaler("cuda")',
        "jax": "Flax layers with dtype=jnp.float16, param_dtype=jnp.float32, and jmp.DynamicLossScale",
        "tensorflow": 'keras.mixed_precision.set_global_policy("mixed_float16"); compile() wraps the '
                      "optimizer in a LossScaleOptimizer (in a custom loop, wrap it yourself)",
    },
    ("bf16", "tpu"): {
        "torch": "torch_xla.amp.autocast(device), bf16 on TPU; no GradScaler",
        "jax": "Flax layers with dtype=jnp.bfloat16, param_dtype=jnp.float32; no loss scaling",
        "tensorflow": 'keras.mixed_precision.set_global_policy("mixed_bfloat16") under a TPUStrategy',
    },
    ("bf16", "cpu"): {
        "torch": 'torch.autocast("cpu", dtype=torch.bfloat16) (the CPU default dtype); no GradScaler',
        "jax": "Flax layers with dtype=jnp.bfloat16, param_dtype=jnp.float32; XLA:CPU gains vary, measure",
        "tensorflow": 'keras.mixed_precision.set_global_policy("mixed_bfloat16"); oneDNN uses the bf16 units',
    },
    ("fp32", "any"): {
        "torch": "plain float32: no autocast",
        "jax": "plain float32 (the default dtype)",
        "tensorflow": 'the default "float32" policy',
    },
}


def advise(report: HardwareReport) -> Advice:
    """The precision to train in on the hardware ``report`` describes.

    * TPU -> bf16: the MXU multiplies in bfloat16; fp16 is not a TPU format.
    * NVIDIA compute capability >= 8.0 (Ampere, Ada, Hopper, Blackwell) -> bf16, no loss
      scaling: bf16 Tensor Cores, and bf16 has fp32's exponent range.
    * 7.x (Volta V100, Turing T4) -> fp16 with loss scaling: fp16 Tensor Cores only.
    * 6.0 (GP100: Tesla P100), and the Jetsons 5.3 and 6.2 -> fp16 with loss scaling: no
      Tensor Cores, but fp16 arithmetic at twice fp32's rate (`GPUInfo.fp16_rate`).
    * Other GPUs below 7.0 (consumer Pascal 6.1 -- GTX 10xx, P4, P40 -- where fp16 runs at
      1/64 of fp32's rate; Maxwell, Kepler) -> fp32.
    * CPU with AVX512-BF16, AMX-BF16 or Arm BF16 -> bf16; any other CPU -> fp32.

    TPUs come before GPUs, GPUs before the CPU; with unlike GPUs the least capable decides.
    Then, per framework (`Advice.by_framework`): a framework that would only emulate the
    16-bit format here (`native_precision`) is advised fp32 -- JAX on every CPU.
    """
    if not isinstance(report, HardwareReport):
        raise TypeError("advise() takes a HardwareReport (from detect() or example_report()), "
                        f"not {type(report).__name__}")
    notes = list(_framework_notes(report))
    if report.tpus:
        tpu = report.tpus[0]
        reason = ("TPU matrix units (MXU) multiply in bfloat16, which has fp32's exponent range: no "
                  "loss scaling. fp16 is not a TPU format. JAX's default matmul precision already "
                  "rounds float32 inputs to bf16 on TPU.")
        target = tpu.kind + (f" x{tpu.count}" if tpu.count else "")
        return _per_framework(Advice("bf16", False, reason, target, _HOW["bf16", "tpu"], tuple(notes)), report)
    gpus = [g for g in report.gpus if g.vendor in ("nvidia", "amd")]
    if gpus:
        return _per_framework(_advise_gpu(gpus, notes), report)
    if report.gpus:  # Apple or another vendor
        notes.append('torch.autocast("mps", dtype=torch.float16) runs on Apple GPUs for experiments; '
                     "fp16 there needs loss scaling as anywhere else.")
        reason = ("This GPU has no Tensor-Core-style bf16/fp16 matrix units of the kind AMP is built "
                  "around, and mixed precision support on it is young: train in fp32 and use the "
                  "course to study the formats.")
        return Advice("fp32", False, reason, report.gpus[0].name, _HOW["fp32", "any"], tuple(notes))
    return _per_framework(_advise_cpu(report.cpu, notes), report)


def _per_framework(advice: Advice, report: HardwareReport) -> Advice:
    """`advice` with `Advice.by_framework` filled in: fp32 for a framework that would only
    emulate the advised 16-bit format on this hardware (`native_precision`)."""
    if advice.precision == "fp32":
        return advice
    by, how, notes = {}, dict(advice.frameworks), list(advice.notes)
    for name in ADVISED_FRAMEWORKS:
        native = native_precision(name, advice.precision, report)
        by[name] = advice.precision if native.native else "fp32"
        if not native.native:
            how[name] = _HOW["fp32", "any"][name]
            notes.insert(0, f"{name}: fp32, not {advice.precision}: {native.why}, so {advice.precision} "
                            "gains nothing over fp32 there, and is often slower (notebooks 06 and 07 measure it).")
    return dataclasses.replace(advice, frameworks=how, notes=tuple(notes), by_framework=by)


def gpu_precision(gpu: GPUInfo) -> str:
    """``"bf16"`` with bf16 Tensor Cores, else ``"fp16"`` with fp16 ones or with fp16
    arithmetic at twice fp32's rate (GP100), else ``"fp32"``."""
    dtypes = gpu.tensor_core_dtypes
    if "bf16" in dtypes:
        return "bf16"
    return "fp16" if "fp16" in dtypes or (gpu.fp16_rate or 0) > 1 else "fp32"


def describe_gpu(gpu: GPUInfo) -> str:
    cc = f"compute capability {gpu.capability[0]}.{gpu.capability[1]}, " if gpu.capability else ""
    return f"{gpu.name} ({cc}{gpu.architecture})"


def _advise_gpu(gpus: list[GPUInfo], notes: list[str]) -> Advice:
    g = min(gpus, key=lambda x: _RANK[gpu_precision(x)])
    precision, target = gpu_precision(g), describe_gpu(g)
    if len({gpu_precision(x) for x in gpus}) > 1:
        notes.append(f"The GPUs differ; the advice follows the least capable one, {g.name}.")
    if g.vendor == "nvidia" and g.capability is None:
        notes.append("The compute capability is unknown, so fp32 is the safe choice; install torch "
                     "and run `labkit doctor` again to read it.")
    if "tf32" in g.tensor_core_dtypes:
        notes.append("TF32: float32 matmuls and convolutions can run on Tensor Cores with a 10-bit mantissa. "
                     "TensorFlow and JAX do so by default (JAX's default matmul precision is TF32 on Ampere "
                     "and newer); PyTorch does for convolutions (torch.backends.cudnn.allow_tf32 is True) "
                     'but not for matmuls until torch.set_float32_matmul_precision("high").')
    if "fp8" in g.tensor_core_dtypes:
        notes.append("This GPU also has fp8 Tensor Cores (e4m3/e5m2), used through NVIDIA Transformer "
                     "Engine rather than autocast.")
    if "3090" in g.name:
        notes.append("Seed 004's table gives the RTX 3090 FP16: INCORRECT, it is Ampere (8.6) and "
                     "supports bf16.")
    if re.search(r"(?<![A-Za-z0-9])T4(?![A-Za-z0-9])", g.name):
        notes.append("Seed 003 calls the T4 Volta: it is Turing (7.5). Its Tensor Cores take fp16, "
                     "not bf16, either way.")
    arch, units = g.architecture, "Tensor Cores" if g.vendor == "nvidia" else "matrix cores"
    if precision == "bf16":
        reason = (f"This GPU ({arch}) has bf16 {units}, and bf16 keeps fp32's 8-bit exponent: "
                  "gradients that fit in fp32 fit in bf16, so no loss scaling.")
        return Advice("bf16", False, reason, target, _HOW["bf16", "gpu"], tuple(notes))
    if precision == "fp16" and "fp16" in g.tensor_core_dtypes:
        reason = (f"This GPU ({arch}) has fp16 {units} but none for bf16 (bf16 runs, emulated and "
                  "slowly). fp16's 5-bit exponent flushes gradients at or below 2^-25 (about 3e-8, "
                  "half its smallest subnormal) to zero: scale the loss.")
        return Advice("fp16", True, reason, target, _HOW["fp16", "gpu"], tuple(notes))
    if precision == "fp16":  # GP100 (P100) and the Jetsons: no Tensor Cores, fp16 at 2x fp32
        reason = (f"This GPU ({arch}) has no {units}, but unlike consumer Pascal its CUDA cores run "
                  "fp16 at twice the fp32 rate (packed half2), and fp16 halves memory traffic. The "
                  "gain is smaller than with Tensor Cores and depends on the kernels: compare with "
                  "fp32 (notebook 07). fp16 needs loss scaling; bf16 is emulated.")
        return Advice("fp16", True, reason, target, _HOW["fp16", "gpu"], tuple(notes))
    if g.fp16_rate is not None and g.fp16_rate < 1:
        reason = (f"This GPU ({arch}, consumer Pascal) has no {units}, and its fp16 arithmetic runs "
                  "at 1/64 of the fp32 rate (only GP100, the Tesla P100, runs it at 2x): 16-bit "
                  "compute brings no speed. fp16 storage could still halve activation memory, at "
                  "the price of loss scaling.")
        return Advice("fp32", False, reason, target, _HOW["fp32", "any"], tuple(notes))
    reason = (f"This GPU ({arch}) has no {units}, so autocast brings little speed. fp16 "
              "storage could still halve activation memory, at the price of loss scaling.")
    return Advice("fp32", False, reason, target, _HOW["fp32", "any"], tuple(notes))


def _advise_cpu(cpu: CPUInfo, notes: list[str]) -> Advice:
    target = f"CPU {cpu.model}"
    if cpu.fp16_instructions:
        notes.append(f"This CPU also does fp16 arithmetic ({', '.join(cpu.fp16_instructions)}); bf16 "
                     "is still the easier training format: no loss scaling.")
    if cpu.bf16_instructions:
        amx = " and AMX tile units" if cpu.amx else ""
        reason = (f"No GPU or TPU; the CPU has native bf16 instructions "
                  f"({', '.join(cpu.bf16_instructions)}){amx}: bf16 dot products with fp32 "
                  "accumulation. bf16 has fp32's exponent range: no loss scaling.")
        return Advice("bf16", False, reason, target, _HOW["bf16", "cpu"], tuple(notes))
    if not cpu.flags:
        notes.append("The CPU's instruction-set flags could not be read here.")
    capped = [f for f in cpu.capped_instructions if f in BF16_FLAGS]
    if capped:
        notes.append(f"The CPU has {', '.join(capped)}, but the environment caps the instruction set "
                     f"({cpu.caps_text}): the libraries run as on a CPU without them.")
    reason = ("No GPU or TPU, and the CPU has no native bf16 instructions (AVX512-BF16, AMX-BF16 or "
              "Arm BF16) that the libraries may use: bf16 and fp16 are emulated by conversions, slower "
              "than fp32. The course still shows their numerics here; it just cannot make them faster.")
    return Advice("fp32", False, reason, target, _HOW["fp32", "any"], tuple(notes))


class Native(NamedTuple):
    """Whether a precision runs on native units here (`native_precision`), and why."""

    native: bool
    why: str

    def __str__(self) -> str:
        return f"{'native' if self.native else 'emulated'} ({self.why})"


_NATIVE_FRAMEWORKS = ("torch", "jax", "tf", "tensorflow")


def native_precision(framework: str, precision: str, report: HardwareReport | None = None) -> Native:
    """Does `precision` run on native 16-bit units in `framework` on this machine (or on
    `report`'s)? fp32 and tf32 always do. False means emulated: converted to fp32 around
    fp32 arithmetic, or a slow generic kernel -- correct numbers, no speed-up, often much slower.

    * TPU: bf16 yes, fp16 no. NVIDIA GPU: fp16 from compute capability 7.0 (Tensor Cores) and
      on GP100 (6.0: P100, fp16 at twice fp32's rate), bf16 from 8.0.
    * CPU: PyTorch and TensorFlow use the CPU's bf16 (AVX512-BF16, AMX) and fp16 (AVX512-FP16,
      AMX-FP16) instructions through oneDNN, where the instruction-set caps allow; XLA:CPU (JAX)
      converts every 16-bit dot to an fp32 dot, so never.

    >>> from labkit.hardware import example_report
    >>> native_precision("torch", "bf16", example_report("cpu")).native
    False
    >>> native_precision("jax", "bf16", example_report("A100"))
    Native(native=True, why='NVIDIA A100 (compute capability 8.0, Ampere) has bf16 Tensor Cores')
    """
    if not isinstance(framework, str) or framework not in _NATIVE_FRAMEWORKS:
        raise ValueError(f"unknown framework {_validate.shown(framework)}; choose from torch, jax, tf")
    fmt = precision.removesuffix("-pure") if isinstance(precision, str) else precision
    if fmt not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"unknown precision {_validate.shown(precision)}; choose from fp32, tf32, fp16, bf16, bf16-pure")
    if fmt in ("fp32", "tf32"):
        return Native(True, f"{fmt} is what every device computes in")
    if report is None:
        from labkit.hardware.detect import detect

        report = detect(frameworks=())
    elif not isinstance(report, HardwareReport):
        raise TypeError(f"report must be a HardwareReport or None, not {type(report).__name__}")
    if report.tpus:
        ok = fmt == "bf16"
        return Native(ok, "the TPU's matrix units multiply in bf16" if ok else "fp16 is not a TPU format")
    gpus = [g for g in report.gpus if g.vendor in ("nvidia", "amd")]
    if gpus:
        g = min(gpus, key=lambda x: _RANK[gpu_precision(x)])
        ok = fmt in g.tensor_core_dtypes
        units = "Tensor Cores" if g.vendor == "nvidia" else "matrix cores"
        if not ok and fmt == "fp16" and (g.fp16_rate or 0) > 1:
            return Native(True, f"{describe_gpu(g)} runs fp16 at twice its fp32 rate (no Tensor Cores)")
        return Native(ok, f"{describe_gpu(g)} {'has' if ok else 'has no'} {fmt} {units}")
    cpu = report.cpu
    if framework == "jax":
        return Native(False, f"XLA:CPU runs {fmt} dots as fp32 dots between conversions")
    have = cpu.bf16_instructions if fmt == "bf16" else cpu.fp16_instructions
    if have:
        return Native(True, f"the CPU's {', '.join(have)} instructions, through oneDNN")
    capped = [f for f in cpu.capped_instructions if f in (BF16_FLAGS if fmt == "bf16" else FP16_FLAGS)]
    why = (f"{', '.join(capped)} unused: the environment caps the instruction set to {cpu.isa_cap}"
           if capped else f"the CPU has no {fmt} instructions")
    return Native(False, why)


def native_table(report: HardwareReport | None = None):
    """`native_precision` for every framework and 16-bit precision, as a Table: what the course's
    bf16 and fp16 cells will do on this machine (or on `report`'s)."""
    from labkit.table import Table

    if report is None:
        from labkit.hardware.detect import detect

        report = detect(frameworks=())
    rows = []
    for framework in ("torch", "jax", "tf"):
        for precision in ("bf16", "fp16"):
            n = native_precision(framework, precision, report)
            rows.append((framework, precision, "native" if n.native else "emulated", n.why))
    return Table(("framework", "precision", "here", "why"), tuple(rows), "16-bit arithmetic on this machine")


def _framework_notes(report: HardwareReport):
    accelerated = bool(report.tpus or report.gpus)
    for f in report.frameworks:
        if f.error:
            yield f"{f.name} {f.version} is installed but failed to load: {f.error}"
        elif accelerated and f.uses == "cpu":
            yield (f"{f.name} {f.version} computes on the CPU although an accelerator is here: "
                   "its CPU-only build is installed, or the device is not visible to it.")
