"""quantize() and BlockTensor: a float array to block-scaled elements and back, as torchao does it.

Every step is torchao's eager emulation, ported to numpy operation for operation, in float32
(``torchao/prototype/mx_formats/mx_tensor.py``: ``to_mx``, ``_to_mx_rceil``, ``get_fp_scale``,
``to_dtype``; ``nvfp4_tensor.py``: ``nvfp4_quantize``, ``per_tensor_amax_to_scale``), so that
scales and dequantized values agree bit for bit (tests/formats/test_blocks_conformance.py).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from labkit._validate import choice, number, shown
from labkit.formats.blocks.catalog import FORMATS, BlockFormat, get_format

SCALE_ROUNDINGS = ("floor", "ceil", "even", "rceil")
"""torchao's ``ScaleCalculationMode`` values (``torchao/prototype/mx_formats/config.py``)."""

_E8M0 = np.array([2.0 ** (i - 127) for i in range(255)] + [np.nan], np.float32)  # 2^(s - 127); 0xFF is NaN
_RCEIL_RCP = np.array([1.0] + [2.0 ** (127 - i) for i in range(1, 255)] + [np.nan], np.float32)
_F32_MIN_NORMAL = np.float32(2.0 ** -126)
_E4M3_TINY = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).smallest_normal)  # torch.finfo(...).tiny: 2^-6
_E4M3_MAX, _E2M1_MAX = 448.0, 6.0
_FLOAT_KINDS = "float16, bfloat16, float32 or float64"


def _element_values(fmt: BlockFormat) -> np.ndarray:
    """Each element bit pattern's value, as float32: the decoding table."""
    if fmt.element == "int8":
        return np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32) * np.float32(2.0 ** -6)
    codes = np.arange(2 ** fmt.element_bits, dtype=np.uint8)
    return codes.view(fmt.dtype).astype(np.float32)


_DECODE = {name: _element_values(fmt) for name, fmt in FORMATS.items()}


