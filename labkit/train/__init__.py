"""Real mixed precision training runs in PyTorch, JAX/Flax and TensorFlow/Keras.

>>> from labkit.train import RunConfig, run
>>> res = run(RunConfig("torch", "bf16", steps=5, progress=False))   # doctest: +SKIP
>>> res.status, len(res.losses)                                      # doctest: +SKIP
('ok', 5)

The framework is imported only when a run for it starts.
"""

from __future__ import annotations

import importlib

from labkit._validate import choice
from labkit.train import data, models, report
from labkit.train.config import DATASETS, FRAMEWORKS, MODELS, PRECISIONS, TORCH_OPTIMIZERS, TORCH_PRECISIONS, RunConfig
from labkit.train.lessons import GradientError, gradient_error, gradient_error_table, moved_fraction
from labkit.train.loop import RunFailed, StepOut, train, train_in_turns
from labkit.train.result import RunResult, log_path

_RUNNERS = {"torch": "labkit.train.torch.stepper", "jax": "labkit.train.jax.stepper", "tf": "labkit.train.tf.stepper"}


def run(config: RunConfig) -> RunResult:
    """Train as `config` says and return the result (also written to `config.out` as it goes).

    ``config.out`` is checked before anything else, and on one device its header line is
    written before the framework is imported. Raises `RunFailed` (``.result`` holds every
    finished step) if the run fails, a full disk included.
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"run() takes a RunConfig, got {type(config).__name__}; e.g. run(RunConfig('torch', 'bf16'))")
    if config.devices > 1:
        if config.out is not None:
            log_path(config.out)  # the engines' subprocesses write it
        runner(config.framework)
        from labkit.train import launch

        return launch.run_distributed(config)
    return train(config, _make_stepper)


def run_in_turns(configs) -> list[RunResult]:
    """Train every config in `configs`, one step of each in turn, and return their results in order.

    Use it to compare step times: run one after the other, a run that happens to meet a burst of
    other work on the machine (another program, a notebook next door) is slowed alone, and its
    speed ratio to the others is that burst's, not its precision's. In turns, a burst slows every
    run alike; who goes first changes every round. Each run's losses, scales and accuracy are those
    `run(config)` gives (the runs share no state: the same config gives the same numbers either
    way); only `step_times` are measured differently. Every model is held in memory at once, and on
    a GPU a peak-memory figure (``peak_bytes``) is the process's, shared by the runs. One device per
    run (``devices=1``).

    >>> fast, slow = run_in_turns([RunConfig("torch", p, steps=20, progress=False)     # doctest: +SKIP
    ...                            for p in ("fp32", "bf16")])
    """
    return train_in_turns(configs, _make_stepper)


def runner(framework: str):
    """The runner module of `framework` (``labkit.train.torch.stepper`` ...), imported now, whose
    ``make_stepper(config, data)`` builds the `Stepper` the loop drives; an ImportError naming the
    extra if the framework is missing."""
    try:
        return importlib.import_module(_RUNNERS[choice("framework", framework, FRAMEWORKS)])
    except ImportError as exc:  # the extras are named as the frameworks are
        raise ImportError(f"{framework} runs need the framework: pip install 'labkit[{framework}]' ({exc})") from exc


def _make_stepper(config: RunConfig, data):
    return runner(config.framework).make_stepper(config, data)


__all__ = ["DATASETS", "FRAMEWORKS", "GradientError", "MODELS", "PRECISIONS", "RunConfig", "TORCH_OPTIMIZERS", "TORCH_PRECISIONS", "RunFailed", "RunResult", "StepOut",
           "data", "gradient_error", "gradient_error_table", "models", "moved_fraction", "report", "run", "run_in_turns",
           "runner"]
