"""Exercises on training choices: precision per GPU (00), a resumed GradScaler and the AMP step's order (04),
Keras' loss scale and logits (05), a gradient's dtype and jmp's loss scale (06), model-state bytes and MFU (07),
ZeRO's bytes per rank and FSDP2's collective dtypes (08), MX block scaling (09) and optimizer-state bytes (10).

The precision keys come from `labkit.hardware.advise` on `labkit.hardware.example_report` (the
same rule `labkit doctor` applies), the loss scales from `labkit.scaling`'s replays (tested against
the libraries), the dtypes from Flax, Keras and `labkit.diagrams.sharding_plan` (imported when checked),
the MX key from ml_dtypes, the state bytes from `labkit.memory.model_state_bytes` and the 8-bit
optimizers' block layout.

>>> from labkit.exercises import check
>>> check("precision_for_rtx_4090", "bf16").correct
True
>>> print(check("amp_step_order", ["backward", "clip", "unscale_", "step", "update"]).message)  # doctest: +ELLIPSIS
Clipping before unscale_ clips the *scaled* gradients...
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from labkit import formats as lf
from labkit._validate import choice, number
from labkit.exercises.core import AMP_CALLS, Exercise, Hint, register

# -- 00: which precision on which GPU -----------------------------------------------------------------


def _gpu(name: str):
    from labkit import hardware

    return hardware.example_report(name).gpus[0]


def _precision_key(name: str):
    """The answers accepted for GPU `name`: `advise()`'s headline, and fp8 where it has fp8 Tensor Cores."""
    from labkit import hardware

    key = {hardware.advise(hardware.example_report(name)).headline}
    if "fp8" in _gpu(name).tensor_core_dtypes:
        key.add("fp8")
    return frozenset(key)


def _precision_hints(name: str) -> tuple[Hint, ...]:
    def gpu_text():
        g = _gpu(name)
        return f"The {name} ({g.architecture}, compute capability {g.capability[0]}.{g.capability[1]})"

    return (
        Hint(lambda a, k: a == "bf16" and "bf16" not in _gpu(name).tensor_core_dtypes,
             lambda a, k: f"{gpu_text()} has no bf16 Tensor Cores: bf16 runs there, but emulated and slowly."),
        Hint(lambda a, k: a == "fp8" and "fp8" not in _gpu(name).tensor_core_dtypes,
             lambda a, k: f"{gpu_text()} has no fp8 Tensor Cores: they start with Ada (8.9) and Hopper (9.0)."),
        Hint(lambda a, k: a == "fp16" and "fp16 + loss scaling" in k,
             "fp16 is the right format, but its 5-bit exponent flushes small gradients to zero: without loss "
             "scaling they are lost. Say how you keep them."),
        Hint(lambda a, k: a.startswith("fp16") and "bf16" in k,
             lambda a, k: f"fp16 runs on the {name} too, but bf16 is as fast there and has fp32's exponent range: "
                          "no loss scale to manage."),
        Hint(lambda a, k: a.startswith("fp16") and "fp32" in k and (_gpu(name).fp16_rate or 1) < 1,
             lambda a, k: f"{gpu_text()} is Pascal like the P100, but consumer Pascal: it has no Tensor Cores, and "
                          f"its fp16 arithmetic runs at 1/{round(1 / _gpu(name).fp16_rate)} of its fp32 rate (only "
                          "GP100, the Tesla P100, runs fp16 at twice its fp32 rate). 16-bit compute brings no speed "
                          "there."),
        Hint(lambda a, k: a == "fp32" and "fp32" not in k,
             lambda a, k: f"fp32 is always safe, but the {gpu_text()[4:]} has 16-bit Tensor Cores: fp32 leaves their "
                          "speed, and half the activation memory, unused."),
        Hint(lambda a, k: a != "fp32" and "fp32" in k,
             lambda a, k: f"{gpu_text()} has no Tensor Cores that 16-bit training would use."),
    )


PRECISION_GPUS = {"RTX 4090": ("00",), "GTX 1080": ("00",)}
"""The GPUs of the precision exercises (id ``precision_for_<name>``), by notebook: two that notebook 00's rule
covers but its tables do not name, so the rule must be applied (Ada: bf16 and fp8 Tensor Cores; consumer Pascal:
no Tensor Cores and fp16 at 1/64 of the fp32 rate)."""

