"""The block widget, driven from Python as the browser would: construct it, change its controls, type bad text."""

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from labkit.formats import blocks  # noqa: E402
from labkit.widgets.blocks import BlockExplorer  # noqa: E402


def test_the_default_view_shows_500_saturating_at_448_under_floor():
    w = BlockExplorer()
    assert w.block.format == "mxfp8_e4m3" and w.values[0] == 500
    assert float(w.block.dequantize()[0]) == 448.0
    assert "scale 2^0" in w.summary.value and w.table.value.count("<tr>") == 33 and w.message.value == ""


def test_rounding_format_and_position_change_the_view():
    w = BlockExplorer()
    w.rounding.value = "rceil"
    assert float(w.block.dequantize()[0]) == 512.0 and "scale 2^1" in w.summary.value
    w.position.value = 31
    assert w.values[31] == 500 and w.values[0] != 500
    w.format.value = "nvfp4"  # 16 elements: the position is clamped into the block, the rounding is off
    assert w.block.shape == (16,) and w.position.value == 15 and w.rounding.disabled
    assert w.table.value.count("<tr>") == 17
    np.testing.assert_array_equal(w.block.dequantize(), blocks.quantize(w.values, "nvfp4").dequantize())


def test_unplanting_the_outlier_shows_the_plain_block():
    w = BlockExplorer(format="mxfp4", outlier="2**10", position=3, seed=1)
    assert w.values[3] == 1024
    w.plant.value = False
    assert w.values[3] != 1024 and np.abs(w.values).max() < 10


@pytest.mark.parametrize("text", ["abc", "", "2**99999", "1/0", "<b>1</b>"])
def test_bad_outlier_text_shows_a_message_and_keeps_the_last_view(text):
    w = BlockExplorer()
    before = w.table.value
    w.outlier.value = text
    assert "labkit-error" in w.message.value and "outlier" in w.message.value and "Traceback" not in w.message.value
    assert w.table.value == before
    w.outlier.value = "500"
    assert w.message.value == ""


def test_inf_and_nan_outliers_are_shown_not_refused():
    w = BlockExplorer()
    w.outlier.value = "-inf"
    assert w.message.value == "" and w.block.dequantize()[0] == -np.inf
    w.outlier.value = "nan"
    assert w.message.value == "" and "NaN" in w.summary.value and np.isnan(w.block.dequantize()).all()


def test_bad_arguments_are_refused_before_any_widget_exists():
    with pytest.raises(ValueError, match="unknown format"):
        BlockExplorer(format="mxfp3")
    with pytest.raises(ValueError, match="scale_rounding"):
        BlockExplorer(scale_rounding="round")
    with pytest.raises(ValueError, match="position"):
        BlockExplorer(position=32)
    with pytest.raises(ValueError, match="abc"):
        BlockExplorer(outlier="abc")
    with pytest.raises(TypeError, match="outlier"):
        BlockExplorer(outlier=None)
