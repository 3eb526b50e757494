"""The figures and the two widgets: what they draw and how they answer bad input."""

import html
import io
import math

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
    assert shaded_runs(ax) == [(1.5, 2.5), (5.5, 6.5)]  # the two overflow steps, in one artist
    stacked = plots.plot_traces(traces, stacked=True)
    assert len(stacked.axes) == 2
    with pytest.raises(TypeError, match="Trace objects"):
        plots.plot_traces({"x": [1, 2]})
    with pytest.raises(ValueError, match="do not pass ax"):
        plots.plot_traces(traces, ax=ax, stacked=True)


def shaded_runs(ax):
    """(first, last) x of each shaded overflow run; the shading must be one artist."""
    (shading,) = [p for p in ax.patches if p.get_gid() == "overflow"]
    x = shading.get_path().vertices[:, 0].reshape(-1, 5)
    return [(float(a), float(b)) for a, b in zip(x[:, 0], x[:, 2])]


def test_overflow_runs_are_shaded_as_one_artist_and_sub_pixel_gaps_are_closed():
    t = scaling.simulate("torch", scaling.overflow_pattern("xx.x...xxx"))
    ax = plots.plot_traces(t).axes[0]
    assert shaded_runs(ax) == [(-0.5, 1.5), (2.5, 3.5), (6.5, 9.5)] and len(ax.patches) == 1
    assert ax.get_xlim()[0] < -0.5 and ax.get_xlim()[1] > 9.5  # the shading is inside the view
    assert not plots.plot_traces(scaling.simulate("torch", [False] * 5)).axes[0].patches
    # 50,000 runs (every other step) at the playground's cap: merged into a few thousand rectangles
    alternating = np.arange(100_000) % 2 == 1
    runs = shaded_runs(plots.plot_traces(scaling.simulate("torch", alternating)).axes[0])
    assert len(runs) <= 2 * plots.MAX_SPANS and runs[0][0] == 0.5 and runs[-1][1] == 99_999.5
    # a wide gap stays open however many runs there are
    alternating[40_000:60_000] = False
    runs = shaded_runs(plots.plot_traces(scaling.simulate("torch", alternating)).axes[0])
    assert (39_999.5, 60_000.5) in [(b, c) for (_, b), (c, _) in zip(runs, runs[1:])]


def test_a_long_trace_puts_its_legend_outside_the_axes():
    # matplotlib's loc="best" tests every point: seconds at 10**5 steps
    fig = plots.plot_traces(scaling.simulate("torch", np.arange(100_000) % 3 == 0))
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


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


@pytest.mark.parametrize("scale", [2.0**-1074, 2.0**1000])
def test_gradient_histogram_draws_scales_where_g_times_s_leaves_float64(scale):
    fig = plots.plot_gradient_histogram(sample(), scale, formats=("fp16",))
    top, bottom = fig.axes
    lo, hi = top.get_xlim()
    assert lo <= -30 + math.log2(scale) and -4 + math.log2(scale) <= hi  # every value is on the axis
    if scale == 2.0**-1074:
        assert "S = 2**-1074" in top.get_title()
    fig.savefig(io.BytesIO(), format="png")


