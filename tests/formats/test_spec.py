"""FloatFormat constants: read from ml_dtypes, and consistent with the bit layout."""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf

ALL = list(lf.FORMATS)
STORED = [name for name in ALL if lf.get(name).dtype is not None]


@pytest.mark.parametrize("name", ALL)
def test_layout_adds_up_to_the_width(name):
    f = lf.get(name)
    assert f.bits == f.signed + f.exponent_bits + f.mantissa_bits
    assert f.signed is (name != "e8m0")


@pytest.mark.parametrize("name", ALL)
def test_eps_is_two_to_the_minus_mantissa_bits(name):
    f = lf.get(name)
    assert f.eps == 2.0 ** -f.mantissa_bits


@pytest.mark.parametrize("name", ALL)
def test_smallest_subnormal_is_smallest_normal_times_eps(name):
    f = lf.get(name)
    assert f.smallest_subnormal == f.smallest_normal * f.eps  # e8m0: eps = 1, no subnormals


@pytest.mark.parametrize("name", ALL)
def test_smallest_normal_follows_from_the_bias(name):
    f = lf.get(name)
    assert f.smallest_normal == 2.0 ** ((1 if f.subnormals else 0) - f.bias) == 2.0**f.emin
    fnuz = f.nan_encoding == "negative-zero"  # the fnuz formats: bias one larger
    assert f.bias == 2 ** (f.exponent_bits - 1) - 1 + fnuz


@pytest.mark.parametrize("name", ALL)
def test_max_is_the_largest_finite_pattern(name):
    f = lf.get(name)
    top = (1 << f.bits) - 1
    patterns = np.arange(top + 1, dtype=np.uint64) if f.bits <= 19 else None
    if patterns is not None:
        values = f.decode(patterns)
        assert np.nanmax(values[np.isfinite(values)]) == f.max
    # the top binade loses one pattern to NaN only where NaN is "all ones" and there is a mantissa
    lost = f.nan_encoding == "all-ones" and f.mantissa_bits > 0
    assert f.max == (2 - 2 * f.eps if lost else 2 - f.eps) * 2.0**f.emax


@pytest.mark.parametrize("name", STORED)
def test_constants_match_ml_dtypes_finfo(name):
    f = lf.get(name)
    info = ml_dtypes.finfo(f.dtype)
    assert (f.bits, f.exponent_bits, f.mantissa_bits) == (info.bits, info.nexp, info.nmant)
    assert f.max == float(info.max)
    assert f.smallest_normal == float(info.smallest_normal)
    assert f.smallest_subnormal == float(info.smallest_subnormal)
    assert f.eps == float(info.eps)


def test_tf32_has_fp32_range_and_fp16_precision():
    tf32, fp32, fp16 = lf.get("tf32"), lf.get("fp32"), lf.get("fp16")
    assert tf32.exponent_bits == fp32.exponent_bits and tf32.smallest_normal == fp32.smallest_normal
    assert tf32.mantissa_bits == fp16.mantissa_bits
    assert tf32.max == float.fromhex("0x1.ffcp127")


