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

import dataclasses
from dataclasses import dataclass

from labkit.scaling import _numbers as num
from labkit.scaling.basic import _Scaler


class DynamicLossScaler:
    """Dynamic loss scaling (seed 004, verbatim)."""

    def __init__(self, initial_scale=2**16, growth_interval=2000):
        self.scale = initial_scale
        self.growth_interval = growth_interval
        self.steps_since_last_overflow = 0

    def scale_loss(self, loss):
        """Scale the loss."""
        return loss * self.scale

    def unscale_gradients(self, optimizer):
        """Unscale the gradients."""
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

    @classmethod
    def create(cls, initial_scale=2**16, growth_interval=2000):
        return cls(num.check_scale("initial_scale", initial_scale),
                   num.check_interval("growth_interval", growth_interval))

    def applies(self, finite: bool) -> bool:
        return True

    def adjust(self, finite: bool) -> "SeedLossScale":
        s = self.loss_scale
        if not finite:
            s /= 2
            return dataclasses.replace(self, loss_scale=s, steps_since_last_overflow=0)
        steps = self.steps_since_last_overflow + 1
        if steps >= self.growth_interval:
            s *= 2
            steps = 0
        return dataclasses.replace(self, loss_scale=s, steps_since_last_overflow=steps)


def fast_seed004(flags, opts):
    s, n = opts["initial_scale"], opts["growth_interval"]
    scales, counts = [], []
    keep, track = scales.append, counts.append
    c = 0
    for o in flags:
        keep(s)
        if o:
            s /= 2
            c = 0
        else:
            c += 1
            if c >= n:
                s *= 2
                c = 0
        track(c)
    return scales, [True] * len(flags), {"steps_since_last_overflow": counts}, None, s


def differences_table():
    """Seed 004's scaler next to torch.amp.GradScaler, row by row, as a Table."""
    from labkit.formats import Table

    return Table(("", "seed 004 DynamicLossScaler", "torch.amp.GradScaler"), DIFFERENCES,
                 "Seed 004's hand-written scaler vs PyTorch's")


def seed004_vs_gradscaler(overflows, *, initial_scale=2**16, growth_interval=2000):
    """Run seed 004's class and the real ``torch.amp.GradScaler("cpu")`` side by side.

    Each step gives one real parameter a gradient (inf on an overflow step), then the
    seed's loop (``unscale_gradients``, ``optimizer.step()``, ``update(overflow)``) and
    GradScaler's (``step``, ``update``). Returns a Table: per step, each scaler's scale
    and whether its parameter is still finite. torch is imported here.
    """
    import math

    import torch

    from labkit.formats import Table

    flags = num.check_overflows(overflows)
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
