"""The real FormatExplorer widget, driven as a learner would: type, drag, click a bit."""

import math

import pytest

import labkit.formats as lf
from labkit.widgets.explorer import SLIDER_RANGE, FormatExplorer


@pytest.fixture
def explorer():
    return FormatExplorer("0.1")


def flags(explorer, fmt):
    html = explorer.flag_label(fmt).value
    return [flag for flag in lf.FLAGS if f"labkit-flag-{flag}'" in html]


def test_it_starts_by_showing_its_first_value(explorer):
    assert "0.0999755859375" in explorer.value_label("fp16").value
    assert flags(explorer, "fp16") == ["rounded"]
    assert explorer.view.ok and explorer.view.entry.value == 0.1
    assert explorer.bit_button("fp16", 15).description == "0"
    assert "labkit-info" in explorer.message.value


def test_typing_a_value_updates_every_row(explorer):
    explorer.text.value = "1e-8"
    assert flags(explorer, "fp16") == ["underflow"]
    assert "<b><code>0.0</code></b>" == explorer.value_label("fp16").value
    assert flags(explorer, "bf16") == ["rounded"]
    assert "rounds to 0" in explorer.detail_label("fp16").value
    assert explorer.slider.value == pytest.approx(1e-8)


def test_overflow_is_flagged(explorer):
    explorer.text.value = "256**2"
    assert flags(explorer, "fp16") == ["overflow"] and explorer.value_label("fp16").value == "<b><code>inf</code></b>"
    assert flags(explorer, "bf16") == ["exact"]
    assert "no infinity" in explorer.detail_label("fp8_e4m3").value


def test_a_hex_pattern_is_read_in_the_chosen_format(explorer):
    explorer.pattern_format.value = "fp8_e4m3"
    explorer.text.value = "0x7e"
    assert "448.0" in explorer.value_label("fp8_e4m3").value
    assert "0x7e is an fp8_e4m3 bit pattern" in explorer.message.value
    assert "labkit-row-source" in explorer.rows["fp8_e4m3"].box._dom_classes
    assert "labkit-row-source" not in explorer.rows["fp16"].box._dom_classes


def test_changing_the_pattern_format_rereads_the_pattern(explorer):
    explorer.text.value = "0x3c00"
    assert "<b><code>1.0</code></b>" == explorer.value_label("fp32").value
    explorer.pattern_format.value = "bf16"  # 0x3c00 in bf16 is 2^-7 = 0.0078125
    assert "<b><code>0.0078125</code></b>" == explorer.value_label("fp32").value


def test_clicking_a_bit_flips_it_and_makes_the_pattern_the_input(explorer):
    explorer.text.value = "0x3c00"
    explorer.bit_button("fp16", 15).click()  # the sign bit
    assert explorer.text.value == "0xbc00"
    assert explorer.bit_button("fp16", 15).description == "1"
    assert explorer.value_label("fp16").value == "<b><code>-1.0</code></b>"
    assert explorer.value_label("fp32").value == "<b><code>-1.0</code></b>"
    explorer.bit_button("fp16", 0).click()  # one ulp further from zero
    assert explorer.text.value == "0xbc01"
    assert explorer.value_label("fp16").value == "<b><code>-1.0009765625</code></b>"


def test_clicking_a_bit_in_another_row_switches_the_pattern_format(explorer):
    explorer.text.value = "1"
    explorer.bit_button("bf16", 14).click()  # top exponent bit of 0x3f80 -> 0x7f80 = inf
    assert explorer.pattern_format.value == "bf16" and explorer.text.value == "0x7f80"
    assert explorer.value_label("bf16").value == "<b><code>inf</code></b>"
    assert flags(explorer, "fp32") == ["inf"]


def test_clicking_a_bit_into_subnormal_range_flags_it(explorer):
    explorer.text.value = "0x0400"  # fp16's smallest normal
    assert flags(explorer, "fp16") == ["exact"]
    explorer.bit_button("fp16", 10).click()  # exponent field -> 0: a zero
    explorer.bit_button("fp16", 9).click()  # top mantissa bit: 2^-15, a subnormal
    assert explorer.text.value == "0x0200"
    assert flags(explorer, "fp16") == ["subnormal", "exact"]
    assert flags(explorer, "fp8_e4m3") == ["underflow"]


def test_bit_buttons_are_coloured_by_field_and_value(explorer):
    explorer.text.value = "0x3c00"
    sign, top_exp, mantissa = (explorer.bit_button("fp16", i) for i in (15, 14, 9))
    assert sign.style.button_color != top_exp.style.button_color != mantissa.style.button_color
    one = explorer.bit_button("fp16", 13)  # 0x3c00 = 0 01111 ...: bit 13 is 1
    assert one.description == "1" and one.style.text_color == "white"
    assert top_exp.description == "0" and top_exp.style.text_color != "white"


def test_dragging_the_slider_writes_the_value_into_the_box(explorer):
    explorer.slider.value = 1e-6
    assert explorer.text.value == "1e-06"
    assert flags(explorer, "fp16") == ["subnormal", "rounded"]
    assert "keeps 5 of 11 significant bits" in explorer.detail_label("fp16").value


def test_the_browsers_snapped_slider_value_does_not_overwrite_the_typed_one(explorer):
    # Typing 256**2 moves the slider to 65536; the browser snaps that to its log10 step of
    # 0.01 and sends 10**4.82 = 66069 back. (Found by the browser test.)
    explorer.text.value = "256**2"
    explorer.slider.value = 10 ** (round(math.log10(65536) / 0.01) * 0.01)
    assert explorer.text.value == "256**2" and "65536" in explorer.value_label("bf16").value
    explorer.slider.value = 1e-6  # a real drag still wins
    assert explorer.text.value == "1e-06"


