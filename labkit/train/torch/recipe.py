"""The full PyTorch AMP recipe, each step run for real on the CPU (after PyTorch's "Automatic Mixed
Precision examples", ``docs/source/notes/amp_examples.rst``, https://pytorch.org/docs/stable/notes/amp_examples.html).

One function per part of the recipe, each written the way a learner writes the loop, with a wrong
version next to the right one where there is a classic mistake:

* `accumulate` / `accumulation_table` -- gradient accumulation: one ``scaler.update()`` per
  optimizer step, the loss divided by the number of micro-batches;
* `several_optimizers` -- several models, losses and optimizers, one scaler, one ``update()``;
* `checkpoint_resume_identical` -- save model, optimizer *and* ``scaler.state_dict()`` (and the data
  position), resume, and get the same run bit for bit;
* `custom_function_dtypes` -- ``torch.amp.custom_fwd`` / ``custom_bwd`` and an autocast-disabled region;
* `compile_autocast` -- ``torch.compile`` (inductor) under autocast: speed, and the casts it fuses;
* `sdpa_dtypes` and `inference_agreement` -- attention and inference (``torch.inference_mode()``) under
  autocast.

Every run is small (the digits MLP of `labkit.train.torch.models`, width 16 or 32) and uses
``device="cpu"``: fp16 and bf16 autocast and ``torch.amp.GradScaler("cpu")`` all work there.

>>> r = checkpoint_resume_identical(steps=4, at=2)
>>> r.identical, r.saved
(True, ('model', 'optimizer', 'scaler', 'step', 'rng'))
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
import tempfile
import time
import types
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from labkit._validate import choice, integer, names, number
from labkit.table import Table
from labkit.train.torch.stepper import deterministic

__all__ = [
    "Accumulation", "Compiled", "Resume", "SeveralOptimizers", "WAYS", "accumulate", "accumulation_table",
    "checkpoint_resume_identical", "compile_autocast", "custom_function_dtypes", "inference_agreement",
    "sdpa_dtypes", "several_optimizers",
]

_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
_LOW = tuple(_DTYPE)


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=1)
def _digits():
    from labkit.train import data
    return data.load("digits", seed=0)


def _batches(batch_size: int, seed: int):
    from labkit.train import data
    for x, y in data.batches(_digits(), batch_size, seed=seed):
        yield torch.from_numpy(x), torch.from_numpy(y).long()


def _mlp(width: int, seed: int):
    from labkit.train import models
    from labkit.train.torch.models import build
    return build("mlp", models.init_params("mlp", seed=seed, width=width))


def _steps_set(name: str, value, steps: int) -> frozenset[int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"{name} must be a list of step numbers (integers); got {type(value).__name__} {value!r:.60}")
    return frozenset(integer(name, s, minimum=0, maximum=steps - 1) for s in value)


def _overflow_hook(param, when: frozenset[int], counter: list[int]):
    """Turn `param`'s gradient into +inf at the steps in `when` (counter[0] is the current step): an
    overflow injected where we choose, as a too-large loss scale makes one."""
    return param.register_hook(lambda g: torch.full_like(g, math.inf) if counter[0] in when else g)


# -- 1. gradient accumulation ----------------------------------------------------------------------
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
    net = _mlp(width, seed)
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    applied = []  # the gradients the optimizer really steps with, read by a step pre-hook
    opt.register_step_pre_hook(lambda *_: applied.append(torch.cat([p.grad.flatten() for p in params])))
    data = _batches(batch_size, seed)
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


def accumulation_table(steps: int = 3, micro_batches: int = 4, **options) -> Table:
    """`accumulate` run each of the `WAYS`, side by side: the scales per micro-batch (``|`` between
    optimizer steps), the largest gradient error against one big batch, and what torch said.

    >>> accumulation_table(2, 2).column("way") == list(WAYS)
    True
    """
    rows = []
    for way in WAYS:
        r = accumulate(steps, micro_batches, way=way, **options)
        scales = " | ".join(" ".join(f"2^{math.log2(s):g}" for s in step) for step in r.scales)
        worst = max((e for e in r.grad_errors if not math.isnan(e)), default=math.nan)
        rows.append((way, scales, "-" if math.isnan(worst) else f"{worst:.2%}", r.error or "-"))
    return Table(("way", "scale at each micro-batch", "gradient error vs one big batch", "torch says"), tuple(rows),
                 title=f"{micro_batches} micro-batches per optimizer step, fp16 autocast + GradScaler('cpu')")


# -- 2. several models, losses and optimizers, one scaler -------------------------------------------
SEVERAL_WAYS = ("right", "update after each step")


@dataclass(frozen=True)
class SeveralOptimizers:
    """One `several_optimizers` run, per iteration: the scale used, whether each optimizer stepped,
    and model 1's applied gradient over its true gradient (1.0 when right; nan when skipped)."""

    way: str
    scales: tuple[float, ...]
    stepped0: tuple[bool, ...]
    stepped1: tuple[bool, ...]
    ratio1: tuple[float, ...]

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
    when = _steps_set("overflow_at", overflow_at, steps)
    init_scale = number("init_scale", init_scale, minimum=0, maximum=2.0**64, inclusive=False)
    growth_interval = integer("growth_interval", growth_interval, minimum=1)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=1024)
    width = integer("width", width, minimum=1, maximum=1024)
    seed = integer("seed", seed, minimum=0)
    lr = number("lr", lr, minimum=0, maximum=10)
    m0, m1 = _mlp(width, seed), _mlp(width, seed + 1)
    opt0, opt1 = torch.optim.SGD(m0.parameters(), lr=lr), torch.optim.SGD(m1.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    p1 = list(m1.parameters())
    counter, applied = [0], {}
    _overflow_hook(m0.out.weight, when, counter)
    opt0.register_step_pre_hook(lambda *_: applied.__setitem__(0, True))
    opt1.register_step_pre_hook(lambda *_: applied.__setitem__(1, torch.cat([p.grad.flatten() for p in p1])))

    def losses(x, y):
        out0, out1 = m0(x), m1(x)
        return F.cross_entropy(2 * out0 + 3 * out1, y), F.cross_entropy(3 * out0 - 5 * out1, y)

    scales, st0, st1, ratio = [], [], [], []
    data = _batches(batch_size, seed)
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
    return SeveralOptimizers(way, tuple(scales), tuple(st0), tuple(st1), tuple(ratio))


# -- 3. checkpoint and resume -----------------------------------------------------------------------
FORGETTABLE = ("optimizer", "scaler", "data position")


@dataclass(frozen=True)
class Resume:
    """`checkpoint_resume_identical`'s two runs: the loss and the loss scale of every step, straight
    through and checkpointed at `at` then resumed; `saved` are the checkpoint's keys."""

    at: int
    saved: tuple[str, ...]
    straight_losses: tuple[float, ...]
    resumed_losses: tuple[float, ...]
    straight_scales: tuple[float, ...]
    resumed_scales: tuple[float, ...]
    checkpoint_bytes: int

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
        self.net = _mlp(width, seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval,
                                           enabled=precision == "fp16")
        self.step, self.counter = 0, [0]
        self.data = _batches(batch_size, seed)
        _overflow_hook(self.net.out.weight, overflow_at, self.counter)

    def train(self, until: int, losses: list, scales: list):
        for self.step in range(self.step, until):
            self.counter[0] = self.step
            x, y = next(self.data)
            with torch.autocast("cpu", dtype=_DTYPE.get(self.precision), enabled=self.precision != "fp32"):
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
            self.data = itertools.islice(_batches(self.batch_size, self.seed), ckpt["step"], None)


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
    when = _steps_set("overflow_at", overflow_at, steps)
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
    return Resume(at, saved, tuple(s_losses), tuple(r_losses), tuple(s_scales), tuple(r_scales), size)


# -- 4. custom autograd functions --------------------------------------------------------------------
def _mm(fwd_wrap, bwd_wrap):
    """amp_examples' ``MyMM`` (``a @ b``), its forward and backward wrapped, logging the dtypes they see."""

    def forward(ctx, a, b, log):
        log.forward = (_name(a.dtype), _name(b.dtype), torch.is_autocast_enabled("cpu"))
        ctx.save_for_backward(a, b)
        ctx.log = log
        return a.mm(b)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ctx.log.backward = (_name(grad.dtype), torch.is_autocast_enabled("cpu"))
        return grad.mm(b.t()), a.t().mm(grad), None

    return type("MyMM", (torch.autograd.Function,), {"forward": staticmethod(fwd_wrap(forward)),
                                                      "backward": staticmethod(bwd_wrap(backward))})


_FUNCTIONS = {
    "plain autograd.Function": _mm(lambda f: f, lambda f: f),
    "custom_fwd + custom_bwd": _mm(torch.amp.custom_fwd(device_type="cpu"), torch.amp.custom_bwd(device_type="cpu")),
    "custom_fwd(cast_inputs=float32)": _mm(torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32),
                                           torch.amp.custom_bwd(device_type="cpu")),
}


