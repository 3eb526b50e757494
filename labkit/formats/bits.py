"""Bit patterns <-> values, with the rounding a real conversion does.

The algorithm, for a format with E exponent bits, M mantissa bits and bias B:

    decode(s, e, m):
        e == 0           -> (-1)^s * m * 2^(1 - B - M)          zero or subnormal
        e == 2^E - 1     -> inf (m == 0) or NaN                 IEEE formats
        otherwise        -> (-1)^s * (2^M + m) * 2^(e - B - M)   normal

    and where the format says otherwise (`FloatFormat.nan_encoding`, `signed`, `subnormals`):
        fp8_e4m3, e8m0   only the all-ones pattern (per sign) is NaN; no inf
        fnuz formats     0x80, the pattern of -0, is the one NaN; no inf, no -0
        fp4, fp6         no NaN, no inf: every pattern is a number
        e8m0             no sign bit, no subnormals: e == 0 is 2^-127, there is no zero

    encode(x):                                   round to nearest, ties to even
        k = exponent of |x| (|x| = 1.f * 2^k), clamped below at emin = 1 - B (e8m0: -B)
        q = 2^(k - M)                            the spacing of values near |x|
        y = rint(|x| / q) * q                    exact in float64; rint is ties-to-even
        y > max  -> inf (fp16, bf16, fp8_e5m2, ...) or NaN (fp8_e4m3, fnuz, e8m0: no inf)
                    saturating: +-max instead (an infinite input too; NaN stays NaN);
                    fp4 / fp6 have neither inf nor NaN: they always saturate
        else pack y's sign, exponent and mantissa fields

Two overflow modes, the "saturating" and "non-saturating" conversions of the OCP FP8
specification:

* **non-saturating** (``saturate=False``): what ``ml_dtypes``' ``astype`` and numpy do -- an
  overflow becomes inf, or NaN in fp8_e4m3 (and fnuz, e8m0), which have no inf. The default,
  ``saturate=None``, is this mode in every format that has an inf or a NaN to overflow to;
* **saturating** (``saturate=True``): an overflow, and an infinite input, become the largest
  finite value of that sign (the only mode, and so the default, of fp4 / fp6). FP8 training recipes convert this way on purpose, so that one
  value above the scale's range cannot turn a tensor into NaNs: torchao's
  ``to_fp8_saturated`` clamps to +-``finfo.max`` before the cast
  (``torchao/float8/float8_utils.py``). PyTorch's own eager ``.to(torch.float8_e4m3fn)``
  saturates since torch 2.12 (pytorch/pytorch pull request 178817,
  ``torch/headeronly/util/Float8_e4m3fn.h``: "Finite overflow or inf -> saturate to max
  finite value"); its cast to float8_e5m2 still gives inf.

Which library does what by default (checked in ``tests/formats/test_saturate.py`` and
``tests/formats/test_subbyte.py``, ml_dtypes 0.7.0, torch 2.13):

=======================  ===============================  ==========================================
format                   ml_dtypes ``astype``             torch eager ``.to(dtype)``
=======================  ===============================  ==========================================
fp8_e4m3 (e4m3fn)        non-saturating: NaN above 464    saturating: 448 (since torch 2.12)
fp8_e5m2                 non-saturating: inf              non-saturating: inf
fp8_e4m3fnuz, e5m2fnuz   non-saturating: NaN (0x80)       non-saturating: NaN (0x80)
e8m0 (e8m0fnu)           non-saturating: NaN (0xFF)       NaN past 2^127; but 0 -> 2^-127, -x -> |x|
fp4_e2m1, fp6_*          saturating (no inf, no NaN)      no eager cast (float4_e2m1fn_x2 is packed)
=======================  ===============================  ==========================================

gfloat (``gfloat/round.py``, ``round_float(fi, v, sat=False)``), an independent implementation of
the OCP formats, agrees on fp4 / fp6 by refusing what they cannot hold: a NaN, or an overflow
without ``sat=True``, raises ValueError -- as ``saturate=False`` does here for fp4 / fp6.

The sub-byte formats follow ml_dtypes (``float4_e2m1fn``, ``float6_e2m3fn``,
``float6_e3m2fn``, ``float8_e8m0fnu``, ``float8_e4m3fnuz``, ``float8_e5m2fnuz``) in every
detail, some of them surprising: fp4 / fp6 turn a NaN into a zero *of the opposite sign*
(NaN -> -0, -NaN -> +0); e8m0 rounds a tie up (1.5 -> 2, 3 -> 4: with no mantissa the count
of 2^k's is 1 or 2, and 2 is the even one; torch does the same, gfloat keeps the even exponent
code instead, 3 -> 2: the MX specification derives a scale from floor(log2(amax)), not by a
cast), turns 0, -0, a negative number and inf into NaN, and a positive number below 2^-127
into 2^-127 (it has no zero to underflow to); the fnuz formats turn -0 and a negative
underflow into +0 (they have no -0).

Conversions follow ml_dtypes' ``astype`` bit for bit, including two details worth
knowing: ml_dtypes 0.6 converts float64 to bf16 and fp8 *through float32* (so two
roundings happen; numpy's float64 -> float16, and ml_dtypes 0.7, round once) -- labkit asks
the installed ml_dtypes which it does (`FloatFormat.via_float32`) -- and fp8_e4m3 has no
infinity, so an overflow -- or an infinite input -- becomes NaN rather than saturating at 448.
"""

