"""Real 2-process DDP / FSDP2 runs under torchrun (gloo on 127.0.0.1), tiny MLP, a few steps.

Each distributed run is launched once per module (a fixture) and checked by several tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch")

from labkit.train.torch import distributed as torch_dist
from labkit.train import RunConfig, RunFailed, run

BASE = {"framework": "torch", "model": "mlp", "width": 32, "batch_size": 32, "steps": 4, "progress": False}
BF16_TOL = 2e-2  # relative: a few bf16 ulps (2**-8) of the loss


@pytest.fixture(scope="module")
def single_bf16():
    return run(RunConfig(precision="bf16", **BASE))


@pytest.fixture(scope="module")
def dp_bf16_reduce():
    return run(RunConfig(precision="bf16", devices=2, parallel="dp", reduce_dtype="bf16", **BASE))


@pytest.fixture(scope="module")
def fsdp_fp32_reduce():
    return run(RunConfig(precision="bf16", devices=2, parallel="fsdp", reduce_dtype="fp32", **BASE))


@pytest.fixture(scope="module", params=["dp", "fsdp"])
def fp16_overflow_on_one_rank(request):
    return run(RunConfig(precision="fp16", devices=2, parallel=request.param, inject_overflow=(1,), **BASE))


# -- sharded runs match the single-device run ------------------------------------------------
@pytest.mark.parametrize("which", ["dp_bf16_reduce", "fsdp_fp32_reduce"])
def test_two_process_run_matches_single_device_within_bf16_tolerance(which, single_bf16, request):
    res = request.getfixturevalue(which)
    assert res.status == "ok" and len(res.losses) == BASE["steps"]
    np.testing.assert_allclose(res.losses, single_bf16.losses, rtol=BF16_TOL)
    assert res.losses[-1] < res.losses[0]  # it trained
    assert res.extra["world_size"] == 2 and "gloo" in res.device


# -- the reduction happens in the dtype asked for, and its bytes are the real sizes ------------
def test_ddp_bf16_compress_hook_all_reduces_every_gradient_once_in_bf16(dp_bf16_reduce):
    extra = dp_bf16_reduce.extra
    assert extra["reduce_dtype"] == "bf16"
    assert [(c["op"], c["dtype"]) for c in extra["collectives"]] == [("allreduce", "bf16")]
    assert extra["comm_bytes_per_step"] == torch_dist.reduction_bytes("mlp", "bf16", width=32)
    # the weights stay fp32 on every rank (autocast computes in bf16 from them)
    assert {p["dtype"] for p in extra["sharding"]} == {"fp32"}
    assert all(p["local_shape"] == [p["shape"], p["shape"]] for p in extra["sharding"])
    assert set(extra["compute_dtypes"].values()) == {"bf16"}


def test_fsdp2_shards_fp32_weights_gathers_bf16_and_reduce_scatters_fp32(fsdp_fp32_reduce):
    extra = fsdp_fp32_reduce.extra
    assert extra["reduce_dtype"] == "fp32"
    for p in extra["sharding"]:  # each rank holds half of dim 0 of every fp32 weight
        assert p["dtype"] == "fp32"
        assert [s[0] for s in p["local_shape"]] == [p["shape"][0] // 2] * 2
    assert set(extra["compute_dtypes"].values()) == {"bf16"}
    gathers = [c for c in extra["collectives"] if c["op"].startswith("allgather")]
    scatters = [c for c in extra["collectives"] if c["op"].startswith("reduce_scatter")]
    assert {c["dtype"] for c in gathers} == {"bf16"} and {c["dtype"] for c in scatters} == {"fp32"}
    assert sum(c["bytes"] for c in scatters) == torch_dist.reduction_bytes("mlp", "fp32", width=32)
    assert extra["comm_bytes_per_step"] == sum(c["bytes"] for c in extra["collectives"])
    # sharded: each rank holds half the parameter bytes of a DDP rank
    assert fsdp_fp32_reduce.memory["parameter_bytes"] * 2 == torch_dist.reduction_bytes("mlp", "fp32", width=32)
    assert "dense1.weight" in torch_dist.sharding_table(fsdp_fp32_reduce).column("parameter")
    assert "reduce_scatter_base" in torch_dist.collectives_table(fsdp_fp32_reduce).column("collective")


def test_fsdp2_default_reduces_in_param_dtype_and_reshards_the_root_after_evaluation():
    config = RunConfig(**{**BASE, "model": "transformer", "batch_size": 16, "steps": 3, "precision": "bf16"})
    single = run(config)
    res = run(config.replace(devices=2, parallel="fsdp"))
    np.testing.assert_allclose(res.losses, single.losses, rtol=BF16_TOL)
    assert res.extra["reduce_dtype"] == "bf16"  # MixedPrecisionPolicy(reduce_dtype=None): param_dtype
    # the root's own parameters (embeddings, final LayerNorm, head) are fp32 shards too
    for p in res.extra["sharding"]:
        assert p["dtype"] == "fp32" and sum(s[0] for s in p["local_shape"]) == p["shape"][0], p


def test_fsdp2_gathers_the_parameters_in_param_dtype(fsdp_fp32_reduce):
    """FSDP2 casts each fp32 shard to param_dtype *before* the all-gather (``_fsdp_param.py``,
    ``all_gather_inputs``): it gathers bf16, 2 bytes per element."""
    from labkit.train import report

    g = report.gathered(fsdp_fp32_reduce)
    assert g["dtype"] == "bf16" and g["bytes"] == 2 * g["elements"]
    n = 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    assert g["elements"] % n == 0  # whole layers, each gathered for forward (and again for backward)


def test_ddp_refuses_the_stock_bf16_hook_exactly_where_its_rule_says_and_takes_labkits_copy():
    import torch.distributed as dist

    seen = torch_dist.ddp_bf16_hooks()
    assert seen["labkit"] == "accepted"
    if torch_dist.stock_bf16_hook_allowed():
        assert seen["stock"] == "accepted"
    else:
        assert seen["stock"].startswith("refused: TypeError: BF16 all reduce communication hook required")
    assert seen["build"].startswith("torch ")
    assert not dist.is_initialized()  # its one-rank group is torn down


# -- fp16: one rank overflows, every rank skips ---------------------------------------------------
def test_overflow_on_one_rank_skips_the_step_on_every_rank(fp16_overflow_on_one_rank):
    res = fp16_overflow_on_one_rank
    extra = res.extra
    assert extra["overflow_rank"] == 1
    assert extra["skipped_by_rank"] == [[False, True, False, False]] * 2
    assert res.skipped == [False, True, False, False]
    assert res.scales[2] == res.scales[1] / 2  # backed off once, on every rank
    assert math.isinf(res.grad_norms[1]) and all(math.isfinite(g) for g in res.grad_norms[2:])
    finite = extra["local_grads_finite_by_rank"]
    assert finite[1][1] is False
    if res.config.parallel == "dp":  # the all-reduce carried rank 1's inf to rank 0
        assert finite[0][1] is False
    else:  # rank 0's shard stayed finite: ShardedGradScaler's all-reduced found_inf made it skip
        assert finite[0][1] is True
    assert "SKIP" in str(torch_dist.skip_table(res))


# -- errors ---------------------------------------------------------------------------------------
def test_a_failing_worker_raises_with_its_stderr(tmp_path):
    config = RunConfig(precision="fp32", devices=2, **BASE)
    spec = {"config": {**config.to_dict(), "no_such_field": 1}, "out": str(tmp_path / "run.jsonl")}
    with pytest.raises(RunFailed, match="no_such_field") as info:
        torch_dist._launch(spec, config, str(tmp_path), timeout_s=120)
    assert info.value.result.status == "failed" and info.value.result.steps_done == 0


@pytest.mark.parametrize("changes, message", [
    ({"device": "tpu"}, "not on a TPU"),
    ({"device": "cuda"}, "needs 2 GPUs"),
    ({"precision": "bf16-pure", "reduce_dtype": "fp32"}, "bf16-pure"),
    ({"devices": 1}, "devices >= 2"),
])
def test_configs_that_cannot_run_are_refused_before_any_launch(changes, message):
    config = RunConfig(**{**BASE, "precision": "fp32", "devices": 2, **changes})
    if changes.get("device") == "cuda":
        import torch

        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine has 2 GPUs")
    with pytest.raises(ValueError, match=message):
        torch_dist.check(config)


def test_reduction_bytes_counts_every_parameter_once_in_the_reduce_dtype():
    n = 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    assert torch_dist.reduction_bytes("mlp", "fp32", width=32) == 4 * n
    assert torch_dist.reduction_bytes("mlp", "bf16", width=32) == 2 * n
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        torch_dist.reduction_bytes("mlp", "int8")