@pytest.mark.parametrize("call, error, message", [
    (lambda t: plots.plot_traces({}), ValueError, "traces is empty"),
    (lambda t: plots.plot_traces(t, ceiling=[-1.0, 2.0]), ValueError, "ceiling must be a 1-D sequence of numbers > 0"),
    (lambda t: plots.plot_traces(t, ceiling=[float("nan")]), ValueError, "ceiling must be"),
    (lambda t: plots.plot_traces(t, ceiling="abc"), TypeError, "ceiling must be a sequence of numbers"),
    (lambda t: plots.plot_traces(t, ceiling=10**400), TypeError, "ceiling must be a sequence of numbers"),
    (lambda t: plots.plot_traces(t, band=(16.0, 2.0)), ValueError, "band's hi must be a finite number >= 16"),
    (lambda t: plots.plot_traces(t, band=(0, 2.0)), ValueError, "band's lo must be a finite number > 0"),
    (lambda t: plots.plot_traces(t, band=5), TypeError, "band must be a ScaleRange or a pair"),
    (lambda t: plots.plot_gradient_histogram(sample(), bins=0), ValueError, "bins must be an integer from 1 to"),
    (lambda t: plots.plot_gradient_histogram(sample(), bins=True), TypeError, "bins must be an integer"),
    (lambda t: plots.plot_gradient_histogram(sample(), formats=[]), ValueError, "at least one format"),
    (lambda t: plots.plot_gradient_histogram(sample(), xlim=[1]), TypeError, "xlim must be a pair"),
    (lambda t: plots.plot_gradient_histogram(sample(), xlim=(5, 1)), ValueError, "xlim's hi must be .* > 5"),
    (lambda t: plots.plot_gradient_histogram(sample(), xlim=(0, float("inf"))), ValueError, "xlim's hi must be"),
    (lambda t: plots.plot_fp8(None), TypeError, "traces must be a dict"),
    (lambda t: plots.plot_fp8({}), ValueError, "traces is empty"),
    (lambda t: plots.plot_fp8({"a": t}), TypeError, "'a' is Trace"),
    (lambda t: playground.summary_html(None), TypeError, "takes a Trace"),
    (lambda t: playground.run("torch", None, "x"), TypeError, "option_texts must be a dict"),
    (lambda t: playground.format_default("abc"), TypeError, "value must be a number"),
])
def test_figures_and_playground_helpers_refuse_bad_arguments_with_a_message(call, error, message):
    with pytest.raises(error, match=message):
        call(scaling.simulate("torch", [True, False]))


def test_format_default_writes_powers_of_two_exactly():
    assert playground.format_default(2**2000) == "2**2000" and playground.format_default(10**400).startswith("an")
    assert playground.format_default(2.0**-24) == "2**-24" and playground.format_default(float("inf")) == "inf"
    assert playground.format_default(1) == "1" and playground.format_default(16) == "2**4"
    assert playground.format_default(np.float32(65536)) == "2**16" and playground.format_default(-8.0) == "-8.0"


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


def test_loss_scale_explorer_draws_the_tiniest_scales():
    w = LossScaleExplorer(sample(), formats=("fp16",))
    for text, scale in (("2**-1074", 2.0**-1074), ("1e-320", 1e-320)):
        before = w.figure.value
        w.text.value = text
        assert w.message.value == "" and w.scale == scale and w.figure.value != before
        assert "lost to zero" in w.table.value and "100.00%" in w.table.value
    assert w.slider.value == -16  # as far left as it goes


def test_loss_scale_explorer_shows_a_message_about_this_input():
    w = LossScaleExplorer(sample(), formats=("fp16",))
    for text, message in [
        ("2**100000", "'2**100000' is beyond float64's range"),
        ("2**99999999999", "'2**99999999999' is beyond float64's range"),
        ("0**-1", "'0**-1': division by zero"),
        ("0^-1", "'0^-1': division by zero"),
        ("-2**2", "S = '-2**2': scale must be a finite number > 0; got -4.0"),
        ("abc", "'abc': only numbers"),
    ]:
        w.text.value = "1/0"  # an error first: the next message must replace it
        w.text.value = text
        shown = html.unescape(w.message.value)
        assert "labkit-error" in shown and message in shown and "1/0" not in shown and w.scale == 1.0, text
    w.text.value = "2**3"
    assert w.message.value == "" and w.scale == 8.0


def test_playground_number_options_show_a_message_about_this_input():
    p = ScalerPlayground("torch", pattern="x..x")
    good = p.trace
    for option in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
        for text in ("2**100000", "0**-1", "0^-1", "2**99999999999"):
            p.pattern.value = "random 10 p=abc"  # an error first, in another box
            p.pattern.value = "x..x"
            p.options[option].value = text
            shown = html.unescape(p.message.value)
            assert "labkit-error" in shown and f"{option}: {text!r}" in shown and "abc" not in shown
            assert p.trace is good
        p.options[option].value = playground.format_default(scaling.PRESETS["torch"].defaults[option])
        assert p.message.value == "" and p.trace is good  # the same inputs as drawn: nothing redrawn


def test_playground_reports_every_bad_box_at_once():
    with pytest.raises(ValueError) as e:
        playground.run("torch", {"init_scale": "abc", "growth_interval": "2**99999999999"}, "random 10 p=abc")
    assert str(e.value).count(";") >= 2
    assert all(part in str(e.value) for part in ("init_scale: 'abc'", "growth_interval: '2**99999999999'",
                                                 "pattern 'random 10 p=abc': p must be a probability from 0 to 1"))


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


