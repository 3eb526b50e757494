"""Teaching helpers for the TensorFlow / Keras notebook (05): seed 003's claims, checked.

* `global_policy`: set Keras' global dtype policy for a block and put the old one back
  (seed 003 sets it once for the whole process, which leaks into everything after).
* `dtypes_of`: per layer, the policy, the variable dtype, the compute dtype and the
  dtype of its output: what a policy really does to each layer (the same lesson as
  ``labkit.train.torch.dtypes_of`` and ``labkit.train.jax.dtypes_of``).
* `softmax_table`: one softmax in two dtypes, side by side (the TF guide's INCORRECT
  float16 softmax next to the CORRECT float32 one).
* `cross_entropies`: Keras' cross-entropy of those probabilities, with and without the
  logits a softmax layer attaches to its output.
* `gradient_underflow`: seed 003's "gradients cast to float32 for accumulation, to avoid
  underflow", run for real next to loss scaling and bfloat16 (compared with
  `labkit.train.gradient_error`, shown with `labkit.train.gradient_error_table`).
* `normalization_check`: whether Keras' normalization layers really compute their
  statistics in low precision under a mixed policy (they do not: float32 inside).
* `matmul_ms`: how long one large matmul takes in float32, bfloat16 and float16 here.
* `run_with_xla`: a labkit run with the training step compiled by XLA (``jit_compile=True``).
* `jit_settings`: what seed 003's ``tf.config.optimizer.set_jit(True)`` switches, and what
  ``compile()``'s default ``jit_compile="auto"`` resolves to here.

>>> with global_policy("mixed_bfloat16"):
...     keras.mixed_precision.global_policy().name
'mixed_bfloat16'
>>> keras.mixed_precision.global_policy().name
'float32'
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from labkit._validate import integer, number
from labkit.hardware.detect import TF_STARTUP_NOISE, quiet_native_logs
from labkit.table import Table
from labkit.train import data as D
from labkit.train.config import RunConfig
from labkit.train.lessons import GradientError, gradient_error
from labkit.train.loop import train
from labkit.train.result import RunResult
from labkit.train.tf import models as TM
from labkit.train.tf import stepper as TR
from labkit.train.tf.models import keras, tf


def _quiet():
    """TensorFlow's start-up notices dropped, every other line of descriptor 2 kept (the first
    float16 kernel on a CPU prints a oneDNN notice)."""
    return quiet_native_logs(TF_STARTUP_NOISE, log_level=None)


@contextlib.contextmanager
def global_policy(name: str):
    """Keras' global dtype policy is `name` inside the block, and what it was before after it.

    Layers created inside the block keep the policy they were built with.
    """
    if not isinstance(name, str):
        raise TypeError(f"policy name must be a str such as 'mixed_float16', got {type(name).__name__}")
    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield keras.mixed_precision.global_policy()
    finally:
        keras.mixed_precision.set_global_policy(old)


def _dtype_name(dtype) -> str:
    return "-" if dtype is None else tf.as_dtype(dtype).name


def dtypes_of(model) -> Table:
    """One row per layer of a built Keras model (input layers left out): its name, class,
    policy, variable dtype(s), compute dtype and the dtype of its output.

    >>> print(dtypes_of(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, dtype="mixed_bfloat16", name="d")])))
    name  class  policy          variables  compute   output
    ----  -----  --------------  ---------  --------  --------
    d     Dense  mixed_bfloat16  float32    bfloat16  bfloat16
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"dtypes_of takes a built keras.Model, got {type(model).__name__}")
    rows = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        out = layer.output
        out = out[0] if isinstance(out, (list, tuple)) else out
        variables = sorted({_dtype_name(v.dtype) for v in layer.weights}) or ["-"]
        rows.append((layer.name, type(layer).__name__, layer.dtype_policy.name, ",".join(variables),
                     str(layer.compute_dtype), _dtype_name(out.dtype)))
    return Table(("name", "class", "policy", "variables", "compute", "output"), tuple(rows))


