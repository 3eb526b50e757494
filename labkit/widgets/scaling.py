"""Loss-scaling widgets: a loss-scale slider over the gradient histogram, and a scaler
playground (pick a preset, set its options, draw an overflow pattern).

Both are thin layers over tested functions: ``labkit.scaling.underflow`` /
``labkit.scaling.plots`` for the explorer, ``labkit.scaling.playground`` for the
playground. Figures are PNG images (``widgets.Image``); bad input shows a message in the
widget (class ``labkit-error``) and leaves the last good view up.

Stable CSS classes: ``labkit-lossscale`` (the explorer), ``labkit-lossscale-slider``,
``labkit-lossscale-text``, ``labkit-lossscale-figure``, ``labkit-lossscale-table``,
``labkit-lossscale-message``; ``labkit-playground`` (the playground),
``labkit-playground-preset``, ``labkit-playground-option-{name}``,
``labkit-playground-pattern``, ``labkit-playground-figure``,
``labkit-playground-summary``, ``labkit-playground-message``.
"""

from __future__ import annotations

import html
import io
import math

import ipywidgets as widgets

from labkit.scaling import playground, plots, underflow
from labkit.scaling.registry import PRESETS, get_preset

LOG2_RANGE = (-16, 40)


def _png(fig, dpi: int = 72) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _error(text: str) -> str:
    return f"<span class='labkit-error' style='color:#C0392B'>{html.escape(text)}</span>"


class LossScaleExplorer(widgets.VBox):
    """Move the loss scale S and watch the gradient histogram slide across each format.

    Args:
      values: a GradientRecord (``labkit.scaling.gradients.record_gradients()``) or an
        array of gradient values.
      scale: the first S shown (a power of two is exact; any number > 0 works).
      formats: the formats drawn under the histogram.

    Attributes tests may use: ``slider`` (log2 S), ``text`` (S as typed), ``figure``
    (the PNG image), ``table`` (fractions and safe ranges, HTML), ``message``, ``scale``.
    """

    def __init__(self, values, scale: float = 1.0, formats=underflow.DEFAULT_FORMATS):
        self.values = values
        underflow.gradient_values(values)  # bad values raise here, before any widget exists
        self.formats = tuple(formats)
        self.ranges = [underflow.safe_scale_range(values, f) for f in self.formats]
        self.scale = underflow.check_scale(scale)
        self.slider = widgets.IntSlider(value=int(round(math.log2(self.scale))), min=LOG2_RANGE[0], max=LOG2_RANGE[1],
                                        description="log2 S", continuous_update=False,
                                        layout=widgets.Layout(width="520px"))
        self.text = widgets.Text(value=playground.format_default(self.scale), description="S",
                                 continuous_update=False, layout=widgets.Layout(width="200px"))
        self.figure = widgets.Image(format="png")
        self.table = widgets.HTML()
        self.message = widgets.HTML()
        for w, cls in ((self.slider, "slider"), (self.text, "text"), (self.figure, "figure"),
                       (self.table, "table"), (self.message, "message")):
            w.add_class(f"labkit-lossscale-{cls}")
        super().__init__([widgets.HBox([self.slider, self.text]), self.message, self.figure, self.table])
        self.add_class("labkit-lossscale")
        self._quiet = False
        self.slider.observe(self._on_slider, names="value")
        self.text.observe(self._on_text, names="value")
        self._draw()

    def __repr__(self) -> str:
        return f"LossScaleExplorer(scale={playground.format_default(self.scale)}, formats={list(self.formats)})"

    def _on_slider(self, change) -> None:
        if self._quiet:
            return
        self.scale = 2.0 ** change["new"]
        self._set_text()
        self.message.value = ""
        self._draw()

    def _on_text(self, change) -> None:
        if self._quiet:
            return
        try:
            scale = underflow.check_scale(playground.parse_number(change["new"].strip()))
        except ValueError as e:
            self.message.value = _error(f"S: {e}")
            return
        self.scale = scale
        self.message.value = ""
        self._quiet = True
        try:
            self.slider.value = min(max(int(round(math.log2(scale))), LOG2_RANGE[0]), LOG2_RANGE[1])
        finally:
            self._quiet = False
        self._draw()

    def _set_text(self) -> None:
        self._quiet = True
        try:
            self.text.value = playground.format_default(self.scale)
        finally:
            self._quiet = False

    def _draw(self) -> None:
        fig = plots.plot_gradient_histogram(self.values, self.scale, self.formats)
        self.figure.value = _png(fig)
        rows = []
        for r in self.ranges:
            fr = underflow.fractions(self.values, r.format, self.scale)
            verdict = "loses nothing" if r.contains(self.scale) else ("range empty" if r.empty else "outside")
            rows.append(f"<tr><td>{r.format}</td><td>{100 * fr.lost:.2f}%</td><td>{100 * fr.subnormal:.2f}%</td>"
                        f"<td>{100 * fr.overflow:.2f}%</td><td>2**{r.log2_lo:.1f} .. 2**{r.log2_hi:.1f}</td>"
                        f"<td>{verdict}</td></tr>")
        head = ("<tr><th>format</th><th>lost to zero</th><th>subnormal</th><th>overflow</th>"
                "<th>S that loses nothing</th><th>this S</th></tr>")
        self.table.value = f"<table>{head}{''.join(rows)}</table>"


