"""Mixed precision across devices, with each framework's own distributed engine.

``run(config)`` with ``config.devices > 1`` dispatches here: ``labkit.distributed.torch_dist``
(DDP / FSDP2 under torchrun), ``labkit.distributed.jax_dist`` (a jax.sharding mesh),
``labkit.distributed.tf_dist`` (tf.distribute). Results keep labkit.train's RunResult schema, with
``extra["comm_bytes_per_step"]`` and ``extra["reduce_dtype"]``.
"""

from __future__ import annotations

import importlib

from labkit import _validate

_ENGINES = {"torch": "labkit.distributed.torch_dist", "jax": "labkit.distributed.jax_dist", "tf": "labkit.distributed.tf_dist"}


def run(config):
    """Run `config` (devices > 1) on its framework's distributed engine."""
    from labkit.train.config import RunConfig

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig; got {type(config).__name__}")
    if config.devices < 2:
        raise ValueError("labkit.distributed.run is for devices >= 2; labkit.train.run handles one device")
    try:
        engine = importlib.import_module(_ENGINES[config.framework])
    except ModuleNotFoundError as exc:
        raise ValueError(f"no distributed engine for {config.framework} in this labkit ({exc})") from exc
    return engine.run(config)


def check_engine(config, framework: str, name: str) -> None:
    """What every engine checks first: a RunConfig, for its framework, on two or more devices."""
    from labkit.train.config import RunConfig

    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig (the {name} engine's run() takes one), got {type(config).__name__}")
    if config.framework != framework:
        raise ValueError(f"this is the {name} engine: it runs framework={_validate.shown(framework)}, got {config.framework!r}")
    if config.devices < 2:
        raise ValueError(f"the {name} engine needs devices >= 2, got {config.devices}; one device runs via "
                         "labkit.train.run")
