"""`labkit bench`: step time, throughput and activation memory per framework x precision x model.

Every cell trains the course's real model (the runner's own stepper: model, optimizer, loss
scaler) on synthetic data of the course's shapes, within a time budget (``max_seconds``):

    for each framework, model, shape:
        for each precision (fp32 first, the baseline):
            if this device only emulates the precision:        (labkit.hardware.native_precision)
                time it and fp32 at a small size (SMALL)      -> "emulated here: N x slower than fp32"
                go on to the full size only if it fits the budget
            warm-up steps                                     (compilation lands here)
            timed steps, adaptively                           (torch.utils.benchmark for PyTorch,
                                                               the same stopping rule for JAX and TF)
            step_time = median of the timed steps             (each synchronised with the device)
            speedup   = fp32 step_time / step_time            (same framework, model, shape, run)

Activation bytes are *measured* where the framework can tell (PyTorch: the bytes autograd
saves for backward; JAX: the compiled step's temporary buffers) and *modelled* from the layer
shapes (`labkit.memory.activation_bytes`) everywhere; both are in each record.

Shapes default to multiples of 64 -- what tensor cores and AVX-512/AMX tiles want;
``odd_sizes=True`` adds the same cells at odd sizes (batch - 1, width - 1 or -4) to show
what misaligned shapes cost. A combination that cannot run here is a record with
``status="skipped"`` and the reason, never a crash: bf16 on a GPU without it, a device
that is not here, a framework that is not installed, a cell whose first step alone spends
its budget. No cell waits minutes for an emulated precision: PyTorch's generic bf16 kernel
(a CPU without bf16 instructions) took 20 s for one MLP step at batch 512 and width 2048 on
the AVX2-capped Xeon this was written on, where fp32 took 0.15 s.

>>> cells(["torch"], ["fp32", "bf16"], ["mlp"])[:2]
[('torch', 'mlp', 'aligned', 'fp32'), ('torch', 'mlp', 'aligned', 'bf16')]
"""

from __future__ import annotations

import importlib
import time
from typing import Callable

import numpy as np

from labkit import memory
from labkit._validate import choice, integer, names, number, out_path, shown
from labkit.formats.table import Table
from labkit.train import FRAMEWORKS, MODELS, PRECISIONS, RunConfig
from labkit.train.config import DEVICES

DEFAULT_WIDTH = {"mlp": 2048, "transformer": 256}
DEFAULT_BATCH = 512
_MEASURED = {  # the memory() key that holds measured activation bytes, per framework
    "torch": ("saved_activation_bytes", "measured: bytes autograd saves for backward"),
    "jax": ("step_temp_bytes", "measured: XLA temporary buffers of the compiled step"),
}


# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; fp16 for
# Volta/Turing, which have no bf16. Used only to report MFU when the device name matches.
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L4": 121.0, "A10G": 70.0,
               "V100": 125.0, "T4": 65.0}


def train_flops(model: str, batch_size: int, width: int | None = None) -> int:
    """Matmul FLOPs of one training step: 3 x the forward pass (the backward pass does two
    matmuls for each forward one), forward = 2 x multiply-adds. Element-wise work, norms and
    softmax are left out, as MFU figures usually do (the "6 N D" convention: it also counts
    the gradient with respect to the data, which a first layer does not need). Checked
    against ``torch.utils.flop_counter.FlopCounterMode`` in the tests.

    >>> train_flops("mlp", 1, 32) == 3 * 2 * (64 * 32 + 32 * 32 + 32 * 10)
    True
    """
    from labkit.train.models import DEFAULT_WIDTH as MODEL_WIDTH
    from labkit.train.models import N_CLASSES, N_PIXELS, transformer_shape

    model, batch_size, width = memory.check_sizes(model, batch_size, width)
    if model == "mlp":
        w = MODEL_WIDTH["mlp"] if width is None else width  # the model's default, not this module's DEFAULT_WIDTH
        macs = N_PIXELS * w + w * w + w * N_CLASSES
    else:
        s = transformer_shape(width)
        t, d = N_PIXELS, s.d_model
        macs = s.layers * t * (12 * d * d + 2 * t * d) + d * N_CLASSES
    return 3 * 2 * macs * batch_size


