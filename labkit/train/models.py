"""The two models, defined once: parameter names, shapes, initial values and the forward pass.

Each framework builds its own layers (``nn.Linear``, ``flax.linen.Dense``,
``keras.layers.Dense`` ...) and loads the *same* initial arrays from `init_params`, so a
seeded run starts from identical weights in torch, JAX and TensorFlow. `reference_logits`
is the forward pass in float64 numpy; every framework's fp32 forward is tested against it.

Kernels are stored (fan_in, fan_out), as JAX and Keras hold them; PyTorch's
``nn.Linear.weight`` is the transpose.

mlp -- 64 pixels -> Dense(width) -> ReLU -> Dense(width) -> ReLU -> Dense(10)

transformer -- the 8x8 image read as 64 pixel tokens (intensity 0..16):
    h = embed[token] + pos                          (64, d)   the Embedding
    repeat `layers` times (pre-norm blocks):
        h = h + Out(attention(LN1(h)))              softmax(q k^T / sqrt(d_head)) v, `heads` heads
        h = h + FC2(gelu(FC1(LN2(h))))              exact (erf) GELU, hidden 4d
    logits = Head(LN_f(mean over tokens of h))
LayerNorm uses eps = 1e-5 and the biased variance, as torch.nn.LayerNorm does.

>>> p = init_params("mlp", seed=0, width=32)
>>> [(k, v.shape) for k, v in p.items()][:2]
[('dense1/kernel', (64, 32)), ('dense1/bias', (32,))]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labkit.train.data import PIXEL_LEVELS, Dataset

N_CLASSES = 10
N_PIXELS = 64
LN_EPS = 1e-5


@dataclass(frozen=True)
class TransformerShape:
    d_model: int = 64
    heads: int = 4
    layers: int = 2

    @property
    def d_head(self) -> int:
        return self.d_model // self.heads


DEFAULT_WIDTH = {"mlp": 256, "transformer": 64}


def transformer_shape(width: int | None = None) -> TransformerShape:
    d = width or DEFAULT_WIDTH["transformer"]
    if d % 4:
        raise ValueError(f"transformer width must be a multiple of 4 (4 heads), got {d}")
    return TransformerShape(d_model=d)


def param_layout(model: str, width: int | None = None) -> list[tuple[str, tuple[int, ...], float | None]]:
    """Each parameter's (name, shape, init std) in a fixed order, without allocating any of it.

    std None means a constant: ones for a norm's scale, zeros for biases and a norm's bias.
    """
    layout: list[tuple[str, tuple[int, ...], float | None]] = []

    def dense(name, fan_in, fan_out, std):
        layout.extend([(f"{name}/kernel", (fan_in, fan_out), std), (f"{name}/bias", (fan_out,), None)])

    def norm(name, d):
        layout.extend([(f"{name}/scale", (d,), None), (f"{name}/bias", (d,), None)])

    if model == "mlp":
        w = width or DEFAULT_WIDTH["mlp"]
        dense("dense1", N_PIXELS, w, math.sqrt(2 / N_PIXELS))  # He init for ReLU
        dense("dense2", w, w, math.sqrt(2 / w))
        dense("out", w, N_CLASSES, math.sqrt(1 / w))
    elif model == "transformer":
        s = transformer_shape(width)
        d = s.d_model
        layout.append(("embed/embedding", (PIXEL_LEVELS, d), 0.02))
        layout.append(("pos/embedding", (N_PIXELS, d), 0.02))
        for i in range(s.layers):
            b = f"block{i}"
            norm(f"{b}/ln1", d)
            dense(f"{b}/attn/qkv", d, 3 * d, 0.02)
            dense(f"{b}/attn/out", d, d, 0.02 / math.sqrt(2 * s.layers))
            norm(f"{b}/ln2", d)
            dense(f"{b}/mlp/fc1", d, 4 * d, 0.02)
            dense(f"{b}/mlp/fc2", 4 * d, d, 0.02 / math.sqrt(2 * s.layers))
        norm("ln_f", d)
        dense("head", d, N_CLASSES, 0.02)
    else:
        raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")
    return layout


def init_params(model: str, seed: int = 0, width: int | None = None) -> dict[str, np.ndarray]:
    """Initial parameters as float32 numpy arrays, in a fixed order (`param_layout`'s)."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape, std in param_layout(model, width):
        if std is not None:
            params[name] = (rng.standard_normal(shape) * std).astype(np.float32)
        else:
            params[name] = (np.ones if name.endswith("/scale") else np.zeros)(shape, np.float32)
    return params


def count_params(params: dict[str, np.ndarray]) -> int:
    return int(sum(v.size for v in params.values()))


# -- the reference forward pass (float64 numpy) ------------------------------------------
def _layer_norm(x, scale, bias):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * scale + bias


def _gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def reference_logits(model: str, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Logits of `model` for pixel inputs x in [0, 1], shape (batch, 64), in float64."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x = np.asarray(x, np.float64)
    if model == "mlp":
        h = np.maximum(x @ p["dense1/kernel"] + p["dense1/bias"], 0)
        h = np.maximum(h @ p["dense2/kernel"] + p["dense2/bias"], 0)
        return h @ p["out/kernel"] + p["out/bias"]
    if model != "transformer":
        raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")
    shape = transformer_shape(p["embed/embedding"].shape[1])
    heads, dh = shape.heads, shape.d_head
    h = p["embed/embedding"][Dataset.tokens(x)] + p["pos/embedding"]
    i = 0
    while f"block{i}/ln1/scale" in p:
        b = f"block{i}"
        a = _layer_norm(h, p[f"{b}/ln1/scale"], p[f"{b}/ln1/bias"])
        qkv = a @ p[f"{b}/attn/qkv/kernel"] + p[f"{b}/attn/qkv/bias"]
        q, k, v = (t.reshape(*t.shape[:-1], heads, dh).swapaxes(-2, -3) for t in np.split(qkv, 3, -1))
        s = q @ k.swapaxes(-1, -2) / math.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        att = (s / s.sum(-1, keepdims=True)) @ v
        att = att.swapaxes(-2, -3).reshape(*h.shape)
        h = h + att @ p[f"{b}/attn/out/kernel"] + p[f"{b}/attn/out/bias"]
        m = _layer_norm(h, p[f"{b}/ln2/scale"], p[f"{b}/ln2/bias"])
        m = _gelu(m @ p[f"{b}/mlp/fc1/kernel"] + p[f"{b}/mlp/fc1/bias"])
        h = h + m @ p[f"{b}/mlp/fc2/kernel"] + p[f"{b}/mlp/fc2/bias"]
        i += 1
    pooled = _layer_norm(h.mean(-2), p["ln_f/scale"], p["ln_f/bias"])
    return pooled @ p["head/kernel"] + p["head/bias"]