def test_fp8_e4m3_is_the_fn_variant():
    e4m3 = lf.get("fp8_e4m3")
    assert e4m3.max == float.fromhex("0x1.Cp8")  # 448
    assert not e4m3.has_inf
    assert e4m3.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize(
    "alias, name",
    [("bfloat16", "bf16"), ("BF16", "bf16"), ("float16", "fp16"), ("half", "fp16"),
     ("float32", "fp32"), ("single", "fp32"), ("TF32", "tf32"), ("tensorfloat-32", "tf32"),
     ("e4m3", "fp8_e4m3"), ("float8_e4m3fn", "fp8_e4m3"), ("fp8-e5m2", "fp8_e5m2"),
     ("torch.bfloat16", "bf16"), ("jnp.float16", "fp16"), (np.float16, "fp16"),
     (np.dtype(np.float32), "fp32"), (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e5m2, "fp8_e5m2"),
     ("fp4", "fp4_e2m1"), ("e2m1", "fp4_e2m1"), ("float4_e2m1fn", "fp4_e2m1"), (ml_dtypes.float4_e2m1fn, "fp4_e2m1"),
     ("fp6_e2m3", "fp6_e2m3"), ("e2m3", "fp6_e2m3"), (ml_dtypes.float6_e2m3fn, "fp6_e2m3"),
     ("e3m2", "fp6_e3m2"), ("float6_e3m2fn", "fp6_e3m2"), (ml_dtypes.float6_e3m2fn, "fp6_e3m2"),
     ("E8M0", "e8m0"), ("float8_e8m0fnu", "e8m0"), ("torch.float8_e8m0fnu", "e8m0"), (ml_dtypes.float8_e8m0fnu, "e8m0"),
     ("e4m3fnuz", "fp8_e4m3fnuz"), ("float8_e4m3fnuz", "fp8_e4m3fnuz"), (ml_dtypes.float8_e4m3fnuz, "fp8_e4m3fnuz"),
     ("e5m2fnuz", "fp8_e5m2fnuz"), ("torch.float8_e5m2fnuz", "fp8_e5m2fnuz"), (ml_dtypes.float8_e5m2fnuz, "fp8_e5m2fnuz")],
)
def test_get_accepts_aliases_and_dtypes(alias, name):
    assert lf.get(alias) is lf.FORMATS[name]


def test_get_returns_a_format_unchanged():
    f = lf.get("fp16")
    assert lf.get(f) is f


@pytest.mark.parametrize("bad", ["fp64", "int8", "", "bf17"])
def test_unknown_name_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match="valid names are fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2, fp4_e2m1, "
                                         "fp6_e2m3, fp6_e3m2, e8m0, fp8_e4m3fnuz, fp8_e5m2fnuz "):
        lf.get(bad)


def test_the_catalog_is_the_course_formats_then_the_sub_byte_ones():
    assert list(lf.COURSE_FORMATS) == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
    assert list(lf.SUBBYTE_FORMATS) == ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2", "e8m0", "fp8_e4m3fnuz", "fp8_e5m2fnuz"]
    assert lf.FORMATS == {**lf.COURSE_FORMATS, **lf.SUBBYTE_FORMATS}
    assert all(lf.FORMATS[n] is f for n, f in {**lf.COURSE_FORMATS, **lf.SUBBYTE_FORMATS}.items())


def test_decimal_digits_grow_with_the_mantissa():
    digits = {name: lf.get(name).decimal_digits for name in ALL}
    assert digits["fp32"] > digits["fp16"] == digits["tf32"] > digits["bf16"] > digits["fp8_e4m3"]
    assert math.isclose(digits["fp32"], 24 * math.log10(2))


# -- a FloatFormat built by hand is checked (issue 12) ---------------------------------------
@pytest.mark.parametrize("change, error, words", [
    (dict(bits=17), ValueError, "bits must be 1 \\+ exponent_bits \\+ mantissa_bits"),
    (dict(mantissa_bits=2.5), TypeError, "mantissa_bits must be an integer"),
    (dict(max=None), TypeError, "max must be a number"),
    (dict(eps=-1.0), ValueError, "eps must be a finite number > 0"),
    (dict(has_inf="yes"), TypeError, "has_inf must be True or False"),
    (dict(signed=1), TypeError, "signed must be True or False"),
    (dict(signed=False), ValueError, "bits must be exponent_bits \\+ mantissa_bits \\(no sign bit"),
    (dict(nan_encoding="fnuz"), ValueError, "unknown nan_encoding 'fnuz'; choose one of 'ieee'"),
    (dict(nan_encoding="none"), ValueError, "has_inf=True does not go with nan_encoding='none'"),
    (dict(subnormals=None), TypeError, "subnormals must be True or False"),
    (dict(dtype="float16"), TypeError, "dtype must be a numpy dtype"),
    (dict(name=3), TypeError, "name must be a non-empty string"),
])
def test_a_float_format_refuses_fields_it_cannot_describe(change, error, words):
    with pytest.raises(error, match=words):
        dataclasses.replace(lf.get("fp16"), **change)


