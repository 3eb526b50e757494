"""The sub-byte and scale formats (fp4_e2m1, fp6_e2m3, fp6_e3m2, e8m0) and the fnuz FP8s: what each
lacks (inf, NaN, -0, zero, a sign), checked pattern by pattern against ml_dtypes, against gfloat (an
independent implementation of the OCP formats) and against the MX specification's value tables.

The generic identities (every pattern decoded, encoded, its float32 neighbourhood rounded, random
float32 and float64 inputs) run for these formats too, in test_bits.py and test_saturate.py.
"""

import math

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from test_bits import all_patterns, library_cast

SUB = list(lf.SUBBYTE_FORMATS)


def specials(f):
    """The inputs where a conversion has a rule rather than a rounding: zeros, NaNs, infinities, just
    past max, the tie above max, half the smallest subnormal and either side of it."""
    ss, top = f.smallest_subnormal, f.max
    half_ulp_top = f.ulp(top) / 2
    x = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, top, top * 1.01, top + half_ulp_top, top * 1e6,
         ss, ss / 2, ss / 2 * (1 + 2**-20), ss / 2 * (1 - 2**-20), ss / 4, 1e-300, 5e-324]
    x = np.array(x, np.float64)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name", SUB)
def test_specials_convert_as_ml_dtypes_converts_them(name):
    f = lf.get(name)
    x = specials(f)
    np.testing.assert_array_equal(f.encode(x), library_cast(x, f.dtype).view(np.uint8))
    with np.errstate(over="ignore"):  # e8m0's max * 1e6 is past float32's: inf, a probe too
        x32 = x.astype(np.float32)
    np.testing.assert_array_equal(f.encode(x32), library_cast(x32, f.dtype).view(np.uint8))
    got, want = f.round(x), library_cast(library_cast(x, f.dtype), np.float64)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


