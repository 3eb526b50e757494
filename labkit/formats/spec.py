"""What a floating-point format is: a sign bit, E exponent bits, M mantissa bits.

A `FloatFormat` holds the layout and the constants that follow from it, in numpy's
vocabulary (``np.finfo`` / ``ml_dtypes.finfo``): ``eps``, ``smallest_normal``,
``smallest_subnormal``, ``max``. The constants are read from ``ml_dtypes.finfo`` (or
``numpy.finfo`` for fp16/fp32), never typed by hand. TF32 has no numpy dtype: it is
fp32 with a 10-bit mantissa, so its constants are derived from fp32's.

The catalog has two parts. ``COURSE_FORMATS`` are the six formats of notebooks 01-08
(fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2); tables and figures show these when given no
names. ``SUBBYTE_FORMATS`` are the element and scale formats of block scaling (OCP MX
v1.0, NVFP4) and AMD's "fnuz" FP8, each the ``ml_dtypes`` dtype of that name:

=================  =====================  =================================================
fp4_e2m1           ``float4_e2m1fn``      1+2+1, max 6; no inf, no NaN (an overflow saturates)
fp6_e2m3           ``float6_e2m3fn``      1+2+3, max 7.5; no inf, no NaN
fp6_e3m2           ``float6_e3m2fn``      1+3+2, max 28; no inf, no NaN
e8m0               ``float8_e8m0fnu``     8 exponent bits, no sign, no mantissa: 2^(e - 127);
                                          no zero, 0xFF is NaN (the MX block scale)
fp8_e4m3fnuz       ``float8_e4m3fnuz``    1+4+3, bias 8, max 240; NaN is 0x80 (no -0), no inf
fp8_e5m2fnuz       ``float8_e5m2fnuz``    1+5+2, bias 16, max 57344; NaN is 0x80, no inf
=================  =====================  =================================================

ml_dtypes stores fp4 and fp6 one value per byte, in the low bits (``itemsize`` 1); a bit
pattern here is the value's own 4 or 6 bits. ``FORMATS`` holds all twelve.

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

from labkit._validate import choice, integer, number, shown
from labkit.formats import bits as _bits

NAN_ENCODINGS = ("ieee", "all-ones", "negative-zero", "none")
"""Which patterns are NaN: see `FloatFormat.nan_encoding`."""


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
      signed: False for e8m0, which has no sign bit (bits = E + M); True otherwise (bits = 1 + E + M).
      nan_encoding: which patterns are NaN (one of NAN_ENCODINGS):
        "ieee"          exponent all ones, mantissa not 0 (fp32, fp16, bf16, fp8_e5m2; these have inf);
        "all-ones"      only exponent and mantissa all ones, one per sign (fp8_e4m3 "fn"; e8m0: 0xFF);
        "negative-zero" the pattern of -0, 0x80: the "fnuz" formats, which have no -0;
        "none"          no NaN at all (fp4_e2m1, fp6_*: every pattern is a number).
        Left empty it is "ieee" with inf and "all-ones" without.
      subnormals: False for e8m0, whose exponent field 0 is the normal value 2^-127 (so it has no zero).
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
    signed: bool = True
    nan_encoding: str = ""
    subnormals: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise TypeError(f"name must be a non-empty string; got {type(self.name).__name__} {shown(self.name)}")
        for name in ("bits", "exponent_bits", "mantissa_bits"):  # e8m0 has no mantissa bits
            object.__setattr__(self, name, integer(name, getattr(self, name),
                                                   minimum=0 if name == "mantissa_bits" else 1, maximum=64))
        for name in ("signed", "subnormals"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False; got {shown(getattr(self, name))}")
            object.__setattr__(self, name, bool(getattr(self, name)))
        if self.bits != self.signed + self.exponent_bits + self.mantissa_bits:
            sign = "1 + " if self.signed else ""
            raise ValueError(f"bits must be {sign}exponent_bits + mantissa_bits ("
                             f"{'a sign bit, then the fields' if self.signed else 'no sign bit: signed=False'}); "
                             f"got bits={self.bits}, exponent_bits={self.exponent_bits}, "
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
        if self.nan_encoding == "":
            object.__setattr__(self, "nan_encoding", "ieee" if self.has_inf else "all-ones")
        choice("nan_encoding", self.nan_encoding, NAN_ENCODINGS)
        if self.has_inf != (self.nan_encoding == "ieee"):
            raise ValueError(f"has_inf={self.has_inf} does not go with nan_encoding={self.nan_encoding!r}: only "
                             "the 'ieee' encoding keeps the all-ones exponent for inf and NaN")
        if self.nan_encoding == "negative-zero" and not self.signed:
            raise ValueError("nan_encoding='negative-zero' needs a sign bit (NaN is the pattern of -0)")
        if not self.subnormals and self.nan_encoding == "negative-zero":
            raise ValueError("nan_encoding='negative-zero' needs subnormals=True (a zero to take the sign from)")

    # -- derived layout ---------------------------------------------------------------
    @property
    def uint_dtype(self) -> np.dtype:
        """The unsigned integer dtype that holds one bit pattern."""
        return np.dtype(next(f"uint{w}" for w in (8, 16, 32, 64) if w >= self.bits))

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value: 1 - bias (e8m0, without subnormals: -bias)."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def has_nan(self) -> bool:
        """False for fp4_e2m1 and fp6_*: no pattern is NaN."""
        return self.nan_encoding != "none"

    @property
    def has_zero(self) -> bool:
        """False for e8m0: its smallest value is 2^-127 (a value below it becomes 2^-127)."""
        return self.subnormals

    @property
    def has_negative_zero(self) -> bool:
        """True where -0 has its own pattern (not in e8m0, nor in the fnuz formats: there 0x80 is NaN)."""
        return self.signed and self.has_zero and self.nan_encoding != "negative-zero"

    @property
    def storage_bits(self) -> int:
        """Bits one stored value takes: 8 * itemsize (fp4 and fp6: one per byte in ml_dtypes), or `bits`."""
        return 8 * self.dtype.itemsize if self.dtype is not None else self.bits

    @property
    def saturates(self) -> bool:
        """Does the format's own conversion (ml_dtypes' ``astype``) saturate an overflow to +-max?

        True only where there is nothing else to overflow to: fp4_e2m1 and fp6_* have no inf and
        no NaN. The others overflow to inf ("ieee") or to NaN (fp8_e4m3, e8m0, fnuz); see `encode`.
        """
        return not self.has_nan

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value."""
        return math.frexp(self.max)[1] - 1

    @property
    def decimal_digits(self) -> float:
        """About how many decimal digits the format keeps: (M + 1) * log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def nan_bits(self) -> int | None:
        """The positive NaN bit pattern this format produces from a NaN input (None: it has no NaN)."""
        return _bits.canonical_nan(self)

    # -- conversions (see labkit.formats.bits for the algorithms) ----------------------
    def encode(self, x, saturate: bool | None = None):
        """Round float(s) to this format (nearest, ties to even) and return the bit patterns.

        The two conversion modes of the OCP FP8 and MX specifications:

        * ``saturate=False``, "non-saturating": an overflow becomes inf, or NaN where the format
          has no inf (fp8_e4m3, the fnuz formats, e8m0), as ``ml_dtypes``' ``astype`` does.
          fp4_e2m1 and fp6_* have neither, so they have no such mode (ValueError);
        * ``saturate=True``, "saturating": an overflow, and an infinite input, become +-max,
          the conversion of FP8 training recipes (see `labkit.formats.bits`);
        * ``saturate=None`` (the default): the format's own rule, what ``astype`` does: saturating
          for fp4_e2m1 / fp6_* (`saturates`), non-saturating for every other format.
        """
        return _bits.encode(self, x, saturate)

    def decode(self, bits):
        """Bit pattern(s) -> float64 value(s)."""
        return _bits.decode(self, bits)

    def round(self, x, saturate: bool | None = None):
        """The value(s) after a round trip through this format, as float64 (`saturate`: see `encode`).

        >>> e4m3 = get("fp8_e4m3")
        >>> e4m3.round(500.0), e4m3.round(500.0, saturate=True)
        (nan, 448.0)
        >>> get("fp4").round([100.0, 2.5, 0.2]).tolist()   # saturates at 6; 2.5 ties to even, 2
        [6.0, 2.0, 0.0]
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

    @property
    def layout(self) -> str:
        """'1+5+10' for fp16 (sign + exponent + mantissa bits); '8+0' for e8m0, which has no sign bit."""
        return f"{'1+' if self.signed else ''}{self.exponent_bits}+{self.mantissa_bits}"

    def __repr__(self) -> str:
        return (
            f"FloatFormat({self.name}: {self.layout} bits, "
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


def _from_finfo(name, dtype, *, has_inf, via_float32, description, **layout) -> FloatFormat:
    info = ml_dtypes.finfo(dtype)
    subnormals = layout.get("subnormals", True)
    return FloatFormat(
        name=name,
        bits=int(info.bits),
        exponent_bits=int(info.nexp),
        mantissa_bits=int(info.nmant),
        bias=(1 if subnormals else 0) - int(info.minexp),  # smallest normal = 2^minexp
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal),
        eps=float(info.eps),
        has_inf=has_inf,
        dtype=np.dtype(dtype),
        via_float32=via_float32,
        description=description,
        **layout,
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


def _ml(name, dtype_name, description, **layout) -> FloatFormat:
    """A format of ml_dtypes without inf, read from its finfo; rounding as the installed ml_dtypes rounds."""
    dtype = getattr(ml_dtypes, dtype_name)
    return _from_finfo(name, dtype, has_inf=False, via_float32=rounds_through_float32(dtype),
                       description=description, **layout)


COURSE_FORMATS: dict[str, FloatFormat] = {
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
"""The six formats of notebooks 01-08: what a table or a figure shows when given no names."""

SUBBYTE_FORMATS: dict[str, FloatFormat] = {
    "fp4_e2m1": _ml("fp4_e2m1", "float4_e2m1fn", "OCP MX FP4 E2M1 (MXFP4, NVFP4 elements): 15 values up to 6; "
                    "no inf, no NaN: an overflow saturates", nan_encoding="none"),
    "fp6_e2m3": _ml("fp6_e2m3", "float6_e2m3fn", "OCP MX FP6 E2M3: max 7.5; no inf, no NaN: an overflow saturates",
                    nan_encoding="none"),
    "fp6_e3m2": _ml("fp6_e3m2", "float6_e3m2fn", "OCP MX FP6 E3M2: max 28; no inf, no NaN: an overflow saturates",
                    nan_encoding="none"),
    "e8m0": _ml("e8m0", "float8_e8m0fnu", "OCP MX E8M0 block scale: 2^(e - 127), no sign, no zero, "
                "no mantissa; 0xFF is NaN", signed=False, nan_encoding="all-ones", subnormals=False),
    "fp8_e4m3fnuz": _ml("fp8_e4m3fnuz", "float8_e4m3fnuz", "FP8 E4M3 'fnuz' (AMD MI300, Graphcore): bias 8, "
                        "max 240; no inf, no -0, one NaN at 0x80", nan_encoding="negative-zero"),
    "fp8_e5m2fnuz": _ml("fp8_e5m2fnuz", "float8_e5m2fnuz", "FP8 E5M2 'fnuz' (AMD MI300, Graphcore): bias 16, "
                        "max 57344; no inf, no -0, one NaN at 0x80", nan_encoding="negative-zero"),
}
"""Block-scaling element and scale formats (OCP MX v1.0, NVFP4) and the fnuz FP8s, from ml_dtypes."""

FORMATS: dict[str, FloatFormat] = {**COURSE_FORMATS, **SUBBYTE_FORMATS}
"""Every format: name -> FloatFormat (`get` finds each by name, alias or dtype)."""

_ALIASES = {
    "fp32": ("float32", "f32", "single", "float", "binary32"),
    "tf32": ("tensorfloat32", "tensorfloat-32", "tensor_float_32"),
    "fp16": ("float16", "f16", "half", "binary16"),
    "bf16": ("bfloat16", "brain", "brainfloat16"),
    "fp8_e4m3": ("e4m3", "e4m3fn", "fp8_e4m3fn", "float8_e4m3fn", "float8_e4m3", "fp8"),
    "fp8_e5m2": ("e5m2", "float8_e5m2"),
    "fp4_e2m1": ("fp4", "e2m1", "float4_e2m1fn", "float4_e2m1", "fp4_e2m1fn", "mxfp4_element", "nvfp4_element"),
    "fp6_e2m3": ("e2m3", "float6_e2m3fn", "float6_e2m3", "fp6_e2m3fn"),
    "fp6_e3m2": ("e3m2", "float6_e3m2fn", "float6_e3m2", "fp6_e3m2fn"),
    "e8m0": ("float8_e8m0fnu", "fp8_e8m0", "e8m0fnu", "fp8_e8m0fnu", "float8_e8m0", "ue8m0", "mx_scale"),
    "fp8_e4m3fnuz": ("e4m3fnuz", "float8_e4m3fnuz"),
    "fp8_e5m2fnuz": ("e5m2fnuz", "float8_e5m2fnuz"),
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

    Accepts the canonical names (fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2, and fp4_e2m1
    fp6_e2m3 fp6_e3m2 e8m0 fp8_e4m3fnuz fp8_e5m2fnuz), common aliases ("bfloat16",
    "float16", "half", "e4m3", "fp4", "e2m1", "float8_e8m0fnu", ...), case-insensitively,
    a numpy / ml_dtypes dtype, a framework dtype whose name is one of these
    (``torch.bfloat16``, ``torch.float8_e8m0fnu``), or a FloatFormat (returned as is).

    >>> get("fp4").name, get("float6_e3m2fn").name, get(ml_dtypes.float8_e8m0fnu).name
    ('fp4_e2m1', 'fp6_e3m2', 'e8m0')
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
"""The most format names one table or figure takes (there are twelve formats; repeats are allowed)."""


def format_names(names, what: str = "names", default=None) -> list[str]:
    """Canonical names of `names`: one name (never split into letters), several, or None for `default`.

    A name is anything `get` takes (a name, an alias, a dtype, a FloatFormat). `default` is the
    names None stands for: every format (None), or e.g. ``COURSE_FORMATS`` -- what the tables,
    figures and the explorer show when given no names, so that adding a format to the catalog
    does not change them.

    >>> format_names("half"), format_names(["bf16", "e4m3"])
    (['fp16'], ['bf16', 'fp8_e4m3'])
    >>> format_names(None, default=COURSE_FORMATS)
    ['fp32', 'tf32', 'fp16', 'bf16', 'fp8_e4m3', 'fp8_e5m2']
    """
    if names is None:
        return list(FORMATS if default is None else default)
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