@pytest.mark.parametrize("text, message", [
    ("garbage", "type a number"),
    ("", "the input is empty"),
    ("0x1ffff", "does not fit in fp16"),
    ("1/0", "division by zero"),
])
def test_bad_input_shows_a_message_and_keeps_the_last_view(explorer, text, message):
    before = explorer.value_label("fp16").value
    explorer.text.value = text
    assert "labkit-error" in explorer.message.value and message in explorer.message.value
    assert explorer.value_label("fp16").value == before
    assert explorer.view.entry.value == 0.1
    explorer.text.value = "2"  # and it recovers
    assert "labkit-error" not in explorer.message.value
    assert explorer.value_label("fp16").value == "<b><code>2.0</code></b>"


def test_markup_in_the_input_is_escaped(explorer):
    explorer.text.value = "<b>1</b>"
    assert "<b>" not in explorer.message.value and "&lt;b&gt;" in explorer.message.value


def test_zero_inf_and_nan_leave_the_slider_where_it_was(explorer):
    explorer.text.value = "0.5"
    for text in ("0", "-inf", "nan"):
        explorer.text.value = text
        assert explorer.slider.value == 0.5


def test_tiny_and_huge_values_pin_the_slider_to_its_ends(explorer):
    explorer.text.value = "1e-300"
    assert explorer.slider.value == pytest.approx(10 ** SLIDER_RANGE[0])
    explorer.text.value = "1e300"
    assert explorer.slider.value == pytest.approx(10 ** SLIDER_RANGE[1])
    assert flags(explorer, "fp32") == ["overflow"]


def test_stable_css_classes_for_the_browser_test(explorer):
    assert "labkit-explorer" in explorer._dom_classes
    assert "labkit-explorer-input" in explorer.text._dom_classes
    assert "labkit-explorer-slider" in explorer.slider._dom_classes
    assert "labkit-explorer-message" in explorer.message._dom_classes
    assert "labkit-explorer-pattern-format" in explorer.pattern_format._dom_classes
    b = explorer.bit_button("fp8_e4m3", 3)
    assert {"labkit-bit", "labkit-bit-fp8_e4m3-3", "labkit-bit-exponent"} <= set(b._dom_classes)
    assert "labkit-value-fp16" in explorer.value_label("fp16")._dom_classes
    assert "labkit-flags-bf16" in explorer.flag_label("bf16")._dom_classes
    assert "labkit-details-fp32" in explorer.detail_label("fp32")._dom_classes


def test_a_subset_of_formats_and_bad_arguments():
    e = FormatExplorer("1", names=["bf16", "fp16"], pattern_format="bf16")
    assert list(e.rows) == ["bf16", "fp16"] and e.pattern_format.value == "bf16"
    assert repr(e) == "FormatExplorer(value='1', formats=['bf16', 'fp16'])"
    with pytest.raises(ValueError, match="shows bf16, fp16, not fp32"):
        e.value_label("fp32")
    with pytest.raises(ValueError, match=r"index must be a bit of fp16: 0 \.\. 15"):
        e.bit_button("fp16", 16)
    with pytest.raises(ValueError, match="valid names"):
        FormatExplorer("1", names=["fp12"])


def test_a_bad_first_value_shows_a_message_not_a_traceback():
    e = FormatExplorer("oops")
    assert "labkit-error" in e.message.value and e.view is None
    e.bit_button("fp16", 0).click()  # nothing to flip yet: no error
    e.text.value = "1"
    assert e.value_label("fp16").value == "<b><code>1.0</code></b>"


# -- the sub-byte formats, on request (issue 16) ------------------------------------------------
def test_the_default_rows_are_the_course_formats():
    assert list(FormatExplorer("0.1").rows) == list(lf.COURSE_FORMATS)


def test_sub_byte_rows_have_their_own_bits_and_flags():
    e = FormatExplorer("100", names=["fp8_e4m3", *lf.SUBBYTE_FORMATS])
    assert list(e.rows) == ["fp8_e4m3", *lf.SUBBYTE_FORMATS]
    assert flags(e, "fp4") == ["overflow", "saturated"] and "6.0" in e.value_label("fp4").value
    assert "saturates to max (6)" in e.detail_label("fp4").value
    assert flags(e, "fp8_e4m3fnuz") == ["rounded"] and "96.0" in e.value_label("fp8_e4m3fnuz").value
    with pytest.raises(ValueError, match=r"index must be a bit of fp4_e2m1: 0 \.\. 3"):
        e.bit_button("fp4", 4)
    top = e.bit_button("e8m0", 7)  # no sign bit: the top bit is an exponent bit
    assert "labkit-bit-exponent" in top._dom_classes and top.description == "1"
    e.text.value = "0"
    assert flags(e, "e8m0") == ["invalid"] and "no sign and no zero" in e.detail_label("e8m0").value


def test_clicking_a_bit_of_fp4_reads_the_pattern_in_fp4():
    e = FormatExplorer("1", names=list(lf.SUBBYTE_FORMATS))
    e.bit_button("fp4", 0).click()  # 1.0 = 0 01 0 -> 0 01 1 = 1.5
    assert e.pattern_format.value == "fp4_e2m1" and e.text.value == "0x3"
    assert e.view.entry.value == 1.5 and e.view.row("fp4").is_source
    assert "1.5" in e.value_label("fp6_e2m3").value
