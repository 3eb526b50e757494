"""Teaching helpers for the TensorFlow / Keras notebook (05): seed 003's claims, checked.

* `global_policy`: set Keras' global dtype policy for a block and put the old one back
  (seed 003 sets it once for the whole process, which leaks into everything after).
* `layer_dtypes`: per layer, the policy, the variable dtype, the compute dtype and the
  dtype of its output: what a policy really does to each layer.
* `softmax_table`: one softmax in two dtypes, side by side (the TF guide's INCORRECT
  float16 softmax next to the CORRECT float32 one).
* `normalization_check`: whether Keras' normalization layers really compute their
  statistics in low precision under a mixed policy (they do not: float32 inside).
* `moved_fraction`: how many weights a few real training steps changed (the stalled
  updates of pure bfloat16).
* `matmul_ms`: how long one large matmul takes in float32, bfloat16 and float16 here.
* `run_with_xla`: a labkit run with the training step compiled by XLA (``jit_compile=True``).

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

from labkit.train import data as D
from labkit.train import tf_runner
from labkit.train.config import RunConfig
from labkit.train.loop import train
from labkit.train.result import RunResult
from labkit.train.tf_models import keras, quiet_native_stderr, tf


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
    below float16's smallest subnormal (about 6e-8) to exactly 0, whose log is -inf.
    """
    cols = softmax_probabilities(logits, dtypes)
    lines = [f"{'logit':>8}  " + "  ".join(f"{name + ' p':>22}  {'log p':>9}" for name in cols)]
    with np.errstate(divide="ignore"):
        for i, zi in enumerate(np.asarray(logits, np.float64)):
            lines.append(f"{zi:8.2f}  " + "  ".join(f"{p[i]:22.6g}  {np.log(p[i]):9.3f}" for p in cols.values()))
    return "\n".join(lines)


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
