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
`train_in_turns` drives several runs through the same loop, one step of each in turn, so that
their step times can be compared.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from labkit._validate import shown
from labkit.memory import MemoryReport
from labkit.train.config import RunConfig
from labkit.train.data import Dataset, batches, load
from labkit.train.result import LogWriteFailed, Recorder, RunResult, log_path


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
    return _turns([config], make_stepper)[0]


def _check_configs(configs) -> None:
    """What `train_in_turns` refuses before it builds anything: not a non-empty list of RunConfigs, a
    multi-device config, or two runs writing one log file."""
    if isinstance(configs, RunConfig) or not isinstance(configs, (list, tuple)):
        raise TypeError("configs must be a list of RunConfigs, e.g. [RunConfig('torch', p) for p in ('fp32', "
                        f"'bf16')]; got {type(configs).__name__} {shown(configs)}")
    if not configs:
        raise ValueError("configs must hold at least one RunConfig")
    for i, c in enumerate(configs):
        if not isinstance(c, RunConfig):
            raise TypeError(f"configs must hold RunConfigs; configs[{i}] is {type(c).__name__} {shown(c)}")
        if c.devices > 1:
            raise ValueError(f"configs[{i}] asks for devices={c.devices}: runs in turns take one device each "
                             "(run a multi-device config with run())")
    outs = [str(log_path(c.out)) for c in configs if c.out is not None]
    shared = sorted({o for o in outs if outs.count(o) > 1})
    if shared:
        raise ValueError(f"configs write to the same out file ({', '.join(shared)}): give each run its own out, "
                         "or None")


def train_in_turns(configs, make_stepper: Callable[[RunConfig, Dataset], Stepper]) -> list[RunResult]:
    """The loop above for several runs at once, one step of each in turn, so that their step times
    are measured side by side (`labkit.train.run_in_turns` says why)::

        build every stepper (a refused config: its error, and no run starts)
        for round k = 0, 1, ...:                   until every run has ended
            for each run still going, from run k mod n on:
                one step of it (after its last step: its evaluation)

    Each run keeps its own batches, log and result; a run that diverges ends there and the others go
    on. If one fails, it ends "failed", the others "interrupted", and `RunFailed` holds the failed
    one's result; an interrupt ends every unfinished run "interrupted" and returns them all.
    """
    _check_configs(configs)
    return _turns(configs, make_stepper)


def _turns(configs: list[RunConfig], make_stepper) -> list[RunResult]:
    """`train_in_turns`' loop, for checked configs; `train` is its one-run case."""
    lives: list[_Live] = []
    try:
        for c in configs:
            lives.append(_Live(c, make_stepper))
    except BaseException:
        for live in lives:
            live.rec.discard()  # nothing ran
        raise
    results: list[RunResult | None] = [None] * len(lives)
    current = 0
    try:
        for current, live in enumerate(lives):
            live.start()
        k = 0
        while any(r is None for r in results):
            for j in range(len(lives)):
                current = (k + j) % len(lives)  # who goes first changes every round
                if results[current] is None:
                    results[current] = lives[current].advance()
            k += 1
        return results
    except KeyboardInterrupt:  # never raises: a log without its end line reads as interrupted
        return [r if r is not None else live.rec.end("interrupted") for r, live in zip(results, lives)]
    except Exception as exc:
        failed = lives[current].rec.end("failed", error=_describe(exc))  # never raises, even when the disk is full
        for j, live in enumerate(lives):
            if results[j] is None and j != current:
                live.rec.end("interrupted")
        c = configs[current]
        which = "the run" if len(configs) == 1 else f"run {current} ({c.framework} {c.precision} {c.model})"
        raise RunFailed(f"{which} failed after {failed.steps_done} steps: {exc}", failed) from exc
    finally:
        for live in lives:
            live.close()


class _Live:
    """One run the loop drives: its log (`Recorder`), its stepper, its batches and its progress bar."""

    def __init__(self, config: RunConfig, make_stepper):
        try:
            self.rec = Recorder(config)  # the header is on disk from here on
        except LogWriteFailed as exc:
            raise RunFailed(f"the run failed before its first step: {exc}",
                            RunResult(config=config, status="failed", error=_describe(exc))) from exc
        try:
            self.data = load(config.dataset, seed=config.seed)
            self.stepper = make_stepper(config, self.data)  # raises before any work for an unusable config
        except BaseException:
            self.rec.discard()
            raise
        self.config, self.bar, self.i = config, None, 0

    def start(self) -> None:
        self.rec.start(self.stepper.device)
        self.feed = batches(self.data, self.config.batch_size, seed=self.config.seed)
        self.inject = set(self.config.inject_overflow)
        self.bar = progress_bar(self.config)

    def advance(self) -> RunResult | None:
        """One step, timed around ``stepper.step`` alone; after the last, the evaluation. The
        result once the run has ended ("ok" or "diverged"), else None."""
        if self.i < self.config.steps:
            x, y = next(self.feed)
            start = time.perf_counter()
            out = self.stepper.step(x, y, self.i in self.inject)
            elapsed = time.perf_counter() - start
            self.rec.step(out.loss, elapsed, out.grad_norm, out.scale, out.skipped)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{out.loss:.4f}", refresh=False)
            self.i += 1
            if not math.isfinite(out.loss):
                return self.rec.end("diverged", diverged_step=self.i - 1, diverged_where=self.stepper.nonfinite_layer(),
                                    memory=self.stepper.memory().to_dict(), extra=_extra(self.stepper))
            return None
        accuracy = float(self.stepper.evaluate(self.data.x_test, self.data.y_test))
        return self.rec.end("ok", metric={"name": "accuracy", "value": accuracy},
                            memory=self.stepper.memory().to_dict(), extra=_extra(self.stepper))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


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