def test_a_format_argument_is_named_in_its_error():
    from labkit.formats.spec import format_arg

    assert format_arg("accumulator", "half") is lf.get("fp16")
    with pytest.raises(ValueError, match="^accumulator: unknown float format 'fp12'"):
        format_arg("accumulator", "fp12")
    with pytest.raises(ValueError, match=r"an integer of 401 digits"):  # not the value printed whole
        lf.get(10**400)


# -- the sub-byte formats: what each lacks (issue 16) -----------------------------------------
@pytest.mark.parametrize("name, signed, has_inf, has_nan, has_zero, has_negative_zero, saturates, nan_bits", [
    ("fp4_e2m1", True, False, False, True, True, True, None),
    ("fp6_e2m3", True, False, False, True, True, True, None),
    ("fp6_e3m2", True, False, False, True, True, True, None),
    ("e8m0", False, False, True, False, False, False, 0xFF),
    ("fp8_e4m3fnuz", True, False, True, True, False, False, 0x80),
    ("fp8_e5m2fnuz", True, False, True, True, False, False, 0x80),
    ("fp8_e4m3", True, False, True, True, True, False, 0x7F),
    ("fp16", True, True, True, True, True, False, 0x7E00),
])
def test_each_format_says_what_it_lacks(name, signed, has_inf, has_nan, has_zero, has_negative_zero, saturates,
                                        nan_bits):
    f = lf.get(name)
    assert (f.signed, f.has_inf, f.has_nan, f.has_zero, f.has_negative_zero, f.saturates, f.nan_bits) == (
        signed, has_inf, has_nan, has_zero, has_negative_zero, saturates, nan_bits)


@pytest.mark.parametrize("name", STORED)
def test_the_nan_pattern_is_what_ml_dtypes_makes_of_nan(name):
    f = lf.get(name)
    made = np.asarray(np.float32(np.nan)).astype(f.dtype).view(f.uint_dtype if f.bits > 8 else np.uint8)
    is_nan = np.isnan(np.asarray(made).view(f.dtype).astype(np.float32))
    assert (f.nan_bits == int(made)) if f.has_nan else not is_nan


@pytest.mark.parametrize("name", [n for n in STORED if n != "fp32"])
def test_a_value_takes_one_byte_or_more_and_fp4_fp6_leave_bits_unused(name):
    f = lf.get(name)
    assert f.storage_bits == 8 * np.dtype(f.dtype).itemsize
    assert (f.storage_bits > f.bits) is (name in ("fp4_e2m1", "fp6_e2m3", "fp6_e3m2"))


def test_e8m0_is_a_power_of_two_from_2_to_the_minus_127():
    e8m0 = lf.get("e8m0")
    assert (e8m0.bias, e8m0.emin, e8m0.emax, e8m0.eps) == (127, -127, 127, 1.0)
    assert e8m0.smallest_normal == float.fromhex("0x1p-127") and e8m0.max == float.fromhex("0x1p127")
    assert e8m0.layout == "8+0" and lf.get("fp4").layout == "1+2+1"


def test_fnuz_formats_have_a_bias_one_larger_than_their_ocp_twins():
    assert lf.get("fp8_e4m3fnuz").bias == lf.get("fp8_e4m3").bias + 1
    assert lf.get("fp8_e5m2fnuz").bias == lf.get("fp8_e5m2").bias + 1
    assert lf.get("fp8_e4m3fnuz").max == float.fromhex("0x1.Ep7")  # 240
    assert lf.get("fp8_e5m2fnuz").max == lf.get("fp8_e5m2").max  # 57344: the top binade is not lost to inf