def custom_function_dtypes(precision: str = "bf16") -> Table:
    """What a custom ``torch.autograd.Function`` sees under autocast, and what fixes it.

    Input ``a`` comes out of an autocast ``Linear`` (so it is in `precision`), ``b`` is an fp32
    parameter, and ``MyMM`` computes ``a @ b`` (amp_examples, "Autocast and Custom Autograd Functions")::

        class MyMM(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a.mm(b)

            @staticmethod
            @torch.amp.custom_bwd(device_type="cpu")
            def backward(ctx, grad):
                a, b = ctx.saved_tensors
                return grad.mm(b.t()), a.t().mm(grad)

    * undecorated, ``forward`` runs under autocast (its ``mm`` is cast to `precision`) but
      ``backward`` runs where ``loss.backward()`` is called, outside autocast: ``grad`` (in
      `precision`) times the fp32 ``b`` fails, with torch's dtype-mismatch error;
    * ``custom_fwd`` / ``custom_bwd`` (no ``cast_inputs``) run backward under forward's autocast state;
    * ``custom_fwd(cast_inputs=torch.float32)`` turns autocast *off* inside forward and casts its
      floating inputs to fp32 (``torch/amp/autocast_mode.py``: ``_cast``): the op runs in fp32;
    * an autocast-disabled region, ``with torch.autocast("cpu", enabled=False):``, does the same for a
      few lines, but casts nothing: the inputs must be made fp32 by hand (``h.float()``), or the same
      dtype error.

    >>> t = custom_function_dtypes("bf16")
    >>> dict(zip(t.column("variant"), t.column("forward sees a, b")))["custom_fwd(cast_inputs=float32)"]
    'float32, float32'
    """
    precision = choice("precision", precision, _LOW)
    dtype = _DTYPE[precision]
    gen = torch.Generator().manual_seed(0)
    x, w0, w = (torch.randn(*s, generator=gen) for s in ((4, 8), (8, 8), (8, 3)))
    rows = []

    def row(variant, run):
        w0.grad = w.grad = None
        w0.requires_grad_(True)
        w.requires_grad_(True)
        log, out = types.SimpleNamespace(forward=None, backward=None), None
        try:
            with torch.autocast("cpu", dtype=dtype):
                out = run(F.linear(x, w0), log)
            out.register_hook(lambda g: setattr(log, "backward", (_name(g.dtype), torch.is_autocast_enabled("cpu"))))
            out.float().sum().backward()
            result = f"grads: {_name(w0.grad.dtype)} (Linear), {_name(w.grad.dtype)} (b)"
        except RuntimeError as err:
            result = f"RuntimeError: {str(err).splitlines()[0]}"
        fwd, bwd = log.forward, log.backward
        rows.append((variant, ", ".join(fwd[:2]) if fwd else "-", str(fwd[2]) if fwd else "-",
                     "-" if out is None else _name(out.dtype),
                     bwd[0] if bwd else "-", str(bwd[1]) if bwd else "-", result))

    for variant, fn in _FUNCTIONS.items():
        row(variant, lambda a, log, fn=fn: fn.apply(a, w, log))

    def region(a, log, cast):
        with torch.autocast("cpu", enabled=False):
            a, b = (a.float(), w.float()) if cast else (a, w)
            log.forward = (_name(a.dtype), _name(b.dtype), torch.is_autocast_enabled("cpu"))
            return a @ b

    row("autocast(enabled=False) + .float()", lambda a, log: region(a, log, True))
    row("autocast(enabled=False), no cast", lambda a, log: region(a, log, False))
    return Table(("variant", "forward sees a, b", "autocast in forward", "output", "backward sees grad",
                  "autocast in backward", "result"), tuple(rows),
                 title=f"a (from an autocast Linear, {_name(dtype)}) @ b (fp32 parameter), "
                       f"under autocast('cpu', {_name(dtype)})")