from __future__ import annotations

import numbers

import numpy as np

from labkit._validate import shown

_KIND_MSG = "real numbers (a float, an int, or a numpy array of them)"


# -- helpers ---------------------------------------------------------------------------
def real_array(x, what: str = "x") -> np.ndarray:
    """`x` as a numpy array of real numbers (ml_dtypes' bfloat16 / float8 widened to float32), or a
    TypeError / ValueError naming `what`: a string, a bool, a ragged list, an int float64 cannot hold."""
    if isinstance(x, (str, bytes, dict)) or isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{what} must be {_KIND_MSG}, got {type(x).__name__} {shown(x)}")
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # a ragged nested list
        raise TypeError(f"{what} must be {_KIND_MSG}, got {type(x).__name__} {shown(x)}") from exc
    if arr.dtype.kind == "O":  # Python ints beyond int64 (fine if float64 holds them), or not numbers at all
        if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in arr.flat):
            raise TypeError(f"{what} must be {_KIND_MSG}, got {type(x).__name__} {shown(x)}")  # None is no NaN
        try:
            arr = arr.astype(np.float64)
        except OverflowError:
            raise ValueError(f"{what} must lie within float64's range (|x| < 1.8e308), got {shown(x)}") from None
    if arr.dtype.kind == "V" and arr.dtype.itemsize <= 2:  # ml_dtypes: bfloat16, float8_*
        arr = arr.astype(np.float32)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{what} must be {_KIND_MSG}, got an array of dtype {arr.dtype}")
    return arr


def _values(x) -> tuple[np.ndarray, np.ndarray, bool]:
    """x as an array, the same as float64 (exact), and whether x was a scalar."""
    arr = real_array(x)
    # A signalling NaN raises the CPU's "invalid" flag as it is widened; that is expected.
    with np.errstate(invalid="ignore"):
        x64 = arr.astype(np.float64)
    return arr, x64, arr.ndim == 0