def peak_tflops(device: str) -> float | None:
    """The chip's dense bf16 (fp16 before Ampere) peak, if the device description names a known GPU."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a device description (a string); got {type(device).__name__} {shown(device)}")
    text = device.upper().replace(" ", "")
    return next((v for k, v in PEAK_TFLOPS.items() if k in text), None)


def _split(values, allowed, what: str) -> list[str]:
    """A list of names from `allowed`: a list, one name, or one comma-separated string ("torch,jax")."""
    items = names(what, [v.strip() for v in values.split(",")] if isinstance(values, str) else values, allowed)
    if not items:
        raise ValueError(f"no {what} given; choose from {', '.join(allowed)}")
    return items


def cells(frameworks, precisions, models, odd_sizes: bool = False) -> list[tuple[str, str, str, str]]:
    """(framework, model, shape, precision) in run order: fp32 first in each group."""
    _flag("odd_sizes", odd_sizes)
    fws = _split(frameworks, FRAMEWORKS, "framework")
    precs = _split(precisions, PRECISIONS, "precision")
    precs = sorted(set(precs), key=lambda p: (p != "fp32", PRECISIONS.index(p)))
    mods = _split(models, MODELS, "model")
    shapes = ("aligned", "odd") if odd_sizes else ("aligned",)
    return [(f, m, s, p) for f in fws for m in mods for s in shapes for p in precs]


SHAPES = ("aligned", "odd")


def shape_of(model: str, shape: str, batch_size: int | None, width: int | None) -> tuple[int, int]:
    """Batch size and width for a cell: aligned defaults (None), or odd neighbours of them.

    "odd" runs batch size - 1 and width - 1 (the transformer: width - 4, keeping its 4 heads, each
    of an odd size), so it needs a batch size of 2 or more and a width of 2 (transformer: 8) or more.

    >>> shape_of("mlp", "odd", 64, 256)
    (63, 255)
    """
    from labkit.train.models import transformer_shape

    shape = choice("shape", shape, SHAPES)
    model, b, w = memory.check_sizes(model, DEFAULT_BATCH if batch_size is None else batch_size, width)
    w = DEFAULT_WIDTH[model] if w is None else w
    if model == "transformer":
        transformer_shape(w)  # 4 heads must divide it
    if shape == "odd":
        less = 4 if model == "transformer" else 1  # transformer: 4 heads, so d_head becomes odd
        if b < 2 or w <= less:
            raise ValueError(f"odd sizes also run batch size - 1 and width - {less}: they need a batch "
                             f"size of 2 or more and a width of {less + 1 if less == 1 else 2 * less} or more for "
                             f"the {model}; got batch size {b}, width {w}")
        b, w = b - 1, w - less
    return b, w


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {shown(value)}")
    return bool(value)


def _plan(frameworks=("torch",), precisions=("fp32", "bf16"), models=("mlp",), *, batch_size: int | None = None,
          width: int | None = None, warmup: int = 2, steps: int | None = None, device: str = "auto",
          odd_sizes: bool = False, max_seconds: float = 20.0, on_cell: Callable[[dict], None] | None = None,
          ) -> list[tuple[str, str, str, str]]:
    """What `bench` checks before it runs a cell, and its plan (`cells`); a bad value is a
    ValueError or TypeError that names it. Nothing is imported or run."""
    integer("warmup", warmup, minimum=0, maximum=MAX_STEPS)
    if steps is not None:
        integer("steps", steps, minimum=1, maximum=MAX_STEPS)
    number("max_seconds", max_seconds, minimum=0, inclusive=False)
    choice("device", device, DEVICES)
    if on_cell is not None and not callable(on_cell):
        raise TypeError(f"on_cell must be a function of one record, or None; got {type(on_cell).__name__}")
    plan = cells(frameworks, precisions, models, odd_sizes)
    for model, shape in dict.fromkeys((m, s) for _, m, s, _ in plan):
        shape_of(model, shape, batch_size, width)
    return plan


SMALL = {"mlp": (64, 256), "transformer": (8, 64)}
"""(batch, width) at which an emulated precision is timed, next to fp32 at the same size."""
MIN_STEPS = 3  # timed steps a measurement needs, at the least
MAX_STEPS = 100_000  # warm-up or timed steps of one cell, at the most


def bench(frameworks=("torch",), precisions=("fp32", "bf16"), models=("mlp",), *, batch_size: int | None = None,
          width: int | None = None, warmup: int = 2, steps: int | None = None, device: str = "auto",
          odd_sizes: bool = False, max_seconds: float = 20.0, on_cell: Callable[[dict], None] | None = None,
          ) -> list[dict]:
    """Run every cell and return one record per cell (see the module docstring).

    Each cell gets ``max_seconds`` in all (building the model, `warmup` untimed steps, timing).
    With ``steps=None`` the timing is adaptive: PyTorch's ``torch.utils.benchmark.Timer``
    (``adaptive_autorange``) for torch, the same rule in labkit's own loop for JAX and
    TensorFlow -- until the step times agree (interquartile range under 10% of the median) or
    the budget is spent; ``steps=N`` times exactly N steps instead.

    A precision this device does not run natively (`labkit.hardware.native_precision`: bf16 on a
    CPU without bf16 instructions, every 16-bit dot in XLA:CPU) is first timed at a small size
    (`SMALL`) next to fp32 at that size. If the full size would not fit the budget, the record
    has status ``"emulated"`` and says how many times slower than fp32 it is; if even the small
    size does not fit, it is ``"skipped"`` with that reason.
    """
    plan = _plan(frameworks, precisions, models, batch_size=batch_size, width=width, warmup=warmup, steps=steps,
                 device=device, odd_sizes=odd_sizes, max_seconds=max_seconds, on_cell=on_cell)
    records, baseline, small_fp32, on_cpu = [], {}, {}, {}
    for framework, model, shape, precision in plan:
        if framework not in on_cpu:  # imports the framework and its runner: a one-time cost, outside any budget
            on_cpu[framework] = _on_cpu(framework, device)
        b, w = shape_of(model, shape, batch_size, width)
        rec = dict(framework=framework, precision=precision, model=model, shape=shape, batch_size=b, width=w,
                   warmup=warmup, steps=steps, max_seconds=max_seconds,
                   activation_bytes_model=memory.activation_bytes(model, b, precision, w))
        cell = _Cell(framework, model, precision, device, warmup, steps, deadline=time.perf_counter() + max_seconds,
                     on_cpu=on_cpu[framework])
        try:
            rec.update(cell.measure(b, w, small_fp32))
        except _Skip as exc:
            rec.update(status="skipped", reason=str(exc))
        rec["seconds"] = round(cell.elapsed(), 3)
        if rec["status"] == "ok":
            rec["flops_per_step"] = train_flops(model, b, w)
            rec["achieved_tflops"] = rec["flops_per_step"] / rec["step_time_s"] / 1e12
            peak = peak_tflops(rec["device"])
            rec["mfu"] = rec["achieved_tflops"] / peak if peak else None
            if precision == "fp32":
                baseline[(framework, model, shape)] = rec["step_time_s"]
            base = baseline.get((framework, model, shape))
            rec["speedup_vs_fp32"] = base / rec["step_time_s"] if base else None
        records.append(rec)
        if on_cell:
            on_cell(rec)
    return records


class _Skip(Exception):
    """A cell that cannot be measured here; the message says why."""


class _Cell:
    """Times one framework x model x precision within a deadline."""

    def __init__(self, framework, model, precision, device, warmup, steps, deadline, on_cpu):
        self.framework, self.model, self.precision, self.device = framework, model, precision, device
        self.warmup, self.steps, self.deadline, self.on_cpu = warmup, steps, deadline, on_cpu
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def stepper(self, precision, batch, width):
        """(stepper, step): ``step()`` runs one optimizer step on the next batch and keeps its
        StepOut in ``step.last``."""
        from labkit.train import _RUNNERS
        from labkit.train.data import batches, load

        cfg = RunConfig(self.framework, precision, model=self.model, dataset="synthetic", steps=1, batch_size=batch,
                        width=width, device=self.device, progress=False, seed=0)
        try:
            runner = importlib.import_module(_RUNNERS[self.framework])
            data = load("synthetic", seed=0)
            stepper = runner.make_stepper(cfg, data)
        except (ValueError, ImportError) as exc:  # cannot run here: say why
            raise _Skip(str(exc)) from None
        feed = batches(data, batch, seed=0)

        def step():
            step.last = stepper.step(*next(feed), False)

        return stepper, step

    def measure(self, batch, width, small_fp32) -> dict:
        native, why = True, ""
        if self.on_cpu:
            from labkit import hardware

            native, why = hardware.native_precision(self.framework, self.precision,
                                                    hardware.HardwareReport(hardware.detect_cpu()))
        out = {"native": native}
        small_b, small_w = SMALL[self.model]
        if not native and (batch, width) != (small_b, small_w):
            probe = self.probe(small_b, small_w, small_fp32)
            out.update(probe, emulated_why=why)
            flops = train_flops(self.model, batch, width) / train_flops(self.model, small_b, small_w)
            # scaled by FLOPs; emulated kernels also slow down per FLOP as matrices outgrow the caches
            # (torch's bf16 on AVX2: 13 ms at batch 64 x 256 wide, 20 s at 512 x 2048, not 5), hence x4
            predicted = probe["small_step_time_s"] * flops
            if 4 * predicted * (self.warmup + MIN_STEPS) > self.left():
                slower = probe["emulated_slowdown"]
                return dict(out, status="emulated", step_time_s=None, speedup_vs_fp32=1 / slower,
                            reason=f"emulated here: {slower:.0f}x slower than fp32 at batch {small_b}, width "
                                   f"{small_w} ({why}); the full size would need {predicted:.0f} s a step or more, "
                                   f"past the {self.budget():.0f} s budget",
                            activation_bytes=None, activation_source="not measured: timed at the small size only",
                            memory={}, final_loss=None, samples_per_s=None)
        stepper, step = self.stepper(self.precision, batch, width)
        out.update(device=stepper.device, **self.time(stepper, step))
        out["samples_per_s"] = batch / out["step_time_s"]
        return out

    def budget(self) -> float:
        return self.deadline - self.start

    def probe(self, batch, width, small_fp32) -> dict:
        """fp32 and this precision at the small size (fp32 once per framework and model)."""
        key = (self.framework, self.model)
        if key not in small_fp32:
            small_fp32[key] = self.time(*self.stepper("fp32", batch, width), steps=MIN_STEPS, warmup=1)["step_time_s"]
        stepper, step = self.stepper(self.precision, batch, width)
        t = self.time(stepper, step, steps=MIN_STEPS, warmup=1)["step_time_s"]
        return {"device": stepper.device, "small_batch_size": batch, "small_width": width, "small_step_time_s": t,
                "small_fp32_step_time_s": small_fp32[key], "emulated_slowdown": t / small_fp32[key]}

    def time(self, stepper, step, steps=None, warmup=None) -> dict:
        """Warm up, then time: `steps` steps, or adaptively within the deadline."""
        warmup = self.warmup if warmup is None else warmup
        steps = self.steps if steps is None else steps
        first = None
        for _ in range(warmup):
            t = self._timed(step)
            first = t if first is None else first
            if self.left() < 0:
                raise _Skip(f"a warm-up step took {t:.1f} s, and the {self.budget():.0f} s budget of the cell is "
                            "spent: raise max_seconds (--max-seconds), or use a smaller batch or width")
        if steps is not None:
            times, how = [self._timed(step) for _ in range(steps)], f"median of {steps} timed steps"
        else:
            last = first if first is not None else self._timed(step)
            if self.framework == "torch" and last * 20 < self.left():
                times, how = self._torch_timer(step)
            else:
                times, how = self._adaptive(step)
        return {"status": "ok", "step_time_s": float(np.median(times)), "timed_steps": len(times), "timer": how,
                "final_loss": step.last.loss, **_activations(self.framework, stepper.memory())}

    @staticmethod
    def _timed(step) -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    def _window(self) -> tuple[float, float]:
        """(min_run_time, max_run_time): about 2 s of steps, within what is left of the budget."""
        high = max(self.left() * 0.9, 0.0)
        return min(2.0, high), high

    def _torch_timer(self, step):
        import torch
        from torch.utils import benchmark

        low, high = self._window()
        timer = benchmark.Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads())
        m = timer.adaptive_autorange(threshold=0.1, min_run_time=low, max_run_time=high)
        per_run = [t / m.number_per_run for t in m.raw_times]
        return per_run, f"torch.utils.benchmark adaptive_autorange ({len(per_run)} x {m.number_per_run} steps)"

    def _adaptive(self, step):
        """torch.utils.benchmark's stopping rule, one step at a time: once there are more than
        MIN_STEPS steps and `low` seconds of them, stop when the interquartile range is under
        10% of the median; stop anyway before `high`, keeping at least one step."""
        low, high = self._window()
        times = []
        while True:
            times.append(self._timed(step))
            total = sum(times)
            if len(times) > MIN_STEPS and total >= low:
                q1, med, q3 = np.percentile(times, [25, 50, 75])
                if (q3 - q1) < 0.1 * med:
                    break
            if total + times[-1] > high:
                break
        return times, f"labkit's adaptive loop ({len(times)} steps)"


def _on_cpu(framework: str, device: str) -> bool:
    """Will `framework` run on the CPU for RunConfig's `device`? Imports the framework and
    labkit's runner for it, and asks the framework for "auto" (PyTorch: no CUDA; JAX: its
    default backend; TensorFlow: no GPU or TPU)."""
    from labkit.train import _RUNNERS

    try:
        importlib.import_module(_RUNNERS[framework])
    except ImportError:
        return False  # not installed: building the stepper says so
    if device != "auto":
        return device == "cpu"
    try:
        if framework == "torch":
            import torch

            return not torch.cuda.is_available()
        if framework == "jax":
            import jax

            return jax.default_backend() == "cpu"
        from labkit.train.tf_models import import_tensorflow

        tf, _ = import_tensorflow()
        return not (tf.config.list_physical_devices("GPU") or tf.config.list_logical_devices("TPU"))
    except ImportError:
        return False  # not installed: building the stepper will say so


def _activations(framework: str, memory_dict: dict) -> dict:
    key, source = _MEASURED.get(framework, (None, None))
    measured = memory_dict.get(key) if key else None
    return {"memory": memory_dict, "activation_bytes": measured,
            "activation_source": source if measured is not None else "not measurable here (see activation_bytes_model)"}


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
    """The records as a Table (one row per cell). An emulated cell shows its slowdown against
    fp32 at the small size it was timed at, in the "vs fp32" column."""
    rows = []
    for r in _records(records):
        act = f"({_mb(r['activation_bytes_model'])})"
        if r["status"] == "skipped":
            rows.append((r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]),
                         "skipped", "", "", "", "", act, ""))
            continue
        if r["status"] == "emulated":
            rows.append((r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]),
                         "emulated", "", "", f"1/{r['emulated_slowdown']:.0f} (at batch {r['small_batch_size']}, "
                         f"width {r['small_width']})", "", act, ""))
            continue
        rows.append((
            r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]), r["status"],
            f"{r['step_time_s'] * 1e3:.2f}", f"{r['samples_per_s']:.0f}",
            f"{r['speedup_vs_fp32']:.2f}x" if r.get("speedup_vs_fp32") else "-",
            f"{r['achieved_tflops'] * 1e3:.1f}" + (f" ({100 * r['mfu']:.0f}% MFU)" if r.get("mfu") else ""),
            _mb(r["activation_bytes"]) if r["activation_bytes"] is not None else act,
            f"{r['final_loss']:.3f}",
        ))
    cols = ("framework", "model", "precision", "batch", "width", "status", "ms/step", "samples/s",
            "vs fp32", "GFLOP/s", "activations MB", "final loss")
    return Table(cols, tuple(rows), "labkit bench (activation MB in parentheses: modelled, not measured)")


def _mb(n) -> str:
    return f"{n / 1e6:.2f}"


def plot_suffixes() -> tuple[str, ...]:
    """The file suffixes `plot` can save to: what matplotlib's canvas supports (".png", ".svg", ".pdf", ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{k}" for k in sorted(FigureCanvasBase.get_supported_filetypes()))


