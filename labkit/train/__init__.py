"""Real mixed precision training runs in PyTorch, JAX/Flax and TensorFlow/Keras.

>>> from labkit.train import RunConfig, run
>>> res = run(RunConfig("torch", "bf16", steps=5, progress=False))   # doctest: +SKIP
>>> res.status, len(res.losses)                                      # doctest: +SKIP
('ok', 5)

The framework is imported only when a run for it starts.
"""

from __future__ import annotations

import importlib

from labkit.train.config import DATASETS, FRAMEWORKS, MODELS, PRECISIONS, RunConfig
from labkit.train.loop import RunFailed, StepOut, train
from labkit.train.result import RunResult

_RUNNERS = {"torch": "labkit.train.torch_runner", "jax": "labkit.train.jax_runner", "tf": "labkit.train.tf_runner"}


def run(config: RunConfig) -> RunResult:
    """Train as `config` says and return the result (also written to `config.out` as it goes)."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"run() takes a RunConfig, got {type(config).__name__}; e.g. run(RunConfig('torch', 'bf16'))")
    try:
        runner = importlib.import_module(_RUNNERS[config.framework])
    except ImportError as exc:  # the extras are named as the frameworks are
        raise ImportError(f"{config.framework} runs need the framework: "
                          f"pip install 'labkit[{config.framework}]' ({exc})") from exc
    if config.devices > 1:
        from labkit import distributed

        return distributed.run(config)
    return train(config, runner.make_stepper)


__all__ = ["DATASETS", "FRAMEWORKS", "MODELS", "PRECISIONS", "RunConfig", "RunFailed", "RunResult", "StepOut", "run"]
