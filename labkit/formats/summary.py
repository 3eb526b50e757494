"""The seeds' comparison tables, regenerated from the formats' bit layouts.

The seed documents describe fp32 / fp16 / bf16 with adjectives ("wide", "narrow",
precision "high / medium / low") and hand-typed ranges. Here every cell is computed
from a `FloatFormat`, so a table can be checked against the claim it replaces:

* ``feature_table()`` -- seed 000's layout: one column per format, one row per feature;
* ``precision_comparison()`` -- seed 004's ``precision_comparison`` dict, with the
  range given as *both* ends of the normal range and the subnormal floor, and the
  precision in decimal digits rather than a word;
* ``representation_table()`` -- a few values stored in one format: what each became;
* ``decode_formula()``, ``error_summary()``, ``short_decimal()``, ``bit_fields()`` --
  the one-line texts the bit-layout figure and the explorer widget show.

>>> print(feature_table(["fp16", "bf16"]))
feature              fp16                            bf16
-------------------  ------------------------------  -----------------------------
total bits           16                              16
exponent bits        5                               8
fraction bits        10                              7
max                  65504                           3.39e+38
smallest normal      6.1e-05                         1.18e-38
smallest subnormal   5.96e-08                        9.18e-41
dynamic range        12 decades (9.0 normal)         79 decades (76.5 normal)
precision            3.3 decimal digits (eps 2^-10)  2.4 decimal digits (eps 2^-7)
needs loss scaling?  usually (dynamic loss scaling)  no (fp32's exponent range)
"""

from __future__ import annotations

import math

from labkit._validate import shown
from labkit.formats.describe import represent
from labkit.formats.spec import COURSE_FORMATS, format_names, get
from labkit.formats.comparison import loss_scaling_need
from labkit.table import Table


def dynamic_range(fmt) -> tuple[float, float]:
    """Decades spanned by (all positive values, normal values): log10(max / smallest)."""
    f = get(fmt)
    return math.log10(f.max / f.smallest_subnormal), math.log10(f.max / f.smallest_normal)


def feature_table(names=("fp32", "fp16", "bf16")) -> Table:
    """Seed 000's comparison table (features as rows, formats as columns), computed.

    `names`: one or several formats; None: the six of COURSE_FORMATS."""
    fmts = [get(n) for n in format_names(names, default=COURSE_FORMATS)]
    def row(label, cell):
        return (label, *(cell(f) for f in fmts))
    def decades(f):
        full, normal = dynamic_range(f)
        return f"{full:.0f} decades ({normal:.1f} normal)"
    rows = (
        row("total bits", lambda f: str(f.bits)),
        row("exponent bits", lambda f: str(f.exponent_bits)),
        row("fraction bits", lambda f: str(f.mantissa_bits)),
        row("max", lambda f: f"{f.max:.6g}" if f.max < 1e6 else f"{f.max:.3g}"),
        row("smallest normal", lambda f: f"{f.smallest_normal:.3g}"),
        row("smallest subnormal", lambda f: f"{f.smallest_subnormal:.3g}" if f.subnormals else "none"),
        row("dynamic range", decades),
        row("precision", lambda f: f"{f.decimal_digits:.1f} decimal digits (eps 2^-{f.mantissa_bits})"),
        row("needs loss scaling?", loss_scaling_need),
    )
    return Table(("feature", *(f.name for f in fmts)), rows)


def precision_comparison(names=("fp32", "fp16", "bf16")) -> dict[str, dict[str, object]]:
    """Seed 004's ``precision_comparison`` dict, every entry computed from the format.

    "range" is the *normal* range, as the seed gives it, and "subnormal_min" adds what
    the seed leaves out: gradual underflow reaches far below the smallest normal.

    >>> precision_comparison(["bf16"])["BF16"]["range"]
    '1.18e-38 to 3.39e+38'
    >>> precision_comparison(["bf16"])["BF16"]["subnormal_min"]
    '9.18e-41'
    """
    out = {}
    for name in format_names(names, default=COURSE_FORMATS):
        f = get(name)
        out[f.name.upper()] = {
            "bits": f.bits,
            "exponent": f.exponent_bits,
            "mantissa": f.mantissa_bits,
            "range": f"{_short(f.smallest_normal)} to {_short(f.max)}",
            "subnormal_min": _short(f.smallest_subnormal),
            "max": f.max,
            "decimal_digits": round(f.decimal_digits, 1),
            "eps": f.eps,
            "memory": _memory(f),
        }
    return out


def _memory(f) -> str:
    if f.dtype is None:
        return "stored as fp32 (4 bytes)"
    if f.storage_bits != f.bits:  # ml_dtypes' fp4 / fp6: one value per byte
        return f"{f.dtype.itemsize} byte ({f.bits} bits used; packed: {f.bits / 8:g} byte)"
    return f"{f.dtype.itemsize} bytes"


def _short(x: float) -> str:
    """3 significant digits, written like the seed writes them: 6.55e+4, 1.18e-38."""
    return f"{x:.3g}".replace("e-0", "e-").replace("e+0", "e+")


MAX_ROWS = 1000
"""The most values one representation_table shows (a row each)."""