for _name, _notebooks in PRECISION_GPUS.items():
    register(Exercise(
        f"precision_for_{_name.lower().replace(' ', '_')}", _notebooks,
        f"Which precision would you train in on an NVIDIA {_name}? (labkit.hardware.example_report('{_name}') "
        "describes it.)",
        "precision", (lambda n=_name: _precision_key(n)), accepts=lambda a, k: a in k,
        hints=_precision_hints(_name),
        why=f"labkit.hardware.advise() says {next(iter(_precision_key(_name) - {'fp8'}))} for the {_name}" + (
            "; its fp8 Tensor Cores also train the matmuls in fp8 (torchao.float8, Transformer Engine), the "
            "rest in bf16." if "fp8" in _precision_key(_name) else
            ": no Tensor Cores, and no 16-bit arithmetic faster than its fp32." if "fp32" in _precision_key(_name)
            else ".")))

# -- 06: the dtype of a gradient --------------------------------------------------------------------
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _flax_grad_dtype() -> str:
    """The dtype jax.grad gives the kernel of seed 000's layer: Flax nn.Dense(dtype=bfloat16, param_dtype=float32)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    layer = nn.Dense(2, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    x = jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)  # traced, not run: eval_shape gives the dtypes in milliseconds
    params = jax.eval_shape(lambda x: layer.init(jax.random.PRNGKey(0), x), x)
    grads = jax.eval_shape(jax.grad(lambda p, x: layer.apply(p, x).astype(jnp.float32).sum()), params, x)
    return _DTYPE_NAMES[grads["params"]["kernel"].dtype.name]


register(Exercise(
    "flax_grad_dtype", ("06",),
    "Seed 000's layer is nn.Dense(features, dtype=jnp.bfloat16, param_dtype=jnp.float32). In which dtype does "
    "jax.grad return the gradient of a float32 loss with respect to its kernel?",
    "dtype", _flax_grad_dtype,
    hints=(
        Hint(lambda a, k: a == "bf16",
             "That is the seed's claim. bfloat16 is the dtype of the backward *computation*; the backward pass of the "
             "layer's cast (astype(bfloat16)) casts the gradient back to the dtype of what was cast: the parameter."),
        Hint(lambda a, k: a == "fp16", "Nothing here is float16: the layer computes in bfloat16."),
    ),
    otherwise="Not a dtype that appears in this layer: it stores its kernel in one dtype and computes in another.",
    why="a gradient has its parameter's dtype: float32 here, so optax updates the float32 master weights directly."))

# -- 04: the order of an AMP step, and a resumed GradScaler ------------------------------------------
AMP_ORDER = tuple(AMP_CALLS)
"""The working order of one torch.amp step with clipping (torch's AMP examples, "Gradient clipping":
backward on the scaled loss, unscale_, clip, step, update)."""


def _pos(calls, name):
    return calls.index(name) if name in calls else None


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


def _default(preset: str, option: str) -> float:
    """A loss scaler's default `option`, as labkit.scaling's `preset` imitates it (tested against the library)."""
    from labkit.scaling import PRESETS

    return float(PRESETS[preset].defaults[option])


def _pow2_other(a: float, k: float) -> bool:
    """`a` is a power of two other than the key (a scale, just not the right one)."""
    return a != k and a > 0 and math.isfinite(a) and math.frexp(a)[0] == 0.5


def _log2(x: float) -> int:
    return int(math.log2(x))


RESUME_SETTLED = 2.0**10
"""Where the scale of the resume exercise (04) had settled when the run was saved."""

register(Exercise(
    "resume_scale_without_state", ("04",),
    "A run with torch.amp.GradScaler('cuda') at its defaults saves model.state_dict() and optimizer.state_dict() "
    f"every 1000 steps, but not scaler.state_dict(). By step 50,000 the scale has settled at 2^"
    f"{_log2(RESUME_SETTLED)}. The run is resumed from that checkpoint with a new "
    "torch.amp.GradScaler('cuda') and nothing loaded into it. What scale does the first resumed step use?",
    "number", lambda: _default("torch", "init_scale"),
    hints=(
        Hint(lambda a, k: a == RESUME_SETTLED,
             "That scale lived in the scaler's state (scaler.state_dict()['scale']), and the checkpoint left it "
             "out: the new GradScaler knows nothing of the old run."),
        Hint(lambda a, k: a == 1.0, "A new GradScaler does not start unscaled: it starts at its init_scale."),
        Hint(lambda a, k: a == _default("keras", "initial_scale"),
             "That is where Keras' LossScaleOptimizer and jmp's docstring start; torch.amp.GradScaler's init_scale "
             "is one power of two higher."),
        Hint(lambda a, k: _pow2_other(a, k),
             "Nothing was loaded, so the new scaler starts where every new GradScaler starts: its init_scale "
             "default (torch/amp/grad_scaler.py)."),
        Hint(lambda a, k: not _pow2_other(a, k), "GradScaler's scales are powers of two: scaling by them is exact."),
    ),
    why=f"a new GradScaler starts at init_scale, 2^{_log2(_default('torch', 'init_scale'))}, whatever the old run "
        f"had reached. From there back down to "
        f"2^{_log2(RESUME_SETTLED)} the first resumed steps can overflow and be skipped, one halving "
        "each: save scaler.state_dict() with the model and optimizer, and load it on resume."))


# -- 05: Keras' loss scale, and the dtype of its logits ----------------------------------------------
KERAS_OVERFLOWS = (3, 10)
"""The Keras exercise (05): that many overflowing batches, then that many clean ones."""


def _keras_final_scale(overflows: int = KERAS_OVERFLOWS[0], clean: int = KERAS_OVERFLOWS[1], **options) -> float:
    from labkit.scaling import simulate

    return float(simulate("keras", [True] * overflows + [False] * clean, **options).final_scale)


register(Exercise(
    "keras_scale_after_overflows", ("05",),
    f"Keras 3's LossScaleOptimizer at its defaults (what compile() adds under mixed_float16): the first "
    f"{KERAS_OVERFLOWS[0]} batches' gradients overflow, the next {KERAS_OVERFLOWS[1]} are finite. What is "
    "its dynamic_scale after them? (labkit.scaling.simulate('keras', ...) replays it.)",
    "number", _keras_final_scale,
    hints=(
        Hint(lambda a, k: not _pow2_other(a, k), "The scale is a power of two: it only halves and doubles."),
        Hint(lambda a, k: a == _default("keras", "initial_scale"),
             "Each overflowing batch halves the scale (and skips that batch's update): it does not stay at its "
             "start."),
        Hint(lambda a, k: a == 2 * k,
             "Either you started from torch's 2^16, or you doubled the scale after the finite batches. Keras "
             "starts at its initial_scale default, and grows only after dynamic_growth_steps (2000) finite steps "
             "in a row."),
        Hint(lambda a, k: a > _default("keras", "initial_scale"),
             "Growth is one doubling per dynamic_growth_steps (2000) finite steps in a row, not one per batch."),
        Hint(lambda a, k: a < k and a > 0,
             "Halved too often: one halving per overflowing batch, and none for a finite one."),
        Hint(lambda a, k: a > k and a < _default("keras", "initial_scale"),
             "Count the halvings: one per overflowing batch."),
    ),
    why=f"2^{_log2(_default('keras', 'initial_scale'))} halved {KERAS_OVERFLOWS[0]} times; {KERAS_OVERFLOWS[1]} "
        "finite batches are far from the 2000 that would double it. Keras has no floor: halving goes on to 0 if "
        "every batch overflows."))


@functools.cache
def _keras_logits_dtype() -> str:
    """The dtype of seed 003's logits under mixed_float16, its last Dense without dtype="float32", from Keras."""
    from labkit.train.tf.lessons import global_policy
    from labkit.train.tf.models import keras

    with global_policy("mixed_float16"):  # seed 003 sets the global policy; a layer takes it when created
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    # traced, not run (no float16 kernel, no oneDNN notice); the tests call the model for real
    return _DTYPE_NAMES[keras.backend.standardize_dtype(model.outputs[0].dtype)]