# -- 5. torch.compile under autocast -----------------------------------------------------------------
@dataclass(frozen=True)
class Compiled:
    """`compile_autocast`'s figures per precision; `available` False (with `reason`) where inductor
    could not compile here. ``ms[(precision, "eager" | "compiled")]`` is the median step time."""

    available: bool
    reason: str
    ms: dict
    compile_s: dict
    eager_casts: dict
    kernels: dict
    fused_cast_kernels: dict
    converts: dict
    library_calls: dict

    def table(self) -> Table:
        if not self.available:
            return Table(("torch.compile",), (("not available here: " + self.reason,),))
        rows = tuple((p, f"{self.ms[p, 'eager']:.3f}", f"{self.ms[p, 'compiled']:.3f}",
                      f"{self.ms[p, 'eager'] / self.ms[p, 'compiled']:.2f}x", f"{self.compile_s[p]:.1f}",
                      str(self.eager_casts[p]), str(self.kernels[p]), str(self.fused_cast_kernels[p]),
                      str(self.converts[p]), self.library_calls[p]) for p in self.eager_casts)
        return Table(("precision", "eager ms/step", "compiled ms/step", "speed-up", "compile s",
                      "eager casts (aten._to_copy)", "inductor C++ kernels", "kernels with a fused cast",
                      "convert<> in code", "library calls"), rows, title="an MLP train step (forward + backward), CPU inductor")


