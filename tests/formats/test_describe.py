"""represent(): one value in one format, with what was lost; and the comparison table."""

import math
from decimal import Decimal, localcontext

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from labkit.table import Table


def test_fp16_overflow_of_256_squared():
    r = lf.represent(256.0**2, "fp16")
    assert r.flags == ("overflow",) and r.value == math.inf and r.hex == "0x7c00"


def test_fp16_underflow_of_1e_minus_5_squared():
    r = lf.represent(1e-5 * 1e-5, "fp16")
    assert r.flags == ("underflow",) and r.value == 0.0 and r.kind == "zero"


def test_same_squares_survive_in_bf16():
    assert lf.represent(256.0**2, "bf16").flags == ("exact",)
    assert "underflow" not in lf.represent(1e-10, "bf16").flags


def test_subnormal_keeps_fewer_significant_bits():
    r = lf.represent(1e-7, "fp16")
    assert r.flags == ("subnormal", "rounded")
    assert r.significant_bits == 2 and r.mantissa == 2  # 1e-7 ~ 2 * 2^-24
    assert lf.represent(1.0, "fp16").significant_bits == 11


def test_fp8_e4m3_overflow_becomes_nan():
    r = lf.represent(1000.0, "fp8_e4m3")
    assert r.flags == ("overflow",) and math.isnan(r.value) and r.bitstring == "0 1111 111"


def test_neighbours_and_errors_are_consistent():
    r = lf.represent(0.1, "bf16")
    assert r.prev < r.value < r.next
    assert r.abs_error == abs(r.value - 0.1)
    assert r.rel_error == pytest.approx(r.abs_error / 0.1)
    assert r.exact == "0.10009765625" and float(r.exact) == r.value


def test_exact_decimal_is_exact():
    assert lf.exact_decimal(2.0**-24) == "0.000000059604644775390625"
    assert lf.exact_decimal(65504.0) == "65504"
    assert lf.exact_decimal(-math.inf) == "-inf"
    from decimal import Decimal
    x = lf.get("fp32").round(0.1)
    assert Decimal(lf.exact_decimal(x)) == Decimal(x)


@pytest.mark.parametrize("x, flag", [(math.nan, "nan"), (-math.inf, "inf"), (1.0, "exact")])
def test_special_inputs_are_flagged(x, flag):
    for r in lf.represent_all(x):
        assert flag in r.flags


def test_represent_all_covers_every_format_in_order():
    assert [r.format for r in lf.represent_all(1.0)] == list(lf.COURSE_FORMATS)  # None: the course's six
    assert [r.format for r in lf.represent_all(1.0, list(lf.FORMATS))] == list(lf.FORMATS)
    assert [r.format for r in lf.represent_all(1.0, ["bf16", "fp16"])] == ["bf16", "fp16"]


@pytest.mark.parametrize("bad", ["0.1", [1.0, 2.0], None, True])
def test_represent_takes_one_number(bad):
    with pytest.raises(TypeError, match="one real number"):
        lf.represent(bad, "fp16")


def test_represent_rejects_unknown_formats():
    with pytest.raises(ValueError, match="valid names"):
        lf.represent(1.0, "fp12")


def test_comparison_table_is_computed_from_the_formats():
    t = lf.comparison_table()
    assert t.column("format") == list(lf.COURSE_FORMATS)
    assert t.column("max")[2] == "65504"  # fp16: not the "6.55e-5" of seed 003
    assert t.column("smallest subnormal")[2] == "5.96e-08"
    assert t.column("needs loss scaling?")[t.column("format").index("bf16")].startswith("no")
    assert t.column("needs loss scaling?")[2].startswith("usually")
    assert "<table>" in t._repr_html_() and "fp8_e5m2" in str(t)


def test_table_rejects_ragged_rows_and_unknown_columns():
    with pytest.raises(ValueError, match="header has 2"):
        Table(("a", "b"), (("1",),))
    with pytest.raises(ValueError, match="columns are a, b"):
        Table(("a", "b"), (("1", "2"),)).column("c")


def test_loss_scaling_need_follows_the_exponent_range():
    assert lf.loss_scaling_need("bf16").startswith("no")
    assert lf.loss_scaling_need("fp16").startswith("usually")
    assert lf.loss_scaling_need("e5m2").startswith("yes")
    assert [lf.loss_scaling_need(n).split()[0] for n in lf.FORMATS] == ["no", "no", "usually", "no", "yes:", "yes:",
                                                                         "yes:", "yes:", "yes:", "n/a:", "yes:", "yes:"]
    assert lf.loss_scaling_need("fp6_e3m2").endswith("per block (MX, NVFP4)")


# -- exact_decimal takes any real scalar, exactly (issue 12) -------------------------------------
@pytest.mark.parametrize("value", [np.float32(0.1), np.float16(0.1), np.float64(-2.5), np.float32(-0.0),
                                   np.float32(1e-45), ml_dtypes.bfloat16(0.1), ml_dtypes.float8_e4m3fn(0.3)])
def test_exact_decimal_of_a_numpy_scalar_is_that_value_exactly(value):
    text = lf.exact_decimal(value)
    assert Decimal(text) == Decimal(float(value))  # float() is exact for these: float64 holds them all
    assert text.startswith("-") == bool(np.signbit(value))


def test_exact_decimal_of_float32_point_one_is_not_float64_s():
    assert lf.exact_decimal(np.float32(0.1)) == "0.100000001490116119384765625"
    if np.finfo(np.longdouble).nmant >= 60:  # x87's 80-bit long double: more than a float64 holds
        with localcontext() as ctx:
            ctx.prec = 100
            exact = str(Decimal(1) / 2 + Decimal(2) ** -60)
        assert lf.exact_decimal(np.longdouble(0.5) + np.longdouble(2.0) ** -60) == exact


@pytest.mark.parametrize("bad, error", [(True, TypeError), ("0.1", TypeError), ([0.1], TypeError),
                                        (10**400, ValueError)])
def test_exact_decimal_refuses_what_is_not_one_real_number(bad, error):
    with pytest.raises(error, match="value must"):
        lf.exact_decimal(bad)


def test_represent_refuses_an_int_beyond_float64_with_a_message():
    with pytest.raises(ValueError, match="x must be within float64's range"):
        lf.represent(10**400, "fp16")
    with pytest.raises(TypeError, match="x must be one real number"):
        lf.represent([[1.0], [2.0, 3.0]], "fp16")
