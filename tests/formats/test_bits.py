"""encode / decode / round against ml_dtypes and numpy, bit for bit.

The 16- and 8-bit formats are small enough to check every pattern; fp32, tf32 and
the float64 -> narrow conversions are checked on millions of random inputs.
"""

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf

SMALL = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", *lf.SUBBYTE_FORMATS]  # every pattern of each


def all_patterns(f):
    return np.arange(1 << f.bits, dtype=np.uint64).astype(f.uint_dtype)


def library_cast(x, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype)


@pytest.mark.parametrize("name", SMALL)
def test_decode_matches_ml_dtypes_for_every_pattern(name):
    f = lf.get(name)
    bits = all_patterns(f)
    expected = library_cast(bits.view(f.dtype), np.float64)
    got = f.decode(bits)
    np.testing.assert_array_equal(got, expected)  # NaNs compare equal here
    assert np.array_equal(np.signbit(got), np.signbit(expected))


@pytest.mark.parametrize("name", SMALL)
def test_encode_inverts_decode_for_every_non_nan_pattern(name):
    f = lf.get(name)
    bits = all_patterns(f)
    values = f.decode(bits)
    keep = ~np.isnan(values)
    np.testing.assert_array_equal(f.encode(values[keep]), bits[keep])


@pytest.mark.parametrize("name", SMALL)
def test_encode_matches_ml_dtypes_on_every_float32_neighbourhood(name):
    # Every pattern's value, and the float32 values just above, below, and half-way to the
    # next pattern: exactly the inputs where rounding can go wrong.
    f = lf.get(name)
    values = f.decode(all_patterns(f))
    values = values[np.isfinite(values)]
    up, down = f.next_up(values), f.next_down(values)
    mids = np.concatenate([(values + up) / 2, (values + down) / 2])
    mids = mids[np.isfinite(mids)].astype(np.float32)
    probes = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    np.testing.assert_array_equal(f.encode(probes), library_cast(probes, f.dtype).view(f.uint_dtype))


