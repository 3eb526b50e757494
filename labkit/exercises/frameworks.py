"""Exercises of notebooks 05 and 06, mixed precision in Keras and in JAX: Keras' loss scale after overflows and
the dtype of its logits, the dtype of a Flax gradient, and jmp's loss scale after overflows.

The loss scales come from `labkit.scaling`'s replays (tested against Keras and jmp), the dtypes from Keras
and Flax themselves (imported only when the exercise is checked).

>>> from labkit.exercises import check
>>> print(check("flax_grad_dtype", "bf16").message)  # doctest: +ELLIPSIS
That is the seed's claim...
"""

from __future__ import annotations

import functools

from labkit.exercises._common import default, final_scale, is_pow2, log2
from labkit.exercises.core import DTYPE_ALIASES, Exercise, Hint, register


# -- 05: Keras' loss scale, and the dtype of its logits ---------------------------------------------
KERAS_OVERFLOWS = (3, 10)
"""The Keras exercise (05): that many overflowing batches, then that many clean ones."""


register(Exercise(
    "keras_scale_after_overflows", ("05",),
    f"Keras 3's LossScaleOptimizer at its defaults (what compile() adds under mixed_float16): the first "
    f"{KERAS_OVERFLOWS[0]} batches' gradients overflow, the next {KERAS_OVERFLOWS[1]} are finite. What is "
    "its dynamic_scale after them? (labkit.scaling.simulate('keras', ...) replays it.)",
    "number", lambda: final_scale("keras", *KERAS_OVERFLOWS),
    hints=(
        Hint(lambda a, k: not is_pow2(a), "The scale is a power of two: it only halves and doubles."),
        Hint(lambda a, k: a == default("keras", "initial_scale"),
             "Each overflowing batch halves the scale (and skips that batch's update): it does not stay at its "
             "start."),
        Hint(lambda a, k: a == 2 * k,
             "Either you started from torch's 2^16, or you doubled the scale after the finite batches. Keras "
             "starts at its initial_scale default, and grows only after dynamic_growth_steps (2000) finite steps "
             "in a row."),
        Hint(lambda a, k: a > default("keras", "initial_scale"),
             "Growth is one doubling per dynamic_growth_steps (2000) finite steps in a row, not one per batch."),
        Hint(lambda a, k: a < k and a > 0,
             "Halved too often: one halving per overflowing batch, and none for a finite one."),
        Hint(lambda a, k: a > k and a < default("keras", "initial_scale"),
             "Count the halvings: one per overflowing batch."),
    ),
    why=f"2^{log2(default('keras', 'initial_scale'))} halved {KERAS_OVERFLOWS[0]} times; {KERAS_OVERFLOWS[1]} "
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
    return DTYPE_ALIASES[keras.backend.standardize_dtype(model.outputs[0].dtype)]


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


# -- 06: the dtype of a gradient in Flax, and jmp's dynamic loss scale ------------------------------
def _flax_grad_dtype() -> str:
    """The dtype jax.grad gives the kernel of seed 000's layer: Flax nn.Dense(dtype=bfloat16, param_dtype=float32)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    layer = nn.Dense(2, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    x = jax.ShapeDtypeStruct((3, 4), jnp.bfloat16)  # traced, not run: eval_shape gives the dtypes in milliseconds
    params = jax.eval_shape(lambda x: layer.init(jax.random.PRNGKey(0), x), x)
    grads = jax.eval_shape(jax.grad(lambda p, x: layer.apply(p, x).astype(jnp.float32).sum()), params, x)
    return DTYPE_ALIASES[grads["params"]["kernel"].dtype.name]


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


JMP_STEPS = (3, 2000)
"""The jmp exercise (06): that many steps with non-finite gradients, then that many finite ones."""
JMP_LOSS_SCALE = 2.0**15
"""The jmp exercise's starting scale (labkit's jmp preset's default too)."""


register(Exercise(
    "jmp_scale_after_overflows", ("06",),
    f"loss_scale = jmp.DynamicLossScale(jnp.float32(2**{log2(JMP_LOSS_SCALE)}), period=2000, factor=2). The first {JMP_STEPS[0]} steps' "
    f"gradients are not finite, the next {JMP_STEPS[1]} are; after each step, loss_scale = "
    "loss_scale.adjust(jmp.all_finite(grads)). What is loss_scale.loss_scale after the last of them? "
    "(labkit.scaling.simulate('jmp', ...) replays it.)",
    "number", lambda: final_scale("jmp", *JMP_STEPS, loss_scale=JMP_LOSS_SCALE, period=2000, factor=2),
    hints=(
        Hint(lambda a, k: not is_pow2(a), "The scale is a power of two: adjust() only divides and multiplies "
                                                 "it by factor (2)."),
        Hint(lambda a, k: a == k / 2,
             f"{JMP_STEPS[1]} finite steps in a row are exactly one period: adjust() multiplies the scale by factor "
             "at the period-th finite step."),
        Hint(lambda a, k: a == 2 * k,
             "One factor of 2 too high: count a division for each non-finite step, and a doubling for each full "
             "period of finite steps in a row."),
        Hint(lambda a, k: a == JMP_LOSS_SCALE * 2,
             f"The growth starts from where the overflows left the scale, not from 2^{log2(JMP_LOSS_SCALE)}."),
        Hint(lambda a, k: a == JMP_LOSS_SCALE,
             "Each non-finite step divides the scale by factor (2) -- and the caller skips that update."),
        Hint(lambda a, k: a > JMP_LOSS_SCALE, "adjust() grows the scale once per period (2000) of finite steps, not once "
                                       "per step."),
        Hint(lambda a, k: a < k, "Count the divisions: one per non-finite step, and none for a finite one."),
    ),
    why=f"2^{log2(JMP_LOSS_SCALE)} halved {JMP_STEPS[0]} times, then doubled once when {JMP_STEPS[1]} finite steps complete a "
        "period. (min_loss_scale, 1 by default, is far below.)"))


__all__ = ["JMP_LOSS_SCALE", "JMP_STEPS", "KERAS_OVERFLOWS"]