register(Exercise(
    "keras_logits_dtype", ("05",),
    "Seed 003 sets keras.mixed_precision.set_global_policy('mixed_float16') and builds Sequential([Dense(512, "
    "activation='relu'), Dense(10)]): its last Dense has no dtype='float32'. In which dtype does the model "
    "return its logits?",
    "dtype", _keras_logits_dtype,
    hints=(
        Hint(lambda a, k: a == "fp32",
             "float32 is the dtype of the variables (the policy's variable_dtype) and of Keras' loss, which casts "
             "the logits up; the layer itself computes, and returns, in the policy's compute_dtype."),
        Hint(lambda a, k: a == "bf16", "That is mixed_bfloat16's compute dtype; this policy is mixed_float16."),
    ),
    why="every layer created under mixed_float16 computes in float16, the last one included: the logits are "
        "float16 unless that layer gets dtype='float32' (the TF guide's advice: a softmax of them in float16 "
        "can round small probabilities to 0)."))


# -- 06: jmp's dynamic loss scale ---------------------------------------------------------------------
JMP_STEPS = (3, 2000)
"""The jmp exercise (06): that many steps with non-finite gradients, then that many finite ones."""


def _jmp_final_scale() -> float:
    from labkit.scaling import simulate

    overflows, clean = JMP_STEPS
    return float(simulate("jmp", [True] * overflows + [False] * clean, loss_scale=2**15, period=2000,
                          factor=2).final_scale)


