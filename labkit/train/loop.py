"""The training loop every framework shares; a framework supplies only a `Stepper`.

    data    = load(config.dataset)                 same arrays in every framework
    stepper = make_stepper(config, data)           builds model, optimizer, scaler; checks
                                                   the device supports the precision
    for step in range(config.steps):
        x, y = next(batches)                       same order in every framework
        out  = stepper.step(x, y, inject)          one optimizer step, device-synchronised
        record(out)                                appended to config.out at once (its header
                                                   went there before the model was built)
        if out.loss is not finite: stop, "diverged"
    metric = stepper.evaluate(test set)

Keeping the loop here means timing, logging, divergence and interruption behave the same
way in PyTorch, JAX and TensorFlow; the frameworks differ only where they really do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from labkit.memory import MemoryReport
from labkit.train.config import RunConfig
from labkit.train.data import Dataset, batches, load
from labkit.train.result import LogWriteFailed, Recorder, RunResult


@dataclass(frozen=True)
class StepOut:
    """What one optimizer step reports.

    loss: the unscaled loss of the batch (as float); grad_norm: the global norm of the
    unscaled gradients (inf/NaN when they overflowed); scale: the loss scale used in this
    step's backward pass (None without loss scaling); skipped: the update was not applied.
    """

    loss: float
    grad_norm: float
    scale: float | None = None
    skipped: bool = False


class Stepper(Protocol):
    """What a framework supplies. A stepper may also have ``extra() -> dict``: what the run
    adds to ``RunResult.extra`` (the distributed engines report their collectives there)."""

    device: str

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool) -> StepOut: ...

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float: ...

    def nonfinite_layer(self) -> str | None: ...

    def params(self) -> dict[str, np.ndarray]: ...  # the weights under labkit.train.models' names

    def memory(self) -> MemoryReport: ...  # a labkit.memory.MemoryReport's to_dict(): RunResult.memory


class RunFailed(RuntimeError):
    """A run raised an exception; `.result` holds every step it finished."""

    def __init__(self, message: str, result: RunResult):
        super().__init__(message)
        self.result = result


def train(config: RunConfig, make_stepper: Callable[[RunConfig, Dataset], Stepper]) -> RunResult:
    """Run the loop above; raises `RunFailed` (holding every finished step) if anything fails.

    ``config.out`` is checked, opened and given its header first, before any model is built: a
    bad path is a ValueError/TypeError naming it. If `make_stepper` refuses the config (or fails),
    its error is raised as it is and the log is removed: nothing ran.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"train() takes a RunConfig, got {type(config).__name__}")
    try:
        rec = Recorder(config)  # the header is on disk from here on
    except LogWriteFailed as exc:
        raise RunFailed(f"the run failed before its first step: {exc}",
                        RunResult(config=config, status="failed", error=_describe(exc))) from exc
    try:
        data = load(config.dataset, seed=config.seed)
        stepper = make_stepper(config, data)  # raises before any work for an unusable config
    except BaseException:
        rec.discard()
        raise
    bar = None
    try:
        rec.start(stepper.device)
        feed = batches(data, config.batch_size, seed=config.seed)
        inject = set(config.inject_overflow)
        bar = progress_bar(config)
        for i in range(config.steps):
            x, y = next(feed)
            start = time.perf_counter()
            out = stepper.step(x, y, i in inject)
            elapsed = time.perf_counter() - start
            rec.step(out.loss, elapsed, out.grad_norm, out.scale, out.skipped)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{out.loss:.4f}", refresh=False)
            if not math.isfinite(out.loss):
                return rec.end("diverged", diverged_step=i, diverged_where=stepper.nonfinite_layer(),
                               memory=stepper.memory().to_dict(), extra=_extra(stepper))
        accuracy = float(stepper.evaluate(data.x_test, data.y_test))
        return rec.end("ok", metric={"name": "accuracy", "value": accuracy}, memory=stepper.memory().to_dict(),
                       extra=_extra(stepper))
    except KeyboardInterrupt:
        return rec.end("interrupted")  # never raises: a log without its end line reads as interrupted
    except Exception as exc:
        result = rec.end("failed", error=_describe(exc))  # never raises, even when the disk is full
        raise RunFailed(f"the run failed after {result.steps_done} steps: {exc}", result) from exc
    finally:
        if bar is not None:
            bar.close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _extra(stepper) -> dict:
    extra = getattr(stepper, "extra", None)
    return dict(extra()) if extra is not None else {}


def progress_bar(config: RunConfig):
    """A tqdm bar over the run's steps (None when config.progress is off)."""
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, desc=f"{config.framework} {config.precision} {config.model}", leave=False)
