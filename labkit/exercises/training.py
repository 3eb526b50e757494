"""Exercises on training choices: precision per GPU (00, 06), a gradient's dtype (06), the AMP step's order (04, 05),
model-state bytes and MFU (07), ZeRO's bytes per rank and FSDP2's collective dtypes (08),
MX block scaling (09) and optimizer-state bytes (10).

The precision keys come from `labkit.hardware.advise` on `labkit.hardware.example_report` (the
same rule `labkit doctor` applies), the MX key from ml_dtypes, the state bytes from
`labkit.memory.model_state_bytes` and the 8-bit optimizers' block layout.

>>> from labkit.exercises import check
>>> check("precision_for_a100", "bf16").correct
True
>>> print(check("amp_step_order", ["backward", "clip", "unscale_", "step", "update"]).message)  # doctest: +ELLIPSIS
Clipping before unscale_ clips the *scaled* gradients...
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from labkit import formats as lf
from labkit._validate import choice, number
from labkit.exercises.core import AMP_CALLS, Exercise, Hint, register

# -- 00 / 06: which precision on which GPU -----------------------------------------------------------


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
             lambda a, k: f"fp16 runs on {name} too, but bf16 is as fast there and has fp32's exponent range: "
                          "no loss scale to manage."),
        Hint(lambda a, k: a == "fp32" and "fp32" not in k,
             lambda a, k: f"fp32 is always safe, but the {gpu_text()[4:]} has 16-bit Tensor Cores: fp32 leaves their "
                          "speed, and half the activation memory, unused."),
        Hint(lambda a, k: a != "fp32" and "fp32" in k,
             lambda a, k: f"{gpu_text()} has no Tensor Cores that 16-bit training would use."),
    )


for _name, _notebooks in (("T4", ("00",)), ("A100", ("00",)), ("V100", ("06",)), ("H100", ("06",))):
    register(Exercise(
        f"precision_for_{_name.lower()}", _notebooks,
        f"Which precision would you train in on an NVIDIA {_name}? (labkit.hardware.example_report('{_name}') "
        "describes it.)",
        "precision", (lambda n=_name: _precision_key(n)), accepts=lambda a, k: a in k,
        hints=_precision_hints(_name),
        why=f"labkit.hardware.advise() says {next(iter(_precision_key(_name) - {'fp8'}))} for the {_name}" + (
            "; its fp8 Tensor Cores also train the matmuls in fp8 (torchao.float8, Transformer Engine), the "
            "rest in bf16." if "fp8" in _precision_key(_name) else ".")))

# -- 06: the dtype of a gradient --------------------------------------------------------------------
_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _flax_grad_dtype() -> frozenset:
    """The dtype jax.grad gives the kernel of seed 000's layer: Flax nn.Dense(dtype=bfloat16, param_dtype=float32)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    layer = nn.Dense(2, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    x = jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)  # traced, not run: eval_shape gives the dtypes in milliseconds
    params = jax.eval_shape(lambda x: layer.init(jax.random.PRNGKey(0), x), x)
    grads = jax.eval_shape(jax.grad(lambda p, x: layer.apply(p, x).astype(jnp.float32).sum()), params, x)
    return frozenset({_DTYPE_NAMES[grads["params"]["kernel"].dtype.name]})


register(Exercise(
    "flax_grad_dtype", ("06",),
    "Seed 000's layer is nn.Dense(features, dtype=jnp.bfloat16, param_dtype=jnp.float32). In which dtype does "
    "jax.grad return the gradient of a float32 loss with respect to its kernel? ('float32' and 'bfloat16' work too.)",
    "precision", _flax_grad_dtype, accepts=lambda a, k: a in k,
    hints=(
        Hint(lambda a, k: a == "bf16" and a not in k,
             "That is the seed's claim. bfloat16 is the dtype of the backward *computation*; the backward pass of the "
             "layer's cast (astype(bfloat16)) casts the gradient back to the dtype of what was cast: the parameter."),
        Hint(lambda a, k: a.startswith("fp16"), "Nothing here is float16: the layer computes in bfloat16."),
    ),
    otherwise="Not a dtype that appears in this layer: it stores its kernel in one dtype and computes in another.",
    why="a gradient has its parameter's dtype: float32 here, so optax updates the float32 master weights directly."))