def plot(records: list[dict], path: str | None = None):
    """Bar chart of speed-up vs fp32 per cell; saved to `path` if given (its suffix one of
    `plot_suffixes()`: checked before drawing). Returns the Figure."""
    records = _records(records)
    if path is not None:
        path = out_path("path", path, suffixes=plot_suffixes())
    import matplotlib.pyplot as plt

    done = [r for r in records if r["status"] == "ok" and r.get("speedup_vs_fp32")]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(done) + 2), 3.2), dpi=90)
    labels = [f"{r['framework']}\n{r['model']}\n{r['precision']}" for r in done]
    ax.bar(range(len(done)), [r["speedup_vs_fp32"] for r in done], color="#4C78A8")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(done)), labels, fontsize=7)
    ax.set_ylabel("speed-up vs fp32")
    ax.set_title("Measured step-time speed-up (same framework, model and shape)", fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path)
    plt.close(fig)
    return fig


# -- the hardware's ceiling: one big matmul per framework ----------------------------------------
MATMUL_FRAMEWORKS = ("torch", "jax", "tf")
MAX_MATMUL_N = 2**15  # two 32768 x 32768 float32 operands already take 8 GiB


def _seconds(name: str, value) -> float:
    """A time budget: a finite number > 0 (here, where matmul_ms's `number` argument hides _validate's)."""
    return number(name, value, minimum=0, inclusive=False)