register(Exercise(
    "jmp_scale_after_overflows", ("06",),
    f"loss_scale = jmp.DynamicLossScale(jnp.float32(2**15), period=2000, factor=2). The first {JMP_STEPS[0]} steps' "
    f"gradients are not finite, the next {JMP_STEPS[1]} are; after each step, loss_scale = "
    "loss_scale.adjust(jmp.all_finite(grads)). What is loss_scale.loss_scale after the last of them? "
    "(labkit.scaling.simulate('jmp', ...) replays it.)",
    "number", _jmp_final_scale,
    hints=(
        Hint(lambda a, k: not _pow2_other(a, k), "The scale is a power of two: adjust() only divides and multiplies "
                                                 "it by factor (2)."),
        Hint(lambda a, k: a == k / 2,
             f"{JMP_STEPS[1]} finite steps in a row are exactly one period: adjust() multiplies the scale by factor "
             "at the period-th finite step."),
        Hint(lambda a, k: a == 2 * k,
             "One factor of 2 too high: count a division for each non-finite step, and a doubling for each full "
             "period of finite steps in a row."),
        Hint(lambda a, k: a == 2.0**15 * 2,
             "The growth starts from where the overflows left the scale, not from 2^15."),
        Hint(lambda a, k: a == 2.0**15,
             "Each non-finite step divides the scale by factor (2) -- and the caller skips that update."),
        Hint(lambda a, k: a > 2.0**15, "adjust() grows the scale once per period (2000) of finite steps, not once "
                                       "per step."),
        Hint(lambda a, k: a < k, "Count the divisions: one per non-finite step, and none for a finite one."),
    ),
    why=f"2^15 halved {JMP_STEPS[0]} times, then doubled once when {JMP_STEPS[1]} finite steps complete a "
        "period. (min_loss_scale, 1 by default, is far below.)"))


# -- 09: MX block scaling ----------------------------------------------------------------------------
def _e2m1_values() -> int:
    values = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    return len({float(v) for v in values if np.isfinite(v)})  # -0.0 == 0.0: one value


