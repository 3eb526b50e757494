"""TensorFlow / Keras 3 runs: one custom training step, Keras' own loss scaling.

`labkit.train.run` imports this module for ``framework="tf"`` and drives `make_stepper`'s
`TFStepper` with the shared loop. One step, in the order Keras 3 requires::

    with tf.GradientTape() as tape:
        loss   = cross_entropy(y, model(x))          # float32 logits: the head is float32
        scaled = optimizer.scale_loss(loss)           # fp16 only: loss * dynamic_scale
    grads = tape.gradient(scaled, weights)           # still multiplied by the scale
    optimizer.apply(grads)                            # LossScaleOptimizer (fp16):
        # all finite?  yes: inner.apply(grads / scale) -> clip (global_clipnorm) -> Adam
        #              no:  skip the update, dynamic_scale *= 0.5, step_counter = 0
        # after 2000 finite steps in a row (dynamic_growth_steps): dynamic_scale *= 2

The inner optimizer clips the *unscaled* gradients with ``global_clipnorm`` (Keras has no
``gradient_transformers``; that name in seed 003 does not exist). A step was skipped when
the inner optimizer's ``iterations`` did not advance: Keras only counts applied updates.

Precisions: ``fp32`` turns TF32 off and ``tf32`` on (TF32 matters on NVIDIA Ampere and newer;
on a TPU, TF32 "on" means float32 matmuls in bfloat16 passes, "off" full float32); ``fp16``
uses the ``mixed_float16`` policy and ``keras.optimizers.LossScaleOptimizer`` (initial scale
``config.init_scale`` or Keras' 2**15); ``bf16`` uses ``mixed_bfloat16`` (no loss scaling:
bfloat16 has float32's range); ``bf16-pure`` the ``bfloat16`` policy: weights and Adam's
moments are bfloat16, with no float32 copy. Keras' Adam computes its bias correction in the
variable's dtype, where ``beta_2 = 0.999`` rounds to 1.0: its step size is then exactly 0, so
pure-bf16 Adam does not move the weights at all (SGD's small updates are rounded away). See
`labkit.train.tf.models` for the per-layer policies.

Global state: the Keras global policy is never changed (each layer gets ``dtype=``). TF32,
and on a CPU op determinism (so that a seeded run repeats exactly), are set around every
call into the stepper and restored on the way out. A step whose loss is not finite is not
applied: the shared loop stops there, and `TFStepper.nonfinite_layer` replays the forward
pass on the weights that overflowed to name the first layer whose output is inf/NaN.

Device ``"auto"`` takes a TPU (through ``TPUClusterResolver``, asked only when the
environment names a TPU, so a machine without one never waits on the network), else a
GPU, else the CPU (`labkit.train.tf.devices`). A strategy is an option of the one stepper:
on a TPU, or given ``strategy=`` (`labkit.train.tf.distributed` passes a
``MirroredStrategy``), the model and optimizer are built under ``strategy.scope()`` and
every step runs through ``strategy.run``::

    on every replica, its slice of the global batch:
        loss   = sum(cross_entropy(y_i, model(x_i))) / global_batch
        grads  = tape.gradient(optimizer.scale_loss(loss))        # fp16: times the loss scale
        grads  = ctx.all_reduce(SUM, cast(grads, reduce_dtype))    # THE gradient collective
        norm   = global_norm(grads / scale);  grads = clip(grads, clip_norm)   # unscaled
        optimizer.apply(grads)     # not summed again (`pre_reduced`); LSO: finite? apply : skip

Every replica then holds the same summed gradient, so clipping is global (as on one device)
and the loss scaler's skip is the same on every replica; `labkit.train.tf.distributed`
explains why Keras' own aggregation would do neither.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from labkit._validate import integer
from labkit.hardware.detect import TF_STARTUP_NOISE, quiet_native_logs
from labkit.memory.report import MemoryReport
from labkit.train import models as M
from labkit.train.config import RunConfig
from labkit.train.data import Dataset
from labkit.train.loop import StepOut
from labkit.train.tf import models as TM
from labkit.train.tf.devices import find_tpu, resolve_device
from labkit.train.tf.models import keras, tf

REDUCE_TF_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""RunConfig.reduce_dtype -> the TensorFlow dtype the gradient all-reduce moves."""


