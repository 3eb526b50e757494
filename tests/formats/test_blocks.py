"""labkit.formats.blocks on its own: the catalog's constants, the spec's rules recomputed independently,
the edge cases, the explanation helpers and bad input (the torchao/gfloat comparisons are in
test_blocks_conformance.py)."""

import math

import ml_dtypes
import numpy as np
import pytest

from labkit.formats import blocks

MX = [n for n, f in blocks.FORMATS.items() if f.scale == "e8m0"]
FLOAT_MX = [n for n in MX if n != "mxint8"]


def gaussian(n=4096, seed=0, spread=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n // 64, 64))
    if spread:
        x *= np.exp2(rng.integers(-20, 20, (n // 64, 1)))
    return x.astype(np.float32)


def test_formats_are_the_seven_block_formats():
    assert list(blocks.FORMATS) == ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8", "nvfp4"]


@pytest.mark.parametrize("name", blocks.FORMATS)
def test_format_constants_follow_from_the_element_dtype(name):
    f = blocks.FORMATS[name]
    assert f.block_size == (16 if name == "nvfp4" else 32)
    if f.element != "int8":
        fi = ml_dtypes.finfo(f.dtype)
        assert (f.element_max, f.element_bits, f.element_mbits) == (float(fi.max), fi.bits, fi.nmant)
    assert 2 ** f.element_emax <= f.element_max < 2 ** (f.element_emax + 1)
    assert f.bits_per_value == f.element_bits + 8 / f.block_size


@pytest.mark.parametrize("name", MX)
def test_floor_scale_is_floor_log2_amax_minus_emax(name):
    x = gaussian(seed=1)
    q = blocks.quantize(x, name)
    amax = np.abs(x.astype(np.float64)).reshape(-1, 32).max(axis=1)
    expected = np.clip(np.floor(np.log2(amax)) - blocks.FORMATS[name].element_emax, -127, 127) + 127
    np.testing.assert_array_equal(q.scales.reshape(-1), expected)


@pytest.mark.parametrize("name", FLOAT_MX)
def test_elements_are_x_over_the_scale_rounded_to_nearest_even_and_saturated(name):
    f = blocks.FORMATS[name]
    x = gaussian(seed=2)
    q = blocks.quantize(x, name)
    scale = np.repeat(q.scale_values().astype(np.float64), 32, axis=-1)
    y = np.clip(x / scale, -f.element_max, f.element_max)  # exact: the scale is a power of two
    np.testing.assert_array_equal(q.element_values(), y.astype(f.dtype).astype(np.float32))
    np.testing.assert_array_equal(q.dequantize(), (q.element_values() * scale).astype(np.float32))


def test_mxint8_elements_are_int8_over_64():
    q = blocks.quantize(np.linspace(-1, 1, 32, dtype=np.float32), "mxint8")
    assert q.scales[0] == 127  # amax 1: 2^0
    np.testing.assert_array_equal(q.elements.view(np.int8), np.rint(np.linspace(-1, 1, 32) * 64))


def test_an_all_zero_block_gets_the_smallest_scale_and_comes_back_zero():
    q = blocks.quantize(np.zeros((2, 32), np.float32), "mxfp8_e4m3")
    assert (q.scales == 0).all() and (q.dequantize() == 0).all()


@pytest.mark.parametrize("mode", blocks.SCALE_ROUNDINGS)
def test_a_nan_makes_its_block_nan_and_leaves_the_next_block_alone(mode):
    x = np.ones(64, np.float32)
    x[3] = np.nan
    q = blocks.quantize(x, "mxfp4", scale_rounding=mode)
    assert q.scales[0] == 255 and np.isnan(q.dequantize()[:32]).all()
    np.testing.assert_array_equal(q.dequantize()[32:], 1.0)


def test_an_infinity_comes_back_as_infinity_and_the_rest_of_its_block_as_zero():
    x = np.ones(32, np.float32)
    x[0] = -np.inf
    back = blocks.quantize(x, "mxfp8_e4m3").dequantize()
    assert back[0] == -np.inf and (back[1:] == 0).all()


def test_amax_500_comes_back_as_448_under_floor_and_512_under_rceil():
    t = blocks.outlier_table(500.0, "mxfp8_e4m3")
    back = dict(zip(t.column("scale rounding"), t.column("amax comes back as")))
    e4m3_max = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    assert back["floor"] == f"{e4m3_max:g}"                    # scale 2^0: 500 saturates
    assert back["rceil"] == back["ceil"] == back["even"] == "512"  # scale 2^1: 250 rounds to 256


def test_nvfp4_amax_tensor_scale_puts_the_top_block_at_e4m3_max():
    x = gaussian(seed=3)
    q = blocks.quantize(x, "nvfp4", tensor_scale="amax")
    assert q.tensor_scale == np.float32(np.abs(x).max()) / np.float32(448 * 6)
    top = np.unravel_index(np.argmax(np.abs(x)), x.shape)
    assert q.scales[top[0], top[1] // 16] == 0x7E  # 448 in E4M3
    assert blocks.quantize(x, "nvfp4").tensor_scale is None


def test_nvfp4_small_blocks_lose_less_than_mxfp4():
    x = gaussian(seed=4, spread=False)
    t = blocks.error_table(x, ["mxfp4", "nvfp4"])
    err = {f: float(e.rstrip("%")) for f, e in zip(t.column("format"), t.column("RMS relative error"))}
    assert err["nvfp4"] < err["mxfp4"] and err["nvfp4 + tensor scale"] < err["mxfp4"]
    assert blocks.rms_relative_error(x, "nvfp4") < blocks.rms_relative_error(x, "mxfp4")


def test_shapes_scales_one_per_block_of_the_last_axis():
    x = gaussian(seed=5).reshape(4, 8, 128)
    for name in ("mxfp6_e3m2", "nvfp4"):
        q = blocks.quantize(x, name)
        bs = blocks.FORMATS[name].block_size
        assert q.elements.shape == x.shape and q.scales.shape == (4, 8, 128 // bs)
        assert q.dequantize().shape == x.shape and q.dequantize().dtype == np.float32


def test_inputs_are_rounded_to_float32_first():
    x64 = np.full(32, 1.0 + 2.0 ** -30)
    np.testing.assert_array_equal(blocks.quantize(x64, "mxfp8_e4m3").dequantize(), 1.0)
    with np.errstate(over="ignore"):
        assert blocks.quantize(np.full(32, 1e300), "mxfp8_e4m3").dequantize()[0] == np.inf
    bf = np.full(32, 3.0, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(blocks.quantize(bf, "mxfp4").dequantize(), 3.0)


def test_block_table_shows_each_element_of_one_block():
    t = blocks.block_table([500.0] + [1.0] * 31, "mxfp8_e4m3", scale_rounding="rceil")
    assert len(t.rows) == 32 and "scale 2^1" in t.title
    assert t.rows[0][4] == "512" and t.rows[1][4] == "1"
    with pytest.raises(ValueError, match="one block of 16"):
        blocks.block_table(np.ones(32), "nvfp4")


def test_blocktensor_refuses_bit_patterns_out_of_range():
    q = blocks.quantize(np.ones(32, np.float32), "mxfp4")
    with pytest.raises(ValueError, match="elements must be bit patterns from 0 to 15"):
        blocks.BlockTensor("mxfp4", q.scales, q.elements + 16)
    with pytest.raises(ValueError, match="one entry per block"):
        blocks.BlockTensor("mxfp4", np.zeros(2, np.uint8), q.elements)


# -- bad input ---------------------------------------------------------------------------------
def test_an_unknown_format_is_refused_with_the_names():
    with pytest.raises(ValueError, match="unknown format 'mxfp3'.*'mxfp4'"):
        blocks.quantize(np.ones(32), "mxfp3")


def test_a_last_axis_that_is_not_whole_blocks_says_what_to_pad_to():
    with pytest.raises(ValueError, match="pad the last axis from 40 to 64"):
        blocks.quantize(np.ones((2, 40)), "mxfp4")
    with pytest.raises(ValueError, match="pad the last axis from 40 to 48"):
        blocks.quantize(np.ones(40), "nvfp4")
    with pytest.raises(ValueError, match="last axis"):
        blocks.quantize(np.float32(1.0), "mxfp4")


@pytest.mark.parametrize("bad", [np.ones(32, np.int32), np.ones(32, bool), np.ones(32, np.complex64),
                                 np.array([1.0] * 32, object), "1.0", [1] * 32])
def test_non_float_input_is_a_type_error(bad):
    with pytest.raises(TypeError, match="x must"):
        blocks.quantize(bad, "mxfp8_e4m3")


def test_scale_rounding_and_tensor_scale_are_checked():
    x = np.ones(32, np.float32)
    with pytest.raises(ValueError, match="unknown scale_rounding 'round'"):
        blocks.quantize(x, "mxfp4", scale_rounding="round")
    with pytest.raises(ValueError, match="scale_rounding applies to the MX formats"):
        blocks.quantize(x, "nvfp4", scale_rounding="floor")
    with pytest.raises(ValueError, match="tensor_scale must be None for mxfp4"):
        blocks.quantize(x, "mxfp4", tensor_scale=1.0)
    for bad in (0.0, -1.0, math.inf, math.nan, 1e-60):
        with pytest.raises(ValueError, match="tensor_scale must be a number > 0"):
            blocks.quantize(x, "nvfp4", tensor_scale=bad)
    with pytest.raises(ValueError, match="'amax'"):
        blocks.quantize(x, "nvfp4", tensor_scale="max")
    with pytest.raises(TypeError, match="tensor_scale"):
        blocks.quantize(x, "nvfp4", tensor_scale=True)


def test_nvfp4_without_a_tensor_scale_flushes_a_tensor_of_small_values():
    # the E4M3 block scale is clamped at 2^-6: a block with amax below 6 * 2^-6 cannot use E2M1's range
    x = gaussian(seed=6, spread=False) * np.float32(1e-3)
    t = blocks.error_table(x, ["nvfp4"])
    flushed = dict(zip(t.column("format"), (float(z.rstrip("%")) for z in t.column("nonzero -> 0"))))
    assert flushed["nvfp4"] > 50 and flushed["nvfp4 + tensor scale"] < 10
    assert (blocks.quantize(x, "nvfp4").scale_values() == 2.0 ** -6).all()
