"""FormatExplorer: one number, seen in every float format at once, bit by bit.

Type a value (``0.1``, ``1e-8``, ``-inf``, ``nan``, ``256**2``) or a bit pattern
(``0x3c00``, read in the format chosen in the drop-down), or drag the log-scale slider;
every format shows its bits, the stored value, the exact decimal, the neighbours, the
rounding error and flags (overflow, underflow, subnormal, rounded, exact). Click a bit
to flip it: the pattern becomes the new input. Text is read when you press Enter or
leave the box. Bad input shows a message in the widget and leaves the last view up.

The widget is a thin layer: `labkit.widgets.explorer_view.explorer_view` computes
everything it shows, and is tested on its own.

Stable CSS classes (for browser tests; ``{fmt}`` is a format name such as ``fp16`` or
``fp8_e4m3``, ``{i}`` a bit index, 0 = least significant):

====================================  ==============================================
``labkit-explorer``                    the whole widget
``labkit-explorer-input``              the text box
``labkit-explorer-pattern-format``     the drop-down: which format reads bit patterns
``labkit-explorer-slider``             the log-scale |x| slider
``labkit-explorer-message``            the message line (``labkit-error`` inside on bad input)
``labkit-row labkit-row-{fmt}``        one format's row (``labkit-row-source`` added to
                                       the row whose pattern was typed or clicked)
``labkit-bit labkit-bit-{fmt}-{i}``    a bit button; also ``labkit-bit-sign`` /
                                       ``labkit-bit-exponent`` / ``labkit-bit-mantissa``;
                                       its text is the bit, 0 or 1
``labkit-hex-{fmt}``                   the pattern in hex
``labkit-value-{fmt}``                 the stored value
``labkit-flags-{fmt}``                 the flags, each a ``<span class="labkit-flag
                                       labkit-flag-{flag}">``
``labkit-details-{fmt}``               exact decimal, neighbours, error, note
====================================  ==============================================
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from labkit._validate import shown
from labkit.formats.plots import FIELD_COLORS, FORMAT_COLORS, pale
from labkit.formats.spec import COURSE_FORMATS, format_names, get
from labkit.formats.summary import bit_fields
from labkit.widgets.explorer_view import ExplorerView, FormatRow, explorer_view, flip_bit

SLIDER_RANGE = (-46.0, 39.0)  # log10 |x|: fp32's smallest subnormal (1.4e-45) to past its max
FLAG_COLORS = {
    "overflow": "#C0392B", "underflow": "#D35400", "subnormal": "#8E44AD", "rounded": "#7F8C8D",
    "exact": "#27AE60", "nan": "#2C3E50", "inf": "#2C3E50", "saturated": "#E67E22", "invalid": "#2C3E50",
}


class _Shared:
    """Layouts and styles shared by every row: a few models instead of hundreds.

    Each ipywidget owns a Layout (and a Style) model unless it is given one; with ~100
    bit buttons that would be ~300 models to sync and to store in a notebook. A bit's
    look depends only on its field and its value, so six button styles cover them all.
    """

    def __init__(self, widest: int):
        L = widgets.Layout
        self.button = L(width="21px", height="26px", padding="0", margin="0 1px 0 0")
        self.styles = {}
        for field, color in FIELD_COLORS.items():
            for bit in (0, 1):
                self.styles[field, bit] = widgets.ButtonStyle(
                    button_color=color if bit else pale(color), text_color="white" if bit else "#444",
                    font_family="monospace",
                )
        self.title, self.hex = L(width="78px"), L(margin="0 0 0 6px")
        self.value, self.free = L(min_width="150px", margin="0 8px 0 0"), L(margin="0 8px 0 0")
        self.details = L()
        self.bits = L(flex="0 0 auto", width=f"{22 * widest}px")  # one width: the hex columns line up
        self.top = L(align_items="center")
        self.middle = L(align_items="center", margin="0 0 0 82px", flex_flow="row wrap")
        self.row = L(padding="2px 4px", margin="1px 0", border="1px solid transparent")
        self.source_row = L(padding="2px 4px", margin="1px 0", border="1px solid #999")

    def html(self, layout, value="") -> widgets.HTML:
        return widgets.HTML(value, layout=layout)


class _Row:
    """The controls of one format's row."""

    def __init__(self, name: str, on_click, shared: _Shared):
        f = get(name)
        self.name, self.shared, self.fields = name, shared, bit_fields(f)
        self.title = shared.html(
            shared.title,
            f"<div style='line-height:1.3'><b style='color:{FORMAT_COLORS.get(name, '#333')}'>{name}</b>"
            f"<br><span style='color:#888;font-size:85%'>{f.layout}</span></div>",
        )
        self.buttons = []  # most significant first, as drawn
        for pos, field in enumerate(self.fields):
            index = f.bits - 1 - pos
            b = widgets.Button(description="0", tooltip=f"{name} bit {index} ({field}): click to flip",
                               layout=shared.button, style=shared.styles[field, 0])
            for cls in ("labkit-bit", f"labkit-bit-{name}-{index}", f"labkit-bit-{field}"):
                b.add_class(cls)
            b.on_click(lambda _b, i=index: on_click(name, i))
            self.buttons.append(b)
        self.hex = shared.html(shared.hex)
        self.value = shared.html(shared.value)
        self.flags = shared.html(shared.free)
        self.details = shared.html(shared.details)
        for w, cls in ((self.hex, "hex"), (self.value, "value"), (self.flags, "flags"), (self.details, "details")):
            w.add_class(f"labkit-{cls}-{name}")
        bits = widgets.HBox(self.buttons, layout=shared.bits)
        top = widgets.HBox([self.title, bits, self.hex], layout=shared.top)
        middle = widgets.HBox([self.value, self.flags, self.details], layout=shared.middle)
        self.box = widgets.VBox([top, middle], layout=shared.row)
        self.box.add_class("labkit-row")
        self.box.add_class(f"labkit-row-{name}")

    def show(self, row: FormatRow) -> None:
        for button, bit, field in zip(self.buttons, row.cells, self.fields):
            button.description = str(bit.value)
            button.style = self.shared.styles[field, bit.value]
        self.hex.value = f"<code>{row.hex}</code>"
        self.value.value = f"<b><code>{html.escape(row.value_text)}</code></b>"
        self.flags.value = "".join(_badge(flag) for flag in row.flags)
        parts = [f"exact {html.escape(row.exact if len(row.exact) <= 60 else row.exact[:57] + '…')}",
                 f"prev {row.prev_text} · next {row.next_text}", html.escape(row.error_text)]
        if row.note:
            parts.append(f"<i>{html.escape(row.note)}</i>")
        self.details.value = ("<div style='color:#666;font-size:85%;line-height:1.35;padding:4px 0'>"
                              f"{' &nbsp;|&nbsp; '.join(parts)}</div>")
        self.box.layout = self.shared.source_row if row.is_source else self.shared.row
        (self.box.add_class if row.is_source else self.box.remove_class)("labkit-row-source")


