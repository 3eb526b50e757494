"""The clinic's last entries: training that stops (DeepSpeed at its minimum loss scale), a NaN found
by autograd's anomaly mode, and mixed precision that is slower than fp32 (`autocast_speed`)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from labkit._validate import choice, integer, number, shown
from labkit.train.torch.clinic.case import Entry, linear, raised, warned


# -- DeepSpeed: "Current loss scale already at minimum" ---------------------------------------------
@contextlib.contextmanager
def _quiet_deepspeed():
    """DeepSpeed's first import logs "Setting accelerator to CPU ..." to stdout when it finds no GPU (its
    ``accelerator/real_accelerator.py``): name the CPU for it, through its own ``DS_ACCELERATOR``, for
    that import only -- the accelerator it would pick anyway. Its overflow logs go to ERROR meanwhile."""
    import os
    import sys

    env = "deepspeed" not in sys.modules and "DS_ACCELERATOR" not in os.environ and torch.cuda.device_count() == 0
    if env:
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed.utils.logging  # noqa: F401 -- creates the "DeepSpeed" logger

        lg = logging.getLogger("DeepSpeed")
        level = lg.level
        lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            lg.setLevel(level)
    finally:
        if env:
            os.environ.pop("DS_ACCELERATOR", None)


@dataclass(frozen=True)
class _Stop:
    step: int  # the step whose overflow raised, counted from 1
    scale: float  # the scale then: min_loss_scale
    ours: str  # labkit's ScalerStopped, "Type: text"
    theirs: str | None  # DeepSpeed's own, "Type: text"; None where DeepSpeed is not installed
    version: str | None  # DeepSpeed's version, where installed


@functools.cache
def _deepspeed_stop() -> _Stop | None:
    """Every step overflowing from the fp16 config's defaults: labkit's replay until it stops, then the real
    ``DynamicLossScaler`` in the state the replay reached (once per process: the case and its verdict read it)."""
    from labkit import scaling
    from labkit.train.torch.deepspeed_config import deepspeed_installed

    scaler, steps = scaling.DeepSpeedLossScaler.create(), 0  # the fp16 config's defaults: 2**16, hysteresis 2
    try:
        while steps < 100:
            scaler = scaler.adjust(False)  # every step overflows
            steps += 1
    except scaling.ScalerStopped as stop:
        ours = f"{type(stop).__name__}: {stop}"
    else:
        return None
    if not deepspeed_installed():
        return _Stop(steps + 1, scaler.loss_scale, ours, None, None)
    import importlib.metadata as md

    with _quiet_deepspeed():
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

        # the real scaler in the state labkit's replay reached: at the floor, no hysteresis left
        real = DynamicLossScaler(init_scale=scaler.loss_scale, scale_window=1000, min_scale=1, delayed_shift=2,
                                 consecutive_hysteresis=False)
        real.cur_hysteresis = scaler.hysteresis
        theirs = raised(lambda: real.update_scale(True))
    return _Stop(steps + 1, scaler.loss_scale, ours, theirs, md.version("deepspeed"))


def _deepspeed_min_scale() -> str:
    stop = _deepspeed_stop()
    if stop is None:
        return "(labkit's DeepSpeed scaler did not stop)"
    lines = [f"labkit.scaling.DeepSpeedLossScaler, every step overflowing from 2**16: stopped at step {stop.step}, "
             f"counting from 1 "
             f"(scale {stop.scale:g} = min_loss_scale, hysteresis used up):", "  " + stop.ours]
    if stop.theirs is None:
        return "\n".join(lines + ["DeepSpeed is not installed here (pip install 'labkit[deepspeed]'): no message "
                                  "of its own"])
    return "\n".join(lines + [f"deepspeed {stop.version} DynamicLossScaler.update_scale(overflow=True) in that state:",
                              "  " + stop.theirs])


def _deepspeed_verdict():
    """Holds wherever the replay stops with DeepSpeed's words and DeepSpeed, where installed, raises the same."""
    from labkit import checks

    stop = _deepspeed_stop()
    words = stop.ours.split(": ", 1)[1] if stop else "(no stop)"
    same = stop is not None and (stop.theirs is None or stop.theirs.split(": ", 1)[-1] == words)
    return checks.that(f"every step overflowing from 2**16, labkit's replay stops at step {stop.step if stop else '?'} "
                       "(counting from 1) "
                       f"and DeepSpeed's DynamicLossScaler, where installed, raises the same words: '{words}'",
                       same, f"deepspeed {stop.version}" if stop and stop.version else "DeepSpeed is not installed")


