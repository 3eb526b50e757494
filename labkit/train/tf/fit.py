"""Seed 003's Keras code run end to end through ``model.fit()``, and what its comments promise, checked.

* `fit_seed`: seed 003's section 2.1 model (``Dense(512, relu)``, ``Dense(10)``) and compile call
  (``Adam(1e-3)``, ``SparseCategoricalCrossentropy(from_logits=True)``, ``metrics=["accuracy"]``),
  as written, trained for a few epochs on labkit's digits under a global policy that is put back
  afterwards: what ``History`` says, which optimizer ``compile()`` chose, what dtype comes out, and
  the loss scale of the ``LossScaleOptimizer`` that ``compile()`` adds for ``mixed_float16``,
  read by `ScaleLog`, a Keras callback, after every batch;
* `ScaleLog`: that callback (``model.optimizer.dynamic_scale``, a float32 variable of Keras 3's
  ``LossScaleOptimizer``, keras/src/optimizers/loss_scale_optimizer.py, ``build``);
* `autoclustering`: seed 003's ``tf.config.optimizer.set_jit(True)`` executed around a real
  ``tf.function``, and the XLA ops it put into the graph that ran (none on a CPU);
* `bf16_fallback`: seed 003's comment "prefer BF16, fall back to FP16 where there is none", checked:
  a policy has no fallback.

>>> ScaleLog().batches
[]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from labkit._validate import choice, integer, number
from labkit.hardware.detect import TF_STARTUP_NOISE, quiet_native_logs
from labkit.train import data as D
from labkit.train.tf.models import keras, tf

SEED_COMMENT = "# 1. 创建并设置全局混合精度策略（优先BF16，无则回退FP16）"
"""Seed 003, section 2.1, the comment above ``Policy('mixed_bfloat16')``: "create and set the global
mixed-precision policy (prefer BF16; where there is none, fall back to FP16)"."""

XLA_OPS = ("_XlaCompile", "_XlaRun", "_XlaMerge", "XlaLaunch")
"""The ops TensorFlow's auto-clustering passes put in place of a cluster (tensorflow/compiler/jit/
build_xla_ops_pass.cc: ``_XlaCompile`` + ``_XlaRun``; ``XlaLaunch`` in older or lazy modes)."""


class ScaleLog(keras.callbacks.Callback):
    """A Keras callback that reads the loss scale while ``fit()`` runs.

    After each training batch it appends ``float(model.optimizer.dynamic_scale)``, the scale the
    *next* step will use, to `batches`, and after each epoch to `epochs`. Keras 3's
    ``LossScaleOptimizer`` keeps the scale in a variable named ``dynamic_scale`` (there is no
    ``loss_scale`` attribute any more: that was ``tf.keras``' ``LossScaleOptimizerV3``); an optimizer
    without one (``Adam`` under ``mixed_bfloat16``) leaves both lists empty.
    """

    def __init__(self):
        super().__init__()
        self.batches: list[float] = []
        self.epochs: list[float] = []

    def _scale(self):
        scale = getattr(self.model.optimizer, "dynamic_scale", None)
        return None if scale is None else float(scale)

    def on_train_batch_end(self, batch, logs=None):
        if (s := self._scale()) is not None:
            self.batches.append(s)

    def on_epoch_end(self, epoch, logs=None):
        if (s := self._scale()) is not None:
            self.epochs.append(s)


@dataclass(frozen=True)
class FitRun:
    """What one `fit_seed` run showed (losses are ``History.history["loss"]``, one per epoch)."""

    policy: str
    output_float32: bool
    optimizer: str  # class of model.optimizer after compile(): LossScaleOptimizer for mixed_float16 only
    inner_optimizer: str
    initial_scale: float | None  # the LossScaleOptimizer's, None without one
    growth_steps: int | None
    losses: tuple[float, ...]
    accuracy: tuple[float, ...]
    batch_scales: tuple[float, ...]  # ScaleLog.batches: the scale after each batch
    epoch_scales: tuple[float, ...]
    output_dtype: str  # the model's output (the logits)
    head_compute_dtype: str  # the last Dense layer's compute dtype
    loss_dtype: str  # the dtype the Keras loss computes in
    softmax_dtype: str  # a softmax of the test logits in their own dtype
    softmax_zeros: int  # probabilities that are exactly 0 there (log p = -inf)
    softmax_subnormal: int  # nonzero probabilities below that dtype's smallest normal (fewer significant bits)
    softmax_min: float  # the smallest probability there
    jit_compile: bool  # model.jit_compile after fit(): what compile()'s jit_compile resolved to
    policy_after: str  # the global policy once fit_seed returned


