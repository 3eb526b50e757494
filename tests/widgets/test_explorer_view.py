"""The explorer's state -> view step: every string the widget shows, computed and checked."""


import numpy as np
import pytest

import labkit.formats as lf
from labkit.widgets.explorer_view import ExplorerView, explorer_view, flip_bit

ALL = list(lf.COURSE_FORMATS)  # what the explorer shows by default
EVERY = list(lf.FORMATS)


def test_a_decimal_is_shown_in_every_format_as_represent_sees_it():
    v = explorer_view("0.1")
    assert v.ok and [r.format for r in v.rows] == ALL
    for row in v.rows:
        r = lf.represent(0.1, row.format)
        assert (row.bits, row.hex, row.bitstring, row.flags, row.kind) == (r.bits, r.hex, r.bitstring, r.flags, r.kind)
        assert row.value_text == repr(r.value) and row.exact == r.exact
        assert row.prev_text == repr(r.prev) and row.next_text == repr(r.next)
        assert not row.is_source and row.note == ""


def test_cells_spell_the_pattern_most_significant_first_with_fields():
    row = explorer_view("0.1").row("fp16")
    assert "".join(str(c.value) for c in row.cells) == "0010111001100110"  # 0x2e66
    assert [c.index for c in row.cells] == list(range(15, -1, -1))
    assert [c.field for c in row.cells] == ["sign"] + ["exponent"] * 5 + ["mantissa"] * 10
    assert row.bit(0).value == 0 and row.bit(1).value == 1 and row.bit(15).field == "sign"


def test_1e_minus_8_underflows_in_fp16_and_fp8_but_not_in_bf16():
    v = explorer_view("1e-8")
    assert v.row("fp16").flags == ("underflow",) and v.row("fp16").value == 0.0
    assert "rounds to 0" in v.row("fp16").note
    assert v.row("fp8_e5m2").flags == ("underflow",)
    assert v.row("bf16").flags == ("rounded",) and v.row("fp32").flags == ("rounded",)


def test_256_squared_overflows_fp16_and_becomes_nan_in_e4m3():
    v = explorer_view("256**2")
    assert v.row("fp16").flags == ("overflow",) and v.row("fp16").value_text == "inf"
    assert "becomes inf" in v.row("fp16").note
    assert v.row("fp8_e4m3").value_text == "nan" and "no infinity" in v.row("fp8_e4m3").note
    assert v.row("bf16").flags == ("exact",)


def test_subnormal_rows_say_how_many_significant_bits_are_left():
    row = explorer_view("1e-7").row("fp16")
    assert row.flags == ("subnormal", "rounded")
    assert "keeps 2 of 11 significant bits" in row.note
    assert "subnormal" in row.formula


def test_minus_inf_and_nan():
    v = explorer_view("-inf")
    assert v.row("fp32").value_text == "-inf" and v.row("fp32").flags == ("inf",)
    assert v.row("fp8_e4m3").value_text == "nan" and "no infinity" in v.row("fp8_e4m3").note
    v = explorer_view("nan")
    assert all(r.value_text == "nan" and r.flags == ("nan",) for r in v.rows)
    assert v.row("fp16").hex == "0x7e00"


def test_negative_zero_keeps_its_sign_bit():
    v = explorer_view("-0")
    for row in v.rows:
        assert row.value_text == "-0.0" and row.cells[0].value == 1 and sum(c.value for c in row.cells) == 1


def test_a_huge_value_reads_as_inf_and_says_so():
    v = explorer_view("1e400")
    assert v.ok and "beyond float64's range" in v.message
    assert v.row("bf16").value_text == "inf"
    big = explorer_view("1e38")
    assert big.row("bf16").flags == ("rounded",) and big.row("fp16").flags == ("overflow",)