# -- the values, as the OCP MX v1.0 specification tabulates them ----------------------------
def test_fp4_e2m1_holds_fifteen_values_up_to_six():
    values = lf.get("fp4").decode(np.arange(16, dtype=np.uint8))
    assert values[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert values[8:].tolist() == [-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert lf.representable_values("fp4", -6, 6).size == 15  # -0 and +0 are one value


@pytest.mark.parametrize("name, top, positives", [("fp6_e2m3", 7.5, 32), ("fp6_e3m2", 28.0, 32)])
def test_fp6_formats_have_no_special_patterns(name, top, positives):
    f = lf.get(name)
    values = f.decode(all_patterns(f))
    assert np.all(np.isfinite(values)) and values.max() == top and values.size == 2 * positives


@pytest.mark.parametrize("name, fi", [("fp4_e2m1", "format_info_ocp_e2m1"), ("fp6_e2m3", "format_info_ocp_e2m3"),
                                      ("fp6_e3m2", "format_info_ocp_e3m2"), ("e8m0", "format_info_ocp_e8m0"),
                                      ("fp8_e4m3", "format_info_ocp_e4m3"), ("fp8_e5m2", "format_info_ocp_e5m2")])
def test_every_pattern_decodes_as_gfloat_decodes_it(name, fi):
    gfloat = pytest.importorskip("gfloat")
    import gfloat.formats  # noqa: F401 -- not imported by the package itself
    info = getattr(gfloat.formats, fi)
    f = lf.get(name)
    expected = np.array([gfloat.decode_float(info, int(i)).fval for i in all_patterns(f)])
    np.testing.assert_array_equal(f.decode(all_patterns(f)), expected)


# -- fp4 / fp6: no inf, no NaN ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2"])
def test_fp4_and_fp6_turn_nan_into_a_zero_of_the_opposite_sign_as_ml_dtypes_does(name):
    f = lf.get(name)
    nans = np.array([np.nan, -np.nan], np.float32)
    assert f.encode(nans).tolist() == library_cast(nans, f.dtype).view(np.uint8).tolist() == [1 << (f.bits - 1), 0]
    assert f.classify(np.nan) == "zero" and f.nan_bits is None


def test_fp4_rounds_to_nearest_even_and_saturates_at_six():
    fp4 = lf.get("fp4")
    x = [0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 5.5, 7.0, 100.0, -100.0, np.inf]
    assert fp4.round(x).tolist() == [0.0, 1.0, 1.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -6.0, 6.0]
    r = lf.represent(100.0, "fp4")
    assert r.flags == ("overflow", "saturated") and r.value == 6.0 and r.bitstring == "0 11 1"
    assert math.isnan(fp4.next_up(6.0)) and math.isnan(fp4.next_down(-6.0))  # nothing beyond max, not even inf


# -- fnuz: no -0, one NaN at 0x80, no inf ----------------------------------------------------
@pytest.mark.parametrize("name", ["fp8_e4m3fnuz", "fp8_e5m2fnuz"])
def test_fnuz_has_no_negative_zero_and_its_pattern_is_the_one_nan(name):
    f = lf.get(name)
    assert f.encode(-0.0) == 0 == f.encode(-f.smallest_subnormal / 4)  # a negative underflow is +0
    values = f.decode(all_patterns(f))
    assert np.isnan(values).sum() == 1 and np.isnan(f.decode(0x80)) and f.classify(np.nan) == "nan"
    assert f.encode([np.nan, -np.nan, np.inf, -np.inf, 1e9]).tolist() == [0x80] * 5
    assert lf.represent(-0.0, f).value == 0.0 and not math.copysign(1, lf.represent(-0.0, f).value) < 0


def test_fnuz_e4m3_reaches_240_and_ocp_e4m3_448():
    assert lf.get("fp8_e4m3fnuz").round([240.0, 247.9, 248.0]).tolist()[:2] == [240.0, 240.0]
    assert np.isnan(lf.get("fp8_e4m3fnuz").round(248.0))  # the tie rounds up to 256: past max
    assert lf.get("fp8_e4m3fnuz").to_bitstring(0x80) == "1 0000 000"


# -- e8m0: a power of two, no sign, no zero ---------------------------------------------------
def test_e8m0_pattern_e_is_two_to_the_e_minus_127_and_0xff_is_nan():
    e8m0 = lf.get("e8m0")
    values = e8m0.decode(np.arange(255, dtype=np.uint8))
    np.testing.assert_array_equal(values, np.exp2(np.arange(255) - 127.0))
    assert np.isnan(e8m0.decode(0xFF)) and e8m0.classify([2.0**-127, 1.0, 0.0]).tolist() == ["normal", "normal", "nan"]
    assert e8m0.to_bitstring(e8m0.encode(1.0)) == "01111111" and e8m0.fields(0.25) == (0, 125, 0)


def test_e8m0_rounds_a_tie_up_as_ml_dtypes_and_torch_do():
    e8m0 = lf.get("e8m0")
    ties = np.array([0.75, 1.5, 3.0, 6.0, 1.5 * 2.0**-127])
    assert e8m0.round(ties).tolist() == library_cast(library_cast(ties, ml_dtypes.float8_e8m0fnu), np.float64).tolist()
    assert e8m0.round(ties).tolist() == [1.0, 2.0, 4.0, 8.0, 2.0**-126]
    assert e8m0.round(np.nextafter(1.5, 0)) == 1.0


def test_gfloat_rounds_an_e8m0_tie_to_the_even_exponent_instead():
    # The MX specification derives a block's scale from floor(log2(amax)), not by a cast, so a cast's
    # tie rule is each library's own: ml_dtypes and torch go up, gfloat keeps the even code.
    gfloat = pytest.importorskip("gfloat")
    import gfloat.formats  # noqa: F401 -- not imported by the package itself
    info = gfloat.formats.format_info_ocp_e8m0
    assert [gfloat.round_float(info, v) for v in (0.75, 3.0)] == [0.5, 2.0]
    assert lf.get("e8m0").round([0.75, 3.0]).tolist() == [1.0, 4.0]


def test_e8m0_has_no_value_for_zero_or_negatives_and_lifts_tiny_values_to_its_smallest():
    e8m0 = lf.get("e8m0")
    assert e8m0.encode([0.0, -0.0, -1.0, -np.inf, np.inf, 2.0**128]).tolist() == [0xFF] * 6
    assert e8m0.encode([2.0**-130, 1e-300, 5e-324]).tolist() == [0, 0, 0]
    assert lf.represent(0.0, "e8m0").flags == ("invalid",)
    assert lf.represent(1e-50, "e8m0").flags == ("rounded",) and lf.represent(1e-50, "e8m0").value == 2.0**-127
    assert e8m0.next_up(1.0) == 2.0 and e8m0.next_down(1.0) == 0.5 and e8m0.ulp(8.0) == 8.0
    assert math.isnan(e8m0.next_down(2.0**-127)) and math.isnan(e8m0.next_up(2.0**127))
    assert e8m0.next_up(-5.0) == e8m0.next_up(0.0) == 2.0**-127 and math.isnan(e8m0.next_down(0.0))
    assert lf.representable_values("e8m0", -1.0, 1.0).tolist() == np.exp2(np.arange(-127.0, 1.0)).tolist()


# -- the figures, the explorer and the tables see them ---------------------------------------
def test_texts_describe_what_each_format_lacks():
    from labkit.formats.summary import decode_formula, error_summary

    assert decode_formula(lf.represent(0.25, "e8m0")) == "2^(125 - 127)  =  2^-2   (no sign, no mantissa: a power of two)"
    assert decode_formula(lf.represent(np.nan, "fp8_e4m3fnuz")).startswith("sign 1, exponent and mantissa all zeros")
    assert error_summary(lf.represent(100.0, "fp4")) == "OVERFLOW: 100 > max 6  →  6.0  (saturated: the format has no inf and no NaN)"
    assert error_summary(lf.represent(-2.0, "e8m0")).startswith("NO VALUE: e8m0 has no zero and no sign")


def test_tables_list_the_sub_byte_formats_only_when_asked():
    assert lf.comparison_table().column("format") == list(lf.COURSE_FORMATS)
    t = lf.comparison_table(list(lf.SUBBYTE_FORMATS))
    assert t.column("format") == SUB
    assert t.column("storage")[:2] == ["1 byte (4 bits used)", "1 byte (6 bits used)"]
    assert t.column("smallest subnormal")[SUB.index("e8m0")] == "none"
    assert lf.precision_comparison(["fp4"])["FP4_E2M1"]["memory"] == "1 byte (4 bits used; packed: 0.5 byte)"
