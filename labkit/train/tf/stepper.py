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
GPU, else the CPU. On a TPU the model and optimizer are built under
``TPUStrategy.scope()`` and every step runs through ``strategy.run``: each core takes its
slice of the batch, the gradients are summed across cores and clipped globally.
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np

from labkit.hardware import detect_cpu, tpu_from_environment
from labkit.train import models as M
from labkit.train.tf import models as TM
from labkit.train.config import RunConfig
from labkit.train.data import Dataset
from labkit.train.loop import StepOut
from labkit.train.tf.models import keras, tf



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


# -- devices -----------------------------------------------------------------------------
def find_tpu():
    """(a connected ``TPUClusterResolver``, "") or (None, why not); never raises.

    Asks TensorFlow only where the environment names a TPU, as `labkit.hardware` does: a
    Cloud TPU VM sets ``TPU_ACCELERATOR_TYPE`` (the TPU is local), the older Colab TPU
    runtime ``COLAB_TPU_ADDR``, TPU nodes and GKE ``TPU_NAME`` /
    ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS``. Elsewhere the resolver would look for Google's
    metadata server over the network, so it is not asked at all.
    """
    hint = tpu_from_environment(os.environ)
    if hint is None:
        return None, ("no TPU: the environment names none (TPU_ACCELERATOR_TYPE, COLAB_TPU_ADDR, "
                      "TPU_NAME, KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS are unset)")
    addr = os.environ.get("COLAB_TPU_ADDR")
    tpu = f"grpc://{addr}" if addr else "local" if os.environ.get("TPU_ACCELERATOR_TYPE") else None
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as exc:  # named but not reachable: report why, do not crash
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"no usable TPU ({hint.source}): {type(exc).__name__}: {first_line}"
    return resolver, ""


def _versions() -> str:
    return f"tensorflow {tf.__version__}, keras {keras.__version__}"


def _gpu_details(gpu) -> tuple[str, tuple[int, int] | None]:
    details = tf.config.experimental.get_device_details(gpu)
    return details.get("device_name", gpu.name), details.get("compute_capability")


def _resolve_device(config: RunConfig, strategy):
    """(kind, tf device string, strategy, description); ValueError if `config` cannot run here."""
    want = {"cuda": "gpu"}.get(config.device, config.device)
    if strategy is not None:
        kind = "tpu" if isinstance(strategy, tf.distribute.TPUStrategy) else "strategy"
        desc = f"{type(strategy).__name__} over {strategy.num_replicas_in_sync} replicas ({_versions()})"
        return kind, None, strategy, desc
    if want in ("auto", "tpu"):
        resolver, why = find_tpu()
        if resolver is not None:
            strategy = tf.distribute.TPUStrategy(resolver)
            return "tpu", None, strategy, f"tpu ({strategy.num_replicas_in_sync} cores via TPUStrategy, {_versions()})"
        if want == "tpu":
            raise ValueError(f"device='tpu' asked for, but {why}. Use device='auto' or 'cpu'.")
    gpus = tf.config.list_physical_devices("GPU")
    if want in ("auto", "gpu") and gpus:
        name, cc = _gpu_details(gpus[0])
        cc_text = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
        if config.precision in ("bf16", "bf16-pure") and cc is not None and tuple(cc) < (8, 0):
            raise ValueError(f"precision={config.precision!r} needs bfloat16 Tensor Cores (NVIDIA Ampere, compute "
                             f"capability 8.0, or newer); {name} has {cc_text}. Use 'fp16' (with loss scaling) "
                             "or 'fp32' here.")
        return "gpu", "/GPU:0", None, f"gpu ({name}, {cc_text}, {_versions()})"
    if want == "gpu":
        raise ValueError(f"device={config.device!r} asked for, but TensorFlow sees no GPU (tensorflow "
                         f"{tf.__version__}, built with CUDA: {tf.test.is_built_with_cuda()}). "
                         "Use device='auto' or 'cpu'.")
    return "cpu", "/CPU:0", None, f"cpu ({detect_cpu().model}, {_versions()})"