def test_hex_pattern_in_the_chosen_format_is_the_source_row():
    v = explorer_view("0x3c00", pattern_format="fp16")
    assert v.message == "0x3c00 is an fp16 bit pattern: 1.0"
    assert [r.format for r in v.rows if r.is_source] == ["fp16"]
    assert all(r.value_text == "1.0" and r.flags == ("exact",) for r in v.rows)
    assert v.row("bf16").hex == "0x3f80"


@pytest.mark.parametrize("text, fmt, message", [
    ("0x7c00", "fp16", "0x7c00 is an fp16 bit pattern: inf (+infinity)"),
    ("0xfc00", "fp16", "0xfc00 is an fp16 bit pattern: -inf (-infinity)"),
    ("0x7f800000", "fp32", "0x7f800000 is an fp32 bit pattern: inf (+infinity)"),
    ("0xff800000", "fp32", "0xff800000 is an fp32 bit pattern: -inf (-infinity)"),
    ("0x7e00", "fp16", "0x7e00 is an fp16 bit pattern: nan (not a number)"),
    ("0x7f", "fp8_e4m3", "0x7f is an fp8_e4m3 bit pattern: nan (not a number)"),
])
def test_a_pattern_that_is_an_infinity_or_a_nan_of_its_format_says_so(text, fmt, message):
    v = explorer_view(text, pattern_format=fmt)
    assert v.ok and v.message == message and "beyond" not in v.message
    assert v.row(fmt).is_source and v.row(fmt).value_text == message.split(": ")[1].split(" ")[0]


def test_0x7f_is_the_nan_of_fp8_e4m3():
    v = explorer_view("0x7f", pattern_format="e4m3")
    row = v.row("fp8_e4m3")
    assert row.is_source and row.value_text == "nan" and row.bits == 0x7F and row.bitstring == "0 1111 111"
    assert explorer_view("0x7e", pattern_format="e4m3").row("fp8_e4m3").value_text == "448.0"


def test_a_nan_pattern_keeps_its_own_payload_in_the_source_row():
    v = explorer_view("0x7e01", pattern_format="fp16")
    assert v.row("fp16").bits == 0x7E01 and v.row("fp16").bitstring == "0 11111 1000000001"
    assert v.row("fp16").cells[-1].value == 1
    assert v.row("bf16").bits == 0x7FC0  # the other formats show the NaN a conversion gives


@pytest.mark.parametrize("text, message", [
    ("", "the input is empty"),
    ("garbage", "type a number"),
    ("0x1ffff", "does not fit in fp16"),
    ("-0x3c00", "no sign"),
    ("1/0", "division by zero"),
])
def test_bad_text_gives_a_view_with_a_message_not_an_exception(text, message):
    v = explorer_view(text)
    assert not v.ok and message in v.message and v.rows == () and v.entry is None
    assert str(v).startswith("cannot show this entry")


def test_out_of_range_hex_depends_on_the_pattern_format():
    assert not explorer_view("0x3f800000", pattern_format="fp16").ok
    assert explorer_view("0x3f800000", pattern_format="fp32").row("fp32").value_text == "1.0"
    assert not explorer_view("0x100", pattern_format="fp8_e5m2").ok


def test_a_number_from_the_slider_is_accepted():
    v = explorer_view(np.float64(2.0) ** -24)
    assert v.ok and v.row("fp16").flags == ("subnormal", "exact") and v.row("fp16").hex == "0x0001"
    assert explorer_view(3).row("fp8_e4m3").value_text == "3.0"


@pytest.mark.parametrize("bad", [None, [0.1], True, b"0.1"])
def test_entries_that_are_not_text_or_a_number_raise(bad):
    with pytest.raises(TypeError, match="text or a real number"):
        explorer_view(bad)


def test_names_select_and_order_the_rows():
    v = explorer_view("1", names=["bf16", "half"])
    assert [r.format for r in v.rows] == ["bf16", "fp16"]
    with pytest.raises(ValueError, match="no row for fp32"):
        v.row("fp32")
    with pytest.raises(ValueError, match="valid names"):
        explorer_view("1", names=["fp12"])
    with pytest.raises(ValueError, match="at least one"):
        explorer_view("1", names=[])


