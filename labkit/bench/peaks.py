"""The ceiling a step is measured against: each GPU's dense peak per precision, and a step's FLOPs.

MFU (model FLOPs utilisation) = `train_flops` / step time / `peak_tflops`.

>>> peak("cuda:0 (NVIDIA A100-SXM4-40GB)").chip
'A100'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit._validate import choice, number, shown
from labkit.memory.shapes import DEFAULT_WIDTH as MODEL_WIDTH
from labkit.memory.shapes import N_CLASSES, N_PIXELS, check_sizes, transformer_shape
from labkit.table import Table

# Peak dense (no sparsity) TFLOP/s per chip and precision, from NVIDIA's datasheets. The
# datasheets of Ampere and later quote tensor-core figures "with sparsity"; the dense figure is
# half of it. Volta (V100) and Turing (T4) have no bf16 and no tf32: their tensor cores do fp16
# (with fp32 accumulation) only, so a bf16 run there has no peak to be measured against. `fp32`
# is the non-tensor-core fp32 rate: labkit's `fp32` precision turns TF32 off.
PEAK_PRECISION = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "bf16-pure": "bf16"}
"""Which peak a run of each labkit precision is measured against (pure bf16 computes in bf16)."""


@dataclass(frozen=True)
class Peak:
    """One chip's dense peaks, TFLOP/s, and where they come from.

    ``pattern`` is a regular expression matched against the device text (upper case), e.g.
    ``"cuda:0 (NVIDIA H100 PCIe, ...)"``; ``tflops`` maps a precision to its peak, and leaves
    out the precisions the chip has no tensor-core path for.
    """

    chip: str
    pattern: str
    tflops: dict
    source: str

    def __post_init__(self):
        for field in ("chip", "pattern", "source"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise TypeError(f"Peak.{field} must be a non-empty str, not {shown(value)}")
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"Peak.pattern {self.pattern!r} is not a regular expression: {e}") from None
        if not isinstance(self.tflops, dict) or not self.tflops:
            raise TypeError(f"Peak.tflops must be a dict of precision -> TFLOP/s, not {shown(self.tflops)}")
        for precision, value in self.tflops.items():
            choice("Peak.tflops precision", precision, ("fp32", "tf32", "fp16", "bf16"))
            number(f"Peak.tflops[{precision!r}]", value, minimum=0, inclusive=False)


PEAKS = (
    Peak("H200 SXM", r"H200(?!\s*NVL)", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
         "https://www.nvidia.com/en-us/data-center/h200/"),
    Peak("H100 SXM", r"H100(?!\s*(PCIE|NVL))", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Peak("H100 PCIe", r"H100\s*PCIE", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Peak("A100", r"A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    Peak("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
         "https://www.nvidia.com/en-us/data-center/l4/"),
    Peak("V100 SXM2", r"V100-SXM2", {"fp32": 15.7, "fp16": 125.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Peak("V100 PCIe", r"V100-PCIE", {"fp32": 14.0, "fp16": 112.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Peak("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0},
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
)
"""The chips labkit reports MFU on. Any other device -- a CPU, an H100 NVL, a V100S, an A10G (whose
peaks NVIDIA publishes no datasheet for) -- gets no MFU rather than a guessed one."""

PEAK_TFLOPS = {p.chip: dict(p.tflops) for p in PEAKS}
"""chip -> {precision: dense TFLOP/s}, as in `PEAKS`."""


def train_flops(model: str, batch_size: int, width: int | None = None) -> int:
    """Matmul FLOPs of one training step: 3 x the forward pass (the backward pass does two
    matmuls for each forward one), forward = 2 x multiply-adds. Element-wise work, norms and
    softmax are left out, as MFU figures usually do (the "6 N D" convention: it also counts
    the gradient with respect to the data, which a first layer does not need). Checked
    against ``torch.utils.flop_counter.FlopCounterMode`` in the tests.

    >>> train_flops("mlp", 1, 32) == 3 * 2 * (64 * 32 + 32 * 32 + 32 * 10)
    True
    """
    model, batch_size, width = check_sizes(model, batch_size, width)
    if model == "mlp":
        w = MODEL_WIDTH["mlp"] if width is None else width  # the model's default, not this module's DEFAULT_WIDTH
        macs = N_PIXELS * w + w * w + w * N_CLASSES
    else:
        s = transformer_shape(width)
        t, d = N_PIXELS, s.d_model
        macs = s.layers * t * (12 * d * d + 2 * t * d) + d * N_CLASSES
    return 3 * 2 * macs * batch_size


def peak(device: str) -> Peak | None:
    """The `Peak` of the GPU a device description names, or None (a CPU, an unknown chip)."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a device description (a string); got {type(device).__name__} {shown(device)}")
    text = device.upper()
    return next((p for p in PEAKS if re.search(p.pattern, text)), None)


def peak_tflops(device: str, precision: str = "bf16") -> float | None:
    """The chip's dense peak for a labkit precision (`PEAK_PRECISION`), if the device description
    names a known GPU and the chip has that precision; None otherwise.

    >>> peak_tflops("cuda:0 (NVIDIA H100 PCIe)"), peak_tflops("cuda:0 (Tesla T4)", "bf16")
    (756.5, None)
    """
    precision = choice("precision", precision, tuple(PEAK_PRECISION))
    found = peak(device)
    return found.tflops.get(PEAK_PRECISION[precision]) if found else None


def peaks_table() -> Table:
    """Every chip's dense peaks, one column per precision ("-": the chip has none), and the source."""
    cols = ("fp32", "tf32", "fp16", "bf16")
    rows = tuple((p.chip, *(f"{p.tflops[c]:g}" if c in p.tflops else "-" for c in cols), p.source) for p in PEAKS)
    return Table(("chip", *(f"{c} TFLOP/s" for c in cols), "source (datasheet)"), rows,
                 "Dense peaks MFU is measured against (no sparsity; NVIDIA's datasheets)")


__all__ = ["PEAKS", "PEAK_PRECISION", "PEAK_TFLOPS", "Peak", "peak", "peak_tflops", "peaks_table", "train_flops"]
