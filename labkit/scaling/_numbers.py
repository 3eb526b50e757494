"""Small numeric helpers shared by the scalers: float32 rounding and input checks.

Several libraries keep the loss scale in a float32 tensor (torch's GradScaler, Keras,
jmp). A Python float is a float64, so a faithful replay rounds each new scale to
float32 exactly once, the way the library's kernel stores it:

>>> f32(0.1)
0.10000000149011612
>>> f32(2.0 ** 128)   # past float32's max: the kernel would store inf
inf
"""

from __future__ import annotations

import math
import numbers
import struct

import numpy as np

_F32 = struct.Struct("<f")
INF = math.inf


def f32(x: float) -> float:
    """x rounded to the nearest float32 (ties to even), returned as a Python float.

    A product or quotient of two float32 values computed in float64 and rounded once
    to float32 equals the float32 operation's result (53 >= 2*24 + 2 bits), so
    ``f32(s * 2.0)`` reproduces ``scale * 2`` done on a float32 tensor.
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:  # some Python versions refuse to pack a value that rounds to inf
        return math.copysign(INF, x)


def to_float(x) -> float:
    """float(x), or +-inf for a Python int too large for a float64 (DeepSpeed's int scales)."""
    try:
        return float(x)
    except OverflowError:
        return math.copysign(INF, x)


def floats(values) -> np.ndarray:
    """A list of Python numbers (floats, possibly huge ints) as a float64 array."""
    try:
        return np.asarray(values, dtype=np.float64)
    except OverflowError:
        return np.array([to_float(v) for v in values], dtype=np.float64)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_scale(name: str, value, *, allow_none: bool = False):
    """A loss scale: a finite number > 0 (kept as given: int stays int, as in the library)."""
    if value is None and allow_none:
        return None
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a finite number > 0{extra}; got {value!r}")
    return value.item() if isinstance(value, np.generic) else value


def check_floor(name: str, value, *, allow_none: bool = False):
    """A lower bound on the scale: a finite number >= 0."""
    if value is None and allow_none:
        return None
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a finite number >= 0{extra}; got {value!r}")
    return value.item() if isinstance(value, np.generic) else value


def check_interval(name: str, value, what: str = "steps between growths") -> int:
    """A growth interval (or another count that must be positive): an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 ({what}); got {value!r}")
    return int(value)


def check_count(name: str, value) -> int:
    """A count: an integer >= 0."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
    return int(value)


def check_growth(name: str, value) -> float:
    """A growth factor: a finite number > 1."""
    if not _is_number(value) or not math.isfinite(value) or value <= 1:
        raise ValueError(f"{name} must be a finite number > 1 (the scale grows by it); got {value!r}")
    return value.item() if isinstance(value, np.generic) else value


def check_backoff(name: str, value) -> float:
    """A backoff factor: a number strictly between 0 and 1."""
    if not _is_number(value) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in (0, 1) (the scale shrinks by it); got {value!r}")
    return value.item() if isinstance(value, np.generic) else value


def check_flag(name: str, value) -> bool:
    """A boolean option."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def check_overflows(overflows) -> list[bool]:
    """The overflow sequence as a list of Python bools (True = that step's grads were inf/nan).

    Accepts a sequence of bools or a 1-D numpy bool array; anything else is a TypeError
    (0/1 integers too: a silent cast is exactly the kind of bug this course is about).
    """
    if isinstance(overflows, (str, bytes)):
        raise TypeError("overflows must be a sequence of booleans (True = inf/nan gradients that step), not a string; "
                        "use overflow_pattern('..x..') to turn a drawing into one")
    if isinstance(overflows, np.ndarray):
        if overflows.ndim != 1:
            raise ValueError(f"overflows must be one-dimensional (one flag per step); got shape {overflows.shape}")
        if overflows.dtype != np.bool_:
            raise TypeError("overflows must be booleans (True = inf/nan gradients that step); "
                            f"got dtype {overflows.dtype}")
        return overflows.tolist()
    try:
        flags = list(overflows)
    except TypeError:
        raise TypeError(f"overflows must be a sequence of booleans; got {type(overflows).__name__}") from None
    for i, flag in enumerate(flags):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(
                f"overflows must be a sequence of booleans (True = inf/nan gradients that step); "
                f"item {i} is {flag!r} ({type(flag).__name__})"
            )
    return [bool(flag) for flag in flags]