class ScalerPlayground(widgets.VBox):
    """Pick a preset, set its options, type an overflow pattern; see the scale and the skips.

    The options are the imitated library's own (``PRESETS[name].defaults``); numbers may
    be typed as ``2**16``. The pattern is a drawing (``....x...xx``) or a generator
    (``random 300 p=0.02 seed=1``, ``every 300 k=50``, ``burst 200 start=20 length=10``).

    Attributes tests may use: ``preset``, ``options`` ({name: widget}), ``pattern``,
    ``figure``, ``summary``, ``message``, ``trace`` (the last good Trace).
    """

    def __init__(self, preset: str = "torch", pattern: str = "random 300 p=0.02 seed=1", **options):
        p = get_preset(preset)
        self.trace = None
        self.preset = widgets.Dropdown(options=list(PRESETS), value=p.name, description="preset")
        self.pattern = widgets.Text(value=pattern, description="pattern", continuous_update=False,
                                    placeholder=playground.PATTERN_HELP, layout=widgets.Layout(width="520px"))
        self.help = widgets.HTML(
            f"<span style='color:#666;font-size:85%'>{html.escape(playground.PATTERN_HELP)}</span>")
        self.options_box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
        self.source = widgets.HTML()
        self.figure = widgets.Image(format="png")
        self.summary = widgets.HTML()
        self.message = widgets.HTML()
        for w, cls in ((self.preset, "preset"), (self.pattern, "pattern"), (self.figure, "figure"),
                       (self.summary, "summary"), (self.message, "message")):
            w.add_class(f"labkit-playground-{cls}")
        super().__init__([self.preset, self.source, self.options_box, self.pattern, self.help, self.message,
                          self.figure, self.summary])
        self.add_class("labkit-playground")
        self.options: dict[str, widgets.Widget] = {}
        self._build_options(p.name, options)
        self.preset.observe(self._on_preset, names="value")
        self.pattern.observe(lambda _c: self._run(), names="value")
        self._run()

    def __repr__(self) -> str:
        return f"ScalerPlayground(preset={self.preset.value!r}, pattern={self.pattern.value!r})"

    def _build_options(self, name: str, given: dict) -> None:
        p = get_preset(name)
        self.options = {}
        for opt, default in p.defaults.items():
            value = given.get(opt, default)
            if playground.option_kind(name, opt) == "bool":
                w = widgets.Checkbox(value=bool(value), description=opt, indent=False,
                                     layout=widgets.Layout(width="220px"))
            else:
                w = widgets.Text(value=playground.format_default(value), description=opt, continuous_update=False,
                                 style={"description_width": "initial"}, layout=widgets.Layout(width="260px"))
            w.add_class(f"labkit-playground-option-{opt}")
            w.observe(lambda _c: self._run(), names="value")
            self.options[opt] = w
        self.options_box.children = list(self.options.values())
        self.source.value = (f"<span style='color:#555;font-size:90%'>{html.escape(p.imitates)} &mdash; "
                             f"<code>{html.escape(p.source)}</code></span>")

    def _on_preset(self, change) -> None:
        self._build_options(change["new"], {})
        self._run()

    def _run(self) -> None:
        texts = {k: w.value for k, w in self.options.items()}
        try:
            trace = playground.run(self.preset.value, texts, self.pattern.value)
        except (ValueError, TypeError) as e:
            self.message.value = _error(str(e))
            return
        self.trace = trace
        self.message.value = ""
        fig = plots.plot_traces({self.preset.value: trace})
        self.figure.value = _png(fig)
        self.summary.value = playground.summary_html(trace)