# -- 04 / 05: the order of an AMP step ---------------------------------------------------------------
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
    "amp_step_order", ("04", "05"),
    "Fix a broken AMP loop: give the order of one training step's calls as a list of strings, from "
    "'scaler.scale(loss).backward()', 'scaler.unscale_(opt)', 'clip', 'scaler.step(opt)', 'scaler.update()' "
    "(short names such as 'backward', 'unscale_', 'step', 'update' work too). Keras' LossScaleOptimizer "
    "runs the same steps inside apply().",
    "calls", lambda: AMP_ORDER, hints=_amp_hints(),
    otherwise="Not a working order: the gradients must be real (unscaled) when clipped, and applied before "
              "update() adjusts the scale.",
    why="backward on the scaled loss, unscale_ so clipping sees true gradients, clip, step (skipped on inf), "
        "update the scale."))

register(Exercise(
    "bf16_needs_grad_scaler", ("04",),
    "Under torch.autocast(dtype=torch.bfloat16), do you need a GradScaler to keep small gradients? "
    "Answer True or False.",
    "bool", lambda: bool(lf.get("bf16").smallest_normal > lf.get("fp32").smallest_normal),
    hints=(Hint(lambda a, k: a and not k,
                f"bf16 keeps fp32's 8-bit exponent: its smallest normal is the same, "
                f"{lf.get('bf16').smallest_normal:.3g}. Gradients that fit in fp32 fit in bf16 -- they lose "
                "mantissa bits, not range."),
           Hint(lambda a, k: not a and k, "This format's range is narrower than fp32's: it needs scaling.")),
    why="bf16 has fp32's range: GradScaler is for fp16 (torch's docs: bf16 needs no scaling)."))


def _keras_initial_scale() -> float:
    from labkit.scaling import KerasLossScale

    return float(KerasLossScale.create().loss_scale)


register(Exercise(
    "keras_lso_initial_scale", ("05",),
    "Under the mixed_float16 policy Model.compile() wraps the optimizer in a LossScaleOptimizer. At what loss "
    "scale does Keras 3's LossScaleOptimizer start? (labkit.scaling.KerasLossScale replays it.)",
    "number", _keras_initial_scale,
    hints=(
        Hint(lambda a, k: a == 2.0**16, "That is torch.amp.GradScaler's init_scale; Keras starts one power of two "
                                        "lower (keras/src/optimizers/loss_scale_optimizer.py, initial_scale)."),
        Hint(lambda a, k: a == 1.0, "A scale of 1 is no scaling at all: the LossScaleOptimizer starts high and "
                                    "halves on each overflow."),
        Hint(lambda a, k: a > 0 and math.isfinite(a) and math.frexp(a)[0] != 0.5,
             "Loss scales are powers of two: scaling and unscaling by them is exact."),
    ),
    otherwise="A power of two, but not Keras' default: read initial_scale in keras/src/optimizers/"
              "loss_scale_optimizer.py.",
    why="2^15, doubled after 2000 finite steps (dynamic_growth_steps), halved on inf/NaN."))


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


def _autocast_state_bytes() -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, "bf16", "adam")["total"])  # labkit's "bf16": autocast, fp32 weights


def _state_bytes(precision: str) -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, precision, "adam")["total"])