class _CountCasts(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.casts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.casts += func.overloadpacket is torch.ops.aten._to_copy
        return func(*args, **(kwargs or {}))


def compile_autocast(precisions=("fp32", "bf16"), *, width: int = 64, batch_size: int = 64, steps: int = 10,
                     warmup: int = 2, seed: int = 0) -> Compiled:
    """``torch.compile`` (inductor, the CPU's C++ backend) of the digits MLP under autocast, against eager.

    Per precision (``fp32``: no autocast), one train step ``loss = F.cross_entropy(model(x), y);
    loss.backward()`` timed `steps` times after `warmup` (the median, ms), eager and compiled. Eager
    autocast casts at every op (``aten._to_copy`` calls per step, counted with a dispatch mode);
    inductor sees the casts as graph nodes and fuses them into its generated C++ kernels
    (``cpp_fused__to_copy_...``; the element casts are ``convert<>`` in the code, read with
    ``torch._inductor.utils.run_and_get_code``). The matmuls stay library calls
    (``extern_kernels.mm``/``addmm``). Compiling takes seconds per precision (C++ compiler); dynamo's
    caches are reset first (``torch.compiler.reset()``) so the code is generated afresh. Where compiling
    fails (no C++ compiler, ...) the result says so, with the reason, instead of raising.

    >>> r = compile_autocast(("bf16",), steps=3)                        # doctest: +SKIP
    >>> r.eager_casts["bf16"] > 0, r.fused_cast_kernels["bf16"] > 0     # doctest: +SKIP
    (True, True)
    """
    import re

    precisions = names("precisions", precisions, ("fp32", "bf16", "fp16"))
    width = integer("width", width, minimum=1, maximum=4096)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=4096)
    steps = integer("steps", steps, minimum=1, maximum=1000)
    warmup = integer("warmup", warmup, minimum=0, maximum=100)
    seed = integer("seed", seed, minimum=0)
    net = _mlp(width, seed)
    x, y = next(_batches(batch_size, seed))

    def step(model, precision):
        with torch.autocast("cpu", dtype=_DTYPE.get(precision, torch.bfloat16), enabled=precision != "fp32"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        net.zero_grad(set_to_none=True)
        return loss

    def median_ms(model, precision):
        for _ in range(warmup):
            step(model, precision)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(model, precision)
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    out = {k: {} for k in ("ms", "compile_s", "eager_casts", "kernels", "fused_cast_kernels", "converts",
                           "library_calls")}
    for p in precisions:
        counter = _CountCasts()
        with counter:
            step(net, p)
        out["eager_casts"][p] = counter.casts
        out["ms"][p, "eager"] = median_ms(net, p)
        try:
            import torch._functorch.config as functorch_config
            import torch._inductor.config as inductor_config
            from torch._inductor.utils import run_and_get_code

            # no cache hits: the code must be generated (and seen) here; and inductor's first import
            # (torch/utils/mkldnn.py) calls torch.jit.script_method, which torch 2.13 marks deprecated
            with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False), \
                    warnings.catch_warnings():
                warnings.filterwarnings("ignore", r"`torch\.jit\.script_method` is deprecated", DeprecationWarning)
                torch.compiler.reset()
                compiled = torch.compile(net)
                t0 = time.perf_counter()
                _, codes = run_and_get_code(step, compiled, p)
            out["compile_s"][p] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - any compile failure is the answer, not a crash
            text = str(err).strip().splitlines()
            return Compiled(False, f"{type(err).__name__}: {text[0] if text else ''}"[:300], **out)
        code = "\n".join(codes)
        kernels = set(re.findall(r"^(cpp_fused_\w+) = async_compile", code, re.M))
        out["kernels"][p] = len(kernels)
        out["fused_cast_kernels"][p] = sum("_to_copy" in k for k in kernels)
        out["converts"][p] = len(re.findall(r"\bconvert<", code))
        calls = sorted(re.findall(r"\bextern_kernels\.(\w+)\(", code))
        out["library_calls"][p] = ", ".join(f"{c} x{calls.count(c)}" for c in sorted(set(calls))) or "-"
        out["ms"][p, "compiled"] = median_ms(compiled, p)
    torch.compiler.reset()
    return Compiled(True, "", **out)