# -- the stepper ---------------------------------------------------------------------------
def _make_optimizer(config: RunConfig, clip_inside: bool):
    clip = dict(global_clipnorm=config.clip_norm) if (clip_inside and config.clip_norm) else {}
    if config.optimizer == "adam":
        # epsilon 1e-8 as torch.optim.AdamW and optax.adam use (Keras' own default is 1e-7).
        inner = keras.optimizers.Adam(learning_rate=config.lr, epsilon=1e-8, **clip)
    else:
        inner = keras.optimizers.SGD(learning_rate=config.lr, **clip)
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
    (a ``LossScaleOptimizer`` for fp16, else Adam/SGD), ``strategy`` (a
    ``tf.distribute.Strategy`` on a TPU, else None).
    """

    def __init__(self, config: RunConfig, *, jit_compile: bool = False, strategy=None):
        if not isinstance(jit_compile, bool):
            raise TypeError(f"jit_compile must be True or False, got {jit_compile!r}")
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
        self.config = config
        kind, self._tf_device, self.strategy, self.device = _resolve_device(config, strategy)
        if self.strategy is not None:
            n = self.strategy.num_replicas_in_sync
            if config.precision == "fp16":
                raise ValueError(f"precision='fp16' is not run through a tf.distribute strategy ({self.device}): "
                                 "TPUs have no float16 units, use 'bf16'; the fp16 path is single-device")
            if config.batch_size % n:
                raise ValueError(f"batch_size={config.batch_size} must be a multiple of the {n} replicas "
                                 f"of {type(self.strategy).__name__}")
        self.kind, self.jit_compile = kind, jit_compile
        self._tf32 = config.precision != "fp32"
        # Op determinism on CPUs only: that is where seeded runs are promised to repeat exactly;
        # on a GPU it costs speed and some kernels (e.g. segment sums) have no deterministic form.
        devices = [self._tf_device] if self.strategy is None else list(self.strategy.extended.worker_devices)
        self._deterministic = all("CPU" in d.upper() for d in devices)
        self._last, self._gradient_bytes = None, None
        with self._state(), self._scope():
            self.model = TM.build(config.model, config.precision, config.width)
            TM.load_params(self.model, M.init_params(config.model, config.seed, config.width))
            self.optimizer = _make_optimizer(config, clip_inside=self.strategy is None)
            self.optimizer.build(self.model.trainable_variables)
        self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self._inner = self.optimizer.inner_optimizer if self._loss_scaled else self.optimizer
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
    def _gradients(self, x, y, inject, loss_divisor):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            per_example = _cross_entropy(y, self.model(x, training=True))
            loss = tf.reduce_sum(per_example) / loss_divisor
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]  # Embedding: IndexedSlices
        self._gradient_bytes = _nbytes(grads)  # at tracing: the gradient tensors' shapes and dtypes
        # An injected overflow: one entry of the first kernel's gradient becomes inf.
        first = grads[0]
        bump = tf.where(inject, tf.constant(math.inf, first.dtype), tf.zeros((), first.dtype))
        grads[0] = tf.tensor_scatter_nd_add(first, [[0] * len(first.shape)], [bump])
        return loss, grads

    def _apply_if_finite(self, loss, grads):
        """Apply the update unless the loss itself is inf/NaN: then the run ends, and the weights
        stay those that overflowed, for `nonfinite_layer` to replay."""
        def apply():
            self.optimizer.apply(grads, self.model.trainable_variables)
            return tf.constant(True)

        return tf.cond(tf.math.is_finite(loss), apply, lambda: tf.constant(False))

    def _single_step(self, x, y, inject):
        loss, grads = self._gradients(x, y, inject, tf.cast(tf.shape(y)[0], tf.float32))
        scale = tf.identity(self.optimizer.dynamic_scale) if self._loss_scaled else tf.ones((), tf.float32)
        norm = tf.linalg.global_norm([tf.cast(g, tf.float32) / scale for g in grads])
        before = tf.identity(self._inner.iterations)
        self._apply_if_finite(loss, grads)
        skipped = tf.equal(self._inner.iterations, before)  # Keras counts applied updates only
        return loss, norm, scale, skipped

    def _replicated_step(self, x, y, inject):
        """One step over all replicas: each takes its slice of the batch, gradients are
        summed across replicas, clipped globally, and handed to Keras, which sums them again
        (hence the division by the replica count)."""
        strategy, n = self.strategy, self.strategy.num_replicas_in_sync
        per = self.config.batch_size // n

        def replica_fn(x, y, inject):
            ctx = tf.distribute.get_replica_context()
            i = ctx.replica_id_in_sync_group
            xs, ys = x[i * per:(i + 1) * per], y[i * per:(i + 1) * per]
            loss, grads = self._gradients(xs, ys, inject, float(self.config.batch_size))
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            norm = tf.linalg.global_norm([tf.cast(g, tf.float32) for g in grads])
            if self.config.clip_norm:
                grads, _ = tf.clip_by_global_norm(grads, self.config.clip_norm, use_norm=norm)
            # Unconditional: a tf.cond around apply() would hide Keras' cross-replica merge_call.
            self.optimizer.apply([g / n for g in grads], self.model.trainable_variables)
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss), norm

        loss, norm = (strategy.experimental_local_results(t)[0] for t in strategy.run(replica_fn, args=(x, y, inject)))
        return loss, norm, tf.ones((), tf.float32), tf.constant(False)

    def step(self, x: np.ndarray, y: np.ndarray, inject_overflow: bool = False) -> StepOut:
        """One optimizer step on a numpy batch; returns when the device has finished."""
        xin = TM.model_inputs(self.config.model, x)
        self._last = (xin, np.asarray(y, np.int32))
        # The first call traces and compiles; TensorFlow's kernel notices go through the filter.
        quiet = TM.quiet_native_stderr() if self._steps_done == 0 else contextlib.nullcontext()
        with quiet, self._state(), self._scope():
            out = self._step_fn(tf.constant(xin), tf.constant(self._last[1]), tf.constant(bool(inject_overflow)))
            # .numpy() copies the results to the host, so the device has finished the step.
            loss, norm, scale, skipped = (t.numpy() for t in out)
        self._steps_done += 1
        return StepOut(loss=float(loss), grad_norm=float(norm), scale=float(scale) if self._loss_scaled else None,
                       skipped=bool(skipped))

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

    def memory(self) -> dict:
        """Byte counts read from the real variables, plus the device allocator's figures on a GPU.

        ``parameter_bytes``: the model's variables in their stored dtype (float32 master
        weights under a mixed policy, bfloat16 under ``bf16-pure``). ``gradient_bytes``: the
        gradient tensors of one step, from their traced shapes and dtypes (a gradient takes
        its variable's dtype, so float32 under a mixed policy). ``optimizer_state_bytes``:
        every optimizer variable (Adam's moments, step counters, the learning rate, and for
        fp16 the loss scale and its counter). On a GPU, ``gpu_peak_bytes`` /
        ``gpu_current_bytes`` come from TensorFlow's allocator. On a CPU TensorFlow reports no
        allocator statistics, so activations and workspace are not counted.
        """
        mem = {"parameter_bytes": _nbytes(self.model.weights),
               "optimizer_state_bytes": _nbytes(self.optimizer.variables)}
        if self._gradient_bytes is not None:  # known once a step has been traced
            mem["gradient_bytes"] = self._gradient_bytes
        if self.kind == "gpu":
            info = tf.config.experimental.get_memory_info("GPU:0")
            mem["gpu_peak_bytes"], mem["gpu_current_bytes"] = int(info["peak"]), int(info["current"])
        elif self.kind == "tpu":
            with contextlib.suppress(Exception):  # not every TPU runtime reports it
                info = tf.config.experimental.get_memory_info("TPU:0")
                mem["tpu_peak_bytes"], mem["tpu_current_bytes"] = int(info["peak"]), int(info["current"])
        return mem


def make_stepper(config: RunConfig, data: Dataset | None = None, *, jit_compile: bool = False,
                 strategy=None) -> TFStepper:
    """The `Stepper` the shared loop drives (see `labkit.train.loop`).

    Raises ValueError before any work for a config this machine cannot run (a GPU or TPU
    that is not there, bf16 on a pre-Ampere GPU, fp16 on a TPU). ``jit_compile=True``
    compiles the step with XLA; ``strategy`` runs it through any ``tf.distribute.Strategy``
    (a TPU is found and used automatically).
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"make_stepper takes a RunConfig, got {type(config).__name__}")
    if config.framework != "tf":
        raise ValueError(f"this is the TensorFlow runner; config.framework is {config.framework!r}")
    return TFStepper(config, jit_compile=jit_compile, strategy=strategy)