def _patterns(fmt, bits) -> tuple[np.ndarray, bool]:
    """bits as a uint64 array, checked against the format's width."""
    if isinstance(bits, (bool, np.bool_)):
        raise TypeError(f"a {fmt.name} bit pattern must be an integer, got bool")
    top = (1 << fmt.bits) - 1
    try:
        arr = np.asarray(bits)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a {fmt.name} bit pattern must be an integer or an integer array, "
                        f"got {type(bits).__name__} {shown(bits)}") from exc
    if arr.dtype.kind == "O" and arr.size and all(isinstance(v, int) and not isinstance(v, bool) for v in arr.flat):
        bad = next(int(v) for v in arr.flat if not 0 <= v <= top)  # only ints beyond int64 make an object array
        raise ValueError(f"bit pattern {shown(bad)} is out of range for {fmt.name}: "
                         f"a {fmt.bits}-bit pattern lies in 0x0 .. {top:#x}")
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"a {fmt.name} bit pattern must be an integer (e.g. {fmt.nan_bits if fmt.has_nan else max_pattern(fmt):#x}) "
            "or an integer "
            f"array, got {type(bits).__name__} of dtype {arr.dtype}; to convert a value use encode()"
        )
    if arr.size and (arr.min() < 0 or int(arr.max()) > top):
        bad = arr[(arr < 0) | (arr > top)].flat[0]
        raise ValueError(
            f"bit pattern {int(bad):#x} is out of range for {fmt.name}: "
            f"a {fmt.bits}-bit pattern lies in 0x0 .. {top:#x}"
        )
    return arr.astype(np.uint64), arr.ndim == 0


def ndim(x) -> int:
    """np.ndim(x), or -1 for what is not an array at all (a ragged nested list)."""
    try:
        return np.ndim(x)
    except ValueError:
        return -1


def _out(arr: np.ndarray, scalar: bool, pytype):
    return pytype(arr[()]) if scalar else arr


def split(fmt, bits):
    """(sign, biased exponent, mantissa) fields of bit pattern(s); sign 0 in a format without one (e8m0)."""
    b, scalar = _patterns(fmt, bits)
    m = fmt.mantissa_bits
    sign = b >> np.uint64(fmt.bits - 1) if fmt.signed else b & np.uint64(0)
    exp = (b >> np.uint64(m)) & np.uint64((1 << fmt.exponent_bits) - 1)
    man = b & np.uint64((1 << m) - 1)
    if scalar:
        return int(sign), int(exp), int(man)
    return sign.astype(np.int64), exp.astype(np.int64), man.astype(np.int64)


def canonical_nan(fmt) -> int | None:
    """The NaN a conversion produces: quiet bit set (fp8_e4m3, e8m0: all bits set; fnuz: 0x80).

    None for a format without NaN (fp4, fp6)."""
    exp_ones = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
    if fmt.nan_encoding == "none":
        return None
    if fmt.nan_encoding == "negative-zero":
        return 1 << (fmt.bits - 1)
    if fmt.nan_encoding == "all-ones":
        return exp_ones | ((1 << fmt.mantissa_bits) - 1)
    return exp_ones | (1 << (fmt.mantissa_bits - 1))


def max_pattern(fmt) -> int:
    """The bit pattern of +max: the largest pattern below the inf / NaN ones."""
    ones = (1 << (fmt.exponent_bits + fmt.mantissa_bits)) - 1  # every bit but the sign
    if fmt.nan_encoding == "ieee":
        return ones - ((1 << fmt.mantissa_bits) - 1) - 1  # exponent all ones is inf / NaN
    if fmt.nan_encoding == "all-ones":
        return ones - 1
    return ones  # fnuz (NaN is 0x80), fp4 / fp6 (no NaN): all magnitude bits set


