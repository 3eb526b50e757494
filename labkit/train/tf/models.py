"""The two labkit models built in Keras 3, with a dtype policy per layer.

Keras decides a layer's precision with its *dtype policy*: ``variable_dtype`` is what the
weights are stored in, ``compute_dtype`` what the layer computes in (its inputs and its
float32 variables are cast to it inside ``call``). The precisions of `RunConfig` map to
policies like this:

=============  =================  ================  ======================
precision      body layers        embeddings        output layer ("head")
=============  =================  ================  ======================
``fp32``       ``float32``        ``float32``       ``float32``
``tf32``       ``float32``        ``float32``       ``float32``
``fp16``       ``mixed_float16``  ``float32``       ``float32``
``bf16``       ``mixed_bfloat16`` ``float32``       ``float32``
``bf16-pure``  ``bfloat16``       ``bfloat16``      ``bfloat16``
=============  =================  ================  ======================

The output layer stays in float32 under a mixed policy, as the TensorFlow mixed precision
guide asks: its logits feed a softmax / cross-entropy, which is not safe in float16. The
embeddings follow seed 003's advice (``dtype=tf.float32`` on the Embedding); a lookup is
exact in any format, so this costs nothing. ``bf16-pure`` stores every variable in
bfloat16: there is no float32 master copy (what ``model.to(torch.bfloat16)`` does).

Each layer gets its policy through ``dtype=``; the global policy is never touched.
TensorFlow itself is imported by `import_tensorflow`, which hides its C++ start-up notices.
Every model is the architecture of `labkit.train.models` (same parameter names through
`variable_map`, same initial values through `load_params`), so its float32 forward pass
matches `models.reference_logits`.
"""

from __future__ import annotations

import math
import os

import numpy as np

from labkit.hardware.detect import TF_STARTUP_NOISE, quiet_native_logs, tensorflow_environment
from labkit.train import models as M
from labkit.train.data import Dataset

