"""The seeds' "FP32 vs FP16 vs BF16" tables, regenerated from the formats themselves, so that no
number in them is typed by hand."""

from __future__ import annotations

from labkit.formats.spec import COURSE_FORMATS, FORMATS, format_names, get
from labkit.table import Table


def loss_scaling_need(fmt) -> str:
    """Does training in this format usually need its gradients scaled? From its range.

    >>> loss_scaling_need("fp4"), loss_scaling_need("e8m0")
    ('yes: a scale per block (MX, NVFP4)', 'n/a: a scale format (powers of two only)')
    """
    f = get(fmt)
    fp32 = FORMATS["fp32"]
    if not f.signed:
        return "n/a: a scale format (powers of two only)"
    if f.exponent_bits >= fp32.exponent_bits:
        return "no (fp32's exponent range)"
    if f.bits < 8:
        return "yes: a scale per block (MX, NVFP4)"
    if f.bits <= 8:
        return "yes: a scale per tensor"
    return "usually (dynamic loss scaling)"


def _storage(f) -> str:
    if f.dtype is None:
        return "none (a matmul mode)"
    text = f"{f.dtype.itemsize} byte" + "s" * (f.dtype.itemsize > 1)
    return text if f.storage_bits == f.bits else f"{text} ({f.bits} bits used)"  # ml_dtypes: fp4/fp6 one per byte


def comparison_table(names=None) -> Table:
    """Layout, range and precision of each format, computed from FloatFormat.

    `names`: one format name, a list of them (an empty list: a table with no rows), or None for
    the six of COURSE_FORMATS (``list(lf.FORMATS)`` for all twelve; ``lf.SUBBYTE_FORMATS`` for
    the block-scaling ones).
    """
    rows = []
    for name in [] if isinstance(names, (list, tuple)) and not names else format_names(names, default=COURSE_FORMATS):
        f = get(name)
        rows.append((
            f.name,
            str(f.bits),
            str(f.exponent_bits),
            str(f.mantissa_bits),
            f"{f.max:.5g}",
            f"{f.smallest_normal:.3g}",
            f"{f.smallest_subnormal:.3g}" if f.subnormals else "none",
            f"{f.eps:.3g}",
            f"{f.decimal_digits:.1f}",
            _storage(f),
            loss_scaling_need(f),
        ))
    columns = ("format", "bits", "exponent", "mantissa", "max", "smallest normal",
               "smallest subnormal", "eps", "decimal digits", "storage", "needs loss scaling?")
    return Table(columns, tuple(rows), "Floating-point formats, computed from their bit layouts")