def _check_ms(ms) -> None:
    """`matmul_ms`'s result: {(framework, dtype): milliseconds > 0}."""
    if not isinstance(ms, dict) or not ms:
        raise TypeError(f"ms must be the dict matmul_ms returns, {{(framework, dtype): milliseconds}}; got "
                        f"{type(ms).__name__} {shown(ms)}")
    for key, t in ms.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"ms must be keyed by (framework, dtype) pairs, as matmul_ms returns it; "
                            f"got key {shown(key)}")
        number(f"ms[{key!r}] (a time in milliseconds)", t, minimum=0, inclusive=False)


def matmul_ms(n: int = 1024, frameworks=MATMUL_FRAMEWORKS, dtypes=("float32", "bfloat16"),
              repeats: int = 5, number: int = 5, max_seconds: float | None = None) -> dict[tuple[str, str], float]:
    """Milliseconds of one (n, n) @ (n, n) matmul, per (framework, dtype): the best of `repeats`
    timings of `number` calls each, after a warm-up call (compilation, kernel selection).

    Each framework runs on its default device (PyTorch: CUDA if present) with its *default*
    settings -- so on an NVIDIA GPU JAX and TensorFlow compute float32 in TF32 and PyTorch does
    not. Every call waits for its result. The operands are the same numbers in every framework.

    ``max_seconds`` bounds the timing of each (framework, dtype) after its warm-up call: a slow
    call (an emulated dtype) is then timed fewer times, down to once.
    """
    import timeit

    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    repeats = integer("repeats", repeats, minimum=1, maximum=MAX_STEPS)
    number_ = integer("number", number, minimum=1, maximum=MAX_STEPS)
    if max_seconds is not None:
        max_seconds = _seconds("max_seconds", max_seconds)
    frameworks = _split(frameworks, MATMUL_FRAMEWORKS, "framework")
    dtypes = _split(dtypes, ("float32", "bfloat16", "float16"), "dtype")
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = {}
    for framework in frameworks:
        for dtype in dtypes:
            call = _matmul_call(framework, a, dtype)
            first = min(timeit.repeat(call, number=1, repeat=1))  # the warm-up, timed to size the rest
            k, r = number_, repeats
            if max_seconds is not None and first * k * r > max_seconds:
                k, r = 1, max(1, min(repeats, int(max_seconds / max(first, 1e-9))))
            out[framework, dtype] = 1e3 * min(timeit.repeat(call, number=k, repeat=r)) / k
    return out


