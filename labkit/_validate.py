"""Argument checks shared by every public function: one message style, naming what is allowed.

Each check returns the value it accepted (normalised) or raises a ValueError/TypeError whose
message starts with the parameter's name:

>>> integer("batch_size", 8, minimum=1)
8
>>> integer("batch_size", 0, minimum=1)
Traceback (most recent call last):
    ...
ValueError: batch_size must be an integer >= 1; got 0
>>> integer("batch_size", 2.5)
Traceback (most recent call last):
    ...
TypeError: batch_size must be an integer; got float 2.5
>>> names("formats", "fp16", ("fp16", "bf16"))
['fp16']
>>> number("lr", 10**400, minimum=0, inclusive=False)
Traceback (most recent call last):
    ...
ValueError: lr must be a finite number > 0; got an integer of 401 digits
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

__all__ = ["integer", "number", "choice", "names", "out_path", "shown"]


def shown(value) -> str:
    """repr(value), kept short: a huge int or a long sequence is described, not printed whole."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value) -> str:
    return f"{type(value).__name__} {shown(value)}"


def integer(name: str, value, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number (not a bool, not a float that happens to be whole) within [minimum, maximum]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer; got {_kind(value)}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            allowed = f">= {minimum}"
        elif minimum is None:
            allowed = f"<= {maximum}"
        else:
            allowed = f"from {minimum} to {maximum}"
        raise ValueError(f"{name} must be an integer {allowed}; got {shown(value)}")
    return value


def number(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
           inclusive: bool = True, finite: bool = True) -> float:
    """A real number (not a bool) as a Python float, finite unless told, within the bounds.

    `inclusive=False` makes both bounds strict. An int too large for a float64 is refused
    with a message, not an OverflowError.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number; got {_kind(value)}")
    lo, hi = ("" if minimum is None else (">= " if inclusive else "> ") + f"{minimum:g}",
              "" if maximum is None else ("<= " if inclusive else "< ") + f"{maximum:g}")
    allowed = " and ".join(p for p in (lo, hi) if p)
    what = f"{name} must be a {'finite ' if finite else ''}number{' ' + allowed if allowed else ''}"
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{what}; got {shown(value)}") from None
    bad = (finite and not math.isfinite(x)) or math.isnan(x)
    if minimum is not None:
        bad = bad or (x < minimum if inclusive else x <= minimum)
    if maximum is not None:
        bad = bad or (x > maximum if inclusive else x >= maximum)
    if bad:
        raise ValueError(f"{what}; got {shown(value)}")
    return x


def choice(name: str, value, allowed) -> str:
    """One of `allowed` (strings)."""
    allowed = tuple(allowed)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {_kind(value)}")
    if value not in allowed:
        raise ValueError(f"unknown {name} {shown(value)}; choose one of {', '.join(map(repr, allowed))}")
    return value


def names(name: str, value, allowed=None) -> list[str]:
    """A list of names: one name alone is a list of one (never split into letters).

    With `allowed`, every name must be in it.
    """
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be a name or a list of names; got {_kind(value)}")
    for item in items:
        if allowed is None:
            if not isinstance(item, str):
                raise TypeError(f"{name} must hold names (strings); got {_kind(item)}")
        else:
            choice(name, item, allowed)
    return items


def out_path(name: str, value, *, suffixes: tuple[str, ...] | None = None) -> str:
    """A path a result can be written to, checked before any work starts.

    Refuses a non-path, an empty string, an unknown suffix, a directory, a parent that is not a
    directory, and a place this process may not write: each with a message naming the path.
    Nothing is created.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a file path (str or os.PathLike); got {_kind(value)}")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{name} must be a non-empty file path; got {value!r}")
    if suffixes is not None and not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        raise ValueError(f"{name} {path!r} must end in one of {', '.join(suffixes)}")
    if os.path.isdir(path):
        raise ValueError(f"{name} {path!r} is a directory; give a file path inside it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{name} {path!r}: its folder {parent!r} does not exist or is not a folder")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{name} {path!r} exists and cannot be written")
    if not os.path.exists(path) and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {path!r}: its folder {parent!r} cannot be written")
    return path
