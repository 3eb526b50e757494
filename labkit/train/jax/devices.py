"""The devices of a JAX run: one (`select_device`), or a data-parallel mesh and how each
parameter is laid out on it.

A 1-D ``jax.sharding.Mesh`` whose one axis, ``"data"``, splits the batch. ``"dp"`` keeps every
parameter and optimizer state whole on every device (``P()``); ``"fsdp"`` splits each leaf
along its largest dimension divisible by the device count (`shard_dim`), else keeps it whole.
`labkit.train.jax.stepper.JaxStepper` takes such a mesh (None: one device).

>>> partition_spec((64, 32), 4, "fsdp"), partition_spec((64, 32), 4, "dp"), partition_spec((10,), 4, "fsdp")
(P('data',), P(), P())
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from labkit.hardware import detect_cpu
from labkit.train.config import RunConfig

AXIS = "data"
REDUCE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def select_device(requested: str):
    """The JAX device for a config's ``device``; ValueError if that kind is not present.

    "auto" takes JAX's default backend (TPU, then GPU, then CPU); "cuda" needs an NVIDIA GPU,
    "gpu" any GPU JAX can use, "tpu" a TPU.
    """
    if requested == "auto":
        return jax.devices()[0]
    backend = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}.get(requested)
    if backend is None:
        raise ValueError(f"unknown device {requested!r}; choose one of auto, cpu, cuda, gpu, tpu")
    try:
        devices = jax.devices(backend)
    except RuntimeError:
        devices = []
    if requested == "cuda":  # any GPU but an AMD one (JAX's ROCm build also says "gpu")
        devices = [d for d in devices if "rocm" not in str(getattr(d.client, "platform_version", "")).lower()]
    if not devices:
        present = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise ValueError(f"device {requested!r} was requested but JAX sees no {requested.upper()} here "
                         f"(JAX {jax.__version__} has: {present}); use device='auto' or 'cpu'")
    return devices[0]


def describe_device(device) -> str:
    """E.g. "cpu (Intel(R) Xeon(R) ..., 2 cores, jax 0.10.2)" or "gpu (NVIDIA H100 ..., jax ...)"."""
    versions = f"jax {jax.__version__}"
    if device.platform == "cpu":
        cpu = detect_cpu()
        cores = f"{cpu.cores} core" + ("s" if cpu.cores != 1 else "")
        return f"cpu ({cpu.model}, {cores}, {versions})"
    kind = getattr(device, "device_kind", device.platform)
    cc = getattr(device, "compute_capability", None)
    extra = f", compute capability {cc}" if cc else ""
    return f"{device.platform} ({kind}{extra}, {versions})"


def compute_capability(device) -> tuple[int, ...]:
    """An NVIDIA GPU's compute capability, e.g. (8, 0); (99,) for any other device."""
    cc = getattr(device, "compute_capability", None) if device.platform == "gpu" else None
    try:
        return tuple(int(part) for part in str(cc).split("."))
    except ValueError:
        return (99,)


def shard_dim(shape: tuple[int, ...], n: int) -> int | None:
    """The dimension fsdp splits a leaf of this shape along: the largest one divisible by n
    (the first such on ties); None (kept whole on every device) when none is.

    >>> shard_dim((64, 32), 4), shard_dim((10,), 4), shard_dim((), 4)
    (0, None, None)
    """
    best = None
    for dim, size in enumerate(shape):
        if size % n == 0 and size >= n and (best is None or size > shape[best]):
            best = dim
    return best


def partition_spec(shape, n: int, parallel: str) -> P:
    """How a leaf of `shape` lies on an `n`-device mesh: ``P()`` (whole on every device) for
    "dp" or an indivisible leaf, else ``P(None, ..., "data")`` along its `shard_dim`."""
    dim = shard_dim(tuple(shape), n) if parallel == "fsdp" else None
    return P() if dim is None else P(*([None] * dim), AXIS)


def reduce_name(config: RunConfig) -> str:
    """The dtype ("fp32", "bf16", "fp16") the gradients are reduced in across devices: the
    config's ``reduce_dtype``, else the gradients' own dtype."""
    if config.reduce_dtype is not None:
        return config.reduce_dtype
    return "bf16" if config.precision == "bf16-pure" else "fp32"


def make_mesh(requested: str, n: int) -> Mesh:
    """A 1-D mesh of the first `n` devices of the kind `requested` ("auto", "cpu", "cuda", ...);
    ValueError when this process sees fewer."""
    kind = select_device(requested).platform
    devices = jax.devices(kind)
    if len(devices) < n:
        raise ValueError(f"devices={n} needs {n} {kind} devices; JAX sees {len(devices)} "
                         f"(on a CPU, labkit.train.jax.distributed.run starts a process with {n} virtual ones)")
    return Mesh(np.array(devices[:n]), (AXIS,))


__all__ = ["AXIS", "REDUCE_NAMES", "compute_capability", "describe_device", "make_mesh", "partition_spec", "reduce_name",
           "select_device", "shard_dim"]
