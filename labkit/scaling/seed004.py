"""Seed 004's hand-written ``DynamicLossScaler``, kept verbatim, and how it differs from
``torch.amp.GradScaler``.

The class below is copied from seed 004 (its Chinese docstrings translated). Its
``update`` rule is torch's, so fed the same overflow flags it produces the same scales
-- until float32 matters. What it lacks is everything around the rule; see
:data:`DIFFERENCES`.

>>> s = SeedLossScale.create()
>>> s.loss_scale, s.adjust(False).loss_scale, s.applies(False)
(65536, 32768.0, True)
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from labkit._validate import integer
from labkit.scaling import _numbers as num
from labkit.scaling.basic import ScalerStopped, _Scaler
from labkit.scaling.torch_amp import INT64_MAX

# Python's int / int raises when the quotient is past float64's range: the seed's int scale
# can grow that far (it stays an int until the first halving), and then `scale /= 2` fails.
STOP_MESSAGE = "OverflowError: integer division result too large for a float"


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


DIFFERENCES = (
    ("detects overflow", "no: the caller must pass `overflow`",
     "yes: unscale_() checks every grad for inf/nan (found_inf)"),
    ("skips the optimizer step on overflow", "no: it has no step(); inf/nan reach the weights",
     "yes: scaler.step(opt) skips opt.step()"),
    ("scale storage", "Python number (int until the first halving, then float64)",
     "float32 tensor on the device"),
    ("many overflows in a row", "reaches 0.0 after 1091 halvings from 2**16 (float64)",
     "reaches 0.0 after 166 halvings from 2**16 (float32)"),
    ("growth into inf", "not checked", "refused: isfinite(new_scale)"),
    ("factors", "fixed 2 and 1/2", "growth_factor, backoff_factor"),
    ("counter test", "steps >= growth_interval (same steps)", "growth_tracker + 1 == growth_interval"),
    ("unscaling", "p.grad /= scale, one parameter at a time", "fused multiply by 1/scale, with the inf check"),
    ("unscale twice / clip then step", "nothing prevents double unscaling",
     "per-optimizer state: unscale_() twice raises"),
    ("checkpointing", "no state_dict", "state_dict() / load_state_dict()"),
)


@dataclass(frozen=True)
class SeedLossScale(_Scaler):
    """Seed 004's ``DynamicLossScaler.update`` as a value (same numbers, Python semantics)::

        if overflow: scale /= 2; steps_since_last_overflow = 0
        else:
            steps_since_last_overflow += 1
            if steps_since_last_overflow >= growth_interval: scale *= 2; steps = 0
        # nothing skips the step: applies() is always True

    Defaults ``initial_scale=2**16``, ``growth_interval=2000`` (torch's).
    """

    loss_scale: float = 2**16
    growth_interval: int = 2000
    steps_since_last_overflow: int = 0

    TRACKED = ("steps_since_last_overflow",)
    COUNTER = "steps_since_last_overflow"

    def __post_init__(self):
        self._set(loss_scale=num.check_scale("loss_scale", self.loss_scale),
                  growth_interval=integer("growth_interval", self.growth_interval, minimum=1))
        self._set(steps_since_last_overflow=num.check_counter(
            "steps_since_last_overflow", self.steps_since_last_overflow, self.growth_interval, "growth_interval"))

    @classmethod
    def create(cls, initial_scale=2**16, growth_interval=2000):
        return cls(num.check_scale("initial_scale", initial_scale), growth_interval)

    def _applies(self, finite: bool) -> bool:
        return True

    def _adjust(self, finite: bool) -> "SeedLossScale":
        s = self.loss_scale
        if not finite:
            try:
                s /= 2
            except OverflowError:
                raise ScalerStopped(STOP_MESSAGE) from None
            return self._next(loss_scale=s, steps_since_last_overflow=0)
        steps = self.steps_since_last_overflow + 1
        if steps >= self.growth_interval:
            s *= 2
            steps = 0
        return self._next(loss_scale=s, steps_since_last_overflow=steps)


def fast_seed004(flags, opts):
    s, n = opts["initial_scale"], opts["growth_interval"]
    scales, counts = [], []
    keep, track = scales.append, counts.append
    c, stopped = 0, None
    for it, o in enumerate(flags):
        keep(s)
        if o:
            try:
                s /= 2
            except OverflowError:
                track(c)
                stopped = it
                break
            c = 0
        else:
            c += 1
            if c >= n:
                s *= 2
                c = 0
        track(c)
    return scales, [True] * len(scales), {"steps_since_last_overflow": counts}, stopped, s


def differences_table():
    """Seed 004's scaler next to torch.amp.GradScaler, row by row, as a Table."""
    from labkit.table import Table

    return Table(("", "seed 004 DynamicLossScaler", "torch.amp.GradScaler"), DIFFERENCES,
                 "Seed 004's hand-written scaler vs PyTorch's")


MAX_TABLE_STEPS = 10_000


def seed004_vs_gradscaler(overflows, *, initial_scale=2**16, growth_interval=2000):
    """Run seed 004's class and the real ``torch.amp.GradScaler("cpu")`` side by side.

    Each step gives one real parameter a gradient (inf on an overflow step), then the
    seed's loop (``unscale_gradients``, ``optimizer.step()``, ``update(overflow)``) and
    GradScaler's (``step``, ``update``). Returns a Table: per step, each scaler's scale
    and whether its parameter is still finite. At most ``MAX_TABLE_STEPS`` steps (a
    table to read); ``initial_scale`` must be one a float32 holds (GradScaler's scale is
    float32). torch is imported here.
    """
    import math

    flags = num.check_overflows(overflows)
    if len(flags) > MAX_TABLE_STEPS:
        raise ValueError(f"overflows must have at most {MAX_TABLE_STEPS} steps (one table row each); "
                         f"got {len(flags)}")
    initial_scale = num.check_scale("initial_scale", initial_scale)
    num.check_scale("initial_scale", initial_scale, float32=True)
    growth_interval = integer("growth_interval", growth_interval, minimum=1, maximum=INT64_MAX)

    import torch

    from labkit.table import Table

    p_seed, p_torch = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt_seed, opt_torch = torch.optim.SGD([p_seed], lr=0.1), torch.optim.SGD([p_torch], lr=0.1)
    seed = DynamicLossScaler(initial_scale, growth_interval)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=float(initial_scale), growth_interval=growth_interval)
    grad_scaler.scale(torch.ones(()))  # creates its scale tensor
    rows = []
    for step, overflow in enumerate(flags):
        scales = (seed.scale, grad_scaler.get_scale())
        p_seed.grad = torch.full((1,), math.inf) if overflow else seed.scale_loss(torch.ones(1))
        seed.unscale_gradients(opt_seed)
        opt_seed.step()
        seed.update(overflow)
        p_torch.grad = torch.full((1,), math.inf) if overflow else grad_scaler.scale(torch.ones(1))
        grad_scaler.step(opt_torch)
        grad_scaler.update()
        rows.append((str(step), "overflow" if overflow else "", f"{scales[0]:g}",
                     "yes" if bool(torch.isfinite(p_seed).all()) else "NO (nan/inf)", f"{scales[1]:g}",
                     "yes" if bool(torch.isfinite(p_torch).all()) else "NO (nan/inf)"))
    columns = ("step", "grads", "seed scale", "seed weights finite", "GradScaler scale", "GradScaler weights finite")
    return Table(columns,
                 tuple(rows), "Seed 004's scaler and torch.amp.GradScaler on the same steps (real torch, CPU)")
