"""Teaching helpers for the TensorFlow / Keras notebook (05): seed 003's claims, checked.

* `global_policy`: set Keras' global dtype policy for a block and put the old one back
  (seed 003 sets it once for the whole process, which leaks into everything after).
* `layer_dtypes`: per layer, the policy, the variable dtype, the compute dtype and the
  dtype of its output: what a policy really does to each layer.
* `softmax_table`: one softmax in two dtypes, side by side (the TF guide's INCORRECT
  float16 softmax next to the CORRECT float32 one).
* `cross_entropies`: Keras' cross-entropy of those probabilities, with and without the
  logits a softmax layer attaches to its output.
* `gradient_underflow`: seed 003's "gradients cast to float32 for accumulation, to avoid
  underflow", run for real next to loss scaling and bfloat16.
* `normalization_check`: whether Keras' normalization layers really compute their
  statistics in low precision under a mixed policy (they do not: float32 inside).
* `moved_fraction`: how many weights a few real training steps changed (the stalled
  updates of pure bfloat16).
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
from dataclasses import dataclass

import numpy as np

from labkit._validate import integer, number

from labkit.train import data as D
from labkit.train.tf import stepper as tf_runner
from labkit.train.config import RunConfig
from labkit.train.loop import train
from labkit.train.result import RunResult
from labkit.train.tf.models import keras, quiet_native_stderr, tf


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


def layer_dtypes(model) -> list[dict]:
    """One row per layer (input layers left out): name, class, policy, variable dtype,
    compute dtype and the dtype of the layer's output, read from the built model."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"layer_dtypes takes a built keras.Model, got {type(model).__name__}")
    rows = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        out = layer.output
        out = out[0] if isinstance(out, (list, tuple)) else out
        rows.append({
            "layer": layer.name,
            "class": type(layer).__name__,
            "policy": layer.dtype_policy.name,
            "variables": sorted({_dtype_name(v.dtype) for v in layer.weights}) or ["-"],
            "compute": layer.compute_dtype,
            "output": _dtype_name(out.dtype),
        })
    return rows


