"""labkit.formats.blocks against the real libraries: torchao's MX and NVFP4 emulation, gfloat's block formats.

The same float32 blocks -- random data spread over float32's whole range, outliers, zeros, subnormals,
infinities, NaNs, ties, amax below the smallest scale -- go through both, and the scales' bits, the
elements' bits and the dequantized values' bits must agree. Where they may not (documented in
labkit/formats/blocks/__init__.py), the test says so and checks what is specified instead.
"""

import types
import warnings

import numpy as np
import pytest

from labkit.formats import blocks
from labkit.train.torch.quiet import quiet_import

MODES = blocks.SCALE_ROUNDINGS
TORCHAO_MX = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4")


@pytest.fixture(scope="module")
def ao():
    """torchao's MX and NVFP4 modules, imported quietly (it prints 'Failed to load ...so' and warns)."""
    with quiet_import():
        torch = pytest.importorskip("torch")
        pytest.importorskip("torchao")
        from torchao.prototype.mx_formats import constants, kernels
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    elem = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2, "mxfp4": torch.float4_e2m1fn_x2,
            "mxfp6_e2m3": constants.DTYPE_FP6_E2M3, "mxfp6_e3m2": constants.DTYPE_FP6_E3M2}
    return types.SimpleNamespace(torch=torch, MXTensor=MXTensor, NVFP4Tensor=NVFP4Tensor, Mode=ScaleCalculationMode,
                                 per_tensor_amax_to_scale=per_tensor_amax_to_scale, elem=elem, kernels=kernels)


def mixed_blocks(seed: int, n_blocks: int = 96, block: int = 32, specials: bool = True) -> np.ndarray:
    """float32 blocks over the whole float32 range, with outliers and the edge cases, shaped (-1, 64)."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal((n_blocks, block)) * np.exp2(rng.integers(-135, 120, (n_blocks, 1)))).astype(np.float32)
    x[rng.random(x.shape) < 0.02] *= np.float32(300.0)  # outliers
    x[0] = 0.0
    x[1] = (np.arange(block) - block // 2) * np.float32(2.0 ** -149)    # subnormals
    x[2] = rng.standard_normal(block) * np.float32(2.0 ** -128)         # amax below the smallest scale
    x[3] = np.float32(3.0e38) * np.clip(rng.standard_normal(block), -1, 1)  # near float32's max
    x[4] = 500.0                                                        # the amax = 500 example
    x[5] = np.arange(block) * np.float32(0.25) + np.float32(0.125)      # ties in every format
    x[6, :] = -(1 + np.arange(block) / block) * 8                       # negative amax
    if specials:
        x[7, 3], x[8, 5] = np.inf, -np.inf
        x[9, 1], x[10, 0] = np.nan, -np.nan
    return x.reshape(-1, 64)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: identical float32 bit patterns, or both NaN (NaN payloads are not specified)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def torchao_elements(ao, qdata, fmt):
    """torchao's element bit patterns, one per byte (fp4 comes packed two to a byte)."""
    if fmt in ("mxfp4", "nvfp4"):
        return ao.kernels.unpack_uint4(qdata.view(ao.torch.uint8).contiguous()).numpy()
    return qdata.view(ao.torch.uint8).numpy() if qdata.dtype != ao.torch.uint8 else qdata.numpy()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", TORCHAO_MX)
def test_mx_quantize_matches_torchao_to_mx_bit_for_bit(ao, fmt, mode):
    x = mixed_blocks(seed=len(fmt) * 7 + MODES.index(mode))
    t = ao.MXTensor.to_mx(ao.torch.from_numpy(x), ao.elem[fmt], 32, scaling_mode=ao.Mode(mode))
    q = blocks.quantize(x, fmt, scale_rounding=mode)
    scales = t.scale.view(ao.torch.uint8).numpy().reshape(q.scales.shape)
    np.testing.assert_array_equal(q.scales, scales)
    deq = t.dequantize(ao.torch.float32).numpy()
    assert same_bits(q.dequantize(), deq).all(), np.argwhere(~same_bits(q.dequantize(), deq))[:5]
    # a NaN scale (0xFF) makes the whole block NaN in both; the element bits inside are not specified
    nan_block = np.repeat(scales == 255, 32, axis=-1)
    assert nan_block.any() and np.isnan(deq[nan_block]).all()
    elements = torchao_elements(ao, t.qdata, fmt).reshape(x.shape)
    np.testing.assert_array_equal(q.elements[~nan_block], elements[~nan_block])


@pytest.mark.parametrize("tensor_scale", [None, "amax", 0.37])
def test_nvfp4_matches_torchao_nvfp4_tensor(ao, tensor_scale):
    x = mixed_blocks(seed=5, block=16, specials=tensor_scale != "amax")  # an inf or NaN makes amax useless
    xt = ao.torch.from_numpy(x)
    pts = {None: None, "amax": ao.per_tensor_amax_to_scale(ao.torch.max(ao.torch.abs(xt))),
           0.37: ao.torch.tensor(0.37, dtype=ao.torch.float32)}[tensor_scale]
    t = ao.NVFP4Tensor.to_nvfp4(xt, per_tensor_scale=pts)
    q = blocks.quantize(x, "nvfp4", tensor_scale=tensor_scale)
    scales = t.scale.view(ao.torch.uint8).numpy().reshape(q.scales.shape)
    np.testing.assert_array_equal(q.scales, scales)
    if pts is None:
        assert q.tensor_scale is None
    else:
        assert q.tensor_scale.view(np.uint32) == pts.numpy().view(np.uint32)
    deq = t.dequantize(ao.torch.float32).numpy()
    assert same_bits(q.dequantize(), deq).all()
    nan_block = np.repeat(np.isnan(q.scale_values()), 16, axis=-1)
    elements = torchao_elements(ao, t.qdata, "nvfp4").reshape(x.shape)
    np.testing.assert_array_equal(q.elements[~nan_block], elements[~nan_block])


