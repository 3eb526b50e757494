"""Small numeric helpers shared by the scalers: float32 rounding and input checks.

Several libraries keep the loss scale in a float32 tensor (torch's GradScaler, Keras,
jmp). A Python float is a float64, so a faithful replay rounds each new scale to
float32 exactly once, the way the library's kernel stores it:

>>> f32(0.1)
0.10000000149011612
>>> f32(2.0 ** 128)   # past float32's max: the kernel would store inf
inf

The checks delegate to :mod:`labkit._validate` (one message style: the parameter's name,
then what is allowed) and add what loss scaling needs: a scale a float32 can hold, a flag.

>>> check_scale("init_scale", 2**16), check_scale("init_scale", 0.1, float32=True)
(65536, 0.10000000149011612)
>>> check_scale("init_scale", 1e39, float32=True)  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
ValueError: init_scale must be a number > 0 that float32 holds (2**-149 to 3.4028235e+38: ...); got 1e+39
"""

from __future__ import annotations

import math
import numbers
import struct

import numpy as np

from labkit._validate import integer, number, shown

_F32 = struct.Struct("<f")
INF = math.inf
F32_MAX = float(np.finfo(np.float32).max)


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
        return INF if x > 0 else -INF


def floats(values) -> np.ndarray:
    """A list of Python numbers (floats, possibly huge ints) as a float64 array."""
    try:
        return np.asarray(values, dtype=np.float64)
    except OverflowError:
        return np.array([to_float(v) for v in values], dtype=np.float64)


def set_fields(obj, **values) -> None:
    """Store checked (normalised) values on a frozen dataclass, from its ``__post_init__``."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


def _kept(value):
    """A checked number as the library keeps it: an int stays an int (DeepSpeed's 2**power), else a float."""
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def _optional(check, name, value, allow_none, what="no bound"):
    if value is None and allow_none:
        return None
    try:
        return check()
    except (TypeError, ValueError) as e:
        if not allow_none:
            raise
        raise type(e)(f"{e} (or None: {what})") from None


def _float32(name: str, value, floor: bool) -> float:
    x = f32(float(value))
    if not math.isfinite(x) or (x == 0 and not floor):
        lo = "0" if floor else "2**-149"
        raise ValueError(f"{name} must be a number {'>= 0' if floor else '> 0'} that float32 holds "
                         f"({lo} to {F32_MAX:.8g}: the library stores it in float32); got {shown(value)}")
    return x


def check_scale(name: str, value, *, allow_none: bool = False, float32: bool = False):
    """A loss scale: a finite number > 0 (an int stays an int, as in the library).

    ``float32=True``: the library stores it in float32, so it must be finite and nonzero
    there too; returned rounded to float32.
    """
    def check():
        number(name, value, minimum=0, inclusive=False)
        return _float32(name, value, floor=False) if float32 else _kept(value)
    return _optional(check, name, value, allow_none)


def check_floor(name: str, value, *, allow_none: bool = False, float32: bool = False):
    """A lower bound on the scale: a finite number >= 0."""
    def check():
        number(name, value, minimum=0)
        return _float32(name, value, floor=True) if float32 else _kept(value)
    return _optional(check, name, value, allow_none)


def check_growth(name: str, value) -> float:
    """A growth factor: a finite number > 1 (the scale grows by it)."""
    return number(name, value, minimum=1, inclusive=False)


def check_backoff(name: str, value) -> float:
    """A backoff factor: a number strictly between 0 and 1 (the scale shrinks by it)."""
    return number(name, value, minimum=0, maximum=1, inclusive=False)


def check_counter(name: str, value, interval: int, interval_name: str) -> int:
    """A state's step counter: an integer from 0 to interval - 1."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return integer(name, value)  # raises the TypeError
    if not 0 <= value < interval:
        raise ValueError(f"{name} must be an integer from 0 to {interval_name} - 1 ({shown(interval - 1)}); "
                         f"got {shown(value)}")
    return int(value)


def check_flag(name: str, value) -> bool:
    """A boolean option (True or False; numpy's bool too, not 0/1 or a string)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {shown(value)}")
    return bool(value)


def check_finite_flag(finite) -> bool:
    """``adjust`` / ``applies``'s argument: were this step's gradients all finite (True) or not (False)?"""
    if not isinstance(finite, (bool, np.bool_)):
        raise TypeError("finite must be True (this step's gradients are all finite) or False (some are inf/nan); "
                        f"got {type(finite).__name__} {shown(finite)}")
    return bool(finite)


def real_array(name: str, values) -> np.ndarray:
    """Real numbers (an array, a sequence, one number) as a float64 array: not bools, strings or None.

    A number too large for a float64 (``10**400``) or a ragged nesting is refused with a
    message; finiteness is left to the caller.
    """
    try:
        arr = np.asarray(values)
    except ValueError:
        raise ValueError(f"{name} must be an array of real numbers, each row as long as the others") from None
    except (TypeError, OverflowError):
        raise TypeError(f"{name} must be an array of real numbers; got {type(values).__name__}") from None
    if arr.dtype == object:
        bad = [v for v in arr.flat if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real)][:1]
        if bad:
            bad = bad[0]
            raise TypeError(f"{name} must be an array of real numbers; it holds {type(bad).__name__} {shown(bad)}")
        try:
            return arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"{name} holds a number too large for a float64") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be an array of real numbers; got dtype {arr.dtype}")
    return arr.astype(np.float64)


def check_overflows(overflows, name: str = "overflows") -> list[bool]:
    """The overflow sequence as a list of Python bools (True = that step's grads were inf/nan).

    Accepts a sequence of bools or a 1-D numpy bool array; anything else is a TypeError
    (0/1 integers too: a silent cast is exactly the kind of bug this course is about).
    """
    what = f"{name} must be a sequence of booleans (True = inf/nan gradients that step)"
    if isinstance(overflows, (str, bytes)):
        raise TypeError(f"{what}, not a string; use overflow_pattern('..x..') to turn a drawing into one")
    if isinstance(overflows, np.ndarray):
        if overflows.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional (one flag per step); got shape {overflows.shape}")
        if overflows.dtype != np.bool_:
            raise TypeError(f"{what}; got dtype {overflows.dtype}")
        return overflows.tolist()
    try:
        flags = list(overflows)
    except TypeError:
        raise TypeError(f"{what}; got {type(overflows).__name__}") from None
    for i, flag in enumerate(flags):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{what}; item {i} is {shown(flag)} ({type(flag).__name__})")
    return [bool(flag) for flag in flags]
