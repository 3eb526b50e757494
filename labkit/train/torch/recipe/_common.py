"""What every part of the AMP recipe trains with: the digits MLP and its batches (`mlp`, `batches`),
the 16-bit dtypes (`DTYPE`), an overflow injected at chosen steps (`overflow_hook`), and a log of the
aten ops a few lines run (`OpLog`, which counts autocast's casts)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from labkit._validate import integer
from labkit.train.torch.clinic.case import dtype_name  # noqa: F401 -- the recipe's modules import it from here

DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
LOW = tuple(DTYPE)


@functools.lru_cache(maxsize=1)
def digits():
    from labkit.train import data
    return data.load("digits", seed=0)


def batches(batch_size: int, seed: int):
    from labkit.train import data
    for x, y in data.batches(digits(), batch_size, seed=seed):
        yield torch.from_numpy(x), torch.from_numpy(y).long()


def mlp(width: int, seed: int):
    from labkit.train import models
    from labkit.train.torch.models import build
    return build("mlp", models.init_params("mlp", seed=seed, width=width))


def steps_set(name: str, value, steps: int) -> frozenset[int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be a list of step numbers (integers); got {type(value).__name__} {value!r:.60}")
    return frozenset(integer(name, s, minimum=0, maximum=steps - 1) for s in value)


def overflow_hook(param, when: frozenset[int], counter: list[int]):
    """Turn `param`'s gradient into +inf at the steps in `when` (counter[0] is the current step): an
    overflow injected where we choose, as a too-large loss scale makes one."""
    return param.register_hook(lambda g: torch.full_like(g, math.inf) if counter[0] in when else g)


class OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run inside ``with OpLog():``, each with the dtypes of its first three tensor
    arguments (`ops`); `casts` counts the ``aten._to_copy`` calls among them, autocast's casts."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func.overloadpacket).removeprefix("aten."), [dtype_name(a.dtype) for a in args[:3]
                                                                           if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))

    @property
    def casts(self) -> int:
        return sum(name == "_to_copy" for name, _ in self.ops)


__all__ = ["DTYPE", "LOW", "OpLog", "batches", "digits", "dtype_name", "mlp", "overflow_hook", "steps_set"]