def softmax_probabilities(logits, dtypes=("mixed_float16", "float32")) -> dict[str, np.ndarray]:
    """One row of logits through a Keras softmax layer (``Activation("softmax", dtype=...)``,
    as the TF guide writes its output layer) in each dtype policy, and exactly (float64)."""
    z = np.asarray(logits, np.float64)
    if z.ndim != 1 or z.size < 2:
        raise ValueError(f"logits must be one row of at least 2 numbers, got shape {z.shape}")
    exact = np.exp(z - z.max())
    out = {"float64 (exact)": exact / exact.sum()}
    for policy in dtypes:
        layer = keras.layers.Activation("softmax", dtype=policy)
        with _quiet():
            out[policy] = np.asarray(tf.cast(layer(z[None].astype(np.float32)), tf.float64))[0]
    return out


def softmax_table(logits, dtypes=("mixed_float16", "float32")) -> Table:
    """`softmax_probabilities` as a table of p and log p per class, numbers right-aligned.

    A float16 softmax rounds the largest probability to 1.0 and flushes every probability
    at or below half float16's smallest subnormal (2**-25, about 2.98e-8) to exactly 0, whose
    log is -inf (between 2.98e-8 and 5.96e-8 it rounds up to the smallest subnormal).
    """
    cols = softmax_probabilities(logits, dtypes)
    columns = [f"{'logit':>8}"] + [h for name in cols for h in (f"{name + ' p':>22}", f"{'log p':>9}")]
    rows = []
    with np.errstate(divide="ignore"):
        for i, zi in enumerate(np.asarray(logits, np.float64)):
            rows.append((f"{zi:8.2f}", *(c for p in cols.values() for c in (f"{p[i]:22.6g}", f"{np.log(p[i]):9.3f}"))))
    return Table(tuple(columns), tuple(rows))


def cross_entropies(logits, label: int, dtypes=("mixed_float16", "float32")) -> dict[str, float]:
    """Keras' ``sparse_categorical_crossentropy`` of one softmax output, per dtype policy, two ways.

    Keras' TensorFlow softmax attaches its input to its output (``output._keras_logits``,
    keras/src/backend/tensorflow/nn.py, ``softmax``), and the cross-entropy, given such an
    output, computes from those logits instead (``_get_logits``): the right loss. Any other
    tensor of probabilities -- here the same one after ``tf.identity``, as after a cast, a
    saved model or one's own softmax -- is clipped to ``[epsilon, 1 - epsilon]``
    (``keras.config.epsilon()``, 1e-7) before its log: finite, and wrong for a probability
    below 1e-7, in float16 and float32 alike. The first entry is the exact loss (float64).
    """
    z = np.asarray(logits, np.float64)
    if z.ndim != 1 or z.size < 2:
        raise ValueError(f"logits must be one row of at least 2 numbers, got shape {z.shape}")
    label = integer("label", label, minimum=0, maximum=z.size - 1)
    exact = z - z.max()
    out = {"exact (float64)": float(np.log(np.exp(exact).sum()) - exact[label])}
    y = np.array([label])
    for policy in dtypes:
        layer = keras.layers.Activation("softmax", dtype=policy)
        with _quiet():
            p = layer(z[None].astype(np.float32))
            out[f"{policy}, the layer's output"] = float(keras.losses.sparse_categorical_crossentropy(y, p)[0])
            out[f"{policy}, the probabilities alone"] = float(
                keras.losses.sparse_categorical_crossentropy(y, tf.identity(p))[0])
    return out


