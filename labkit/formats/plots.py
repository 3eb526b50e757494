"""Figures of what a format can hold: its bits, its range, its spacing, its rounding error.

Every function returns a new ``matplotlib.figure.Figure`` (closed in pyplot, so a
notebook shows it once: as the cell's value) and draws only numbers computed by
`labkit.formats`:

* ``plot_bit_layout(x, names)``   -- one value in several formats: sign / exponent /
  mantissa cells, the decoded value, its exact decimal, the neighbours, the error;
* ``plot_number_line(names)``     -- each format's range on a log axis: underflow zone,
  subnormals, normals, overflow zone, and how many values each binade holds;
* ``plot_values(names, lo, hi)``  -- every representable value in a window, one tick each;
* ``plot_rounding_error(names)``  -- the worst relative rounding error at each magnitude;
* ``plot_running_sum(acc)``       -- a running sum in 16 bits against a wide accumulator.

`names` may hold any format of ``FORMATS`` (fp4_e2m1, e8m0, the fnuz FP8s ...); None draws
the six of ``COURSE_FORMATS``.

>>> fig = plot_bit_layout(0.1, ["fp16", "bf16"])
>>> [t.get_text() for t in fig.axes[0].texts if t.get_text() in ("fp16", "bf16")]
['fp16', 'bf16']
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch, Rectangle

from labkit._validate import integer, number, shown
from labkit.formats.describe import represent
from labkit.formats.numerics import Accumulation, binade_counts, representable_values
from labkit.formats.spec import COURSE_FORMATS, format_names, get
from labkit.formats.summary import bit_fields, decode_formula, error_summary, short_decimal

FIELD_COLORS = {"sign": "#E45756", "exponent": "#54A24B", "mantissa": "#4C78A8"}
FORMAT_COLORS = {
    "fp32": "#4C78A8", "tf32": "#72B7B2", "fp16": "#F58518",
    "bf16": "#54A24B", "fp8_e4m3": "#B279A2", "fp8_e5m2": "#9D755D",
    "fp4_e2m1": "#E45756", "fp6_e2m3": "#EECA3B", "fp6_e3m2": "#FF9DA6",
    "e8m0": "#79706E", "fp8_e4m3fnuz": "#D67195", "fp8_e5m2fnuz": "#BAB0AC",
}
_STYLE = {
    "font.size": 10, "axes.titlesize": 11, "axes.spines.top": False,
    "axes.spines.right": False, "figure.dpi": 90, "savefig.dpi": 90,
}


def pale(color: str, amount: float = 0.25) -> str:
    """`color` mixed with white: `amount` of the colour, the rest white (a '0' bit)."""
    r, g, b = (amount * c + (1 - amount) for c in to_rgb(color))
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _names(names) -> list[str]:
    """The formats a figure draws: `names`, or the six of COURSE_FORMATS when None."""
    return format_names(names, default=COURSE_FORMATS)


def _finish(fig):
    plt.close(fig)  # the caller shows it (a notebook: as the cell's value)
    return fig


def _real(x, what: str, *, finite: bool = False, nan: bool = False) -> float:
    """A real number (not a bool) as a float; inf allowed unless `finite`, NaN only if `nan`."""
    if nan and isinstance(x, (float, np.floating)) and math.isnan(x):
        return float(x)
    return number(what, x, finite=finite)


# -- one value, bit by bit --------------------------------------------------------------
def plot_bit_layout(x, names=None, *, title: str | None = None):
    """One value stored in each of `names`, drawn bit by bit, one row per format.

    Cells are coloured by field (sign, exponent, mantissa); a 1 bit is filled, a 0 bit
    pale. Under each row: how the fields decode, the stored value's exact decimal with
    the flags, the neighbouring representable values and the rounding error. Rows
    start at the same left edge, so fields of equal width line up (bf16 over fp32).
    `names`: one or several formats (fp4_e2m1, e8m0, ... too); None: the six of COURSE_FORMATS.

    >>> fig = plot_bit_layout(100.0, ["fp4", "e8m0"])
    >>> [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("1+") or t.get_text() == "8+0"]
    ['1+2+1', '8+0']
    """
    x = _real(x, "x", nan=True)
    names = _names(names)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string or None; got {type(title).__name__} {shown(title)}")
    reps = [represent(x, n) for n in names]
    widest = max(get(n).bits for n in names)
    span = max(widest, 26)  # room for the text lines under a narrow (4-, 6-, 8-bit) row
    label = 0.45 * max(0, max(len(n) for n in names) - 8)  # room for a long name (fp8_e4m3fnuz)
    row_h, cell_h = 3.6, 1.0
    with plt.rc_context(_STYLE):
        height = 0.3 * row_h * len(names) + 0.9
        fig = plt.figure(figsize=(0.31 * (span + 8.5 + label), height))
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0 - 0.55 / height))
        for i, r in enumerate(reps):
            f = get(r.format)
            y = -i * row_h
            ax.text(-0.6, y + 0.5, r.format, ha="right", va="center", fontsize=11, weight="bold",
                    color=FORMAT_COLORS.get(r.format, "black"))
            ax.text(-0.6, y - 0.25, f.layout, ha="right",
                    va="center", fontsize=8, color="0.4")
            pattern = format(r.bits, f"0{f.bits}b")
            for j, (bit, field) in enumerate(zip(pattern, bit_fields(f))):
                color = FIELD_COLORS[field]
                ax.add_patch(Rectangle((j + 0.04, y), 0.92, cell_h, facecolor=color if bit == "1" else pale(color),
                                       edgecolor=color, linewidth=0.8))
                ax.text(j + 0.5, y + 0.5, bit, ha="center", va="center", fontsize=9,
                        color="white" if bit == "1" else "0.25", family="monospace")
            ax.text(f.bits + 0.4, y + 0.5, r.hex, ha="left", va="center", fontsize=8.5,
                    family="monospace", color="0.35")
            flags = ", ".join(r.flags)
            lines = (
                (decode_formula(r), "0.15"),
                (f"stored  {short_decimal(r)}   [{flags}]", _flag_color(r.flags)),
                (f"neighbours  {r.prev:.9g}  |  {r.next:.9g}      {error_summary(r)}", "0.35"),
            )
            for k, (text, color) in enumerate(lines):
                ax.text(0.04, y - 0.62 - 0.62 * k, text, ha="left", va="center", fontsize=8.5, color=color)
        handles = [Patch(facecolor=c, edgecolor=c, label=name) for name, c in FIELD_COLORS.items()]
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(0.985, 1.0), ncol=3, frameon=False,
                  fontsize=9, borderaxespad=0.1)
        ax.set_xlim(-4.0 - label, span + 4.5)
        ax.set_ylim(-(len(names) - 1) * row_h - 2.6, 1.2)
        ax.axis("off")
        if title is None:
            title = f"x = {x!r} stored in {len(names)} format{'s' * (len(names) > 1)}"
        fig.suptitle(title, x=0.02, ha="left", y=1.0 - 0.12 / height, va="top", fontsize=11)
    return _finish(fig)


def _flag_color(flags) -> str:
    if {"overflow", "underflow", "nan"} & set(flags):
        return "#C0392B"
    if "subnormal" in flags:
        return "#8E44AD"
    return "0.15"


# -- ranges on a log axis -----------------------------------------------------------------
def _log_window(names, lo, hi) -> tuple[float, float]:
    fmts = [get(n) for n in names]
    lo = min(f.smallest_subnormal for f in fmts) / 10**1.5 if lo is None else _real(lo, "lo")
    hi = max(f.max for f in fmts) * 10**1.5 if hi is None else _real(hi, "hi")
    if not (0 < lo < hi) or not math.isfinite(hi):
        raise ValueError(f"need 0 < lo < hi < inf on a log axis, got lo={lo:g}, hi={hi:g}")
    return lo, hi


def plot_number_line(names=None, lo=None, hi=None):
    """Each format's positive range on a log axis, and how densely it is filled.

    Top: one band per format -- hatched where a value rounds to 0 (below half the
    smallest subnormal) or overflows (above max), pale where it is subnormal (fewer
    significant bits), solid where it is normal. The three boundaries are listed to the
    right. Bottom: how many values each binade [2^k, 2^(k+1)) holds: 2^M across the
    normal range, halving binade by binade through the subnormals. Negative values
    mirror the positive ones. e8m0 has no zero: below 2^-127 a value rounds up to it, so
    its low zone is left plain.
    """
    names = _names(names)
    lo, hi = _log_window(names, lo, hi)
    with plt.rc_context(_STYLE):
        fig, (top, bottom) = plt.subplots(
            2, 1, sharex=True, figsize=(11, 1.0 + 0.55 * len(names) + 2.4),
            gridspec_kw={"height_ratios": [0.55 * len(names) + 0.4, 2.2], "hspace": 0.12},
        )
        left = 0.09 + 0.007 * max(0, max(len(n) for n in names) - 8)  # a long name (fp8_e4m3fnuz) needs room
        fig.subplots_adjust(left=left, right=0.66, top=0.9, bottom=0.1)
        for i, name in enumerate(names):
            f, y, color = get(name), len(names) - 1 - i, FORMAT_COLORS.get(name, "0.3")
            low = f.smallest_subnormal / 2 if f.has_zero else lo  # e8m0: below 2^-127 is 2^-127, no zero
            zones = (
                (lo, low, dict(facecolor="white", edgecolor="0.55", hatch="////")),
                (low if f.has_zero else f.smallest_normal, f.smallest_normal,
                 dict(facecolor=pale(color, 0.35), edgecolor=color)),
                (f.smallest_normal, f.max, dict(facecolor=color, edgecolor=color)),
                (f.max, hi, dict(facecolor="white", edgecolor="#C0392B", hatch="\\\\\\\\")),
            )
            for a, b, style in zones:
                a, b = max(a, lo), min(b, hi)
                if a < b:
                    top.add_patch(Rectangle((a, y - 0.32), b - a, 0.64, linewidth=0.6, **style))
            for k, (v, fmt_) in enumerate(((f.smallest_subnormal, ".3g"), (f.smallest_normal, ".3g"), (f.max, ".6g"))):
                text = format(v, fmt_) if v < 1e6 else f"{v:.3g}"
                top.text(1.03 + 0.13 * k, y, text, transform=top.get_yaxis_transform(), va="center",
                         fontsize=9, family="monospace")
            k, counts = binade_counts(f)
            edges = np.ldexp(1.0, np.append(k, k[-1] + 1))
            edges[-1] = min(edges[-1], f.max)
            bottom.stairs(counts, edges, color=color, linewidth=1.8, label=name, baseline=None)
        for k, head in enumerate(("smallest\nsubnormal", "smallest\nnormal", "largest\nfinite")):
            top.text(1.03 + 0.13 * k, len(names) - 0.35, head, transform=top.get_yaxis_transform(),
                     va="bottom", fontsize=8.5, color="0.35")
        top.set_xscale("log")
        top.set_xlim(lo, hi)
        top.set_ylim(-0.6, len(names) - 0.4)
        top.set_yticks(range(len(names)), names[::-1])
        top.tick_params(axis="y", length=0)
        top.spines["left"].set_visible(False)
        top.axvline(1.0, color="0.6", linewidth=0.8, linestyle=":")
        legend = [
            Patch(facecolor="white", edgecolor="0.55", hatch="////", label="underflow: → 0"),
            Patch(facecolor=pale("#777777", 0.35), edgecolor="0.5", label="subnormal"),
            Patch(facecolor="#777777", label="normal"),
            Patch(facecolor="white", edgecolor="#C0392B", hatch="\\\\\\\\", label="overflow: → inf (e4m3: NaN)" if not any(
                get(n).saturates for n in names) else "overflow: → inf / NaN / max"),
        ]
        top.legend(handles=legend, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4, frameon=False,
                   fontsize=8.5, borderaxespad=0.2, handlelength=2.2)
        bottom.set_yscale("log", base=2)
        plateaus = []  # tick the plateau heights 2^M, skipping ones too close to read
        for m in sorted({get(n).mantissa_bits for n in names}, reverse=True):
            if not plateaus or plateaus[-1] - m >= 3:
                plateaus.append(m)
        bottom.set_yticks([2.0**m for m in plateaus], [f"$2^{{{m}}}$" for m in plateaus])
        bottom.minorticks_off()
        bottom.set_ylim(0.5, 2.0 ** (plateaus[0] + 2))
        bottom.set_ylabel("values per binade\n[2^k, 2^(k+1))")
        bottom.set_xlabel("|x|  (log scale; negative values mirror positive ones)")
        bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
        bottom.grid(True, which="major", axis="y", color="0.92")
        fig.suptitle("Where each format can hold a number", x=0.09, ha="left", fontsize=12)
    return _finish(fig)


# -- the values themselves, on a linear axis -------------------------------------------------
def plot_values(names=None, lo: float = 0.0, hi: float = 4.0, *, limit: int = 5000):
    """Every representable value of each format in [lo, hi], one tick each.

    On a linear axis the spacing doubles at every power of two, and the subnormals
    (pale ticks) are evenly spaced down to 0. Raises ValueError when a format has more
    than `limit` values in the window (fp32 between 0 and 1 has about a billion).
    """
    names = _names(names)
    lo, hi = _real(lo, "lo", finite=True), _real(hi, "hi", finite=True)
    values = {}
    for n in names:
        try:
            values[n] = representable_values(n, lo, hi, limit=limit)
        except ValueError as exc:
            if "limit" in str(exc) and "values lie in" in str(exc):  # too many of this format's values
                raise ValueError(f"names: {exc}; or leave {n} out of names") from None
            raise
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(11, 0.6 + 0.55 * len(names)))
        fig.subplots_adjust(left=0.1, right=0.84, bottom=0.22 if len(names) < 3 else 0.15, top=0.86)
        for i, name in enumerate(names):
            f, y, v = get(name), len(names) - 1 - i, values[name]
            color = FORMAT_COLORS.get(name, "0.3")
            sub = np.abs(v) < f.smallest_normal
            ax.vlines(v[~sub], y - 0.3, y + 0.3, color=color, linewidth=0.8)
            ax.vlines(v[sub], y - 0.3, y + 0.3, color=pale(color, 0.45), linewidth=0.8)
            ax.text(1.01, y, f"{v.size:,} values", transform=ax.get_yaxis_transform(), va="center", fontsize=9)
        ax.set_xlim(lo - 0.01 * (hi - lo), hi + 0.01 * (hi - lo))
        ax.set_ylim(-0.6, len(names) - 0.4)
        ax.set_yticks(range(len(names)), names[::-1])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
        any_sub = any(np.any(np.abs(values[n]) < get(n).smallest_normal) for n in names)
        ax.set_title(f"Every representable value in [{lo:g}, {hi:g}]" + (" (pale: subnormal)" if any_sub else ""),
                     loc="left")
    return _finish(fig)


# -- rounding error against magnitude ----------------------------------------------------------
def worst_rel_error(fmt, x) -> np.ndarray:
    """The largest relative rounding error of any value in the binade of each |x|.

    Half the spacing over the binade's lower end: eps/2 across the normal range, growing
    as ss / (2|x|) through the subnormals, 1 below half the smallest subnormal (the
    value becomes 0) and inf above the overflow threshold.
    """
    f = get(fmt)
    a = np.abs(np.asarray(x, np.float64))
    k = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    spacing = np.ldexp(1.0, (np.maximum(k, f.emin) - f.mantissa_bits).astype(int))
    worst = np.minimum(spacing / 2 / np.ldexp(1.0, k.astype(int)), 1.0)
    worst = np.where(a <= f.smallest_subnormal / 2, 1.0, worst)
    return np.where(a > f.max + f.ulp(f.max) / 2, np.inf, worst)


def plot_rounding_error(names=None, lo=None, hi=None, *, n: int = 3000):
    """Worst relative rounding error against |x|: flat at eps/2, rising in the subnormals."""
    names = _names(names)
    lo, hi = _log_window(names, lo, hi)
    x = np.geomspace(lo, hi, integer("n", n, minimum=2, maximum=1_000_000))
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(11, 4.2))
        fig.subplots_adjust(left=0.08, right=0.78, top=0.88, bottom=0.14)
        for name in names:
            f, color = get(name), FORMAT_COLORS.get(name, "0.3")
            err = worst_rel_error(f, x)
            ax.plot(x, np.where(np.isfinite(err), err, np.nan), color=color, linewidth=1.8,
                    drawstyle="steps-post", label=f"{name}  (eps/2 = 2^-{f.mantissa_bits + 1})")
            over = x[np.isinf(err)]
            if over.size:
                ax.plot(over[0], 1.0, marker=">", color=color, markersize=7)
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.set_ylim(None, 2.0)
        ax.set_xlim(lo, hi)
        ax.set_xlabel("|x|  (log scale)")
        ax.set_ylabel("worst relative error")
        ax.grid(True, which="major", color="0.92")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
        ax.set_title("Worst relative rounding error at each magnitude: eps/2 for normal values, "
                     "up to 1 for subnormals (▶: overflow)", loc="left")
    return _finish(fig)


# -- accumulation ------------------------------------------------------------------------------
def plot_running_sum(acc: Accumulation):
    """The running sums of a `compare_accumulation` result, and where the narrow one stalls."""
    if not isinstance(acc, Accumulation):
        raise TypeError(f"plot_running_sum() takes the result of compare_accumulation(), got {type(acc).__name__}")
    steps = np.arange(1, acc.inputs.size + 1)
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(9, 4))
        fig.subplots_adjust(left=0.1, right=0.97, top=0.88, bottom=0.14)
        ax.plot(steps, acc.reference, color="0.2", linestyle="--", linewidth=1.2, label="exact (float64)")
        ax.plot(steps, acc.wide, color=FORMAT_COLORS.get(acc.accumulator, "C0"), linewidth=2.2, alpha=0.8,
                label=f"{acc.accumulator} accumulator")
        ax.plot(steps, acc.naive, color=FORMAT_COLORS.get(acc.format, "C1"), linewidth=2.2,
                label=f"{acc.format} accumulator")
        if acc.stall_step is not None:
            ax.axvline(acc.stall_step + 1, color="0.5", linestyle=":", linewidth=1)
            top = float(np.nanmax(np.abs(acc.reference))) or 1.0
            ax.annotate(f"the {acc.format} sum stops at {acc.naive_total:g} (step {acc.stall_step:,})",
                        (acc.stall_step + 1, acc.naive_total),
                        xytext=(0.45 * acc.inputs.size, acc.naive_total + 0.12 * top),
                        fontsize=9, color="0.25", arrowprops=dict(arrowstyle="->", color="0.5"))
        ax.set_xlabel("number of values added")
        ax.set_ylabel("running sum")
        ax.legend(loc="upper left", frameon=False)
        ax.set_title(f"Summing {acc.inputs.size:,} {acc.format} values", loc="left")
    return _finish(fig)
