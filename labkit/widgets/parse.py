"""What a learner may type as a number or a bit pattern, and how it is read: the one
parser behind every widget's text box.

``parse_entry(text, pattern_format)`` (the format explorer) turns one line of text into
an `Entry`: the number to show in every format, and -- when the text is a bit pattern --
the pattern and the format it was read in. ``parse_number(text)`` (the loss-scale
explorer and the scaler playground) reads the same numbers, bit patterns aside, and
refuses one that is beyond float64's range. Anything else raises a ValueError whose
message quotes the input and says what is allowed; the widgets show that message
instead of a traceback.

Accepted forms:

=====================  =====================================================
``0.1  -3.5  1e-8``    a decimal number (``1_000`` works too)
``inf  -inf  nan``     the IEEE specials (``-0`` is negative zero)
``0x1.8p3``            a hex float, as ``float.fromhex`` reads it (12.0)
``256**2  2^-24``      arithmetic with + - * / ** ^ and parentheses, with
``1e-5*1e-5  1/3``     Python's precedence (``-2**2`` is -4); it is done in
                       float64, and the result is then stored in each format
``0x3c00``             a bit pattern, read in `pattern_format` (fp16: 1.0)
``0b0 01111 00..0``    a bit pattern in binary (spaces and ``_`` are ignored)
=====================  =====================================================

Nothing typed is ever run as code: the text is parsed (``ast``) and only number
literals, ``inf``/``nan`` and the operators above are evaluated, each in float64, so
that ``2**99999999999`` is an overflow found at once, not a huge integer computed.
Inputs are at most MAX_LENGTH characters.

>>> parse_entry("0x3c00", "fp16").value
1.0
>>> parse_entry("2^-24").value == 2.0**-24
True
>>> parse_entry("1e-5 * 1e-5").value
1.0000000000000002e-10
>>> parse_number("-2**2")
-4.0
>>> parse_number("2**99999999999")
Traceback (most recent call last):
    ...
ValueError: '2**99999999999' is beyond float64's range (max 1.798e+308); type inf for an infinity
"""

from __future__ import annotations

import ast
import math
import operator
import re
import sys
from dataclasses import dataclass

from labkit._validate import shown
from labkit.formats.spec import FloatFormat, get

MAX_LENGTH = 200
NUMBER_HELP = "type a number (0.1, 1e-8, -inf, nan, 256**2, 2^-24)"
HELP = f"{NUMBER_HELP} or a bit pattern (0x3c00, 0b0011110000000000)"
_BIT_PATTERNS = (  # (what it looks like, its base, what its digits are)
    (re.compile(r"0x[0-9a-f_ ]*"), 16, "hex digits, as in 0x3c00"),
    (re.compile(r"0b[01_ ]*"), 2, "0s and 1s, as in 0b0011110000000000"),
)
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
    """Read `text` as a number or as a bit pattern of `pattern_format` (see the module doc).

    A number beyond float64's range reads as an infinity (``1e400`` is ``inf``), as
    float64 arithmetic would give.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_entry() reads text, got {type(text).__name__}; {HELP}")
    fmt = get(pattern_format)
    raw, low = _read(text, HELP)
    for pattern, base, digits_are in _BIT_PATTERNS:
        if pattern.fullmatch(low) and not re.search(r"[.p]", low):
            digits = low[2:].replace("_", "").replace(" ", "")
            if not digits:
                raise ValueError(f"{shown(raw)} has no digits: a bit pattern is {low[:2]} then {digits_are}")
            return _pattern(raw, int(digits, base), fmt)
    if re.fullmatch(r"[+-]\s*0[xb][0-9a-f_ ]*", low) and not re.search(r"[.p]", low):
        raise ValueError(f"{shown(raw)}: a bit pattern has no sign in front; its top bit is the sign bit")
    return Entry(raw, _number(raw, low, HELP))


def parse_number(text: str) -> float:
    """Read `text` as a number (the forms of the module doc, bit patterns aside), as a float.

    ``inf``, ``-inf`` and ``nan`` are read as typed; a number that only overflows to an
    infinity (``1e400``, ``2**100000``) is refused with a message, since it is not what
    was typed. Whether the number suits the box it was typed in is the caller's check.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_number() reads text, got {type(text).__name__}; {NUMBER_HELP}")
    raw, low = _read(text, NUMBER_HELP)
    value = _number(raw, low, NUMBER_HELP)
    if math.isinf(value) and "inf" not in low:
        raise ValueError(f"{shown(raw)} is beyond float64's range (max {sys.float_info.max:.4g}); "
                         "type inf for an infinity")
    return value


def _read(text: str, help: str) -> tuple[str, str]:
    """The input stripped, and its normal form (lower case, typographic signs made ASCII)."""
    raw = text.strip()
    if not raw:
        raise ValueError(f"the input is empty: {help}")
    if len(raw) > MAX_LENGTH:
        raise ValueError(f"{shown(raw)} is {len(raw)} characters long; at most {MAX_LENGTH} are read")
    return raw, raw.lower().replace("−", "-").replace("×", "*").replace("÷", "/")


def _number(raw: str, low: str, help: str) -> float:
    """A decimal, a hex float or an arithmetic expression, as a float64 (overflow: +-inf)."""
    if _HEX_FLOAT.fullmatch(low):
        try:
            return float.fromhex(low)
        except OverflowError:
            return -math.inf if low.startswith("-") else math.inf
        except ValueError:
            raise ValueError(f"{shown(raw)} is not a valid hex float such as 0x1.8p3: {help}") from None
    try:
        return float(low)
    except ValueError:
        pass
    return _evaluate(raw, low, help)


def _pattern(raw: str, bits: int, fmt: FloatFormat) -> Entry:
    top = (1 << fmt.bits) - 1
    if bits > top:
        width = (fmt.bits + 3) // 4
        raise ValueError(
            f"{raw} does not fit in {fmt.name}: a {fmt.bits}-bit pattern lies in "
            f"0x{0:0{width}x} .. 0x{top:0{width}x}; pick another format for bit patterns"
        )
    return Entry(raw, float(fmt.decode(bits)), fmt.name, bits)


def _evaluate(raw: str, low: str, help: str) -> float:
    """A small arithmetic expression, evaluated in float64 (no names, no calls)."""
    try:
        tree = ast.parse(low.replace("^", "**"), mode="eval")
    except (SyntaxError, ValueError):  # ValueError: a null byte
        raise ValueError(f"{shown(raw)} is not a number: {help}") from None
    try:
        return _eval(tree.body, raw, help)
    except RecursionError:
        raise ValueError(f"{shown(raw)} is nested too deeply") from None


def _eval(node, raw: str, help: str) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        try:
            return float(node.value)
        except OverflowError:
            return math.inf
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, raw, help)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left, raw, help), _eval(node.right, raw, help)
        try:
            result = _OPS[type(node.op)](a, b)
        except ZeroDivisionError:
            raise ValueError(f"{shown(raw)}: division by zero has no value here; "
                             "type inf or -inf for an infinity") from None
        except OverflowError:  # float ** float beyond float64: the IEEE answer is an infinity
            negative = a < 0 and math.isfinite(b) and b == int(b) and int(b) % 2 == 1
            return -math.inf if negative else math.inf
        if isinstance(result, complex):
            raise ValueError(f"{shown(raw)}: {a:g} ** {b:g} is not a real number")
        return float(result)
    raise ValueError(f"{shown(raw)}: only numbers, inf, nan, + - * / ** ^ and parentheses are allowed; {help}")
