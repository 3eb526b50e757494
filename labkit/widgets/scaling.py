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

from labkit._validate import choice, names, shown
from labkit.scaling import playground, plots, underflow
from labkit.scaling.registry import PRESETS, get_preset
from labkit.scaling.trace import simulate
from labkit.widgets.parse import parse_number

LOG2_RANGE = (-16, 40)
RECENT_VIEWS = 8  # each widget keeps its last few figures: going back to one is instant
_KIND_TIPS = {"int": "a whole number, e.g. 2000 or 2**11", "number": "a number, e.g. 65536, 2**16 or 1e-3",
              "optional": "a number (e.g. 1 or 2**-14), or None"}


def _png(fig, dpi: int = 72) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _error(text: str) -> str:
    return f"<span class='labkit-error' style='color:#C0392B'>{html.escape(text)}</span>"


def _recent(views: dict, key, make):
    """views[key], made first if it is not there; past RECENT_VIEWS, the oldest is forgotten.

    Going back to an input seen lately (2**16 for 65536, the value before a typo) shows
    its figure again at once instead of redrawing it.
    """
    if key not in views:
        views[key] = make()
        if len(views) > RECENT_VIEWS:
            del views[next(iter(views))]
    return views[key]


def _reason(exc: Exception) -> str:
    """What to tell the learner: a ValueError/TypeError says it all; anything else is a bug
    of ours, shown by its type rather than as a traceback."""
    return str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"


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
        self.formats = tuple(names("formats", formats))  # one name alone is a list of one
        self.ranges = [underflow.safe_scale_range(values, f) for f in self.formats]
        scale = underflow.check_scale(scale)
        self.scale = None  # the S drawn: set by _show
        self._views: dict[float, tuple] = {}  # S -> (figure, table), oldest first
        self.slider = widgets.IntSlider(value=int(round(math.log2(scale))), min=LOG2_RANGE[0], max=LOG2_RANGE[1],
                                        description="log2 S", continuous_update=False,
                                        layout=widgets.Layout(width="520px"))
        self.text = widgets.Text(value=playground.format_default(scale), description="S",
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
        self._show(scale)

    def __repr__(self) -> str:
        return f"LossScaleExplorer(scale={playground.format_default(self.scale)}, formats={list(self.formats)})"

    def _on_slider(self, change) -> None:
        if self._quiet:
            return
        try:
            self._show(2.0 ** change["new"])
        except Exception as e:  # noqa: BLE001 -- a widget shows a message, never a traceback
            self.message.value = _error(f"log2 S = {change['new']}: {_reason(e)}")
            return
        self._set_quietly(self.text, playground.format_default(self.scale))

    def _on_text(self, change) -> None:
        if self._quiet:
            return
        text = change["new"]
        try:
            scale = parse_number(text)
        except Exception as e:  # noqa: BLE001
            self.message.value = _error(f"S: {_reason(e)}")
            return
        try:
            self._show(underflow.check_scale(scale))
        except Exception as e:  # noqa: BLE001
            self.message.value = _error(f"S = {shown(text.strip())}: {_reason(e)}")
            return
        self._set_quietly(self.slider, min(max(int(round(math.log2(self.scale))), LOG2_RANGE[0]), LOG2_RANGE[1]))

    def _set_quietly(self, widget, value) -> None:
        self._quiet = True
        try:
            widget.value = value
        finally:
            self._quiet = False

    def _show(self, scale: float) -> None:
        """Draw S; only once it is drawn does S become the widget's scale (a failure leaves
        the last good view up), and the message line is cleared."""
        self.figure.value, self.table.value = _recent(self._views, scale, lambda: (
            _png(plots.plot_gradient_histogram(self.values, scale, self.formats)), self._table(scale)))
        self.scale = scale
        self.message.value = ""

    def _table(self, scale: float) -> str:
        rows = []
        for r in self.ranges:
            fr = underflow.fractions(self.values, r.format, scale)
            verdict = "loses nothing" if r.contains(scale) else ("range empty" if r.empty else "outside")
            rows.append(f"<tr><td>{r.format}</td><td>{100 * fr.lost:.2f}%</td><td>{100 * fr.subnormal:.2f}%</td>"
                        f"<td>{100 * fr.overflow:.2f}%</td><td>2**{r.log2_lo:.1f} .. 2**{r.log2_hi:.1f}</td>"
                        f"<td>{verdict}</td></tr>")
        head = ("<tr><th>format</th><th>lost to zero</th><th>subnormal</th><th>overflow</th>"
                "<th>S that loses nothing</th><th>this S</th></tr>")
        return f"<table>{head}{''.join(rows)}</table>"


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
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str such as {playground.PATTERN_HELP!r}; got {type(pattern).__name__}")
        for name in options:
            choice(f"{p.name} option", name, p.defaults)
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
        self._views: dict[tuple, tuple] = {}  # (preset, options, pattern) -> (trace, figure, summary), oldest first
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
            kind = playground.option_kind(name, opt)
            if kind == "bool":
                w = widgets.Checkbox(value=bool(value), description=opt, indent=False,
                                     layout=widgets.Layout(width="220px"))
            else:
                w = widgets.Text(value=playground.format_default(value), description=opt, continuous_update=False,
                                 tooltip=_KIND_TIPS[kind], style={"description_width": "initial"},
                                 layout=widgets.Layout(width="260px"))
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
        preset, pattern = self.preset.value, self.pattern.value
        try:
            options, flags = playground.read(preset, {k: w.value for k, w in self.options.items()}, pattern)
            trace, figure, summary = _recent(self._views, (preset, repr(options), pattern),
                                             lambda: self._view(preset, flags, options))
        except Exception as e:  # noqa: BLE001 -- a widget shows a message, never a traceback
            self.message.value = _error(_reason(e))
            return
        self.trace, self.figure.value, self.summary.value = trace, figure, summary
        self.message.value = ""

    @staticmethod
    def _view(preset, flags, options) -> tuple:
        trace = simulate(preset, flags, **options)
        return trace, _png(plots.plot_traces({preset: trace})), playground.summary_html(trace)