def fit_seed(policy: str = "mixed_bfloat16", output_float32: bool = False, epochs: int = 3, samples: int = 512,
             batch_size: int = 64, initial_scale: float | None = None, growth_steps: int | None = None,
             jit_compile="auto", seed: int = 0) -> FitRun:
    """Seed 003's section 2.1, as written, run through ``model.fit()``.

    The global policy is set to `policy` (seed 003: ``set_global_policy(Policy('mixed_bfloat16'))``),
    the seed's ``Sequential`` is built, compiled with its optimizer, loss and metric, and fitted
    for `epochs` on the first `samples` digits; the old global policy is put back afterwards,
    also when something fails. `output_float32` gives the last layer ``dtype="float32"`` (seed 003's
    section 2.2, the TF guide's advice): without it, under a mixed policy the logits come out in
    float16 or bfloat16. Keras' loss still computes in float32 (``Loss.__call__`` converts
    ``y_pred`` to the loss's dtype, ``keras.config.floatx()``; keras/src/losses/loss.py), so the
    training loss is safe; a softmax of those logits in their own dtype is what is at risk: the
    ``softmax_*`` fields count its exact zeros and subnormals on the test set (after a few epochs on the
    digits the logits are still small and there may be none; `labkit.train.tf.softmax_table` shows
    larger ones).

    ``compile()`` wraps the optimizer in a ``LossScaleOptimizer`` when the model's policy is
    ``mixed_float16`` (keras/src/trainers/trainer.py, ``auto_scale_loss``), with ``initial_scale``
    2**15 and ``dynamic_growth_steps`` 2000. `initial_scale` and `growth_steps`, when given, are set
    on that automatically wrapped optimizer before ``fit()`` builds it, so that a short run shows
    the scale move: halved on a step whose gradients overflow (the step is skipped), doubled after
    `growth_steps` clean steps. `jit_compile` goes to ``compile()``. Its default, ``"auto"``, is resolved
    there (keras/src/trainers/trainer.py, ``_resolve_auto_jit_compile``): on the TensorFlow backend XLA
    is on only where a non-CPU device is present, no ``tf.distribute`` strategy is in use, op determinism
    is off and every layer supports XLA (not on an Apple-silicon GPU); on the JAX backend the same
    layer rule applies, CPU or not; on the torch backend it is off; ``run_eagerly=True`` turns it off.
    `FitRun.jit_compile` is what it resolved to here. The weights come from
    ``keras.utils.set_random_seed(seed)``, which seeds Python's, numpy's and TensorFlow's generators.
    """
    policy = choice("policy", policy, ("float32", "mixed_float16", "mixed_bfloat16"))
    if not isinstance(output_float32, bool):
        raise TypeError(f"output_float32 must be True or False, got {type(output_float32).__name__}")
    epochs = integer("epochs", epochs, minimum=1, maximum=50)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=1024)
    seed = integer("seed", seed, minimum=0)
    data = D.load("digits", seed=seed)
    samples = integer("samples", samples, minimum=batch_size, maximum=len(data.x_train))
    if initial_scale is not None:
        initial_scale = number("initial_scale", initial_scale, minimum=1, maximum=2.0**64)
    if growth_steps is not None:
        growth_steps = integer("growth_steps", growth_steps, minimum=1)
    if not isinstance(jit_compile, (bool, str)):
        raise TypeError(f"jit_compile must be 'auto', True or False, got {type(jit_compile).__name__}")
    if isinstance(jit_compile, str):
        choice("jit_compile", jit_compile, ("auto",))
    x, y = data.x_train[:samples], data.y_train[:samples]
    old = keras.mixed_precision.global_policy()
    try:
        with quiet_native_logs(TF_STARTUP_NOISE, log_level=None):
            keras.utils.set_random_seed(seed)
            # seed 003, section 2.1, with tf.keras as it writes it (Keras 3 behind tf.keras)
            keras.mixed_precision.set_global_policy(keras.mixed_precision.Policy(policy))
            head = {"dtype": "float32"} if output_float32 else {}
            model = tf.keras.Sequential([
                tf.keras.layers.Dense(512, activation="relu"),
                tf.keras.layers.Dense(10, **head),
            ])
            model.compile(
                optimizer=tf.keras.optimizers.Adam(learning_rate=1e-3),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
                jit_compile=jit_compile,
            )
            opt = model.optimizer
            lso = isinstance(opt, keras.optimizers.LossScaleOptimizer)
            if lso and initial_scale is not None:
                opt.initial_scale = float(initial_scale)  # read by build(), which fit() calls
            if lso and growth_steps is not None:
                opt.dynamic_growth_steps = growth_steps  # read when the train step is traced
            log = ScaleLog()
            history = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, callbacks=[log], shuffle=False)
            logits = model(data.x_test, training=False)  # eager: no predict() function to trace
            probs = keras.ops.softmax(logits)
            jit = bool(model.jit_compile)
        p = np.asarray(tf.cast(probs, tf.float64))
        tiny = float(ml_dtypes.finfo(tf.as_dtype(probs.dtype).as_numpy_dtype).smallest_normal)
    finally:
        keras.mixed_precision.set_global_policy(old)
    return FitRun(
        policy=policy, output_float32=output_float32, optimizer=type(opt).__name__,
        inner_optimizer=type(opt.inner_optimizer).__name__ if lso else type(opt).__name__,
        initial_scale=float(opt.initial_scale) if lso else None,
        growth_steps=int(opt.dynamic_growth_steps) if lso else None,
        losses=tuple(float(v) for v in history.history["loss"]),
        accuracy=tuple(float(v) for v in history.history["accuracy"]),
        batch_scales=tuple(log.batches), epoch_scales=tuple(log.epochs),
        output_dtype=tf.as_dtype(logits.dtype).name, head_compute_dtype=str(model.layers[-1].compute_dtype),
        loss_dtype=str(model.loss.dtype), softmax_dtype=tf.as_dtype(probs.dtype).name,
        softmax_zeros=int(np.count_nonzero(p == 0.0)),
        softmax_subnormal=int(np.count_nonzero((p > 0.0) & (p < tiny))), softmax_min=float(p.min()),
        jit_compile=jit, policy_after=keras.mixed_precision.global_policy().name,
    )


