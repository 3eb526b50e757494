"""The two overflow modes of a conversion: non-saturating (ml_dtypes' astype) and saturating
(FP8 recipes: clamp to +-max, then cast), checked against ml_dtypes and against torch."""

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from test_bits import library_cast as cast  # ml_dtypes' own cast, warnings silenced

SMALL = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def probes(f):
    """Every finite value of the format, the float32 values half-way to their neighbours and
    just either side, values far past max, and the infinities: where the two modes differ."""
    values = f.decode(np.arange(1 << f.bits, dtype=np.uint64).astype(f.uint_dtype))
    values = values[np.isfinite(values)]
    up = f.next_up(values)
    mids = ((values + up) / 2)[np.isfinite(up)]
    far = np.array([f.max * 1.01, f.max * 2, f.max * 1e3, np.inf], dtype=np.float64)
    with np.errstate(over="ignore"):  # bf16's 2 * max is past float32's: inf, a probe too
        x = np.concatenate([values, mids, far]).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name", SMALL)
def test_non_saturating_is_ml_dtypes_astype_bit_for_bit(name):
    f = lf.get(name)
    x = probes(f)
    expected = cast(x, f.dtype).view(f.uint_dtype)
    np.testing.assert_array_equal(f.encode(x), expected)
    np.testing.assert_array_equal(f.encode(x, saturate=False), expected)


@pytest.mark.parametrize("name", SMALL)
def test_saturating_is_clamp_to_max_then_astype_bit_for_bit(name):
    # torchao's to_fp8_saturated: x.clamp(-finfo.max, finfo.max).to(dtype)
    f = lf.get(name)
    x = probes(f)
    clamped = np.clip(x, np.float32(-f.max), np.float32(f.max))
    np.testing.assert_array_equal(f.encode(x, saturate=True), cast(clamped, f.dtype).view(f.uint_dtype))


@pytest.mark.parametrize("name", list(lf.FORMATS))
def test_saturating_keeps_nan_and_sends_overflow_and_infinity_to_max(name):
    f = lf.get(name)
    got = f.round([np.nan, np.inf, -np.inf, f.max * 4, -f.max * 4, f.max, 1.0], saturate=True)
    np.testing.assert_array_equal(got, [np.nan, f.max, -f.max, f.max, -f.max, f.max, 1.0])
    assert np.isnan(f.round(f.max * 4)) or np.isinf(f.round(f.max * 4))  # the default does not saturate


def test_e4m3_500_is_nan_without_saturation_and_448_with_it():
    e4m3 = lf.get("fp8_e4m3")
    assert np.isnan(e4m3.round(500.0)) and e4m3.round(500.0, saturate=True) == 448.0
    assert e4m3.round(464.0) == 448.0  # the tie below 480 rounds to even, 448, in both modes


def test_saturate_must_be_a_bool():
    f = lf.get("fp8_e4m3")
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="saturate must be True"):
            f.encode(1.0, saturate=bad)
        with pytest.raises(TypeError, match="saturate must be True"):
            f.round(1.0, saturate=bad)


# -- against torch ---------------------------------------------------------------------
torch = pytest.importorskip("torch")
TORCH_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}


def torch_bits(x, name, clamp=None):
    t = torch.from_numpy(np.asarray(x, np.float32))
    if clamp is not None:
        t = t.clamp(-clamp, clamp)
    out = t.to(getattr(torch, TORCH_DTYPES[name]))
    return out.view(torch.uint8 if out.element_size() == 1 else torch.int16).numpy().view(lf.get(name).uint_dtype)


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_saturating_is_torchaos_clamp_then_cast(name):
    f = lf.get(name)
    x = probes(f)
    np.testing.assert_array_equal(f.encode(x, saturate=True), torch_bits(x, name, clamp=f.max))


def _torch_version():
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.skipif(_torch_version() < (2, 12), reason="torch's eager e4m3fn cast saturates from 2.12 (pytorch#178817)")
def test_torchs_eager_e4m3fn_cast_saturates_and_its_e5m2_cast_does_not():
    e4m3, e5m2 = lf.get("fp8_e4m3"), lf.get("fp8_e5m2")
    x = probes(e4m3)
    np.testing.assert_array_equal(torch_bits(x, "fp8_e4m3"), e4m3.encode(x, saturate=True))
    x = probes(e5m2)
    np.testing.assert_array_equal(torch_bits(x, "fp8_e5m2"), e5m2.encode(x, saturate=False))
