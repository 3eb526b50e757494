"""Fractions lost / subnormal / overflowing, checked against direct ml_dtypes casts."""

import math

import numpy as np
import pytest

import labkit.formats as lf
from labkit.scaling import underflow

STORED = [name for name in underflow.DEFAULT_FORMATS]


def wide_sample(seed=0, n=20000):
    rng = np.random.default_rng(seed)
    mags = 2.0 ** rng.uniform(-40, 20, n)
    signs = rng.choice([-1.0, 1.0], n)
    vals = (mags * signs).astype(np.float32)
    vals[:500] = 0  # exact zeros are counted apart
    return vals


@pytest.mark.parametrize("name", STORED)
@pytest.mark.parametrize("scale", [1.0, 2.0**-7, 2.0**10, 3.0])
def test_fractions_match_a_direct_cast(name, scale):
    vals = wide_sample()
    fr = underflow.fractions(vals, name, scale)
    f = lf.get(name)
    nonzero = vals[vals != 0].astype(np.float64)
    with np.errstate(over="ignore"):  # numpy warns when float16 overflows; that is the point here
        cast = (np.abs(nonzero) * scale).astype(f.dtype).astype(np.float64)
    assert fr.count == nonzero.size and fr.zeros == 500
    assert fr.lost == np.mean(cast == 0)
    assert fr.overflow == np.mean(~np.isfinite(cast))
    assert fr.subnormal == np.mean((cast > 0) & (cast < f.smallest_normal))
    assert math.isclose(fr.lost + fr.subnormal + fr.normal + fr.overflow, 1.0)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e5m2"])
def test_powers_of_two_inside_the_safe_range_lose_nothing_and_outside_they_do(name):
    vals = (2.0 ** np.random.default_rng(1).uniform(-20, -2, 5000)).astype(np.float32)
    r = underflow.safe_scale_range(vals, name)
    assert not r.empty and r.pow2_lo <= r.pow2_hi
    for s in (r.pow2_lo, r.pow2_hi):
        fr = underflow.fractions(vals, name, s)
        assert fr.lost == 0 and fr.overflow == 0 and r.contains(s)
    assert underflow.fractions(vals, name, r.pow2_lo / 4).lost > 0
    assert underflow.fractions(vals, name, r.pow2_hi * 4).overflow > 0
    assert underflow.fractions(vals, name, r.lo_normal * 1.0001).subnormal == 0


def test_a_sample_wider_than_the_format_has_an_empty_range():
    r = underflow.safe_scale_range([2.0**-30, 1.0], "fp8_e4m3")
    assert r.empty and r.pow2_lo is None and r.pow2_hi is None
    assert math.isclose(r.log2_lo - r.log2_hi, (-9 + 30) - math.log2(448))


def test_tables_have_a_row_per_format():
    vals = wide_sample()
    t = underflow.fractions_table(vals, 2.0**8)
    assert t.column("format") == list(underflow.DEFAULT_FORMATS) and t.column("scale S")[0] == "2**8"
    r = underflow.safe_range_table(vals)
    assert r.column("powers of two that lose nothing")[-1] == "empty"


def test_all_zero_sample():
    fr = underflow.fractions(np.zeros(4), "fp16")
    assert fr.count == 0 and fr.zeros == 4
    with pytest.raises(ValueError, match="no nonzero gradient"):
        underflow.safe_scale_range(np.zeros(4), "fp16")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 10**400])
def test_bad_scale(bad):
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        underflow.fractions([1.0], "fp16", bad)


@pytest.mark.parametrize("bad", [True, "2**8", None])
def test_a_scale_that_is_not_a_number_is_a_type_error(bad):
    with pytest.raises(TypeError, match="scale must be a number"):
        underflow.fractions([1.0], "fp16", bad)


def test_bad_values_and_format():
    with pytest.raises(ValueError, match="empty"):
        underflow.fractions([], "fp16")
    with pytest.raises(ValueError, match="finite"):
        underflow.fractions([1.0, np.nan], "fp16")
    with pytest.raises(TypeError, match="numbers"):
        underflow.fractions(["a"], "fp16")
    with pytest.raises(ValueError, match="unknown float format"):
        underflow.fractions([1.0], "fp12")
