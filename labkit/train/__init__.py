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
from labkit.train.config import DATASETS, FRAMEWORKS, MODELS, PRECISIONS, RunConfig
from labkit.train.loop import RunFailed, StepOut, train
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
        _runner(config.framework)
        from labkit.train import launch

        return launch.run_distributed(config)
    return train(config, _make_stepper)


def _runner(framework: str):
    """The runner module for `framework` (imported now): an ImportError naming the extra if it is missing."""
    try:
        return importlib.import_module(_RUNNERS[choice("framework", framework, FRAMEWORKS)])
    except ImportError as exc:  # the extras are named as the frameworks are
        raise ImportError(f"{framework} runs need the framework: pip install 'labkit[{framework}]' ({exc})") from exc


def _make_stepper(config: RunConfig, data):
    return _runner(config.framework).make_stepper(config, data)


__all__ = ["DATASETS", "FRAMEWORKS", "MODELS", "PRECISIONS", "RunConfig", "RunFailed", "RunResult", "StepOut", "run"]
