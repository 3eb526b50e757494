"""What a learner may type into the explorer, and the messages for what it cannot read."""

import math

import pytest

import labkit.formats as lf
from labkit.widgets import parse
from labkit.widgets.parse import MAX_LENGTH, parse_entry, parse_number


@pytest.mark.parametrize("text, value", [
    ("0.1", 0.1),
    ("  1e-8 ", 1e-8),
    ("-3.5", -3.5),
    ("1_000", 1000.0),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("-Infinity", -math.inf),
    ("0x1.8p3", 12.0),
    ("-0x1p-24", -(2.0**-24)),
    ("256**2", 65536.0),
    ("256^2", 65536.0),
    ("2^-24", 2.0**-24),
    ("1e-5 * 1e-5", 1e-5 * 1e-5),
    ("1/3", 1 / 3),
    ("-(2 + 2) * 0.5", -2.0),
    ("−1", -1.0),  # a typographic minus
    ("3 × 2", 6.0),
    ("10**400", math.inf),
    ("-10**401", -math.inf),
    ("(-10)**401", -math.inf),
    ("1e400", math.inf),
])
def test_numbers_are_read_as_float64(text, value):
    e = parse_entry(text)
    assert e.value == value and not e.is_pattern and e.bits is None and e.format is None


def test_nan_and_negative_zero():
    assert math.isnan(parse_entry("nan").value)
    z = parse_entry("-0")
    assert z.value == 0.0 and math.copysign(1.0, z.value) == -1.0


@pytest.mark.parametrize("text, fmt, bits, value", [
    ("0x3c00", "fp16", 0x3C00, 1.0),
    ("0X3C00", "float16", 0x3C00, 1.0),
    ("0x3c_00", "fp16", 0x3C00, 1.0),
    ("0x7f", "fp8_e4m3", 0x7F, math.nan),
    ("0x7e", "fp8_e4m3", 0x7E, 448.0),
    ("0x3f80", "bf16", 0x3F80, 1.0),
    ("0x3f800000", "fp32", 0x3F800000, 1.0),
    ("0x8000", "fp16", 0x8000, -0.0),
    ("0x0001", "fp16", 1, 2.0**-24),
    ("0b0 01111 0000000000", "fp16", 0x3C00, 1.0),
    ("0b0_0111_000", "e4m3", 0x38, 1.0),
    ("0x3e", "fp8_e5m2", 0x3E, 1.5),  # "e" is a hex digit here, not an exponent
])
def test_bit_patterns_are_read_in_the_chosen_format(text, fmt, bits, value):
    e = parse_entry(text, fmt)
    assert e.is_pattern and e.bits == bits
    assert e.format == lf.get(fmt).name
    if math.isnan(value):
        assert math.isnan(e.value)
    else:
        assert e.value == value and math.copysign(1, e.value) == math.copysign(1, value)


@pytest.mark.parametrize("text, fmt, message", [
    ("0x1ffff", "fp16", r"does not fit in fp16: a 16-bit pattern lies in 0x0000 \.\. 0xffff"),
    ("0x100", "fp8_e4m3", r"does not fit in fp8_e4m3: a 8-bit pattern lies in 0x00 \.\. 0xff"),
    ("0b11111111111111111", "fp16", "does not fit in fp16"),
    ("-0x3c00", "fp16", "no sign in front"),
    ("", "fp16", "the input is empty"),
    ("   ", "fp16", "the input is empty"),
    ("garbage", "fp16", "type a number"),
    ("1e-", "fp16", "not a number"),
    ("__import__('os')", "fp16", "only numbers"),
    ("x + 1", "fp16", "only numbers"),
    ("[1, 2]", "fp16", "only numbers"),
    ("True", "fp16", "only numbers"),
    ("1/0", "fp16", "division by zero"),
    ("0**-1", "fp16", "division by zero"),
    ("(-8)**(1/3)", "fp16", "not a real number"),
    ("0x1.gp3", "fp16", "type a number"),
    ("0x_", "fp16", "'0x_' has no digits: a bit pattern is 0x then hex digits, as in 0x3c00"),
    ("0x", "fp16", "'0x' has no digits"),
    ("0b", "fp16", "'0b' has no digits: a bit pattern is 0b then 0s and 1s"),
    ("0xZZ", "fp16", "'0xZZ' is not a number: type a number"),
    ("1" * (MAX_LENGTH + 1), "fp16", "at most"),
    ("(" * 150 + "1" + ")" * 49, "fp16", "."),
])
def test_bad_text_is_refused_with_a_message_that_says_what_is_allowed(text, fmt, message):
    with pytest.raises(ValueError, match=message):
        parse_entry(text, fmt)


def test_non_text_and_unknown_formats_raise():
    with pytest.raises(TypeError, match="reads text"):
        parse_entry(0.1)
    with pytest.raises(ValueError, match="valid names"):
        parse_entry("0x3c00", "fp12")


@pytest.mark.parametrize("text, value", [
    ("-2**2", -4.0),  # Python's precedence: -(2**2)
    ("(-2)**2", 4.0),
    ("2**-1", 0.5),
    ("-2^2", -4.0),
    ("2**16", 65536.0),
    ("2^-4", 0.0625),
    ("1e-3", 1e-3),
    ("0x1p4", 16.0),
    ("2**-1074", 5e-324),
    ("1e-320", 1e-320),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("１２", 12.0),  # Unicode digits, as float() reads them
    ("−1", -1.0),
])
def test_parse_number_reads_numbers_as_python_does(text, value):
    assert parse_number(text) == value
    assert parse_entry(text).value == value


@pytest.mark.parametrize("text, message", [
    ("2**100000", "'2\\*\\*100000' is beyond float64's range \\(max 1.798e\\+308\\); type inf for an infinity"),
    ("2**99999999999", "beyond float64's range"),
    ("9**9**9**9", "beyond float64's range"),
    ("1e400", "beyond float64's range"),
    ("0x1p99999", "beyond float64's range"),
    ("0**-1", "'0\\*\\*-1': division by zero"),
    ("0^-1", "'0\\^-1': division by zero"),
    ("1/0", "division by zero"),
    ("0x_", "'0x_' is not a number: type a number"),
    ("0x3c00_", "not a number"),
    ("abc", "'abc': only numbers, inf, nan"),
    ("__import__('os')", "only numbers"),
    ("().__class__", "only numbers"),
    ("()", "only numbers"),
    ("1,5", "only numbers"),
    ("\x00", "is not a number"),
    ("", "the input is empty: type a number"),
    ("1" * 5000, "is 5000 characters long; at most 200 are read"),
])
def test_parse_number_refuses_what_is_not_a_number_in_float64_with_a_message(text, message):
    with pytest.raises(ValueError, match=message):
        parse_number(text)


def test_a_huge_exponent_is_refused_at_once_not_computed():
    # Done in float64, each is an overflow found in microseconds; as Python integers,
    # 2**99999999999 alone would take minutes and gigabytes.
    for text in ("2**99999999999", "10**10**10", "9**9**9**9**9"):
        with pytest.raises(ValueError, match="beyond float64's range"):
            parse_number(text)
        assert parse_entry(text).value == math.inf  # the explorer shows it, as float64 arithmetic gives


def test_parse_number_reads_text_only():
    with pytest.raises(TypeError, match="parse_number\\(\\) reads text, got int"):
        parse_number(5)
