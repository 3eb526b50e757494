"""Exercises of the clinic (notebook 11): which fix for which message, which fix when a loss scale cannot
help, and when DeepSpeed gives up.

The two fix exercises' keys are computed by running each offered fix on the real ``torch.amp.GradScaler``
(`fp16_fix_outcomes`, `t5_fix_outcomes`), through the clinic's own runs, ``scaler_step`` and ``ff_run`` of
``labkit.train.torch.clinic.amp`` (imported only when they are checked, so ``labkit.exercises`` stays
framework-free); the DeepSpeed key comes from `labkit.scaling`'s replay of
``DynamicLossScaler``, which is tested against DeepSpeed itself.

>>> from labkit.exercises import check
>>> print(check("deepspeed_stop_step", 9).message)  # doctest: +ELLIPSIS
9 steps bring the scale down to min_loss_scale...
"""

from __future__ import annotations

import functools

from labkit import formats as lf
from labkit.exercises.core import Exercise, Hint, register

def _only_working(outcomes, works) -> int:
    """The option (from 1) whose outcome `works`: there must be exactly one."""
    good = [i + 1 for i, o in enumerate(outcomes) if works(o)]
    if len(good) != 1:  # pragma: no cover - torch changed
        raise AssertionError(f"expected exactly one working fix, torch gave {good}")
    return good[0]


# -- which fix for "ValueError: Attempting to unscale FP16 gradients." ---------------------------------
FP16_GRADIENT_FIXES = (
    ("construct the scaler as torch.amp.GradScaler(enabled=False)", {"params": "fp16", "scaler": False}),
    ("call scaler.unscale_(optimizer) yourself before scaler.step(optimizer)",
     {"params": "fp16", "unscale_first": True}),
    ("drop model.half(): keep fp32 parameters and run the forward under torch.autocast(device, dtype=torch.float16)",
     {"params": "fp32"}),
    ("convert the model with model.to(torch.bfloat16) instead of model.half()", {"params": "bf16"}),
)
"""The fixes the exercise offers, numbered from 1 in its question: (text, the settings of
``labkit.train.torch.clinic.amp.scaler_step`` that try it)."""


@functools.cache
def fp16_fix_outcomes() -> tuple:
    """What each of `FP16_GRADIENT_FIXES` does to one real GradScaler step on the CPU, in order: the clinic's
    ``scaler_step`` records (``error``, the ``grad_dtype``, ``scaling``: GradScaler enabled, ``params``: the
    dtype of the parameters the optimizer updates)."""
    from labkit.train.torch.clinic.amp import scaler_step  # torch, imported when the exercise is checked

    return tuple(scaler_step(**settings) for _, settings in FP16_GRADIENT_FIXES)


def _keeps_mixed_precision(outcome) -> bool:
    """It runs, keeps the loss scale and updates fp32 parameters."""
    return outcome.error is None and outcome.scaling and outcome.params == "float32"


def _fp16_fix_key() -> int:
    return _only_working(fp16_fix_outcomes(), _keeps_mixed_precision)


def _outcome(answer: int):
    return fp16_fix_outcomes()[answer - 1]


def _fp16_fix_hints() -> tuple[Hint, ...]:
    n = len(FP16_GRADIENT_FIXES)
    valid = lambda a: 1 <= a <= n  # noqa: E731
    return (
        Hint(lambda a, k: not valid(a), f"Answer with the number of one option, 1 to {n}."),
        Hint(lambda a, k: valid(a) and _outcome(a).error is not None,
             lambda a, k: f"Tried on the real GradScaler, option {a} fails the same way: {_outcome(a).error} "
                          "unscale_ is where the check lives, whoever calls it."),
        Hint(lambda a, k: valid(a) and not _outcome(a).scaling,
             "The error goes away because nothing is unscaled any more: the gradients stay fp16 with no loss "
             f"scale, and every one below about {lf.get('fp16').smallest_subnormal / 2:.1g} (half of fp16's smallest "
             f"subnormal, {lf.get('fp16').smallest_subnormal:.2g}) is flushed to zero."),
        Hint(lambda a, k: valid(a) and _outcome(a).params != "float32",
             lambda a, k: f"It runs (GradScaler accepts {_outcome(a).grad_dtype} gradients), but the weights "
                          "are now 16-bit themselves: with no fp32 master copy, updates smaller than half a "
                          "spacing of the weight are rounded away (notebook 10), and a scaler adds nothing in bf16."),
    )


