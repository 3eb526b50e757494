"""What a floating-point format is: a sign bit, E exponent bits, M mantissa bits.

A `FloatFormat` holds the layout and the constants that follow from it, in numpy's
vocabulary (``np.finfo`` / ``ml_dtypes.finfo``): ``eps``, ``smallest_normal``,
``smallest_subnormal``, ``max``. The constants are read from ``ml_dtypes.finfo`` (or
``numpy.finfo`` for fp16/fp32), never typed by hand. TF32 has no numpy dtype: it is
fp32 with a 10-bit mantissa, so its constants are derived from fp32's.

>>> import labkit.formats as lf
>>> fp16 = lf.get("half")
>>> fp16.exponent_bits, fp16.mantissa_bits, fp16.max
(5, 10, 65504.0)
>>> lf.get("bfloat16").smallest_normal == lf.get("fp32").smallest_normal
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from labkit._validate import integer, number, shown
from labkit.formats import bits as _bits


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: its layout, its constants, and conversions.

    Values go in and come out as float64 (every value of these formats is exactly a
    float64); bit patterns are unsigned integers of the format's width.

    Attributes:
      name: canonical short name ("fp16", "bf16", ...).
      bits, exponent_bits, mantissa_bits: the layout (1 sign bit + E + M).
      bias: the exponent bias; a normal value is (-1)^s * 1.m * 2^(e - bias).
      max: the largest finite value.
      smallest_normal: 2^(1 - bias), the smallest value with full precision.
      smallest_subnormal: smallest_normal * eps, the smallest positive value.
      eps: 2^-M, the gap between 1 and the next larger value.
      has_inf: False for fp8 e4m3 (the "fn" variant: finite + NaN only).
      dtype: the numpy / ml_dtypes dtype of the format (None for tf32, stored in float32).
      via_float32: True where the conversion from float64 goes through float32 first, so
        that a float64 within 2^-24 of a rounding tie can round differently than a direct
        conversion would: tf32 (a matmul mode on fp32 inputs), and bf16 and fp8 when the
        installed ml_dtypes converts that way (0.6.0 did; 0.7.0 rounds float64 once).
        labkit asks the installed ml_dtypes (`rounds_through_float32`) and follows it.
    """

    name: str
    bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    has_inf: bool
    dtype: np.dtype | None
    via_float32: bool
    description: str = field(default="", compare=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise TypeError(f"name must be a non-empty string; got {type(self.name).__name__} {shown(self.name)}")
        for name in ("bits", "exponent_bits", "mantissa_bits"):
            object.__setattr__(self, name, integer(name, getattr(self, name), minimum=1, maximum=64))
        if self.bits != 1 + self.exponent_bits + self.mantissa_bits:
            raise ValueError(f"bits must be 1 + exponent_bits + mantissa_bits (a sign bit, then the fields); got "
                             f"bits={self.bits}, exponent_bits={self.exponent_bits}, "
                             f"mantissa_bits={self.mantissa_bits}")
        object.__setattr__(self, "bias", integer("bias", self.bias))
        for name in ("max", "smallest_normal", "smallest_subnormal", "eps"):
            object.__setattr__(self, name, number(name, getattr(self, name), minimum=0, inclusive=False))
        for name in ("has_inf", "via_float32"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False; got {shown(getattr(self, name))}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.dtype is not None and not isinstance(self.dtype, np.dtype):
            raise TypeError(f"dtype must be a numpy dtype or None; got {type(self.dtype).__name__} {shown(self.dtype)}")
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string; got {type(self.description).__name__}")

    # -- derived layout ---------------------------------------------------------------
    @property
    def uint_dtype(self) -> np.dtype:
        """The unsigned integer dtype that holds one bit pattern."""
        return np.dtype(next(f"uint{w}" for w in (8, 16, 32, 64) if w >= self.bits))

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value (1 - bias)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value."""
        return math.frexp(self.max)[1] - 1

    @property
    def decimal_digits(self) -> float:
        """About how many decimal digits the format keeps: (M + 1) * log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def nan_bits(self) -> int:
        """The positive NaN bit pattern this format produces from a NaN input."""
        return _bits.canonical_nan(self)

    # -- conversions (see labkit.formats.bits for the algorithms) ----------------------
    def encode(self, x, saturate: bool = False):
        """Round float(s) to this format (nearest, ties to even) and return the bit patterns.

        ``saturate=False`` (the default) overflows as ``ml_dtypes``' ``astype`` does: to inf,
        or to NaN where the format has no inf (fp8_e4m3). ``saturate=True`` gives +-max
        instead, for an infinite input too: the saturating conversion of FP8 recipes
        (see `labkit.formats.bits`).
        """
        return _bits.encode(self, x, saturate)

    def decode(self, bits):
        """Bit pattern(s) -> float64 value(s)."""
        return _bits.decode(self, bits)

    def round(self, x, saturate: bool = False):
        """The value(s) after a round trip through this format, as float64.

        >>> e4m3 = get("fp8_e4m3")
        >>> e4m3.round(500.0), e4m3.round(500.0, saturate=True)
        (nan, 448.0)
        """
        return _bits.decode(self, _bits.encode(self, x, saturate))

    def fields(self, x):
        """(sign, biased exponent, mantissa) of the encoded value(s), as integers."""
        return _bits.split(self, _bits.encode(self, x))

    def classify(self, x):
        """"zero" | "subnormal" | "normal" | "inf" | "nan" for the encoded value(s)."""
        return _bits.classify_bits(self, _bits.encode(self, x))

    def next_up(self, x):
        """The smallest value of this format strictly greater than x."""
        return _bits.step(self, x, +1)

    def next_down(self, x):
        """The largest value of this format strictly less than x."""
        return _bits.step(self, x, -1)

    def ulp(self, x):
        """The gap between representable values at round(x): 2^(max(e, emin) - M)."""
        return _bits.ulp(self, x)

    def rel_error(self, x):
        """|round(x) - x| / |x|: the relative rounding error (0 where x is 0)."""
        return _bits.rel_error(self, x)

    def to_bitstring(self, bits: int, sep: str = " ") -> str:
        """'0 01111 0000000000' for fp16's 1.0: sign, exponent and mantissa fields.

        `bits` is one bit pattern: an integer (not a bool, not a float) in 0 .. 2^bits - 1.
        """
        return _bits.bitstring(self, bits, sep)

    def __repr__(self) -> str:
        return (
            f"FloatFormat({self.name}: 1+{self.exponent_bits}+{self.mantissa_bits} bits, "
            f"max={self.max:.6g}, smallest_normal={self.smallest_normal:.6g}, "
            f"smallest_subnormal={self.smallest_subnormal:.6g}, eps={self.eps:.6g})"
        )


def rounds_through_float32(dtype) -> bool:
    """Does ``np.asarray(x, float64).astype(dtype)`` round twice, through float32?

    Asked of the installed library on 1 + eps/2 + 2^-30: just above the tie between 1 and
    1 + eps, but in float32 exactly the tie, which then rounds to even, down to 1. One rounding
    goes up. ml_dtypes 0.6.0 converted float64 to bf16 and fp8 through float32; 0.7.0 rounds
    once (jax-ml/ml_dtypes pull request 401 describes the change), as numpy's float16 always has.
    """
    eps = float(ml_dtypes.finfo(dtype).eps)
    x = np.float64(1 + eps / 2 + 2.0**-30)
    return float(np.asarray(x).astype(dtype)) == 1.0


def _from_finfo(name, dtype, *, has_inf, via_float32, description) -> FloatFormat:
    info = ml_dtypes.finfo(dtype)
    return FloatFormat(
        name=name,
        bits=int(info.bits),
        exponent_bits=int(info.nexp),
        mantissa_bits=int(info.nmant),
        bias=1 - int(info.minexp),
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal),
        eps=float(info.eps),
        has_inf=has_inf,
        dtype=np.dtype(dtype),
        via_float32=via_float32,
        description=description,
    )


def _tf32() -> FloatFormat:
    # TF32 is not a storage format: tensor cores read fp32 inputs and keep 10 of their
    # 23 mantissa bits. Its range is fp32's; its precision is fp16's.
    f32 = ml_dtypes.finfo(np.float32)
    mant = 10
    eps = 2.0**-mant
    return FloatFormat(
        name="tf32",
        bits=1 + int(f32.nexp) + mant,
        exponent_bits=int(f32.nexp),
        mantissa_bits=mant,
        bias=1 - int(f32.minexp),
        max=float((2 - eps) * 2.0 ** (int(f32.maxexp) - 1)),
        smallest_normal=float(f32.smallest_normal),
        smallest_subnormal=float(f32.smallest_normal) * eps,
        eps=eps,
        has_inf=True,
        dtype=None,
        via_float32=True,
        description="NVIDIA TensorFloat-32: fp32 range, 10-bit mantissa; a matmul mode, not a storage type",
    )


FORMATS: dict[str, FloatFormat] = {
    "fp32": _from_finfo(
        "fp32", np.float32, has_inf=True, via_float32=False,
        description="IEEE 754 single precision (binary32)",
    ),
    "tf32": _tf32(),
    "fp16": _from_finfo(
        "fp16", np.float16, has_inf=True, via_float32=False,
        description="IEEE 754 half precision (binary16)",
    ),
    "bf16": _from_finfo(
        "bf16", ml_dtypes.bfloat16, has_inf=True, via_float32=rounds_through_float32(ml_dtypes.bfloat16),
        description="Google Brain bfloat16: fp32's exponent, 7-bit mantissa",
    ),
    "fp8_e4m3": _from_finfo(
        "fp8_e4m3", ml_dtypes.float8_e4m3fn, has_inf=False, via_float32=rounds_through_float32(ml_dtypes.float8_e4m3fn),
        description="OCP FP8 E4M3 ('fn': no infinity, one NaN per sign, max 448)",
    ),
    "fp8_e5m2": _from_finfo(
        "fp8_e5m2", ml_dtypes.float8_e5m2, has_inf=True, via_float32=rounds_through_float32(ml_dtypes.float8_e5m2),
        description="OCP FP8 E5M2: fp16's exponent, 2-bit mantissa",
    ),
}

_ALIASES = {
    "fp32": ("float32", "f32", "single", "float", "binary32"),
    "tf32": ("tensorfloat32", "tensorfloat-32", "tensor_float_32"),
    "fp16": ("float16", "f16", "half", "binary16"),
    "bf16": ("bfloat16", "brain", "brainfloat16"),
    "fp8_e4m3": ("e4m3", "e4m3fn", "fp8_e4m3fn", "float8_e4m3fn", "float8_e4m3", "fp8"),
    "fp8_e5m2": ("e5m2", "float8_e5m2"),
}


def _key(name: str) -> str:
    """'torch.BFloat16' -> 'bfloat16', 'fp8-e4m3' -> 'fp8e4m3'."""
    key = name.strip().lower()
    for prefix in ("jax.numpy.", "torch.", "jnp.", "numpy.", "np.", "tf.", "ml_dtypes."):
        key = key.removeprefix(prefix)
    return "".join(ch for ch in key if ch not in "-_ ")


_LOOKUP = {_key(name): name for name in FORMATS}
_LOOKUP.update({_key(alias): name for name, aliases in _ALIASES.items() for alias in aliases})


def get(name) -> FloatFormat:
    """The FloatFormat called `name`.

    Accepts the canonical names (fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2), common aliases
    ("bfloat16", "float16", "half", "e4m3", ...), case-insensitively, a numpy /
    ml_dtypes dtype, a framework dtype whose name is one of these (``torch.bfloat16``),
    or a FloatFormat (returned as is).
    """
    if isinstance(name, FloatFormat):
        return name
    given = name
    if not isinstance(name, str):
        try:
            name = np.dtype(name).name
        except TypeError:
            name = str(name)
    key = _key(name)
    if key not in _LOOKUP:
        valid = ", ".join(FORMATS)
        raise ValueError(
            f"unknown float format {shown(given)}; valid names are {valid} "
            f"(aliases such as 'bfloat16', 'float16', 'half', 'e4m3', 'e5m2' work too)"
        )
    return FORMATS[_LOOKUP[key]]



def format_arg(what: str, name) -> FloatFormat:
    """`get(name)` for the parameter called `what`: its error names the parameter.

    >>> format_arg("accumulator", "fp32").name
    'fp32'
    """
    try:
        return get(name)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


MAX_NAMES = 100
"""The most format names one table or figure takes (there are six formats; repeats are allowed)."""


def format_names(names, what: str = "names") -> list[str]:
    """Canonical names of `names`: one name (never split into letters), several, or None for all.

    A name is anything `get` takes (a name, an alias, a dtype, a FloatFormat).

    >>> format_names("half"), format_names(["bf16", "e4m3"])
    (['fp16'], ['bf16', 'fp8_e4m3'])
    """
    if names is None:
        return list(FORMATS)
    if isinstance(names, (str, FloatFormat, np.dtype, type)) or not hasattr(names, "__iter__"):
        return [format_arg(what, names).name]  # one name, or a framework dtype (torch.bfloat16)
    if isinstance(names, bytes):
        raise TypeError(f"{what} must be a format name or a list of them (e.g. ['fp16', 'bf16']); "
                        f"got {type(names).__name__} {shown(names)}")
    out = []
    for name in names:
        out.append(format_arg(what, name).name)
        if len(out) > MAX_NAMES:
            raise ValueError(f"{what}: at most {MAX_NAMES} format names, got more")
    if not out:
        raise ValueError(f"{what}: give at least one format name; valid names are {', '.join(FORMATS)}")
    return out
