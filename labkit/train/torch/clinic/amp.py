"""The clinic's GradScaler entries: what ``torch.amp.GradScaler`` raises, warns and cannot do.

Every case runs on the CPU (``torch.amp.GradScaler("cpu")``, fp16 autocast on the CPU), with tiny
models built from private generators: the messages are the ones CUDA prints too, because they come
from ``torch/amp/grad_scaler.py`` and ``torch/optim/lr_scheduler.py``, not from a device kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from labkit.train.torch.clinic.case import Entry, dtype_name, linear, raised, warned

FP16_MAX = torch.finfo(torch.float16).max  # 65504


# -- an activation past fp16's max: no loss scale helps -------------------------------------------
class FFBlock(nn.Module):
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


def _ff_run(mode: str, steps: int = 4) -> tuple[list[float], list[float], list[bool], list[float]]:
    """(losses, largest |ff(x)| per step, applied per step, scales) of `steps` SGD steps: the scale each
    step used, then the scale after the last step."""
    model = FFBlock(ff_in_fp32=mode == "fp16, ff in fp32")
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    x = 16.0 + torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    losses, amax, applied, scales = [], [], [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            loss = F.mse_loss(model(x).float(), torch.zeros(8, 1))
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
        amax.append(model.amax)
        scales.append(before)
        applied.append(scaler.get_scale() >= before)
    return losses, amax, applied, scales + [scaler.get_scale()]


def _ff_text(mode: str) -> str:
    losses, amax, applied, scales = _ff_run(mode)
    finite = "finite" if all(math.isfinite(v) for v in losses) else "nan" if any(map(math.isnan, losses)) else "inf"
    n = len(applied)
    scale = (f", scale {scales[0]:g} at step 1, {scales[n - 1]:g} at step {n}, {scales[n]:g} after it"
             if mode != "bf16" else " (no GradScaler)")
    return (f"{mode}: max |ff(x)| {max(amax):.3g} (fp16's max is {FP16_MAX:g}), loss {finite} at every step; "
            f"{sum(applied)} of {len(applied)} steps applied{scale}")


def _forward_overflow() -> str:
    return _ff_text("fp16")


def _forward_overflow_fix() -> str:
    return "\n".join(_ff_text(m) for m in ("fp16, ff in fp32", "bf16"))


# -- fp16 parameters under GradScaler ---------------------------------------------------------
def _scaler_step(half: bool) -> str:
    gen = torch.Generator().manual_seed(0)
    model = linear(4, 4, gen)
    x = torch.randn(8, 4, generator=gen)
    if half:
        model, x = model.half(), x.half()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # the default 2**16 overflows this first step
    before = model.weight.detach().clone()
    with torch.autocast("cpu", dtype=torch.float16, enabled=not half):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)  # raises for fp16 parameters: their gradients are fp16
    scaler.update()
    return (f"step applied: {not torch.equal(before, model.weight.detach())}; parameters "
            f"{dtype_name(model.weight.dtype)}, gradients {dtype_name(model.weight.grad.dtype)}; "
            f"scale {scaler.get_scale():g}")


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
          lambda: raised(lambda: _scaler_step(half=True)), lambda: _scaler_step(half=False)),
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

__all__ = ["ENTRIES", "FFBlock"]
