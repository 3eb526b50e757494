"""The clinic's debugging entries: training that stops (DeepSpeed at its minimum loss scale) and a NaN
found by autograd's anomaly mode. The last entry, mixed precision slower than fp32, lives in
`labkit.train.torch.clinic.speed`."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from labkit.train.logs import logger_level
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

        with logger_level("DeepSpeed", "ERROR"):
            yield
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
)

__all__ = ["ENTRIES"]