# -- framework state ---------------------------------------------------------------------
def _determinism():
    """(is_enabled, enable, disable) for op determinism; TF exports only `enable` publicly."""
    from tensorflow.python.framework import config as tf_config

    return (tf_config.is_op_determinism_enabled, tf.config.experimental.enable_op_determinism,
            tf_config.disable_op_determinism)


@contextlib.contextmanager
def framework_state(tf32: bool, deterministic: bool = True):
    """Set TF32 and op determinism for the block, then put back what was there before.

    >>> before = tf.config.experimental.tensor_float_32_execution_enabled()
    >>> with framework_state(tf32=not before):
    ...     tf.config.experimental.tensor_float_32_execution_enabled() == (not before)
    True
    >>> tf.config.experimental.tensor_float_32_execution_enabled() == before
    True
    """
    is_det, enable_det, disable_det = _determinism()
    old_tf32, old_det = tf.config.experimental.tensor_float_32_execution_enabled(), is_det()
    tf.config.experimental.enable_tensor_float_32_execution(tf32)
    if deterministic and not old_det:
        enable_det()
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(old_tf32)
        if deterministic and not old_det:
            disable_det()


# -- the stepper ---------------------------------------------------------------------------
def pre_reduced(cls):
    """`cls` (a Keras optimizer class) told that its gradients arrive already summed over replicas.

    Keras' TensorFlow optimizer sums the replicas' gradients in ``_all_reduce_sum_gradients``
    before updating each variable; a `TFStepper` with a strategy has summed them already (see
    the module docstring), so this returns them as they are and every replica updates its copy
    with the same gradient.
    """
    if not hasattr(cls, "_all_reduce_sum_gradients"):
        raise RuntimeError(f"this Keras ({keras.__version__}) has no {cls.__name__}._all_reduce_sum_gradients; "
                           "labkit's tf.distribute step needs updating")

    class PreReduced(cls):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            return list(grads_and_vars)

    PreReduced.__name__ = PreReduced.__qualname__ = f"PreReduced{cls.__name__}"
    return PreReduced


def _make_optimizer(config: RunConfig, replicated: bool):
    """Adam (epsilon 1e-8, as torch.optim.AdamW and optax.adam; Keras' own default is 1e-7) or
    SGD, in a LossScaleOptimizer for fp16. One device: Keras clips (``global_clipnorm``); with
    a strategy the step clips the summed gradient itself and Keras must not sum again."""
    cls = keras.optimizers.Adam if config.optimizer == "adam" else keras.optimizers.SGD
    kwargs = dict(learning_rate=config.lr, **(dict(epsilon=1e-8) if config.optimizer == "adam" else {}))
    if config.clip_norm and not replicated:
        kwargs["global_clipnorm"] = config.clip_norm
    inner = (pre_reduced(cls) if replicated else cls)(**kwargs)
    if config.precision != "fp16":
        return inner
    scale = 2.0**15 if config.init_scale is None else float(config.init_scale)
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale)


