"""Runs side by side: tables and a figure for RunResults of any framework, on one device or several.

`run_table` and `plot_runs` compare runs; `step_time_table`, `gather_table` and
`zero_memory_table` read what a multi-device run adds (its engine, collectives and ZeRO memory).

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

from labkit._validate import choice, integer, shown
from labkit.memory import MemoryReport, param_count
from labkit.table import Table
from labkit.train.config import TORCH_PRECISIONS
from labkit.train.result import STEP_TIMES, RunResult


def _kib(n) -> str:
    return "-" if n is None else f"{n / 1024:.0f}"


def _state_bytes_per_param(r) -> str:
    m = MemoryReport.from_dict(r.config.framework, r.memory)
    states = (m.parameter_bytes, m.gradient_bytes, m.optimizer_state_bytes)
    if None in states:
        return "-"
    return f"{sum(states) / param_count(r.config.model, r.config.width):.1f}"


def _runs(results) -> list:
    """A list of RunResults from any iterable of them (not a string, not one RunResult alone)."""
    if isinstance(results, (str, bytes, dict, RunResult)) or not hasattr(results, "__iter__"):
        raise TypeError(f"results must be a list of RunResults; got {type(results).__name__} {shown(results)}")
    results = list(results)
    for r in results:
        if not isinstance(r, RunResult):
            raise TypeError(f"results must hold RunResults; got {type(r).__name__} {shown(r)}")
    return results


def _labels(labels, results) -> list:
    """One label (a string) per run; None: each run's precision."""
    if labels is None:
        return [r.config.precision for r in results]
    if isinstance(labels, (str, bytes, dict)) or not hasattr(labels, "__iter__"):
        raise TypeError(f"labels must be a list of names, one per run; got {type(labels).__name__} {shown(labels)}")
    labels = list(labels)
    for label in labels:
        if not isinstance(label, str):
            raise TypeError(f"labels must hold names (strings); got {type(label).__name__} {shown(label)}")
    if len(labels) != len(results):
        raise ValueError(f"{len(labels)} labels for {len(results)} runs")
    return labels


def _emulated(results) -> str:
    """The title a speed table needs when it holds fp8 / MX runs emulated on a CPU ("" when none does)."""
    names = []
    for r in results:
        fp8 = r.extra.get("fp8") if isinstance(r.extra, dict) else None
        emulated = fp8.get("emulated") if isinstance(fp8, dict) else r.device.startswith("cpu")
        if r.config.precision in TORCH_PRECISIONS and emulated and r.config.precision not in names:
            names.append(r.config.precision)
    if not names:
        return ""
    return f"{', '.join(names)}: emulated on CPU (fp8 values, fp32 matmuls); their step times are not fp8 speed"


def run_table(results, labels=None, step_time: str = "median") -> Table:
    """One row per run: status, final loss, accuracy, skipped steps, median step time
    (the first step -- compilation, warm-up -- left out), samples/s, the parameter and
    optimizer-state bytes the framework reported, and model-state bytes per parameter
    (weights + gradients + optimizer states: 16 for Adam in fp32 and under autocast).
    ``step_time="best"`` shows each run's fastest step instead (`STEP_TIMES`), and samples/s at it.

    fp8 / MX runs on a CPU are emulated (torchao decodes the fp8 values and multiplies in fp32):
    the table's title then says so, since their step times are not fp8's speed.

    >>> from labkit.train import RunConfig
    >>> fp8 = RunResult(RunConfig("torch", "mxfp8", steps=2), losses=[2.3, 2.1], step_times=[0.2, 0.1], device="cpu")
    >>> print(run_table([fp8]).title)
    mxfp8: emulated on CPU (fp8 values, fp32 matmuls); their step times are not fp8 speed
    """
    results = _runs(results)
    labels = _labels(labels, results)
    step_time = choice("step_time", step_time, STEP_TIMES)
    rows = []
    for label, r in zip(labels, results):
        t = r.step_time(step_time)
        ok = t > 0 and math.isfinite(t)
        rows.append((
            label, r.status, f"{r.final_loss:.4f}", f"{r.metric['value']:.3f}" if r.metric else "-",
            str(sum(r.skipped)), f"{1e3 * t:.2f}" if ok else "-", f"{r.config.batch_size / t:.0f}" if ok else "-",
            _kib(r.memory.get("parameter_bytes")), _kib(r.memory.get("optimizer_state_bytes")),
            _state_bytes_per_param(r),
        ))
    cols = ("run", "status", "final loss", "accuracy", "skipped", f"{step_time} step ms", "samples/s",
            "params KiB", "opt state KiB", "state B/param")
    return Table(cols, tuple(rows), _emulated(results))


