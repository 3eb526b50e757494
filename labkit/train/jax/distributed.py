"""JAX across devices: starting a run on a ``jax.sharding.Mesh`` of N devices.

The step itself is `labkit.train.jax.stepper.JaxStepper` given a mesh (`labkit.train.jax.devices`):
the same code as one device, with the gradient computed per device inside ``jax.shard_map``
and reduced by an explicit collective. This module only starts the run. Here a CPU pretends
to be N devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set in a fresh
subprocess because JAX fixes its device count when it starts); on N GPUs or a TPU slice the
same code runs in-process on the real devices.

What the collectives move is read from the programs themselves (`labkit.train.jax.hlo.collectives`):
the lowered HLO shows what the program asks for (``bf16[...] all-reduce`` when
``reduce_dtype="bf16"``); the compiled HLO shows what this backend runs. XLA:CPU has no bf16
all-reduce or reduce-scatter, so its compiler promotes them to f32 (the values are still
rounded to bf16 first, so the numerics are bf16's, but the bytes are f32's); GPU and TPU
backends keep them in bf16. Both land in ``RunResult.extra`` (`JaxStepper.extra`).

>>> from labkit.train import RunConfig, run
>>> res = run(RunConfig("jax", "bf16", devices=4, parallel="fsdp", steps=3, progress=False))  # doctest: +SKIP
>>> res.extra["comm_bytes_per_step"], res.extra["reduce_dtype"]                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

from labkit.train import launch
from labkit.train.config import RunConfig
from labkit.train.jax import stepper
from labkit.train.jax.devices import make_mesh, select_device
from labkit.train.loop import RunFailed, train
from labkit.train.result import LogWriteFailed, RunResult, append_end_line


def make_stepper(config: RunConfig, data) -> stepper.JaxStepper:
    """A stepper on a mesh of `config.devices` devices of this process, for the shared loop."""
    _check(config)
    return stepper.make_stepper(config, data)


def _check(config: RunConfig) -> None:
    launch.check_engine(config, "jax", "JAX")


# -- running: in this process, or in a child with N virtual CPU devices --------------------
def run(config: RunConfig) -> RunResult:
    """Train `config` on a ``config.devices``-device mesh and return its RunResult.

    With enough devices of the requested kind here, it runs in this process. On a CPU with
    fewer, it runs ``python -m labkit.train.jax.distributed`` with
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (JAX fixes the count at start-up),
    reading the run back from its JSON lines. ``extra`` holds the mesh, the sharding of
    every parameter, the reduce dtype, the collectives of the compiled and the lowered step
    and their bytes, and which devices overflowed at each step.
    """
    _check(config)
    kind = select_device(config.device).platform  # ValueError for a device that is not here
    if len(jax.devices(kind)) >= config.devices:
        return _run_here(config)
    if kind != "cpu":
        make_mesh(config.device, config.devices)  # raises: not enough GPUs / TPU cores
    return _run_child(config)


def _run_here(config: RunConfig) -> RunResult:
    made = []

    def make(cfg, data):
        made.append(make_stepper(cfg, data))
        return made[0]

    result = train(config, make)
    if made and made[0].compiled is not None:
        result.extra = made[0].extra()
        if config.out:  # the log carries the extras too: RunResult.load reads them back
            try:
                append_end_line(config.out, result.status, result.extra)
            except LogWriteFailed as exc:
                raise RunFailed(f"the run finished, but {exc}", result) from exc
    return result


def _run_child(config: RunConfig) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="labkit-jax-dist-") as tmp:
        out = config.out or str(Path(tmp) / "run.jsonl")
        child = config.replace(out=out, progress=False)
        env = dict(os.environ)
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={config.devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
        root = str(Path(__file__).resolve().parents[3])  # the directory that holds labkit/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen([sys.executable, "-m", "labkit.train.jax.distributed", json.dumps(child.to_dict())],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = launch.wait(proc, config, out)  # a progress bar if config.progress
        except BaseException:
            launch.stop(proc)
            raise
        result = RunResult.load(out) if Path(out).exists() and Path(out).stat().st_size else RunResult(config=config)
        result.config = config
        if proc.returncode != 0:
            tail = stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise RunFailed(f"the {config.devices}-device JAX run failed (exit {proc.returncode}): {tail[0]}", result)
        return result


def main(argv: list[str]) -> int:
    """Child entry point: ``python -m labkit.train.jax.distributed '<RunConfig as JSON>'``."""
    _run_here(RunConfig.from_dict(json.loads(argv[0])))
    return 0


__all__ = ["make_stepper", "run"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
