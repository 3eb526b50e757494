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
its budget. No cell waits minutes for an emulated precision: PyTorch's generic bf16 and fp16
kernels (a CPU without the instructions) are several times slower than fp32 even at batch 64
(the AVX2-capped Xeon of `labkit.evidence`'s stored reference rows), and the gap grows with size.

>>> cells(["torch"], ["fp32", "bf16"], ["mlp"])[:2]
[('torch', 'mlp', 'aligned', 'fp32'), ('torch', 'mlp', 'aligned', 'bf16')]
"""

from __future__ import annotations

import importlib
import re
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from labkit import memory
from labkit._validate import choice, integer, names, number, out_path, shown
from labkit.table import Table
from labkit.train import FRAMEWORKS, MODELS, PRECISIONS, RunConfig
from labkit.train.config import DEVICES

DEFAULT_WIDTH = {"mlp": 2048, "transformer": 256}
DEFAULT_BATCH = 512
_MEASURED = {  # the memory() key that holds measured activation bytes, per framework
    "torch": ("saved_activation_bytes", "measured: bytes autograd saves for backward"),
    "jax": ("step_temp_bytes", "measured: XLA temporary buffers of the compiled step"),
}


# Peak dense (no sparsity) TFLOP/s per chip and precision, from NVIDIA's datasheets. The
# datasheets of Ampere and later quote tensor-core figures "with sparsity"; the dense figure is
# half of it. Volta (V100) and Turing (T4) have no bf16 and no tf32: their tensor cores do fp16
# (with fp32 accumulation) only, so a bf16 run there has no peak to be measured against. `fp32`
# is the non-tensor-core fp32 rate: labkit's `fp32` precision turns TF32 off.
PEAK_PRECISION = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "bf16-pure": "bf16"}
"""Which peak a run of each labkit precision is measured against (pure bf16 computes in bf16)."""


@dataclass(frozen=True)
class Peak:
    """One chip's dense peaks, TFLOP/s, and where they come from.

    ``pattern`` is a regular expression matched against the device text (upper case), e.g.
    ``"cuda:0 (NVIDIA H100 PCIe, ...)"``; ``tflops`` maps a precision to its peak, and leaves
    out the precisions the chip has no tensor-core path for.
    """

    chip: str
    pattern: str
    tflops: dict
    source: str

    def __post_init__(self):
        for field in ("chip", "pattern", "source"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise TypeError(f"Peak.{field} must be a non-empty str, not {shown(value)}")
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"Peak.pattern {self.pattern!r} is not a regular expression: {e}") from None
        if not isinstance(self.tflops, dict) or not self.tflops:
            raise TypeError(f"Peak.tflops must be a dict of precision -> TFLOP/s, not {shown(self.tflops)}")
        for precision, value in self.tflops.items():
            choice("Peak.tflops precision", precision, ("fp32", "tf32", "fp16", "bf16"))
            number(f"Peak.tflops[{precision!r}]", value, minimum=0, inclusive=False)


PEAKS = (
    Peak("H200 SXM", r"H200(?!\s*NVL)", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
         "https://www.nvidia.com/en-us/data-center/h200/"),
    Peak("H100 SXM", r"H100(?!\s*(PCIE|NVL))", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Peak("H100 PCIe", r"H100\s*PCIE", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Peak("A100", r"A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    Peak("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
         "https://www.nvidia.com/en-us/data-center/l4/"),
    Peak("V100 SXM2", r"V100-SXM2", {"fp32": 15.7, "fp16": 125.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Peak("V100 PCIe", r"V100-PCIE", {"fp32": 14.0, "fp16": 112.0},
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"),
    Peak("T4", r"\bT4\b", {"fp32": 8.1, "fp16": 65.0},
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
)
"""The chips labkit reports MFU on. Any other device -- a CPU, an H100 NVL, a V100S, an A10G (whose
peaks NVIDIA publishes no datasheet for) -- gets no MFU rather than a guessed one."""

PEAK_TFLOPS = {p.chip: dict(p.tflops) for p in PEAKS}
"""chip -> {precision: dense TFLOP/s}, as in `PEAKS`."""


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


def peak(device: str) -> Peak | None:
    """The `Peak` of the GPU a device description names, or None (a CPU, an unknown chip)."""
    import re

    if not isinstance(device, str):
        raise TypeError(f"device must be a device description (a string); got {type(device).__name__} {shown(device)}")
    text = device.upper()
    return next((p for p in PEAKS if re.search(p.pattern, text)), None)


def peak_tflops(device: str, precision: str = "bf16") -> float | None:
    """The chip's dense peak for a labkit precision (`PEAK_PRECISION`), if the device description
    names a known GPU and the chip has that precision; None otherwise.

    >>> peak_tflops("cuda:0 (NVIDIA H100 PCIe)"), peak_tflops("cuda:0 (Tesla T4)", "bf16")
    (756.5, None)
    """
    precision = choice("precision", precision, tuple(PEAK_PRECISION))
    found = peak(device)
    return found.tflops.get(PEAK_PRECISION[precision]) if found else None


def peaks_table() -> Table:
    """Every chip's dense peaks, one column per precision ("-": the chip has none), and the source."""
    cols = ("fp32", "tf32", "fp16", "bf16")
    rows = tuple((p.chip, *(f"{p.tflops[c]:g}" if c in p.tflops else "-" for c in cols), p.source) for p in PEAKS)
    return Table(("chip", *(f"{c} TFLOP/s" for c in cols), "source (datasheet)"), rows,
                 "Dense peaks MFU is measured against (no sparsity; NVIDIA's datasheets)")


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
            top = peak_tflops(rec["device"], precision)
            rec["mfu"] = rec["achieved_tflops"] / top if top else None
            rec["peak_tflops"] = top
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
        q1, q3 = np.percentile(times, [25, 75])
        spread = {"step_time_min_s": float(np.min(times)), "step_time_q1_s": float(q1),
                  "step_time_q3_s": float(q3), "step_time_max_s": float(np.max(times))}
        return {"status": "ok", "step_time_s": float(np.median(times)), **spread, "timed_steps": len(times), "timer": how,
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
        from labkit.train.tf.models import import_tensorflow

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

    The repeats of a framework's dtypes are interleaved (fp32, bf16, fp32, bf16, ...), so that
    other work on a shared machine does not favour one of them. Each framework runs on its default device (PyTorch: CUDA if present) with its *default*
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
        plan = {}
        for dtype in dtypes:
            call = _matmul_call(framework, a, dtype)
            first = min(timeit.repeat(call, number=1, repeat=1))  # the warm-up, timed to size the rest
            k, r = number_, repeats
            if max_seconds is not None and first * k * r > max_seconds:
                k, r = 1, max(1, min(repeats, int(max_seconds / max(first, 1e-9))))
            plan[dtype] = (call, k, r, [])
        # the repeats of the dtypes take turns, so that a burst of other work on the machine
        # slows all of them alike rather than the one that happened to be timed then
        for i in range(max(r for _, _, r, _ in plan.values())):
            for call, k, r, times in plan.values():
                if i < r:
                    times.append(timeit.timeit(call, number=k) / k)
        for dtype, (_, _, _, times) in plan.items():
            out[framework, dtype] = 1e3 * min(times)
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
    from labkit.train.tf.models import import_tensorflow

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
