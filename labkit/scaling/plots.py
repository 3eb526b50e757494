"""Figures for loss scaling: scale trajectories, the gradient histogram against each
format's range (in the style of Figure 3 of Micikevicius et al. 2018), and FP8 scaling.

Each function returns a new ``matplotlib.figure.Figure``, closed in pyplot so that a
notebook shows it once, as the cell's value (the convention of ``labkit.formats.plots``).
``plot_traces`` also draws into an existing axes (``ax=``).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import PathPatch
from matplotlib.path import Path

from labkit import formats as lf
from labkit._validate import integer, names, number, shown
from labkit.scaling.fp8 import Fp8Trace
from labkit.scaling.trace import _as_dict
from labkit.scaling.underflow import DEFAULT_FORMATS, ScaleRange, _pow2, check_scale, fractions, gradient_values

BEST_LEGEND_STEPS = 5_000  # up to this many steps in all, the legend goes where it hides least
MAX_SPANS = 2000  # overflow runs shaded one by one; more are merged (see _shade_overflows)
ZONE_COLORS = {"lost": "#9e9e9e", "subnormal": "#f4a261", "normal": "#2a9d8f", "overflow": "#e63946"}


def _log2(x):
    with np.errstate(divide="ignore"):
        return np.log2(np.asarray(x, dtype=np.float64))


def plot_traces(traces, ax=None, *, title: str | None = None, ceiling=None, band: ScaleRange | tuple | None = None,
                stacked: bool = False):
    """Loss scale (log2) against step for one or more traces; skipped steps marked with x.

    Args:
      traces: a Trace, a list of Traces, or {label: Trace}.
      ceiling: optional per-step largest scale that does not overflow (e.g. fmt.max / amax).
      band: optional ScaleRange or (lo, hi): the scales that lose nothing, shaded.
      stacked: one row per trace (shared axes), so that rules that coincide stay visible.
    """
    items = _as_dict(traces)
    if not items:
        raise ValueError("traces is empty: give a Trace, a list of Traces or {label: Trace} (from simulate)")
    ceiling = None if ceiling is None else _scales("ceiling", ceiling)
    band = None if band is None else _band(band)
    if stacked:
        if ax is not None:
            raise ValueError("stacked=True draws its own rows; do not pass ax")
        fig = _new_figure((9, 0.3 + 1.0 * len(items)))
        axes = np.atleast_1d(fig.subplots(len(items), 1, sharex=True, sharey=True))
        for row, (label, t) in zip(axes, items.items()):
            _draw_traces(row, {label: t}, ceiling, band, color=f"C{list(items).index(label)}")
            row.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
            row.tick_params(labelsize=7)
        axes[0].set_title(title or "log2(loss scale) per step (x: update skipped, o: inf/nan applied, "
                                   "shaded: overflow)", fontsize=10)
        axes[-1].set_xlabel("step")
        return fig
    fig, ax = _figure(ax, (9, 3.6))
    _draw_traces(ax, items, ceiling, band)
    ax.set_xlabel("step")
    ax.set_ylabel("log2(loss scale)")
    ax.set_title(title or "Loss scale per step (x: update skipped, o: inf/nan applied, shaded: overflow)",
                 fontsize=10)
    ncol = 2 if len(items) > 4 else 1
    if sum(len(t) for t in items.values()) <= BEST_LEGEND_STEPS:
        ax.legend(fontsize=8, loc="best", ncol=ncol)
    else:  # "best" tests every point against nine boxes: seconds at 10**5 steps. Outside, it hides nothing.
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), ncol=ncol)
    return fig


def _draw_traces(ax, items, ceiling, band, color=None):
    overflows = [t.overflows for t in items.values()]
    if overflows and all(len(o) == len(overflows[0]) and np.array_equal(o, overflows[0]) for o in overflows):
        _shade_overflows(ax, overflows[0])
    if band is not None:
        lo, hi = band
        ax.axhspan(math.log2(lo), math.log2(hi), color=ZONE_COLORS["normal"], alpha=0.12,
                   label="scales that lose nothing")
    if ceiling is not None:
        ax.plot(_log2(ceiling), color="k", lw=0.8, ls=":", label="overflow above this")
    for k, (label, t) in enumerate(items.items()):
        steps = np.arange(len(t))
        y = _log2(t.scales)
        line, = ax.step(steps, y, where="post", lw=1.4, label=label, zorder=3 + k, color=color)
        skipped = np.flatnonzero(t.skipped)
        ax.plot(skipped, y[skipped], "x", color=line.get_color(), ms=5, zorder=3 + k)
        poisoned = np.flatnonzero(t.poisoned)
        if poisoned.size:
            ax.plot(poisoned, y[poisoned], "o", mfc="none", color=ZONE_COLORS["overflow"], ms=6, zorder=3 + k)
        if t.stopped_at is not None:
            ax.annotate("stops: exception", (t.stopped_at, y[-1]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7, color=ZONE_COLORS["overflow"])
    ax.grid(alpha=0.3)


def _scales(name: str, values) -> np.ndarray:
    """A 1-D sequence of scales > 0, one per step (inf: no limit), as float64."""
    try:
        a = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name} must be a sequence of numbers > 0, one per step; got {shown(values)}") from None
    if a.ndim != 1 or a.size == 0 or not np.all(a > 0):  # NaN is not > 0
        raise ValueError(f"{name} must be a 1-D sequence of numbers > 0 (inf: no limit), one per step; "
                         f"got {shown(values)}")
    return a


def _band(band) -> tuple[float, float]:
    """(lo, hi) of a ScaleRange, or a pair 0 < lo <= hi."""
    if isinstance(band, ScaleRange):
        return band.lo, band.hi
    if not isinstance(band, (tuple, list)) or len(band) != 2:
        raise TypeError(f"band must be a ScaleRange or a pair (lo, hi); got {shown(band)}")
    lo = number("band's lo", band[0], minimum=0, inclusive=False)
    return lo, number("band's hi", band[1], minimum=lo)


def _xlim(xlim) -> tuple[float, float]:
    if not isinstance(xlim, (tuple, list)) or len(xlim) != 2:
        raise TypeError(f"xlim must be a pair (lo, hi) of log2 values; got {shown(xlim)}")
    lo = number("xlim's lo", xlim[0])
    return lo, number("xlim's hi", xlim[1], minimum=lo, inclusive=False)


def _shade_overflows(ax, overflows) -> None:
    """Shade every run of overflow steps, full height, as ONE artist (a PathPatch, gid "overflow").

    One ``axvspan`` per overflow step made a 100,000-step pattern take minutes to draw; a
    collection of rectangles is still slow to place the legend around (matplotlib tests
    each rectangle in Python). Here each run of consecutive overflows is one closed
    rectangle of a single compound path, built with numpy. Past MAX_SPANS runs, gaps
    narrower than 1/MAX_SPANS of the steps (a fraction of a pixel) are closed, so that at
    most about 2 * MAX_SPANS rectangles are drawn whatever the length.
    """
    flags = np.asarray(overflows, dtype=np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags, [0]))))
    if edges.size == 0:
        return
    starts, stops = edges[::2], edges[1::2]  # a run covers steps starts[i] .. stops[i] - 1
    if starts.size > MAX_SPANS:  # close the gaps too narrow to see: under 1/MAX_SPANS of the x axis
        wide = starts[1:] - stops[:-1] >= flags.size / MAX_SPANS
        starts, stops = starts[np.concatenate(([True], wide))], stops[np.concatenate((wide, [True]))]
    x0, x1 = starts - 0.5, stops - 0.5
    vertices = np.zeros((x0.size, 5, 2))
    vertices[:, :, 0] = np.column_stack([x0, x0, x1, x1, x0])
    vertices[:, :, 1] = [0, 1, 1, 0, 0]  # y in axes coordinates: bottom to top
    codes = np.tile([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY], x0.size)
    shading = PathPatch(Path(vertices.reshape(-1, 2), codes), facecolor=ZONE_COLORS["overflow"], alpha=0.12,
                        lw=0, gid="overflow", transform=ax.get_xaxis_transform())
    ax.add_artist(shading)  # not add_patch: its limit update walks the path segment by segment
    ax.update_datalim([(x0[0], 0), (x1[-1], 0)], updatey=False)


def _new_figure(size):
    fig = plt.figure(figsize=size, layout="constrained", dpi=90)
    plt.close(fig)  # the caller shows it (a notebook: as the cell's value)
    return fig


def _figure(ax, size):
    from matplotlib.axes import Axes

    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes to draw into, or None for a new figure; got {type(ax).__name__}")
    if ax is not None:
        return ax.figure, ax
    fig = _new_figure(size)
    return fig, fig.add_subplot()


def _groups(values) -> dict:
    layers = getattr(values, "layers", None)
    if isinstance(layers, dict):
        acts = [v for k, v in layers.items() if k.startswith("grad(")]
        weights = [v for k, v in layers.items() if not k.startswith("grad(")]
        groups = {}
        if weights:
            groups["weight gradients"] = np.concatenate(weights)
        if acts:
            groups["activation gradients"] = np.concatenate(acts)
        return groups
    if isinstance(values, dict):
        return {k: gradient_values(v) for k, v in values.items()}
    return {"gradients": gradient_values(values)}


def plot_gradient_histogram(values, scale: float = 1.0, formats=DEFAULT_FORMATS, *, bins: int = 80,
                            xlim: tuple[float, float] | None = None):
    """Histogram of log2|g * S| against each format's zones: lost, subnormal, normal, overflow.

    ``values``: a GradientRecord (weight and activation gradients stacked), {label: array},
    or one array. Exact zeros are left out (their share is in the title). Below the
    histogram, one bar per format shows where its zones lie and what share of the values
    lands in each (computed by exact rounding, ``fractions``).
    """
    fmts = [lf.get(f) for f in names("formats", formats)]
    if not fmts:
        raise ValueError("formats must name at least one format, e.g. ('fp16',)")
    bins = integer("bins", bins, minimum=1, maximum=100_000)
    xlim = None if xlim is None else _xlim(xlim)
    groups = _groups(values)
    pooled = np.concatenate([g.ravel() for g in groups.values()])
    s = check_scale(scale)
    nonzero = np.abs(pooled[pooled != 0])
    if nonzero.size == 0:
        raise ValueError("values are all exactly zero: a log2|g| histogram needs at least one nonzero gradient")
    zeros = 1 - nonzero.size / pooled.size
    log2_s = math.log2(s)  # added in the log domain: |g| * S itself may round to 0 (S = 2**-1074) or overflow
    x = np.log2(nonzero) + log2_s
    if xlim is None:
        lo = min(x.min(), *(math.log2(f.smallest_subnormal) for f in fmts if f.exponent_bits < 8)) - 2
        hi = max(x.max(), *(math.log2(f.max) for f in fmts if f.exponent_bits < 8)) + 2
        xlim = (math.floor(lo), math.ceil(hi))
    fig = _new_figure((10.5, 3.2 + 0.45 * len(fmts)))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 0.45 * len(fmts) + 0.3])
    edges = np.linspace(*xlim, bins + 1)
    data = [np.log2(np.abs(g[g != 0])) + log2_s for g in groups.values()]
    weights = [np.full(d.size, 100.0 / x.size) for d in data]
    colors = ["#457b9d", "#e9c46a", "#8ab17d", "#e76f51"]
    top.hist(data, bins=edges, weights=weights, stacked=True, label=list(groups),
             color=[colors[i % len(colors)] for i in range(len(data))])
    top.set_ylabel("% of nonzero values")
    top.set_title(f"log2|gradient x S|, S = {_pow2(s)}  ({100 * zeros:.1f}% of values are exactly 0, not shown)",
                  fontsize=10)
    first = fmts[0]
    for v, name in ((first.smallest_subnormal, "smallest subnormal"), (first.smallest_normal, "smallest normal"),
                    (first.max, "max")):
        top.axvline(math.log2(v), color="k", lw=0.8, ls="--")
        top.text(math.log2(v), 0.97, f"{first.name} {name} ", rotation=90, ha="right", va="top", fontsize=7,
                 transform=top.get_xaxis_transform(), bbox=dict(fc="white", alpha=0.7, lw=0, pad=0.5))
    # outside the axes, right: inside, it would hide a format's edge label or the histogram for some S
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    top.grid(alpha=0.3)
    for row, f in enumerate(fmts):
        y = len(fmts) - 1 - row
        sub, norm, mx = (math.log2(v) for v in (f.smallest_subnormal, f.smallest_normal, f.max))
        zones = {"lost": (xlim[0], sub - 1), "subnormal": (sub - 1, norm), "normal": (norm, mx),
                 "overflow": (mx, xlim[1])}
        for zone, (a, b) in zones.items():
            a, b = max(a, xlim[0]), min(b, xlim[1])
            if b > a:
                bottom.broken_barh([(a, b - a)], (y - 0.4, 0.8), color=ZONE_COLORS[zone])
        fr = fractions(pooled, f, s)
        text = f"lost {100 * fr.lost:.1f}%  sub {100 * fr.subnormal:.1f}%  over {100 * fr.overflow:.1f}%"
        # in the margin to the right of the strip, never on its red overflow zone
        bottom.text(1.01, y, text, ha="left", va="center", fontsize=7.5,
                    transform=bottom.get_yaxis_transform())
    bottom.set_yticks(range(len(fmts)), [f.name for f in reversed(fmts)], fontsize=8)
    bottom.set_xlim(*xlim)
    bottom.set_xlabel("log2 |value|   (grey: rounds to 0, orange: subnormal, green: normal, red: overflows)")
    return fig


def plot_fp8(traces: dict, *, title: str | None = None):
    """Per step: the scale used (log2), and the % of elements saturated and flushed to zero.

    ``traces``: {label: Fp8Trace}. The black dotted line on the scale panel is the ideal,
    just-in-time scale ``fp8_max / amax`` of each distinct tensor (drawn once, on top: current
    scaling, which uses exactly that scale, lies under it).
    """
    if not isinstance(traces, dict):
        raise TypeError(f"traces must be a dict {{label: Fp8Trace}}; got {type(traces).__name__}")
    if not traces:
        raise ValueError("traces is empty: give {label: Fp8Trace}, e.g. {'delayed': fp8.delayed_scaling(xs)}")
    for label, t in traces.items():
        if not isinstance(t, Fp8Trace):
            raise TypeError(f"traces must hold Fp8Trace objects (from fp8.delayed_scaling / current_scaling); "
                            f"{label!r} is {type(t).__name__}")
    fig = _new_figure((9, 5.6))
    ax_scale, ax_sat, ax_und = fig.subplots(3, 1, sharex=True)
    ideals = []  # one dotted line per distinct tensor: traces of the same tensor share it
    for label, t in traces.items():
        steps = np.arange(len(t.scales))
        line, = ax_scale.step(steps, _log2(t.scales), where="mid", lw=1.3, label=label)
        ideal = _log2(lf.get(t.format).max / np.where(t.amax > 0, t.amax, np.nan))
        if not any(len(i) == len(ideal) and np.array_equal(i, ideal, equal_nan=True) for i in ideals):
            ideals.append(ideal)
        ax_sat.plot(steps, 100 * t.saturated, lw=1.2, color=line.get_color(), label=label)
        ax_und.plot(steps, 100 * t.underflow, lw=1.2, color=line.get_color(), label=label)
    for k, ideal in enumerate(ideals):  # black and on top: it coincides with current scaling's line
        ax_scale.step(np.arange(len(ideal)), ideal, ":", where="mid", color="k", lw=1.6, zorder=5,
                      label="fp8_max / this step's amax" if k == 0 else None)
    ax_scale.set_ylabel("log2(scale)")
    ax_scale.set_title(title or "Per-tensor FP8 scaling (black dotted: fp8_max / this step's amax)", fontsize=10)
    ax_scale.legend(fontsize=8, ncol=2)
    ax_sat.set_ylabel("% saturated")
    ax_und.set_ylabel("% flushed to 0")
    ax_und.set_xlabel("step")
    for ax in (ax_scale, ax_sat, ax_und):
        ax.grid(alpha=0.3)
    return fig