register(Exercise(
    "autocast_state_bytes", ("07",),
    "You train with bf16 autocast and Adam (PyTorch's torch.autocast, Keras' mixed_bfloat16 policy, Flax with "
    "param_dtype=float32). How many bytes per parameter do the model states take -- weights, gradients and "
    "Adam's m and v, activations left out? (labkit.memory.model_state_bytes counts them.)",
    "number", _autocast_state_bytes,
    hints=(
        Hint(lambda a, k: a == _state_bytes("bf16-pure"),
             "That halves everything: pure bf16, where weights, gradients and Adam's moments are all bf16. Under "
             "autocast the weights stay fp32, and so do their gradients and Adam's moments."),
        Hint(lambda a, k: a == k + 4,
             "That counts an fp32 master copy besides the weights, as seed 004's rows do. Under autocast the fp32 "
             "weights *are* the master copy: there is no other."),
        Hint(lambda a, k: a == k + 2,
             "That adds a 16-bit copy of the weights. Autocast makes those copies during the step (notebook 07 "
             "counts them beside the states); they are not kept as model state."),
        Hint(lambda a, k: a == k - 2,
             "A gradient takes its weight's dtype: the weights are fp32, so their gradients are fp32 too, not bf16."),
        Hint(lambda a, k: a == k - 4,
             "Count all four: the weight, its gradient, and Adam's two moments m and v."),
        Hint(lambda a, k: a == k + 8,
             "That is seed 004's fp32 total, which gives Adam twice the bytes its m and v take."),
    ),
    otherwise="Count four tensors per parameter -- weight, gradient, m, v -- each in the dtype autocast leaves it.",
    why="fp32 weights (4) + fp32 gradients (4) + Adam's m and v (8), as in fp32 training: autocast saves memory in "
        "the activations, not in the model states."))

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


def _collective_dtype(strategy: str, op: str, reduce_dtype: str | None) -> str:
    return next(c["dtype"] for c in _plan(2, strategy, "bf16", reduce_dtype)["collectives"] if c["op"] == op)


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
    "FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32): each rank stores its "
    "parameter shards in fp32. In which dtype does the all-gather before a layer's forward pass move the parameters? "
    "Answer 'fp32', 'bf16' or 'fp16'.",
    "precision", lambda: frozenset({_collective_dtype("fsdp", "all-gather", "fp32")}), accepts=lambda a, k: a in k,
    hints=(
        Hint(lambda a, k: a == "fp32",
             "The shards are stored in fp32, but FSDP2 casts each shard to param_dtype *before* it gathers "
             "(FSDPParam.all_gather_inputs): half the bytes. reduce_dtype is for the gradients."),
        Hint(lambda a, k: a.startswith("fp16") or a == "fp8", "No fp16 or fp8 appears in this policy."),
    ),
    why="FSDP2 casts each fp32 shard to param_dtype, then all-gathers it: bf16, 2 bytes per element (this "
        "notebook's JAX example gathers fp32 and casts after: twice the bytes)."))

register(Exercise(
    "fsdp2_default_reduce_dtype", ("08",),
    "Now MixedPrecisionPolicy(param_dtype=torch.bfloat16) with reduce_dtype left at its default, None. In which "
    "dtype are the gradients reduce-scattered? Answer 'fp32', 'bf16' or 'fp16'.",
    "precision", lambda: frozenset({_collective_dtype("fsdp", "reduce-scatter", None)}), accepts=lambda a, k: a in k,
    hints=(
        Hint(lambda a, k: a == "fp32",
             "None does not mean fp32: MixedPrecisionPolicy's docstring says the reduction then uses the compute "
             "dtype. Ask for reduce_dtype=torch.float32 to sum the gradients in fp32."),
        Hint(lambda a, k: a.startswith("fp16") or a == "fp8", "No fp16 or fp8 appears in this policy."),
    ),
    why="reduce_dtype=None reduces in the compute dtype, bf16 (foreach_reduce takes reduce_dtype or the gradient's "
        "dtype): 8 significant bits for the sum, unless you ask for fp32."))

__all__ = ["AMP_ORDER", "BLOCK_8BIT", "SCALE_BYTES", "mx_dequantize"]
