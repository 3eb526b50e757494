"""What hardware is here, what it can do in low precision, and which precision to train in.

Two halves, kept apart so each can be tested on its own:

* **Detection** (`detect`) gathers a plain description, a `HardwareReport`: the CPU and
  its flags, the GPUs (name, compute capability), the TPUs, the versions, and what each
  installed framework sees and will use by default.
* **Advice** (`advise`) is a pure function of that description. It returns an `Advice`:
  a precision (``"bf16"``, ``"fp16"`` or ``"fp32"``), whether loss scaling is needed, the
  reason, and how to ask each framework for it.

The rule: TPU -> bf16; NVIDIA Ampere or newer (compute capability >= 8.0) -> bf16; Volta
and Turing (V100, T4), and GP100 (P100: fp16 at twice fp32's rate) -> fp16 with loss scaling;
other older GPUs (consumer Pascal runs fp16 at 1/64) -> fp32; a CPU with AVX512-BF16, AMX or
Arm BF16 -> bf16; any other CPU -> fp32. Then per framework (`Advice.by_framework`): one that
would only emulate the format here trains in fp32 -- JAX on every CPU. Instruction-set caps in the environment
(``ONEDNN_MAX_CPU_ISA=AVX2`` and the other `ISA_KNOBS`) count: a capped CPU is advised as
the machine it then behaves like.

>>> from labkit import hardware
>>> hardware.advise(hardware.example_report("T4")).headline
'fp16 + loss scaling'
>>> hardware.advise(hardware.example_report("A100")).headline
'bf16'

It replaces seed 004's ``select_precision`` table (kept as `seed_004_select_precision`),
which gives the Ampere RTX 3090 fp16 and any GPU it does not list fp32.
"""

from labkit.hardware.advice import PRECISIONS, Advice, Native, advise, native_precision, native_table
from labkit.hardware.ceiling import CEILING_SLACK, Ceiling, speedup_ceiling
from labkit.hardware.detect import PACKAGES, detect, detect_cpu, package_versions
from labkit.hardware.examples import (
    EXAMPLES, SEED_004_TABLE, advice_table, example_report, seed_004_comparison, seed_004_select_precision,
)
from labkit.hardware.parse import (
    capability_from_name, parse_cpuinfo, parse_isa_caps, parse_nvidia_smi, parse_sysctl, tpu_from_environment,
)
from labkit.hardware.report import (
    FRAMEWORKS, ISA_KNOBS, ISA_LEVELS, KNOWN_GPUS, CPUInfo, FrameworkInfo, GPUInfo, HardwareReport, TPUInfo,
    isa_cap_level, parse_capability,
)
from labkit.hardware.runtime import subnormal_behaviour, tf32_defaults
from labkit.hardware.text import format_report

__all__ = [
    "EXAMPLES",
    "FRAMEWORKS",
    "ISA_KNOBS",
    "ISA_LEVELS",
    "KNOWN_GPUS",
    "PACKAGES",
    "package_versions",
    "PRECISIONS",
    "SEED_004_TABLE",
    "Advice",
    "CEILING_SLACK",
    "Ceiling",
    "Native",
    "CPUInfo",
    "FrameworkInfo",
    "GPUInfo",
    "HardwareReport",
    "TPUInfo",
    "advice_table",
    "advise",
    "capability_from_name",
    "detect",
    "detect_cpu",
    "example_report",
    "format_report",
    "isa_cap_level",
    "native_precision",
    "native_table",
    "parse_capability",
    "parse_cpuinfo",
    "parse_isa_caps",
    "parse_nvidia_smi",
    "parse_sysctl",
    "seed_004_comparison",
    "seed_004_select_precision",
    "speedup_ceiling",
    "subnormal_behaviour",
    "tf32_defaults",
    "tpu_from_environment",
]
