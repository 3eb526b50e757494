"""Where a training step's memory goes, modelled next to measured: tables and figures.

The parts and how each side counts them are in `labkit.memory.breakdown`; every function here
takes the records `labkit.bench.bench` (or `labkit.claims.run_records`) returns.

>>> label_offsets(2)
[-5.0, 5.0]
"""

from __future__ import annotations

from labkit._validate import integer, shown
from labkit.memory.activations import counts
from labkit.memory.breakdown import LABELS, SEGMENTS, Breakdown, measured, modelled, total_bytes
from labkit.table import Table

COLORS = {"weights": "#4C78A8", "master_weights": "#9ECAE9", "gradients": "#F58518", "optimizer_states": "#E45756",
          "weight_copies": "#B279A2", "activations": "#54A24B", "step_temporaries": "#BAB0AC"}

FONT = {"small": 10, "label": 11, "title": 11}
"""Font sizes (pt) of the figures: legible when the notebook shows them at its width."""


def _dpi(dpi) -> int:
    return integer("dpi", dpi, minimum=10, maximum=1000)


def _record_pair(rec: dict) -> tuple[Breakdown, Breakdown]:
    for key in ("framework", "model", "precision", "batch_size", "width", "memory"):
        if key not in rec:
            raise ValueError(f"a benchmark record needs {key!r} (labkit.bench.bench records have it)")
    return (modelled(rec["model"], rec["batch_size"], rec["precision"], rec["width"]),
            measured(rec["framework"], rec["memory"]))


def _ok(records) -> list[dict]:
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"records must be a list of the dicts labkit.bench.bench returns; got "
                        f"{type(records).__name__} {shown(records)}")
    if not all(isinstance(r, dict) for r in records):
        raise TypeError("records must be dicts, as labkit.bench.bench returns them")
    return [r for r in records if r.get("status") == "ok" and r.get("memory") is not None]


def _mb(n) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f}"


def memory_table(records, sources=("modelled", "measured")) -> Table:
    """Modelled and/or measured bytes (MB) of each finished record, part by part."""
    if isinstance(sources, str):
        sources = (sources,)
    if not isinstance(sources, (list, tuple)):
        raise TypeError(f"sources must name 'modelled' and/or 'measured', got {type(sources).__name__} "
                        f"{shown(sources)}")
    if not sources or any(s not in ("modelled", "measured") for s in sources):
        raise ValueError(f"sources must name 'modelled' and/or 'measured', got {shown(tuple(sources))}")
    rows = []
    for rec in _ok(records):
        for b in _record_pair(rec):
            if b.source not in sources:
                continue
            rows.append((rec["framework"], rec["model"], rec["precision"], str(rec["batch_size"]), b.source,
                         *(_mb(b.parts[k]) for k in SEGMENTS), _mb(b.total), _mb(b.peak)))
    cols = ("framework", "model", "precision", "batch", "source", *(LABELS[k] for k in SEGMENTS), "total", "peak")
    return Table(cols, tuple(rows), "Memory of one training step, MB (n/a: not measurable here)")


_WHY = {  # part -> what the model leaves out of it
    "optimizer_states": "Adam's step counters, 4 B x {n} tensors",
    "activations": "nll_loss's total-weight scalar, 4 B",
}


def difference_table(records) -> Table:
    """Measured minus modelled bytes, part by part, for each finished PyTorch record, and what
    the model leaves out. (JAX and TensorFlow split their memory differently; see `measured`.)"""
    rows = []
    for rec in _ok(records):
        if rec.get("framework") != "torch":
            continue
        model, meas = _record_pair(rec)
        tensors = counts(rec["model"], rec["width"])[2]
        diffs = {k: meas.parts[k] - model.parts[k] for k in SEGMENTS if meas.parts[k] is not None}
        notes = []
        for k, d in diffs.items():
            if d and k == "optimizer_states" and d == 4 * tensors:
                notes.append(_WHY[k].format(n=tensors))
            elif d and k == "activations" and d == 4:
                notes.append(_WHY[k])
            elif d:
                notes.append(f"{LABELS[k]}: {d:+d} B unexplained")
        rows.append((rec["model"], rec["precision"], *(f"{diffs[k]:+d}" if k in diffs else "n/a" for k in SEGMENTS[:6]),
                     "; ".join(notes) or "none"))
    if not rows:
        raise ValueError("difference_table needs finished PyTorch records (framework 'torch')")
    return Table(("model", "precision", *(LABELS[k] for k in SEGMENTS[:6]), "what the model leaves out"), tuple(rows),
                 "Measured minus modelled bytes (PyTorch)")


