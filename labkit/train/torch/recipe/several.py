"""Several models, losses and optimizers with one ``GradScaler`` (amp_examples, "Working with
Multiple Models, Losses, and Optimizers"): each optimizer decides to skip on its own gradients, the
scale is updated once, after every step."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit._validate import choice, integer, number
from labkit.table import Table
from labkit.train.torch.recipe._common import batches, mlp, overflow_hook, steps_set
from labkit.train.torch.stepper import deterministic


SEVERAL_WAYS = ("right", "update after each step")


@dataclass(frozen=True)
class SeveralOptimizers:
    """One `several_optimizers` run, per iteration: the scale used, whether each optimizer stepped,
    and model 1's applied gradient over its true gradient (1.0 when right; nan when skipped); and the
    run's settings the checks read: the steps whose model-0 gradient was made inf (`overflow_at`), the
    scaler's `init_scale` and `growth_interval`."""

    way: str
    scales: tuple[float, ...]
    stepped0: tuple[bool, ...]
    stepped1: tuple[bool, ...]
    ratio1: tuple[float, ...]
    overflow_at: tuple[int, ...]
    init_scale: float
    growth_interval: int

    def table(self) -> Table:
        return Table(("step", "scale", "opt0 stepped", "opt1 stepped", "opt1 gradient / true"),
                     tuple((str(i), f"2^{math.log2(s):g}", str(a), str(b), "-" if math.isnan(r) else f"{r:.3f}")
                           for i, (s, a, b, r) in enumerate(zip(self.scales, self.stepped0, self.stepped1,
                                                                self.ratio1))),
                     title=f"two models, two losses, two optimizers, one GradScaler: {self.way}")