register(Exercise(
    "clinic_fp16_gradients_fix", ("11",),
    "A run that calls model.half() and uses a GradScaler fails at scaler.step(optimizer) with "
    "'ValueError: Attempting to unscale FP16 gradients.' Which change fixes it and keeps mixed precision "
    "(fp32 master weights, a loss scale for fp16)? "
    + " ".join(f"({i}) {text};" for i, (text, _) in enumerate(FP16_GRADIENT_FIXES, 1))[:-1]
    + ". Answer with the option's number.",
    "integer", _fp16_fix_key, hints=_fp16_fix_hints(),
    otherwise="Not that one: which option keeps the parameters in fp32 and the scaler on?",
    why="autocast runs the matmuls in fp16 while the parameters, and so their gradients, stay fp32: GradScaler "
        "unscales fp32 gradients, where nothing underflows."))


# -- an activation past fp16's max: which fix --------------------------------------------------------
T5_ACTIVATION = 80_000.0
"""About the largest feed-forward output of the clinic's T5-like block (huggingface/transformers#5651)."""

T5_FIXES = (
    ("start the loss scale higher: torch.amp.GradScaler(device, init_scale=2.0**24)",
     {"mode": "fp16", "init_scale": 2.0**24}),
    ("start the loss scale lower: torch.amp.GradScaler(device, init_scale=1.0)", {"mode": "fp16", "init_scale": 1.0}),
    ("let the scale grow back after every good step: torch.amp.GradScaler(device, growth_interval=1)",
     {"mode": "fp16", "growth_interval": 1}),
    ("run that feed-forward in fp32: in forward(), with torch.autocast(device, enabled=False): h = self.ff(x.float())",
     {"mode": "fp16, ff in fp32"}),
)
"""The fixes the T5 exercise offers, numbered from 1 in its question: (text, the settings of
``labkit.train.torch.clinic.amp.ff_run`` that try it)."""
T5_STEPS = 3
"""Steps each fix is tried for (`t5_fix_outcomes`)."""


@functools.cache
def t5_fix_outcomes() -> tuple:
    """What each of `T5_FIXES` does to `T5_STEPS` steps of the clinic's T5-like block (case
    ``fp16-forward-overflow``: fp16 autocast on the CPU, a real ``torch.amp.GradScaler``), in order: the
    clinic's ``ff_run`` records (per step: ``applied``, the loss, the largest |ff(x)| in ``amax``, and the
    scale it used in ``scales``)."""
    from labkit.train.torch.clinic.amp import ff_run  # the clinic's block: ff(x) reaches ~80,000

    return tuple(ff_run(steps=T5_STEPS, **settings) for _, settings in T5_FIXES)


def _t5_fix_key() -> int:
    """The option (from 1) under which every step is applied."""
    return _only_working(t5_fix_outcomes(), lambda o: o.steps_applied == T5_STEPS)