def memory_figure(records, title: str = "", dpi: int = 100):
    """Stacked bars per finished record: modelled (left, hatched) and measured (right).

    A measured part that cannot be read here is left out and the bar is labelled; a
    GPU allocator peak is drawn as a black tick. Returns the Figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    recs = _ok(records)
    dpi = _dpi(dpi)
    if not isinstance(title, str):
        raise TypeError(f"title must be a string; got {type(title).__name__} {shown(title)}")
    if not recs:
        raise ValueError("memory_figure needs at least one finished record with a memory dict")
    frameworks = {r["framework"] for r in recs}
    fig, ax = plt.subplots(figsize=(min(9.0, max(5.5, 1.4 * len(recs) + 3.4)), 4.0), dpi=dpi)
    ticks, labels, groups, top = [], [], [], 0.0
    for i, rec in enumerate(recs):
        for j, b in enumerate(_record_pair(rec)):
            x = 3 * i + j
            bottom = 0.0
            for seg in SEGMENTS:
                v = b.parts[seg]
                if v:
                    ax.bar(x, v / 1e6, bottom=bottom, color=COLORS[seg], width=0.85, edgecolor="white",
                           hatch="//" if b.source == "modelled" else None, linewidth=0.5)
                    bottom += v / 1e6
            text = f"{b.total / 1e6:.1f}" if b.total is not None else "no\nactivations"
            ax.text(x, bottom, text, ha="center", va="bottom", fontsize=FONT["small"])
            if b.peak is not None:
                ax.plot([x - 0.45, x + 0.45], [b.peak / 1e6] * 2, color="k", lw=2)
                bottom = max(bottom, b.peak / 1e6)
            top = max(top, bottom)
            ticks.append(x)
            labels.append("model" if b.source == "modelled" else "meas.")
        name = f"{rec['framework']} " if len(frameworks) > 1 else ""
        groups.append((3 * i + 0.5, f"{name}{rec['precision']}"))  # one name under each pair of bars
    ax.set_xticks(ticks, labels, fontsize=FONT["small"])
    for x, name in groups:
        ax.annotate(name, (x, 0), xycoords=ax.get_xaxis_transform(), xytext=(0, -22), textcoords="offset points",
                    ha="center", va="top", fontsize=FONT["small"])
    ax.tick_params(axis="y", labelsize=FONT["small"])
    ax.set_ylim(0, 1.18 * top)
    ax.set_ylabel("MB", fontsize=FONT["label"])
    first = recs[0]
    ax.set_title(title or f"{first['model']}, batch {first['batch_size']}, width {first['width']}: "
                 "memory of one step (hatched: modelled)", fontsize=FONT["title"])
    used = [s for s in SEGMENTS if any(b.parts[s] for r in recs for b in _record_pair(r))]
    handles = [Patch(color=COLORS[s], label=LABELS[s]) for s in used]
    ax.legend(handles=handles, fontsize=FONT["small"], frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    plt.close(fig)
    return fig


def _by_batch(records) -> tuple[dict, dict]:
    recs = _ok(records)
    groups = {(r["framework"], r["model"], r["width"]) for r in recs}
    if len(groups) != 1:
        raise ValueError(f"batch_figure takes records of one framework, model and width; got {sorted(groups)}")
    base = {r["batch_size"]: r for r in recs if r["precision"] == "fp32"}
    cand: dict[str, dict[int, dict]] = {}
    for r in recs:
        if r["precision"] != "fp32" and r["batch_size"] in base:
            cand.setdefault(r["precision"], {})[r["batch_size"]] = r
    if not cand:
        raise ValueError("batch_figure needs fp32 records and 16-bit records at the same batch sizes")
    return base, cand


def batch_figure(records, dpi: int = 100, speed: bool = True):
    """How batch size changes the picture: speed-up over fp32 (left) and memory relative to
    fp32 (right, measured points and modelled line) at each batch size, with seed 004's
    claims (2-3x, 50%) drawn in. ``speed=False`` draws the memory alone (for records whose
    step times are not a measurement, such as one-step runs). Returns the Figure."""
    import matplotlib.pyplot as plt

    dpi = _dpi(dpi)
    if not isinstance(speed, bool):
        raise TypeError(f"speed must be True or False; got {type(speed).__name__} {shown(speed)}")
    base, cand = _by_batch(records)
    first = next(iter(base.values()))
    if speed:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=dpi)
        ax.axhspan(2, 3, color="#54A24B", alpha=0.15, label="seed 004: 2-3x")
        ax.axhline(1, color="k", lw=0.8)
    else:
        fig, bx = plt.subplots(1, 1, figsize=(5.6, 3.8), dpi=dpi)
    bx.axhline(0.5, color="#54A24B", lw=1.5, alpha=0.6, label="seed 004: 50% saved")
    bx.axhline(1, color="k", lw=0.8)
    speeds_at: dict[int, list[tuple[float, int]]] = {}
    for i, (prec, recs) in enumerate(sorted(cand.items())):
        bs = sorted(recs)
        if speed:
            speeds = [base[b]["step_time_s"] / recs[b]["step_time_s"] for b in bs]
            ax.plot(bs, speeds, "o-", color=f"C{i}", label=prec)
            for b, s in zip(bs, speeds):
                speeds_at.setdefault(b, []).append((s, i))
        ratio = [_ratio(first["framework"], recs[b], base[b]) for b in bs]
        pts = [(b, r) for b, r in zip(bs, ratio) if r is not None]
        if pts:
            bx.plot(*zip(*pts), "o", color=f"C{i}", label=f"{prec} measured")
        model = [modelled(first["model"], b, prec, first["width"]).total
                 / modelled(first["model"], b, "fp32", first["width"]).total for b in bs]
        bx.plot(bs, model, "--", color=f"C{i}", label=f"{prec} modelled")
    for b, points in speeds_at.items():  # labels never overlap: per batch, stacked apart above and below
        for (s, i), dy in zip(sorted(points), label_offsets(len(points))):
            ax.annotate(f"{s:.1f}x", (b, s), textcoords="offset points", xytext=(0, dy), ha="center",
                        va="bottom" if dy > 0 else "top", fontsize=FONT["small"], color=f"C{i}")
    batches = sorted({b for recs in cand.values() for b in recs})
    for a, where in ((ax, "upper left"), (bx, "lower center")) if speed else ((bx, "lower center"),):
        a.set_xscale("log", base=2)
        a.set_xticks(batches, [str(b) for b in batches], fontsize=FONT["small"])
        a.tick_params(axis="y", labelsize=FONT["small"])
        a.minorticks_off()
        a.set_xlabel("batch size", fontsize=FONT["label"])
        a.grid(alpha=0.3)
        a.legend(fontsize=FONT["small"], frameon=False, loc=where, ncol=2 if a is bx else 1)  # under the 50% line
    if speed:
        ax.set_ylim(0, max(4.2, 1.3 * max(s for points in speeds_at.values() for s, _ in points)))  # room for the legend
        ax.set_ylabel("speed-up vs fp32", fontsize=FONT["label"])
        ax.set_title(f"{first['framework']} {first['model']} (width {first['width']}): speed", fontsize=FONT["title"])
    bx.set_ylim(0, 1.3)
    bx.set_ylabel("memory / fp32's memory", fontsize=FONT["label"])
    bx.set_title("memory of one step\n(weights, gradients, Adam, activations)", fontsize=FONT["title"])
    fig.tight_layout()
    plt.close(fig)
    return fig


def label_offsets(n: int, gap: float = 11.0) -> list[float]:
    """Vertical offsets (points) for `n` labels at one x, ordered by value from lowest: the lower
    half goes below its point, the upper half above, each label `gap` points from the next, so
    two values that nearly coincide get labels that do not.

    >>> label_offsets(1), label_offsets(2), label_offsets(3)
    ([5.0], [-5.0, 5.0], [-5.0, 5.0, 16.0])
    """
    below = n // 2
    return [-(5.0 + gap * (below - 1 - k)) for k in range(below)] + [5.0 + gap * k for k in range(n - below)]


def _ratio(framework: str, rec: dict, base: dict) -> float | None:
    a, _ = total_bytes(framework, rec["memory"])
    b, _ = total_bytes(framework, base["memory"])
    return a / b if a is not None and b else None


__all__ = ["COLORS", "FONT", "batch_figure", "difference_table", "memory_figure", "memory_table"]
