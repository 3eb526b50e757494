"""What `labkit bench` shows of its records: a progress line per cell, the table, the step-time figure.

>>> _duration(75)
'1 min 15 s'
"""

from __future__ import annotations

from labkit._validate import integer, number, out_path, shown
from labkit.table import Table


def progress_line(rec: dict, index: int | None = None, total: int | None = None, left_s: float | None = None) -> str:
    """One line for a finished cell: "[index/total] what, its time, speed-up and status (time left)"."""
    (rec,) = _records([rec], "rec")
    if index is not None:
        index = integer("index", index, minimum=0)
    if total is not None:
        total = integer("total", total, minimum=1)
    if left_s is not None:
        left_s = number("left_s", left_s, minimum=0)
    head = f"[{index}/{total}] " if index else ""
    name = f"{rec['framework']:5} {rec['model']:11} {rec['precision']:9} b={rec['batch_size']} w={rec['width']}"
    eta = f"  (about {_duration(left_s)} left)" if left_s else ""
    if rec["status"] in ("skipped", "emulated"):
        return f"{head}{name}  {rec['status']}: {rec['reason']}{eta}"
    speed = f"x{rec['speedup_vs_fp32']:.2f}" if rec.get("speedup_vs_fp32") else "  -  "
    mfu = f"  MFU {100 * rec['mfu']:.1f}%" if rec.get("mfu") else ""
    return (f"{head}{name}  {rec['step_time_s'] * 1e3:9.2f} ms/step  {speed}  "
            f"{rec['achieved_tflops'] * 1e3:.1f} GFLOP/s{mfu}  {rec['status']}{eta}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


_KEYS = {
    None: ("framework", "model", "precision", "batch_size", "width", "status", "activation_bytes_model"),
    "ok": ("step_time_s", "samples_per_s", "achieved_tflops", "activation_bytes", "final_loss"),
    "emulated": ("emulated_slowdown", "small_batch_size", "small_width", "reason"),
    "skipped": ("reason",),
}


def _records(records, what: str = "records") -> list[dict]:
    """`bench` records: a list of dicts, each with the keys its status needs (a clear error otherwise)."""
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"{what} must be a list of the dicts labkit.bench.bench returns; got "
                        f"{type(records).__name__} {shown(records)}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TypeError(f"{what} must be dicts, as labkit.bench.bench returns them; got {shown(r)}")
        status = r.get("status")
        if status not in ("ok", "emulated", "skipped"):
            raise ValueError(f"{what}[{i}] has status {shown(status)}; a bench record's is 'ok', 'emulated' or "
                             "'skipped'")
        missing = [k for k in _KEYS[None] + _KEYS[status] if k not in r]
        if missing:
            raise ValueError(f"{what}[{i}] lacks {', '.join(map(repr, missing))} (labkit.bench.bench records have it)")
    return list(records)


def table(records: list[dict]) -> Table:
    """The records as a Table (one row per cell). "here" says whether this device runs the
    precision natively or emulates it (`labkit.hardware.native_precision`). An emulated cell
    is timed at full size when that fits its budget (status ok), else only at a small size
    (status "timed small"), and then its "vs fp32" is the slowdown at that size. A skipped
    cell's note says why."""
    rows = []
    for r in _records(records):
        act = f"({_mb(r['activation_bytes_model'])})"
        head = (r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]), _here(r))
        if r["status"] == "skipped":
            rows.append((*head, "skipped", "", "", "", "", act, "", r["reason"]))
            continue
        if r["status"] == "emulated":
            where = f"batch {r['small_batch_size']}, width {r['small_width']}"
            rows.append((*head, "timed small", "", "", f"{_versus(1.0, r['emulated_slowdown'])} (at {where})", "", act,
                         "", f"the full size does not fit the cell's time budget: timed at {where} only"))
            continue
        rows.append((
            *head, r["status"],
            f"{r['step_time_s'] * 1e3:.2f}", f"{r['samples_per_s']:.0f}",
            f"{r['speedup_vs_fp32']:.2f}x" if r.get("speedup_vs_fp32") else "-",
            f"{r['achieved_tflops'] * 1e3:.1f}" + (f" ({100 * r['mfu']:.0f}% MFU)" if r.get("mfu") else ""),
            _mb(r["activation_bytes"]) if r["activation_bytes"] is not None else act,
            f"{r['final_loss']:.3f}", "",
        ))
    cols = ("framework", "model", "precision", "batch", "width", "here", "status", "ms/step", "samples/s",
            "vs fp32", "GFLOP/s", "activations MB", "final loss", "note")
    return Table(cols, tuple(rows), "labkit bench (activation MB in parentheses: modelled, not measured)")


