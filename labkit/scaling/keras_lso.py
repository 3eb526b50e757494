"""Keras' ``LossScaleOptimizer``: Keras 3 and the TF 2.x ``tf.keras`` (tf-keras) version.

Both start at 2**15, double after 2000 finite steps, halve and skip on inf/nan, and keep
the scale in a float32 variable. They differ in the two places that matter at the
extremes: tf-keras has a floor of 1 and refuses to grow into inf; Keras 3 has neither.

>>> k3 = KerasLossScale.create(initial_scale=2.0, dynamic_growth_steps=1)
>>> [(k3 := k3.adjust(False)).loss_scale for _ in range(3)]
[1.0, 0.5, 0.25]
>>> tk = TFKerasLossScale.create(initial_scale=2.0, dynamic_growth_steps=1)
>>> [(tk := tk.adjust(False)).loss_scale for _ in range(3)]
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit._validate import integer
from labkit.scaling import _numbers as num
from labkit.scaling.basic import Facts, _Scaler


@dataclass(frozen=True)
class KerasLossScale(_Scaler):
    """Keras 3 ``keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.**15,
    dynamic_growth_steps=2000)``.

    Source: keras-team/keras ``keras/src/optimizers/loss_scale_optimizer.py``
    (``build``, ``_stateful_handle_finite_grads``, ``_stateful_handle_non_finite_grads``)::

        # dynamic_scale: float32 variable, step_counter: int variable
        if all grads finite:
            inner_optimizer.apply(grads / dynamic_scale)
            if step_counter == dynamic_growth_steps - 1:
                step_counter = 0; dynamic_scale = dynamic_scale * 2.0
            else:
                step_counter += 1
        else:                                   # the update is skipped
            step_counter = 0; dynamic_scale = dynamic_scale * 0.5

    Where it differs: the counter is compared **before** the increment (``== steps - 1``),
    which grows on the same step as torch's ``successful == growth_interval``; there is
    **no floor** (the scale can fall below 1 and, in float32, to 0.0 -- after which the
    next finite step divides its gradients by 0 and applies NaN) and **no check** for
    growing into inf (after that, ``inf * 0.5`` stays inf: every step is skipped).
    The factor is fixed at 2. ``dynamic=False`` is no longer supported.
    """

    loss_scale: float = 2.0**15
    dynamic_growth_steps: int = 2000
    step_counter: int = 0

    STATE = ("loss_scale", "step_counter")
    TRACKED = ("step_counter",)
    COUNTER = "step_counter"
    FACTS = Facts("keras.optimizers.LossScaleOptimizer (Keras 3)",
                  "keras-team/keras keras/src/optimizers/loss_scale_optimizer.py", "initial_scale",
                  "dynamic_growth_steps", "float32 variable", "none (reaches 0.0)", "none (grows into inf)",
                  "skip; scale * 0.5")

    def __post_init__(self):
        _check_keras(self, "step_counter")

    @classmethod
    def create(cls, initial_scale=2.0**15, dynamic_growth_steps=2000):
        return cls(num.check_scale("initial_scale", initial_scale, float32=True), dynamic_growth_steps)

    def rule(self):
        f32, last = num.f32, self.dynamic_growth_steps - 1

        def step(finite, state):
            dynamic_scale, step_counter = state
            if not finite:
                return False, (f32(dynamic_scale * 0.5), 0)
            if step_counter == last:
                return True, (f32(dynamic_scale * 2.0), 0)
            return True, (dynamic_scale, step_counter + 1)
        return step


def _check_keras(state, counter: str) -> None:
    """Both Keras scalers: a float32 scale, growth steps >= 1, the counter below them."""
    state._set(loss_scale=num.check_scale("loss_scale", state.loss_scale, float32=True),
               dynamic_growth_steps=integer("dynamic_growth_steps", state.dynamic_growth_steps, minimum=1))
    state._set(**{counter: num.check_counter(counter, getattr(state, counter), state.dynamic_growth_steps,
                                             "dynamic_growth_steps")})


@dataclass(frozen=True)
class TFKerasLossScale(_Scaler):
    """TF 2.x ``tf.keras.mixed_precision.LossScaleOptimizer(inner, dynamic=True,
    initial_scale=2**15, dynamic_growth_steps=2000)`` (the tf-keras package, Keras 2).

    Source: keras-team/tf-keras ``tf_keras/mixed_precision/loss_scale_optimizer.py``
    (``_DynamicLossScaleState.update``; the optimizer builds it with ``multiplier=2``)::

        # current_loss_scale: float32 variable, counter ("good_steps"): int64 variable
        if all grads finite:                    # should_apply_gradients = is_finite
            if counter + 1 >= growth_steps:
                new = current_loss_scale * multiplier
                if isfinite(new): current_loss_scale = new   # _assign_if_finite
                counter = 0
            else:
                counter += 1
        else:
            counter = 0
            current_loss_scale = maximum(current_loss_scale / multiplier, 1)

    Where it differs: a **floor of 1**; growth into inf is **refused**; the counter test
    is ``counter + 1 >= growth_steps`` (same step as torch for steps >= 1).
    """

    loss_scale: float = 2.0**15
    dynamic_growth_steps: int = 2000
    counter: int = 0

    STATE = ("loss_scale", "counter")
    TRACKED = ("counter",)
    COUNTER = "counter"
    FACTS = Facts("tf.keras.mixed_precision.LossScaleOptimizer (TF 2.x, tf-keras)",
                  "keras-team/tf-keras tf_keras/mixed_precision/loss_scale_optimizer.py", "initial_scale",
                  "dynamic_growth_steps", "float32 variable", "1", "refuses to grow into inf",
                  "skip; max(scale / 2, 1)")

    def __post_init__(self):
        _check_keras(self, "counter")

    @classmethod
    def create(cls, initial_scale=2.0**15, dynamic_growth_steps=2000):
        return cls(num.check_scale("initial_scale", initial_scale, float32=True), dynamic_growth_steps)

    def rule(self):
        f32, isfinite, growth_steps = num.f32, math.isfinite, self.dynamic_growth_steps

        def step(finite, state):
            current_loss_scale, counter = state
            if not finite:
                return False, (max(f32(current_loss_scale / 2.0), 1.0), 0)
            if counter + 1 >= growth_steps:
                new = f32(current_loss_scale * 2.0)
                return True, (new if isfinite(new) else current_loss_scale, 0)
            return True, (current_loss_scale, counter + 1)
        return step


MAX_ZERO_STEPS = 2000  # from float32's max, 2**128 -> 2**-150 is 278 halvings: far fewer than this


def keras_scale_to_zero(initial_scale=2.0**15) -> dict:
    """Drive the **real** Keras 3 ``LossScaleOptimizer`` (SGD inside, lr 0.1) into its missing floor.

    One float32 weight of 1.0. Every step's gradient is inf (an fp16 overflow, injected), until
    the optimizer's ``dynamic_scale`` is 0.0: each step is skipped and the scale halved, in
    float32. With subnormals, 2**15 would take 165 halvings to reach 0 (2**-149 is float32's
    smallest subnormal, and half of it rounds to 0); TensorFlow flushes subnormals to zero around
    every kernel (``port::ScopedFlushDenormal`` in
    ``tensorflow/core/common_runtime/eager/kernel_and_device.cc``), so the real scale goes from
    2**-126, the smallest normal, straight to 0: 142 halvings from 2**15. Then one clean step, done as a training step does it: the loss ``w**2``
    scaled by ``scale_loss`` (times 0.0), its gradient from ``tf.GradientTape`` (0.0: finite, so
    the step is applied), unscaled by Keras as ``grad / dynamic_scale`` = 0 / 0 = NaN.
    (keras-team/keras ``keras/src/optimizers/loss_scale_optimizer.py``:
    ``_stateful_handle_non_finite_grads`` halves with no floor; ``_stateful_handle_finite_grads``
    divides by the scale.) `initial_scale`: a power of two that float32 holds. Keras and
    TensorFlow are imported here; the Keras backend must be TensorFlow.

    Returns ``{"scales": float32 scales before each overflowing step and after the last one,
    "halvings": overflowing steps until 0.0, "gradient": the clean step's scaled gradient,
    "weight_before", "weight_after": the weight around the clean step}``.
    """
    initial_scale = num.check_scale("initial_scale", initial_scale, float32=True)
    if math.frexp(initial_scale)[0] != 0.5:
        raise ValueError(f"initial_scale must be a power of two (the halvings are then exact), e.g. 2**15; "
                         f"got {initial_scale!r}")
    import numpy as np

    from labkit.train.tf.models import import_tensorflow  # quietly; Keras 3 on the TensorFlow backend

    tf, keras = import_tensorflow()

    w = keras.Variable(np.ones(1, np.float32), name="w")
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.1), initial_scale=initial_scale)
    opt.build([w])
    overflow = [tf.constant(np.full(1, np.inf, np.float32))]
    scales = [float(opt.dynamic_scale.numpy())]
    while scales[-1] != 0.0 and len(scales) <= MAX_ZERO_STEPS:
        opt.apply(overflow, [w])
        scales.append(float(opt.dynamic_scale.numpy()))
    before = float(w.numpy()[0])
    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(tf.reduce_sum(tf.square(w.value)))
    grad = tape.gradient(scaled, w.value)
    opt.apply([grad], [w])
    return {"scales": np.array(scales, np.float64), "halvings": len(scales) - 1, "gradient": float(grad.numpy()[0]),
            "weight_before": before, "weight_after": float(w.numpy()[0])}
