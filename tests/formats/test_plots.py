"""The figures draw the numbers labkit.formats computes: bits, ranges, spacing, error."""

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import Rectangle

import labkit.formats as lf
from labkit.formats import plots
from labkit.formats.numerics import compare_accumulation, representable_values
from labkit.formats.plots import (
    FIELD_COLORS,
    pale,
    plot_bit_layout,
    plot_number_line,
    plot_rounding_error,
    plot_running_sum,
    plot_values,
    worst_rel_error,
)


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def cells(fig):
    """(x, y, facecolor) of every bit cell, in drawing order."""
    ax = fig.axes[0]
    return [(p.get_x(), p.get_y(), to_hex(p.get_facecolor())) for p in ax.patches if isinstance(p, Rectangle)]


def test_figures_are_closed_in_pyplot_so_a_notebook_shows_each_once():
    plot_bit_layout(0.1, ["fp16"])
    plot_number_line(["fp16"])
    assert plt.get_fignums() == []


@pytest.mark.parametrize("names", [["fp32", "fp16", "bf16", "fp8_e4m3"], list(lf.SUBBYTE_FORMATS)])
@pytest.mark.parametrize("x", [0.1, -1e-6, 65504.0, 256.0**2, 0.0])
def test_bit_layout_cells_spell_the_encoded_pattern_in_field_colours(x, names):
    fig = plot_bit_layout(x, names)
    drawn = cells(fig)
    assert len(drawn) == sum(lf.get(n).bits for n in names)
    digits = [t for t in texts(fig) if t in ("0", "1")]
    start = 0
    for name in names:
        f, r = lf.get(name), lf.represent(x, name)
        pattern = format(r.bits, f"0{f.bits}b")
        assert "".join(digits[start:start + f.bits]) == pattern
        fields = ["sign"] * f.signed + ["exponent"] * f.exponent_bits + ["mantissa"] * f.mantissa_bits
        for (_, _, color), bit, field in zip(drawn[start:start + f.bits], pattern, fields):
            want = FIELD_COLORS[field] if bit == "1" else pale(FIELD_COLORS[field])
            assert color == to_hex(want).lower()
        assert r.hex in texts(fig)
        start += f.bits


def test_bit_layout_shows_value_exact_decimal_neighbours_and_error():
    fig = plot_bit_layout(0.1, ["bf16"])
    joined = "\n".join(texts(fig))
    r = lf.represent(0.1, "bf16")
    assert r.exact in joined and "[rounded]" in joined
    assert f"{r.prev:.9g}" in joined and f"{r.next:.9g}" in joined
    assert f"{r.abs_error:.3g}" in joined
    assert "+2^(123 - 127) × 1.6015625" in joined


def test_bit_layout_flags_overflow_and_underflow():
    joined = "\n".join(texts(plot_bit_layout(256.0**2, ["fp16"])))
    assert "OVERFLOW" in joined and "[overflow]" in joined
    joined = "\n".join(texts(plot_bit_layout(1e-10, ["fp16"])))
    assert "UNDERFLOW" in joined and "[underflow]" in joined


def test_bit_layout_rows_line_up_at_the_sign_bit():
    drawn = cells(plot_bit_layout(1.0, ["fp32", "bf16"]))
    fp32_x = [x for x, y, _ in drawn[:32]]
    bf16_x = [x for x, y, _ in drawn[32:]]
    assert bf16_x == fp32_x[:16]


@pytest.mark.parametrize("bad, error", [("0.1", TypeError), (True, TypeError), ([1.0], TypeError)])
def test_bit_layout_refuses_what_is_not_one_number(bad, error):
    with pytest.raises(error, match="x must be a number"):
        plot_bit_layout(bad)


def test_bit_layout_refuses_an_unknown_format():
    with pytest.raises(ValueError, match="valid names"):
        plot_bit_layout(1.0, ["fp17"])
    with pytest.raises(ValueError, match="at least one"):
        plot_bit_layout(1.0, [])


def zone_edges(fig, row_y):
    """(left, right, hatch) of the zone rectangles drawn for the band at height row_y."""
    ax = fig.axes[0]
    return [(p.get_x(), p.get_x() + p.get_width(), p.get_hatch())
            for p in ax.patches if math.isclose(p.get_y() + p.get_height() / 2, row_y)]


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3"])
def test_number_line_zones_sit_at_the_format_boundaries(name):
    f = lf.get(name)
    fig = plot_number_line([name, "fp32"])
    zones = zone_edges(fig, 1)  # the first name is drawn on top, at y = 1
    lo, hi = fig.axes[0].get_xlim()
    assert zones == [
        (lo, f.smallest_subnormal / 2, "////"),
        (f.smallest_subnormal / 2, f.smallest_normal, None),
        (f.smallest_normal, f.max, None),
        (f.max, hi, "\\\\\\\\"),
    ]
    listed = texts(fig)
    assert f"{f.smallest_subnormal:.3g}" in listed and f"{f.smallest_normal:.3g}" in listed


def test_number_line_density_is_2_to_the_m_per_normal_binade():
    fig = plot_number_line(["fp16", "bf16"])
    steps = [a for a in fig.axes[1].patches]
    heights = [max(s.get_path().vertices[:, 1]) for s in steps]
    assert heights == [2.0**10, 2.0**7]


