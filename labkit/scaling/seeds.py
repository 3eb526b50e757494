"""Seed code kept verbatim: seed 004's hand-written ``DynamicLossScaler``.

The class is copied from seed 004 (its Chinese docstrings translated); labkit adds only
argument checks, on the first line of ``__init__``, ``scale_loss`` and
``unscale_gradients``. :mod:`labkit.scaling.seed004` replays its ``update`` as a value
(``SeedLossScale``, the "seed004" preset) and sets it beside ``torch.amp.GradScaler``.

>>> s = DynamicLossScaler(initial_scale=8, growth_interval=2)
>>> for overflow in (False, False, True):
...     s.update(overflow)
>>> s.scale, s.steps_since_last_overflow
(8.0, 0)
"""

from __future__ import annotations

import numbers

import numpy as np

from labkit._validate import integer
from labkit.scaling import _numbers as num


class DynamicLossScaler:
    """Dynamic loss scaling (seed 004, verbatim but for the argument checks labkit adds on the
    first line of ``__init__``, ``scale_loss`` and ``unscale_gradients``; ``update`` is untouched)."""

    def __init__(self, initial_scale=2**16, growth_interval=2000):
        _check_seed_arguments(initial_scale, growth_interval)
        self.scale = initial_scale
        self.growth_interval = growth_interval
        self.steps_since_last_overflow = 0

    def scale_loss(self, loss):
        """Scale the loss."""
        _check_loss(loss)
        return loss * self.scale

    def unscale_gradients(self, optimizer):
        """Unscale the gradients."""
        _check_optimizer(optimizer)
        for group in optimizer.param_groups:
            for p in group['params']:
                if p.grad is not None:
                    p.grad.data /= self.scale

    def update(self, overflow):
        """Update the scale factor."""
        if overflow:
            self.scale /= 2
            self.steps_since_last_overflow = 0
        else:
            self.steps_since_last_overflow += 1
            if self.steps_since_last_overflow >= self.growth_interval:
                self.scale *= 2
                self.steps_since_last_overflow = 0


def _check_seed_arguments(initial_scale, growth_interval) -> None:
    num.check_scale("initial_scale", initial_scale)
    integer("growth_interval", growth_interval, minimum=1)


def _check_loss(loss) -> None:
    """A number or a tensor (anything with a shape and a dtype: torch, numpy); not a list or a string."""
    if isinstance(loss, (bool, np.bool_)) or not (isinstance(loss, numbers.Real)
                                                  or hasattr(loss, "shape") and hasattr(loss, "dtype")):
        raise TypeError(f"loss must be a number or a tensor; got {type(loss).__name__}")


def _check_optimizer(optimizer) -> None:
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "params" in g for g in groups):
        raise TypeError(f"optimizer must be a torch optimizer (with param_groups); got {type(optimizer).__name__}")


__all__ = ["DynamicLossScaler"]
