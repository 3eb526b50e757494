"""Loss scaling that matters in a real run (labkit.train.torch.underflow), on real torch.

One run of the four at the notebook's defaults is shared by the tests (a few seconds); everything
else is either built from it or tiny.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from labkit.train.torch.underflow import (
    FP16_FLUSH, RUNS, UnderflowRun, UnderflowRuns, deep_mlp, plot_underflow_runs, underflow_checks, underflow_runs,
)


def _torch_state():
    return (torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.is_autocast_enabled("cpu"),
            torch.get_rng_state())


@pytest.fixture(scope="module")
def result():
    before = _torch_state()
    r = underflow_runs()  # the notebook's call
    after = _torch_state()
    assert before[:3] == after[:3] and torch.equal(before[3], after[3]), "underflow_runs leaked global state"
    return r


def test_the_four_runs_share_their_start_and_record_every_step(result):
    assert list(result.runs) == list(RUNS)
    first = {name: run.losses[0] for name, run in result.runs.items()}
    for run in result.runs.values():
        assert len(run.losses) == len(run.flushed) == len(run.below_fp16) == len(run.scales) == result.steps
    # the same weights and the same first batch: the first losses differ by the forward's rounding only
    assert first["fp16"] == first["fp16-scaler"]
    assert all(abs(v - first["fp32"]) < 0.01 for v in first.values()), first


def test_under_fp16_autocast_the_activation_gradients_are_fp16_and_the_weight_gradients_fp32(result):
    assert {n: r.grad_dtype for n, r in result.runs.items()} == {
        "fp32": "float32", "fp16": "float16", "fp16-scaler": "float16", "bf16": "bfloat16"}
    net = deep_mlp(depth=2, width=8)
    with torch.amp.autocast("cpu", dtype=torch.float16):
        out = net(torch.ones(4, 64))
    out.float().sum().backward()
    assert out.dtype == torch.float16 and net[0].weight.grad.dtype == torch.float32


def test_without_a_scaler_fp16_flushes_a_large_share_of_the_gradients_and_with_one_almost_none(result):
    r = result.runs
    assert r["fp16"].flushed.mean() > 0.25 and r["fp16"].flushed[0] > 0.2, r["fp16"].flushed[:5]
    assert r["fp16-scaler"].flushed.max() < 0.01
    assert r["fp32"].flushed.max() < 0.001 and r["bf16"].flushed.max() < 0.01
    # an fp16 value of at most 2**-25 is 0: in the unscaled fp16 run the two shares are one
    np.testing.assert_array_equal(r["fp16"].flushed, r["fp16"].below_fp16)
    # the gradients really are that small: in fp32, from the same first weights and batch, a large share is
    # at most 2**-25 -- and with the scaler the unscaled values are as small, yet not flushed
    assert r["fp32"].below_fp16[0] > 0.2 and r["fp16-scaler"].below_fp16[0] > 0.2
    assert r["fp16"].flushed[0] >= r["fp32"].below_fp16[0] - 0.05


def test_gradscaler_runs_at_its_default_scale_and_the_others_at_one(result):
    init = torch.amp.GradScaler("cpu").get_scale()  # torch's own default, 2**16
    scales = result.runs["fp16-scaler"].scales
    assert scales[0] == init == 2.0**16 and set(scales) <= {init, init / 2, init / 4}
    for name in ("fp32", "fp16", "bf16"):
        assert set(result.runs[name].scales) == {1.0}


def test_without_a_scaler_fp16_stalls_while_gradscaler_and_bf16_track_fp32(result):
    loss = {n: r.final_loss for n, r in result.runs.items()}
    assert loss["fp32"] < 0.9 * math.log(10)  # fp32 learned something
    assert loss["fp16"] / loss["fp32"] > 1.1
    assert abs(loss["fp16"] - math.log(10)) < 0.05  # it learns only the class frequencies: ln 10 on ten near-even classes
    assert loss["fp16-scaler"] / loss["fp32"] < 1.1 and loss["bf16"] / loss["fp32"] < 1.1
    assert underflow_checks(result).all_hold, str(underflow_checks(result))


def test_the_checks_fail_where_a_claim_does_not_hold(result):
    r = dict(result.runs)
    r["fp16-scaler"] = dataclasses.replace(r["fp16-scaler"], flushed=r["fp16"].flushed, losses=r["fp16"].losses)
    lines = str(underflow_checks(dataclasses.replace(result, runs=r))).splitlines()
    assert lines[2].startswith("✗ expected: with GradScaler, at most 1% of them are flushed; saw: ")
    assert lines[5].startswith("✗ expected: with GradScaler, fp16 ends at most 1.1x fp32's loss; saw: ")
    assert sum(line.startswith("✓") for line in lines) == 6


def test_the_ln10_check_fails_where_fp16_without_a_scaler_learns():
    mk = lambda name, loss: UnderflowRun(name, np.array([2.3, loss]), np.zeros(2), np.full(2, 0.45),  # noqa: E731
                                         np.ones(2), "float32")
    runs = {name: mk(name, 1.8) for name in RUNS}
    runs["fp16"] = mk("fp16", 2.1)  # still 1.17x fp32's loss, but it has learned more than the class frequencies
    lines = str(underflow_checks(UnderflowRuns(runs, 2, 16, 64, 512, 1e-3, 0))).splitlines()
    assert lines[4].startswith("✓ fp16 without a scaler ends at least 1.1x above fp32's loss")
    assert lines[7] == ("✗ expected: fp16 without a scaler ends within 0.05 of ln 10 = 2.303, the loss of knowing "
                        "only how frequent each class is; saw: 2.100")


def test_the_table_and_the_plot_show_the_four_runs(result):
    table = result.table()
    assert [row[0] for row in table.rows] == list(RUNS.values())
    assert table.rows[2][-1] == f"2^{math.log2(result.runs['fp16-scaler'].scales[-1]):g}"
    fig = plot_underflow_runs(result)
    left, right = fig.axes
    assert len(left.lines) == 4 and len(right.lines) == 5


def test_deep_mlp_draws_nn_linears_default_init_without_torchs_generator():
    rng = torch.get_rng_state()
    net = deep_mlp(depth=2, width=512, seed=1)
    assert torch.equal(torch.get_rng_state(), rng)
    w = net[2].weight.detach().double()
    bound = 1 / math.sqrt(512)
    assert w.abs().max() <= bound and abs(float(w.std()) / (bound / math.sqrt(3)) - 1) < 0.01
    reference = torch.nn.Linear(512, 512)  # torch's own init, for the spread only
    assert abs(float(reference.weight.detach().std()) / float(w.std()) - 1) < 0.01
    torch.set_rng_state(rng)
    assert torch.equal(deep_mlp(depth=2, width=512, seed=1)[2].weight, net[2].weight)
    assert [type(m).__name__ for m in deep_mlp(depth=2, width=4)] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]


def test_fp16_flush_is_where_torch_rounds_to_zero():
    assert torch.tensor(FP16_FLUSH).half().item() == 0.0
    assert torch.tensor(FP16_FLUSH * (1 + 2**-10)).half().item() == 2.0**-24  # just above the tie: up, to 2**-24


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(steps=0), ValueError, "steps must be an integer from 1"),
    (dict(steps=2.5), TypeError, "steps must be an integer"),
    (dict(depth=0), ValueError, "depth must be an integer from 1"),
    (dict(width=True), TypeError, "width must be an integer"),
    (dict(batch_size=10**6), ValueError, "batch_size must be an integer from 1 to 4096"),
    (dict(lr=0.0), ValueError, "lr must be a finite number > 0"),
    (dict(lr=math.nan), ValueError, "lr must be a finite number"),
    (dict(lr="1e-3"), TypeError, "lr must be a number"),
    (dict(seed=-1), ValueError, "seed must be an integer"),
])
def test_underflow_runs_refuses_bad_input_before_any_work(kwargs, error, match):
    with pytest.raises(error, match=match):
        underflow_runs(**kwargs)


def test_the_checks_and_the_plot_refuse_what_is_not_a_result(result):
    for bad in (None, "x", {"fp16": 1}):
        with pytest.raises(TypeError, match="underflow_runs"):
            underflow_checks(bad)
        with pytest.raises(TypeError, match="underflow_runs"):
            plot_underflow_runs(bad)
    partial = dataclasses.replace(result, runs={k: v for k, v in result.runs.items() if k != "bf16"})
    with pytest.raises(ValueError, match="four runs fp32, fp16, fp16-scaler, bf16"):
        underflow_checks(partial)
    with pytest.raises(ValueError, match="dpi must be an integer"):
        plot_underflow_runs(result, dpi=0)
    assert isinstance(result.runs["fp16"], UnderflowRun) and isinstance(result, UnderflowRuns)
