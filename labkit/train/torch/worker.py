"""One rank of a PyTorch DDP / FSDP2 / DeepSpeed ZeRO run; ``torchrun`` starts one of these per process.

    python -m torch.distributed.run --nproc-per-node=2 ... -m labkit.train.torch.worker spec.json

`labkit.train.torch.distributed.run` writes ``spec.json`` (``{"config": RunConfig.to_dict(),
"out": path, "backend": "gloo" | "nccl"}``) and launches this module. Every rank runs the shared
loop (`labkit.train.loop.train`) over the one `TorchStepper`, with the engine
``config.parallel`` names: `labkit.train.torch.parallel.DDP` (``"dp"``), ``FSDP2``
(``"fsdp"``) or `labkit.train.torch.deepspeed_engine.DeepSpeedZero` (``"zero1"``, ``"zero2"``).
Rank 0 writes the JSON-lines log that `RunResult.load` reads back.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys

import torch
import torch.distributed as dist

from labkit.train.config import RunConfig
from labkit.train.loop import train
from labkit.train.torch.devices import where
from labkit.train.torch.stepper import TorchStepper


def engine_for(config: RunConfig, rank: int, world: int):
    """The per-process engine ``config.parallel`` names ("dp", "fsdp", "zero1", "zero2")."""
    if config.parallel.startswith("zero"):
        from labkit.train.torch.deepspeed_engine import DeepSpeedZero

        return DeepSpeedZero(rank, world)
    from labkit.train.torch.parallel import DDP, FSDP2

    return DDP(rank, world) if config.parallel == "dp" else FSDP2(rank, world)


def train_rank(config: RunConfig, out: str | None) -> None:
    """The shared loop on this rank over the one stepper with its engine; rank 0 records the run."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # DeepSpeed takes the GPU wherever there is one; DDP / FSDP2 take it with nccl
    gpu = torch.cuda.is_available() if config.parallel.startswith("zero") else dist.get_backend() == "nccl"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mine = config.replace(out=out if rank == 0 else None, progress=False)

    def stepper(cfg: RunConfig, data) -> TorchStepper:
        engine = engine_for(cfg, rank, world)
        s = TorchStepper(cfg, data, device, "", engine)
        s.device = f"{world} processes, {engine.name}, {dist.get_backend()}; each on {where(device)}"
        return s

    train(mine, stepper)


def init_process_group(config: RunConfig, backend: str, timeout: datetime.timedelta) -> None:
    """torch's process group, or DeepSpeed's ``init_distributed`` (which makes one) for ZeRO."""
    if not config.parallel.startswith("zero"):
        dist.init_process_group(backend, timeout=timeout)
        return
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # its per-step INFO lines go nowhere useful
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)


def main(argv: list[str]) -> int:
    """One rank: read the spec, join the process group, train, then wait for every rank and
    tear the group down."""
    if len(argv) != 2:
        raise SystemExit("usage: torchrun ... -m labkit.train.torch.worker SPEC.json")
    with open(argv[1]) as f:
        spec = json.load(f)
    config = RunConfig.from_dict(spec["config"])  # a bad spec fails here, before any collective
    backend = "nccl" if spec.get("backend") == "nccl" else "gloo"
    init_process_group(config, backend, datetime.timedelta(seconds=spec.get("timeout_s", 300)))
    try:
        train_rank(config, spec.get("out"))
        dist.barrier()  # nobody tears gloo down while a peer still talks to it (that aborts the peer)
    finally:
        dist.destroy_process_group()
    return 0


def exit_after(main) -> None:
    """Run ``main(sys.argv)`` under torchrun's ``@record`` (an exception's traceback goes into the
    failure summary torchrun prints, which `labkit.train.torch.distributed.run` passes on), then
    leave at once.

    Everything is written by then (the Recorder fsyncs each line) and the process group is gone.
    Leaving without C++ static destructors matters: after torch.profiler has run, its thread can
    still be joinable at interpreter exit, and its destructor then aborts the process
    ("terminate called without an active exception", SIGABRT) -- seen in about one launch in ten
    on this CPU, after the run had finished.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    code = record(main)(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    exit_after(main)
