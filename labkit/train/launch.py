"""Launching a run on two or more devices: the framework's distributed engine, and waiting for its subprocess.

``run(config)`` with ``config.devices > 1`` comes here: ``labkit.train.torch.distributed``
(DDP / FSDP2 / DeepSpeed under torchrun), ``labkit.train.jax.distributed`` (a jax.sharding mesh),
``labkit.train.tf.distributed`` (tf.distribute). Results keep RunResult's schema, with
``extra["comm_bytes_per_step"]`` and ``extra["reduce_dtype"]``.
"""

from __future__ import annotations

import importlib
import subprocess
import time
from pathlib import Path

from labkit import _validate
from labkit.train.config import RunConfig
from labkit.train.loop import progress_bar


def steps_logged(out) -> int:
    """How many steps the JSON-lines log at `out` holds so far (0 if it does not exist yet)."""
    try:
        return Path(out).read_text().count('"kind": "step"')
    except (OSError, TypeError):
        return 0


def wait(proc: subprocess.Popen, config: RunConfig, out, timeout_s: float | None = None) -> tuple[str, str]:
    """``proc.communicate()``, showing a tqdm bar of the steps logged to `out` when ``config.progress``.

    Raises ``subprocess.TimeoutExpired`` after `timeout_s`; the caller stops the process.
    """
    bar = progress_bar(config)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            poll = 0.5 if bar is not None else None  # None: wait until it ends
            if deadline is not None:
                left = max(deadline - time.monotonic(), 0.0)
                poll = left if poll is None else min(poll, left)
            try:
                return proc.communicate(timeout=poll)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if bar is not None:
                    bar.update(min(steps_logged(out), config.steps) - bar.n)
    finally:
        if bar is not None:
            bar.update(min(steps_logged(out), config.steps) - bar.n)
            bar.close()


def stop(proc: subprocess.Popen) -> None:
    """Kill `proc` and collect it (after a timeout or an interrupt)."""
    proc.kill()
    proc.communicate()

_ENGINES = {"torch": "labkit.train.torch.distributed", "jax": "labkit.train.jax.distributed", "tf": "labkit.train.tf.distributed"}


def run_distributed(config):
    """Run `config` (devices > 1) on its framework's distributed engine (`labkit.train.run` calls it)."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig; got {type(config).__name__}")
    if config.devices < 2:
        raise ValueError("run_distributed is for devices >= 2; labkit.train.run handles one device")
    try:
        engine = importlib.import_module(_ENGINES[config.framework])
    except ModuleNotFoundError as exc:
        raise ValueError(f"no distributed engine for {config.framework} in this labkit ({exc})") from exc
    return engine.run(config)


def check_engine(config, framework: str, name: str) -> None:
    """What every engine checks first: a RunConfig, for its framework, on two or more devices."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig (the {name} engine's run() takes one), got {type(config).__name__}")
    if config.framework != framework:
        raise ValueError(f"this is the {name} engine: it runs framework={_validate.shown(framework)}, got {config.framework!r}")
    if config.devices < 2:
        raise ValueError(f"the {name} engine needs devices >= 2, got {config.devices}; one device runs via "
                         "labkit.train.run")


__all__ = ["check_engine", "run_distributed"]  # wait / stop / steps_logged serve the engines