def several_optimizers(steps: int = 4, *, way: str = "right", overflow_at=(1,), init_scale: float = 2.0**12,
                       growth_interval: int = 2000,
                       batch_size: int = 16, width: int = 16, seed: int = 0, lr: float = 1e-3) -> SeveralOptimizers:
    """amp_examples' "Working with Multiple Models, Losses, and Optimizers", with an overflow injected
    into model 0's gradients at the steps in `overflow_at`::

        with torch.autocast("cpu", dtype=torch.float16):
            out0, out1 = model0(x), model1(x)
            loss0 = F.cross_entropy(2 * out0 + 3 * out1, y)
            loss1 = F.cross_entropy(3 * out0 - 5 * out1, y)
        scaler.scale(loss0).backward(retain_graph=True)
        scaler.scale(loss1).backward()
        scaler.step(opt0)               # each optimizer checks its own gradients: opt0 may skip
        scaler.step(opt1)               # while opt1 steps
        scaler.update()                 # once, after every step: backs off if any optimizer saw inf

    ``"update after each step"`` calls ``scaler.update()`` after ``step(opt0)`` too: after an overflow
    the scale halves *before* ``step(opt1)`` unscales, so opt1 divides gradients made at scale S by
    S/2 and applies twice its true gradient, silently (and without overflows the growth tracker counts
    two per iteration).

    >>> r = several_optimizers(3)
    >>> r.stepped0, r.stepped1, r.scales
    ((True, False, True), (True, True, True), (4096.0, 4096.0, 2048.0))
    >>> [round(x, 2) for x in several_optimizers(3, way="update after each step").ratio1]
    [1.0, 2.0, 1.0]
    """
    steps = integer("steps", steps, minimum=1, maximum=1000)
    way = choice("way", way, SEVERAL_WAYS)
    when = steps_set("overflow_at", overflow_at, steps)
    init_scale = number("init_scale", init_scale, minimum=0, maximum=2.0**64, inclusive=False)
    growth_interval = integer("growth_interval", growth_interval, minimum=1)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=1024)
    width = integer("width", width, minimum=1, maximum=1024)
    seed = integer("seed", seed, minimum=0)
    lr = number("lr", lr, minimum=0, maximum=10)
    m0, m1 = mlp(width, seed), mlp(width, seed + 1)
    opt0, opt1 = torch.optim.SGD(m0.parameters(), lr=lr), torch.optim.SGD(m1.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    p1 = list(m1.parameters())
    counter, applied = [0], {}
    overflow_hook(m0.out.weight, when, counter)
    opt0.register_step_pre_hook(lambda *_: applied.__setitem__(0, True))
    opt1.register_step_pre_hook(lambda *_: applied.__setitem__(1, torch.cat([p.grad.flatten() for p in p1])))

    def losses(x, y):
        out0, out1 = m0(x), m1(x)
        return F.cross_entropy(2 * out0 + 3 * out1, y), F.cross_entropy(3 * out0 - 5 * out1, y)

    scales, st0, st1, ratio = [], [], [], []
    data = batches(batch_size, seed)
    with deterministic(True):
        for step in range(steps):
            counter[0] = step
            x, y = next(data)
            true = torch.cat([g.flatten() for g in torch.autograd.grad(sum(losses(x, y)), p1)])  # fp32, unscaled
            applied.clear()
            opt0.zero_grad()
            opt1.zero_grad()
            scales.append(scaler.get_scale())
            with torch.autocast("cpu", dtype=torch.float16):
                loss0, loss1 = losses(x, y)
            scaler.scale(loss0).backward(retain_graph=True)
            scaler.scale(loss1).backward()
            scaler.step(opt0)
            if way != "right":
                scaler.update()                       # WRONG: the scale changes before opt1 unscales
            scaler.step(opt1)
            scaler.update()
            st0.append(0 in applied)
            st1.append(1 in applied)
            ratio.append(float(applied[1].norm() / true.norm()) if 1 in applied else math.nan)
    return SeveralOptimizers(way, tuple(scales), tuple(st0), tuple(st1), tuple(ratio), tuple(sorted(when)),
                             init_scale, growth_interval)


def _run(name: str, value, way: str) -> SeveralOptimizers:
    if not isinstance(value, SeveralOptimizers):
        raise TypeError(f"{name} must be a SeveralOptimizers (from several_optimizers); got {type(value).__name__}")
    if value.way != way:
        raise ValueError(f"{name} must be the run with way={way!r}; got way={value.way!r}")
    return value


def several_checks(right: SeveralOptimizers, wrong: SeveralOptimizers):
    """What `several_optimizers` teaches, read from a ``"right"`` run and an ``"update after each step"``
    run, each with an overflow injected (a `labkit.checks.Report`, one line per claim; the same on every
    machine where it holds):

    * only the optimizer that saw the overflow (opt0) skips its step, at the overflow steps;
    * one ``update()`` per iteration changes the scale as torch's scaler does, step for step
      (`labkit.scaling.simulate` with the run's `init_scale` and `growth_interval`): halved once, after
      the overflow;
    * the right loop applies opt1's true gradient, within 5%, at every step;
    * ``update()`` between the two steps makes opt1 apply twice its gradient (within 5%) at the first
      overflow step.

    >>> runs = [several_optimizers(3, way=w, overflow_at=(1,)) for w in SEVERAL_WAYS]
    >>> several_checks(*runs).all_hold
    True
    """
    from labkit import checks, scaling

    right, wrong = _run("right", right, "right"), _run("wrong", wrong, "update after each step")
    if not wrong.overflow_at:
        raise ValueError("wrong must be a run with an overflow (overflow_at=(1,), say): without one, "
                         "update() between the steps changes nothing that the checks can see")
    n = len(right.scales)
    torch_scales = scaling.simulate("torch", overflows=[i in right.overflow_at for i in range(n)],
                                    init_scale=right.init_scale, growth_interval=right.growth_interval).scales
    ratio_off = [abs(x - 1) for x in right.ratio1]
    return checks.report(
        checks.equal("only the optimizer that saw the overflow skips its step", [right.stepped0, right.stepped1],
                     [tuple(i not in right.overflow_at for i in range(n)), (True,) * n]),
        checks.equal("one update() per iteration halves the scale once, after the overflow", right.scales,
                     torch_scales),
        checks.at_most("the right loop applies opt1's true gradient, within 5%",
                       100 * (math.nan if any(map(math.isnan, ratio_off)) else max(ratio_off)), 5, unit="%"),
        checks.close("update() between the two steps makes opt1 apply twice its gradient after the overflow",
                     wrong.ratio1[wrong.overflow_at[0]], 2.0, rel=0.05),
    )


__all__ = ["SEVERAL_WAYS", "SeveralOptimizers", "several_checks", "several_optimizers"]
