"""Well-known hardware as descriptions, and seed 004's precision table next to `advise()`.

>>> advise(example_report("RTX 3090")).precision       # Ampere, compute capability 8.6
'bf16'
>>> seed_004_select_precision("RTX3090", "预训练")        # what seed 004 says: INCORRECT
'FP16'
"""

from __future__ import annotations

from collections.abc import Iterable

from labkit.hardware.advice import advise
from labkit.hardware.report import (
    KNOWN_GPUS, CPUInfo, GPUInfo, HardwareReport, TPUInfo, check_str, check_strs,
)

_CPUS = {  # name -> (model, typical flags as Linux spells them)
    "cpu": ("x86-64 with AVX2 (e.g. Colab's CPU runtime)",
            ("sse4_2", "avx", "avx2", "fma", "f16c")),
    "cpu-avx512-bf16": ("x86-64 with AVX512-BF16 (e.g. AMD Zen 4)",
                        ("avx2", "f16c", "avx512f", "avx512_vnni", "avx512_bf16")),
    "cpu-amx": ("x86-64 with AMX (e.g. Intel Sapphire Rapids)",
                ("avx2", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                 "amx_int8")),
}
_HOST = CPUInfo("host CPU", "x86_64", _CPUS["cpu"][1])

EXAMPLES = (*_CPUS, "apple-m2", "tpu", *KNOWN_GPUS)
"""The names `example_report()` knows: three CPUs, an Apple M2, a TPU, every `KNOWN_GPUS`."""


def example_report(name: str) -> HardwareReport:
    """A description of well-known hardware, to ask `advise()` about it.

    GPU names are matched without case or spaces (``"rtx3090"`` is the RTX 3090).

    >>> example_report("V100").gpus[0].architecture
    'Volta'
    """
    key = check_str(name, "example name").strip().lower()
    if key in _CPUS:
        model, flags = _CPUS[key]
        return HardwareReport(CPUInfo(model, "x86_64", flags))
    if key == "apple-m2":
        cpu = CPUInfo("Apple M2", "arm64", ("bf16", "fp16"))
        return HardwareReport(cpu, gpus=(GPUInfo("Apple M2 GPU", "apple"),))
    if key == "tpu":  # Colab's TPU runtime: one TPU v2 board, 8 cores
        return HardwareReport(_HOST, tpus=(TPUInfo("TPU v2", 8),))
    model = next((m for m in KNOWN_GPUS if m.replace(" ", "").lower() == key.replace(" ", "")), None)
    if model is None:
        raise ValueError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
    return HardwareReport(_HOST, gpus=(GPUInfo(f"NVIDIA {model}", "nvidia", KNOWN_GPUS[model]),))


SEED_004_TABLE = {
    ("A100", "预训练"): "BF16",
    ("A100", "微调"): "BF16",
    ("V100", "预训练"): "FP16",
    ("V100", "微调"): "FP16",
    ("RTX3090", "预训练"): "FP16",
    ("RTX3090", "微调"): "FP16",
    ("CPU", "任何"): "FP32",
}
"""Seed 004's ``select_precision`` table, verbatim: (GPU, 预训练 pre-training / 微调
fine-tuning / 任何 any) -> precision. Its RTX 3090 rows are wrong (Ampere has bf16), and
a GPU it does not list (H100, L4, T4) falls through to its default, FP32."""

_TRAINING = {"预训练": "pre-training", "微调": "fine-tuning", "任何": "any"}


def seed_004_select_precision(gpu_type: str, training_type: str) -> str:
    """Seed 004's ``select_precision(gpu_type, training_type)``, as written (INCORRECT)."""
    key = (check_str(gpu_type, "gpu_type"), check_str(training_type, "training_type"))
    return SEED_004_TABLE.get(key, "FP32")


def seed_004_comparison():
    """Seed 004's answers next to `advise()`, for its rows and three GPUs it left out.

    Returns a `labkit.table.Table`; the last column says CORRECT or INCORRECT.
    """
    from labkit.table import Table

    rows = [*SEED_004_TABLE, *((gpu, "预训练") for gpu in ("H100", "L4", "T4"))]
    out = []
    for gpu, training in rows:
        seed = seed_004_select_precision(gpu, training)
        advice = advise(example_report(gpu))
        verdict = "CORRECT" if seed.lower() == advice.precision else "INCORRECT"
        out.append((gpu, seed, advice.headline, verdict, f"{_TRAINING[training]} ({training})"))
    # The training column comes last: its Chinese characters are double width in a terminal.
    return Table(("device", "seed 004 says", "labkit says", "seed 004 is", "training"), tuple(out),
                 title="Seed 004's select_precision() next to labkit.hardware.advise()")


def advice_table(names: Iterable[str] = ("cpu", "cpu-amx", "T4", "L4", "A100", "tpu")):
    """`advise()` for several `example_report()` names, as a `labkit.table.Table`."""
    from labkit.table import Table

    rows = []
    for name in check_strs(names, "names"):
        advice = advise(example_report(name))
        rows.append((name, advice.target, advice.headline))
    return Table(("example", "device", "train in"), tuple(rows),
                 title="labkit.hardware.advise() on examples")