register(Exercise(
    "e2m1_values", ("09",),
    "How many distinct values does fp4 E2M1 (the elements of MXFP4 and NVFP4; ml_dtypes.float4_e2m1fn) have? "
    "Count +0 and -0 as one value.",
    "integer", _e2m1_values,
    hints=(
        Hint(lambda a, k: a == 16, "16 bit patterns, but +0 and -0 are the same value: count it once."),
        Hint(lambda a, k: a in (k // 2, k // 2 + 1), "Count the negative values too: the sign bit doubles them."),
        Hint(lambda a, k: a in (k - 2, k - 1 - 2), "E2M1 has no inf and no NaN: every pattern is a finite number."),
    ),
    otherwise="Decode all 16 patterns: 1 sign, 2 exponent, 1 mantissa bit, with subnormals.",
    why="0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives: 16 patterns, 15 values."))



def mx_dequantize(x: float, amax: float, rounding: str = "floor") -> float:
    """`x` after MXFP8-E4M3 quantization in a block whose largest magnitude is `amax`, dequantized.

    The shared scale is a power of two (E8M0). FLOOR (torchao's default,
    ``torchao/prototype/mx_formats/mx_tensor.py``, ``to_mx``): ``2^(floor(log2 amax) - 8)``, 8 being
    ``floor(log2 448)``, e4m3's largest power of two; RCEIL: ``2^ceil(log2(amax / 448))``. The
    scaled value is clamped to +-448 before the cast (a plain ml_dtypes cast of 500 to
    float8_e4m3fn gives NaN: e4m3fn has no inf), then multiplied back.

    >>> mx_dequantize(500.0, 500.0), mx_dequantize(500.0, 500.0, "rceil")
    (448.0, 512.0)
    """
    x = number("x", x)
    amax = number("amax", amax, minimum=0, inclusive=False)
    rounding = choice("rounding", rounding, ("floor", "rceil"))
    if abs(x) > amax:
        raise ValueError(f"x ({x:g}) must lie in the block: |x| <= amax ({amax:g})")
    top = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    exp = (math.floor(math.log2(amax)) - math.floor(math.log2(top)) if rounding == "floor"
           else math.ceil(math.log2(amax / top)))
    scale = 2.0 ** min(max(exp, -127), 127)
    q = np.clip(np.float32(x / scale), -top, top).astype(ml_dtypes.float8_e4m3fn)
    return float(q.astype(np.float64) * scale)


register(Exercise(
    "mxfp8_floor_500", ("09",),
    "A 32-value block whose largest magnitude is 500 is quantized to MXFP8 (E4M3 elements, one E8M0 scale) "
    "with torchao's default FLOOR scale. What does the 500 dequantize to? (mx_dequantize checks you.)",
    "number", lambda: mx_dequantize(500.0, 500.0, "floor"),
    hints=(
        Hint(lambda a, k: a == 500.0,
             "With FLOOR the scale is 2^(floor(log2 500) - 8) = 2^0, so the element must hold 500 itself, and "
             "e4m3's largest finite value (ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) is below 500."),
        Hint(lambda a, k: math.isnan(a),
             "A plain ml_dtypes cast of 500 to float8_e4m3fn does give NaN (e4m3fn has no inf), but MX "
             "quantizers (torchao's to_mx) clamp to +-max before casting."),
        Hint(lambda a, k: a == mx_dequantize(500.0, 500.0, "rceil"),
             "That is RCEIL's answer (scale rounded up so that amax fits, 2^1): FLOOR rounds the scale down."),
        Hint(lambda a, k: a == 480.0,
             "e4m3fn has no 480: at exponent 8 its top pattern S.1111.111 is NaN, so 1.75 x 2^8 is its max."),
        Hint(lambda a, k: math.isinf(a), "e4m3fn has no infinity: its overflow is NaN, or a clamp."),
    ),
    why="floor(log2 500) = 8 = e4m3's top exponent, so the scale is 1 and 500 saturates: FLOOR loses the top "
        "of the block (the OCP spec's known weakness; RCEIL avoids it)."))


# -- 10: optimizer-state bytes -----------------------------------------------------------------------
BLOCK_8BIT = 256
"""Values per block of the 8-bit optimizers' states: bitsandbytes (``bitsandbytes/optim/optimizer.py``,
``Optimizer2State.init_state``: ``blocksize = 256``, one fp32 ``absmax`` per block) and torchao
(``torchao/optim/adam.py``, ``Adam8bit(block_size=256)``, one fp32 scale per block)."""
SCALE_BYTES = 4
"""Bytes of one block scale: float32 in both libraries."""


def _adam_state_bytes_8bit() -> float:
    return 2 * (1 + SCALE_BYTES / BLOCK_8BIT)  # m and v: one byte each, plus each block's fp32 scale


def _fp32_state_bytes() -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, "fp32", "adam")["optimizer_states"])


