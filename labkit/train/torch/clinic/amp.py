"""The clinic's GradScaler entries: what ``torch.amp.GradScaler`` raises, warns and cannot do.

Every case runs on the CPU (``torch.amp.GradScaler("cpu")``, fp16 autocast on the CPU), with tiny
models built from private generators: the messages are the ones CUDA prints too, because they come
from ``torch/amp/grad_scaler.py`` and ``torch/optim/lr_scheduler.py``, not from a device kernel.

Two of the runs take settings, and notebook 11's exercises try their fixes with them: `ff_run` (the T5-like
block whose activation passes fp16's max, with GradScaler's options) and `scaler_step` (one GradScaler step
with fp32, fp16 or bf16 parameters). In both, a step is *applied* when it changed the weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from labkit._validate import choice, integer, number, shown
from labkit.train.torch.clinic.case import NO_ERROR, Entry, dtype_name, linear, raised, warned
from labkit.train.torch.collectives import DTYPES

FP16_MAX = torch.finfo(torch.float16).max  # 65504


# -- an activation past fp16's max: no loss scale helps -------------------------------------------
class _FFBlock(nn.Module):
    """T5's feed-forward sublayer in miniature: ``layer_norm(x + ff(x))`` then a head. ff's weights
    (~300) times inputs (~16) summed over 16 features give outputs near 76800 > 65504."""

    def __init__(self, ff_in_fp32: bool = False):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.ff = linear(16, 16, gen, bias=False, std=15.0)
        with torch.no_grad():
            self.ff.weight.add_(300.0)
        self.head = linear(16, 1, gen, std=0.01)  # small outputs: the scaled gradients fit fp16
        self.ff_in_fp32, self.amax = ff_in_fp32, 0.0

    def forward(self, x):
        if self.ff_in_fp32:  # the fix: this one op leaves autocast and computes in fp32
            with torch.autocast("cpu", enabled=False):
                h = self.ff(x.float())
        else:
            h = self.ff(x)
        self.amax = float(h.detach().abs().max())
        return self.head(F.layer_norm(x + h, (16,)))


FF_MODES = ("fp16", "fp16, ff in fp32", "bf16")
"""The ways `ff_run` trains the block: fp16 autocast, fp16 autocast with the feed-forward in fp32 (the fix),
bf16 autocast (no GradScaler)."""


@dataclass(frozen=True)
class FFRun:
    """`ff_run`'s record, one entry per step: the loss, the largest |ff(x)|, whether the step was `applied`
    (it changed the weights: GradScaler skips a step whose gradients are not finite) and the loss scale the
    step used; `final_scale` is the scale after the last step (1.0 where no GradScaler runs, in bf16)."""

    mode: str
    losses: tuple[float, ...]
    amax: tuple[float, ...]
    applied: tuple[bool, ...]
    scales: tuple[float, ...]
    final_scale: float

    def __post_init__(self):
        choice("mode", self.mode, FF_MODES)
        fields = ("losses", "amax", "applied", "scales")
        if not all(isinstance(getattr(self, f), tuple) for f in fields) or len(
                {len(getattr(self, f)) for f in fields}) != 1 or not self.losses:
            raise ValueError(f"losses, amax, applied and scales must be tuples with one entry per step, as ff_run "
                             f"returns them; got {shown(self.losses)}, {shown(self.amax)}, {shown(self.applied)}, "
                             f"{shown(self.scales)}")
        object.__setattr__(self, "final_scale", number("final_scale", self.final_scale, minimum=0))

    @property
    def steps_applied(self) -> int:
        return sum(self.applied)

    @property
    def finite_losses(self) -> int:
        return sum(math.isfinite(v) for v in self.losses)

    def __str__(self) -> str:
        finite = ("finite" if self.finite_losses == len(self.losses)
                  else "nan" if any(map(math.isnan, self.losses)) else "inf")
        n = len(self.applied)
        scale = (f", scale {self.scales[0]:g} at step 1, {self.scales[-1]:g} at step {n}, {self.final_scale:g} "
                 "after it" if self.mode != "bf16" else " (no GradScaler)")
        return (f"{self.mode}: max |ff(x)| {max(self.amax):.3g} (fp16's max is {FP16_MAX:g}), loss {finite} at every "
                f"step; {self.steps_applied} of {n} steps applied{scale}")


def ff_run(mode: str = "fp16", steps: int = 4, *, init_scale: float = 2.0**16, growth_interval: int = 2000) -> FFRun:
    """`steps` SGD steps (lr 1e-3) of `_FFBlock` on one batch, under CPU autocast in `mode` (one of `FF_MODES`),
    with a ``torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)`` for the fp16
    modes (GradScaler's defaults otherwise; none in bf16). The clinic's fp16-forward-overflow case prints
    three of these runs, and notebook 11's T5 exercise tries its fixes with it.

    >>> r = ff_run("fp16, ff in fp32", steps=1)
    >>> r.steps_applied, r.finite_losses, r.scales
    (1, 1, (65536.0,))
    """
    mode = choice("mode", mode, FF_MODES)
    steps = integer("steps", steps, minimum=1, maximum=100)
    init_scale = number("init_scale", init_scale, minimum=0, inclusive=False)
    growth_interval = integer("growth_interval", growth_interval, minimum=1)
    model = _FFBlock(ff_in_fp32=mode == "fp16, ff in fp32")
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval,
                                  enabled=dtype == torch.float16)
    x = 16.0 + torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    losses, amax, applied, scales = [], [], [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = F.mse_loss(model(x).float(), torch.zeros(8, 1))
        before = [p.detach().clone() for p in model.parameters()]
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        amax.append(model.amax)
        applied.append(_changed(before, model))
    return FFRun(mode, tuple(losses), tuple(amax), tuple(applied), tuple(scales), scaler.get_scale())


def _changed(before: list[torch.Tensor], model: nn.Module) -> bool:
    """Did the step apply: did any of the model's parameters change from `before`?"""
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))