def emulation_table(frameworks=MATMUL_FRAMEWORKS, dtypes=("bfloat16", "float16"), n: int = 256,
                    max_seconds: float = 5.0, ms: dict | None = None) -> Table:
    """Native or emulated, here: for each framework and 16-bit dtype, what `labkit.hardware`
    says about this machine (`native_precision`) and one (n, n) matmul's time against float32 in
    the same framework. An emulated dtype computes the right numbers, converted to and from
    fp32 or through a slow generic kernel: no faster than fp32, often many times slower.

    ``ms`` takes timings measured elsewhere ({(framework, dtype): ms}, as `matmul_ms` returns
    them, n x n, float32 included); without it the matmuls are timed here."""
    from labkit import hardware

    frameworks = _split(frameworks, MATMUL_FRAMEWORKS, "framework")
    dtypes = _split(dtypes, ("bfloat16", "float16"), "dtype")
    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    max_seconds = _seconds("max_seconds", max_seconds)
    if ms is not None:
        _check_ms(ms)
    if ms is None:
        ms = matmul_ms(n, frameworks, ("float32", *dtypes), repeats=3, number=3, max_seconds=max_seconds)
    missing = [(f, d) for f in frameworks for d in ("float32", *dtypes) if (f, d) not in ms]
    if missing:
        raise ValueError(f"ms lacks {', '.join(f'{f} {d}' for f, d in missing)}: time float32 and each 16-bit dtype")
    short = {"bfloat16": "bf16", "float16": "fp16"}
    rows = []
    for fw in frameworks:
        for d in dtypes:
            native = hardware.native_precision(fw, short[d])
            rows.append((fw, d, "native" if native.native else "emulated", native.why,
                         f"{ms[fw, 'float32']:.3f}", f"{ms[fw, d]:.3f}", _versus(ms[fw, "float32"], ms[fw, d])))
    return Table(("framework", "dtype", "here", "why", "float32 ms", "16-bit ms", "against float32"),
                 tuple(rows), f"{n} x {n} matmul: native or emulated on this machine")