def _cross_entropy(y, logits):
    """Per-example softmax cross-entropy, computed in float32 whatever the logits' dtype."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=tf.cast(logits, tf.float32))


def _nbytes(variables) -> int:
    return int(sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables))


class TFStepper:
    """One Keras model, its optimizer and a compiled training step (see the module docstring).

    Attributes: ``device`` (a description), ``model`` (the keras.Model), ``optimizer``
    (a ``LossScaleOptimizer`` for fp16, else Adam/SGD), ``strategy`` (the
    ``tf.distribute.Strategy`` given, or found on a TPU, else None), ``replicas``,
    ``overflow_replica`` (the replica an injected overflow hits; None: all of them),
    ``reduce_dtype`` (what the gradient all-reduce moves) and ``local_overflow`` (per step,
    the replicas whose own gradient was not finite).
    """

    def __init__(self, config: RunConfig, *, jit_compile: bool = False, strategy=None,
                 overflow_replica: int | None = None):
        if not isinstance(jit_compile, bool):
            raise TypeError(f"jit_compile must be True or False, got {jit_compile!r}")
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
        self.config = config
        kind, self._tf_device, self.strategy, self.device = resolve_device(config, strategy)
        self.replicas = n = 1 if self.strategy is None else self.strategy.num_replicas_in_sync
        if overflow_replica is not None:
            overflow_replica = integer("overflow_replica", overflow_replica, minimum=0, maximum=n - 1)
        self.overflow_replica = overflow_replica
        if self.strategy is not None:
            if config.precision == "fp16" and kind == "tpu":
                raise ValueError(f"precision='fp16' on a TPU ({self.device}): TPUs have no float16 units; use 'bf16'")
            if config.batch_size % n:
                raise ValueError(f"batch_size={config.batch_size} must be a multiple of the {n} replicas "
                                 f"of {type(self.strategy).__name__}")
        self.kind, self.jit_compile = kind, jit_compile
        self._tf32 = config.precision != "fp32"
        # Op determinism on CPUs only: that is where seeded runs are promised to repeat exactly;
        # on a GPU it costs speed and some kernels (e.g. segment sums) have no deterministic form.
        devices = [self._tf_device] if self.strategy is None else list(self.strategy.extended.worker_devices)
        self._deterministic = all("CPU" in d.upper() for d in devices)
        self._last, self._gradient_bytes, self._args, self.local_overflow = None, None, None, []
        with self._state(), self._scope():
            self.model = TM.build(config.model, config.precision, config.width)
            TM.load_params(self.model, M.init_params(config.model, config.seed, config.width))
            self.optimizer = _make_optimizer(config, replicated=self.strategy is not None)
            self.optimizer.build(self.model.trainable_variables)
        self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self._inner = self.optimizer.inner_optimizer if self._loss_scaled else self.optimizer
        var_dtype = tf.as_dtype(self.model.trainable_variables[0].dtype).name
        self.reduce_dtype = REDUCE_TF_DTYPES[config.reduce_dtype] if config.reduce_dtype else var_dtype
        if self.strategy is None:
            self._step_fn = tf.function(self._single_step, jit_compile=jit_compile)
        else:  # TPUStrategy compiles with XLA anyway
            self._step_fn = tf.function(self._replicated_step)
        # Every stepper has a new model, so its step must be traced once; TensorFlow counts
        # traces per Python function and would warn after a few short runs in one process.
        # Its own restored functions switch that warning off with this attribute too.
        if hasattr(self._step_fn, "_omit_frequent_tracing_warning"):
            self._step_fn._omit_frequent_tracing_warning = True
        # Evaluation runs once per run: eagerly on one device, compiled for strategy.run.
        self._predict_fn = None if self.strategy is None else tf.function(lambda x: self.model(x, training=False))
        self._steps_done = 0
        if kind == "gpu":
            tf.config.experimental.reset_memory_stats("GPU:0")

    # -- context ---------------------------------------------------------------------------
    def _state(self):
        return framework_state(tf32=self._tf32, deterministic=self._deterministic)

    def _scope(self):
        if self.strategy is not None:
            return self.strategy.scope()
        return tf.device(self._tf_device)

    # -- one step ----------------------------------------------------------------------------
    def _gradients(self, x, y, inject, loss_divisor, replica=0):
        """(loss, gradients, this replica's gradients all finite), with an injected overflow."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            per_example = _cross_entropy(y, self.model(x, training=True))
            loss = tf.reduce_sum(per_example) / loss_divisor
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]  # Embedding: IndexedSlices
        self._gradient_bytes = _nbytes(grads)  # at tracing: the gradient tensors' shapes and dtypes
        # An injected overflow: one entry of the first kernel's gradient becomes inf (on one
        # replica, or on every one when overflow_replica is None).
        first = grads[0]
        if self.overflow_replica is not None:
            inject = tf.logical_and(inject, tf.equal(replica, self.overflow_replica))
        bump = tf.where(inject, tf.constant(math.inf, first.dtype), tf.zeros((), first.dtype))
        grads[0] = tf.tensor_scatter_nd_add(first, [[0] * len(first.shape)], [bump])
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        return loss, grads, finite

    def _scale(self):
        return tf.identity(self.optimizer.dynamic_scale) if self._loss_scaled else tf.ones((), tf.float32)

    def _apply_if_finite(self, loss, grads):
        """Apply the update unless the loss itself is inf/NaN: then the run ends, and the weights
        stay those that overflowed, for `nonfinite_layer` to replay."""
        def apply():
            self.optimizer.apply(grads, self.model.trainable_variables)
            return tf.constant(True)

        return tf.cond(tf.math.is_finite(loss), apply, lambda: tf.constant(False))

    def _single_step(self, x, y, inject):
        loss, grads, finite = self._gradients(x, y, inject, tf.cast(tf.shape(y)[0], tf.float32))
        scale = self._scale()
        norm = tf.linalg.global_norm([tf.cast(g, tf.float32) / scale for g in grads])
        before = tf.identity(self._inner.iterations)
        self._apply_if_finite(loss, grads)
        skipped = tf.equal(self._inner.iterations, before)  # Keras counts applied updates only
        return loss, norm, scale, skipped, tf.logical_not(finite)[None]

    def _replica_step(self, x, y, inject):
        """One replica's part: its slice of the batch, the gradient all-reduce, the global norm and
        clip on the unscaled sum, then Keras' apply (told not to sum again: `pre_reduced`)."""
        ctx = tf.distribute.get_replica_context()
        i, per = ctx.replica_id_in_sync_group, self.config.batch_size // self.replicas
        xs, ys = x[i * per:(i + 1) * per], y[i * per:(i + 1) * per]
        loss, grads, local_finite = self._gradients(xs, ys, inject, float(self.config.batch_size), replica=i)
        with tf.name_scope("labkit_grad_allreduce"):
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [tf.cast(g, self.reduce_dtype) for g in grads])
        grads = [tf.cast(s, g.dtype) for s, g in zip(summed, grads)]
        scale = self._scale()
        unscaled = [tf.cast(g, tf.float32) / scale for g in grads]
        norm = tf.linalg.global_norm(unscaled)
        if self.config.clip_norm:  # on the unscaled global gradient, then scaled back for the LSO
            clipped, _ = tf.clip_by_global_norm(unscaled, self.config.clip_norm, use_norm=norm)
            grads = [tf.cast(c * scale, g.dtype) for c, g in zip(clipped, grads)]
        # Unconditional: a tf.cond around apply() would hide Keras' cross-replica merge_call.
        self.optimizer.apply(grads, self.model.trainable_variables)
        with tf.name_scope("labkit_loss_allreduce"):
            loss = ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss)
        return loss, norm, scale, tf.logical_not(local_finite)

    def _replicated_step(self, x, y, inject):
        """One step over all replicas. Every replica holds the same summed gradients, so the loss
        scaler's finite check (and the skip) is the same on all of them."""
        before = tf.identity(self._inner.iterations)
        out = self.strategy.run(self._replica_step, args=(x, y, inject))
        loss, norm, scale = (self.strategy.experimental_local_results(t)[0] for t in out[:3])
        local_overflow = tf.stack(self.strategy.experimental_local_results(out[3]))
        return loss, norm, scale, tf.equal(self._inner.iterations, before), local_overflow

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        """One optimizer step on a numpy batch; returns when the device has finished."""
        xin = TM.model_inputs(self.config.model, x)
        self._last = (xin, np.asarray(y, np.int32))
        self._args = (tf.constant(xin), tf.constant(self._last[1]), tf.constant(bool(inject_overflow)))
        # The first call traces and compiles; TensorFlow's kernel notices go through the filter.
        quiet = quiet_native_logs(TF_STARTUP_NOISE, log_level=None) if self._steps_done == 0 else contextlib.nullcontext()
        with quiet, self._state(), self._scope():
            out = self._step_fn(*self._args)
            # .numpy() copies the results to the host, so the device has finished the step.
            loss, norm, scale, skipped, local = (t.numpy() for t in out)
        self._steps_done += 1
        self.local_overflow.append([int(r) for r in range(self.replicas) if local[r]])
        return StepOut(loss=float(loss), grad_norm=float(norm), scale=float(scale) if self._loss_scaled else None,
                       skipped=bool(skipped))

    def step_graph(self):
        """The graph TensorFlow runs for one step (as traced for the last batch), or None before
        a step: what `labkit.train.tf.distributed.collectives` reads the all-reduces from."""
        if self._args is None:
            return None
        with self._state(), self._scope():
            return self._step_fn.get_concrete_function(*self._args).graph

    # -- after the run -----------------------------------------------------------------------
    def logits(self, x: np.ndarray) -> np.ndarray:
        """The model's logits for a pixel batch, as float32 numpy."""
        xin = tf.constant(TM.model_inputs(self.config.model, x))
        with self._state(), self._scope():
            if self.strategy is None:
                out = self.model(xin, training=False)
            else:
                out = self.strategy.experimental_local_results(self.strategy.run(self._predict_fn, args=(xin,)))[0]
            return tf.cast(out, tf.float32).numpy()

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accuracy on (x, y)."""
        return float(np.mean(np.argmax(self.logits(x), -1) == np.asarray(y)))

    def params(self) -> dict[str, np.ndarray]:
        """The current weights under labkit's parameter names, as numpy (in their own dtype)."""
        return {k: np.asarray(v.numpy()) for k, v in TM.variable_map(self.model).items()}

    def nonfinite_layer(self) -> str | None:
        """The first weight, else the first layer output on the last batch, that holds inf/NaN."""
        for name, value in self.params().items():
            if not np.all(np.isfinite(value.astype(np.float32))):
                return f"{name} (weights)"
        if self._last is None:
            return None
        probe = keras.Model(self.model.inputs, [layer.output for layer in self.model.layers[1:]])
        with self._state(), self._scope():
            outputs = probe(tf.constant(self._last[0]), training=False)
        for layer, out in zip(self.model.layers[1:], outputs):
            if not np.all(np.isfinite(tf.cast(out, tf.float32).numpy())):
                return f"{layer.name} (output of layer, {layer.dtype_policy.name})"
        return None

    def memory(self) -> MemoryReport:
        """Byte counts read from the real variables, plus the device allocator's figures on a GPU.

        ``parameter_bytes``: the model's variables in their stored dtype (float32 master
        weights under a mixed policy, bfloat16 under ``bf16-pure``). ``gradient_bytes``: the
        gradient tensors of one step, from their traced shapes and dtypes (a gradient takes
        its variable's dtype, so float32 under a mixed policy). ``optimizer_state_bytes``:
        every optimizer variable (Adam's moments, step counters, the learning rate, and for
        fp16 the loss scale and its counter). On a GPU, ``peak_bytes`` / ``current_bytes``
        (``gpu_peak_bytes`` / ``gpu_current_bytes`` in the dict) come from TensorFlow's allocator. On a CPU TensorFlow reports no
        allocator statistics, so activations and workspace are not counted.
        """
        mem = {"parameter_bytes": _nbytes(self.model.weights),
               "optimizer_state_bytes": _nbytes(self.optimizer.variables),
               "gradient_bytes": self._gradient_bytes}  # known once a step has been traced
        if self.kind in ("gpu", "tpu"):
            with contextlib.suppress(Exception) if self.kind == "tpu" else contextlib.nullcontext():
                info = tf.config.experimental.get_memory_info(f"{self.kind.upper()}:0")  # not every TPU reports it
                mem.update(device=self.kind, peak_bytes=int(info["peak"]), current_bytes=int(info["current"]))
        return MemoryReport("tf", **mem)


def make_stepper(config: RunConfig, data: Dataset | None = None, *, jit_compile: bool = False,
                 strategy=None, overflow_replica: int | None = None) -> TFStepper:
    """The `Stepper` the shared loop drives (see `labkit.train.loop`).

    Raises ValueError before any work for a config this machine cannot run (a GPU or TPU
    that is not there, bf16 on a pre-Ampere GPU, fp16 on a TPU, a batch that does not split
    over the replicas). ``jit_compile=True`` compiles the step with XLA; ``strategy`` runs it
    through any ``tf.distribute.Strategy`` (a TPU is found and used automatically), and
    ``overflow_replica`` makes an injected overflow hit that replica only (None: every one).
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "tf":
        raise ValueError(f"this is the TensorFlow runner; config.framework is {config.framework!r}")
    return TFStepper(config, jit_compile=jit_compile, strategy=strategy, overflow_replica=overflow_replica)


__all__ = ["REDUCE_TF_DTYPES", "TFStepper", "find_tpu", "framework_state", "make_stepper", "pre_reduced"]