def _nan_patterns(fmt, src: np.ndarray) -> np.ndarray:
    """NaN bit patterns (without sign) for NaN inputs `src`, as the real conversion gives.

    numpy's float -> float16 keeps the top 10 payload bits (and makes sure the result is
    still a NaN); the CPU's float64 -> float32 keeps the top 22 payload bits and sets
    the quiet bit (so does tf32 here); Eigen/ml_dtypes' bf16 and fp8 give a canonical NaN.
    """
    canon = np.full(src.shape, canonical_nan(fmt), np.uint64)
    if fmt.name not in ("fp16", "fp32", "tf32"):
        return canon
    if src.dtype == np.float32:
        payload, width = src.view(np.uint32).astype(np.uint64) & np.uint64(0x7FFFFF), 23
    else:
        payload = src.astype(np.float64).view(np.uint64) & np.uint64((1 << 52) - 1)
        width = 52
    top = payload >> np.uint64(width - fmt.mantissa_bits)
    exp_ones = np.uint64(((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits)
    if fmt.name == "fp16":
        return exp_ones | np.where(top == 0, np.uint64(1), top)
    if fmt.name == "fp32" and src.dtype == np.float32:
        return exp_ones | top  # no conversion happens: the pattern is kept as it is
    return exp_ones | top | np.uint64(1 << (fmt.mantissa_bits - 1))


# -- the two conversions ---------------------------------------------------------------
def encode(fmt, x, saturate: bool | None = None):
    """Value(s) -> bit pattern(s) of `fmt`, rounding to nearest, ties to even.

    `saturate`: False -- an overflow becomes inf (NaN where the format has no inf), as
    ml_dtypes' ``astype`` does; True -- it becomes +-max, as FP8 recipes convert; None --
    the format's own rule (`FloatFormat.saturates`: fp4 / fp6 saturate, the others do not).
    """
    saturate = check_saturate(saturate, fmt)
    src, x64, scalar = _values(x)
    x64, a, finite, y = _round_magnitude(fmt, x64)
    m = fmt.mantissa_bits

    overflow = y > fmt.max
    ok = finite & ~overflow
    normal = ok & (y >= fmt.smallest_normal)
    ky = np.frexp(np.where(normal, y, 1.0))[1] - 1
    mant_normal = np.ldexp(np.where(normal, y, 1.0), m - ky) - (1 << m)
    exp_field = (ky + fmt.bias).astype(np.int64)
    mag = np.where(
        normal,
        (exp_field << m) | mant_normal.astype(np.int64),
        np.rint(np.where(ok & ~normal, y, 0.0) / fmt.smallest_subnormal).astype(np.int64),
    ).astype(np.uint64)

    exp_ones = np.uint64(((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits)
    big = (overflow & finite) | np.isinf(a)
    if saturate:
        mag = np.where(big, np.uint64(max_pattern(fmt)), mag)
    else:
        mag = np.where(big, exp_ones if fmt.has_inf else np.uint64(canonical_nan(fmt)), mag)
    nan = np.isnan(x64)
    negative = np.signbit(x64)
    if not fmt.has_nan:  # fp4 / fp6: ml_dtypes gives a zero of the opposite sign
        mag = np.where(nan, np.uint64(0), mag)
        negative = negative ^ nan
    elif nan.any():
        mag = np.where(nan, _nan_patterns(fmt, np.where(nan, src, 0).astype(src.dtype)), mag)

    if not fmt.signed:  # e8m0: zero and negative numbers have no pattern; they become NaN
        mag = np.where(negative | (x64 == 0), np.uint64(canonical_nan(fmt)), mag)
        negative = np.zeros_like(negative)
    elif not fmt.has_negative_zero:  # fnuz: -0 and a negative underflow are +0 (0x80 is NaN)
        negative = negative & (mag != 0)
    sign = negative.astype(np.uint64) << np.uint64(fmt.bits - 1)
    out = (sign | mag).astype(fmt.uint_dtype)
    return _out(out, scalar, int)


def _round_magnitude(fmt, x64):
    """(x64 as converted, |x|, finite?, |x| rounded to fmt's spacing with no upper bound)."""
    if fmt.via_float32:
        with np.errstate(over="ignore", invalid="ignore"):
            x64 = x64.astype(np.float32).astype(np.float64)
    a = np.abs(x64)
    finite = np.isfinite(a)
    a_f = np.where(finite, a, 0.0)
    # Round |x| to a multiple of the spacing q of the binade it falls in.
    k = np.frexp(a_f)[1] - 1
    q_exp = np.maximum(k, fmt.emin) - fmt.mantissa_bits
    y = np.ldexp(np.rint(np.ldexp(a_f, -q_exp)), q_exp)  # rint: an integer count of q's, exact
    if not fmt.has_zero:  # e8m0: nothing to underflow to; a tiny positive value becomes 2^-127
        y = np.where(a_f > 0, np.maximum(y, fmt.smallest_normal), y)
    return x64, a, finite, y


def check_saturate(saturate, fmt=None) -> bool:
    """`saturate` as a bool: None is the format's own rule; False is refused where nothing but max is left."""
    if saturate is None and fmt is not None:
        return fmt.saturates
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError("saturate must be True (an overflow becomes +-max), False (it becomes inf, or NaN "
                        "without inf, as ml_dtypes converts) or None (the format's own rule); got "
                        f"{type(saturate).__name__} {shown(saturate)}")
    if fmt is not None and not saturate and not fmt.has_nan:
        raise ValueError(f"saturate=False: {fmt.name} has no inf and no NaN, so an overflow can only saturate to "
                         f"+-max ({fmt.max:g}); pass saturate=True or None (ml_dtypes' astype saturates it)")
    return bool(saturate)


def overflows(fmt, x):
    """Does finite `x` round past max? (It then becomes inf or NaN, or +-max where saturated.)"""
    _, x64, scalar = _values(x)
    _, _, finite, y = _round_magnitude(fmt, x64)  # not finite: float32 overflowed on the way (tf32)
    return _out(np.isfinite(x64) & (~finite | (y > fmt.max)), scalar, bool)


def decode(fmt, bits):
    """Bit pattern(s) of `fmt` -> float64 value(s)."""
    sign, exp, man = (np.asarray(f, np.int64) for f in split(fmt, bits))
    scalar = np.ndim(bits) == 0
    m = fmt.mantissa_bits
    top = (1 << fmt.exponent_bits) - 1
    subnormal = (exp == 0) & fmt.subnormals
    value = np.ldexp(
        np.where(subnormal, man, man + (1 << m)).astype(np.float64),
        np.where(subnormal, 1, exp) - fmt.bias - m,
    )
    if fmt.has_inf:
        value = np.where(exp == top, np.where(man == 0, np.inf, np.nan), value)
    else:
        value = np.where(is_nan_pattern(fmt, sign, exp, man), np.nan, value)
    value = np.where(sign == 1, -value, value)
    return _out(value, scalar, float)


def is_nan_pattern(fmt, sign, exp, man):
    """Which (sign, exponent, mantissa) fields are NaN, by the format's `nan_encoding`."""
    top = (1 << fmt.exponent_bits) - 1
    if fmt.nan_encoding == "ieee":
        return (exp == top) & (man != 0)
    if fmt.nan_encoding == "all-ones":
        return (exp == top) & (man == (1 << fmt.mantissa_bits) - 1)
    if fmt.nan_encoding == "negative-zero":
        return (sign == 1) & (exp == 0) & (man == 0)
    return np.zeros(np.shape(exp), bool)


# -- what the patterns mean --------------------------------------------------------------
def classify_bits(fmt, bits):
    """"zero" | "subnormal" | "normal" | "inf" | "nan" for bit pattern(s)."""
    sign, exp, man = (np.asarray(f, np.int64) for f in split(fmt, bits))
    scalar = np.ndim(bits) == 0
    value = np.asarray(decode(fmt, bits))
    low = (exp == 0) & fmt.subnormals
    kind = np.where(
        np.isnan(value), "nan",
        np.where(np.isinf(value), "inf",
                 np.where(low, np.where(man == 0, "zero", "subnormal"), "normal")),
    )
    return _out(kind, scalar, str)


def bitstring(fmt, bits: int, sep: str = " ") -> str:
    """'0 01111 0000000000': the sign, exponent and mantissa fields of one pattern.

    `bits` must be one integer pattern: a float (1.5) or a bool is refused, not truncated.
    """
    if not isinstance(sep, str):
        raise TypeError(f"sep must be a string (e.g. ' '); got {type(sep).__name__} {shown(sep)}")
    if ndim(bits) != 0:
        raise TypeError(f"bits must be one {fmt.name} bit pattern (an integer); got {type(bits).__name__} "
                        f"{shown(bits)}: to_bitstring shows one pattern at a time")
    s, e, m = split(fmt, bits)
    fields = [str(s)] if fmt.signed else []  # e8m0: no sign bit, no mantissa bits
    fields.append(format(e, f"0{fmt.exponent_bits}b"))
    if fmt.mantissa_bits:
        fields.append(format(m, f"0{fmt.mantissa_bits}b"))
    return sep.join(fields)


# -- neighbours, spacing, error ----------------------------------------------------------
def _key(fmt, bits: np.ndarray) -> np.ndarray:
    """Order-preserving integer for each pattern: negative patterns count down from -0
    (a format without a sign bit, e8m0: the pattern itself)."""
    b = bits.astype(np.int64)
    if not fmt.signed:
        return b
    signbit = 1 << (fmt.bits - 1)
    return np.where(b & signbit, -(b & (signbit - 1)), b)


def _unkey(fmt, key: np.ndarray) -> np.ndarray:
    if not fmt.signed:
        return np.asarray(key).astype(np.uint64)
    signbit = 1 << (fmt.bits - 1)
    return np.where(key < 0, signbit | -key, key).astype(np.uint64)


def _key_range(fmt) -> tuple[int, int]:
    """The smallest and largest key of a pattern."""
    if not fmt.signed:
        return 0, (1 << fmt.bits) - 1
    return -(1 << (fmt.bits - 1)) + 1, (1 << (fmt.bits - 1)) - 1


def step(fmt, x, direction: int):
    """The nearest value of `fmt` strictly above (direction=+1) or below (-1) x."""
    _, x64, scalar = _values(x)
    y_bits = np.asarray(encode(fmt, x64), np.uint64)
    y = np.asarray(decode(fmt, y_bits))
    beyond = (y > x64) if direction > 0 else (y < x64)
    key = _key(fmt, y_bits)  # +0 and -0 both have key 0
    nxt = _key_decode(fmt, np.clip(key + direction, *_key_range(fmt)))
    stuck = ~((nxt > x64) if direction > 0 else (nxt < x64))  # past the last pattern: nothing beyond, not even inf
    out = np.where(np.isnan(x64) | np.isnan(y), np.nan, np.where(beyond, y, np.where(stuck, np.nan, nxt)))
    if not fmt.signed and direction > 0:  # e8m0: above 0 or a negative number comes its smallest value
        out = np.where(x64 <= 0, fmt.smallest_normal, out)
    return _out(out, scalar, float)


def _key_decode(fmt, key):
    return np.asarray(decode(fmt, _unkey(fmt, key)))


def ulp(fmt, x):
    """Spacing of `fmt` at round(x): 2^(max(e, emin) - M); NaN where round(x) is inf/NaN."""
    _, x64, scalar = _values(x)
    y = np.abs(np.asarray(fmt.round(x64)))
    finite = np.isfinite(y)
    k = np.frexp(np.where(finite & (y > 0), y, fmt.smallest_normal))[1] - 1
    out = np.ldexp(1.0, np.maximum(k, fmt.emin) - fmt.mantissa_bits)
    return _out(np.where(finite, out, np.nan), scalar, float)


def rel_error(fmt, x):
    """|round(x) - x| / |x| (0 where x == 0; inf where x overflows to inf)."""
    _, x64, scalar = _values(x)
    y = np.asarray(fmt.round(x64))
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(y - x64) / np.abs(x64)
    err = np.where(x64 == 0, 0.0, err)
    err = np.where(np.isinf(y) & np.isfinite(x64), np.inf, err)
    return _out(err, scalar, float)
