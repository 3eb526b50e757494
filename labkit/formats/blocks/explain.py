"""What the notebook and the block widget show: one block element by element, one outlier under
each scale rule, and the error of each format on the same data.

>>> print(outlier_table(500.0).rows[0])
('floor', '2^0', '500', '448', '-10.4%')
"""

from __future__ import annotations

import math

import numpy as np

from labkit._validate import integer, names, number
from labkit.formats.blocks.catalog import FORMATS, get_format
from labkit.formats.blocks.codec import SCALE_ROUNDINGS, BlockTensor, float32_blocks, quantize
from labkit.table import Table

ERROR_FORMATS = ("mxfp8_e4m3", "mxfp6_e2m3", "mxfp4", "nvfp4")


def _scale_text(q: BlockTensor, block: int = 0) -> str:
    """The scale of one block as a learner reads it: 2^k for E8M0, the E4M3 value (times the tensor scale)."""
    s = int(q.scales.reshape(-1)[block])
    if q.spec.scale == "e8m0":
        return "NaN" if s == 255 else f"2^{s - 127}"
    v = float(q.scale_values().reshape(-1)[block])
    return f"{v:.6g}" if q.tensor_scale is None else f"{v:.6g} (E4M3 x tensor scale)"


def rms_relative_error(x, format: str, *, scale_rounding: str | None = None, tensor_scale=None) -> float:
    """sqrt(mean(((dequantized - x) / x)^2)) over the finite, nonzero values of `x` (float32).

    >>> rms_relative_error(np.ones(32), "mxfp4")
    0.0
    """
    xb = float32_blocks(x, get_format(format))
    q = quantize(xb.reshape(xb.shape[:-2] + (-1,)), format, scale_rounding=scale_rounding, tensor_scale=tensor_scale)
    x32 = xb.reshape(q.shape).astype(np.float64)
    keep = np.isfinite(x32) & (x32 != 0)
    if not keep.any():
        raise ValueError("x must hold at least one finite, nonzero value to measure a relative error")
    rel = (q.dequantize().astype(np.float64)[keep] - x32[keep]) / x32[keep]
    return float(np.sqrt(np.mean(rel ** 2)))


def error_table(x, formats=ERROR_FORMATS, *, scale_rounding: str | None = None) -> Table:
    """Each format's error on `x`: the RMS of the relative errors (each value's own, where the small
    values that flush to zero weigh 100%), the RMS error over the RMS of x (the noise-to-signal
    ratio), and the share of nonzero values that come back as zero; with each format's bits per value. MX formats use `scale_rounding` (default "floor"); nvfp4 is
    shown without and with its per-tensor scale ("amax").

    >>> x = np.random.default_rng(0).standard_normal(4096)
    >>> t = error_table(x, ["mxfp4", "nvfp4"])
    >>> t.column("format")
    ['mxfp4', 'nvfp4', 'nvfp4 + tensor scale']
    """
    chosen = names("formats", formats, FORMATS)
    if not chosen:
        raise ValueError(f"formats must name at least one of {', '.join(FORMATS)}")
    rows = []
    for name in chosen:
        fmt = FORMATS[name]
        for ts in ((None, "amax") if fmt.tensor_scale else (None,)):
            sr = scale_rounding if fmt.scale == "e8m0" else None
            q = quantize(x, name, scale_rounding=sr, tensor_scale=ts)
            x32 = float32_blocks(x, fmt).reshape(q.shape)
            keep = np.isfinite(x32) & (x32 != 0)
            if not keep.any():
                raise ValueError("x must hold at least one finite, nonzero value to measure a relative error")
            back, ref = q.dequantize()[keep].astype(np.float64), x32[keep].astype(np.float64)
            err = float(np.sqrt(np.mean(((back - ref) / ref) ** 2)))
            noise = float(np.sqrt(np.mean((back - ref) ** 2) / np.mean(ref ** 2)))
            zeros = float(np.mean(back == 0))
            rows.append((name + (" + tensor scale" if ts else ""), str(fmt.block_size), f"{fmt.bits_per_value:g}",
                         f"{100 * err:.2f}%", f"{100 * noise:.2f}%", f"{100 * zeros:.2f}%"))
    mode = scale_rounding or "floor"
    return Table(("format", "block", "bits/value", "RMS relative error", "RMS error / RMS x", "nonzero -> 0"),
                 tuple(rows),
                 f"Quantization error on {x32.size} values (MX scales: {mode})")