def test_rceil_takes_float32_log2_as_torchao_does_not_the_exact_ceiling(ao):
    # amax = 448 * 2^k * (1 + j * 2^-23): the descale amax / 448 lies just above a power of two
    k = np.arange(-120, 120, 3, dtype=np.float64)[:, None]
    j = np.arange(1, 9, dtype=np.float64)[None, :]
    amax = (448.0 * np.exp2(k) * (1 + j * 2.0 ** -23)).astype(np.float32).reshape(-1, 1)
    x = np.repeat(amax, 32, axis=1)  # one block per (k, j)
    t = ao.MXTensor.to_mx(ao.torch.from_numpy(x), ao.elem["mxfp8_e4m3"], 32, scaling_mode=ao.Mode("rceil"))
    q = blocks.quantize(x, "mxfp8_e4m3", scale_rounding="rceil")
    np.testing.assert_array_equal(q.scales[:, 0], t.scale.view(ao.torch.uint8).numpy().reshape(-1))
    descale = (np.abs(x).max(axis=-1) / np.float32(448.0)).astype(np.float64)
    exact = np.clip(np.ceil(np.log2(descale)), -127, 127) + 127  # what cvt.rp.satfinite.ue8m0 computes
    assert (q.scales[:, 0] < exact).any() and (q.scales[:, 0] <= exact).all()


# -- gfloat: the OCP spec's rule, element by element, in float64 ----------------------------------
@pytest.fixture(scope="module")
def gf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gfloat = pytest.importorskip("gfloat")
        formats = pytest.importorskip("gfloat.formats")
    return types.SimpleNamespace(gfloat=gfloat, fmt={
        "mxfp8_e4m3": formats.format_info_mxfp8_e4m3, "mxfp8_e5m2": formats.format_info_mxfp8_e5m2,
        "mxfp6_e2m3": formats.format_info_mxfp6_e2m3, "mxfp6_e3m2": formats.format_info_mxfp6_e3m2,
        "mxfp4": formats.format_info_mxfp4_e2m1, "mxint8": formats.format_info_mxint8})


def gfloat_blocks(gf, fmt, x):
    """gfloat's quantize_block (compute_scale_amax: 2^(floor(log2 amax) - emax)) on each block, float64."""
    rows = x.reshape(-1, 32).astype(np.float64)
    return np.stack([gf.gfloat.quantize_block(gf.fmt[fmt], r, gf.gfloat.compute_scale_amax) for r in rows])


@pytest.mark.parametrize("fmt", blocks.FORMATS.keys() - {"nvfp4"})
def test_mx_floor_matches_gfloat_quantize_block(gf, fmt):
    x = mixed_blocks(seed=11, n_blocks=48, specials=False)
    q = blocks.quantize(x, fmt, scale_rounding="floor")
    ref = gfloat_blocks(gf, fmt, x).reshape(x.shape)
    normal = np.repeat(q.scales > 0, 32, axis=-1)  # scale 2^-127: torchao's divisor, documented below
    assert normal.mean() > 0.9
    np.testing.assert_array_equal(q.dequantize()[normal].astype(np.float64), ref[normal])


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "mxint8"])
def test_amax_below_the_smallest_scale_is_divided_by_2_to_the_minus_126_not_127(gf, fmt):
    # the documented difference: spec and gfloat divide by the scale 2^-127; torchao (and labkit) by 2^-126
    emax = blocks.get_format(fmt).element_emax
    x = (np.clip(np.random.default_rng(3).standard_normal(32), -1.9, 1.9) * 2.0 ** (emax - 128)).astype(np.float32)
    q = blocks.quantize(x, fmt)
    assert q.scales[0] == 0
    spec = gfloat_blocks(gf, fmt, x).reshape(-1)
    halved = gfloat_blocks(gf, fmt, x / np.float32(2)).reshape(-1)  # the same scale 2^-127, elements of x / 2^-126
    assert not np.array_equal(q.dequantize(), spec)
    np.testing.assert_array_equal(q.dequantize().astype(np.float64), halved)


def test_mxint8_saturates_as_twos_complement_like_gfloat(gf):
    x = np.ones(32, np.float32)
    x[0], x[1] = np.float32(-1.999) * 8, np.float32(1.999) * 4  # -2 * 8 fits int8 (-128); +2 * 8 would not
    q = blocks.quantize(x, "mxint8")
    assert q.elements.view(np.int8)[0] == -128
    np.testing.assert_array_equal(q.dequantize().astype(np.float64), gfloat_blocks(gf, "mxint8", x).reshape(-1))


@pytest.mark.parametrize("mode", MODES)
def test_the_amax_500_example_is_what_torchao_gives(ao, mode):
    t = blocks.outlier_table(500.0, "mxfp8_e4m3", modes=[mode])
    x = np.ones((1, 32), np.float32)
    x[0, 0] = 500.0
    back = ao.MXTensor.to_mx(ao.torch.from_numpy(x), ao.elem["mxfp8_e4m3"], 32, scaling_mode=ao.Mode(mode))
    assert t.column("amax comes back as") == [f"{float(back.dequantize(ao.torch.float32)[0, 0]):.6g}"]
