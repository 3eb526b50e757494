"""Block formats: OCP MX v1.0 (MXFP8, MXFP6, MXFP4, MXINT8) and NVIDIA's NVFP4.

A block format stores a small element per value and one shared scale per block of the last
axis, so that 4- to 8-bit elements cover a tensor's range block by block. labkit follows
torchao's eager emulation bit for bit (``torchao/prototype/mx_formats/mx_tensor.py``
``to_mx``; ``nvfp4_tensor.py`` ``nvfp4_quantize``), in float32, with ml_dtypes' element
dtypes; tests/formats/test_blocks_conformance.py checks it against torchao and gfloat.

**MX** (blocks of 32, an E8M0 scale: a power of two 2^(s - 127), 0xFF is NaN). With
``amax`` the block's largest magnitude and ``emax`` the exponent of the element's largest
power of two (8 for E4M3, 2 for E2M1, 0 for INT8), ``scale_rounding`` picks the exponent
(torchao's ``ScaleCalculationMode``, ``torchao/prototype/mx_formats/config.py``):

    floor  floor(log2 amax) - emax                  the OCP spec's rule; torchao's default
    ceil   ceil(log2 amax) - emax                   (amax's exponent, +1 if it has mantissa bits)
    even   floor(log2 round(amax)) - emax           amax first rounded to the element's mantissa
    rceil  ceil(log2(amax / element_max))           cuBLAS' rule for MXFP8 (NVIDIA's hardware)

clamped to E8M0's range (-127 .. 127; NaN if the block holds a NaN). Each element is
x / 2^exponent rounded to nearest even, saturated at the element's max (FLOOR can push
the block's amax past the max: 500 in E4M3 comes back as 448; the others round the scale
up, and 500 comes back as 512). What torchao does at the edges, and labkit with it:

* a block whose scale is 2^-127 (amax below 2^(emax - 126)) is divided by 2^-126 under
  floor/ceil/even (torchao clamps the divisor to float32's smallest normal), and under rceil
  by 1, while its scale still reads 2^-127: its values come back halved, or as zeros.
  The spec (and gfloat) divide by 2^-127;
* an infinity makes amax inf: floor/ceil/even give the scale 2^(128 - emax), rceil 0xFE
  (2^127, dividing by 2^127); the inf saturates and comes back as inf (max * scale overflows
  float32), and the block's finite values are divided by that huge scale (most become 0);
* a NaN makes the scale 0xFF and the whole block NaN; the element bits in such a block are
  not specified (torchao's and labkit's differ there; fp4/fp6 have no NaN pattern);
* rceil's ceil(log2 d) takes a float32 log2, as torch.log2 computes it: for d within a few
  float32 ulps above a power of two (large exponents) log2 rounds to the integer and the
  scale is one step lower than the exact rule (NVIDIA's cvt.rp.ue8m0) gives.

MXINT8 (not in torchao 0.18) uses the same rules with int8 elements read as int / 64
(-2 .. 127/64), checked against gfloat.

**NVFP4** (blocks of 16 E2M1 elements, an E4M3 block scale): the block scale is
(amax / 6) / tensor_scale rounded to E4M3, clamped to [2^-6, 448]; each element is
x * ((1 / tensor_scale) / block_scale), clamped to +-6 and rounded to E2M1.
``tensor_scale=None`` (torchao's ``to_nvfp4`` default) uses no per-tensor scale (1);
``"amax"`` computes torchao's ``per_tensor_amax_to_scale``: amax(|x|) / (448 * 6), what its
dynamic NVFP4 recipe passes (an all-zero x then gives NaN, as in torchao); a number is used
as given. The clamp at 2^-6 means that without a tensor scale a block whose amax is below
6 * 2^-6 = 0.09375 loses resolution.

>>> from labkit.formats import blocks
>>> q = blocks.quantize([500.0] + [1.0] * 31, "mxfp8_e4m3", scale_rounding="floor")
>>> int(q.scales[0]), float(q.dequantize()[0])
(127, 448.0)
>>> float(blocks.quantize([500.0] + [1.0] * 31, "mxfp8_e4m3", scale_rounding="rceil").dequantize()[0])
512.0
"""

from labkit.formats.blocks.catalog import FORMATS, BlockFormat, format_table, get_format
from labkit.formats.blocks.codec import SCALE_ROUNDINGS, BlockTensor, quantize, tensor_scale_from_amax
from labkit.formats.blocks.explain import (
    ERROR_FORMATS,
    block_table,
    error_table,
    outlier_table,
    rms_relative_error,
)

__all__ = [
    "ERROR_FORMATS",
    "FORMATS",
    "SCALE_ROUNDINGS",
    "BlockFormat",
    "BlockTensor",
    "block_table",
    "error_table",
    "format_table",
    "get_format",
    "outlier_table",
    "quantize",
    "rms_relative_error",
    "tensor_scale_from_amax",
]
