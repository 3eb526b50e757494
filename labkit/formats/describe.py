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
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from labkit.formats import bits as _bits
from labkit.formats.spec import FORMATS, FloatFormat, get

FLAGS = ("overflow", "underflow", "subnormal", "rounded", "exact", "nan", "inf")


@dataclass(frozen=True)
class Representation:
    """What happens to `input` when it is stored in `format`.

    flags: a tuple of
      "overflow"  -- a finite input too large: it became inf (or NaN in fp8_e4m3);
      "underflow" -- a nonzero input too small: it became zero;
      "subnormal" -- stored below smallest_normal, with fewer significant bits;
      "rounded"   -- stored value differs from the input;
      "exact"     -- stored exactly;
      "nan", "inf" -- the input itself was NaN / infinite.
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


def exact_decimal(value: float) -> str:
    """The exact decimal expansion of a binary float (every one has a finite one).

    >>> exact_decimal(0.1)   # the float64 nearest to 0.1
    '0.1000000000000000055511151231257827021181583404541015625'
    """
    if not math.isfinite(value):
        return str(value)
    text = format(Decimal(value), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def represent(x, fmt: str | FloatFormat) -> Representation:
    """Store the number `x` in `fmt` and describe the result."""
    f = get(fmt)
    if isinstance(x, (str, bytes, bool, np.bool_)) or np.ndim(x) != 0:
        raise TypeError(f"represent() takes one real number, got {type(x).__name__} {x!r}")
    try:
        x = float(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"represent() takes one real number, got {type(x).__name__}") from exc
    bits = f.encode(x)
    sign, exponent, mantissa = _bits.split(f, bits)
    value = f.decode(bits)
    kind = _bits.classify_bits(f, bits)
    flags = []
    if math.isnan(x):
        flags.append("nan")
    elif math.isinf(x):
        flags.append("inf")
    elif not math.isfinite(value):
        flags.append("overflow")
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
    """`x` in each of `names` (default: every format in lf.FORMATS)."""
    return [represent(x, name) for name in (names or FORMATS)]