def test_text_view_lists_every_format():
    text = str(explorer_view("0x3c00", names=["fp16", "fp8_e4m3"]))
    assert text.splitlines() == [
        "0x3c00 is an fp16 bit pattern: 1.0",
        "fp16      0x3c00  0 01111 0000000000  1.0  [exact]  <- the pattern you gave",
        "fp8_e4m3  0x38    0 0111 000          1.0  [exact]",
    ]


@pytest.mark.parametrize("name", EVERY)
def test_flipping_every_bit_twice_gives_back_the_pattern(name):
    f = lf.get(name)
    bits = int(f.encode(0.1))
    for i in range(f.bits):
        flipped = flip_bit(f, bits, i)
        assert flipped != bits and flip_bit(f, flipped, i) == bits
        assert bin(flipped ^ bits).count("1") == 1


def test_flip_results_follow_the_fields():
    assert flip_bit("fp16", 0x3C00, 15) == 0xBC00  # sign: 1.0 -> -1.0
    assert lf.get("fp16").decode(flip_bit("fp16", 0x3C00, 10)) == 0.5  # lowest exponent bit
    assert lf.get("fp16").decode(flip_bit("fp16", 0x3C00, 0)) == 1 + 2.0**-10  # one ulp
    v = explorer_view(hex(flip_bit("fp16", 0x3C00, 14)), pattern_format="fp16")  # top exponent bit
    assert v.row("fp16").value_text == "inf"  # 0x7c00


@pytest.mark.parametrize("args, error, message", [
    (("fp16", 0x3C00, 16), ValueError, r"bits 0 \.\. 15"),
    (("fp16", 0x3C00, -1), ValueError, r"bits 0 \.\. 15"),
    (("fp16", 0x3C00, 1.0), TypeError, "integer"),
    (("fp16", 0x10000, 0), ValueError, "not a 16-bit fp16 pattern"),
    (("fp16", "0x3c00", 0), TypeError, "integer bit pattern"),
    (("fp12", 1, 0), ValueError, "valid names"),
])
def test_flip_bit_refuses_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        flip_bit(*args)


def test_view_is_a_value():
    v = explorer_view("1")
    assert isinstance(v, ExplorerView) and v == explorer_view("1")
    with pytest.raises(AttributeError):
        v.ok = False
    assert v.entry.value == 1.0 and not v.entry.is_pattern


def test_every_format_can_be_shown_and_read_patterns_in():
    v = explorer_view("0x80", pattern_format="fp8_e4m3fnuz", names=EVERY)
    assert v.ok and [r.format for r in v.rows] == EVERY
    assert v.message == "0x80 is an fp8_e4m3fnuz bit pattern: nan (not a number)"
    assert v.row("fp4").flags == ("nan",) and v.row("fp4").value == -0.0  # ml_dtypes: NaN -> -0 in fp4
    assert [c.field for c in v.row("e8m0").cells] == ["exponent"] * 8
    assert v.row("e8m0").bitstring == "11111111" and v.row("e8m0").kind == "nan"


@pytest.mark.parametrize("entry, name, note", [
    ("100", "fp4", "fp4_e2m1 has no infinity and no NaN: this saturates to max (6)"),
    ("inf", "fp6_e3m2", "fp6_e3m2 has no infinity and no NaN: this saturates to max (28)"),
    ("-1", "e8m0", "e8m0 has no sign and no zero (its smallest value is 5.88e-39): this becomes NaN"),
    ("1e-60", "e8m0", "e8m0 has no zero: a value below 5.88e-39 becomes 5.88e-39"),
    ("1000", "fp8_e4m3fnuz", "fp8_e4m3fnuz has no infinity: this becomes NaN (max is 240)"),
])
def test_the_note_says_what_the_format_lacks(entry, name, note):
    assert explorer_view(entry, names=[name]).row(name).note == note
