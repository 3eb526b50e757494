"""The figures and the two widgets: what they draw and how they answer bad input."""

import html

import numpy as np
import pytest

from labkit import scaling
from labkit.scaling import fp8, playground, plots

ipywidgets = pytest.importorskip("ipywidgets")

from labkit.widgets import LossScaleExplorer, ScalerPlayground  # noqa: E402


def sample():
    rng = np.random.default_rng(0)
    return {"weights": (2.0 ** rng.uniform(-28, -4, 3000)).astype(np.float32),
            "activations": (2.0 ** rng.uniform(-30, -6, 3000)).astype(np.float32)}


def test_plot_traces_draws_a_line_per_trace_and_marks_skips():
    flags = scaling.overflow_pattern("..x...x...")
    traces = {n: scaling.simulate(n, flags, growth_interval=2) for n in ("torch", "seed004")}
    fig = plots.plot_traces(traces)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["torch", "seed004"]
    assert len(ax.patches) == 2  # the two overflow steps are shaded
    stacked = plots.plot_traces(traces, stacked=True)
    assert len(stacked.axes) == 2
    with pytest.raises(TypeError, match="Trace objects"):
        plots.plot_traces({"x": [1, 2]})
    with pytest.raises(ValueError, match="do not pass ax"):
        plots.plot_traces(traces, ax=ax, stacked=True)


def test_plot_traces_with_band_and_ceiling():
    t = scaling.simulate_closed_loop("torch", [0.5] * 50, growth_interval=5)
    fig = plots.plot_traces(t, ceiling=np.full(50, 65504 / 0.5), band=(2.0**4, 2.0**16))
    labels = [x.get_text() for x in fig.axes[0].get_legend().get_texts()]
    assert labels == ["scales that lose nothing", "overflow above this", "torch"]


def test_gradient_histogram_has_a_zone_bar_per_format():
    fig = plots.plot_gradient_histogram(sample(), 2.0**8, formats=("fp16", "fp8_e5m2"))
    top, bottom = fig.axes
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["fp8_e5m2", "fp16"]
    assert "S = 2**8" in top.get_title()
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["weights", "activations"]


def test_plot_fp8_has_three_panels():
    xs = [np.array([1.0, 2.0], np.float32) * k for k in (1, 2, 3)]
    delayed = fp8.delayed_scaling(xs)
    fig = plots.plot_fp8({"delayed": delayed, "current": fp8.current_scaling(xs)})
    assert len(fig.axes) == 3 and fig.axes[2].get_xlabel() == "step"
    scale_ax, sat_ax, _ = fig.axes
    np.testing.assert_array_equal(scale_ax.lines[0].get_ydata(), np.log2(delayed.scales))
    np.testing.assert_array_equal(sat_ax.lines[0].get_ydata(), 100 * delayed.saturated)
    assert delayed.saturated.max() > 0  # the delayed scale lags behind the growing tensor


def test_loss_scale_explorer_follows_the_slider_and_the_text():
    w = LossScaleExplorer(sample(), scale=1.0, formats=("fp16", "fp8_e4m3"))
    before = (w.figure.value, w.table.value)
    assert "fp8_e4m3" in w.table.value and len(w.figure.value) > 1000
    w.slider.value = 12
    assert w.scale == 2.0**12 and w.text.value == "2**12"
    assert (w.figure.value, w.table.value) != before
    w.text.value = "1000"
    assert w.scale == 1000 and w.slider.value == 10 and w.message.value == ""


def test_loss_scale_explorer_shows_bad_input_in_the_widget():
    w = LossScaleExplorer(sample())
    view = w.table.value
    w.text.value = "-5"
    assert "labkit-error" in w.message.value and "scale must be a finite number > 0" in html.unescape(w.message.value)
    assert w.table.value == view
    with pytest.raises(ValueError, match="empty"):
        LossScaleExplorer([])


def test_playground_runs_rebuilds_options_and_reports_errors():
    p = ScalerPlayground("torch", pattern="..x..x", growth_interval=2)
    assert p.trace.preset == "torch" and p.options["growth_interval"].value == "2"
    assert "labkit-playground-summary" in p.summary.value
    p.preset.value = "deepspeed"
    assert set(p.options) == set(scaling.PRESETS["deepspeed"].defaults)
    assert isinstance(p.options["consecutive_hysteresis"], ipywidgets.Checkbox)
    good = p.trace
    p.options["loss_scale_window"].value = "0"
    assert "loss_scale_window must be an integer >= 1" in html.unescape(p.message.value) and p.trace is good
    p.options["loss_scale_window"].value = "2"
    p.pattern.value = "burst 40 start=5 length=30"
    assert p.message.value == "" and p.trace.stopped_at is not None
    assert "training stopped at step" in p.summary.value
    p.pattern.value = "??"
    assert "cannot read the pattern" in p.message.value
    p.pattern.value = "xxx.."
    p.preset.value = "optax"
    assert "optax has no default" in p.message.value
    p.options["max_consecutive_errors"].value = "1"
    assert p.message.value == "" and p.trace.preset == "optax"


def test_playground_parsing():
    assert playground.parse_option("apex", "min_loss_scale", "None") is None
    assert playground.parse_option("apex", "min_loss_scale", "0.5") == 0.5
    assert playground.parse_option("optax", "max_consecutive_errors", "3") == 3
    assert playground.parse_option("deepspeed", "init_scale", "2^16") == 2**16
    assert playground.parse_option("deepspeed", "consecutive_hysteresis", "true") is True
    assert playground.format_default(65536.0) == "2**16" and playground.format_default(2000) == "2000"
    assert playground.parse_pattern("every 6 k=3").tolist() == [False, False, True] * 2
    assert playground.parse_pattern("none 3").tolist() == [False] * 3
    assert playground.parse_pattern(". . x").tolist() == [False, False, True]
    for bad, message in [("random", "number of steps"), ("every 5 q=2", "every takes k="),
                         ("burst 5 start=a", "start must be a whole number"), ("none 200000", "at most 100000")]:
        with pytest.raises(ValueError, match=message):
            playground.parse_pattern(bad)
    with pytest.raises(ValueError, match="True or False"):
        playground.parse_option("static", "skip_nonfinite", "maybe")
    with pytest.raises(ValueError, match="type a number"):
        playground.parse_option("torch", "init_scale", "lots")


def test_widgets_have_short_stable_reprs():
    assert repr(LossScaleExplorer(sample(), scale=2.0**10, formats=("fp16",))) == \
        "LossScaleExplorer(scale=2**10, formats=['fp16'])"
    assert repr(ScalerPlayground("jmp", pattern="x.")) == "ScalerPlayground(preset='jmp', pattern='x.')"
