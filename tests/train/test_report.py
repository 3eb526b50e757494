"""labkit.train.report: the table and figure every notebook uses to compare runs."""

import math

import matplotlib.pyplot as plt
import pytest

from labkit.train import RunConfig, RunResult, run
from labkit.train.report import loss_gap, plot_runs, run_table


def by_hand(precision, losses, skipped=None, framework="jax"):
    """A RunResult filled in by hand: the table and the plot only read its fields."""
    return RunResult(RunConfig(framework, precision, steps=len(losses), progress=False), losses=list(losses),
                     step_times=[1.5] + [0.002] * (len(losses) - 1), grad_norms=[1.0] * len(losses),
                     skipped=skipped or [False] * len(losses), status="ok",
                     metric={"name": "accuracy", "value": 0.9},
                     memory={"parameter_bytes": 4096, "optimizer_state_bytes": 8192})


def two_runs():
    return [by_hand("fp32", [2.3, 1.0, 0.05]), by_hand("fp16", [2.3, 2.3, 0.06], [False, True, False])]


def test_table_has_a_row_per_run_with_the_median_step_time():
    t = run_table(two_runs())
    assert t.column("run") == ["fp32", "fp16"] and t.column("skipped") == ["0", "1"]
    assert t.column("median step ms") == ["2.00", "2.00"]  # the 1.5 s first step is left out
    assert t.column("samples/s") == ["32000", "32000"] and t.column("params KiB") == ["4", "4"]
    assert t.column("state B/param") == ["-", "-"]  # no gradient bytes reported
    assert run_table(two_runs(), labels=["a", "b"]).column("run") == ["a", "b"]
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        run_table(two_runs(), labels=["a"])


def test_table_and_plot_can_show_each_runs_best_step_instead():
    fast = by_hand("bf16", [2.3, 1.0, 0.05])
    fast.step_times = [1.5, 0.004, 0.001]
    t = run_table([fast], step_time="best")
    assert "median step ms" not in t.columns and t.column("best step ms") == ["1.00"]
    assert t.column("samples/s") == ["64000"] and run_table([fast]).column("median step ms") == ["2.50"]
    fig = plot_runs([fast], step_time="best")
    assert [p.get_width() for p in fig.axes[1].patches] == pytest.approx([1.0])
    assert fig.axes[1].get_xlabel() == "best step time (ms)"
    with pytest.raises(ValueError, match="step_time 'min'; choose one of 'median', 'best'"):
        run_table([fast], step_time="min")


def test_table_counts_model_state_bytes_per_parameter_from_real_runs():
    cfg = RunConfig("torch", width=16, batch_size=8, steps=2, progress=False)
    t = run_table([run(cfg.replace(precision=p)) for p in ("fp32", "bf16", "bf16-pure")])
    per_param = [float(v) for v in t.column("state B/param")]
    # Adam: 4 + 4 + 8 bytes in fp32 and under autocast, 2 + 2 + 4 in pure bf16 (plus a few
    # bytes of step counters, which round away here).
    assert per_param[0] == pytest.approx(16, abs=0.1) and per_param[1] == per_param[0]
    assert per_param[2] == pytest.approx(8, abs=0.1)


def test_plot_overlays_losses_marks_skips_and_bars_step_times():
    fig = plot_runs(two_runs(), title="t")
    ax_loss, ax_time = fig.axes
    curves = [line for line in ax_loss.get_lines() if line.get_marker() != "x"]
    assert [c.get_label() for c in curves] == ["fp32", "fp16"]
    assert [c.get_linestyle() for c in curves] == ["-", "--"]
    marks = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax_loss.get_lines()
             if line.get_marker() == "x" and len(line.get_xdata())]
    assert marks == [([1], [2.3])]
    assert ax_loss.get_yscale() == "log" and ax_loss.get_title() == "t"
    assert [p.get_width() for p in ax_time.patches] == pytest.approx([2.0, 2.0])
    assert not plt.fignum_exists(fig.number)  # closed: a notebook shows it once, as the value


def test_plot_smooths_and_labels_runs_that_did_not_finish():
    r = by_hand("fp16", [4.0, 3.0, 2.0, 1.0])
    r.status = "diverged"
    fig = plot_runs([r], smooth=2)
    (curve,) = [line for line in fig.axes[0].get_lines() if line.get_marker() != "x"]
    assert list(curve.get_ydata()) == [3.5, 2.5, 1.5] and curve.get_label() == "fp16 (diverged)"
    assert "2-step mean" in fig.axes[0].get_ylabel()


def test_plot_needs_a_run():
    with pytest.raises(ValueError, match="at least one"):
        plot_runs([])
    assert math.isnan(RunResult(RunConfig("tf")).median_step_time())


def test_loss_gap_is_the_largest_step_by_step_difference():
    a, b = by_hand("fp32", [2.3, 1.0, 0.05]), by_hand("bf16", [2.3, 1.02, 0.06])
    assert loss_gap(a, b) == pytest.approx(0.02) and loss_gap(a, a) == 0.0
    with pytest.raises(ValueError, match="same steps"):
        loss_gap(a, by_hand("bf16", [2.3]))
    with pytest.raises(TypeError, match="two RunResults"):
        loss_gap(a, [2.3, 1.0, 0.05])


def test_a_run_gives_its_median_or_best_step_time_by_name_for_the_tables_and_the_claims():
    r = RunResult(RunConfig("torch", steps=4), losses=[2.0] * 4, step_times=[9.0, 0.003, 0.001, 0.002], status="ok")
    assert (r.step_time(), r.step_time("median"), r.step_time("best")) == (0.002, 0.002, 0.001)
    assert r.step_time("best", skip_first=0) == 0.001 and r.step_time(skip_first=0) == 0.0025
    with pytest.raises(ValueError, match="unknown kind 'mean'; choose one of 'median', 'best'"):
        r.step_time("mean")
    assert run_table([r], step_time="best").column("best step ms") == ["1.00"]
    with pytest.raises(ValueError, match="unknown step_time 'mean'"):
        run_table([r], step_time="mean")