def _deepspeed_fix() -> str:
    from labkit import scaling

    burst = scaling.simulate("deepspeed", overflows=[True] * 5 + [False] * 15, init_scale=2**16)
    stops = "never stops" if burst.stopped_at is None else "stops"
    return (f"overflows that stop (5 steps, then 15 clean): the replay {stops}; scale {burst.scales[0]:g} at the "
            f"first step, {burst.final_scale:g} after the last\n"
            f"a bf16 config: deepspeed_options({{'bf16': {{'enabled': True}}}}) -> "
            f"{scaling.deepspeed_options({'bf16': {'enabled': True}})}: no loss scale, nothing to reach a minimum")


# -- NaN hunting with anomaly mode ------------------------------------------------------------------
def _masked_sqrt_step(fixed: bool, anomaly: bool) -> str:
    """A forward that is finite and a backward that is not: ``torch.where(h > 0, torch.sqrt(h), 0)``.
    The where drops the nan of sqrt(negative) from the forward, but its backward sends a gradient of 0
    to those entries, and sqrt's backward, grad / (2 * sqrt(h)), is 0 / nan = nan there: nan reaches
    every weight. The fix: take the square root of a safe input, ``torch.sqrt(h.clamp_min(1e-6))``."""
    gen = torch.Generator().manual_seed(0)
    model = linear(4, 4, gen)
    x = torch.randn(8, 4, generator=gen)
    h = model(x)  # about half the entries are negative
    r = torch.sqrt(h.clamp_min(1e-6)) if fixed else torch.sqrt(h)
    loss = torch.where(h > 0, r, 0.0).sum()
    with torch.autograd.set_detect_anomaly(anomaly):
        loss.backward()
    finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    return f"loss {'finite' if torch.isfinite(loss) else 'not finite'}, gradients finite: {finite}"


def _nan_hunt() -> str:
    text, _ = warned(lambda: raised(lambda: _masked_sqrt_step(False, True)), "")  # anomaly mode warns: recorded
    return text


def _nan_hunt_fix() -> str:
    plain = _masked_sqrt_step(False, False)
    fixed, _ = warned(lambda: _masked_sqrt_step(True, True), "")
    return (f"without anomaly mode: {plain} -- and no word of where\n"
            f"torch.sqrt(h.clamp_min(1e-6)), under anomaly mode: no error; {fixed}")


# -- mixed precision slower than fp32 ------------------------------------------------------------
@dataclass(frozen=True)
class AutocastSpeed:
    """Seconds per training step of an MLP in fp32 and under ``torch.autocast("cpu", dtype)`` (the
    best of `autocast_speed`'s repeats), with what `labkit.hardware.native_precision` says about that
    dtype here."""

    precision: str
    size: int
    fp32_s: float
    autocast_s: float
    native: bool
    why: str

    def __post_init__(self):
        choice("precision", self.precision, ("bf16", "fp16"))
        integer("size", self.size, minimum=1)
        for name in ("fp32_s", "autocast_s"):
            object.__setattr__(self, name, number(name, getattr(self, name), minimum=0, inclusive=False))
        if not isinstance(self.native, bool):
            raise TypeError(f"native must be True or False; got {type(self.native).__name__} {shown(self.native)}")
        if not isinstance(self.why, str):
            raise TypeError(f"why must be a string; got {type(self.why).__name__} {shown(self.why)}")

    @property
    def ratio(self) -> float:
        """Autocast's time over fp32's: above 1 means slower."""
        return self.autocast_s / self.fp32_s

    def check(self):
        """The course's claim for an emulated format, checked here (a `labkit.checks.Check`): where
        labkit.hardware says the format is emulated, autocast is no faster than fp32 (at least 0.9x its
        time). Where it is native the line does not apply (it says so after ``here:``): whether autocast
        gains then depends on the size (`_speed_verdict` checks that with two sizes)."""
        from labkit import checks

        holds = self.native or self.ratio >= 0.9
        state = "native, so this line does not apply" if self.native else "emulated"
        return checks.that(f"where labkit.hardware says {self.precision} is emulated, {self.precision} autocast is "
                           "no faster than fp32 (at least 0.9x its time)", holds,
                           f"{state}; {self.ratio:.2f}x fp32's time at width {self.size}")

    def __str__(self) -> str:
        return (f"width {self.size}: fp32 step {self.fp32_s * 1e3:.3g} ms, {self.precision} autocast step "
                f"{self.autocast_s * 1e3:.3g} ms ({self.ratio:.2f}x fp32's time)")