def import_tensorflow():
    """Import TensorFlow and Keras 3 quietly; returns (tf, keras).

    Sets ``TF_CPP_MIN_LOG_LEVEL=2`` (drop C++ INFO and WARNING logs) unless the user chose a
    level, and hides the few start-up notices that ignore it
    (`labkit.hardware.detect.TF_STARTUP_NOISE`; every other line still shows). With
    ``ONEDNN_MAX_CPU_ISA`` capped below the CPU's 16-bit instructions it turns TensorFlow's
    oneDNN kernels off first (`labkit.hardware.detect.tensorflow_environment`).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tensorflow_environment()  # a capped oneDNN would crash TensorFlow's bf16/fp16 kernels
    with quiet_native_logs(TF_STARTUP_NOISE, log_level=None):
        import tensorflow as tf
        import keras

        # The CUDA probe happens here, not at import. Listing physical devices does not start
        # the runtime: logical devices and memory growth can still be configured afterwards.
        tf.config.list_physical_devices()
    if not keras.__version__.startswith("3."):
        raise ImportError(f"labkit's TensorFlow runner needs Keras 3, found keras {keras.__version__}")
    if keras.backend.backend() != "tensorflow":
        raise ImportError(f"labkit's TensorFlow runner needs the tensorflow Keras backend; KERAS_BACKEND is "
                          f"{keras.backend.backend()!r}. Unset KERAS_BACKEND or set it to 'tensorflow'.")
    return tf, keras


tf, keras = import_tensorflow()
from keras import layers, ops  # noqa: E402

POLICIES = {
    "fp32": ("float32", "float32", "float32"),
    "tf32": ("float32", "float32", "float32"),
    "fp16": ("mixed_float16", "float32", "float32"),
    "bf16": ("mixed_bfloat16", "float32", "float32"),
    "bf16-pure": ("bfloat16", "bfloat16", "bfloat16"),
}
"""precision -> (body, embeddings, head) Keras dtype policy names."""


def policies(precision: str) -> dict[str, str]:
    """The Keras dtype policy names used for `precision`: {"body", "embed", "head"}.

    >>> policies("bf16")
    {'body': 'mixed_bfloat16', 'embed': 'float32', 'head': 'float32'}
    """
    if precision not in POLICIES:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(POLICIES)}")
    return dict(zip(("body", "embed", "head"), POLICIES[precision]))


def gelu_exact(x):
    """GELU with the exact erf form, ``x * Phi(x)`` (``approximate=False``), as the reference uses."""
    return keras.activations.gelu(x, approximate=False)


class PositionEmbedding(layers.Layer):
    """Adds a learned position vector to each of the 64 tokens: ``h + pos``."""

    def __init__(self, length: int, **kwargs):
        super().__init__(**kwargs)
        self.length = length

    def build(self, input_shape):
        self.embedding = self.add_weight(shape=(self.length, input_shape[-1]), initializer="zeros",
                                         name="embedding")

    def call(self, x):
        return x + self.embedding


class SelfAttention(layers.Layer):
    """Multi-head softmax self-attention with one fused ``qkv`` Dense and an ``out`` Dense.

    ``softmax(q k^T / sqrt(d_head)) v`` per head. The products run in the layer's compute
    dtype; the softmax itself runs in float32 and is cast back, as CUDA autocast does (not
    CPU autocast, which runs softmax in bfloat16; labkit's PyTorch and JAX models force float32
    too): a 16-bit softmax loses the small probabilities, see notebook 05.
    """

    def __init__(self, d_model: int, heads: int, **kwargs):
        super().__init__(**kwargs)
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.d_model, self.heads = d_model, heads
        self.qkv = layers.Dense(3 * d_model, dtype=self.dtype_policy, name="qkv")
        self.out = layers.Dense(d_model, dtype=self.dtype_policy, name="out")

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.out.build(input_shape)

    def call(self, x):
        t, dh = x.shape[1], self.d_model // self.heads
        q, k, v = ops.split(self.qkv(x), 3, axis=-1)
        q, k, v = (ops.transpose(ops.reshape(a, (-1, t, self.heads, dh)), (0, 2, 1, 3)) for a in (q, k, v))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / math.sqrt(dh)
        probs = ops.cast(ops.softmax(ops.cast(scores, "float32"), axis=-1), self.compute_dtype)
        att = ops.reshape(ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3)), (-1, t, self.d_model))
        return self.out(att)


def build(model: str, precision: str, width: int | None = None) -> keras.Model:
    """A Keras functional model for `model` ("mlp" | "transformer") in `precision`.

    The weights are Keras' own initial values; call `load_params` to load labkit's.
    The MLP takes pixels (batch, 64) float32; the transformer takes tokens (batch, 64) int32.
    """
    pol = policies(precision)
    body, embed, head = pol["body"], pol["embed"], pol["head"]
    if model == "mlp":
        w = width or M.DEFAULT_WIDTH["mlp"]
        x = inputs = keras.Input((M.N_PIXELS,), dtype="float32", name="pixels")
        x = layers.Dense(w, activation="relu", dtype=body, name="dense1")(x)
        x = layers.Dense(w, activation="relu", dtype=body, name="dense2")(x)
        logits = layers.Dense(M.N_CLASSES, dtype=head, name="out")(x)
        return keras.Model(inputs, logits, name=f"mlp_{precision}")
    if model != "transformer":
        raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")
    s = M.transformer_shape(width)
    d = s.d_model
    norm = dict(epsilon=M.LN_EPS, dtype=body)
    tokens = keras.Input((M.N_PIXELS,), dtype="int32", name="tokens")
    h = layers.Embedding(M.PIXEL_LEVELS, d, dtype=embed, name="embed")(tokens)
    h = PositionEmbedding(M.N_PIXELS, dtype=embed, name="pos")(h)
    for i in range(s.layers):
        a = layers.LayerNormalization(**norm, name=f"block{i}_ln1")(h)
        a = SelfAttention(d, s.heads, dtype=body, name=f"block{i}_attn")(a)
        h = layers.Add(dtype=body, name=f"block{i}_add1")([h, a])
        m = layers.LayerNormalization(**norm, name=f"block{i}_ln2")(h)
        m = layers.Dense(4 * d, activation=gelu_exact, dtype=body, name=f"block{i}_fc1")(m)
        m = layers.Dense(d, dtype=body, name=f"block{i}_fc2")(m)
        h = layers.Add(dtype=body, name=f"block{i}_add2")([h, m])
    pooled = layers.GlobalAveragePooling1D(dtype=body, name="pool")(h)
    pooled = layers.LayerNormalization(**norm, name="ln_f")(pooled)
    logits = layers.Dense(M.N_CLASSES, dtype=head, name="head")(pooled)
    return keras.Model(tokens, logits, name=f"transformer_{precision}")


def variable_map(model: keras.Model) -> dict[str, keras.Variable]:
    """labkit parameter name (as in `models.init_params`) -> the Keras variable holding it."""
    out: dict[str, keras.Variable] = {}

    def dense(name, layer):
        out[f"{name}/kernel"], out[f"{name}/bias"] = layer.kernel, layer.bias

    def norm(name, layer):
        out[f"{name}/scale"], out[f"{name}/bias"] = layer.gamma, layer.beta

    names = {layer.name: layer for layer in model.layers}
    if "dense1" in names:
        for n in ("dense1", "dense2", "out"):
            dense(n, names[n])
        return out
    out["embed/embedding"] = names["embed"].embeddings
    out["pos/embedding"] = names["pos"].embedding
    i = 0
    while f"block{i}_ln1" in names:
        b = f"block{i}"
        norm(f"{b}/ln1", names[f"{b}_ln1"])
        dense(f"{b}/attn/qkv", names[f"{b}_attn"].qkv)
        dense(f"{b}/attn/out", names[f"{b}_attn"].out)
        norm(f"{b}/ln2", names[f"{b}_ln2"])
        dense(f"{b}/mlp/fc1", names[f"{b}_fc1"])
        dense(f"{b}/mlp/fc2", names[f"{b}_fc2"])
        i += 1
    norm("ln_f", names["ln_f"])
    dense("head", names["head"])
    return out


def load_params(model: keras.Model, params: dict[str, np.ndarray]) -> None:
    """Assign labkit's initial arrays to the model's variables (cast to each variable's dtype)."""
    variables = variable_map(model)
    if set(variables) != set(params):
        missing, extra = sorted(set(variables) - set(params)), sorted(set(params) - set(variables))
        raise ValueError(f"parameter names differ: the model needs {missing[:4]} that the params lack, "
                         f"the params hold {extra[:4]} that the model has not (first 4 of each)")
    for name, var in variables.items():
        if tuple(var.shape) != params[name].shape:
            raise ValueError(f"{name}: model shape {tuple(var.shape)} != params shape {params[name].shape}")
        var.assign(params[name])


def model_inputs(model_name: str, x: np.ndarray) -> np.ndarray:
    """What the Keras model takes for pixel batch x: pixels (mlp) or int32 tokens (transformer)."""
    return Dataset.tokens(x) if model_name == "transformer" else np.asarray(x, np.float32)