@dataclass(frozen=True)
class Autoclustering:
    """What ``tf.config.optimizer.set_jit(jit)`` did to one ``tf.function`` here."""

    jit: bool | str  # the value passed to set_jit
    get_jit: str  # tf.config.optimizer.get_jit() while it was set: "autoclustering" or ""
    ops: tuple[str, ...]  # the op types of the graph that ran (its partition graphs), sorted
    xla_ops: tuple[str, ...]  # those of them that are XLA's (XLA_OPS)
    clustered: bool  # whether auto-clustering compiled part of the function with XLA
    devices: tuple[str, ...]  # the physical device types TensorFlow sees
    tf_xla_flags: str  # $TF_XLA_FLAGS (--tf_xla_cpu_global_jit lets auto-clustering work on a CPU)
    restored: str  # get_jit() afterwards


def autoclustering(jit: bool | str = True) -> Autoclustering:
    """Run ``tf.config.optimizer.set_jit(jit)`` (seed 003's "enable XLA"), trace and call a fresh
    ``tf.function`` (a matmul, a bias, a relu, a sum), and read the graph TensorFlow really ran
    (``RunMetadata.function_graphs[].partition_graphs``, after the graph optimisation passes).
    The old setting is put back afterwards.

    Auto-clustering (``set_jit(True)`` means ``"autoclustering"``; tensorflow/python/framework/config.py)
    replaces each cluster by ``_XlaCompile``/``_XlaRun`` ops. On a GPU it does so; on a CPU it does
    nothing unless the process started with ``TF_XLA_FLAGS=--tf_xla_cpu_global_jit``
    (tensorflow/compiler/jit/flags.cc): the seed's switch is silently inert there. To compile a
    function for certain, ``tf.function(jit_compile=True)`` or ``model.compile(jit_compile=True)``.
    """
    if not isinstance(jit, (bool, str)):
        raise TypeError(f"jit must be True, False, 'autoclustering' or '', got {type(jit).__name__}")
    if isinstance(jit, str):
        choice("jit", jit, ("autoclustering", ""))
    from tensorflow.python.eager import context

    before = tf.config.optimizer.get_jit()
    ctx = context.context()
    try:
        tf.config.optimizer.set_jit(jit)
        during = tf.config.optimizer.get_jit()

        @tf.function
        def step(a, b):
            return tf.reduce_sum(tf.nn.relu(tf.matmul(a, b) + 1.0)) * 2.0

        a = tf.ones((16, 16))
        ctx.enable_run_metadata()
        try:
            with quiet_native_logs(TF_STARTUP_NOISE, log_level=None):
                step(a, a)
            metadata = ctx.export_run_metadata()
        finally:
            ctx.disable_run_metadata()
    finally:
        tf.config.optimizer.set_jit(before or False)
    ops = sorted({n.op for f in metadata.function_graphs for g in f.partition_graphs for n in g.node})
    xla = tuple(op for op in ops if op in XLA_OPS)
    return Autoclustering(jit=jit, get_jit=str(during), ops=tuple(ops), xla_ops=xla, clustered=bool(xla),
                          devices=tuple(sorted({d.device_type for d in tf.config.list_physical_devices()})),
                          tf_xla_flags=os.environ.get("TF_XLA_FLAGS", ""), restored=str(tf.config.optimizer.get_jit()))


