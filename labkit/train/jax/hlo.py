"""Reading XLA's HLO text: what a compiled (or lowered) JAX program really runs.

Two readings of the same instructions (``%name = type opcode(operands), attributes``):

* `hlo_summary`: the matrix multiplies and dtype conversions of an optimised module -- what
  the backend does with a bf16 dot (XLA:CPU converts both operands to f32, multiplies in f32,
  converts back);
* `collectives`: every array a collective moves (all-reduce, all-gather, reduce-scatter, ...),
  with its dtype and bytes -- what a sharded step sends between devices.

`hlo_text` gives the text of a ``jax.stages.Compiled`` (after XLA's passes) or a
``jax.stages.Lowered`` (before them: what the program asks for).

>>> print(hlo_summary("%d = f32[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}"))
dots: 1 x (? x ? -> f32); converts: none
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\([^=]*?\)|\S+)\s+"
                    r"(?P<op>[\w\-]+)\((?P<rest>.*)$")
_COMMENT = re.compile(r"/\*.*?\*/")  # e.g. /*index=5*/ inside long tuple shapes
_ELEMENT = re.compile(r"\(?\s*(\w+)\[")  # f32[64,64]{1,0} -> f32; (bf16[..], s8[..]) -> bf16
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_LIBRARY_MATMUL = re.compile(r"gemm|matmul|dot", re.IGNORECASE)
_COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
              "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def hlo_text(program) -> str:
    """HLO text of a ``jax.stages.Compiled`` (after XLA's passes), a ``jax.stages.Lowered``
    (before them: what the program asks for), or a string already."""
    if isinstance(program, str):
        return program
    if type(program).__name__ == "Lowered":
        return program.as_text(dialect="hlo")
    if hasattr(program, "as_text"):
        return program.as_text()
    raise TypeError(f"collectives() takes a jax Compiled or Lowered program or HLO text, got {type(program).__name__}")


def _instructions(text: str):
    """(name, result type, opcode, the rest of the line) for every instruction line."""
    for line in text.splitlines():
        m = _INSTR.match(_COMMENT.sub("", line))
        if m:
            yield m["name"], m["type"], m["op"], m["rest"]


def _operand_names(rest: str) -> list[str]:
    return re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])


# -- dots and converts ------------------------------------------------------------------------
@dataclass(frozen=True)
class HloSummary:
    """The matrix multiplies and dtype conversions in an optimised (compiled) HLO module.

    dots: Counter of "lhs x rhs -> result" element types of every ``dot``, e.g.
      {"f32 x f32 -> f32": 8}; a matmul the backend hands to a library (a ``custom-call``
      such as GPU's ``__cublas$gemm``) is listed with its target in brackets.
    converts: Counter of "from->to", e.g. {"bf16->f32": 40}.
    """

    dots: Counter = field(default_factory=Counter)
    converts: Counter = field(default_factory=Counter)

    def __post_init__(self):
        for name in ("dots", "converts"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool)
                                                      for k, n in value.items()):
                raise TypeError(f"{name} must be a Counter (a dict of str -> count), got {type(value).__name__}")
            object.__setattr__(self, name, Counter(value))

    def __str__(self) -> str:
        dots = ", ".join(f"{n} x ({k})" for k, n in sorted(self.dots.items())) or "none"
        conv = ", ".join(f"{n} x {k}" for k, n in sorted(self.converts.items())) or "none"
        return f"dots: {dots}; converts: {conv}"


def hlo_summary(hlo_text: str) -> HloSummary:
    """Read the dots and converts out of ``compiled.as_text()`` (optimised HLO text).

    Use the *compiled* text (``jax.jit(f).lower(*args).compile().as_text()``), not the
    lowered StableHLO: only the compiled module shows what the backend does with a bf16
    dot (on XLA:CPU it converts both operands to f32, multiplies in f32, converts back).
    """
    if not isinstance(hlo_text, str):
        raise TypeError(f"hlo_summary takes HLO text (compiled.as_text()), got {type(hlo_text).__name__}")
    types: dict[str, str] = {}
    ops = []
    for name, result, opcode, rest in _instructions(hlo_text):
        element = _ELEMENT.match(result)
        if element:
            types[name] = element.group(1)
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            ops.append((element.group(1), opcode, _operand_names(rest), target.group(1) if target else ""))
    dots, converts = Counter(), Counter()
    for etype, opcode, operands, target in ops:
        library = opcode == "custom-call" and _LIBRARY_MATMUL.search(target)
        if (opcode == "dot" or library) and len(operands) >= 2:
            lhs, rhs = (types.get(o, "?") for o in operands[:2])
            dots[f"{lhs} x {rhs} -> {etype}" + (f" ({target})" if library else "")] += 1
        elif opcode == "convert" and operands:
            converts[f"{types.get(operands[0], '?')}->{etype}"] += 1
    return HloSummary(dots, converts)


# -- collectives ------------------------------------------------------------------------------
class Collective(NamedTuple):
    """One array moved by a collective: op ("all-reduce", ...), HLO dtype ("f32", "bf16",
    "pred"), shape, and bytes: the full array the collective reduces or gathers (an
    all-reduce's buffer, an all-gather's gathered result, a reduce-scatter's input)."""

    op: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(text)]


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    if dtype not in _HLO_BYTES and not dtype.startswith("f8"):
        raise ValueError(f"unknown HLO element type {dtype!r}")
    return _HLO_BYTES.get(dtype, 1) * math.prod(shape)


def collectives(program) -> list[Collective]:
    """Every array moved by a collective in `program` (see `hlo_text`), in program order.

    A combined collective (XLA merges small all-reduces into one tuple-shaped op) gives one
    row per array. Asynchronous pairs (``all-reduce-start`` / ``-done``) count once.

    >>> collectives("%ar = bf16[64,32]{1,0} all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%add")
    [Collective(op='all-reduce', dtype='bf16', shape=(64, 32), bytes=4096)]
    """
    shapes: dict[str, list] = {}
    found = []
    for name, result, opcode, rest in _instructions(hlo_text(program)):
        shapes[name] = _arrays(result)
        base = opcode.removesuffix("-start")
        if base not in _COLLECTIVE_OPS:
            continue
        operands = rest.split(")", 1)[0]
        if base in ("reduce-scatter", "all-to-all", "collective-permute") or (base == "all-reduce" and opcode != base):
            moved = _arrays(operands) or [a for tok in re.findall(r"%?([\w.\-]+)", operands) for a in shapes.get(tok, [])]
        elif base == "all-gather" and opcode != base:  # all-gather-start: (operands..., results...)
            arrays = shapes[name]
            moved = arrays[len(arrays) // 2:]
        else:
            moved = shapes[name]
        found += [Collective(base, dt, shape, _nbytes(dt, shape)) for dt, shape in moved]
    return found


def total_bytes(found: list[Collective]) -> int:
    """The bytes of all `collectives` together: one step's communication payload."""
    if isinstance(found, (str, bytes)) or not hasattr(found, "__iter__"):
        raise TypeError(f"found must be a list of Collective (collectives' result), got {type(found).__name__}")
    found = list(found)
    if not all(isinstance(c, Collective) for c in found):
        raise TypeError("found must be a list of Collective (collectives' result)")
    return int(sum(c.bytes for c in found))


__all__ = ["Collective", "HloSummary", "collectives", "hlo_summary", "hlo_text", "total_bytes"]
