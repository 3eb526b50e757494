"""What `labkit bench` will run: its cells (framework x model x shape x precision) and their sizes.

Nothing here imports a framework: the command line checks every option with it before a run.

>>> cells(["torch"], ["fp32", "bf16"], ["mlp"])[:2]
[('torch', 'mlp', 'aligned', 'fp32'), ('torch', 'mlp', 'aligned', 'bf16')]
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from labkit._validate import choice, integer, names, number, shown
from labkit.memory.shapes import check_sizes, transformer_shape
from labkit.train.config import DEVICES, FRAMEWORKS, MODELS, PRECISIONS

DEFAULT_WIDTH = {"mlp": 2048, "transformer": 256}
DEFAULT_BATCH = 512


def _split(values, allowed, what: str) -> list[str]:
    """A list of names from `allowed`: a list, one name, or one comma-separated string ("torch,jax")."""
    items = names(what, [v.strip() for v in values.split(",")] if isinstance(values, str) else values, allowed)
    if not items:
        raise ValueError(f"no {what} given; choose from {', '.join(allowed)}")
    return items


def cells(frameworks, precisions, models, odd_sizes: bool = False) -> list[tuple[str, str, str, str]]:
    """(framework, model, shape, precision) in run order: fp32 first in each group."""
    _flag("odd_sizes", odd_sizes)
    fws = _split(frameworks, FRAMEWORKS, "framework")
    precs = _split(precisions, PRECISIONS, "precision")
    precs = sorted(set(precs), key=lambda p: (p != "fp32", PRECISIONS.index(p)))
    mods = _split(models, MODELS, "model")
    shapes = ("aligned", "odd") if odd_sizes else ("aligned",)
    return [(f, m, s, p) for f in fws for m in mods for s in shapes for p in precs]


SHAPES = ("aligned", "odd")


def shape_of(model: str, shape: str, batch_size: int | None, width: int | None) -> tuple[int, int]:
    """Batch size and width for a cell: aligned defaults (None), or odd neighbours of them.

    "odd" runs batch size - 1 and width - 1 (the transformer: width - 4, keeping its 4 heads, each
    of an odd size), so it needs a batch size of 2 or more and a width of 2 (transformer: 8) or more.

    >>> shape_of("mlp", "odd", 64, 256)
    (63, 255)
    """
    shape = choice("shape", shape, SHAPES)
    model, b, w = check_sizes(model, DEFAULT_BATCH if batch_size is None else batch_size, width)
    w = DEFAULT_WIDTH[model] if w is None else w
    if model == "transformer":
        transformer_shape(w)  # 4 heads must divide it
    if shape == "odd":
        less = 4 if model == "transformer" else 1  # transformer: 4 heads, so d_head becomes odd
        if b < 2 or w <= less:
            raise ValueError(f"odd sizes also run batch size - 1 and width - {less}: they need a batch "
                             f"size of 2 or more and a width of {less + 1 if less == 1 else 2 * less} or more for "
                             f"the {model}; got batch size {b}, width {w}")
        b, w = b - 1, w - less
    return b, w


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {type(value).__name__} {shown(value)}")
    return bool(value)


def _plan(frameworks=("torch",), precisions=("fp32", "bf16"), models=("mlp",), *, batch_size: int | None = None,
          width: int | None = None, warmup: int = 2, steps: int | None = None, device: str = "auto",
          odd_sizes: bool = False, max_seconds: float = 20.0, on_cell: Callable[[dict], None] | None = None,
          ) -> list[tuple[str, str, str, str]]:
    """What `bench` checks before it runs a cell, and its plan (`cells`); a bad value is a
    ValueError or TypeError that names it. Nothing is imported or run."""
    integer("warmup", warmup, minimum=0, maximum=MAX_STEPS)
    if steps is not None:
        integer("steps", steps, minimum=1, maximum=MAX_STEPS)
    number("max_seconds", max_seconds, minimum=0, inclusive=False)
    choice("device", device, DEVICES)
    if on_cell is not None and not callable(on_cell):
        raise TypeError(f"on_cell must be a function of one record, or None; got {type(on_cell).__name__}")
    plan = cells(frameworks, precisions, models, odd_sizes)
    for model, shape in dict.fromkeys((m, s) for _, m, s, _ in plan):
        shape_of(model, shape, batch_size, width)
    return plan


SMALL = {"mlp": (64, 256), "transformer": (8, 64)}
"""(batch, width) at which an emulated precision is timed, next to fp32 at the same size."""
MIN_STEPS = 3  # timed steps a measurement needs, at the least
MAX_STEPS = 100_000  # warm-up or timed steps of one cell, at the most


__all__ = ["DEFAULT_BATCH", "DEFAULT_WIDTH", "MAX_STEPS", "MIN_STEPS", "SHAPES", "SMALL", "cells", "shape_of"]