@pytest.mark.parametrize("name", SMALL)
def test_encode_matches_ml_dtypes_on_random_float32_bit_patterns(name):
    f = lf.get(name)
    rng = np.random.default_rng(20260)
    x = rng.integers(0, 1 << 32, size=500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(f.encode(x), library_cast(x, f.dtype).view(f.uint_dtype))


@pytest.mark.parametrize("name", SMALL)
def test_encode_matches_ml_dtypes_on_random_float64_inputs(name):
    # ml_dtypes before 0.7 rounds float64 -> bf16/fp8 through float32 (twice), 0.7 and numpy's
    # float64 -> float16 round once. Values near a tie, where the two differ, are included on purpose.
    f = lf.get(name)
    rng = np.random.default_rng(7)
    values = f.decode(all_patterns(f))
    values = values[np.isfinite(values) & (values != 0)]
    near_ties = (values + f.next_up(values)) / 2
    near_ties = near_ties[np.isfinite(near_ties)]
    near_ties = near_ties * (1 + rng.choice([-1, 1], near_ties.size) * 2.0**-40)
    wide = rng.standard_normal(200_000) * np.exp2(rng.uniform(-160, 140, 200_000))
    x = np.concatenate([near_ties, wide, [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e300, -1e-300]])
    np.testing.assert_array_equal(f.encode(x), library_cast(x, f.dtype).view(f.uint_dtype))


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_float64_just_above_a_tie_rounds_as_the_installed_ml_dtypes_does(name):
    # 1 + eps/2 + 2^-30 is just above the tie between 1 and 1 + eps, but in float32 it *is* the
    # tie: two roundings (ml_dtypes < 0.7) give 1, one rounding (ml_dtypes >= 0.7) gives 1 + eps.
    f = lf.get(name)
    x = 1 + f.eps / 2 + 2**-30
    library = float(library_cast(x, f.dtype))
    assert library in (1.0, 1 + f.eps) and f.round(x) == library
    assert f.via_float32 is (library == 1.0)


def test_fp16_from_float64_rounds_once_and_tf32_takes_fp32_inputs():
    assert lf.get("fp16").round(1 + 2**-11 + 2**-40) == 1 + 2**-10  # numpy rounds float16 once
    assert not lf.get("fp16").via_float32 and lf.get("tf32").via_float32


def test_fp32_encode_matches_numpy_cast_on_random_float64_patterns():
    f = lf.get("fp32")
    rng = np.random.default_rng(3)
    x = rng.integers(0, 1 << 64, size=500_000, dtype=np.uint64).view(np.float64)
    x = np.concatenate([x, rng.standard_normal(50_000) * 1e-40, rng.standard_normal(50_000) * 3e38])
    np.testing.assert_array_equal(f.encode(x), library_cast(x, np.float32).view(np.uint32))


def tf32_reference(x32):
    """fp32 with the low 13 mantissa bits rounded off, ties to even, on the raw bits."""
    b = x32.view(np.uint32).astype(np.uint64)
    rounded = (b + 0xFFF + ((b >> 13) & 1)) & ~np.uint64(0x1FFF)
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def test_tf32_is_fp32_with_the_mantissa_rounded_to_10_bits():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 1 << 32, size=500_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[np.isfinite(x)]
    with np.errstate(all="ignore"):
        expected = tf32_reference(x)
    np.testing.assert_array_equal(lf.get("tf32").round(x), expected)


def test_tf32_ties_go_to_even():
    tf32 = lf.get("tf32")
    assert tf32.round(1 + 2**-11) == 1.0  # tie, 1.0 is even
    assert tf32.round(1 + 3 * 2**-11) == 1 + 2**-9  # tie, rounds up to the even neighbour
    assert tf32.round(np.finfo(np.float32).max) == np.inf  # past tf32's max: carries into inf


@pytest.mark.parametrize(
    "name, x, expected",
    [
        ("fp16", 65504.0, 65504.0), ("fp16", 65519.99, 65504.0), ("fp16", 65520.0, np.inf),
        ("fp8_e4m3", 464.0, 448.0), ("fp8_e4m3", 465.0, np.nan), ("fp8_e4m3", np.inf, np.nan),
        ("fp8_e5m2", 61439.0, 57344.0), ("fp8_e5m2", 61440.0, np.inf),
        ("bf16", 3.4e38, np.inf), ("fp16", 2.0**-25, 0.0), ("fp16", 2.0**-25 * 1.0001, 2.0**-24),
    ],
)
def test_overflow_and_underflow_edges(name, x, expected):
    assert np.array_equal(lf.get(name).round(x), expected, equal_nan=True)


@pytest.mark.parametrize("name", [n for n, f in lf.FORMATS.items() if f.has_negative_zero and f.has_nan])
def test_negative_zero_and_nan_keep_their_sign(name):  # the others: tests/formats/test_subbyte.py
    f = lf.get(name)
    assert f.encode(-0.0) == 1 << (f.bits - 1)
    assert f.encode(-np.nan) >> (f.bits - 1) == 1
    assert np.isnan(f.round(np.nan))


@pytest.mark.parametrize("name", list(lf.FORMATS))
def test_fields_reassemble_the_pattern(name):
    f = lf.get(name)
    x = np.array([1.0, -2.5, 0.1, f.smallest_subnormal, -f.max, 0.0])
    s, e, m = f.fields(x)
    np.testing.assert_array_equal((s << (f.bits - 1)) | (e << f.mantissa_bits) | m, f.encode(x))
    assert f.fields(1.0) == (0, f.bias, 0)


def test_classify_names_each_kind():
    fp16 = lf.get("fp16")
    kinds = fp16.classify([0.0, -0.0, 1e-6, 1.0, 1e6, np.nan, -np.inf])
    assert kinds.tolist() == ["zero", "zero", "subnormal", "normal", "inf", "nan", "inf"]
    assert lf.get("fp8_e4m3").classify(1e6) == "nan"  # no inf in e4m3fn
    assert fp16.classify(1.0) == "normal" and isinstance(fp16.classify(1.0), str)


@pytest.mark.parametrize("name", SMALL)
def test_next_up_and_down_walk_every_pattern_in_order(name):
    f = lf.get(name)
    values = np.unique(f.decode(all_patterns(f)))  # sorted; -0 and 0 merge; NaN last
    values = values[~np.isnan(values)]
    if f.has_inf:
        values = values[1:-1]  # the neighbours of +-inf are not values
    np.testing.assert_array_equal(f.next_up(values[:-1]), values[1:])
    np.testing.assert_array_equal(f.next_down(values[1:]), values[:-1])


def test_neighbours_of_a_value_between_patterns_bracket_it():
    fp16 = lf.get("fp16")
    assert fp16.next_down(0.1) < 0.1 < fp16.next_up(0.1)
    assert fp16.next_up(0.1) - fp16.next_down(0.1) == fp16.ulp(0.1)
    assert fp16.next_up(0.0) == fp16.smallest_subnormal == -fp16.next_down(-0.0)
    assert fp16.next_up(fp16.max) == np.inf
    assert np.isnan(lf.get("fp8_e4m3").next_up(448.0))  # nothing above max, not even inf


@pytest.mark.parametrize("name", [n for n, f in lf.FORMATS.items() if f.has_zero])
def test_ulp_is_eps_at_one_and_the_subnormal_step_near_zero(name):
    f = lf.get(name)
    assert f.ulp(1.0) == f.eps
    assert f.ulp(0.0) == f.smallest_subnormal == f.ulp(f.smallest_normal / 3)
    assert f.ulp(-1.5) == f.eps


def test_ulp_matches_numpy_spacing_for_fp16():
    x = np.float16(np.linspace(0.01, 60000, 1001))
    np.testing.assert_array_equal(lf.get("fp16").ulp(x), np.spacing(x).astype(np.float64))


def test_rel_error_is_at_most_half_an_eps_for_normals():
    rng = np.random.default_rng(11)
    for name in lf.FORMATS:
        f = lf.get(name)
        x = np.exp2(rng.uniform(np.log2(f.smallest_normal), np.log2(f.max) - 1, 10_000))
        err = f.rel_error(x)
        assert err.max() <= f.eps / 2
        assert err.max() > f.eps / 4  # and it is not trivially zero
    assert lf.get("fp16").rel_error(0.0) == 0.0
    assert lf.get("fp16").rel_error(1e6) == np.inf


def test_bitstring_shows_the_three_fields():
    assert lf.get("fp16").to_bitstring(0x3C00) == "0 01111 0000000000"
    assert lf.get("fp8_e4m3").to_bitstring(0x7F, sep="|") == "0|1111|111"


def test_scalars_in_python_types_out_arrays_in_arrays_out():
    fp16 = lf.get("fp16")
    assert type(fp16.encode(1.0)) is int and type(fp16.round(1.0)) is float
    assert type(fp16.decode(0x3C00)) is float
    assert (fp16.encode(1.0), fp16.round(0.1), fp16.decode(0x3C00)) == (0x3C00, 0.0999755859375, 1.0)
    out = fp16.encode(np.ones((2, 3)))
    assert out.shape == (2, 3) and out.dtype == np.uint16 and np.all(out == 0x3C00)


@pytest.mark.parametrize("bad", ["0.1", b"1", True, None, {"a": 1}, np.array(["x"]), 1 + 2j])
def test_encode_rejects_what_is_not_a_real_number(bad):
    with pytest.raises(TypeError, match="real numbers"):
        lf.get("fp16").encode(bad)


@pytest.mark.parametrize("bad", [1.0, "0x3c00", np.array([1.5]), True])
def test_decode_rejects_non_integer_patterns(bad):
    with pytest.raises(TypeError, match="bit pattern must be an integer"):
        lf.get("fp16").decode(bad)


@pytest.mark.parametrize("name, bad", [("fp16", 0x10000), ("fp16", -1), ("fp8_e4m3", 256), ("bf16", np.array([1, 70000]))])
def test_decode_rejects_patterns_out_of_range(name, bad):
    with pytest.raises(ValueError, match="out of range"):
        lf.get(name).decode(bad)


# -- a bit pattern is an integer of the format's width (issue 12) ------------------------------
@pytest.mark.parametrize("bits, error, words", [
    (1.5, TypeError, "must be an integer"),  # was: truncated to pattern 1
    (np.float64(1.0), TypeError, "must be an integer"),
    (True, TypeError, "got bool"),  # was: read as 1
    (np.True_, TypeError, "got bool"),
    (0x10000, ValueError, "out of range for fp16"),
    (-1, ValueError, "out of range for fp16"),
    (10**400, ValueError, "out of range for fp16"),
    ([0x3C00, 0x3C00], TypeError, "one fp16 bit pattern"),
    ([[1], [2, 3]], TypeError, "one fp16 bit pattern"),
    ("0x3c00", TypeError, "must be an integer"),
])
def test_to_bitstring_takes_one_integer_pattern_within_the_format(bits, error, words):
    with pytest.raises(error, match=words):
        lf.get("fp16").to_bitstring(bits)


def test_to_bitstring_takes_numpy_integers_and_a_string_separator():
    fp16 = lf.get("fp16")
    assert fp16.to_bitstring(np.uint16(0x3C00)) == fp16.to_bitstring(np.int64(0x3C00)) == "0 01111 0000000000"
    with pytest.raises(TypeError, match="sep must be a string"):
        fp16.to_bitstring(0x3C00, sep=None)


def test_integers_too_large_for_int64_are_out_of_range_not_a_wrong_type():
    fp16 = lf.get("fp16")
    with pytest.raises(ValueError, match="out of range for fp16"):
        fp16.decode([1, 2**70])
    with pytest.raises(ValueError, match="x must lie within float64's range"):
        fp16.encode(10**400)
    assert fp16.encode([2**64, 1.0]).tolist() == [fp16.encode(np.inf), 0x3C00]
    assert fp16.encode(2**64) == fp16.encode(np.inf)  # held by float64: it overflows fp16, as it should