def _t5_hints() -> tuple[Hint, ...]:
    n = len(T5_FIXES)
    valid = lambda a: 1 <= a <= n  # noqa: E731

    def tried(a: int) -> str:
        o = t5_fix_outcomes()[a - 1]
        return (f"Tried on a real GradScaler, option {a} applies {o.steps_applied} of {T5_STEPS} steps, and the loss "
                f"is finite at {o.finite_losses} of them. ")

    def settings(a: int) -> dict:  # the option's settings: each hint is about what the option does, not its place
        return T5_FIXES[a - 1][1] if valid(a) else {}

    return (
        Hint(lambda a, k: not valid(a), "Answer with the number of one of the options the question lists, from 1."),
        Hint(lambda a, k: settings(a).get("init_scale", 1.0) > 1,
             lambda a, k: tried(a) + "The scale multiplies the loss *after* the forward pass (and so the gradients): "
                                     "the activation is inf before any scale is applied, so no scale helps, and a "
                                     "larger one only adds gradient overflows."),
        Hint(lambda a, k: settings(a).get("init_scale") == 1.0,
             lambda a, k: tried(a) + "Even a scale of 1, no scaling at all, leaves the forward pass as it was: the "
                                     f"feed-forward output (about {T5_ACTIVATION:,.0f}) is past fp16's largest value, "
                                     f"{lf.get('fp16').max:g}, and is inf before the loss exists."),
        Hint(lambda a, k: "growth_interval" in settings(a),
             lambda a, k: tried(a) + "growth_interval sets how soon the scale grows back after good steps; here no "
                                     "step is good, so the scale just halves at each one. The overflow is in the "
                                     "forward pass, where the scale never reaches."),
    )


register(Exercise(
    "t5_overflow_fix", ("11",),
    f"Under fp16 autocast a T5 feed-forward output reaches about {T5_ACTIVATION:,.0f}: the loss is nan from the "
    "first step and GradScaler skips every step. Which change lets it train, still under fp16 autocast? "
    + " ".join(f"({i}) {text};" for i, (text, _) in enumerate(T5_FIXES, 1))[:-1]
    + ". Answer with the option's number.",
    "integer", _t5_fix_key, hints=_t5_hints(),
    otherwise="Not that one: where does the inf appear -- before or after the loss scale is applied?",
    why="no loss scale reaches the forward pass, so the op that overflows must leave fp16: in fp32 it holds the "
        "activation, and the rest of the model keeps fp16's speed (Hugging Face keeps T5's wo layer in fp32; bf16, "
        "with fp32's range, is the other way out, and the T5 authors trained in it)."))


# -- DeepSpeed's stop -------------------------------------------------------------------------------
DEEPSPEED_POWER = 8
"""initial_scale_power of the DeepSpeed exercise (11): the clinic's own case starts at the default, 16."""


def _deepspeed_stop_step(power: int = DEEPSPEED_POWER) -> int:
    from labkit import scaling

    trace = scaling.simulate("deepspeed", overflows=[True] * 100, init_scale=2**power, hysteresis=2)
    return int(trace.stopped_at) + 1  # stopped_at counts from 0


register(Exercise(
    "deepspeed_stop_step", ("11",),
    f"DeepSpeed fp16 with initial_scale_power {DEEPSPEED_POWER} and the config's other defaults (hysteresis 2, "
    "min_loss_scale 1, consecutive_hysteresis false), and a loss that is inf at every step. At which step, counting "
    "from 1, does training stop with 'Current loss scale already at minimum - cannot decrease scale anymore. "
    "Exiting run.'?",
    "integer", _deepspeed_stop_step,
    hints=(
        Hint(lambda a, k: a == _deepspeed_stop_step(16),
             "That is where notebook 11's run stops, from the default initial_scale_power 16; this one starts at "
             f"2^{DEEPSPEED_POWER}."),
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
    why=f"step 1 uses up the hysteresis, steps 2-{DEEPSPEED_POWER + 1} halve 2^{DEEPSPEED_POWER} down to 1, and the "
        f"overflow at the next step arrives at the floor and raises. By then no smaller scale could help: overflows "
        "that last that long come from the forward pass."))

__all__ = ["DEEPSPEED_POWER", "FP16_GRADIENT_FIXES", "T5_ACTIVATION", "T5_FIXES", "T5_STEPS", "fp16_fix_outcomes",
           "t5_fix_outcomes"]
