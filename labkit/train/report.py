"""Runs side by side: one table and one figure for RunResults of any framework.

>>> from labkit.train import RunConfig, RunResult
>>> r = RunResult(RunConfig("torch", steps=3), losses=[2.3, 2.0, 1.8], step_times=[0.5, 0.01, 0.01],
...               status="ok", metric={"name": "accuracy", "value": 0.5})
>>> print(run_table([r]))
run   status  final loss  accuracy  skipped  median step ms  samples/s  params KiB  opt state KiB  state B/param
----  ------  ----------  --------  -------  --------------  ---------  ----------  -------------  -------------
fp32  ok      1.8000      0.500     0        10.00           6400       -           -              -
"""

from __future__ import annotations

import math

import numpy as np

from labkit.table import Table


def _kib(n) -> str:
    return "-" if n is None else f"{n / 1024:.0f}"


def _state_bytes_per_param(r) -> str:
    from labkit.train.models import count_params, init_params

    keys = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes")
    if not all(k in r.memory for k in keys):
        return "-"
    n = count_params(init_params(r.config.model, width=r.config.width))
    return f"{sum(r.memory[k] for k in keys) / n:.1f}"


def run_table(results, labels=None) -> Table:
    """One row per run: status, final loss, accuracy, skipped steps, median step time
    (the first step -- compilation, warm-up -- left out), samples/s, the parameter and
    optimizer-state bytes the framework reported, and model-state bytes per parameter
    (weights + gradients + optimizer states: 16 for Adam in fp32 and under autocast)."""
    results = list(results)
    labels = list(labels) if labels is not None else [r.config.precision for r in results]
    if len(labels) != len(results):
        raise ValueError(f"{len(labels)} labels for {len(results)} runs")
    rows = []
    for label, r in zip(labels, results):
        t = r.median_step_time()
        ok = t > 0 and math.isfinite(t)
        rows.append((
            label, r.status, f"{r.final_loss:.4f}", f"{r.metric['value']:.3f}" if r.metric else "-",
            str(sum(r.skipped)), f"{1e3 * t:.2f}" if ok else "-", f"{r.config.batch_size / t:.0f}" if ok else "-",
            _kib(r.memory.get("parameter_bytes")), _kib(r.memory.get("optimizer_state_bytes")),
            _state_bytes_per_param(r),
        ))
    cols = ("run", "status", "final loss", "accuracy", "skipped", "median step ms", "samples/s",
            "params KiB", "opt state KiB", "state B/param")
    return Table(cols, tuple(rows))


_STYLES = (("-", 2.6), ("--", 1.8), (":", 2.2), ("-.", 1.4))  # curves that coincide stay visible


def plot_runs(results, labels=None, title: str = "", smooth: int = 1, dpi: int = 80):
    """Loss curves overlaid (left) and median step time per run (right); returns the Figure.

    `smooth` > 1 draws a moving average over that many steps. Steps whose update was
    skipped (fp16 overflows) are marked with an x. The loss axis is logarithmic when the
    curves span more than a factor of 10. The default title names the framework, model, batch
    size and learning rate (two plots of the same model at different rates must not look alike).
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    results = list(results)
    if not results:
        raise ValueError("plot_runs needs at least one RunResult")
    labels = list(labels) if labels is not None else [r.config.precision for r in results]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=dpi, gridspec_kw={"width_ratios": [3, 2]})
    lows, highs = [], []
    for i, (label, r) in enumerate(zip(labels, results)):
        losses = np.asarray(r.losses, dtype=float)
        k = max(1, min(smooth, len(losses)))
        curve = np.convolve(losses, np.ones(k) / k, mode="valid") if len(losses) else losses
        ls, lw = _STYLES[i % len(_STYLES)]
        ax.plot(np.arange(k - 1, k - 1 + len(curve)), curve, ls, lw=lw, color=f"C{i}",
                label=f"{label}" + ("" if r.status == "ok" else f" ({r.status})"))
        skipped = [s for s, skip in enumerate(r.skipped) if skip and np.isfinite(losses[s])]
        ax.plot(skipped, losses[skipped], "x", color=f"C{i}", ms=6)
        finite = curve[np.isfinite(curve)]
        if finite.size:
            lows.append(finite.min())
            highs.append(finite.max())
    if lows and min(lows) > 0 and max(highs) / min(lows) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    cfg = results[0].config
    ax.set(xlabel="step", ylabel="training loss" + (f" ({smooth}-step mean)" if smooth > 1 else ""),
           title=title or f"{cfg.framework} {cfg.model}, batch {cfg.batch_size}, "
                          f"lr {'/'.join(sorted({f'{r.config.lr:g}' for r in results}))}")
    ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    times = [1e3 * r.median_step_time() for r in results]
    bx.barh(labels, [t if math.isfinite(t) else 0 for t in times], color=[f"C{i}" for i in range(len(results))])
    bx.invert_yaxis()
    bx.set(xlabel="median step time (ms)", title="speed on this machine")
    finite_t = [t for t in times if math.isfinite(t)]
    if finite_t:
        bx.set_xlim(0, 1.3 * max(finite_t))
    for i, t in enumerate(times):
        if math.isfinite(t):
            bx.text(t, i, f" {t:.2f}", va="center", fontsize=8)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def loss_gap(a, b) -> float:
    """The largest difference between two runs' losses, step by step: how far a sharded (or
    otherwise changed) run strays from its reference. The runs must have run the same steps."""
    from labkit.train.result import RunResult

    if not (isinstance(a, RunResult) and isinstance(b, RunResult)):
        raise TypeError(f"loss_gap takes two RunResults, got {type(a).__name__} and {type(b).__name__}")
    if len(a.losses) != len(b.losses) or not a.losses:
        raise ValueError(f"loss_gap compares runs of the same steps; got {len(a.losses)} and {len(b.losses)} losses")
    return max(abs(x - y) for x, y in zip(a.losses, b.losses))
