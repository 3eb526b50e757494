"""The most a 16-bit precision can speed a matmul up over fp32 on given hardware: a sanity bound
for timings.

A measured speed-up is a ratio of two timings, and on a shared machine either can be disturbed:
a 256 x 256 fp32 matmul that waits for a descheduled thread makes bf16 look "140x faster". The
hardware bounds what is possible. Per register or per cycle, the 16-bit units do at most:

* an emulated format (`native_precision` says so): fp32's arithmetic plus conversions -- **1x**;
* AVX512-BF16 (``VDPBF16PS``: 32 bf16 products into 16 fp32 sums, where an fp32 FMA does 16),
  AVX512-FP16 (32 fp16 lanes against 16) and Arm's fp16 arithmetic (8 lanes against 4) -- **2x**;
* Arm BF16 (``BFMMLA``: a 2x4 by 4x2 bf16 product, 16 multiply-adds, where ``FMLA`` does 4) -- **4x**;
* a TPU: an fp32 matmul at full precision takes 6 bf16 passes of the MXU -- **6x**;
* Intel AMX (1,024 bf16 or fp16 operations per cycle per core, against 64 fp32 operations of two
  AVX-512 FMA units) and GPU Tensor Cores (A100: 312 dense bf16 TFLOP/s against 19.5 fp32) -- **16x**;
* a GPU without Tensor Cores that runs fp16 at twice fp32's rate (P100) -- **2x**.

A framework's own fp32 can run below the hardware's fp32 rate (PyTorch's MKL takes slow paths on
AMD CPUs), which lifts its 16-bit speed-up above the ceiling; `CEILING_SLACK` allows for that.
A ratio past ``CEILING_SLACK`` times the ceiling has no hardware explanation: one of the two
timings was disturbed (`Ceiling.exceeded_by`).

>>> from labkit.hardware import example_report
>>> speedup_ceiling("torch", "bf16", example_report("cpu")).times
1.0
>>> speedup_ceiling("torch", "bf16", example_report("cpu-amx")).times
16.0
>>> speedup_ceiling("torch", "bf16", example_report("cpu")).exceeded_by(2.5)
True
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit import _validate
from labkit.hardware.advice import native_precision
from labkit.hardware.report import HardwareReport

CEILING_SLACK = 2.0
"""How far above the hardware's ceiling a measured speed-up may still be real: a framework's fp32
baseline at half the hardware's fp32 rate doubles it. Past that, the timing was disturbed."""

# (flag, times, why): the first usable flag of the CPU decides
_CPU = {
    "bf16": (("amx_bf16", 16.0, "AMX tiles: 1,024 bf16 operations per cycle per core, 16x two AVX-512 fp32 FMA units"),
             ("avx512_bf16", 2.0, "AVX512-BF16: VDPBF16PS does twice the multiply-adds of an fp32 FMA per register"),
             ("bf16", 4.0, "Arm BFMMLA: 16 bf16 multiply-adds where an fp32 FMLA does 4")),
    "fp16": (("amx_fp16", 16.0, "AMX-FP16 tiles: 16x two AVX-512 fp32 FMA units"),
             ("avx512_fp16", 2.0, "AVX512-FP16: 32 fp16 lanes per register against 16 fp32 lanes"),
             ("asimdhp", 2.0, "Arm fp16 arithmetic: 8 lanes per register against 4 fp32 lanes"),
             ("fp16", 2.0, "Arm fp16 arithmetic: 8 lanes per register against 4 fp32 lanes")),
}


@dataclass(frozen=True)
class Ceiling:
    """The most `speedup_ceiling` allows a 16-bit matmul over fp32 here (``times``), and why."""

    times: float
    why: str

    def __post_init__(self):
        object.__setattr__(self, "times", _validate.number("times (a speed-up, > 0)", self.times, minimum=0,
                                                           inclusive=False))
        if not isinstance(self.why, str):
            raise TypeError(f"why must be a string, got {type(self.why).__name__} {_validate.shown(self.why)}")

    @property
    def limit(self) -> float:
        """The largest speed-up a sound timing can show here: `CEILING_SLACK` times the ceiling
        (``times``). Past it is noise: `exceeded_by` is the one rule, and the texts of `speed_checks` and
        `claims.verdict` print this bound (the emulation table's title names the slack, batch_trend the ceiling).

        >>> Ceiling(2.0, "AVX512-BF16").limit
        4.0
        """
        return CEILING_SLACK * self.times

    def exceeded_by(self, ratio) -> bool:
        """Whether a measured speed-up (fp32's time / the 16-bit time) is past `limit`
        (`CEILING_SLACK` times the ceiling): more than any hardware or slow baseline explains, so
        a timing was disturbed -- the one rule behind every "noise" a table or a check prints."""
        ratio = _validate.number("ratio (fp32's time / the 16-bit time)", ratio, minimum=0, inclusive=False)
        return ratio > self.limit

    def __str__(self) -> str:
        return f"{self.times:g}x ({self.why})"


def speedup_ceiling(framework: str, precision: str, report: HardwareReport | None = None) -> Ceiling:
    """The most `precision` can speed a matmul up over fp32 in `framework` on this machine (or on
    `report`'s): 1x where it is emulated (`native_precision`), else the ratio of the 16-bit units'
    rate to fp32's (the module docstring lists them). fp32 is 1x; tf32 is 8x on GPUs with TF32
    Tensor Cores (A100: 156 against 19.5 TFLOP/s), 1x elsewhere, where it runs as fp32."""
    if report is None:  # detected once, here, and handed to native_precision
        from labkit.hardware.detect import detect

        report = detect(frameworks=())
    native = native_precision(framework, precision, report)  # checks framework, precision and report
    fmt = precision.removesuffix("-pure")
    if fmt == "fp32":
        return Ceiling(1.0, "fp32 against itself")
    if not native.native:
        return Ceiling(1.0, f"emulated ({native.why}): fp32's arithmetic plus conversions")
    if fmt == "tf32":
        gpus = [g for g in report.gpus if g.vendor == "nvidia" and "tf32" in g.tensor_core_dtypes]
        return Ceiling(8.0, "TF32 Tensor Cores (A100: 156 against 19.5 TFLOP/s)") if gpus else \
            Ceiling(1.0, "no TF32 units here: tf32 runs as fp32")
    if report.tpus:
        return Ceiling(6.0, "the TPU's MXU multiplies bf16; a full-precision fp32 matmul takes 6 bf16 passes")
    gpus = [g for g in report.gpus if g.vendor in ("nvidia", "amd")]
    if gpus:
        if any(fmt in g.tensor_core_dtypes for g in gpus):
            return Ceiling(16.0, f"{fmt} matrix units: up to 16x fp32's dense rate (A100: 312 bf16 TFLOP/s against 19.5)")
        rate = max(g.fp16_rate or 0 for g in gpus)  # P100: 2.0 (`GPUInfo.fp16_rate`)
        if fmt == "fp16" and rate > 1:
            return Ceiling(rate, "fp16 at twice fp32's rate (no Tensor Cores)" if rate == 2 else
                           f"fp16 at {rate:g}x fp32's rate (no Tensor Cores)")
        return Ceiling(1.0, native.why)  # native by a rule this table does not know: claim no gain
    for flag, times, why in _CPU[fmt]:
        if report.cpu.usable(flag):
            return Ceiling(times, why)
    return Ceiling(1.0, native.why)  # native by a rule this table does not know: claim no gain


__all__ = ["CEILING_SLACK", "Ceiling", "speedup_ceiling"]
