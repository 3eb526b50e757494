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
    assert f.bits == 1 + f.exponent_bits + f.mantissa_bits


@pytest.mark.parametrize("name", ALL)
def test_eps_is_two_to_the_minus_mantissa_bits(name):
    f = lf.get(name)
    assert f.eps == 2.0 ** -f.mantissa_bits


@pytest.mark.parametrize("name", ALL)
def test_smallest_subnormal_is_smallest_normal_times_eps(name):
    f = lf.get(name)
    assert f.smallest_subnormal == f.smallest_normal * f.eps


@pytest.mark.parametrize("name", ALL)
def test_smallest_normal_follows_from_the_bias(name):
    f = lf.get(name)
    assert f.smallest_normal == 2.0 ** (1 - f.bias)
    assert f.bias == 2 ** (f.exponent_bits - 1) - 1


@pytest.mark.parametrize("name", ALL)
def test_max_is_the_largest_finite_pattern(name):
    f = lf.get(name)
    top = (1 << f.bits) - 1
    patterns = np.arange(top + 1, dtype=np.uint64) if f.bits <= 19 else None
    if patterns is not None:
        values = f.decode(patterns)
        assert np.nanmax(values[np.isfinite(values)]) == f.max
    assert f.max == (2 - 2 * f.eps if not f.has_inf and f.bits == 8 else 2 - f.eps) * 2.0**f.emax


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
     (np.dtype(np.float32), "fp32"), (ml_dtypes.bfloat16, "bf16"), (ml_dtypes.float8_e5m2, "fp8_e5m2")],
)
def test_get_accepts_aliases_and_dtypes(alias, name):
    assert lf.get(alias) is lf.FORMATS[name]


def test_get_returns_a_format_unchanged():
    f = lf.get("fp16")
    assert lf.get(f) is f


@pytest.mark.parametrize("bad", ["fp64", "int8", "", "bf17"])
def test_unknown_name_lists_the_valid_ones(bad):
    with pytest.raises(ValueError, match="valid names are fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2"):
        lf.get(bad)


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
