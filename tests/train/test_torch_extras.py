"""The notebook 04 demonstrations, run on real torch."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from labkit import scaling
from labkit.train import RunConfig, run
from labkit.train.torch.lessons import (
    SafeLayerNorm,
    autocast_dtypes,
    dtypes_of,
    compare_layer_norms,
    missing_bias_error,
    naive_layer_norm,
    stalled_updates,
    unbiased_variance_error,
)
from labkit.train.torch.seeds import SeedSafeLayerNorm


# -- autocast's op lists ----------------------------------------------------------------
@pytest.mark.parametrize("dtype, name", [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")])
def test_autocast_lowers_matmuls_and_keeps_losses_in_fp32_on_the_cpu(dtype, name):
    got = autocast_dtypes("cpu", dtype)
    assert got["linear"] == got["matmul"] == (name, name)  # the lower-precision list
    for loss in ("cross_entropy", "nll_loss", "mse_loss"):  # the fp32 list
        assert got[loss] == ("float32", "float32")
    # on the CPU, softmax and layer_norm are on neither list: they follow their input
    # (on CUDA they are on the fp32 list and would give float32 here)
    for op in ("softmax", "log_softmax", "layer_norm", "sum", "mean", "exp", "relu"):
        assert got[op] == ("float32", name)


def test_dtypes_of_is_autocast_dtypes_as_a_table_named_by_op():
    table = dtypes_of("cpu", torch.bfloat16)
    assert table.columns == ("name", "from float32", "from bfloat16")
    assert {row[0]: row[1:] for row in table.rows} == autocast_dtypes("cpu", torch.bfloat16)


def test_autocast_dtypes_leaves_autocast_and_the_rng_as_they_were():
    rng = torch.get_rng_state()
    autocast_dtypes()
    assert torch.equal(torch.get_rng_state(), rng) and not torch.is_autocast_enabled("cpu")


def test_autocast_dtypes_refuses_what_autocast_does_not_do():
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        autocast_dtypes("cpu", torch.float64)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            autocast_dtypes("cuda")


# -- pure bf16 rounds small updates away ------------------------------------------------
def test_pure_bf16_never_moves_while_fp32_master_weights_accumulate():
    r = stalled_updates(steps=40, weight=1.0, update=1e-3)
    assert set(r.weights) == {"fp32", "bf16 autocast", "bf16-pure"}
    assert np.all(r.weights["bf16-pure"] == 1.0)  # every update rounded away
    np.testing.assert_allclose(r.weights["fp32"], 1.0 - 1e-3 * np.arange(41), atol=1e-6)
    # autocast computes the gradient in bf16 (within 2**-8 of 1e-3) and adds it to the fp32 weight
    steps = -np.diff(r.weights["bf16 autocast"])
    assert np.all(np.abs(steps - 1e-3) <= 1e-3 * 2.0**-8)
    assert r.bf16_spacing == 2.0**-8 and r.update < r.bf16_spacing / 2


def test_pure_bf16_moves_once_the_update_exceeds_half_the_spacing():
    r = stalled_updates(steps=3, weight=1.0, update=3e-3)  # > 2**-9 = 0.00195: rounds to 1 - 2**-8
    assert r.weights["bf16-pure"].tolist() == [1.0, 1 - 2**-8, 1 - 2 * 2**-8, 1 - 3 * 2**-8]


@pytest.mark.parametrize("bad", [dict(steps=0), dict(steps=2.5), dict(update=math.nan), dict(weight="1")])
def test_stalled_updates_refuses_bad_arguments(bad):
    with pytest.raises(ValueError):
        stalled_updates(**bad)


# -- LayerNorm --------------------------------------------------------------------------
def test_safe_layer_norm_equals_nn_layer_norm_and_keeps_the_input_dtype():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    ours, ref = SafeLayerNorm(32), nn.LayerNorm(32)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
        ours.bias.normal_(generator=torch.Generator().manual_seed(2))
        ref.load_state_dict(ours.state_dict())
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
        assert ours(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_the_seeds_safe_layer_norm_uses_the_unbiased_variance():
    n = 16
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        seed = SeedSafeLayerNorm(n).double()(x)
        right = nn.LayerNorm(n, dtype=torch.float64)(x)
    # it divides by sqrt(n/(n-1)) too much (eps aside)
    torch.testing.assert_close(seed, right * math.sqrt((n - 1) / n), rtol=1e-4, atol=1e-6)
    assert not hasattr(SeedSafeLayerNorm(n), "bias")


def test_a_hand_written_fp16_layer_norm_overflows_where_torchs_does_not():
    errors = compare_layer_norms(torch.float16, scale=300.0)
    assert math.isnan(errors["naive, in float16"]) or math.isinf(errors["naive, in float16"])
    assert errors["nn.LayerNorm, in float16"] < 2e-3  # its kernel accumulates in fp32
    assert errors["SafeLayerNorm"] == errors["nn.LayerNorm, in float16"]
    assert 0.01 < errors["seed's SafeLayerNorm"] < 0.05  # the unbiased-variance bug, not rounding
    assert compare_layer_norms(torch.float32)["seed's SafeLayerNorm"] > 0.01  # even in fp32


def test_the_unbiased_variance_costs_about_one_over_2n_relative_at_every_width():
    errors = unbiased_variance_error((16, 64, 4096))
    for n, e in errors.items():
        assert e["predicted"] == 1 - math.sqrt((n - 1) / n)
        assert abs(e["measured"] / e["predicted"] - 1) < 0.01  # float32 rounding and eps aside
        assert abs(e["approx"] / e["predicted"] - 1) < 1 / n  # 1/(2n) is the first-order term
    assert round(errors[64]["measured"], 4) == 0.0078 and errors[4096]["measured"] < 1.3e-4
    # the ~2% once quoted is an absolute error on normalised values of size ~3, not a relative one
    assert 0.015 < errors[64]["max_abs"] < 0.035


def test_the_missing_bias_is_an_error_of_the_bias_itself_at_every_width():
    for width in (64, 4096):
        r = missing_bias_error(0.1, width)
        assert 'Unexpected key(s) in state_dict: "bias"' in r["strict_error"]
        assert r["max_abs"] >= 0.1 > 0.05 > r["variance_max_abs"]


@pytest.mark.parametrize("call", [lambda: unbiased_variance_error([1]), lambda: unbiased_variance_error("64"),
                                  lambda: unbiased_variance_error([]), lambda: unbiased_variance_error(rows=0),
                                  lambda: missing_bias_error(math.inf), lambda: missing_bias_error(width=1.5)])
def test_the_layer_norm_error_functions_refuse_bad_arguments(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def test_naive_layer_norm_is_right_in_fp32():
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(naive_layer_norm(x), nn.functional.layer_norm(x, (8,)), rtol=1e-4, atol=1e-4)


# -- GradScaler agrees with labkit.scaling's torch preset --------------------------------
def test_a_real_gradscaler_run_matches_the_torch_scaling_preset():
    cfg = RunConfig("torch", "fp16", width=16, batch_size=8, steps=12, init_scale=2.0**12,
                    inject_overflow=(1, 2, 7), progress=False)
    res = run(cfg)
    trace = scaling.simulate("torch", overflows=res.skipped, init_scale=2.0**12)
    assert res.scales == trace.scales.tolist()
    assert [not s for s in res.skipped] == trace.applied.tolist()
