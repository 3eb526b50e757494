"""The two overflow modes of a conversion: non-saturating (ml_dtypes' astype) and saturating
(FP8 recipes: clamp to +-max, then cast), checked against ml_dtypes and against torch, in every
format of 8 bits or fewer; and each format's own rule (saturate=None)."""

import ml_dtypes
import numpy as np
import pytest

import labkit.formats as lf
from test_bits import library_cast as cast  # ml_dtypes' own cast, warnings silenced

SMALL = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", *lf.SUBBYTE_FORMATS]
WITH_NAN = [n for n in SMALL if lf.get(n).has_nan]  # fp4 / fp6 have no non-saturating mode


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


@pytest.mark.parametrize("name", WITH_NAN)
def test_non_saturating_is_ml_dtypes_astype_bit_for_bit(name):
    f = lf.get(name)
    x = probes(f)
    expected = cast(x, f.dtype).view(f.uint_dtype)
    np.testing.assert_array_equal(f.encode(x), expected)
    np.testing.assert_array_equal(f.encode(x, saturate=False), expected)
    np.testing.assert_array_equal(f.encode(x, saturate=None), expected)


@pytest.mark.parametrize("name", ["fp4_e2m1", "fp6_e2m3", "fp6_e3m2"])
def test_fp4_and_fp6_saturate_by_default_as_ml_dtypes_astype_does_and_have_no_other_mode(name):
    f = lf.get(name)
    x = probes(f)
    expected = cast(x, f.dtype).view(f.uint_dtype)
    np.testing.assert_array_equal(f.encode(x), expected)
    np.testing.assert_array_equal(f.encode(x, saturate=True), expected)
    assert f.round(100.0) == f.max and f.round(-np.inf) == -f.max and f.saturates
    with pytest.raises(ValueError, match=f"saturate=False: {name} has no inf and no NaN"):
        f.encode(1.0, saturate=False)
    with pytest.raises(ValueError, match="pass saturate=True or None"):
        f.round(1.0, saturate=False)


@pytest.mark.parametrize("name, past_max", [
    ("fp32", "inf"), ("tf32", "inf"), ("fp16", "inf"), ("bf16", "inf"), ("fp8_e5m2", "inf"),
    ("fp8_e4m3", "nan"), ("fp8_e4m3fnuz", "nan"), ("fp8_e5m2fnuz", "nan"), ("e8m0", "nan"),
    ("fp4_e2m1", "max"), ("fp6_e2m3", "max"), ("fp6_e3m2", "max"),
])
def test_each_format_has_its_documented_default_rule(name, past_max):
    f = lf.get(name)
    got = f.round(f.max * 4)
    assert {"inf": got == np.inf, "nan": np.isnan(got), "max": got == f.max}[past_max]
    assert f.saturates is (past_max == "max")
    assert f.round(f.max * 4, saturate=True) == f.max

@pytest.mark.parametrize("name", SMALL)
def test_saturating_is_clamp_to_max_then_astype_bit_for_bit(name):
    # torchao's to_fp8_saturated: x.clamp(-finfo.max, finfo.max).to(dtype)
    f = lf.get(name)
    x = probes(f)
    clamped = np.clip(x, np.float32(-f.max), np.float32(f.max))
    np.testing.assert_array_equal(f.encode(x, saturate=True), cast(clamped, f.dtype).view(f.uint_dtype))


@pytest.mark.parametrize("name", [n for n, f in lf.FORMATS.items() if f.has_nan and f.signed])
def test_saturating_keeps_nan_and_sends_overflow_and_infinity_to_max(name):
    f = lf.get(name)
    got = f.round([np.nan, np.inf, -np.inf, f.max * 4, -f.max * 4, f.max, 1.0], saturate=True)
    np.testing.assert_array_equal(got, [np.nan, f.max, -f.max, f.max, -f.max, f.max, 1.0])
    assert np.isnan(f.round(f.max * 4)) or np.isinf(f.round(f.max * 4))  # the default does not saturate


def test_saturating_e8m0_clamps_what_is_too_large_and_still_has_no_value_for_zero_or_negatives():
    e8m0 = lf.get("e8m0")
    got = e8m0.round([np.nan, np.inf, 2.0**200, -1.0, 0.0, -np.inf, 2.0**-200], saturate=True)
    np.testing.assert_array_equal(got, [np.nan, 2.0**127, 2.0**127, np.nan, np.nan, np.nan, 2.0**-127])
    assert np.isnan(e8m0.round(2.0**200))  # non-saturating, the default: NaN (0xFF), as ml_dtypes


def test_e4m3_500_is_nan_without_saturation_and_448_with_it():
    e4m3 = lf.get("fp8_e4m3")
    assert np.isnan(e4m3.round(500.0)) and e4m3.round(500.0, saturate=True) == 448.0
    assert e4m3.round(464.0) == 448.0  # the tie below 480 rounds to even, 448, in both modes


def test_saturate_must_be_a_bool_or_none():
    f = lf.get("fp8_e4m3")
    assert np.isnan(f.round(500.0, saturate=None))  # None: the format's own rule, non-saturating here
    for bad in ("yes", 1, "saturate"):
        with pytest.raises(TypeError, match="saturate must be True"):
            f.encode(1.0, saturate=bad)
        with pytest.raises(TypeError, match="saturate must be True"):
            f.round(1.0, saturate=bad)


# -- against torch ---------------------------------------------------------------------
torch = pytest.importorskip("torch")
TORCH_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16",
                "fp8_e4m3fnuz": "float8_e4m3fnuz", "fp8_e5m2fnuz": "float8_e5m2fnuz", "e8m0": "float8_e8m0fnu"}


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
    if not f.signed:  # torch's e8m0 cast: 0 -> 2^-127, -x -> |x|, float32 subnormals rounded its own way
        x = x[x >= np.float32(2.0**-126)]
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


def test_torchs_eager_fnuz_and_e8m0_casts_do_not_saturate():
    for name in ("fp8_e4m3fnuz", "fp8_e5m2fnuz"):
        f = lf.get(name)
        x = probes(f)
        np.testing.assert_array_equal(torch_bits(x, name), f.encode(x, saturate=False))  # NaN, 0x80
    e8m0 = lf.get("e8m0")
    x = probes(e8m0)
    x = x[x >= np.float32(2.0**-126)]
    np.testing.assert_array_equal(torch_bits(x, "e8m0"), e8m0.encode(x, saturate=False))  # NaN, 0xFF


def test_torchs_e8m0_cast_differs_from_ml_dtypes_on_zero_and_negatives():
    # torch reads the exponent bits and ignores the sign; ml_dtypes (and labkit) have no value there
    x = np.array([0.0, -1.0, -4.0], np.float32)
    assert torch_bits(x, "e8m0").tolist() == [0x00, 0x7F, 0x81]
    assert lf.get("e8m0").encode(x).tolist() == [0xFF, 0xFF, 0xFF]