def _here(rec: dict) -> str:
    """"native" or "emulated", as the bench found it; "" where the cell never got that far."""
    native = rec.get("native")
    return "" if native is None else "native" if native else "emulated"


def _versus(base: float, t: float) -> str:
    """A time `t` against a baseline time, in words: "3.1x faster", "2.0x slower", or "as fast"
    within 5% of the baseline's speed -- the one reading of a 16-bit time against fp32's that
    `table` (an emulated cell's slowdown) and `emulation_table` print.

    >>> _versus(1.0, 3.5), _versus(1.2, 1.0), _versus(1.0, 1.02)
    ('3.5x slower', '1.2x faster', 'as fast')
    """
    r = base / t
    return "as fast" if 0.95 <= r <= 1.05 else f"{r:.1f}x faster" if r > 1 else f"{t / base:.1f}x slower"


def _mb(n) -> str:
    return f"{n / 1e6:.2f}"


def plot_suffixes() -> tuple[str, ...]:
    """The file suffixes `plot` can save to: what matplotlib's canvas supports (".png", ".svg", ".pdf", ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{k}" for k in sorted(FigureCanvasBase.get_supported_filetypes()))


def plot(records: list[dict], path: str | None = None):
    """Step time of every finished cell, with its spread: the median (the dot, the figure the
    tables use), the interquartile range of the timed steps (the thick bar) and their minimum to
    maximum (the thin whisker); each cell's speed-up over fp32 is written above it. (PyTorch's
    timer times blocks of steps; its spread is that of the blocks' means.) Records without a
    spread (from an older labkit) show the median only. Saved to `path` if given (its suffix one
    of `plot_suffixes()`: checked before drawing). Returns the Figure."""
    records = _records(records)
    if path is not None:
        path = out_path("path", path, suffixes=plot_suffixes())
    import matplotlib.pyplot as plt

    done = [r for r in records if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(max(5, 0.75 * len(done) + 2), 3.6), dpi=90)
    colors = {"fp32": "#4C78A8", "tf32": "#72B7B2", "fp16": "#F58518", "bf16": "#54A24B", "bf16-pure": "#B279A2"}
    ms = 1e3
    top = max([r.get("step_time_max_s", r["step_time_s"]) for r in done] or [1.0]) * ms
    for i, r in enumerate(done):
        c = colors.get(r["precision"], "#888888")
        med = r["step_time_s"] * ms
        if "step_time_min_s" in r:
            ax.vlines(i, r["step_time_min_s"] * ms, r["step_time_max_s"] * ms, color=c, lw=1.2)
            ax.vlines(i, r["step_time_q1_s"] * ms, r["step_time_q3_s"] * ms, color=c, lw=7, alpha=0.55)
        ax.plot([i], [med], "o", color=c, ms=6, mec="k", mew=0.6)
        if r.get("speedup_vs_fp32") and r["precision"] != "fp32":
            ax.text(i, top * 1.04, f"{r['speedup_vs_fp32']:.2f}x", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(0, top * 1.18)
    ax.set_xticks(range(len(done)), [f"{r['framework']}\n{r['model']}\n{r['precision']}" for r in done], fontsize=9)
    ax.set_xlim(-0.6, len(done) - 0.4)
    ax.set_ylabel("ms per step", fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_title("Step time: median (dot), interquartile range (bar), min-max (whisker) of the timed steps;\n"
                 "speed-up of the median over fp32 above each cell", fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path)
    plt.close(fig)
    return fig


__all__ = ["plot", "plot_suffixes", "progress_line", "table"]
