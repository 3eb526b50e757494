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

import numpy as np

# the shapes are plain values in labkit.memory (which counts bytes from them); the rooms read them from here
from labkit._validate import choice, integer, shown
from labkit.memory.shapes import (DEFAULT_WIDTH, MODELS, N_CLASSES, N_PIXELS, PIXEL_LEVELS, TransformerShape,
                                  param_shapes, transformer_shape)
from labkit.train.data import Dataset

LN_EPS = 1e-5


def _init_std(model: str, name: str, shape: tuple[int, ...]) -> float | None:
    """The standard deviation a weight starts from; None for a constant (a bias, a norm's scale)."""
    if name.endswith(("/bias", "/scale")):
        return None
    if model == "mlp":  # He init for the ReLU layers, LeCun for the output
        return math.sqrt((1 if name == "out/kernel" else 2) / shape[0])
    if name.endswith(("attn/out/kernel", "mlp/fc2/kernel")):  # the residual projections, GPT-2's scaling
        return 0.02 / math.sqrt(2 * TransformerShape().layers)
    return 0.02


def param_layout(model: str, width: int | None = None) -> list[tuple[str, tuple[int, ...], float | None]]:
    """Each parameter's (name, shape, init std) in a fixed order, without allocating any of it:
    `labkit.memory.shapes.param_shapes` with each weight's initial spread.

    std None means a constant: ones for a norm's scale, zeros for biases and a norm's bias.
    """
    return [(name, shape, _init_std(model, name, shape)) for name, shape in param_shapes(model, width)]


def init_params(model: str, seed: int = 0, width: int | None = None) -> dict[str, np.ndarray]:
    """Initial parameters as float32 numpy arrays, in a fixed order (`param_layout`'s)."""
    rng = np.random.default_rng(integer("seed", seed, minimum=0))
    params: dict[str, np.ndarray] = {}
    for name, shape, std in param_layout(model, width):
        if std is not None:
            params[name] = (rng.standard_normal(shape) * std).astype(np.float32)
        else:
            params[name] = (np.ones if name.endswith("/scale") else np.zeros)(shape, np.float32)
    return params


def _params(params) -> dict:
    """`params` as init_params returns it: a non-empty dict of name -> numpy array."""
    if not isinstance(params, dict) or not params or not all(isinstance(v, np.ndarray) for v in params.values()):
        raise TypeError(f"params must be a non-empty dict of name -> numpy array (init_params' result); "
                        f"got {type(params).__name__} {shown(params)}")
    return params


def count_params(params: dict[str, np.ndarray]) -> int:
    return int(sum(v.size for v in _params(params).values()))


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
    model = choice("model", model, MODELS)
    missing = [n for n, _ in param_shapes(model) if not n.startswith("block") and n not in _params(params)]
    if missing:
        raise ValueError(f"params lacks {', '.join(missing)}: give init_params({model!r}, ...)'s result")
    p = {k: v.astype(np.float64) for k, v in params.items()}
    try:
        x = np.asarray(x, np.float64)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"x must be an array of pixels in [0, 1], shape (batch, {N_PIXELS}); "
                        f"got {type(x).__name__} {shown(x)}") from None
    if x.ndim != 2 or x.shape[1] != N_PIXELS or not x.shape[0]:
        raise ValueError(f"x must have shape (batch, {N_PIXELS}) with batch >= 1; got shape {x.shape}")
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


__all__ = ["DEFAULT_WIDTH", "LN_EPS", "N_CLASSES", "N_PIXELS", "PIXEL_LEVELS", "TransformerShape", "count_params", "init_params", "param_layout",
           "reference_logits", "transformer_shape"]