def representation_table(values, fmt) -> Table:
    """Each of `values` stored in `fmt`: stored value, kind, significant bits kept, error, flags.

    >>> print(representation_table([1.0, 1e-6], "fp16"))
    input  stored                      kind       bits kept  rel. error  flags
    -----  --------------------------  ---------  ---------  ----------  ------------------
    1      1                           normal     11         0           exact
    1e-06  0.000001013278961181640625  subnormal  5          1.3e-02     subnormal, rounded
    """
    f = get(fmt)
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise TypeError(f"values must be a sequence of real numbers, e.g. [1e-5, 1e-6]; got "
                        f"{type(values).__name__} {shown(values)}")
    values = list(values)
    if len(values) > MAX_ROWS:
        raise ValueError(f"values: at most {MAX_ROWS:,} values (one row each), got {len(values):,}")
    rows = []
    for x in values:
        try:
            r = represent(x, f)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"values: each must be one real number; {exc}") from None
        stored = r.exact if len(r.exact) <= 26 else f"{r.value:.17g}"
        err = "-" if math.isnan(r.rel_error) else ("inf" if math.isinf(r.rel_error) else f"{r.rel_error:.1e}")
        if err not in ("-", "inf") and r.rel_error == 0:
            err = "0"
        rows.append((f"{r.input:g}", stored, r.kind, str(r.significant_bits), err, ", ".join(r.flags)))
    if not rows:
        raise ValueError("values: representation_table() needs at least one value")
    return Table(("input", "stored", "kind", "bits kept", "rel. error", "flags"), tuple(rows))


def bit_fields(fmt) -> list[str]:
    """The field of each bit, most significant first: ['sign', 'exponent', ..., 'mantissa'].

    >>> bit_fields("fp4"), bit_fields("e8m0")[:2]   # e8m0 has no sign bit and no mantissa
    (['sign', 'exponent', 'exponent', 'mantissa'], ['exponent', 'exponent'])
    """
    f = get(fmt)
    return ["sign"] * f.signed + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits


def decode_formula(r) -> str:
    """How the fields of a Representation give its value.

    >>> import labkit.formats as lf
    >>> decode_formula(lf.represent(0.1, "fp8_e4m3"))
    '+2^(3 - 7) × 1.625  =  +2^-4 × 1.625'
    >>> decode_formula(lf.represent(1e-6, "fp16"))
    '+2^-14 × 0.0166015625   (subnormal: exponent field 0 means 2^-14 × 0.m)'
    >>> decode_formula(lf.represent(0.3, "e8m0"))
    '2^(125 - 127)  =  2^-2   (no sign, no mantissa: a power of two)'
    """
    f = get(r.format)
    sign = "-" if r.sign else "+"
    if r.kind == "nan" and f.nan_encoding == "negative-zero":
        return f"sign 1, exponent and mantissa all zeros (the pattern of -0): NaN, {f.name} has no -0"
    if not f.signed:  # e8m0: the exponent is all there is
        if r.kind == "nan":
            return "exponent all ones: NaN"
        return f"2^({r.exponent} - {f.bias})  =  2^{r.exponent - f.bias}   (no sign, no mantissa: a power of two)"
    if r.kind in ("nan", "inf"):
        what = "NaN" if r.kind == "nan" else f"{sign}inf"
        return f"exponent all ones, mantissa {'≠' if r.kind == 'nan' else '='} 0: {what}"
    if r.kind == "zero":
        return f"exponent and mantissa all zeros: {sign}0"
    frac = r.mantissa / 2**f.mantissa_bits
    if r.kind == "subnormal":
        return f"{sign}2^{f.emin} × {frac:.9g}   (subnormal: exponent field 0 means 2^{f.emin} × 0.m)"
    return f"{sign}2^({r.exponent} - {f.bias}) × {1 + frac:.9g}  =  {sign}2^{r.exponent - f.bias} × {1 + frac:.9g}"


def short_decimal(r, width: int = 40) -> str:
    """The exact decimal of r.value if it is short, else 17 digits and the exact length."""
    if len(r.exact) <= width:
        return r.exact
    digits = r.exact.replace("-", "").replace(".", "").strip("0")
    return f"{r.value:.17g}  (exact decimal: {len(digits)} significant digits)"


def error_summary(r) -> str:
    """One line on what storing r.input cost: exact, rounded (and by how much), over/underflow."""
    if "nan" in r.flags or "inf" in r.flags:
        return "input is " + ("NaN" if "nan" in r.flags else "infinite")
    if "overflow" in r.flags:
        kept = "  (saturated: the format has no inf and no NaN)" if "saturated" in r.flags else ""
        return f"OVERFLOW: {r.input:g} > max {get(r.format).max:g}  →  {r.value}{kept}"
    if "invalid" in r.flags:
        return f"NO VALUE: {get(r.format).name} has no zero and no sign, so {r.input:g} becomes NaN"
    if "underflow" in r.flags:
        return f"UNDERFLOW: {r.input:g} rounds to 0 (relative error 1)"
    if r.abs_error == 0:
        return "exact: no rounding error"
    return f"rounded: error {r.abs_error:.3g} (relative {r.rel_error:.2g})"
