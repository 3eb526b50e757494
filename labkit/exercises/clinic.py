"""Exercises of the clinic (notebook 11): which fix for which message, when a loss scale cannot help,
and when DeepSpeed gives up.

The fix exercise's key is computed by running each offered fix on the real ``torch.amp.GradScaler``
(`fp16_fix_outcomes`; torch is imported only when it is checked, so ``labkit.exercises`` stays
framework-free); the precision key comes from `labkit.formats` (ml_dtypes' ranges), the DeepSpeed key
from `labkit.scaling`'s replay of ``DynamicLossScaler``, which is tested against DeepSpeed itself.

>>> from labkit.exercises import check
>>> print(check("deepspeed_stop_step", 17).message)  # doctest: +ELLIPSIS
17 steps bring the scale down to min_loss_scale...
>>> check("t5_overflow_precision", "fp16 + loss scaling").correct
False
"""

from __future__ import annotations

import functools

from labkit import formats as lf
from labkit.exercises.core import Exercise, Hint, register

# -- which fix for "ValueError: Attempting to unscale FP16 gradients." ---------------------------------
FP16_GRADIENT_FIXES = (
    "construct the scaler as torch.amp.GradScaler(enabled=False)",
    "call scaler.unscale_(optimizer) yourself before scaler.step(optimizer)",
    "drop model.half(): keep fp32 parameters and run the forward under torch.autocast(device, dtype=torch.float16)",
    "convert the model with model.to(torch.bfloat16) instead of model.half()",
)
"""The fixes the exercise offers, numbered from 1 in its question."""


@functools.cache
def fp16_fix_outcomes() -> tuple[dict, ...]:
    """What each of `FP16_GRADIENT_FIXES` does to one real GradScaler step on the CPU, in order: ``error``
    (``"Type: text"`` of what it raised, or None), ``grad_dtype`` of the weights' gradient, ``scaling``
    (GradScaler enabled) and ``master_fp32`` (the parameters the optimizer updates are fp32)."""
    import torch

    def step(option: int) -> dict:
        gen = torch.Generator().manual_seed(0)
        model = torch.nn.Linear(4, 4)
        with torch.no_grad():
            model.weight.copy_(torch.randn(4, 4, generator=gen))
            model.bias.zero_()
        x = torch.randn(8, 4, generator=gen)
        low = {0: torch.float16, 1: torch.float16, 3: torch.bfloat16}.get(option)
        if low is not None:
            model, x = model.to(low), x.to(low)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=option != 0)
        out = {"error": None, "grad_dtype": None, "scaling": scaler.is_enabled(),
               "master_fp32": model.weight.dtype == torch.float32}
        try:
            with torch.autocast("cpu", dtype=torch.float16, enabled=option == 2):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            out["grad_dtype"] = str(model.weight.grad.dtype).removeprefix("torch.")
            if option == 1:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        except Exception as err:  # noqa: BLE001 -- the exercise reports what torch raised
            out["error"] = f"{type(err).__name__}: {str(err).strip()}"
        return out

    return tuple(step(i) for i in range(len(FP16_GRADIENT_FIXES)))


def _fp16_fix_key() -> int:
    """The option (from 1) that runs, keeps the loss scale and updates fp32 parameters."""
    good = [i + 1 for i, o in enumerate(fp16_fix_outcomes()) if o["error"] is None and o["scaling"] and o["master_fp32"]]
    if len(good) != 1:  # pragma: no cover - torch changed
        raise AssertionError(f"expected exactly one working fix, torch gave {good}")
    return good[0]


def _outcome(answer: int) -> dict:
    return fp16_fix_outcomes()[answer - 1]


def _fp16_fix_hints() -> tuple[Hint, ...]:
    n = len(FP16_GRADIENT_FIXES)
    valid = lambda a: 1 <= a <= n  # noqa: E731
    return (
        Hint(lambda a, k: not valid(a), f"Answer with the number of one option, 1 to {n}."),
        Hint(lambda a, k: valid(a) and _outcome(a)["error"] is not None,
             lambda a, k: f"Tried on the real GradScaler, option {a} fails the same way: {_outcome(a)['error']} "
                          "unscale_ is where the check lives, whoever calls it."),
        Hint(lambda a, k: valid(a) and not _outcome(a)["scaling"],
             "The error goes away because nothing is unscaled any more: the gradients stay fp16 with no loss "
             f"scale, and every one below half fp16's smallest subnormal ({lf.get('fp16').smallest_subnormal:.2g}) "
             "is flushed to zero."),
        Hint(lambda a, k: valid(a) and not _outcome(a)["master_fp32"],
             lambda a, k: f"It runs (GradScaler accepts {_outcome(a)['grad_dtype']} gradients), but the weights "
                          "are now 16-bit themselves: with no fp32 master copy, updates smaller than half a "
                          "spacing of the weight are rounded away (notebook 10), and a scaler adds nothing in bf16."),
    )