# -- 6. attention and inference ------------------------------------------------------------------------
class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func.overloadpacket).removeprefix("aten."), [_name(a.dtype) for a in args[:3]
                                                                           if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def sdpa_dtypes() -> Table:
    """``F.scaled_dot_product_attention`` under CPU autocast: the kernel it dispatches to, the dtypes
    that kernel receives, and the output dtype, from fp32 inputs and from inputs already in 16 bits.

    SDPA is on autocast's lower-precision list on the CPU as on CUDA, so fp32 q, k, v are cast to
    bf16/fp16 first (the ``_to_copy`` calls). On the CPU it then runs the fused flash-attention kernel
    (``_scaled_dot_product_flash_attention_for_cpu``, ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``),
    which keeps its softmax statistics and sums in fp32 (the "opmath" type) and writes 16-bit output.

    >>> t = sdpa_dtypes()
    >>> dict(zip(t.column("autocast"), t.column("output")))["bfloat16"]
    'bfloat16'
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, generator=gen) for _ in range(3))
    rows = []
    for dtype in (None, torch.bfloat16, torch.float16):
        for inputs in ((torch.float32,) if dtype is None else (torch.float32, dtype)):
            args = [t.to(inputs) for t in (q, k, v)]
            ops = _Ops()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None), ops:
                o = F.scaled_dot_product_attention(*args)
            casts = sum(name == "_to_copy" for name, _ in ops.ops)
            kernel = next((name, d) for name, d in ops.ops if "scaled_dot_product" in name)
            rows.append(("off" if dtype is None else _name(dtype), _name(inputs), str(casts), kernel[0],
                         ", ".join(kernel[1]), _name(o.dtype)))
    return Table(("autocast", "q, k, v", "casts first", "kernel", "kernel sees q, k, v", "output"), tuple(rows),
                 title="F.scaled_dot_product_attention on the CPU")


def inference_agreement(precisions=("bf16", "fp16"), *, train_steps: int = 60, width: int = 32, lr: float = 1e-2,
                        seed: int = 0) -> Table:
    """Inference in 16 bits: ``torch.inference_mode()`` + autocast, no scaler (no backward, so
    nothing to scale), against fp32, on the digits MLP after `train_steps` steps of fp32 Adam::

        model.eval()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            predictions = model(x).argmax(-1)

    Per precision: the share of test images whose predicted class is fp32's, the test accuracy, the
    largest |logit - fp32 logit|, the logits' dtype, and what ``inference_mode`` does: outputs that
    need no grad and are *inference tensors* (``torch.is_inference``), nothing recorded for autograd.

    >>> t = inference_agreement(("bf16",), train_steps=5)
    >>> t.column("requires_grad"), t.column("logits dtype")
    (['False', 'False'], ['float32', 'bfloat16'])
    """
    precisions = names("precisions", precisions, _LOW)
    train_steps = integer("train_steps", train_steps, minimum=0, maximum=10_000)
    width = integer("width", width, minimum=1, maximum=1024)
    lr = number("lr", lr, minimum=0, maximum=10)
    seed = integer("seed", seed, minimum=0)
    net = _mlp(width, seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for x, y in itertools.islice(_batches(32, seed), train_steps):
        F.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    net.eval()
    x, y = torch.from_numpy(_digits().x_test), torch.from_numpy(_digits().y_test).long()
    rows, ref = [], None
    for p in ("fp32", *precisions):
        with torch.inference_mode(), torch.autocast("cpu", dtype=_DTYPE.get(p, torch.bfloat16), enabled=p != "fp32"):
            logits = net(x)
        if ref is None:
            ref = logits
        pred = logits.argmax(-1)
        rows.append((p, f"{(pred == ref.argmax(-1)).double().mean().item():.2%}",
                     f"{(pred == y).double().mean().item():.2%}", f"{(logits.float() - ref).abs().max().item():.3g}",
                     _name(logits.dtype), str(logits.requires_grad), str(torch.is_inference(logits))))
    return Table(("precision", "agreement with fp32", "test accuracy", "max |logit diff|", "logits dtype",
                  "requires_grad", "inference tensor"), tuple(rows),
                 title=f"{len(x)} test digits, inference_mode + autocast('cpu'), no GradScaler")
