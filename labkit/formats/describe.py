"""One value, seen through one format: its bits, what it became, and what was lost.

>>> import labkit.formats as lf
>>> r = lf.represent(1e-5 * 1e-5, "fp16")
>>> r.value, r.flags
(0.0, ('underflow',))
>>> lf.represent(256.0 ** 2, "fp16").flags
('overflow',)
>>> print(lf.represent(0.1, "bf16").bitstring, lf.represent(0.1, "bf16").exact)
0 01111011 1001101 0.10009765625
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from labkit._validate import shown
from labkit.formats import bits as _bits
from labkit.formats.spec import COURSE_FORMATS, FloatFormat, format_names, get

FLAGS = ("overflow", "underflow", "subnormal", "rounded", "exact", "nan", "inf", "saturated", "invalid")


@dataclass(frozen=True)
class Representation:
    """What happens to `input` when it is stored in `format`.

    flags: a tuple of
      "overflow"  -- a finite input too large: it became inf (or NaN in fp8_e4m3, fnuz, e8m0),
                     or +-max in fp4 / fp6, which have neither: "saturated" is flagged too;
      "underflow" -- a nonzero input too small: it became zero;
      "subnormal" -- stored below smallest_normal, with fewer significant bits;
      "rounded"   -- stored value differs from the input;
      "exact"     -- stored exactly;
      "nan", "inf" -- the input itself was NaN / infinite;
      "invalid"   -- a finite input the format has no value near: e8m0 (no sign, no zero) makes
                     0 and every negative number NaN.
    """

    format: str
    input: float
    bits: int
    bitstring: str
    sign: int
    exponent: int
    mantissa: int
    value: float
    exact: str
    kind: str
    prev: float
    next: float
    abs_error: float
    rel_error: float
    flags: tuple[str, ...]

    @property
    def hex(self) -> str:
        width = (get(self.format).bits + 3) // 4
        return f"0x{self.bits:0{width}x}"

    @property
    def significant_bits(self) -> int:
        """Bits of precision the stored value keeps (M + 1 for normals, fewer for subnormals)."""
        fmt = get(self.format)
        if self.kind == "normal":
            return fmt.mantissa_bits + 1
        if self.kind == "subnormal":
            return self.mantissa.bit_length()
        return 0


def exact_decimal(value) -> str:
    """The exact decimal expansion of a binary float (every one has a finite one).

    `value` is a Python float, a numpy floating scalar (its own exact value: np.float32(0.1) is
    not the float64 0.1), an ml_dtypes scalar (bfloat16, float8_*), or an int (the float64 nearest
    to it).

    >>> exact_decimal(0.1)   # the float64 nearest to 0.1
    '0.1000000000000000055511151231257827021181583404541015625'
    >>> exact_decimal(np.float32(0.1))
    '0.100000001490116119384765625'
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.generic)):
        raise TypeError(f"value must be a real number (a float, an int, or a numpy scalar); "
                        f"got {type(value).__name__} {shown(value)}")
    if isinstance(value, np.generic) and not isinstance(value, (np.floating, np.integer)):
        if value.dtype.kind != "V" or value.dtype.itemsize > 2:  # ml_dtypes' bfloat16 / float8_* are kind V
            raise TypeError(f"value must be a real number; got a numpy {value.dtype} scalar")
        value = float(value)  # exact: every bfloat16 / float8 value is a float32 value
    elif not isinstance(value, (float, np.floating)):  # an int, a Fraction: the nearest float64
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"value must be within float64's range (|x| < 1.8e308); got {shown(value)}") from None
    if not np.isfinite(value):
        return str(float(value))
    n, d = value.as_integer_ratio()  # exact, also for np.float32 and np.longdouble; d is 2**k
    k = d.bit_length() - 1
    digits = str(abs(n) * 5**k).rjust(k + 1, "0")  # |value| * 10**k, as an integer
    text = digits[: len(digits) - k] + ("." + digits[len(digits) - k:]).rstrip("0").rstrip(".")
    return ("-" if np.signbit(value) else "") + text


def represent(x, fmt: str | FloatFormat) -> Representation:
    """Store the number `x` in `fmt` and describe the result."""
    f = get(fmt)
    if isinstance(x, (str, bytes, bool, np.bool_)) or _bits.ndim(x) != 0:
        raise TypeError(f"x must be one real number (represent() takes one value), got {type(x).__name__} "
                        f"{shown(x)}")
    try:
        x = float(x)
    except OverflowError:
        raise ValueError(f"x must be within float64's range (|x| < 1.8e308), got {shown(x)}") from None
    except (TypeError, ValueError) as exc:
        raise TypeError(f"x must be one real number (represent() takes one value), got {type(x).__name__}") from exc
    bits = f.encode(x)
    sign, exponent, mantissa = _bits.split(f, bits)
    value = f.decode(bits)
    kind = _bits.classify_bits(f, bits)
    flags = []
    if math.isnan(x):
        flags.append("nan")
    elif math.isinf(x):
        flags.append("inf")
    elif _bits.overflows(f, x):
        flags.append("overflow")
        if math.isfinite(value):
            flags.append("saturated")
    elif not math.isfinite(value):
        flags.append("invalid")
    elif value == 0 and x != 0:
        flags.append("underflow")
    else:
        if kind == "subnormal":
            flags.append("subnormal")
        flags.append("exact" if value == x else "rounded")
    abs_error = abs(value - x) if math.isfinite(x) else math.nan
    return Representation(
        format=f.name,
        input=x,
        bits=bits,
        bitstring=f.to_bitstring(bits),
        sign=sign,
        exponent=exponent,
        mantissa=mantissa,
        value=value,
        exact=exact_decimal(value),
        kind=kind,
        prev=f.next_down(value) if not math.isnan(value) else math.nan,
        next=f.next_up(value) if not math.isnan(value) else math.nan,
        abs_error=abs_error,
        rel_error=f.rel_error(x) if math.isfinite(x) else math.nan,
        flags=tuple(flags),
    )


def represent_all(x, names=None) -> list[Representation]:
    """`x` in each of `names`: one format name, a list of them, or None for the six of COURSE_FORMATS.

    >>> [r.value for r in represent_all(100.0, ["fp4", "fp8_e4m3", "e8m0"])]
    [6.0, 96.0, 128.0]
    """
    return [represent(x, name) for name in format_names(names, default=COURSE_FORMATS)]