_STYLES = (("-", 2.6), ("--", 1.8), (":", 2.2), ("-.", 1.4))  # curves that coincide stay visible


def plot_runs(results, labels=None, title: str = "", smooth: int = 1, dpi: int = 80, step_time: str = "median"):
    """Loss curves overlaid (left) and median step time per run (right; ``step_time="best"``: the
    fastest step, `STEP_TIMES`); returns the Figure.

    `smooth` > 1 draws a moving average over that many steps. Steps whose update was
    skipped (fp16 overflows) are marked with an x. The loss axis is logarithmic when the
    curves span more than a factor of 10. The default title names the framework, model, batch
    size and learning rate (two plots of the same model at different rates must not look alike).
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    results = _runs(results)
    if not results:
        raise ValueError("plot_runs needs at least one RunResult in results")
    labels = _labels(labels, results)
    if not isinstance(title, str):
        raise TypeError(f"title must be a string; got {type(title).__name__} {shown(title)}")
    smooth = integer("smooth", smooth, minimum=1)
    dpi = integer("dpi", dpi, minimum=10, maximum=1000)
    step_time = choice("step_time", step_time, STEP_TIMES)
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
    times = [1e3 * r.step_time(step_time) for r in results]
    bx.barh(labels, [t if math.isfinite(t) else 0 for t in times], color=[f"C{i}" for i in range(len(results))])
    bx.invert_yaxis()
    bx.set(xlabel=f"{step_time} step time (ms)",
           title="speed on this machine" + ("\n(fp8 emulated on CPU)" if _emulated(results) else ""))
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
        raise TypeError(f"a and b must be two RunResults; got {type(a).__name__} and {type(b).__name__}")
    if len(a.losses) != len(b.losses) or not a.losses:
        raise ValueError(f"a and b must be runs of the same steps (loss_gap compares them); got {len(a.losses)} and {len(b.losses)} losses")
    return max(abs(x - y) for x, y in zip(a.losses, b.losses))


_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # tf.distribute reports dtype names


def _engine(r: RunResult) -> str:
    if r.config.devices < 2:
        return "one device"
    if r.config.parallel.startswith("zero"):
        return f"DeepSpeed ZeRO-{r.config.parallel[-1]}"
    names = {"torch": {"dp": "DDP", "fsdp": "FSDP2"}, "jax": {"dp": "jit, data parallel", "fsdp": "jit, FSDP-style"},
             "tf": {"dp": "MirroredStrategy"}}
    return names.get(r.config.framework, {}).get(r.config.parallel, r.config.parallel)


def step_time_table(results: dict) -> Table:
    """One row per run ({label: RunResult}): framework, devices, engine, gradient-reduction dtype,
    bytes the collectives moved per step, median step time (first step left out) and samples/s.

    The time is wall-clock on *this* machine: on one CPU, N "devices" share its cores and every
    collective is a memory copy, so more devices are slower here; on N GPUs the same runs measure
    what the collectives really cost.
    """
    if not isinstance(results, dict) or not all(isinstance(r, RunResult) for r in results.values()):
        raise TypeError(f"results must be a dict {{label: RunResult}}; got {type(results).__name__} {shown(results)}")
    rows = []
    for label, r in results.items():
        t = r.median_step_time()
        ok = t > 0 and math.isfinite(t)
        reduce = r.extra.get("reduce_dtype", "-")
        reduce = reduce if isinstance(reduce, (list, tuple)) else [reduce or "-"]
        reduce = "/".join(sorted({_SHORT.get(d, d) for d in reduce}))
        rows.append((str(label), r.config.framework, str(r.config.devices), _engine(r), reduce,
                     str(r.extra.get("comm_bytes_per_step", 0)), f"{1e3 * t:.1f}" if ok else "-",
                     f"{r.config.batch_size / t:.0f}" if ok else "-"))
    cols = ("run", "framework", "devices", "engine", "reduce", "bytes/step", "median step ms", "samples/s")
    return Table(cols, tuple(rows), _emulated(results.values()))


_GATHER_DTYPES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}  # HLO names -> labkit's


def gathered(result: RunResult) -> dict:
    """The parameter all-gathers of one step of a sharded run: their dtype, elements and bytes.

    torch (FSDP2): the collectives the profiler saw (``extra["collectives"]``); jax: the
    program as labkit wrote it (``extra["collectives_requested"]``, before XLA optimises it).
    Returns ``{"dtype": "bf16" | "fp32" | "bf16/fp32", "elements": int, "bytes": int}``.
    """
    if not isinstance(result, RunResult):
        raise TypeError(f"gathered takes a RunResult; got {type(result).__name__}")
    if result.config.framework == "jax":
        rows = [{"dtype": c["dtype"], "elements": math.prod(c["shape"]), "bytes": c["bytes"]}
                for c in result.extra.get("collectives_requested", []) if c["op"] == "all-gather"]
    elif result.config.framework == "torch":
        rows = [c for c in result.extra.get("collectives", []) if c["op"].startswith("allgather")]
    else:
        raise ValueError(f"gathered reads torch and jax runs; got framework={result.config.framework!r}")
    if not rows:
        raise ValueError("gathered needs a sharded run (parallel='fsdp') whose collectives were recorded; "
                         "this one has no all-gather")
    dtypes = sorted({_GATHER_DTYPES.get(r["dtype"], r["dtype"]) for r in rows})
    return {"dtype": "/".join(dtypes), "elements": sum(int(r["elements"]) for r in rows),
            "bytes": sum(int(r["bytes"]) for r in rows)}


def gather_table(results: dict) -> Table:
    """One row per sharded run ({label: RunResult}): what its parameter all-gathers moved in one
    step -- dtype, elements, bytes, bytes per element -- and what the same gathers would move in
    bf16 (2 bytes per element)."""
    if not isinstance(results, dict) or not results or not all(isinstance(r, RunResult) for r in results.values()):
        raise TypeError("results must be a non-empty dict {label: RunResult}; "
                        f"got {type(results).__name__} {shown(results)}")
    rows = []
    for label, r in results.items():
        g = gathered(r)
        rows.append((str(label), g["dtype"], str(g["elements"]), str(g["bytes"]),
                     f"{g['bytes'] / g['elements']:g}", str(2 * g["elements"])))
    cols = ("run", "gathered in", "elements/step", "bytes/step", "bytes/element", "bytes if bf16")
    return Table(cols, tuple(rows))


def zero_memory_table(result: RunResult) -> Table:
    """A DeepSpeed ZeRO run: each rank's bytes as read from DeepSpeed's buffers, next to the
    ZeRO paper's formula (`deepspeed_config.zero_memory`) for the same parameter count, stage
    and ranks. The measured partitions are a few elements larger: DeepSpeed pads the flat buffer
    so that it splits evenly. Gradients are not listed: ZeRO frees them after each step."""
    from labkit.train.torch.deepspeed_config import zero_memory

    if not isinstance(result, RunResult) or "zero_stage" not in result.extra:
        raise ValueError("zero_memory_table needs the RunResult of a DeepSpeed run (parallel='zero1' or 'zero2')")
    n = param_count(result.config.model, result.config.width)
    world, stage = result.extra["world_size"], result.extra["zero_stage"]
    model = zero_memory(n, ranks=world, stage=stage)
    parts = (("16-bit working weights", "parameter_bytes", model["weights"]),
             ("fp32 master weights", "master_weight_bytes", model["master_weights"]),
             ("Adam m and v (fp32)", "optimizer_state_bytes", model["optimizer_states"]))
    rows = []
    for name, measured_key, predicted in parts:
        if name.startswith("16-bit") and result.config.precision == "fp32":
            predicted *= 2  # an fp32 run keeps fp32 working weights
        measured = [m[measured_key] for m in result.extra["memory_by_rank"]]
        rows.append((name, *map(str, measured), f"{predicted:.0f}"))
    cols = ("model state", *(f"rank {i} bytes" for i in range(world)), f"ZeRO-{stage} formula, {n} params")
    return Table(cols, tuple(rows))


__all__ = ["gather_table", "gathered", "loss_gap", "plot_runs", "run_table", "step_time_table",
           "zero_memory_table"]