register(Exercise(
    "clinic_fp16_gradients_fix", ("11",),
    "A run that calls model.half() and uses a GradScaler fails at scaler.step(optimizer) with "
    "'ValueError: Attempting to unscale FP16 gradients.' Which change fixes it and keeps mixed precision "
    "(fp32 master weights, a loss scale for fp16)? "
    + " ".join(f"({i}) {text};" for i, text in enumerate(FP16_GRADIENT_FIXES, 1))[:-1]
    + ". Answer with the option's number.",
    "integer", _fp16_fix_key, hints=_fp16_fix_hints(),
    otherwise="Not that one: which option keeps the parameters in fp32 and the scaler on?",
    why="autocast runs the matmuls in fp16 while the parameters, and so their gradients, stay fp32: GradScaler "
        "unscales fp32 gradients, where nothing underflows."))


# -- an activation past fp16's max: which precision ------------------------------------------------
T5_ACTIVATION = 80_000.0
"""About the largest feed-forward output of the clinic's T5-like block (huggingface/transformers#5651)."""


def _t5_key() -> frozenset[str]:
    """The 16-bit precisions that hold the activation: those whose format's max is above it."""
    return frozenset(p for p in ("fp16", "bf16") if lf.get(p).max > T5_ACTIVATION)


register(Exercise(
    "t5_overflow_precision", ("11",),
    f"Under fp16 autocast a T5 feed-forward output reaches about {T5_ACTIVATION:,.0f}: the loss is nan from the "
    "first step and GradScaler skips every step. Which 16-bit precision trains it without changing the model? "
    "Answer with a precision name.",
    "precision", _t5_key, accepts=lambda a, k: a in k,
    hints=(
        Hint(lambda a, k: a == "fp16 + loss scaling",
             "The loss scale multiplies the loss *after* the forward pass, and the gradients after backward(): "
             "an activation that overflows in the forward pass is inf before any scale is applied. No scale helps."),
        Hint(lambda a, k: a == "fp16",
             f"fp16's largest value is {lf.get('fp16').max:g}: the activation becomes inf, layer_norm of inf is nan."),
        Hint(lambda a, k: a == "fp32",
             "fp32 holds it, but that is not 16 bits. (Keeping just the overflowing op in fp32 is the other fix, "
             "the one Hugging Face applies to T5's wo layer.)"),
        Hint(lambda a, k: a == "fp8",
             f"fp8's range is narrower still: E4M3's largest value is {lf.get('fp8_e4m3').max:g}."),
    ),
    why="bf16 has fp32's 8-bit exponent (largest value about 3.4e38): the activation is held, with 8 significant "
        "bits; the T5 authors trained in bf16."))


# -- DeepSpeed's stop -------------------------------------------------------------------------------
def _deepspeed_stop_step() -> int:
    from labkit import scaling

    trace = scaling.simulate("deepspeed", overflows=[True] * 100, init_scale=2**16)
    return int(trace.stopped_at) + 1  # stopped_at counts from 0


register(Exercise(
    "deepspeed_stop_step", ("11",),
    "DeepSpeed fp16 with the config's defaults (initial_scale_power 16, hysteresis 2, min_loss_scale 1, "
    "consecutive_hysteresis false), and a loss that is inf at every step. At which step, counting from 1, "
    "does training stop with 'Current loss scale already at minimum - cannot decrease scale anymore. Exiting "
    "run.'?",
    "integer", _deepspeed_stop_step,
    hints=(
        Hint(lambda a, k: a == k - 1,
             lambda a, k: f"{a} steps bring the scale down to min_loss_scale, but reaching the floor does not stop "
                          "the run: the next overflow, arriving at the floor, raises."),
        Hint(lambda a, k: a == k - 2,
             lambda a, k: f"{a} halvings take 2^{a} to 1, but with hysteresis 2 the first overflow only uses up the "
                          "hysteresis (the step is skipped, the scale kept), and the run stops at the overflow that "
                          "arrives at the floor."),
        Hint(lambda a, k: a > k,
             "Hysteresis forgives one overflow, and is given back only when the scale grows again (not after each "
             "halving, with consecutive_hysteresis false): after that every overflow halves the scale."),
        Hint(lambda a, k: a < k - 2,
             lambda a, k: f"From 2^{k - 2}, halving once per step, the scale needs {k - 2} steps to reach 1: the stop "
                          "cannot come sooner."),
    ),
    why="step 1 uses up the hysteresis, steps 2-17 halve 2^16 down to 1, and the overflow at step 18 arrives at "
        "the floor and raises. By then no smaller scale could help: overflows that last that long come from the "
        "forward pass."))

__all__ = ["FP16_GRADIENT_FIXES", "T5_ACTIVATION", "fp16_fix_outcomes"]