def autocast_speed(precision: str = "bf16", size: int = 128, repeats: int = 3) -> AutocastSpeed:
    """Time one SGD step of a 2-layer MLP (batch and width `size`) in fp32 and under CPU autocast in
    `precision` ("bf16" or "fp16"): one warm-up step each, then `repeats` steps each, the fp32 and the
    autocast steps taking turns (a burst of other work slows both alike); the best time counts. On one
    thread (``torch.set_num_threads(1)``, restored after), and the time is that thread's CPU time
    (``time.thread_time``): what the step costs, without the time slices a busy machine makes it wait
    for a core.

    Where the CPU has bf16 instructions (AVX512-BF16, AMX), oneDNN runs the bf16 matmuls on them, and
    whether a step gains depends on its size: autocast casts each fp32 weight to bf16 in every forward
    (work that grows as width**2), while the matmuls that speed up grow as width**3. Without them bf16 is
    emulated: on a CPU without AVX-512, PyTorch's bf16 matmul falls back to a generic kernel, many times
    slower than fp32 (notebook 07); with AVX-512 but no bf16 instructions, oneDNN converts to fp32 around
    fp32 arithmetic. The figures depend on this machine (show them in a cell nbval ignores; the `check`
    line is what reads the same everywhere).

    >>> s = autocast_speed(size=32, repeats=1)
    >>> s.precision, s.fp32_s > 0 < s.autocast_s
    ('bf16', True)
    """
    from labkit.hardware import native_precision
    from labkit.train.torch.clinic.case import one_thread

    precision = choice("precision", precision, ("bf16", "fp16"))
    size = integer("size", size, minimum=8, maximum=4096)
    repeats = integer("repeats", repeats, minimum=1, maximum=100)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=gen)
    runs = []
    for low in (False, True):
        model = nn.Sequential(linear(size, size, gen), nn.ReLU(), linear(size, size, gen))
        runs.append((model, torch.optim.SGD(model.parameters(), lr=1e-3), low))

    def step(model, opt, low) -> float:
        start = time.thread_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=low):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return time.thread_time() - start

    with one_thread():
        for run in runs:
            step(*run)  # warm-up: oneDNN builds its kernels for these shapes
        times = [[], []]
        for _ in range(repeats):
            for run, mine in zip(runs, times):
                mine.append(step(*run))
    native = native_precision("torch", precision)
    return AutocastSpeed(precision, size, min(times[0]), min(times[1]), bool(native.native), native.why)


SPEED_SIZES = (64, 256)
"""The cpu-slower entry times bf16 autocast at these two widths (batch = width)."""

_LAST: list[AutocastSpeed] = []


def _measured(new: bool) -> tuple[AutocastSpeed, ...]:
    """The cpu-slower case measures once: its trigger times the steps at both `SPEED_SIZES`, its fix and
    verdict read those figures."""
    if new or not _LAST:
        _LAST[:] = [autocast_speed(size=SPEED_SIZES[0], repeats=9), autocast_speed(size=SPEED_SIZES[1], repeats=5)]
    return tuple(_LAST)


def _speed_text() -> str:
    small, large = _measured(True)
    return "\n".join([str(small), str(large),
                      f"(one SGD step of a 2-layer MLP, batch = width, on one thread, the best of several)",
                      f"labkit.hardware.native_precision('torch', 'bf16'): "
                      f"{'native' if small.native else 'emulated'} ({small.why})"])


def _speed_fix() -> str:
    def pick(s: AutocastSpeed) -> str:
        if s.native and s.ratio < 1:
            return f"native and {s.ratio:.2f}x fp32's time: bf16 autocast gains at this size"
        why = f"{s.ratio:.2f}x fp32's time" + ("" if s.native else ", and bf16 is emulated")
        return f"{why}: train in fp32 at this size"

    return "\n".join(f"width {s.size}: {pick(s)}" for s in _measured(False))