def normalization_check(values=(256.0, 258.0, 260.0, 262.0), policy: str = "mixed_bfloat16") -> dict[str, np.ndarray]:
    """Normalise `values` (mean 0, variance 1) four ways and return each result:

    exactly (float64); step by step in the policy's compute dtype (what a layer that really
    computed in bfloat16 would get: the mean 259 is not a bfloat16 number); and with Keras'
    ``BatchNormalization`` (training mode) and ``LayerNormalization`` under `policy`. Keras 3
    casts these two layers' inputs up to float32 for the statistics, so they match the
    exact row rounded to the compute dtype, while their compute_dtype still says bfloat16.
    """
    import ml_dtypes

    v = np.asarray(values, np.float64)
    if v.ndim != 1 or v.size < 2:
        raise ValueError(f"values must be one row of at least 2 numbers, got shape {v.shape}")
    compute = keras.DTypePolicy(policy).compute_dtype
    low = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}[compute]
    eps = 1e-3  # BatchNormalization's default epsilon; LayerNormalization gets the same below
    x = v.astype(low)
    mean = low(x.sum(dtype=low) / low(v.size))
    d = (x - mean).astype(low)
    var = low((d * d).astype(low).sum(dtype=low) / low(v.size))
    stepwise = (d / low(np.sqrt(low(var + low(eps))))).astype(low)
    with _quiet():
        bn = keras.layers.BatchNormalization(epsilon=eps, dtype=policy)(v[:, None].astype(np.float32), training=True)
        ln = keras.layers.LayerNormalization(epsilon=eps, dtype=policy)(v[None].astype(np.float32))
    return {
        "float64 (exact)": (v - v.mean()) / np.sqrt(v.var() + eps),
        f"step by step in {compute}": stepwise.astype(np.float64),
        f"BatchNormalization ({policy})": np.asarray(tf.cast(bn, tf.float64)).ravel(),
        f"LayerNormalization ({policy})": np.asarray(tf.cast(ln, tf.float64)).ravel(),
    }


def matmul_ms(n: int = 1024, dtypes=("float32", "bfloat16", "float16"), repeats: int = 5,
              max_seconds: float | None = None) -> dict[str, float]:
    """Milliseconds of one (n, n) @ (n, n) matmul in each dtype on TensorFlow's default device,
    with TF32 off (so float32 means float32): `labkit.bench.matmul_ms` for TensorFlow alone.

    The plainest measure of whether the hardware has arithmetic for a format: on an x86 CPU
    without AVX512-FP16, float16 is converted to float32 and is no faster than float32.
    """
    from labkit import bench

    with TR.framework_state(tf32=False, deterministic=False):
        ms = bench.matmul_ms(n, ("tf",), dtypes, repeats=repeats, number=1, max_seconds=max_seconds)
    return {dtype: t for (_, dtype), t in ms.items()}


def run_with_xla(config: RunConfig) -> RunResult:
    """`labkit.train.run(config)` with the training step compiled by XLA (``jit_compile=True``)."""
    if not isinstance(config, RunConfig) or config.framework != "tf":
        raise ValueError("run_with_xla takes a RunConfig with framework='tf'")
    return train(config, functools.partial(TR.make_stepper, jit_compile=True))


