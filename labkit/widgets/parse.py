"""What a learner may type into the format explorer, and how it is read.

``parse_entry(text, pattern_format)`` turns one line of text into an `Entry`: the
number to show in every format, and -- when the text is a bit pattern -- the pattern
and the format it was read in. Anything else raises a ValueError whose message says
what is allowed; the widget shows that message instead of a traceback.

Accepted forms:

=====================  =====================================================
``0.1  -3.5  1e-8``    a decimal number (``1_000`` works too)
``inf  -inf  nan``     the IEEE specials (``-0`` is negative zero)
``0x1.8p3``            a hex float, as ``float.fromhex`` reads it (12.0)
``256**2  2^-24``      arithmetic with + - * / ** ^ and parentheses; it is done
``1e-5*1e-5  1/3``     in float64 and the result is then stored in each format
``0x3c00``             a bit pattern, read in `pattern_format` (fp16: 1.0)
``0b0 01111 00..0``    a bit pattern in binary (spaces and ``_`` are ignored)
=====================  =====================================================

>>> parse_entry("0x3c00", "fp16").value
1.0
>>> parse_entry("2^-24").value == 2.0**-24
True
>>> parse_entry("1e-5 * 1e-5").value
1.0000000000000002e-10
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass

from labkit.formats.spec import FloatFormat, get

MAX_LENGTH = 200
HELP = (
    "type a number (0.1, 1e-8, -inf, nan, 256**2, 2^-24) "
    "or a bit pattern (0x3c00, 0b0011110000000000)"
)
_HEX_PATTERN = re.compile(r"0x[0-9a-f_ ]+")
_BIN_PATTERN = re.compile(r"0b[01_ ]+")
_HEX_FLOAT = re.compile(r"[+-]?0x[0-9a-f]*(\.[0-9a-f]*)?(p[+-]?\d+)?")
_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow,
}
_NAMES = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}


@dataclass(frozen=True)
class Entry:
    """One parsed input.

    text:   the input, stripped;
    value:  the number it stands for, as a float64;
    format, bits: for a bit pattern, the format it was read in and the pattern itself
            (None for a number). A NaN pattern keeps its own bits here, even though
            `value` is just ``nan``.
    """

    text: str
    value: float
    format: str | None = None
    bits: int | None = None

    @property
    def is_pattern(self) -> bool:
        return self.bits is not None


def parse_entry(text: str, pattern_format: str | FloatFormat = "fp16") -> Entry:
    """Read `text` as a number or as a bit pattern of `pattern_format` (see the module doc)."""
    if not isinstance(text, str):
        raise TypeError(f"parse_entry() reads text, got {type(text).__name__}; {HELP}")
    fmt = get(pattern_format)
    raw = text.strip()
    if not raw:
        raise ValueError(f"the input is empty: {HELP}")
    if len(raw) > MAX_LENGTH:
        raise ValueError(f"the input is {len(raw)} characters long; at most {MAX_LENGTH} are read")
    low = raw.lower().replace("−", "-").replace("×", "*").replace("÷", "/")
    if _HEX_PATTERN.fullmatch(low) and not re.search(r"[.p]", low):
        return _pattern(raw, int(low[2:].replace("_", "").replace(" ", ""), 16), fmt)
    if _BIN_PATTERN.fullmatch(low):
        return _pattern(raw, int(low[2:].replace("_", "").replace(" ", ""), 2), fmt)
    if re.fullmatch(r"[+-]\s*0[xb][0-9a-f_ ]*", low) and not re.search(r"[.p]", low):
        raise ValueError(f"{raw!r}: a bit pattern has no sign in front; its top bit is the sign bit")
    if _HEX_FLOAT.fullmatch(low):
        try:
            return Entry(raw, float.fromhex(low))
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{raw!r} is not a valid hex float such as 0x1.8p3 ({exc})") from None
    try:
        return Entry(raw, float(low))
    except ValueError:
        pass
    return Entry(raw, _evaluate(raw, low))


def _pattern(raw: str, bits: int, fmt: FloatFormat) -> Entry:
    top = (1 << fmt.bits) - 1
    if bits > top:
        width = (fmt.bits + 3) // 4
        raise ValueError(
            f"{raw} does not fit in {fmt.name}: a {fmt.bits}-bit pattern lies in "
            f"0x{0:0{width}x} .. 0x{top:0{width}x}; pick another format for bit patterns"
        )
    return Entry(raw, float(fmt.decode(bits)), fmt.name, bits)


def _evaluate(raw: str, low: str) -> float:
    """A small arithmetic expression, evaluated in float64 (no names, no calls)."""
    try:
        tree = ast.parse(low.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError):
        raise ValueError(f"{raw!r} is not a number: {HELP}") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise ValueError(f"{raw!r} is nested too deeply") from None


def _eval(node) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        try:
            return float(node.value)
        except OverflowError:
            return math.inf
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        try:
            result = _OPS[type(node.op)](a, b)
        except ZeroDivisionError:
            raise ValueError("division by zero has no value here; type inf or -inf for an infinity") from None
        except OverflowError:  # float ** float beyond float64: the IEEE answer is an infinity
            negative = a < 0 and b == int(b) and int(b) % 2 == 1
            return -math.inf if negative else math.inf
        if isinstance(result, complex):
            raise ValueError(f"{a:g} ** {b:g} is not a real number")
        return float(result)
    raise ValueError(f"only numbers, inf, nan, + - * / ** ^ and parentheses are allowed: {HELP}")