def format_layer_dtypes(model) -> str:
    """`layer_dtypes` as a fixed-width text table."""
    rows = layer_dtypes(model)
    head = ("layer", "class", "policy", "variables", "compute", "output")
    cells = [[r["layer"], r["class"], r["policy"], ",".join(r["variables"]), r["compute"], r["output"]] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda c: "  ".join(f"{v:<{w}}" for v, w in zip(c, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])


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
        with quiet_native_stderr():  # the first float16 kernel on a CPU prints a oneDNN notice
            out[policy] = np.asarray(tf.cast(layer(z[None].astype(np.float32)), tf.float64))[0]
    return out


def softmax_table(logits, dtypes=("mixed_float16", "float32")) -> str:
    """`softmax_probabilities` as a table of p and log p per class.

    A float16 softmax rounds the largest probability to 1.0 and flushes every probability
    at or below half float16's smallest subnormal (2**-25, about 2.98e-8) to exactly 0, whose
    log is -inf (between 2.98e-8 and 5.96e-8 it rounds up to the smallest subnormal).
    """
    cols = softmax_probabilities(logits, dtypes)
    lines = [f"{'logit':>8}  " + "  ".join(f"{name + ' p':>22}  {'log p':>9}" for name in cols)]
    with np.errstate(divide="ignore"):
        for i, zi in enumerate(np.asarray(logits, np.float64)):
            lines.append(f"{zi:8.2f}  " + "  ".join(f"{p[i]:22.6g}  {np.log(p[i]):9.3f}" for p in cols.values()))
    return "\n".join(lines)


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
        with quiet_native_stderr():
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
    with quiet_native_stderr():
        bn = keras.layers.BatchNormalization(epsilon=eps, dtype=policy)(v[:, None].astype(np.float32), training=True)
        ln = keras.layers.LayerNormalization(epsilon=eps, dtype=policy)(v[None].astype(np.float32))
    return {
        "float64 (exact)": (v - v.mean()) / np.sqrt(v.var() + eps),
        f"step by step in {compute}": stepwise.astype(np.float64),
        f"BatchNormalization ({policy})": np.asarray(tf.cast(bn, tf.float64)).ravel(),
        f"LayerNormalization ({policy})": np.asarray(tf.cast(ln, tf.float64)).ravel(),
    }


def moved_fraction(config: RunConfig, steps: int = 3, names=None) -> dict[str, float]:
    """Run `steps` real training steps of `config` and return, per weight, the fraction of
    its entries that changed (1.0: all moved, 0.0: the update was rounded away)."""
    if not isinstance(config, RunConfig) or config.framework != "tf":
        raise ValueError("moved_fraction takes a RunConfig with framework='tf'")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    data = D.load(config.dataset, seed=config.seed)
    stepper = tf_runner.make_stepper(config, data)
    before = stepper.params()
    feed = D.batches(data, config.batch_size, seed=config.seed)
    for _ in range(steps):
        stepper.step(*next(feed), inject_overflow=False)
    after = stepper.params()
    keep = names or list(before)
    return {k: float(np.mean(after[k] != before[k])) for k in keep}


def matmul_ms(n: int = 1024, dtypes=("float32", "bfloat16", "float16"), repeats: int = 5,
              max_seconds: float | None = None) -> dict[str, float]:
    """Milliseconds of one (n, n) @ (n, n) matmul in each dtype on TensorFlow's default device,
    with TF32 off (so float32 means float32): `labkit.bench.matmul_ms` for TensorFlow alone.

    The plainest measure of whether the hardware has arithmetic for a format: on an x86 CPU
    without AVX512-FP16, float16 is converted to float32 and is no faster than float32.
    """
    from labkit import bench

    with tf_runner.framework_state(tf32=False, deterministic=False):
        ms = bench.matmul_ms(n, ("tf",), dtypes, repeats=repeats, number=1, max_seconds=max_seconds)
    return {dtype: t for (_, dtype), t in ms.items()}


def run_with_xla(config: RunConfig) -> RunResult:
    """`labkit.train.run(config)` with the training step compiled by XLA (``jit_compile=True``)."""
    if not isinstance(config, RunConfig) or config.framework != "tf":
        raise ValueError("run_with_xla takes a RunConfig with framework='tf'")
    return train(config, functools.partial(tf_runner.make_stepper, jit_compile=True))


@dataclass(frozen=True)
class GradientUnderflow:
    """One way of computing the weight gradients, against float32's.

    dtype: the gradients' dtype as the optimizer receives them; underflow: per weight, the
    fraction of its entries nonzero in float32's gradient that came out exactly 0; rel_error:
    ``||g - g_fp32|| / ||g_fp32||`` over all entries (1.0 when everything is lost).
    """

    how: str
    dtype: str
    underflow: dict
    rel_error: float


def gradient_underflow(loss_weight: float = 1e-6, scale: float = 2.0**15, width: int = 64,
                       micro_batches: int = 4, batch_size: int = 8, seed: int = 0) -> dict[str, GradientUnderflow]:
    """Seed 003's "gradients computed in float16/bfloat16, then cast to float32 for
    accumulation, to avoid small gradients underflowing", run for real.

    labkit's MLP (`tf_models.build`, labkit's seeded weights) takes ``micro_batches`` batches
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
    """
    loss_weight = number("loss_weight", loss_weight, minimum=0, inclusive=False)
    scale = number("scale", scale, minimum=1)
    width = integer("width", width, minimum=1, maximum=4096)
    micro_batches = integer("micro_batches", micro_batches, minimum=1, maximum=64)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=256)
    seed = integer("seed", seed, minimum=0)
    from labkit.train import models as M
    from labkit.train.tf import models as tf_models

    data = D.load("digits", seed=seed)
    params = M.init_params("mlp", seed=seed, width=width)
    n = micro_batches * batch_size
    x, y = data.x_train[:n], data.y_train[:n]

    def grads(precision, scaled):
        model = tf_models.build("mlp", precision, width=width)
        tf_models.load_params(model, params)
        names = {id(v): k for k, v in tf_models.variable_map(model).items()}
        variables = model.trainable_variables
        lso = None
        if scaled:
            lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=scale)
            lso.build(variables)
        total = [tf.zeros(v.shape, tf.float32) for v in variables]  # float32 accumulators
        dtypes = set()
        with quiet_native_stderr():
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
    r = np.concatenate([a.ravel() for a in ref.values()])
    out = {}
    for how, (precision, scaled) in ways.items():
        g, dtype = (ref, "float32") if how == "float32" else grads(precision, scaled)
        under = {k: float(np.mean(g[k][ref[k] != 0] == 0)) if np.any(ref[k] != 0) else 0.0 for k in ref}
        flat = np.concatenate([g[k].ravel() for k in ref])
        out[how] = GradientUnderflow(how, dtype, under, float(np.linalg.norm(flat - r) / np.linalg.norm(r)))
    return out


def format_gradient_underflow(results: dict[str, GradientUnderflow], names=("dense1/kernel", "dense2/kernel", "out/kernel")) -> str:
    """`gradient_underflow`'s results as a table: dtype, the fraction of each weight's
    gradient that flushed to zero, and the relative error against float32."""
    if not isinstance(results, dict) or not all(isinstance(v, GradientUnderflow) for v in results.values()):
        raise TypeError("format_gradient_underflow takes the dict gradient_underflow returns")
    head = ("gradients", "dtype", *(f"{k} zeros" for k in names), "error vs float32")
    cells = [(r.how, r.dtype, *(f"{r.underflow[k]:.1%}" for k in names), f"{r.rel_error:.1e}")
             for r in results.values()]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    line = lambda c: "  ".join(f"{v:<{w}}" for v, w in zip(c, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])


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
