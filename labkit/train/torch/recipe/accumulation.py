"""Gradient accumulation with a ``GradScaler`` (amp_examples, "Gradient accumulation"): one
``scaler.update()`` per *optimizer* step, each micro-batch's loss divided by their number; and the two
ways learners get it wrong (`WAYS`), one refused by torch, one silently wrong."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit._validate import choice, integer, number
from labkit.table import Table
from labkit.train.torch.recipe._common import batches, mlp
from labkit.train.torch.stepper import deterministic


RIGHT, UPDATE_EACH, UNSCALE_EACH = "right", "update every micro-batch", "unscale_ + update every micro-batch"
WAYS = (RIGHT, UPDATE_EACH, UNSCALE_EACH)
"""`accumulate`'s loops: the recipe's, and two ways learners get it wrong."""


@dataclass(frozen=True)
class Accumulation:
    """One `accumulate` run: per optimizer step, the mean micro-batch `losses`, the loss scale each
    micro-batch's backward used (`scales`, one tuple per step), whether the optimizer stepped, and the
    relative error of the gradient it applied against the fp32 gradient of the whole batch
    (`grad_errors`, nan when skipped); `error` is torch's message where torch refused the loop."""

    way: str
    losses: tuple[float, ...]
    scales: tuple[tuple[float, ...], ...]
    stepped: tuple[bool, ...]
    grad_errors: tuple[float, ...]
    error: str = ""


def accumulate(steps: int = 3, micro_batches: int = 4, *, way: str = RIGHT, batch_size: int = 8,
               init_scale: float = 2.0**16, growth_interval: int = 2, lr: float = 0.05, width: int = 16,
               seed: int = 0) -> Accumulation:
    """Gradient accumulation with fp16 autocast and a ``GradScaler``, `way` one of `WAYS`.

    The recipe (amp_examples, "Gradient accumulation"): the scaled gradients of `micro_batches`
    micro-batches add up in ``.grad``; the scale must stay the same until they are used, so
    ``step`` and ``update`` run once per *optimizer* step, and each loss is divided by the number of
    micro-batches, so the sum is the gradient of the whole batch's mean loss::

        for i, (x, y) in enumerate(micro):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y) / micro_batches
            scaler.scale(loss).backward()
            if i == micro_batches - 1:
                scaler.step(opt)        # unscales the sum, skips it if it holds inf/nan
                scaler.update()         # one update per optimizer step
                opt.zero_grad()

    Wrong, ``"update every micro-batch"``: ``scaler.update()`` after each backward. ``update`` reads
    the inf checks that ``unscale_``/``step`` record, finds none, and torch raises (`error` holds its
    message). Wrong, ``"unscale_ + update every micro-batch"`` (a learner checking each micro-batch):
    it runs, silently wrong. ``unscale_`` divides ``.grad`` in place, so the next backward adds
    *scaled* gradients to *unscaled* ones and the next ``unscale_`` divides the earlier ones again:
    only the last micro-batch survives. And the growth tracker counts micro-batches, so the scale
    grows `micro_batches` times too fast and changes in the middle of a step.

    >>> r = accumulate(steps=2, micro_batches=2)
    >>> r.scales, max(r.grad_errors) < 0.01
    (((65536.0, 65536.0), (65536.0, 65536.0)), True)
    >>> w = accumulate(steps=2, micro_batches=3, way=UNSCALE_EACH)
    >>> w.scales, min(w.grad_errors) > 0.2
    (((65536.0, 65536.0, 131072.0), (131072.0, 262144.0, 262144.0)), True)
    """
    steps = integer("steps", steps, minimum=1, maximum=1000)
    k = integer("micro_batches", micro_batches, minimum=1, maximum=64)
    way = choice("way", way, WAYS)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=1024)
    init_scale = number("init_scale", init_scale, minimum=0, maximum=2.0**64, inclusive=False)
    growth_interval = integer("growth_interval", growth_interval, minimum=1)
    lr = number("lr", lr, minimum=0, maximum=10)
    width = integer("width", width, minimum=1, maximum=1024)
    seed = integer("seed", seed, minimum=0)
    net = mlp(width, seed)
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    applied = []  # the gradients the optimizer really steps with, read by a step pre-hook
    opt.register_step_pre_hook(lambda *_: applied.append(torch.cat([p.grad.flatten() for p in params])))
    data = batches(batch_size, seed)
    losses, scales, stepped, errors, error = [], [], [], [], ""
    with deterministic(True):
        for _ in range(steps):
            micro = [next(data) for _ in range(k)]
            x_all, y_all = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
            ref = torch.cat([g.flatten() for g in torch.autograd.grad(F.cross_entropy(net(x_all), y_all), params)])
            seen, used, total = len(applied), [], 0.0
            try:
                for i, (x, y) in enumerate(micro):
                    used.append(scaler.get_scale())
                    with torch.autocast("cpu", dtype=torch.float16):
                        loss = F.cross_entropy(net(x), y) / k
                    total += loss.detach().item()
                    scaler.scale(loss).backward()
                    if way == UNSCALE_EACH:
                        scaler.unscale_(opt)          # WRONG: divides .grad in place, every micro-batch
                    if i == k - 1:
                        scaler.step(opt)
                        if way == RIGHT:
                            scaler.update()
                        opt.zero_grad()
                    if way != RIGHT:
                        scaler.update()               # WRONG: the scale may change before the sum is used
            except (AssertionError, RuntimeError) as err:
                error = f"{type(err).__name__}: {err}"
            losses.append(total)
            scales.append(tuple(used))
            stepped.append(len(applied) > seen)
            errors.append(float((applied[-1] - ref).norm() / ref.norm()) if stepped[-1] else math.nan)
            if error:
                break
    return Accumulation(way, tuple(losses), tuple(scales), tuple(stepped), tuple(errors), error)


