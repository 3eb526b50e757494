"""Exercises of notebook 04, torch.amp's step: the order of its calls, whether bf16 needs a GradScaler, and the
scale a run resumed without the scaler's state starts from.

The step order is judged against torch's AMP examples (and, in the tests, a real GradScaler run in every
order), the bf16 key from `labkit.formats`, the resumed scale from `labkit.scaling`'s imitation of
GradScaler's defaults.

>>> from labkit.exercises import check
>>> print(check("amp_step_order", ["backward", "clip", "unscale_", "step", "update"]).message)  # doctest: +ELLIPSIS
Clipping before unscale_ clips the *scaled* gradients...
"""

from __future__ import annotations

from labkit import formats as lf
from labkit.exercises._common import default, is_pow2, log2
from labkit.exercises.core import AMP_CALLS, Exercise, Hint, register

AMP_ORDER = tuple(AMP_CALLS)
"""The working order of one torch.amp step with clipping (torch's AMP examples, "Gradient clipping":
backward on the scaled loss, unscale_, clip, step, update)."""


def _amp_hints() -> tuple[Hint, ...]:
    bwd, uns, clip, step, upd = AMP_ORDER
    before = lambda a, x, y: x in a and y in a and a.index(x) < a.index(y)  # noqa: E731
    return (
        Hint(lambda a, k: len(set(a)) < len(a),
             "Each call appears once per step. A second unscale_ before update() raises RuntimeError "
             "('unscale_() has already been called on this optimizer since the last update()')."),
        Hint(lambda a, k: bwd not in a, "No backward: there are no gradients to unscale, clip or apply."),
        Hint(lambda a, k: a[0] != bwd,
             lambda a, k: f"{a[0]} before backward acts on last step's gradients (or none): backward comes first."),
        Hint(lambda a, k: step not in a, "Without scaler.step(opt) the weights never change."),
        Hint(lambda a, k: before(a, upd, step),
             "update() before step(): update() adjusts the scale and clears this iteration's record of unscale_, "
             "so step() unscales the already unscaled gradients a second time -- divides them by S again -- and "
             "the update is S times too small (or update() asserts 'No inf checks were recorded', without unscale_)."),
        Hint(lambda a, k: upd not in a,
             "Without scaler.update() the scale never moves (an overflow is never answered by halving it), and "
             "this step's record is never cleared: next step's unscale_ raises RuntimeError ('unscale_() is being "
             "called after step()')."),
        Hint(lambda a, k: clip in a and (uns not in a or before(a, clip, uns)),
             "Clipping before unscale_ clips the *scaled* gradients: their norm is S times the true norm "
             "(S = 2^16 at first), so max_norm cuts every step to a tiny update. Unscale first."),
        Hint(lambda a, k: before(a, step, uns) and not before(a, upd, uns),
             "step() unscales the gradients itself when you have not; unscale_ after step() raises "
             "RuntimeError ('unscale_() is being called after step()')."),
        Hint(lambda a, k: before(a, step, clip),
             "Clipping after step() clips gradients the optimizer has already used: no effect on this step."),
        Hint(lambda a, k: clip not in a, "This loop clips the gradient norm: where does clipping go?"),
    )


register(Exercise(
    "amp_step_order", ("04",),
    "Fix a broken AMP loop: give the order of one training step's calls as a list of strings, from "
    "'scaler.scale(loss).backward()', 'scaler.unscale_(opt)', 'clip', 'scaler.step(opt)', 'scaler.update()' "
    "(short names such as 'backward', 'unscale_', 'step', 'update' work too).",
    "calls", lambda: AMP_ORDER, hints=_amp_hints(),
    otherwise="Not a working order: the gradients must be real (unscaled) when clipped, and applied before "
              "update() adjusts the scale.",
    why="backward on the scaled loss, unscale_ so clipping sees true gradients, clip, step (skipped on inf), "
        "update the scale."))

register(Exercise(
    "bf16_needs_grad_scaler", ("04",),
    "Under torch.autocast(dtype=torch.bfloat16), do you need a GradScaler to keep small gradients?",
    "bool", lambda: bool(lf.get("bf16").smallest_normal > lf.get("fp32").smallest_normal),
    hints=(Hint(lambda a, k: a and not k,
                f"bf16 keeps fp32's 8-bit exponent: its smallest normal is the same, "
                f"{lf.get('bf16').smallest_normal:.3g}. Gradients that fit in fp32 fit in bf16 -- they lose "
                "mantissa bits, not range."),
           Hint(lambda a, k: not a and k, "This format's range is narrower than fp32's: it needs scaling.")),
    why="bf16 has fp32's range: GradScaler is for fp16 (torch's docs: bf16 needs no scaling)."))


RESUME_SETTLED = 2.0**10
"""Where the scale of the resume exercise (04) had settled when the run was saved."""

register(Exercise(
    "resume_scale_without_state", ("04",),
    "A run with torch.amp.GradScaler('cuda') at its defaults saves model.state_dict() and optimizer.state_dict() "
    f"every 1000 steps, but not scaler.state_dict(). By step 50,000 the scale has settled at 2^"
    f"{log2(RESUME_SETTLED)}. The run is resumed from that checkpoint with a new "
    "torch.amp.GradScaler('cuda') and nothing loaded into it. What scale does the first resumed step use?",
    "number", lambda: default("torch", "init_scale"),
    hints=(
        Hint(lambda a, k: a == RESUME_SETTLED,
             "That scale lived in the scaler's state (scaler.state_dict()['scale']), and the checkpoint left it "
             "out: the new GradScaler knows nothing of the old run."),
        Hint(lambda a, k: a == 1.0, "A new GradScaler does not start unscaled: it starts at its init_scale."),
        Hint(lambda a, k: a == default("keras", "initial_scale"),
             "That is where Keras' LossScaleOptimizer and jmp's docstring start; torch.amp.GradScaler's init_scale "
             "is one power of two higher."),
        Hint(lambda a, k: is_pow2(a),
             "Nothing was loaded, so the new scaler starts where every new GradScaler starts: its init_scale "
             "default (torch/amp/grad_scaler.py)."),
        Hint(lambda a, k: not is_pow2(a), "GradScaler's scales are powers of two: scaling by them is exact."),
    ),
    why=f"a new GradScaler starts at init_scale, 2^{log2(default('torch', 'init_scale'))}, whatever the old run "
        f"had reached. From there back down to "
        f"2^{log2(RESUME_SETTLED)} the first resumed steps can overflow and be skipped, one halving "
        "each: save scaler.state_dict() with the model and optimizer, and load it on resume."))


__all__ = ["AMP_ORDER", "RESUME_SETTLED"]
