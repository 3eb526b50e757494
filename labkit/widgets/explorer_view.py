"""The format explorer's state -> view step, as a pure function (no ipywidgets here).

``explorer_view(entry, pattern_format, names)`` takes what the learner typed (or a
number from the slider) and returns an `ExplorerView`: for each format, its bits
grouped into fields, the stored value, its exact decimal, its neighbours, the rounding
error, the flags (overflow / underflow / subnormal / rounded / exact / nan / inf) and a
short note. The widget in `labkit.widgets.explorer` only copies these strings into its
controls, so everything it shows is tested here.

Text a learner could type never raises: a bad entry gives a view with ``ok=False``
and a message (the widget shows it and keeps the last good view). Programming errors --
an unknown format name, an entry that is neither text nor a real number -- raise.

>>> v = explorer_view("0x3c00", pattern_format="fp16", names=["fp16", "fp8_e4m3"])
>>> print(v)
0x3c00 is an fp16 bit pattern: 1.0
fp16      0x3c00  0 01111 0000000000  1.0  [exact]  <- the pattern you gave
fp8_e4m3  0x38    0 0111 000          1.0  [exact]
>>> hex(flip_bit("fp16", 0x3c00, 15))             # flip the sign bit
'0xbc00'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from labkit._validate import integer, shown
from labkit.formats.bits import split
from labkit.formats.describe import Representation, represent
from labkit.formats.spec import COURSE_FORMATS, FloatFormat, format_names, get
from labkit.formats.summary import bit_fields, decode_formula, error_summary
from labkit.widgets.parse import Entry, parse_entry


@dataclass(frozen=True)
class Bit:
    """One bit of a pattern: its position (0 = least significant), value and field."""

    index: int
    value: int
    field: str

    def __post_init__(self):
        integer("index", self.index, minimum=0)


@dataclass(frozen=True)
class FormatRow:
    """What one format makes of the entry, as the widget shows it."""

    format: str
    bits: int
    hex: str
    bitstring: str
    cells: tuple[Bit, ...]  # most significant first, as drawn
    kind: str
    flags: tuple[str, ...]
    value: float
    value_text: str
    exact: str
    formula: str
    prev_text: str
    next_text: str
    error_text: str
    note: str
    is_source: bool

    def bit(self, index: int) -> Bit:
        """The bit at `index` (0 = least significant)."""
        return self.cells[len(self.cells) - 1 - _check_index(self.format, index)]


@dataclass(frozen=True)
class ExplorerView:
    """The whole explorer: a message, the parsed entry, one row per format.

    ok:      False when the entry could not be read; `message` then says why and
             `rows` is empty.
    message: what the entry was read as (ok) or what is wrong with it (not ok).
    """

    ok: bool
    message: str
    entry: Entry | None
    rows: tuple[FormatRow, ...]

    def __post_init__(self):
        if not isinstance(self.ok, bool):
            raise TypeError(f"ok must be True or False; got {type(self.ok).__name__} {shown(self.ok)}")
        if not isinstance(self.message, str):
            raise TypeError(f"message must be a string; got {type(self.message).__name__} {shown(self.message)}")
        if self.entry is not None and not isinstance(self.entry, Entry):
            raise TypeError(f"entry must be a parsed Entry or None; got {type(self.entry).__name__} {shown(self.entry)}")
        if not isinstance(self.rows, tuple) or not all(isinstance(r, FormatRow) for r in self.rows):
            raise TypeError(f"rows must be a tuple of FormatRows; got {type(self.rows).__name__} {shown(self.rows)}")
        if self.ok and not self.rows:
            raise ValueError("rows must hold at least one FormatRow when ok is True")

    def row(self, name) -> FormatRow:
        want = get(name).name
        for r in self.rows:
            if r.format == want:
                return r
        raise ValueError(f"no row for {want}; the view has {', '.join(r.format for r in self.rows) or 'no rows'}")

    def __str__(self) -> str:
        if not self.ok:
            return f"cannot show this entry: {self.message}"
        w = max(len(r.format) for r in self.rows)
        hw = max(len(r.hex) for r in self.rows)
        bw = max(len(r.bitstring) for r in self.rows)
        vw = max(len(r.value_text) for r in self.rows)
        lines = [self.message]
        for r in self.rows:
            tail = "  <- the pattern you gave" if r.is_source else ""
            lines.append(f"{r.format:<{w}}  {r.hex:<{hw}}  {r.bitstring:<{bw}}  {r.value_text:<{vw}}  "
                         f"[{', '.join(r.flags)}]{tail}")
        return "\n".join(lines)


def flip_bit(fmt: str | FloatFormat, bits: int, index: int) -> int:
    """`bits` with bit `index` (0 = least significant) inverted."""
    f = get(fmt)
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits must be an integer bit pattern, got {type(bits).__name__}")
    if not 0 <= int(bits) < (1 << f.bits):
        raise ValueError(f"{int(bits):#x} is not a {f.bits}-bit {f.name} pattern (0 .. {(1 << f.bits) - 1:#x})")
    return int(bits) ^ (1 << _check_index(f, index))


def _check_index(fmt, index) -> int:
    f = get(fmt)
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"a bit index must be an integer, got {type(index).__name__}")
    if not 0 <= index < f.bits:
        raise ValueError(f"{f.name} has bits 0 .. {f.bits - 1} (0 = least significant), got {index}")
    return int(index)


def explorer_view(entry, pattern_format: str | FloatFormat = "fp16", names=None) -> ExplorerView:
    """The explorer's view of `entry`: text (see `labkit.widgets.parse`) or a real number.

    `names`: the formats shown, one row each; None: the six of ``labkit.formats.COURSE_FORMATS``.
    Any format of ``labkit.formats.FORMATS`` may be shown, or read patterns in:

    >>> print(explorer_view("0x7", pattern_format="fp4", names=["fp4", "fp6_e2m3", "e8m0"]))
    0x7 is an fp4_e2m1 bit pattern: 6.0
    fp4_e2m1  0x7   0 11 1      6.0  [exact]  <- the pattern you gave
    fp6_e2m3  0x1c  0 11 100    6.0  [exact]
    e8m0      0x82  10000010    8.0  [rounded]
    """
    fmts = [get(n) for n in format_names(names, default=COURSE_FORMATS)]
    try:
        pattern_fmt = get(pattern_format)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"pattern_format: {exc}") from None
    if isinstance(entry, str):
        try:
            parsed = parse_entry(entry, pattern_fmt)
        except ValueError as exc:
            return ExplorerView(False, str(exc), None, ())
    elif isinstance(entry, (int, float, np.integer, np.floating)) and not isinstance(entry, (bool, np.bool_)):
        try:
            parsed = Entry(repr(float(entry)), float(entry))
        except OverflowError:
            raise ValueError(f"entry {shown(entry)} is beyond float64's range; type it as text ('1e400' reads "
                             "as inf)") from None
    else:
        raise TypeError(f"entry must be text or a real number (explorer_view() takes either), "
                        f"got {type(entry).__name__}")
    rows = tuple(_row(parsed, f) for f in fmts)
    return ExplorerView(True, _message(parsed), parsed, rows)


def _message(e: Entry) -> str:
    if e.is_pattern:  # its value is what the format says, an infinity or a NaN included
        return f"{e.text} is {_article(e.format)} {e.format} bit pattern: {e.value!r}{_special(e.value)}"
    if math.isinf(e.value) and "inf" not in e.text.lower():
        return f"{e.text} is beyond float64's range (max {np.finfo(np.float64).max:.4g}): it reads as {e.value!r}"
    if math.isfinite(e.value) and repr(e.value) != e.text and e.text.lower().lstrip("+") != repr(e.value):
        return f"{e.text} = {e.value!r} (as a float64)"
    return f"{e.value!r}"


def _special(value: float) -> str:
    if math.isnan(value):
        return " (not a number)"
    if math.isinf(value):
        return " (+infinity)" if value > 0 else " (-infinity)"
    return ""


def _article(name: str) -> str:
    return "an" if name[0] in "aefhilmnorsx" else "a"


def _row(e: Entry, f: FloatFormat) -> FormatRow:
    r = represent(e.value, f)
    source = e.is_pattern and e.format == f.name
    if source and e.bits != r.bits:  # a NaN payload: keep the very pattern given
        sign, exp, man = split(f, e.bits)
        r = replace(r, bits=e.bits, bitstring=f.to_bitstring(e.bits), sign=sign, exponent=exp, mantissa=man)
    pattern = format(r.bits, f"0{f.bits}b")
    cells = tuple(Bit(f.bits - 1 - i, int(b), field) for i, (b, field) in enumerate(zip(pattern, bit_fields(f))))
    return FormatRow(
        format=f.name, bits=r.bits, hex=r.hex, bitstring=r.bitstring, cells=cells, kind=r.kind,
        flags=r.flags, value=r.value, value_text=repr(r.value), exact=r.exact,
        formula=decode_formula(r), prev_text=_num(r.prev), next_text=_num(r.next),
        error_text=error_summary(r), note=_note(r, f, source), is_source=source,
    )


def _num(v: float) -> str:
    return "-" if math.isnan(v) else repr(v)


def _note(r: Representation, f: FloatFormat, source: bool) -> str:
    if source:
        return "the pattern you gave: the stored value is exactly what these bits say"
    if "saturated" in r.flags or (f.saturates and "inf" in r.flags):
        return f"{f.name} has no infinity and no NaN: this saturates to max ({f.max:g})"
    if "invalid" in r.flags:
        return f"{f.name} has no sign and no zero (its smallest value is {f.smallest_normal:.3g}): this becomes NaN"
    if not f.has_inf and ("overflow" in r.flags or "inf" in r.flags):
        return f"{f.name} has no infinity: this becomes NaN (max is {f.max:g})"
    if "overflow" in r.flags:
        return f"too large: rounds beyond max ({f.max:g}) and becomes inf"
    if "underflow" in r.flags:
        return f"too small: below half the smallest subnormal ({f.smallest_subnormal / 2:.3g}), rounds to 0"
    if not f.has_zero and r.value == f.smallest_normal and r.input < f.smallest_normal:
        return f"{f.name} has no zero: a value below {f.smallest_normal:.3g} becomes {f.smallest_normal:.3g}"
    if "subnormal" in r.flags:
        return (f"subnormal: below the smallest normal ({f.smallest_normal:.3g}), "
                f"keeps {r.significant_bits} of {f.mantissa_bits + 1} significant bits")
    return ""