def test_number_line_refuses_a_bad_window():
    with pytest.raises(ValueError, match="0 < lo < hi"):
        plot_number_line(["fp16"], lo=-1, hi=10)
    with pytest.raises(ValueError, match="0 < lo < hi"):
        plot_number_line(["fp16"], lo=10, hi=1)


def test_plot_values_draws_one_tick_per_representable_value():
    fig = plot_values(["fp8_e4m3", "fp8_e5m2"], 0.0, 4.0)
    ax = fig.axes[0]
    drawn = sum(len(c.get_segments()) for c in ax.collections)
    want = sum(representable_values(n, 0.0, 4.0).size for n in ("fp8_e4m3", "fp8_e5m2"))
    assert drawn == want
    assert f"{representable_values('fp8_e4m3', 0.0, 4.0).size:,} values" in texts(fig)


def test_plot_values_refuses_a_window_with_too_many_values():
    with pytest.raises(ValueError, match="narrow the window"):
        plot_values(["fp32"], 0.0, 1.0)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e5m2"])
def test_worst_rel_error_bounds_the_real_rounding_error(name):
    f = lf.get(name)
    x = np.geomspace(f.smallest_subnormal / 4, f.max, 20_000)
    bound = worst_rel_error(f, x)
    assert np.all(np.asarray(f.rel_error(x)) <= bound * (1 + 1e-12))
    normal = (x >= f.smallest_normal) & (x <= f.max / 2)
    assert np.all(bound[normal] == f.eps / 2)
    assert worst_rel_error(f, f.smallest_subnormal / 2) == 1.0
    assert worst_rel_error(f, f.max * 2) == math.inf


def test_rounding_error_plot_has_one_line_per_format():
    fig = plot_rounding_error(["fp32", "fp16", "bf16"])
    labels = [line.get_label() for line in fig.axes[0].lines if not line.get_label().startswith("_")]
    assert labels == ["fp32  (eps/2 = 2^-24)", "fp16  (eps/2 = 2^-11)", "bf16  (eps/2 = 2^-8)"]


def test_running_sum_plot_draws_the_three_sums_and_the_stall():
    acc = compare_accumulation(np.random.default_rng(0).random(2000), "bf16")
    fig = plot_running_sum(acc)
    lines = {line.get_label(): line.get_ydata() for line in fig.axes[0].lines}
    np.testing.assert_array_equal(lines["bf16 accumulator"], acc.naive)
    np.testing.assert_array_equal(lines["fp32 accumulator"], acc.wide)
    assert any("stops at 256" in t for t in texts(fig))


def test_running_sum_plot_refuses_anything_else():
    with pytest.raises(TypeError, match="compare_accumulation"):
        plot_running_sum([1, 2, 3])


# -- bad sizes and windows are refused, naming the parameter (issue 12) ---------------------------
@pytest.mark.parametrize("call, error, words", [
    (lambda: plots.plot_rounding_error(["fp16"], n=0), ValueError, "n must be an integer from 2"),
    (lambda: plots.plot_rounding_error(["fp16"], n=True), TypeError, "n must be an integer"),
    (lambda: plots.plot_rounding_error(["fp16"], n=2.5), TypeError, "n must be an integer"),
    (lambda: plots.plot_values(["fp16"], 0.0, float("inf")), ValueError, "hi must be a finite number"),
    (lambda: plots.plot_values(["fp16"], 10**400, 1.0), ValueError, "lo must be a finite number"),
    (lambda: plots.plot_values(["fp16"], limit=float("nan")), TypeError, "limit must be an integer"),
    (lambda: plots.plot_values(None), ValueError, "names: .*leave fp32 out of names"),
    (lambda: plots.plot_number_line(["fp16"], lo=10**400), ValueError, "lo must be a number"),
    (lambda: plots.plot_bit_layout(10**400, ["fp16"]), ValueError, "x must be a number"),
    (lambda: plots.plot_bit_layout(0.1, ["fp16"], title=3), TypeError, "title must be a string"),
])
def test_figures_refuse_bad_values_naming_the_parameter(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_figure_takes_one_format_name():
    fig = plots.plot_values("fp8_e4m3", 1.0, 2.0)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["fp8_e4m3"]


def test_bit_layout_shows_the_course_formats_by_default_and_any_format_when_asked():
    default = [t for t in texts(plot_bit_layout(1.0)) if t in lf.FORMATS]
    assert default == list(lf.COURSE_FORMATS)
    fig = plot_bit_layout(100.0, ["fp4", "e8m0"])
    assert {"fp4_e2m1", "e8m0", "1+2+1", "8+0", "0x7", "0x86"} <= set(texts(fig))
    assert any("saturated" in t for t in texts(fig))


def test_number_line_has_no_underflow_zone_for_e8m0_and_names_saturation_in_its_legend():
    fig = plot_number_line(["e8m0", "fp4"])
    top = fig.axes[0]
    hatched = [p for p in top.patches if isinstance(p, Rectangle) and p.get_hatch() == "////"]
    assert len(hatched) == 1 and hatched[0].get_y() < 0.5  # only fp4's row (y = 0) has an underflow zone
    assert "overflow: → inf / NaN / max" in [t.get_text() for t in top.get_legend().get_texts()]
    assert "overflow: → inf (e4m3: NaN)" in [t.get_text() for t in plot_number_line().axes[0].get_legend().get_texts()]