register(Exercise(
    "adam_state_bytes_fp32", ("10",),
    "How many bytes per parameter do Adam's optimizer states (m and v) take in fp32? (Only the states: not the "
    "weights, not the gradients.)",
    "number", _fp32_state_bytes,
    hints=(
        Hint(lambda a, k: a == k / 2, "Adam keeps two states per parameter: m (momentum) and v (squared gradients)."),
        Hint(lambda a, k: a == k + 8, "That counts all of fp32 training's model states (weights + gradients + m + v): "
                                      "the question asks for the optimizer's states only."),
        Hint(lambda a, k: a == k + 4, "That is ZeRO's K = 12: fp32 master weights with m and v. No master copy here."),
    ),
    otherwise="Count the states (how many per parameter?) times the bytes of an fp32.",
    why="m and v, 4 bytes each."))

register(Exercise(
    "adam_state_bytes_8bit", ("10",),
    "With 8-bit Adam (bitsandbytes' or torchao's Adam8bit) each of m and v is stored as 1-byte codes plus one "
    "fp32 scale per block of 256 values. Bytes per parameter of the states, *including* the block scales? "
    "(A number within 0.1% is right.)",
    "number", _adam_state_bytes_8bit, rel_tol=0.001,
    hints=(
        Hint(lambda a, k: a == 2, "Nearly: add the block scales -- one fp32 (4 bytes) per 256 values, for m and "
                                  "for v."),
        Hint(lambda a, k: a == 1 or math.isclose(a, k / 2, rel_tol=1e-3), "Adam has two states, m and v."),
        Hint(lambda a, k: math.isclose(a, 2 + SCALE_BYTES / BLOCK_8BIT, rel_tol=1e-4),
             "That counts one scale per block for one state: m and v each have their own blocks."),
        Hint(lambda a, k: a == 8, "That is fp32 Adam's count; the 8-bit states take 1 byte per value."),
    ),
    why="2 x (1 + 4/256) = 2.03125: about a quarter of fp32 Adam's 8 bytes (bitsandbytes keeps fp32 states for "
        "tensors under 4096 values, torchao for those under 4096 or not divisible by the block)."))

# -- 07: what a step holds, and how busy it keeps the chip --------------------------------------------


MFU_STEP = {"model": "transformer", "batch_size": 256, "width": 1024, "seconds": 0.010, "device": "NVIDIA H100 SXM",
            "precision": "bf16"}
"""The step of the MFU exercise (07): the GPU size of notebook 07's transformer, timed on an H100 SXM."""


def _mfu() -> float:
    from labkit import bench

    s = MFU_STEP
    flops = bench.train_flops(s["model"], s["batch_size"], s["width"])
    return flops / s["seconds"] / (bench.peak_tflops(s["device"], s["precision"]) * 1e12)


def _near(a: float, b: float, rel: float = 0.01) -> bool:
    return math.isfinite(a) and math.isclose(a, b, rel_tol=rel)


MODEL_PARAMS = 7 * 10**9
"""Parameters of the model-state exercise (07): a 7B model."""


def _state_gb(precision: str) -> float:
    """GB (1e9 bytes) of the model states of `MODEL_PARAMS` parameters trained with Adam in `precision`."""
    from labkit.memory import model_state_bytes

    return model_state_bytes(MODEL_PARAMS, precision, "adam")["total"] / 1e9


def _per_param_gb(nbytes: float) -> float:
    return MODEL_PARAMS * nbytes / 1e9