def test_playground_reads_numbers_as_python_does():
    assert playground.parse_option("torch", "init_scale", "-2**2") == -4.0  # not (-2)**2
    assert playground.parse_option("torch", "growth_interval", "-2**2") == -4
    assert playground.parse_option("torch", "growth_interval", "2**11") == 2048
    assert playground.parse_option("torch", "init_scale", "2^-4") == 0.0625


@pytest.mark.parametrize("preset, name, text, error, message", [
    ("torch", "xyz", "1", ValueError, "unknown torch option 'xyz'; choose one of 'init_scale', 'growth_factor'"),
    ("torch", 3, "1", TypeError, "torch option must be one of 'init_scale'"),
    ("torch", "init_scale", "2**99999999999", ValueError, "init_scale: '2\\*\\*99999999999' is beyond float64"),
    ("torch", "init_scale", "0**-1", ValueError, "init_scale: '0\\*\\*-1': division by zero"),
    ("torch", "growth_interval", "1" * 5000, ValueError, "5000 characters long; at most 200"),
    ("torch", "init_scale", "__import__('os')", ValueError, "only numbers"),
    ("deepspeed", "consecutive_hysteresis", "maybe", ValueError, "True or False; got 'maybe'"),
])
def test_playground_options_refuse_bad_text_with_a_message(preset, name, text, error, message):
    with pytest.raises(error, match=message):
        playground.parse_option(preset, name, text)


def test_option_kind_names_the_options_of_the_preset():
    assert playground.option_kind("apex", "min_loss_scale") == "optional"
    with pytest.raises(ValueError, match="unknown keras option 'init_scale'; choose one of 'initial_scale'"):
        playground.option_kind("keras", "init_scale")


@pytest.mark.parametrize("text, message", [
    ("", "pattern '': the pattern is empty"),
    ("random 10 p=abc", "pattern 'random 10 p=abc': p must be a probability from 0 to 1, such as p=0.01; got 'abc'"),
    ("random 10 p=2", "p must be a probability from 0 to 1"),
    ("random 10 p=nan", "p must be a probability from 0 to 1"),
    ("random 10 seed=-1", "seed must be an integer >= 0; got -1"),
    ("random 10 seed=x", "seed must be a whole number >= 0, such as seed=10; got 'x'"),
    ("every 0 k=1", "steps must be an integer >= 1; got 0"),
    ("every 10 k=0", "k must be an integer >= 1; got 0"),
    ("burst 10 start=-1", "start must be an integer >= 0"),
    ("random 99999999999999999999999", "give the number of steps after 'random', 1 to 100000"),
    ("x" * 100_001, "at most 100000 steps; this drawing has 100001"),
    ("0x_", "cannot read the pattern"),
])
def test_playground_patterns_refuse_bad_text_with_a_message(text, message):
    with pytest.raises(ValueError) as e:
        playground.parse_pattern(text)
    assert message in str(e.value) and len(str(e.value)) < 400


def test_playground_reads_the_largest_patterns():
    assert playground.parse_pattern("random 100000 p=1").all()
    assert playground.parse_pattern("x" * 100_000).sum() == 100_000
    assert playground.parse_pattern("every 100000 k=1").size == 100_000


def test_widget_constructors_refuse_unknown_options_and_take_one_format_name():
    with pytest.raises(ValueError, match="unknown torch option 'foo'; choose one of 'init_scale'"):
        ScalerPlayground("torch", foo=1)
    assert LossScaleExplorer(sample(), formats="fp16").formats == ("fp16",)  # not ('f', 'p', '1', '6')


def test_widgets_have_short_stable_reprs():
    assert repr(LossScaleExplorer(sample(), scale=2.0**10, formats=("fp16",))) == \
        "LossScaleExplorer(scale=2**10, formats=['fp16'])"
    assert repr(ScalerPlayground("jmp", pattern="x.")) == "ScalerPlayground(preset='jmp', pattern='x.')"


@pytest.mark.parametrize("call, error, message", [
    (lambda: plots.plot_traces(scaling.simulate("torch", [False, True]), ax="axes"), TypeError, "ax must be a matplotlib Axes"),
    (lambda: plots.plot_gradient_histogram(np.zeros(8)), ValueError, "values are all exactly zero"),
    (lambda: plots.plot_gradient_histogram(np.ones(8), bins=10**400), ValueError, "bins must be an integer from 1 to"),
])
def test_plot_arguments_the_fuzz_found_are_refused_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()
