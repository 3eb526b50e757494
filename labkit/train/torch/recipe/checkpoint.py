"""Checkpoint and resume under AMP: the model, the optimizer, *and* ``scaler.state_dict()`` (with
the data position and the RNG) saved to a real file; resumed, the run is the same bit for bit."""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit._validate import choice, integer, names, number
from labkit.table import Table
from labkit.train.torch.recipe._common import DTYPE, batches, mlp, overflow_hook, steps_set
from labkit.train.torch.stepper import deterministic


FORGETTABLE = ("optimizer", "scaler", "data position")


@dataclass(frozen=True)
class Resume:
    """`checkpoint_resume_identical`'s two runs: the loss and the loss scale of every step, straight
    through and checkpointed at `at` then resumed; `saved` are the checkpoint's keys, `init_scale` the
    scale every new ``GradScaler`` of the run starts at."""

    at: int
    saved: tuple[str, ...]
    straight_losses: tuple[float, ...]
    resumed_losses: tuple[float, ...]
    straight_scales: tuple[float, ...]
    resumed_scales: tuple[float, ...]
    checkpoint_bytes: int
    init_scale: float

    @property
    def identical(self) -> bool:
        """Bit for bit: every loss equal as a float64, every scale equal."""
        return self.straight_losses == self.resumed_losses and self.straight_scales == self.resumed_scales

    @property
    def first_difference(self) -> int | None:
        """The first step whose loss or scale differs (None when identical)."""
        pairs = zip(self.straight_losses, self.resumed_losses, self.straight_scales, self.resumed_scales)
        return next((i for i, (a, b, s, t) in enumerate(pairs) if a != b or s != t), None)

    def table(self) -> Table:
        rows = tuple((str(i), f"{a:.6f}", f"{b:.6f}", f"2^{math.log2(s):g}", f"2^{math.log2(t):g}",
                      "same" if (a, s) == (b, t) else "DIFFERENT")
                     for i, (a, b, s, t) in enumerate(zip(self.straight_losses, self.resumed_losses,
                                                          self.straight_scales, self.resumed_scales)))
        return Table(("step", "loss, straight", "loss, resumed", "scale, straight", "scale, resumed", ""), rows,
                     title=f"checkpoint at step {self.at} holding {', '.join(self.saved)}")


class _Run:
    """The digits MLP, Adam, a GradScaler and the batch stream: one training run that can stop and resume."""

    def __init__(self, precision, init_scale, growth_interval, overflow_at, width, batch_size, lr, seed):
        self.precision, self.batch_size, self.seed = precision, batch_size, seed
        self.net = mlp(width, seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval,
                                           enabled=precision == "fp16")
        self.step, self.counter = 0, [0]
        self.data = batches(batch_size, seed)
        overflow_hook(self.net.out.weight, overflow_at, self.counter)

    def train(self, until: int, losses: list, scales: list):
        for self.step in range(self.step, until):
            self.counter[0] = self.step
            x, y = next(self.data)
            with torch.autocast("cpu", dtype=DTYPE.get(self.precision), enabled=self.precision != "fp32"):
                loss = F.cross_entropy(self.net(x), y)
            scales.append(self.scaler.get_scale() if self.scaler.is_enabled() else 1.0)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad()
            losses.append(loss.detach().item())
        self.step = until

    def save(self, path: str, forget: list[str]):
        ckpt = {"model": self.net.state_dict(), "optimizer": self.opt.state_dict(),
                "scaler": self.scaler.state_dict(), "step": self.step, "rng": torch.get_rng_state()}
        torch.save({k: v for k, v in ckpt.items() if _KEYS.get(k) not in forget}, path)

    def load(self, path: str, at: int):
        ckpt = torch.load(path)  # weights_only=True, torch's default since 2.6: tensors, numbers, dicts only
        self.net.load_state_dict(ckpt["model"])
        if "optimizer" in ckpt:
            self.opt.load_state_dict(ckpt["optimizer"])
        if "scaler" in ckpt:
            self.scaler.load_state_dict(ckpt["scaler"])
        torch.set_rng_state(ckpt["rng"])
        self.step = at
        if "step" in ckpt:  # the batch stream resumes where it stopped; without it, from its first batch
            self.data = itertools.islice(batches(self.batch_size, self.seed), ckpt["step"], None)


_KEYS = {"optimizer": "optimizer", "scaler": "scaler", "step": "data position"}