register(Exercise(
    "model_states_7b_gb", ("07",),
    f"A {MODEL_PARAMS / 1e9:g}B-parameter model trains with bf16 autocast and Adam, its weights in fp32 (PyTorch's "
    "torch.autocast, Keras' mixed_bfloat16, Flax with param_dtype=float32). How many GB (1e9 bytes) do its model "
    "states take -- weights, gradients and Adam's m and v, activations left out? (labkit.memory.model_state_bytes "
    "counts them; within 1% is right.)",
    "number", lambda: _state_gb("bf16"), rel_tol=0.01,
    hints=(
        Hint(lambda a, k: _near(a, _state_gb("bf16-pure")),
             "That halves everything: pure bf16, where weights, gradients and Adam's moments are all bf16. Under "
             "autocast the weights stay fp32, and so do their gradients and Adam's moments."),
        Hint(lambda a, k: _near(a, k * 1e9 / 2**30),
             "That is GiB (2^30 bytes): the question asks for GB, 1e9 bytes."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(4)),
             "That counts an fp32 master copy besides the weights, as seed 004's rows do. Under autocast the fp32 "
             "weights *are* the master copy: there is no other."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(2)),
             "That adds a 16-bit copy of the weights. Autocast makes those copies during the step (notebook 07 "
             "counts them beside the states); they are not kept as model state."),
        Hint(lambda a, k: _near(a, k - _per_param_gb(2)),
             "A gradient takes its weight's dtype: the weights are fp32, so their gradients are fp32 too, not bf16."),
        Hint(lambda a, k: _near(a, k - _per_param_gb(4)),
             "Count all four: the weight, its gradient, and Adam's two moments m and v."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(8)),
             "That is seed 004's fp32 total, which gives Adam twice the bytes its m and v take."),
        Hint(lambda a, k: _near(a, k * 1e3) or _near(a, k * 1e9) or _near(a, k / 1e3),
             "Check the unit: GB, 1e9 bytes."),
        Hint(lambda a, k: _near(a, k / MODEL_PARAMS * 1e9),
             "That is bytes per parameter: multiply by the parameters, then divide by 1e9."),
    ),
    otherwise="Count four tensors per parameter -- weight, gradient, m, v -- each in the dtype autocast leaves it, "
              "times the parameters.",
    why="fp32 weights (4 bytes) + fp32 gradients (4) + Adam's m and v (8): 16 bytes per parameter, as in fp32 "
        "training. Autocast saves memory in the activations, not in the model states; ZeRO and FSDP (notebook 08) "
        "shard these states."))


register(Exercise(
    "mfu_h100_transformer", ("07",),
    "One bf16 training step of the course's transformer at d_model 1024, batch 256 (notebook 07's GPU size) takes "
    "10 ms on an NVIDIA H100 SXM. What is its MFU, as a fraction from 0 to 1? (labkit.bench.train_flops counts a "
    "step's FLOPs; labkit.bench.peaks_table() lists the dense peaks. Within 1% is right.)",
    "number", _mfu, rel_tol=0.01,
    hints=(
        Hint(lambda a, k: _near(a, 100 * k), "That looks like a percentage: give MFU as a fraction (0.5, not 50)."),
        Hint(lambda a, k: _near(a, 1000 * k) or _near(a, k / 1000),
             "Off by a factor of 1000: the step takes 10 milliseconds, and a TFLOP/s is 1e12 FLOP per second."),
        Hint(lambda a, k: a > 1,
             "More than the chip can do: did you divide by its fp32 peak (no tensor cores)? A bf16 step is measured "
             "against the chip's bf16 peak."),
        Hint(lambda a, k: _near(a, k / 2),
             "Half of it: either you divided by the datasheet's figure 'with sparsity' (twice the dense peak that "
             "MFU uses), or you counted multiply-adds as one FLOP (a multiply-add is 2; train_flops counts FLOPs)."),
        Hint(lambda a, k: _near(a, k / 3),
             "That counts the forward pass only: a training step is about 3x the forward's FLOPs (backward does two "
             "matmuls for each forward one)."),
        Hint(lambda a, k: _near(a, 2 * k),
             "Twice too high: did you divide by the TF32 peak? A bf16 run is measured against the bf16 peak."),
    ),
    otherwise="MFU = the step's FLOPs / its time in seconds / the dense peak for the run's precision (in FLOP/s).",
    why="train_flops / 0.010 s is about a quarter of the H100 SXM's dense bf16 peak: a typical MFU for a model this "
        "small; large transformers reach 0.4-0.6."))


# -- 08: what each rank holds, and what the collectives move -------------------------------------------


def _plan(*args, **kwargs) -> dict:
    from labkit.diagrams import sharding_plan

    return sharding_plan(*args, **kwargs)


FSDP2_PARAM_DTYPE = "fp16"
"""param_dtype of the FSDP2 exercises (08): fp16, where notebook 08's own examples use bf16."""


def _collective_dtype(strategy: str, op: str, reduce_dtype: str | None) -> str:
    return next(c["dtype"] for c in _plan(2, strategy, FSDP2_PARAM_DTYPE, reduce_dtype)["collectives"]
                if c["op"] == op)


ZERO_RANKS = 64
"""Ranks of the ZeRO exercise (08)."""


