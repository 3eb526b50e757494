"""The seeds' tables, regenerated: every cell computed from the format, checked against the claim."""

import math

import pytest

import labkit.formats as lf
from labkit.formats.summary import (
    bit_fields,
    decode_formula,
    dynamic_range,
    error_summary,
    feature_table,
    precision_comparison,
    representation_table,
    short_decimal,
)


def test_feature_table_has_seed_000_rows_and_one_column_per_format():
    t = feature_table()
    assert t.columns == ("feature", "fp32", "fp16", "bf16")
    assert t.column("feature")[:3] == ["total bits", "exponent bits", "fraction bits"]
    assert [row[1:] for row in t.rows[:3]] == [("32", "16", "16"), ("8", "5", "8"), ("23", "10", "7")]


def test_feature_table_precision_orders_fp32_fp16_bf16_high_medium_low():
    digits = [float(cell.split()[0]) for cell in feature_table().rows[7][1:]]
    assert digits[0] > digits[1] > digits[2]  # seed 000: 高 / 中 / 低 holds


def test_dynamic_range_of_bf16_is_fp32s_and_fp16s_is_narrow():
    assert dynamic_range("bf16")[1] == pytest.approx(dynamic_range("fp32")[1], abs=0.01)
    assert dynamic_range("fp16")[1] == pytest.approx(math.log10(65504 / 2**-14))
    assert dynamic_range("fp16")[0] < 13 < 78 < dynamic_range("bf16")[0]


def test_precision_comparison_regenerates_seed_004_with_the_subnormal_floor():
    d = precision_comparison()
    assert list(d) == ["FP32", "FP16", "BF16"]
    assert d["FP32"]["range"] == "1.18e-38 to 3.4e+38"
    assert d["FP16"]["range"] == "6.1e-5 to 6.55e+4"
    assert d["BF16"]["range"] == "1.18e-38 to 3.39e+38"
    assert d["BF16"]["subnormal_min"] == "9.18e-41"
    assert d["FP16"]["subnormal_min"] == "5.96e-8"
    assert d["FP16"]["decimal_digits"] > d["BF16"]["decimal_digits"]  # not both "medium"
    assert d["FP16"]["max"] == 65504.0 and d["BF16"]["memory"] == "2 bytes"


def test_representation_table_rows_follow_represent():
    t = representation_table([6.1e-5, 1e-7, 2.9e-8, 7e4], "fp16")
    assert t.column("kind") == ["subnormal", "subnormal", "zero", "inf"]
    assert t.column("bits kept") == ["10", "2", "0", "0"]
    assert t.column("flags")[2] == "underflow" and t.column("flags")[3] == "overflow"


@pytest.mark.parametrize("bad, error", [("1e-5", TypeError), (3.0, TypeError), ([], ValueError)])
def test_representation_table_refuses_bad_values(bad, error):
    with pytest.raises(error):
        representation_table(bad, "fp16")


def test_unknown_format_names_say_what_is_valid():
    with pytest.raises(ValueError, match="valid names"):
        feature_table(["fp16", "float12"])
    with pytest.raises(ValueError, match="at least one"):
        precision_comparison([])


@pytest.mark.parametrize("name", list(lf.FORMATS))
def test_bit_fields_cover_every_bit(name):
    f = lf.get(name)
    fields = bit_fields(f)
    assert len(fields) == f.bits and fields.count("exponent") == f.exponent_bits
    assert fields[0] == ("sign" if f.signed else "exponent")
    assert fields[-1] == ("mantissa" if f.mantissa_bits else "exponent")  # e8m0: exponent bits only


@pytest.mark.parametrize("x, name, text", [
    (1.0, "fp16", "+2^(15 - 15) × 1  =  +2^0 × 1"),
    (-0.0, "bf16", "exponent and mantissa all zeros: -0"),
    (math.inf, "fp16", "exponent all ones, mantissa = 0: +inf"),
    (math.nan, "fp8_e5m2", "exponent all ones, mantissa ≠ 0: NaN"),
    (2.0**-24, "fp16", "+2^-14 × 0.0009765625   (subnormal: exponent field 0 means 2^-14 × 0.m)"),
    (0.5, "fp4", "+2^0 × 0.5   (subnormal: exponent field 0 means 2^0 × 0.m)"),
    (6.0, "fp4", "+2^(3 - 1) × 1.5  =  +2^2 × 1.5"),
    (math.nan, "e8m0", "exponent all ones: NaN"),
    (2.0**-127, "e8m0", "2^(0 - 127)  =  2^-127   (no sign, no mantissa: a power of two)"),
])
def test_decode_formula_reads_the_fields(x, name, text):
    assert decode_formula(lf.represent(x, name)) == text


def test_decode_formula_evaluates_to_the_stored_value():
    for name in lf.FORMATS:
        for x in (0.3, 1.7, 5.0):
            r = lf.represent(x, name)
            f = lf.get(name)
            if r.kind == "normal":  # 0.3 is a subnormal of fp4 / fp6_e2m3
                assert 2.0 ** (r.exponent - f.bias) * (1 + r.mantissa / 2**f.mantissa_bits) == r.value
                assert f"2^{r.exponent - f.bias}" in decode_formula(r)


def test_error_summary_and_short_decimal():
    assert error_summary(lf.represent(0.5, "fp16")) == "exact: no rounding error"
    assert error_summary(lf.represent(7e4, "fp16")).startswith("OVERFLOW")
    assert error_summary(lf.represent(1e-9, "fp16")).startswith("UNDERFLOW")
    assert error_summary(lf.represent(0.1, "fp16")) == "rounded: error 2.44e-05 (relative 0.00024)"
    assert short_decimal(lf.represent(0.1, "bf16")) == "0.10009765625"
    tiny = short_decimal(lf.represent(2.0**-149, "fp32"))
    assert tiny.startswith("1.4012984643248171e-45") and "significant digits" in tiny