def _speed_verdict(small: AutocastSpeed, large: AutocastSpeed):
    """The cpu-slower entry's claims on two timings of `autocast_speed` (`small` at a smaller width than
    `large`), as a `labkit.checks.Report` whose lines read the same on every CPU: where bf16 is emulated,
    autocast is no faster at either width; where it is native, the gain depends on the size -- autocast's
    time relative to fp32's is lower at the larger width (its casts grow as width**2, the matmuls that
    gain as width**3). On each machine one line is the one that applies; the other says so after
    ``here:``."""
    from labkit import checks

    for name, s in (("small", small), ("large", large)):
        if not isinstance(s, AutocastSpeed):
            raise TypeError(f"{name} must be an AutocastSpeed (from autocast_speed); got {type(s).__name__} "
                            f"{shown(s)}")
    if small.size >= large.size or small.precision != large.precision or small.native != large.native:
        raise ValueError(f"small and large must time one precision on one machine, small at the smaller width; got "
                         f"{small.precision} at {small.size} and {large.precision} at {large.size}")
    p, native = small.precision, small.native
    seen = f"{small.ratio:.2f}x fp32's time at width {small.size}, {large.ratio:.2f}x at width {large.size}"
    return checks.report(
        checks.that(f"where labkit.hardware says {p} is emulated, {p} autocast is no faster than fp32 at either "
                    "width (at least 0.9x its time)", native or min(small.ratio, large.ratio) >= 0.9,
                    ("native, so this line does not apply; " if native else "emulated; ") + seen),
        checks.that(f"where it says native, the gain depends on the size: {p} autocast's time relative to fp32's "
                    f"is lower at width {large.size} than at width {small.size}",
                    not native or large.ratio < small.ratio,
                    ("native; " if native else "emulated, so this line does not apply; ") + seen))


ENTRIES = (
    Entry("deepspeed-min-scale",
          "DeepSpeed fp16 training stops with 'Current loss scale already at minimum'",
          "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
          "DeepSpeed fp16 (ZeRO), dynamic loss scale, a loss that is inf/nan at every step",
          "find what overflows (fp16-forward-overflow, nan-hunting); or train in bf16, which has no loss scale",
          "DeepSpeed's DynamicLossScaler halves the scale at each overflow (after its hysteresis of 2) and "
          "raises when an overflow arrives at min_loss_scale (1): from 2**16 that is 18 overflowing steps in "
          "a row. Gradients that a smaller scale would make finite stop overflowing long before; overflows "
          "that reach the floor come from the forward pass (an activation past 65504, a nan), which no scale "
          "changes. Lowering min_loss_scale only delays the stop.",
          _deepspeed_min_scale, _deepspeed_fix, portable=False,  # DeepSpeed's part: its version, if installed
          verdict=_deepspeed_verdict),
    Entry("nan-hunting",
          "the loss or the gradients are nan, and nothing says where",
          "Function 'SqrtBackward0' returned nan values in its 0th output.",
          "loss = torch.where(h > 0, torch.sqrt(h), 0).sum(); with torch.autograd.detect_anomaly(): loss.backward()",
          "give the op anomaly mode names a safe input: torch.sqrt(h.clamp_min(1e-6))",
          "torch.autograd.detect_anomaly() checks every backward function's output and raises at the first "
          "nan, naming the function: SqrtBackward0. The forward and the loss were finite (torch.where had "
          "dropped sqrt's nan), but where's backward sends 0 to the dropped entries and sqrt's backward, "
          "grad / (2 sqrt(h)), turns 0 into nan there, and it reaches every weight. Anomaly mode also "
          "warns with the traceback of the forward call that made the op. It slows every op: turn it on to "
          "hunt, off to train. (For JAX: jax_debug_nans; for TensorFlow: tf.debugging.enable_check_numerics.)",
          _nan_hunt, _nan_hunt_fix),
    Entry("cpu-slower",
          "bf16 autocast on a CPU is slower than fp32",
          "autocast step",
          "the same MLP step in fp32 and under torch.autocast('cpu', dtype=torch.bfloat16), at two widths",
          "bf16 autocast on a CPU only where labkit.hardware.native_precision('torch', 'bf16') says native and a "
          "timing at your size shows a gain; otherwise fp32",
          "Mixed precision is faster where the hardware multiplies 16-bit numbers faster (Tensor Cores, a TPU, "
          "CPUs with AMX or AVX512-BF16). Without those instructions bf16 is emulated: on a CPU without AVX-512 "
          "PyTorch's bf16 matmul falls back to a generic kernel, many times slower than fp32 (notebook 07), and "
          "with AVX-512 but no bf16 instructions oneDNN converts to fp32 around fp32 arithmetic. Where bf16 is "
          "native, the gain depends on the size: autocast casts every weight to bf16 in every forward, work "
          "that grows as width**2, while the matmuls that speed up grow as width**3, so small layers can lose "
          "what large ones gain. Time it at your size.",
          _speed_text, _speed_fix, portable=False, verdict=lambda: _speed_verdict(*_measured(False))),
)

__all__ = ["ENTRIES", "AutocastSpeed", "autocast_speed"]