def _versus(base: float, t: float) -> str:
    """"3.1x faster" / "2.0x slower" / "as fast" for a time t against a baseline time."""
    r = base / t
    return "as fast" if 0.95 <= r <= 1.05 else f"{r:.1f}x faster" if r > 1 else f"{1 / r:.1f}x slower"


def _matmul_call(framework: str, a, dtype: str) -> Callable[[], object]:
    """A no-argument call that multiplies `a` by itself in `framework` and `dtype` and waits."""
    if framework == "torch":
        import torch

        gpu = torch.cuda.is_available()
        t = torch.from_numpy(a).to("cuda" if gpu else "cpu", getattr(torch, dtype))
        return lambda: (t @ t, torch.cuda.synchronize() if gpu else None)
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        j, matmul = jnp.asarray(a, dtype), jax.jit(jnp.matmul)
        return lambda: matmul(j, j).block_until_ready()
    from labkit.train.tf_models import import_tensorflow

    tf, _ = import_tensorflow()
    f = tf.constant(a, dtype)
    return lambda: tf.linalg.matmul(f, f)[0, 0].numpy()


def matmul_table(ms: dict[tuple[str, str], float], n: int) -> Table:
    """`matmul_ms`'s figures per framework: ms and GFLOP/s (2 n^3 flops) for each dtype, and each
    dtype's speed-up over the framework's own float32; the title says how the fastest run of each
    dtype, in any framework, compare -- what the hardware gives, whichever library gets it."""
    _check_ms(ms)
    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    dtypes = list(dict.fromkeys(d for _, d in ms))
    rows = []
    for fw in dict.fromkeys(f for f, _ in ms):
        row = [fw]
        for d in dtypes:
            t = ms.get((fw, d))
            row += ["-", "-"] if t is None else [f"{t:.2f}", f"{2 * n**3 / t / 1e6:.0f}"]
        base = ms.get((fw, "float32"))
        row += [f"{base / ms[fw, d]:.1f}x" if base and (fw, d) in ms else "-" for d in dtypes if d != "float32"]
        rows.append(tuple(row))
    cols = ["framework"] + [c for d in dtypes for c in (f"{d} ms", f"{d} GFLOP/s")]
    cols += [f"{d} speed-up" for d in dtypes if d != "float32"]
    fastest = {d: min(t for (_, dd), t in ms.items() if dd == d) for d in dtypes}
    title = f"{n} x {n} matmul"
    if "float32" in fastest and "bfloat16" in fastest:
        title += f"; fastest float32 / fastest bfloat16, any framework: {fastest['float32'] / fastest['bfloat16']:.1f}x"
    return Table(tuple(cols), tuple(rows), title)