def outlier_table(amax: float = 500.0, format: str = "mxfp8_e4m3", modes=SCALE_ROUNDINGS) -> Table:
    """How a block's largest value `amax` comes back under each MX scale rule (the other 31
    values are 1.0). FLOOR picks 2^(floor(log2 amax) - emax): for E4M3 and amax 500, 2^0, and
    500 > 448 saturates to 448. RCEIL (and CEIL, EVEN) round the scale up to 2^1: 500 / 2 = 250
    rounds to 256 in E4M3, and comes back as 512.

    >>> print(outlier_table(500.0, modes=["rceil"]).rows[0])
    ('rceil', '2^1', '250', '512', '+2.4%')
    """
    amax = number("amax", amax, minimum=0, maximum=float(np.finfo(np.float32).max), inclusive=False)
    fmt = get_format(format)
    if fmt.scale != "e8m0":
        raise ValueError(f"format must be an MX format ({', '.join(n for n in FORMATS if n != 'nvfp4')}): "
                         f"the scale rules are for power-of-two scales; got {format!r}")
    chosen = names("modes", modes, SCALE_ROUNDINGS)
    x = np.ones(fmt.block_size, np.float32)
    x[0] = amax
    rows = []
    for mode in chosen:
        q = quantize(x, fmt.name, scale_rounding=mode)
        back = float(q.dequantize()[0])
        err = (back - float(x[0])) / float(x[0])
        rows.append((mode, _scale_text(q), f"{float(x[0]) / float(q.scale_values()[0]):.6g}", f"{back:.6g}",
                     "inf" if math.isinf(err) else f"{100 * err:+.1f}%"))
    return Table(("scale rounding", "scale", "amax / scale", "amax comes back as", "error"), tuple(rows),
                 f"{fmt.name}: a block whose largest value is {float(x[0]):g}")


def block_table(x, format: str, *, scale_rounding: str | None = None, tensor_scale=None,
                rows: int | None = None) -> Table:
    """One block element by element: its value, the element's bits and value, what it comes back
    as, and the error. `x` is one block (32 values; 16 for nvfp4); the title gives the scale.
    `rows`: show the first `rows` elements only (None: all of them).

    >>> t = block_table([500.0] + [1.0] * 31, "mxfp8_e4m3")
    >>> t.title
    'mxfp8_e4m3 (floor): scale 2^0, amax 500'
    >>> t.rows[0]
    ('0', '500', '0x7e', '448', '448', '-52', '-10.4%')
    """
    fmt = get_format(format)
    shown_rows = fmt.block_size if rows is None else integer("rows", rows, minimum=1, maximum=fmt.block_size)
    xb = float32_blocks(x, fmt)
    if xb.shape[:-1] != (1,):
        raise ValueError(f"x must be one block of {fmt.block_size} values for {fmt.name}; got shape "
                         f"{xb.shape[:-2] + (xb.shape[-2] * xb.shape[-1],)}")
    q = quantize(xb.reshape(-1), fmt.name, scale_rounding=scale_rounding, tensor_scale=tensor_scale)
    v, el, back = xb.reshape(-1), q.element_values(), q.dequantize()
    width = 2 if fmt.element_bits == 8 else 1
    table = []
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for i in range(shown_rows):
            err = float(back[i]) - float(v[i])
            rel = "" if v[i] == 0 or not np.isfinite(err / float(v[i])) else f"{100 * err / float(v[i]):+.1f}%"
            table.append((str(i), f"{float(v[i]):.6g}", f"0x{int(q.elements[i]):0{width}x}", f"{float(el[i]):g}",
                         f"{float(back[i]):.6g}", f"{err:.3g}", rel))
    mode = "" if q.scale_rounding is None else f" ({q.scale_rounding})"
    amax = float(np.max(np.abs(v)))
    more = "" if shown_rows == fmt.block_size else f" (first {shown_rows} of {fmt.block_size})"
    return Table(("i", "x", "bits", "element", "dequantized", "error", "relative"), tuple(table),
                 f"{fmt.name}{mode}: scale {_scale_text(q)}, amax {amax:.6g}{more}")