def _error(text: str) -> str:
    return f"<span class='labkit-error' style='color:#C0392B'>⚠ {html.escape(text)}</span>"


def _badge(flag: str) -> str:
    color = FLAG_COLORS.get(flag, "#555")
    return (f"<span class='labkit-flag labkit-flag-{flag}' style='background:{color};color:white;"
            f"border-radius:3px;padding:1px 5px;margin-right:4px;font-size:85%'>{flag}</span>")


class FormatExplorer(widgets.VBox):
    """An interactive view of one number in several float formats (see the module doc).

    Args:
      value: the first entry shown (text as typed, or a number).
      names: formats to show, one row each (default: the six of ``labkit.formats.COURSE_FORMATS``;
        any of ``labkit.formats.FORMATS``, e.g. ``list(lf.SUBBYTE_FORMATS)`` for fp4 / fp6 / e8m0 /
        fnuz: a 4-bit row has 4 bit buttons, e8m0's has no sign bit).
      pattern_format: the format in which a typed bit pattern is read.

    Attributes tests and notebooks may use: ``text``, ``pattern_format``, ``slider``,
    ``message``, ``view`` (the last good ExplorerView), ``bit_button(fmt, i)``,
    ``value_label(fmt)``, ``flag_label(fmt)``, ``detail_label(fmt)``.
    """

    def __init__(self, value="0.1", names=None, pattern_format: str = "fp16"):
        names = format_names(names, default=COURSE_FORMATS)
        try:
            pattern_name = get(pattern_format).name
        except ValueError as exc:
            raise ValueError(f"pattern_format: {exc}") from None
        self._quiet = False
        self._synced = None  # the |x| the slider was last moved to from the text box
        self.view: ExplorerView | None = None
        self.text = widgets.Text(
            value=str(value), description="value", continuous_update=False,
            placeholder="0.1, 1e-8, -inf, nan, 256**2 or a pattern such as 0x3c00",
            layout=widgets.Layout(width="360px"),
        )
        self.pattern_format = widgets.Dropdown(
            options=names if pattern_name in names else [*names, pattern_name], value=pattern_name,
            description="bit patterns in", style={"description_width": "initial"},
            layout=widgets.Layout(width="230px"),
        )
        self.slider = widgets.FloatLogSlider(
            value=0.1, base=10, min=SLIDER_RANGE[0], max=SLIDER_RANGE[1], step=0.01,
            description="|x|", readout_format=".3e", continuous_update=True,
            layout=widgets.Layout(width="720px"),
        )
        self.message = widgets.HTML()
        for w, cls in ((self.text, "input"), (self.pattern_format, "pattern-format"),
                       (self.slider, "slider"), (self.message, "message")):
            w.add_class(f"labkit-explorer-{cls}")
        shared = _Shared(widest=max(get(n).bits for n in names))
        self.rows = {name: _Row(name, self._flip, shared) for name in names}
        super().__init__([widgets.HBox([self.text, self.pattern_format]), self.slider, self.message,
                          *(row.box for row in self.rows.values())])
        self.add_class("labkit-explorer")
        self.text.observe(self._on_input, names="value")
        self.pattern_format.observe(self._on_input, names="value")
        self.slider.observe(self._on_slider, names="value")
        self._update()

    def __repr__(self) -> str:
        return f"FormatExplorer(value={self.text.value!r}, formats={list(self.rows)})"

    # -- what tests and the browser test look at ------------------------------------
    def bit_button(self, fmt, index: int) -> widgets.Button:
        """The button of bit `index` (0 = least significant) in `fmt`'s row."""
        row = self._row(fmt)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(row.buttons):
            raise ValueError(f"index must be a bit of {row.name}: 0 .. {len(row.buttons) - 1} (0 = least significant), "
                             f"got {shown(index)}")
        return row.buttons[len(row.buttons) - 1 - index]

    def value_label(self, fmt) -> widgets.HTML:
        return self._row(fmt).value

    def flag_label(self, fmt) -> widgets.HTML:
        return self._row(fmt).flags

    def detail_label(self, fmt) -> widgets.HTML:
        return self._row(fmt).details

    def _row(self, fmt) -> _Row:
        name = get(fmt).name
        if name not in self.rows:
            raise ValueError(f"this explorer shows {', '.join(self.rows)}, not {name}")
        return self.rows[name]

    # -- events -------------------------------------------------------------------------
    def _on_input(self, _change) -> None:
        if not self._quiet:
            self._update()

    def _on_slider(self, change) -> None:
        if self._quiet or self._is_echo(change["new"]):
            return
        self._set_quietly(self.text, f"{change['new']:.4g}")
        self._update(sync_slider=False)

    def _flip(self, name: str, index: int) -> None:
        if self.view is None:  # nothing shown yet: there is no pattern to flip
            return
        try:
            bits = flip_bit(name, self.view.row(name).bits, index)
        except Exception as exc:  # noqa: BLE001 -- a widget shows a message, never a traceback
            self.message.value = _error(f"{type(exc).__name__}: {exc}")
            return
        self._set_quietly(self.pattern_format, name)
        self._set_quietly(self.text, f"0x{bits:0{(get(name).bits + 3) // 4}x}")
        self._update()

    def _is_echo(self, value: float) -> bool:
        """The browser's slider snaps what it is given to its step (0.01 in log10) and sends
        the snapped value back: 256**2 = 65536 returns as 10**4.82 = 66069. That is not the
        learner moving the slider, and must not replace what they typed."""
        if self._synced is None or value <= 0:
            return False
        return abs(math.log10(value) - math.log10(self._synced)) <= self.slider.step / 2 + 1e-9

    def _set_quietly(self, widget, value) -> None:
        self._quiet = True
        try:
            widget.value = value
        finally:
            self._quiet = False

    def _update(self, sync_slider: bool = True) -> None:
        try:
            view = explorer_view(self.text.value, self.pattern_format.value, list(self.rows))
        except Exception as exc:  # noqa: BLE001 -- a widget shows a message, never a traceback
            view = ExplorerView(False, f"{type(exc).__name__}: {exc}", None, ())
        if not view.ok:
            self.message.value = _error(view.message)
            return
        self.view = view
        self.message.value = f"<span class='labkit-info' style='color:#555'>{html.escape(view.message)}</span>"
        for row in view.rows:
            self.rows[row.format].show(row)
        v = view.entry.value
        if sync_slider and math.isfinite(v) and v != 0:
            lo, hi = (10.0**e for e in SLIDER_RANGE)
            self._synced = min(max(abs(v), lo), hi)
            self._set_quietly(self.slider, self._synced)