def checkpoint_resume_identical(steps: int = 8, at: int = 4, precision: str = "fp16", *, forget=(),
                                init_scale: float = 2.0**16, growth_interval: int = 2000, overflow_at=(),
                                width: int = 16, batch_size: int = 16, lr: float = 1e-3, seed: int = 0) -> Resume:
    """Train `steps` steps straight through, and again stopping at step `at`: save a checkpoint to a
    real file, build everything anew, load it, go on. With everything saved the two runs are the same
    bit for bit (on this machine, deterministic kernels, ``torch.use_deterministic_algorithms(True)``
    for the runs, restored after)::

        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scaler": scaler.state_dict(),        # scale and growth tracker
                    "step": step, "rng": torch.get_rng_state()}, path)
        ...
        ckpt = torch.load(path)
        model.load_state_dict(ckpt["model"]); opt.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"]); torch.set_rng_state(ckpt["rng"])
        batches = itertools.islice(batches, ckpt["step"], None)   # the data position

    ``scaler.state_dict()`` is ``{"scale", "growth_factor", "backoff_factor", "growth_interval",
    "_growth_tracker"}`` (``torch/amp/grad_scaler.py``). `forget` leaves parts out (`FORGETTABLE`):
    without the scaler's state the resumed run starts again at ``init_scale`` with a fresh growth
    tracker. Scaling by a power of two is exact, so a different scale alone changes no loss unless
    it overflows: with a large `init_scale` (fp16, 2**20: the first steps overflow and back off) the
    forgotten scale overflows again and skips steps. `overflow_at` injects an overflow (model's last
    gradient set to inf) at those steps, to change the scale before `at`.

    >>> r = checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20, forget="scaler")
    >>> r.identical, r.straight_scales[3], r.resumed_scales[3]
    (False, 262144.0, 1048576.0)
    """
    steps = integer("steps", steps, minimum=2, maximum=1000)
    at = integer("at", at, minimum=1, maximum=steps - 1)
    precision = choice("precision", precision, ("fp16", "bf16", "fp32"))
    forget = names("forget", forget, FORGETTABLE)
    init_scale = number("init_scale", init_scale, minimum=0, maximum=2.0**64, inclusive=False)
    growth_interval = integer("growth_interval", growth_interval, minimum=1)
    when = steps_set("overflow_at", overflow_at, steps)
    options = (precision, init_scale, growth_interval, when, integer("width", width, minimum=1, maximum=1024),
               integer("batch_size", batch_size, minimum=1, maximum=1024), number("lr", lr, minimum=0, maximum=10),
               integer("seed", seed, minimum=0))
    rng = torch.get_rng_state()
    with deterministic(True), tempfile.TemporaryDirectory() as tmp:
        straight, s_losses, s_scales = _Run(*options), [], []
        straight.train(steps, s_losses, s_scales)
        first, r_losses, r_scales = _Run(*options), [], []
        first.train(at, r_losses, r_scales)
        path = os.path.join(tmp, "checkpoint.pt")
        first.save(path, forget)
        size = os.path.getsize(path)
        del first
        resumed = _Run(*options)
        resumed.load(path, at)
        resumed.train(steps, r_losses, r_scales)
        saved = tuple(torch.load(path))
    torch.set_rng_state(rng)
    return Resume(at, saved, tuple(s_losses), tuple(r_losses), tuple(s_scales), tuple(r_scales), size, init_scale)


def resume_checks(full: Resume, forgot: Resume):
    """What `checkpoint_resume_identical` teaches, read from a run whose checkpoint held the scaler's
    state (`full`) and one whose checkpoint left it out (`forgot`, an fp16 run whose `init_scale`
    overflows; a `labkit.checks.Report`, one line per claim):

    * with the scaler's state saved, the resumed run is the straight run bit for bit;
    * without it, the resumed scaler starts again at the run's `init_scale`, where the straight run's
      scale had backed off;
    * that scale overflows again, a step is skipped, and from there the losses differ.

    >>> full = checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20)
    >>> forgot = checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20, forget="scaler")
    >>> print(resume_checks(full, forgot))
    ✓ with the scaler's state saved, the resumed run is bit-identical: every loss and scale
    ✓ without it, the resumed scaler starts again at init_scale
    ✓ the scale overflows again, a step is skipped, and from there the losses differ
    """
    from labkit import checks

    for name, run, holds in (("full", full, True), ("forgot", forgot, False)):
        if not isinstance(run, Resume):
            raise TypeError(f"{name} must be a Resume (from checkpoint_resume_identical); got {type(run).__name__}")
        if ("scaler" in run.saved) != holds:
            raise ValueError(f"{name} must be a run whose checkpoint {'held' if holds else 'left out'} the scaler "
                             f"(forget={'()' if holds else repr('scaler')}); "
                             f"its checkpoint held {', '.join(run.saved)}")
    k = forgot.at
    return checks.report(
        checks.that("with the scaler's state saved, the resumed run is bit-identical: every loss and scale",
                    full.identical),
        checks.that("without it, the resumed scaler starts again at init_scale",
                    forgot.resumed_scales[k] == forgot.init_scale != forgot.straight_scales[k]),
        checks.that("the scale overflows again, a step is skipped, and from there the losses differ",
                    forgot.first_difference == k and forgot.resumed_losses[k + 1:] != forgot.straight_losses[k + 1:]),
    )


__all__ = ["FORGETTABLE", "Resume", "checkpoint_resume_identical", "resume_checks"]
