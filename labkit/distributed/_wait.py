"""Waiting for a distributed run's subprocess, with the progress bar the config asks for."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

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