@dataclass(frozen=True, eq=False)
class BlockTensor:
    """A quantized array: one scale per block of the last axis, one bit pattern per element.

    Attributes:
      format: a key of `FORMATS`.
      scales: uint8 bit patterns, one per block, shaped ``x.shape[:-1] + (blocks,)``: E8M0
        (``2^(s - 127)``, 0xFF is NaN) for MX, E4M3 (``float8_e4m3fn``) for NVFP4.
      elements: uint8, shaped like x: each element's bit pattern in its format (the 4 or 6
        bits of fp4/fp6 in the low bits, one per byte, as ml_dtypes stores them; MXINT8's
        two's-complement byte).
      tensor_scale: NVFP4's float32 per-tensor scale, or None (MX, and NVFP4 without one).
      scale_rounding: the MX scale rule used (`SCALE_ROUNDINGS`); None for NVFP4.
    """

    format: str
    scales: np.ndarray
    elements: np.ndarray
    tensor_scale: np.float32 | None = None
    scale_rounding: str | None = None

    def __post_init__(self):
        fmt = get_format(self.format)
        scales, elements = _codes("scales", self.scales, 256), _codes("elements", self.elements, _DECODE[fmt.name].size)
        if elements.ndim == 0 or scales.shape != elements.shape[:-1] + (elements.shape[-1] // fmt.block_size,) \
                or elements.shape[-1] % fmt.block_size:
            raise ValueError(f"scales must have one entry per block of {fmt.block_size} elements along the last axis: "
                             f"elements of shape {elements.shape} need scales of shape "
                             f"{elements.shape[:-1] + (elements.shape[-1] // fmt.block_size,) if elements.ndim else '?'}"
                             f"; got {scales.shape}")
        ts = self.tensor_scale
        if ts is not None:
            if not fmt.tensor_scale:
                raise ValueError(f"tensor_scale must be None for {fmt.name} (only nvfp4 has a per-tensor scale); "
                                 f"got {shown(ts)}")
            # any float32, NaN too: "amax" of an all-zero tensor gives 0 (and NaN scales), as in torchao
            if not (isinstance(ts, (float, np.floating)) and np.isnan(ts)):
                ts = number("tensor_scale", ts, finite=False)
            with np.errstate(over="ignore"):
                ts = np.float32(ts)
        sr = self.scale_rounding
        if fmt.scale == "e8m0":
            sr = choice("scale_rounding", "floor" if sr is None else sr, SCALE_ROUNDINGS)
        elif sr is not None:
            raise ValueError(f"scale_rounding must be None for {fmt.name}: its E4M3 block scale rounds to nearest even")
        for name, value in (("format", fmt.name), ("scales", scales), ("elements", elements),
                            ("tensor_scale", ts), ("scale_rounding", sr)):
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        ts = "" if self.tensor_scale is None else f", tensor_scale={float(self.tensor_scale):.6g}"
        sr = "" if self.scale_rounding is None else f", scale_rounding={self.scale_rounding!r}"
        return f"BlockTensor({self.format!r}, shape={self.shape}, blocks={self.scales.size}{sr}{ts})"

    @property
    def spec(self) -> BlockFormat:
        return FORMATS[self.format]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.elements.shape

    def element_values(self) -> np.ndarray:
        """Each element's own value (float32), before its block's scale multiplies it."""
        return _DECODE[self.format][self.elements]

    def scale_values(self) -> np.ndarray:
        """What multiplies each block (float32): 2^(s-127) (NaN for 0xFF) for MX; for NVFP4 the
        E4M3 value, times the tensor scale when there is one (torchao's ``get_hp_scales``)."""
        if self.spec.scale == "e8m0":
            return _E8M0[self.scales]
        s = self.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return s if self.tensor_scale is None else self.tensor_scale * s

    def dequantize(self) -> np.ndarray:
        """The values this tensor stands for, float32, shaped like the input: element times scale,
        in float32 (torchao's ``to_dtype`` / ``NVFP4Tensor.dequantize``)."""
        bs = self.spec.block_size
        el = self.element_values().reshape(self.scales.shape + (bs,))
        with np.errstate(over="ignore", invalid="ignore"):  # an element times 2^127 may overflow to inf
            return np.multiply(el, self.scale_values()[..., None], out=el).reshape(self.shape)


def _codes(name: str, value, size: int) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # a ragged list
        raise TypeError(f"{name} must be an array of bit patterns; got {type(value).__name__} {shown(value)}") from exc
    if arr.dtype.kind not in "ui":
        raise TypeError(f"{name} must be an array of bit patterns (unsigned integers); got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= size):
        raise ValueError(f"{name} must be bit patterns from 0 to {size - 1}; got values from {arr.min()} to {arr.max()}")
    return arr.astype(np.uint8, copy=False)


def _positive_float32(name: str, value) -> np.float32:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be None, 'amax' or a number > 0; got {type(value).__name__} {shown(value)}")
    with np.errstate(over="ignore", under="ignore"):
        v = np.float32(value)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a number > 0 that float32 holds (about 1e-45 to 3.4e38); got {shown(value)}")
    return v


def float32_blocks(x, fmt: BlockFormat) -> np.ndarray:
    """`x` checked and rounded to float32, reshaped to (..., blocks, block_size)."""
    if isinstance(x, (str, bytes, dict, bool, np.bool_)):
        raise TypeError(f"x must be an array of floats ({_FLOAT_KINDS}); got {type(x).__name__} {shown(x)}")
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # a ragged list
        raise TypeError(f"x must be an array of floats ({_FLOAT_KINDS}); got {type(x).__name__} {shown(x)}") from exc
    if arr.dtype.kind != "f" and arr.dtype not in (np.dtype(ml_dtypes.bfloat16),):
        raise TypeError(f"x must hold floats ({_FLOAT_KINDS}); got dtype {arr.dtype}"
                        + (": convert it with np.asarray(x, np.float32)" if arr.dtype.kind in "iub" else ""))
    if arr.ndim == 0 or arr.size == 0:
        raise ValueError(f"x must have a last axis of blocks of {fmt.block_size} values; got shape {arr.shape}")
    n, bs = arr.shape[-1], fmt.block_size
    if n % bs:
        raise ValueError(f"the last axis of x has {n} values, not a whole number of {fmt.name} blocks of {bs}: "
                         f"pad the last axis from {n} to {-(-n // bs) * bs}")
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, as torch's .to(float32)
        arr = arr.astype(np.float32, copy=False)  # float32 already: read as it is (nothing writes to it)
    return arr.reshape(arr.shape[:-1] + (n // bs, bs))


def quantize(x, format: str, *, scale_rounding: str | None = None, tensor_scale=None) -> BlockTensor:
    """Quantize `x` in blocks along its last axis, exactly as torchao's emulation does.

    `x` (float16/bfloat16/float32/float64, rounded to float32 first) must have a last axis
    that is a multiple of the block size (32; 16 for nvfp4). See the package docstring for
    the rules; in short:

    * MX (`scale_rounding`, default "floor", torchao's default): E8M0 scale
      2^(floor(log2 amax) - emax_elem) ("floor"), rounded up ("ceil", "rceil") or from amax
      rounded to the element's precision ("even"); each element x / scale, rounded to
      nearest even, saturated at the element's max.
    * nvfp4 (`tensor_scale`): None (torchao's default: the E4M3 block scale alone), "amax"
      (a float32 per-tensor scale amax(|x|) / (448 * 6), torchao's
      ``per_tensor_amax_to_scale``, as its dynamic NVFP4 recipe computes it), or a number.

    >>> q = quantize([500.0] + [1.0] * 31, "mxfp8_e4m3")
    >>> int(q.scales[0]), float(q.dequantize()[0])          # 2^0; 500 saturates at 448
    (127, 448.0)
    >>> float(quantize([500.0] + [1.0] * 31, "mxfp8_e4m3", scale_rounding="rceil").dequantize()[0])
    512.0
    """
    fmt = get_format(format)
    if fmt.scale == "e8m0":
        mode = choice("scale_rounding", "floor" if scale_rounding is None else scale_rounding, SCALE_ROUNDINGS)
        if tensor_scale is not None:
            raise ValueError(f"tensor_scale must be None for {fmt.name}: only nvfp4 has a per-tensor scale "
                             f"(MX scales are powers of two per block); got {shown(tensor_scale)}")
        xb = float32_blocks(x, fmt)
        scales, elements = _quantize_mx(xb, fmt, mode)
        return BlockTensor(fmt.name, scales, elements.reshape(xb.shape[:-2] + (-1,)), None, mode)
    if scale_rounding is not None:
        raise ValueError(f"scale_rounding applies to the MX formats (power-of-two scales); {fmt.name}'s E4M3 block "
                         f"scale rounds to nearest even: leave scale_rounding unset; got {shown(scale_rounding)}")
    if not (tensor_scale is None or (isinstance(tensor_scale, str) and tensor_scale == "amax")):
        if isinstance(tensor_scale, str):
            raise ValueError(f"tensor_scale must be None, 'amax' or a number > 0; got {shown(tensor_scale)}")
        tensor_scale = _positive_float32("tensor_scale", tensor_scale)
    xb = float32_blocks(x, fmt)
    if isinstance(tensor_scale, str):
        tensor_scale = _tensor_scale(np.max(np.abs(xb)))  # inf or NaN in x: as torchao, no check
    scales, elements = _quantize_nvfp4(xb, tensor_scale)
    return BlockTensor(fmt.name, scales, elements.reshape(xb.shape[:-2] + (-1,)), tensor_scale, None)


def tensor_scale_from_amax(amax) -> np.float32:
    """NVFP4's per-tensor scale: float32(amax) / (448 * 6), torchao's ``per_tensor_amax_to_scale``.

    With it, the block holding the tensor's amax gets the E4M3 scale 448 (the top of E4M3's range):
    its scale amax / 6 divided by this is 448. An all-zero tensor gives 0, and then NaN scales.

    >>> float(tensor_scale_from_amax(2688.0))
    1.0
    """
    return _tensor_scale(number("amax", amax, minimum=0, finite=False))


def _tensor_scale(amax) -> np.float32:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.float32(amax) / np.float32(_E4M3_MAX * _E2M1_MAX)


def _block_amax(xb: np.ndarray) -> np.ndarray:
    """Each block's largest magnitude (the last axis, a power of two long), NaN if it holds one:
    ``np.max(np.abs(xb), axis=-1)``, computed as a tree of halves (``np.maximum`` propagates NaN),
    which numpy runs about 1.6x faster than a reduction over 16 or 32 values per row."""
    a = np.abs(xb)
    while a.shape[-1] > 1:
        half = a.shape[-1] // 2
        a = np.maximum(a[..., :half], a[..., half:])
    return a[..., 0]


def _quantize_mx(xb: np.ndarray, fmt: BlockFormat, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """torchao's ``to_mx`` in numpy: (scale bits, element bits)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        amax = _block_amax(xb)  # a NaN in the block makes amax NaN, as torch.amax does
        nan = np.isnan(amax)
        top = np.float32(fmt.element_max)
        if mode == "rceil":  # _to_mx_rceil: the descale amax / max rounded up to a power of two
            descale = amax / top
            log2 = np.log2(descale.astype(np.float64)).astype(np.float32)  # float32 log2, as torch.log2 gives it
            biased = np.clip(np.ceil(log2), -127, 127) + 127
            scales = np.where(nan, 255, np.where(np.isinf(descale), 254, np.nan_to_num(biased))).astype(np.uint8)
            rcp = np.where(scales == 255, descale, _RCEIL_RCP[scales])  # 0 -> 1.0 (sic), 254 -> 2^-127
            data = np.clip(xb * rcp[..., None], -top, top)
        else:
            bits = amax.view(np.uint32)
            if mode == "even":  # round amax to the element's mantissa width first
                bits = (bits + np.uint32(1 << (22 - fmt.element_mbits))) & np.uint32(0xFF800000)
                bits = np.where(nan, np.uint32(0x7FC00000), bits)
            pow2 = ((bits >> 23) & 0xFF).astype(np.int32) - 127  # floor(log2 amax): its exponent field
            if mode == "ceil":
                pow2 += (bits & 0x7FFFFF) > 0
            scales = (np.clip(pow2 - fmt.element_emax, -127, 128) + 127).astype(np.uint8)
            scales[nan] = 255
            # torchao divides by max(2^(s-127), 2^-126): a scale of 2^-127 divides by 2^-126 (its note
            # on triton's subnormals); 0xFF reads as inf, so a NaN block's finite elements become 0
            divisor = np.maximum((scales.astype(np.uint32) << 23).view(np.float32), _F32_MIN_NORMAL)
            # times the reciprocal: exact for a power of two (2^-126 .. 2^127; 1/inf = 0 as x/inf), and
            # one multiply is cheaper than a divide
            data = xb * (np.float32(1) / divisor)[..., None]
            if fmt.element_bits == 8 and fmt.element != "int8":
                np.minimum(data, top, out=data)  # e4m3 has no inf: an overflow would be NaN
                np.maximum(data, -top, out=data)
        return scales, _encode(data, fmt)


def _quantize_nvfp4(xb: np.ndarray, tensor_scale: np.float32 | None) -> tuple[np.ndarray, np.ndarray]:
    """torchao's ``nvfp4_quantize`` in numpy: (E4M3 scale bits, E2M1 element bits)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        block_scale = _block_amax(xb) / np.float32(_E2M1_MAX)
        if tensor_scale is None:
            s8 = np.clip(block_scale, _E4M3_TINY, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
            rcp = np.float32(1.0) / s8.astype(np.float32)
        else:
            s8 = np.clip(block_scale / tensor_scale, _E4M3_TINY, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
            rcp = (np.float32(1.0) / tensor_scale) / s8.astype(np.float32)
        data = np.clip(xb * rcp[..., None], -_E2M1_MAX, _E2M1_MAX)
        return s8.view(np.uint8), _encode(data, FORMATS["nvfp4"])


def _encode(data: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """Element bit patterns of float32 `data`: round to nearest even, saturate (ml_dtypes' astype;
    fp4/fp6 have no NaN: ml_dtypes writes a zero there, in a block that decodes to NaN anyway)."""
    if fmt.element == "int8":
        q = np.rint(np.clip(data * np.float32(64.0), -128, 127))
        return np.where(np.isnan(q), 0, q).astype(np.int8).view(np.uint8)
    return data.astype(fmt.dtype).view(np.uint8)
