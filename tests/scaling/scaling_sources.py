"""Loss-scale update rules copied from libraries that do not install here.

Each class is the library's code, trimmed only of logging, distributed calls and the
tensor plumbing around the rule; the lines that decide the scale are unchanged.
Licences: DeepSpeed (Apache-2.0, parts (c) NVIDIA), Apex (BSD-3-Clause), tf-keras
(Apache-2.0).
"""

import importlib


class _LazyTF:
    """tensorflow, imported on first use (only the tf-keras rule needs it)."""

    def __getattr__(self, name):
        return getattr(importlib.import_module("tensorflow"), name)


tf = _LazyTF()


class DeepSpeedDynamicLossScaler:
    """DeepSpeed 0.19.8 deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.

    (0.19.8 has no defaults on these arguments; ``CreateLossScaler`` passes them all from
    ``DeepSpeedFP16Config.dynamic_loss_scale_args()``. The real class is checked against
    labkit in test_deepspeed_real.py wherever DeepSpeed is installed.)
    """

    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis,
                 raise_error_at_min_scale=True):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale

    def update_scale(self, overflow):
        if overflow:
            # self.cur_scale /= self.scale_factor
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if (self.cur_scale == self.min_scale) and self.raise_error_at_min_scale:
                    raise Exception(
                        "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
                else:
                    next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
                    self.cur_scale = next_scale
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift

            stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
            if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


class DeepSpeedFP16Optimizer:
    """DeepSpeed 0.19.8 deepspeed/runtime/fp16/fused_optimizer.py, FP16_Optimizer._update_scale
    (the same in unfused_optimizer.py), on the dynamic part of the LossScaleConfig that
    fp16/loss_scaler.py builds from ``dynamic_loss_args`` (scale_factor = 2.0)."""

    def __init__(self, dynamic_loss_args):
        self.dynamic_loss_scale = True
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.cur_scale = dynamic_loss_args["init_scale"]
        self.scale_window = dynamic_loss_args["scale_window"]
        self.min_loss_scale = dynamic_loss_args["min_scale"]

    def _update_scale(self, skip):
        if self.dynamic_loss_scale:
            if skip:
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_loss_scale)
                self.last_overflow_iter = self.cur_iter
            else:
                # Ensure self.loss_scale_config.scale_window updates since last overflow
                stable_interval = (self.cur_iter - self.last_overflow_iter) - 1
                if (stable_interval > 0) and (stable_interval % self.scale_window == 0):
                    self.cur_scale *= self.scale_factor
        self.cur_iter += 1
        return


class ApexLossScaler:
    """NVIDIA/apex apex/amp/scaler.py, LossScaler (dynamic; no fused kernel)."""

    def __init__(self, loss_scale, init_scale=2.**16, scale_factor=2., scale_window=2000, min_loss_scale=None,
                 max_loss_scale=2.**24):
        if loss_scale == "dynamic":
            self.dynamic = True
            self._loss_scale = min(max_loss_scale, init_scale)
        else:
            self.dynamic = False
            self._loss_scale = loss_scale
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False

    def loss_scale(self):
        return self._loss_scale

    def update_scale(self):
        if self._has_overflow and self.dynamic:
            should_skip = True
            if(self._min_loss_scale):
                self._loss_scale = max(self._min_loss_scale, self._loss_scale/2.)
            else:
                self._loss_scale = self._loss_scale/2.
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1

        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale*2.)
            self._unskipped = 0

        return should_skip


def _assign_if_finite(var, value):
    """Assigns a value to a variable if the value is finite."""
    return tf.cond(tf.math.is_finite(value), lambda: var.assign(value), tf.no_op)


class TFKerasDynamicLossScaleState:
    """keras-team/tf-keras tf_keras/mixed_precision/loss_scale_optimizer.py,
    _DynamicLossScaleState (eager mode, no distribution strategy)."""

    def __init__(self, initial_loss_scale, growth_steps, multiplier):
        self._initial_loss_scale = float(initial_loss_scale)
        self._growth_steps = int(growth_steps)
        self._multiplier = float(multiplier)
        self._current_loss_scale = tf.Variable(self._initial_loss_scale, dtype=tf.float32, trainable=False)
        self._counter = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def growth_steps(self):
        return self._growth_steps

    @property
    def multiplier(self):
        return self._multiplier

    @property
    def current_loss_scale(self):
        return self._current_loss_scale

    @property
    def counter(self):
        return self._counter

    def update(self, grads):
        grads = tf.nest.flatten(grads)
        is_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])

        def update_if_finite_grads():
            """Update assuming the gradients are finite."""

            def incr_loss_scale():
                new_loss_scale = self.current_loss_scale * self.multiplier
                return tf.group(
                    _assign_if_finite(self.current_loss_scale, new_loss_scale),
                    self.counter.assign(0),
                )

            return tf.cond(
                self.counter + 1 >= self.growth_steps,
                incr_loss_scale,
                lambda: self.counter.assign_add(1),
            )

        def update_if_not_finite_grads():
            """Update assuming the gradients are nonfinite."""

            new_loss_scale = tf.maximum(self.current_loss_scale / self.multiplier, 1)
            return tf.group(
                self.counter.assign(0),
                self.current_loss_scale.assign(new_loss_scale),
            )

        update_op = tf.cond(is_finite, update_if_finite_grads, update_if_not_finite_grads)
        should_apply_gradients = is_finite
        return update_op, should_apply_gradients
