"""Seed 004's hand-written ``DynamicLossScaler`` (kept verbatim in :mod:`labkit.scaling.seeds`)
as a value, and how it differs from ``torch.amp.GradScaler``.

Its ``update`` rule is torch's, so fed the same overflow flags it produces the same scales
-- until float32 matters. What it lacks is everything around the rule; see
:data:`SEED004_DIFFERENCES`.

>>> s = SeedLossScale.create()
>>> s.loss_scale, s.adjust(False).loss_scale, s.applies(False)
(65536, 32768.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit._validate import integer
from labkit.scaling import _numbers as num
from labkit.scaling.basic import Facts, ScalerStopped, _Scaler
from labkit.scaling.seeds import DynamicLossScaler
from labkit.scaling.torch_amp import INT64_MAX

# Python's int / int raises when the quotient is past float64's range: the seed's int scale
# can grow that far (it stays an int until the first halving), and then `scale /= 2` fails.
STOP_MESSAGE = "OverflowError: integer division result too large for a float"


SEED004_DIFFERENCES = (
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

    STATE = ("loss_scale", "steps_since_last_overflow")
    TRACKED = ("steps_since_last_overflow",)
    COUNTER = "steps_since_last_overflow"
    FACTS = Facts("seed 004's hand-written DynamicLossScaler", "seeds/004 (the course's source document)",
                  "initial_scale", "growth_interval", "Python number", "none", "none", "applied (no check); scale / 2")

    def __post_init__(self):
        self._set(loss_scale=num.check_scale("loss_scale", self.loss_scale),
                  growth_interval=integer("growth_interval", self.growth_interval, minimum=1))
        self._set(steps_since_last_overflow=num.check_counter(
            "steps_since_last_overflow", self.steps_since_last_overflow, self.growth_interval, "growth_interval"))

    @classmethod
    def create(cls, initial_scale=2**16, growth_interval=2000):
        return cls(num.check_scale("initial_scale", initial_scale), growth_interval)

    def rule(self):
        growth_interval = self.growth_interval

        def step(finite, state):
            scale, steps = state
            if not finite:
                try:
                    scale /= 2
                except OverflowError:
                    raise ScalerStopped(STOP_MESSAGE, applied=True) from None
                return True, (scale, 0)
            steps += 1
            if steps >= growth_interval:
                scale *= 2
                steps = 0
            return True, (scale, steps)
        return step


def seed004_differences():
    """Seed 004's scaler next to torch.amp.GradScaler, row by row, as a Table."""
    from labkit.table import Table

    return Table(("", "seed 004 DynamicLossScaler", "torch.amp.GradScaler"), SEED004_DIFFERENCES,
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
