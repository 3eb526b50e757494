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
"""


from __future__ import annotations

import time
from typing import Callable

import numpy as np

from labkit.bench.peaks import peak_tflops, train_flops
from labkit.bench.plan import MIN_STEPS, SMALL, _plan, shape_of
from labkit.memory import activation_bytes
from labkit.train import RunConfig

_MEASURED = {  # the memory() key that holds measured activation bytes, per framework
    "torch": ("saved_activation_bytes", "measured: bytes autograd saves for backward"),
    "jax": ("step_temp_bytes", "measured: XLA temporary buffers of the compiled step"),
}


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
                   activation_bytes_model=activation_bytes(model, b, precision, w))
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
        from labkit.train import runner
        from labkit.train.data import batches, load

        cfg = RunConfig(self.framework, precision, model=self.model, dataset="synthetic", steps=1, batch_size=batch,
                        width=width, device=self.device, progress=False, seed=0)
        try:
            data = load("synthetic", seed=0)
            stepper = runner(self.framework).make_stepper(cfg, data)
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
                "final_loss": step.last.loss, **_activations(self.framework, stepper.memory().to_dict())}

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
    from labkit.train import runner

    try:
        runner(framework)
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


__all__ = ["bench"]