def _forward_overflow() -> str:
    return str(ff_run("fp16"))


def _forward_overflow_fix() -> str:
    return "\n".join(str(ff_run(m)) for m in ("fp16, ff in fp32", "bf16"))


# -- fp16 parameters under GradScaler ---------------------------------------------------------
PARAMS = ("fp32", "fp16", "bf16")  # keys of DTYPES
"""The parameter dtypes `scaler_step` tries: fp32 (under fp16 autocast, the fix), fp16 (``model.half()``),
bf16 (``model.to(torch.bfloat16)``)."""


@dataclass(frozen=True)
class ScalerStep:
    """What one GradScaler step did (`scaler_step`): ``error`` (``"Type: text"`` of what torch raised, or None),
    the dtypes of the parameters and of their gradients (None if backward never ran), whether the scaler was
    enabled (``scaling``), whether the step was ``applied`` (it changed the weights) and the scale after it."""

    error: str | None
    params: str
    grad_dtype: str | None
    scaling: bool
    applied: bool
    scale: float

    def __post_init__(self):
        for name in ("error", "grad_dtype"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be None or a string; got {shown(getattr(self, name))}")
        if not isinstance(self.params, str):
            raise TypeError(f"params must be a dtype's name (a string); got {shown(self.params)}")
        for name in ("scaling", "applied"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False; got {shown(getattr(self, name))}")
        object.__setattr__(self, "scale", number("scale", self.scale, minimum=0))

    def __str__(self) -> str:
        if self.error is not None:
            return self.error
        return (f"step applied: {self.applied}; parameters {self.params}, gradients {self.grad_dtype}; "
                f"scale {self.scale:g}")


def scaler_step(params: str = "fp32", *, scaler: bool = True, unscale_first: bool = False) -> ScalerStep:
    """One SGD step of a 4x4 linear layer through ``torch.amp.GradScaler("cpu", init_scale=2**10,
    enabled=scaler)`` (the default 2**16 overflows this first step), its parameters in `params` (one of
    `PARAMS`): fp32 parameters run the forward under fp16 autocast, 16-bit ones without autocast.
    `unscale_first`: call ``scaler.unscale_(opt)`` by hand before ``scaler.step(opt)``. What torch raises
    is recorded, not raised: fp16 parameters give ``ValueError: Attempting to unscale FP16 gradients.``

    >>> print(scaler_step("fp32"))
    step applied: True; parameters float32, gradients float32; scale 1024
    >>> scaler_step("fp16").error
    'ValueError: Attempting to unscale FP16 gradients.'
    """
    params = choice("params", params, PARAMS)
    for name, flag in (("scaler", scaler), ("unscale_first", unscale_first)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False; got {type(flag).__name__} {shown(flag)}")
    gen = torch.Generator().manual_seed(0)
    model = linear(4, 4, gen)
    x = torch.randn(8, 4, generator=gen)
    model, x = model.to(DTYPES[params]), x.to(DTYPES[params])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gs = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=scaler)
    before = [p.detach().clone() for p in model.parameters()]

    def step():
        with torch.autocast("cpu", dtype=torch.float16, enabled=params == "fp32"):
            loss = model(x).float().pow(2).mean()
        gs.scale(loss).backward()
        if unscale_first:
            gs.unscale_(opt)
        gs.step(opt)  # raises for fp16 parameters: their gradients are fp16
        gs.update()

    error = raised(step)  # the step's outcome is whatever torch raised
    grad = model.weight.grad
    return ScalerStep(None if error == NO_ERROR else error, dtype_name(model.weight.dtype),
                      None if grad is None else dtype_name(grad.dtype), gs.is_enabled(), _changed(before, model),
                      gs.get_scale())


# -- unscale_ twice: gradient accumulation written wrongly ----------------------------------------
def _accumulate(unscale_each_micro_batch: bool, micro_batches: int = 4, max_norm: float = 1.0) -> str:
    gen = torch.Generator().manual_seed(0)
    model = linear(8, 1, gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # the default 2**16 overflows this first step
    before = model.weight.detach().clone()
    opt.zero_grad(set_to_none=True)
    for _ in range(micro_batches):
        x = torch.randn(16, 8, generator=gen)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), x.sum(1, keepdim=True)) / micro_batches
        scaler.scale(loss).backward()
        if unscale_each_micro_batch:  # wrong: the second micro-batch unscales again before any update()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if not unscale_each_micro_batch:
        scaler.unscale_(opt)  # right: once, after the last backward, before clipping
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    after = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    scaler.step(opt)
    scaler.update()
    return (f"{micro_batches} micro-batches, unscale_ once, then clip_grad_norm_(max_norm={max_norm:g}): norm before "
            f"clipping finite: {math.isfinite(norm)}, norm after <= {max_norm:g}: {after <= max_norm * (1 + 1e-6)}; "
            f"step applied: {not torch.equal(before, model.weight.detach())}")


# -- the scheduler warning after a skipped first step ---------------------------------------------
SCHEDULER_WARNING = "Detected call of `lr_scheduler.step()` before `optimizer.step()`"


def _schedule(skip_aware: bool, steps: int = 4) -> tuple[list[float], list[bool]]:
    """lr used by each step and whether it was applied: d loss / d output = 1.5, and 1.5 * 2**16 =
    98304 overflows fp16, so GradScaler's first step (default init_scale 2**16) is skipped."""
    layer = nn.Linear(1, 1, bias=False, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        layer.weight.fill_(1.0)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    lrs, applied = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = layer(torch.ones(1, 1))
        before = scaler.get_scale()
        scaler.scale(1.5 * out.float().sum()).backward()
        lrs.append(opt.param_groups[0]["lr"])
        scaler.step(opt)
        scaler.update()
        applied.append(scaler.get_scale() >= before)
        if applied[-1] or not skip_aware:
            sched.step()
    return lrs, applied


def _scheduler_warning() -> str:
    _, texts = warned(lambda: _schedule(False), "lr_scheduler.step()")
    return "UserWarning: " + texts[0] if texts else "(no warning)"


def _scheduler_fix() -> str:
    (plain, applied), _ = warned(lambda: _schedule(False), "lr_scheduler.step()")
    (aware, aware_applied), texts = warned(lambda: _schedule(True), "lr_scheduler.step()")
    used = lambda lrs, ok: ", ".join(f"{lr:g}" for lr, a in zip(lrs, ok) if a)  # noqa: E731
    return (f"plain loop: skipped steps {[i + 1 for i, a in enumerate(applied) if not a]} (counting from 1); the "
            f"applied steps used lr "
            f"{used(plain, applied)} (the schedule's first lr, {plain[0]:g}, was never used)\n"
            f"sched.step() only when scaler.get_scale() did not drop: {'no warning' if not texts else 'warned'}; "
            f"the applied steps used lr {used(aware, aware_applied)}")


# -- GradScaler with bf16 ---------------------------------------------------------------------
def _bf16_run(scaled: bool, steps: int = 8) -> tuple[list[float], list[float]]:
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(linear(16, 32, gen), nn.ReLU(), linear(32, 1, gen))
    x = torch.randn(64, 16, generator=gen)
    y = x[:, :1] * x[:, 1:2]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    losses, scales = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        scales.append(scaler.get_scale())
    return losses, scales


def _bf16_scaler() -> str:
    (on, scales), (off, _) = _bf16_run(True), _bf16_run(False)
    diff = max(abs(a - b) for a, b in zip(on, off))
    return (f"bf16 autocast, {len(on)} SGD steps with GradScaler enabled and disabled: losses identical: {on == off} "
            f"(largest difference {diff:g}); the scale stayed {scales[-1]:g}: no bf16 gradient overflowed "
            f"(bf16's max {torch.finfo(torch.bfloat16).max:.3g}, fp32's {torch.finfo(torch.float32).max:.3g})")


def _bf16_scaler_fix() -> str:
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    loss = torch.tensor(2.0)
    return (f"GradScaler(enabled=False): scaler.scale(loss) is loss: {scaler.scale(loss) is loss}; get_scale() "
            f"{scaler.get_scale():g}; step(opt) just calls opt.step()")


ENTRIES = (
    Entry("fp16-forward-overflow",
          "loss is nan from the first step; GradScaler skips every step and keeps halving its scale",
          "loss nan",
          "fp16 autocast, an FF output above 65504 (T5, huggingface/transformers#5651), GradScaler",
          "that op in fp32: with torch.autocast('cpu', enabled=False): h = ff(x.float()); or bf16 autocast",
          "GradScaler multiplies the loss before backward() and divides the gradients after: the forward pass "
          "never sees the scale. An activation past fp16's largest number, 65504, is inf in the forward pass; "
          "layer_norm of inf is nan, the loss is nan, every gradient is nan whatever the scale, so every step "
          "is skipped. Keep the op that overflows in fp32 (Hugging Face keeps T5's `wo` in fp32) or train in "
          "bf16, whose range is fp32's (the T5 authors trained in bf16).",
          _forward_overflow, _forward_overflow_fix),
    Entry("fp16-params",
          "ValueError at scaler.step(optimizer) after model.half()",
          "Attempting to unscale FP16 gradients.",
          "model.half(); scaler.scale(loss).backward(); scaler.step(optimizer)",
          "fp32 parameters, fp16 only inside torch.autocast: model stays fp32, scaler.step(optimizer)",
          "GradScaler unscales the gradients in place, and an fp16 gradient divided by the scale would underflow "
          "again -- the thing loss scaling exists to prevent -- so torch/amp/grad_scaler.py refuses fp16 "
          "gradients (allow_fp16=False in _unscale_grads_). Mixed precision means fp32 master weights: keep "
          "the model in fp32 and let autocast run the matmuls in fp16; the gradients then land in fp32.",
          lambda: scaler_step("fp16").error or NO_ERROR, lambda: str(scaler_step("fp32"))),
    Entry("unscale-twice",
          "RuntimeError at the second micro-batch when clipping inside a gradient-accumulation loop",
          "unscale_() has already been called on this optimizer since the last update().",
          "for each micro-batch: scaler.scale(loss).backward(); scaler.unscale_(opt); clip_grad_norm_(...)",
          "unscale_ and clip once, after the last micro-batch's backward(), then scaler.step(opt); scaler.update()",
          "unscale_ divides the gradients by the scale in place and records it in the optimizer's state, so a "
          "second call before update() would divide twice; GradScaler raises instead. With accumulation the "
          "gradients are complete only after the last micro-batch: unscale and clip there, once per step "
          "(torch's AMP examples, 'Gradient accumulation').",
          lambda: raised(lambda: _accumulate(True)), lambda: _accumulate(False)),
    Entry("scheduler-warning",
          "UserWarning 'Detected call of lr_scheduler.step() before optimizer.step()' in a loop written correctly",
          SCHEDULER_WARNING,
          "scaler.step(opt); scaler.update(); sched.step() -- with the first step's gradients overflowing fp16",
          "harmless when only the first steps are skipped; to keep the schedule, sched.step() only when the "
          "scale did not drop",
          "GradScaler starts at 2**16 (init_scale) on purpose, high enough that the first step or so usually "
          "overflows: it then skips optimizer.step() and halves the scale. lr_scheduler.step() notices that "
          "the optimizer never stepped before its first call and warns (torch/optim/lr_scheduler.py). Nothing "
          "is broken: the skipped step applied nothing, and the schedule is one value ahead. It matters only "
          "if many steps are skipped (a warmup that is half over before training starts).",
          _scheduler_warning, _scheduler_fix),
    Entry("bf16-gradscaler",
          "does bf16 need a GradScaler?",
          "losses identical: True",
          "torch.autocast('cpu', dtype=torch.bfloat16) with torch.amp.GradScaler('cpu') enabled vs disabled",
          "GradScaler(enabled=(dtype == torch.float16)), as nanoGPT writes it",
          "No. Loss scaling lifts small gradients above fp16's smallest normal (6.1e-5); bf16 has fp32's "
          "exponent, so its smallest normal is fp32's 1.2e-38 and nothing underflows that a scale would save. "
          "Multiplying by a power of two is exact, so the scaled run computes the same numbers, plus an extra "
          "multiply and an inf/nan check per step. Keras adds a LossScaleOptimizer only for mixed_float16, and "
          "DeepSpeed's bf16 section has no loss scale.",
          _bf16_scaler, _bf16_scaler_fix),
)

__all__ = ["ENTRIES", "FFRun", "FF_MODES", "PARAMS", "ScalerStep", "ff_run", "scaler_step"]
