"""The block widget: one block of a block format, its shared scale, and what each element becomes.

A thin layer over ``labkit.formats.blocks`` (``quantize``, ``block_table``): pick a format and
an MX scale rounding, plant an outlier (its value typed as text, read by
``labkit.widgets.parse.parse_number``, at a position on a slider), and read the block element
by element -- the scale, each element's bits and value, what it comes back as, and the error.
Bad input shows a message in the widget (class ``labkit-error``) and leaves the last good view up.

>>> w = BlockExplorer(outlier="500", scale_rounding="rceil")
>>> float(w.block.dequantize()[0]), w.block.scales.tolist()
(512.0, [128])
>>> w.outlier.value = "five hundred"
>>> "labkit-error" in w.message.value, float(w.block.dequantize()[0])
(True, 512.0)

Stable CSS classes: ``labkit-blocks`` (the widget), ``labkit-blocks-format``,
``labkit-blocks-rounding``, ``labkit-blocks-outlier``, ``labkit-blocks-position``,
``labkit-blocks-plant``, ``labkit-blocks-summary``, ``labkit-blocks-table``, ``labkit-blocks-message``.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import numpy as np

from labkit._validate import choice, integer, number
from labkit.formats import blocks
from labkit.widgets.parse import NUMBER_HELP, parse_number
from labkit.widgets.scaling import _error, _reason


class BlockExplorer(widgets.VBox):
    """One block (32 values; 16 for nvfp4) of standard-normal values with an outlier planted in it.

    Args:
      format: a key of ``blocks.FORMATS``.
      scale_rounding: an MX scale rule (``blocks.SCALE_ROUNDINGS``); nvfp4 has none.
      outlier: the planted value, as text ("500", "2**10", "-inf") or a number.
      position: where it goes in the block.
      seed: the seed of the block's other values.

    Attributes tests may use: ``format``, ``rounding``, ``outlier`` (text), ``position``,
    ``plant`` (checkbox), ``summary``, ``table`` (HTML), ``message``, ``values`` (the block shown),
    ``block`` (its BlockTensor).
    """

    def __init__(self, format: str = "mxfp8_e4m3", scale_rounding: str = "floor", outlier="500",
                 position: int = 0, seed: int = 0):
        fmt = blocks.get_format(format)
        choice("scale_rounding", scale_rounding, blocks.SCALE_ROUNDINGS)
        position = integer("position", position, minimum=0, maximum=31)
        seed = integer("seed", seed, minimum=0)
        text = outlier if isinstance(outlier, str) else repr(number("outlier", outlier, finite=False))
        try:
            parse_number(text)  # bad text raises here, before any widget exists
        except ValueError as e:
            raise ValueError(f"outlier: {e}") from None
        self.base = np.random.default_rng(seed).standard_normal(32).astype(np.float32)
        self.values = None
        self.block = None
        self.format = widgets.Dropdown(options=list(blocks.FORMATS), value=fmt.name, description="format")
        self.rounding = widgets.Dropdown(options=list(blocks.SCALE_ROUNDINGS), value=scale_rounding,
                                         description="scale")
        self.outlier = widgets.Text(value=text, description="outlier", continuous_update=False,
                                    placeholder=NUMBER_HELP, layout=widgets.Layout(width="240px"))
        self.position = widgets.IntSlider(value=min(position, fmt.block_size - 1), min=0, max=fmt.block_size - 1,
                                          description="at", continuous_update=False)
        self.plant = widgets.Checkbox(value=True, description="plant outlier", indent=False)
        self.summary = widgets.HTML()
        self.table = widgets.HTML()
        self.message = widgets.HTML()
        for w, cls in ((self.format, "format"), (self.rounding, "rounding"), (self.outlier, "outlier"),
                       (self.position, "position"), (self.plant, "plant"), (self.summary, "summary"),
                       (self.table, "table"), (self.message, "message")):
            w.add_class(f"labkit-blocks-{cls}")
        super().__init__([widgets.HBox([self.format, self.rounding]),
                          widgets.HBox([self.plant, self.outlier, self.position]),
                          self.message, self.summary, self.table])
        self.add_class("labkit-blocks")
        for w in (self.format, self.rounding, self.outlier, self.position, self.plant):
            w.observe(lambda _c: self._show(), names="value")
        self._show()

    def __repr__(self) -> str:
        return (f"BlockExplorer(format={self.format.value!r}, scale_rounding={self.rounding.value!r}, "
                f"outlier={self.outlier.value!r}, position={self.position.value})")

    def _show(self) -> None:
        fmt = blocks.FORMATS[self.format.value]
        self.rounding.disabled = fmt.scale != "e8m0"
        self.position.max = fmt.block_size - 1  # clamps the position into the block
        values = self.base[:fmt.block_size].copy()
        try:
            if self.plant.value:
                with np.errstate(over="ignore"):  # the block is float32: beyond 3.4e38 is inf
                    values[self.position.value] = parse_number(self.outlier.value)
            rounding = self.rounding.value if fmt.scale == "e8m0" else None
            table = blocks.block_table(values, fmt.name, scale_rounding=rounding)
            q = blocks.quantize(values, fmt.name, scale_rounding=rounding)
        except Exception as e:  # noqa: BLE001 -- a widget shows a message, never a traceback
            self.message.value = _error(f"outlier: {_reason(e)}")
            return
        self.values, self.block = values, q
        if np.isfinite(values).all() and (values != 0).any():
            err = f"RMS relative error {100 * blocks.rms_relative_error(values, fmt.name, scale_rounding=rounding):.2f}%"
        else:
            err = "an inf or NaN in the block: no relative error"
        self.summary.value = (f"<b>{html.escape(table.title)}</b> &mdash; scale bits 0x{int(q.scales[0]):02x} "
                              f"({fmt.scale}); {err}")
        self.table.value = table._repr_html_()
        self.message.value = ""