@dataclass(frozen=True)
class BF16Fallback:
    """Seed 003's "prefer BF16, fall back to FP16", checked on this machine."""

    seed_comment: str
    policy: str
    compute_dtype: str  # the policy's, after set_global_policy
    variable_dtype: str
    output_dtype: str  # what a Dense layer built under it really returned here
    devices: tuple[str, ...]
    cpu_bf16_instructions: tuple[str, ...]  # the CPU's bf16 instruction sets (none: TensorFlow converts)
    policy_after: str


def bf16_fallback(policy: str = "mixed_bfloat16") -> BF16Fallback:
    """Set `policy` globally, as seed 003 does, read its compute dtype and run a Dense layer under it.

    A Keras ``DTypePolicy`` is a name and two dtypes (keras/src/dtype_policies/dtype_policy.py): it
    never looks at the hardware, so ``mixed_bfloat16`` computes in bfloat16 everywhere -- natively
    where the device has bfloat16 arithmetic, converted to and from float32 by the kernels where it
    has not (an x86 CPU without AVX512-BF16/AMX) -- and it never becomes ``mixed_float16``. Choosing
    by hardware is the caller's job (`labkit.hardware.advise`). The old global policy is put back.
    """
    policy = choice("policy", policy, ("mixed_bfloat16", "mixed_float16", "bfloat16", "float16", "float32"))
    from labkit import hardware

    old = keras.mixed_precision.global_policy()
    try:
        keras.mixed_precision.set_global_policy(keras.mixed_precision.Policy(policy))
        current = keras.mixed_precision.global_policy()
        with quiet_native_logs(TF_STARTUP_NOISE, log_level=None):
            out = keras.layers.Dense(4)(np.ones((2, 8), np.float32))
    finally:
        keras.mixed_precision.set_global_policy(old)
    cpu = hardware.detect_cpu()
    return BF16Fallback(seed_comment=SEED_COMMENT, policy=current.name, compute_dtype=current.compute_dtype,
                        variable_dtype=current.variable_dtype, output_dtype=tf.as_dtype(out.dtype).name,
                        devices=tuple(sorted({d.device_type for d in tf.config.list_physical_devices()})),
                        cpu_bf16_instructions=tuple(cpu.bf16_instructions or ()),
                        policy_after=keras.mixed_precision.global_policy().name)


__all__ = ["Autoclustering", "BF16Fallback", "FitRun", "SEED_COMMENT", "ScaleLog", "XLA_OPS", "autoclustering",
           "bf16_fallback", "fit_seed"]