def _every(errors, pick) -> float:
    """`pick` (max or min) of per-step figures, nan where a step has none (skipped): a claim about every
    step then fails instead of passing over that step."""
    return pick(errors) if errors and not any(math.isnan(e) for e in errors) else math.nan


@dataclass(frozen=True)
class AccumulationWays:
    """`accumulation_ways`' runs: one `Accumulation` per way of `WAYS` (`runs`, keyed by way), each with
    `micro_batches` micro-batches per optimizer step. ``.table()`` shows them side by side, ``.checks()``
    tests what they teach."""

    micro_batches: int
    runs: dict

    def __post_init__(self):
        integer("micro_batches", self.micro_batches, minimum=1, maximum=64)
        if not isinstance(self.runs, dict) or sorted(self.runs) != sorted(WAYS) or not all(
                isinstance(r, Accumulation) and r.way == way for way, r in self.runs.items()):
            raise TypeError(f"runs must be a dict of one Accumulation per way, keyed by its way ({', '.join(WAYS)}); "
                            f"got {self.runs!r:.80}")

    def table(self) -> Table:
        """The scales per micro-batch and the gradient error against one big batch per optimizer step
        (``|`` between optimizer steps, in both), and what torch said, one row per way."""
        rows = []
        for way in WAYS:
            r = self.runs[way]
            scales = " | ".join(" ".join(f"2^{math.log2(s):g}" for s in step) for step in r.scales)
            errors = " | ".join(f"{e:.2%}" for e in r.grad_errors if not math.isnan(e)) or "-"
            rows.append((way, scales, errors, r.error or "-"))
        return Table(("way", "scale at each micro-batch", "gradient error vs one big batch, per step", "torch says"),
                     tuple(rows),
                     title=f"{self.micro_batches} micro-batches per optimizer step, fp16 autocast + GradScaler('cpu')")

    def checks(self):
        """What the runs teach, on any machine (a `labkit.checks.Report`, one line per claim):

        * the recipe's loop applies the whole batch's gradient, within 1% at every optimizer step;
        * its scale stays the same through each optimizer step;
        * ``unscale_`` + ``update`` every micro-batch raises nothing, and its gradient is at least 20%
          off at every optimizer step (only the last micro-batch survives);
        * and its scale changes in the middle of an optimizer step.

        A step that applied no gradient (skipped, or refused by torch) fails the claims about every step.

        >>> print(accumulation_ways(steps=2, micro_batches=3).checks())   # doctest: +ELLIPSIS
        ✓ the recipe's loop applies the whole batch's gradient, within 1% at every step  (here: ...%)
        ✓ its scale stays the same through each optimizer step
        ✓ unscale_ + update every micro-batch raises nothing, and its gradient is at least 20% off ...
        ✓ and its scale changes in the middle of an optimizer step
        """
        from labkit import checks

        right, silent = self.runs[RIGHT], self.runs[UNSCALE_EACH]
        return checks.report(
            checks.at_most("the recipe's loop applies the whole batch's gradient, within 1% at every step",
                           math.nan if right.error else 100 * _every(right.grad_errors, max), 1, unit="%",
                           seen=right.error or None),
            checks.that("its scale stays the same through each optimizer step",
                        all(len(set(s)) == 1 for s in right.scales)),
            checks.at_least("unscale_ + update every micro-batch raises nothing, and its gradient is at least 20% off "
                            "at every step", math.nan if silent.error else 100 * _every(silent.grad_errors, min), 20,
                            unit="%", seen=silent.error or None),
            checks.that("and its scale changes in the middle of an optimizer step",
                        any(len(set(s)) > 1 for s in silent.scales)),
        )


def accumulation_ways(steps: int = 3, micro_batches: int = 4, **options) -> AccumulationWays:
    """`accumulate` run each of the `WAYS` with the same `steps`, `micro_batches` and `options`, kept
    together (an `AccumulationWays`): ``.table()`` shows them, ``.checks()`` tests them, from the same runs.

    >>> list(accumulation_ways(2, 2).runs) == list(WAYS)
    True
    """
    return AccumulationWays(integer("micro_batches", micro_batches, minimum=1, maximum=64),
                            {way: accumulate(steps, micro_batches, way=way, **options) for way in WAYS})


def accumulation_table(steps: int = 3, micro_batches: int = 4, **options) -> Table:
    """`accumulate` run each of the `WAYS`, side by side: the scales per micro-batch and the gradient
    error against one big batch per optimizer step (``|`` between optimizer steps, in both), and
    what torch said (``accumulation_ways(...).table()``; keep the `AccumulationWays` to check them too).

    >>> accumulation_table(2, 2).column("way") == list(WAYS)
    True
    """
    return accumulation_ways(steps, micro_batches, **options).table()


__all__ = ["Accumulation", "AccumulationWays", "RIGHT", "UNSCALE_EACH", "UPDATE_EACH", "WAYS", "accumulate",
           "accumulation_table", "accumulation_ways"]