def gradient_underflow(loss_weight: float = 1e-6, scale: float = 2.0**15, width: int = 64,
                       micro_batches: int = 4, batch_size: int = 8, seed: int = 0) -> dict[str, GradientError]:
    """Seed 003's "gradients computed in float16/bfloat16, then cast to float32 for
    accumulation, to avoid small gradients underflowing", run for real.

    labkit's MLP (`labkit.train.tf.models.build`, labkit's seeded weights) takes ``micro_batches`` batches
    of digits; each loss is multiplied by ``loss_weight`` (small gradients, as late in
    training), differentiated with ``tf.GradientTape``, cast to float32 and added into float32
    accumulators. Four ways:

    * ``float32``: the reference;
    * ``mixed_float16, cast to float32`` (the seed): the backward pass runs in float16, so an
      activation gradient below float16's range is 0 before any cast; the cast (Keras does it
      anyway: a float32 variable's gradient is float32) cannot bring it back;
    * ``mixed_float16, loss scaled``: the loss multiplied by ``scale`` with a real
      ``LossScaleOptimizer.scale_loss``, the gradients divided by it in float32, as its
      ``apply`` does (keras/src/optimizers/loss_scale_optimizer.py, ``ops.divide(g, scale)``);
    * ``mixed_bfloat16``: no scaling; bfloat16 has float32's exponent range.

    Each way is compared with float32's gradients by `labkit.train.gradient_error`; show them
    with ``labkit.train.gradient_error_table(results, names=["dense1/kernel", ...])``.
    """
    loss_weight = number("loss_weight", loss_weight, minimum=0, inclusive=False)
    scale = number("scale", scale, minimum=1)
    width = integer("width", width, minimum=1, maximum=4096)
    micro_batches = integer("micro_batches", micro_batches, minimum=1, maximum=64)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=256)
    seed = integer("seed", seed, minimum=0)
    from labkit.train import models as M

    data = D.load("digits", seed=seed)
    params = M.init_params("mlp", seed=seed, width=width)
    n = micro_batches * batch_size
    x, y = data.x_train[:n], data.y_train[:n]

    def grads(precision, scaled):
        model = TM.build("mlp", precision, width=width)
        TM.load_params(model, params)
        names = {id(v): k for k, v in TM.variable_map(model).items()}
        variables = model.trainable_variables
        lso = None
        if scaled:
            lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=scale)
            lso.build(variables)
        total = [tf.zeros(v.shape, tf.float32) for v in variables]  # float32 accumulators
        dtypes = set()
        with _quiet():
            for i in range(micro_batches):
                xb, yb = x[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size]
                with tf.GradientTape() as tape:
                    logits = model(xb, training=True)
                    loss = loss_weight * tf.reduce_mean(
                        keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True))
                    if lso is not None:
                        loss = lso.scale_loss(loss)
                g = tape.gradient(loss, variables)
                dtypes |= {tf.as_dtype(gi.dtype).name for gi in g}
                if lso is not None:
                    g = [keras.ops.divide(gi, lso.dynamic_scale) for gi in g]
                total = [t + tf.cast(gi, tf.float32) for t, gi in zip(total, g)]
        return {names[id(v)]: np.asarray(t, np.float64) for v, t in zip(variables, total)}, "/".join(sorted(dtypes))

    ways = {"float32": ("fp32", False),
            "mixed_float16, cast to float32": ("fp16", False),
            f"mixed_float16, loss scaled by {scale:g}": ("fp16", True),
            "mixed_bfloat16": ("bf16", False)}
    ref, _ = grads("fp32", False)
    out = {}
    for how, (precision, scaled) in ways.items():
        g, dtype = (ref, "float32") if how == "float32" else grads(precision, scaled)
        out[how] = gradient_error(g, ref, how=how, dtype=dtype)
    return out


def jit_settings() -> dict:
    """Seed 003's XLA switch and Keras 3's default, read from the libraries here.

    * ``set_jit(True)``: what ``tf.config.optimizer.get_jit()`` says after
      ``tf.config.optimizer.set_jit(True)`` ("autoclustering": for every ``tf.function`` of
      the process; ``True`` is a deprecated alias), put back afterwards;
    * ``compile() default``: ``model.jit_compile`` after ``compile()`` with ``jit_compile``
      left at its default, ``"auto"``, which keras/src/trainers/trainer.py
      (``_resolve_auto_jit_compile``) turns on for the TensorFlow backend only when a
      non-CPU device is present, no distribution strategy is in use, op determinism is off
      and every layer supports XLA;
    * ``accelerator``, ``strategy``, ``determinism``: the conditions, read here;
      ``expected``: the rule applied to them (a Dense model supports XLA).
    """
    from tensorflow.python.framework import config as tf_config

    before = tf.config.optimizer.get_jit()
    try:
        tf.config.optimizer.set_jit(True)
        after = tf.config.optimizer.get_jit()
    finally:
        tf.config.optimizer.set_jit(before or False)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    accelerator = any(d.device_type != "CPU" for d in tf.config.list_physical_devices())
    strategy = tf.distribute.has_strategy()
    determinism = bool(tf_config.is_op_determinism_enabled())
    return {"set_jit(True)": after, "restored": before, "compile() default": model.jit_compile,
            "accelerator": accelerator, "strategy": strategy, "determinism": determinism,
            "expected": accelerator and not strategy and not determinism}


__all__ = ["cross_entropies", "dtypes_of", "global_policy", "gradient_underflow", "jit_settings", "matmul_ms",
           "normalization_check", "run_with_xla", "softmax_probabilities", "softmax_table"]