def _zero_bytes(strategy: str) -> float:
    return float(_plan(ZERO_RANKS, strategy, "bf16")["bytes_per_param"])


def _mixed_total() -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, "mixed", "adam")["total"])


register(Exercise(
    "zero2_bytes_per_param", ("08",),
    f"DeepSpeed trains with mixed-precision Adam: bf16 weights and gradients, fp32 master weights, fp32 m and v -- "
    f"16 bytes per parameter in all. Under ZeRO stage 2 on {ZERO_RANKS} ranks, how many bytes of model state per "
    f"parameter does each rank hold? (labkit.diagrams.sharding_plan counts them.)",
    "number", lambda: _zero_bytes("zero2"), rel_tol=1e-9,
    hints=(
        Hint(lambda a, k: a == _mixed_total() / ZERO_RANKS,
             "That shards everything, the 16-bit weights included: ZeRO stage 3 (or FSDP). Stages 1 and 2 keep "
             "every rank's full copy of the bf16 weights."),
        Hint(lambda a, k: a == _mixed_total(), "That is plain data parallelism (stage 0): nothing is sharded."),
        Hint(lambda a, k: a == _zero_bytes("zero1"),
             "That is stage 1, which shards the master weights and Adam's states; stage 2 shards the gradients too."),
        Hint(lambda a, k: a == k - 2, "Count the bf16 weights: every rank keeps all of them under stage 2."),
        Hint(lambda a, k: a == k - 4 / ZERO_RANKS,
             "Count the fp32 master weights: DeepSpeed keeps them besides the bf16 weights, sharded from stage 1."),
        Hint(lambda a, k: a == k + 2 / ZERO_RANKS,
             "The gradients are bf16 here, not fp32: DeepSpeed casts the whole model to bf16, gradients included."),
    ),
    otherwise="Go state by state: which of weights, gradients, master weights and m/v does stage 2 split into "
              "1/N shards, and which does every rank keep whole?",
    why=f"2 (bf16 weights, whole) + (2 gradients + 4 master + 8 m and v) / {ZERO_RANKS}: stage 2 shards everything "
        "but the 16-bit weights."))

register(Exercise(
    "fsdp2_gather_dtype", ("08",),
    "FSDP2 with MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32): each rank stores its "
    "parameter shards in fp32. In which dtype does the all-gather before a layer's forward pass move the parameters? "
    "(labkit.diagrams.sharding_plan describes the collectives.)",
    "dtype", lambda: _collective_dtype("fsdp", "all-gather", "fp32"),
    hints=(
        Hint(lambda a, k: a == "fp32",
             "The shards are stored in fp32, but FSDP2 casts each shard to param_dtype *before* it gathers "
             "(FSDPParam.all_gather_inputs): half the bytes. reduce_dtype is for the gradients."),
        Hint(lambda a, k: a == "bf16",
             "bf16 is what this notebook's examples ask for; this policy's param_dtype is another 16-bit dtype."),
    ),
    why="FSDP2 casts each fp32 shard to param_dtype, then all-gathers it: fp16 here, 2 bytes per element (this "
        "notebook's JAX example gathers fp32 and casts after: twice the bytes)."))

register(Exercise(
    "fsdp2_default_reduce_dtype", ("08",),
    "Now MixedPrecisionPolicy(param_dtype=torch.float16) with reduce_dtype left at its default, None. In which "
    "dtype are the gradients reduce-scattered?",
    "dtype", lambda: _collective_dtype("fsdp", "reduce-scatter", None),
    hints=(
        Hint(lambda a, k: a == "fp32",
             "None does not mean fp32: MixedPrecisionPolicy's docstring says the reduction then uses the compute "
             "dtype. Ask for reduce_dtype=torch.float32 to sum the gradients in fp32."),
        Hint(lambda a, k: a == "bf16",
             "bf16 is what this notebook's examples compute in; this policy's param_dtype, its compute dtype, is "
             "another 16-bit dtype."),
    ),
    why="reduce_dtype=None reduces in the compute dtype, fp16 here (foreach_reduce takes reduce_dtype or the "
        "gradient's dtype): 11 significant bits and fp16's range for the sum, unless you ask for fp32."))

__all__ = ["AMP_ORDER", "BLOCK_8BIT", "SCALE_BYTES", "mx_dequantize"]
