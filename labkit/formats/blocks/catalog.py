"""The block formats: what each one's elements, blocks and scales are.

Constants come from ``ml_dtypes.finfo`` of the element dtype (``float4_e2m1fn``,
``float6_e2m3fn``, ``float6_e3m2fn``, ``float8_e4m3fn``, ``float8_e5m2``), never typed by
hand; MXINT8's element is an int8 read as ``int / 64`` (OCP MX v1.0, section 5.3.2:
two's complement with an implicit scale of 2^-6, so -2 .. 1 63/64).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from labkit._validate import choice, integer, number, shown
from labkit.table import Table


ELEMENTS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "int8")
"""The element types of the catalog: ml_dtypes dtype names, and int8."""


@dataclass(frozen=True)
class BlockFormat:
    """One block format: `block_size` elements of `element` share one `scale`.

    Attributes:
      name: "mxfp8_e4m3", ..., "nvfp4" (the keys of `FORMATS`).
      block_size: elements per block (32 for MX, 16 for NVFP4).
      element: the element's ml_dtypes dtype name ("float4_e2m1fn", ...) or "int8".
      element_bits: bits per element (4, 6 or 8).
      element_max: the largest element value (6, 7.5, 28, 448, 57344; 127/64 for int8).
      element_emax: the exponent of the largest power of two an element holds (2 for fp4,
        8 for e4m3: 256 <= 448 < 512): the spec's ``emax_elem``, torchao's ``*_MAX_POW2``.
      element_mbits: mantissa bits (6 for int8: the fraction bits of int/64), used by the
        "even" scale rounding.
      scale: "e8m0" (a power of two, MX) or "e4m3" (an fp8 number, NVFP4).
      tensor_scale: True for NVFP4, which may add a float32 scale per tensor.
    """

    name: str
    block_size: int
    element: str
    element_bits: int
    element_max: float
    element_emax: int
    element_mbits: int
    scale: str
    tensor_scale: bool
    description: str

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise TypeError(f"name must be a non-empty string; got {type(self.name).__name__} {shown(self.name)}")
        integer("block_size", self.block_size, minimum=1)
        choice("element", self.element, ELEMENTS)
        integer("element_bits", self.element_bits, minimum=1, maximum=8)
        number("element_max", self.element_max, minimum=0, inclusive=False)
        integer("element_emax", self.element_emax, minimum=-127, maximum=127)
        integer("element_mbits", self.element_mbits, minimum=0, maximum=7)
        choice("scale", self.scale, ("e8m0", "e4m3"))
        if not isinstance(self.tensor_scale, (bool, np.bool_)):
            raise TypeError(f"tensor_scale must be True or False; got {shown(self.tensor_scale)}")
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string; got {shown(self.description)}")

    @property
    def bits_per_value(self) -> float:
        """Storage per element, its share of the block scale included (8-bit scales):
        4.25 for MXFP4, 4.5 for NVFP4 (the per-tensor float32 aside)."""
        return self.element_bits + 8 / self.block_size

    @property
    def dtype(self) -> np.dtype:
        """The element's numpy dtype (ml_dtypes' for the floats, int8 for MXINT8)."""
        return np.dtype(np.int8) if self.element == "int8" else np.dtype(getattr(ml_dtypes, self.element))


def _float_element(name, block_size, element, scale, description, tensor_scale=False):
    dt = getattr(ml_dtypes, element)
    fi = ml_dtypes.finfo(dt)
    top = float(fi.max)
    return BlockFormat(name, block_size, element, int(fi.bits), top, int(np.floor(np.log2(top))), int(fi.nmant),
                       scale, tensor_scale, description)


FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    _float_element("mxfp8_e4m3", 32, "float8_e4m3fn", "e8m0", "OCP MXFP8, E4M3 elements"),
    _float_element("mxfp8_e5m2", 32, "float8_e5m2", "e8m0", "OCP MXFP8, E5M2 elements"),
    _float_element("mxfp6_e2m3", 32, "float6_e2m3fn", "e8m0", "OCP MXFP6, E2M3 elements"),
    _float_element("mxfp6_e3m2", 32, "float6_e3m2fn", "e8m0", "OCP MXFP6, E3M2 elements"),
    _float_element("mxfp4", 32, "float4_e2m1fn", "e8m0", "OCP MXFP4, E2M1 elements"),
    BlockFormat("mxint8", 32, "int8", 8, 127 / 64, 0, 6, "e8m0", False,
                "OCP MXINT8, int8 elements read as int/64"),
    _float_element("nvfp4", 16, "float4_e2m1fn", "e4m3",
                   "NVIDIA NVFP4: E2M1 elements, E4M3 block scale, optional float32 tensor scale", True),
)}
"""Every block format by name."""

MX_FORMATS = tuple(n for n, f in FORMATS.items() if f.scale == "e8m0")


def get_format(name) -> BlockFormat:
    """The `BlockFormat` called `name` (a key of `FORMATS`).

    >>> get_format("mxfp4").bits_per_value
    4.25
    >>> get_format("mxfp8_e4m3").element_emax
    8
    """
    if isinstance(name, BlockFormat):
        return name
    return FORMATS[choice("format", name, FORMATS)]


def format_table() -> Table:
    """The block formats side by side: block size, element, scale, largest element, bits per value.

    >>> print(format_table().rows[4])
    ('mxfp4', '32', 'float4_e2m1fn', 'e8m0', '6', '2', '4.25')
    """
    rows = [(f.name, str(f.block_size), f.element, f.scale + (" + fp32 per tensor" if f.tensor_scale else ""),
             f"{f.element_max:g}", str(f.element_emax), f"{f.bits_per_value:g}") for f in FORMATS.values()]
    return Table(("format", "block", "element", "scale", "element max", "emax", "bits/value"), tuple(rows),
                 "Block formats (OCP MX v1.0, NVFP4)")
