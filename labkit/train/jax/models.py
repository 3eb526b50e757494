"""The two labkit models in Flax linen, each with a compute ``dtype`` and a ``param_dtype``.

Flax separates the two dtypes that mixed precision is about:

* ``param_dtype`` -- what the weights are *stored* in (the master copy, updated by optax);
* ``dtype`` -- what the layer *computes* in: ``nn.Dense(dtype=jnp.bfloat16)`` casts its
  input, kernel and bias to bfloat16 before the matmul, and returns bfloat16.

So ``param_dtype=float32, dtype=bfloat16`` is mixed precision with fp32 master weights, and
``param_dtype=bfloat16, dtype=bfloat16`` is pure bf16 (no fp32 copy). Three things stay in
float32 whatever ``dtype`` says, as seed 000 asks ("the variance in normalisation layers and
the final loss"):

* LayerNorm statistics: ``flax.linen.LayerNorm`` computes the mean and variance in at least
  float32 (``force_float32_reductions=True``: ``_compute_stats`` promotes ``x`` to float32)
  and only casts its *output* to ``dtype``. We also pass ``use_fast_variance=False``: Flax's
  default computes Var = E[x^2] - E[x]^2, which cancels badly when the mean is large; the
  reference model uses E[(x - mean)^2].
* the attention softmax (``_Attention``: scores are cast to float32 first);
* the loss (the runner casts the logits to float32 before the cross-entropy).

Submodules carry the names of `labkit.train.models.init_params` ("dense1", "block0/attn/qkv",
...), so the flat numpy parameters load by splitting their names on "/" (`to_flax`).

>>> import jax.numpy as jnp
>>> from labkit.train import models
>>> mlp = build("mlp", width=32, dtype=jnp.bfloat16)
>>> params = to_flax(models.init_params("mlp", seed=0, width=32), jnp.float32)
>>> logits = mlp.apply({"params": params}, jnp.zeros((2, 64), jnp.float32))
>>> logits.dtype, params["dense1"]["kernel"].dtype
(dtype(bfloat16), dtype('float32'))
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from labkit.train.data import PIXEL_LEVELS
from labkit.train.models import DEFAULT_WIDTH, LN_EPS, N_CLASSES, N_PIXELS, transformer_shape

Dtype = Any


class MLP(nn.Module):
    """64 pixels -> Dense(width) -> ReLU -> Dense(width) -> ReLU -> Dense(10), in ``dtype``."""

    width: int = DEFAULT_WIDTH["mlp"]
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = jnp.asarray(x, self.dtype)  # as seed 000 does: cast the input to the compute dtype
        for name in ("dense1", "dense2"):
            x = nn.relu(_dense(self.width, self, name)(x))
        return _dense(N_CLASSES, self, "out")(x)


def _dense(features, module, name):
    return nn.Dense(features, dtype=module.dtype, param_dtype=module.param_dtype, name=name)


def _layer_norm(module, name, h):
    # Statistics in float32 (Flax's default force_float32_reductions=True); output in dtype.
    norm = nn.LayerNorm(epsilon=LN_EPS, use_fast_variance=False, dtype=module.dtype,
                        param_dtype=module.param_dtype, name=name)
    with jax.numpy_dtype_promotion("standard"):  # Flax 0.12's _compute_stats: jnp.promote_types(bf16, f32)
        return norm(h)


class _Attention(nn.Module):
    """Softmax self-attention with one fused qkv projection; the softmax runs in float32."""

    heads: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, h):
        d = h.shape[-1]
        dh = d // self.heads
        qkv = _dense(3 * d, self, "qkv")(h)
        q, k, v = (t.reshape(*t.shape[:-1], self.heads, dh) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("...qhd,...khd->...hqk", q, k) / math.sqrt(dh)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(self.dtype)
        att = jnp.einsum("...hqk,...khd->...qhd", weights, v).reshape(h.shape)
        return _dense(d, self, "out")(att)


class _FeedForward(nn.Module):
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, h):
        d = h.shape[-1]
        m = nn.gelu(_dense(4 * d, self, "fc1")(h), approximate=False)  # exact (erf) GELU
        return _dense(d, self, "fc2")(m)


class _Block(nn.Module):
    heads: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, h):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        h = h + _Attention(self.heads, **kw, name="attn")(_layer_norm(self, "ln1", h))
        return h + _FeedForward(**kw, name="mlp")(_layer_norm(self, "ln2", h))


class Transformer(nn.Module):
    """The 8x8 digit as 64 pixel tokens: embeddings, pre-norm blocks, mean pooling, head."""

    width: int = DEFAULT_WIDTH["transformer"]
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        shape = transformer_shape(self.width)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        tokens = jnp.rint(jnp.asarray(x) * (PIXEL_LEVELS - 1)).astype(jnp.int32)
        h = nn.Embed(PIXEL_LEVELS, shape.d_model, **kw, name="embed")(tokens)
        h = h + nn.Embed(N_PIXELS, shape.d_model, **kw, name="pos")(jnp.arange(N_PIXELS, dtype=jnp.int32))
        for i in range(shape.layers):
            h = _Block(shape.heads, **kw, name=f"block{i}")(h)
        pooled = _layer_norm(self, "ln_f", h.mean(axis=-2))  # jnp.mean accumulates bf16 in float32
        return _dense(N_CLASSES, self, "head")(pooled)


def build(model: str, width: int | None = None, dtype: Dtype = jnp.float32,
          param_dtype: Dtype = jnp.float32) -> nn.Module:
    """The Flax module for `model` ("mlp" or "transformer")."""
    if model == "mlp":
        return MLP(width or DEFAULT_WIDTH["mlp"], dtype=dtype, param_dtype=param_dtype)
    if model == "transformer":
        return Transformer(transformer_shape(width).d_model, dtype=dtype, param_dtype=param_dtype)
    raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")


def to_flax(flat: dict[str, np.ndarray], param_dtype: Dtype = jnp.float32) -> dict:
    """`models.init_params` names ("block0/attn/qkv/kernel") -> a nested Flax param tree."""
    tree: dict = {}
    for name, value in flat.items():
        *path, leaf = name.split("/")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = jnp.asarray(value, dtype=param_dtype)
    return tree


def named_leaves(tree) -> list[tuple[str, Any]]:
    """(name, array) for every leaf of a Flax tree, names joined with "/" as in `models`."""
    return [("/".join(str(getattr(k, "key", k)) for k in path), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def named(tree) -> dict[str, np.ndarray]:
    """A Flax tree as numpy arrays under labkit's names (`named_leaves`), each in its own dtype.

    >>> named({"dense1": {"bias": jnp.zeros(2, jnp.bfloat16)}})
    {'dense1/bias': array([0, 0], dtype=dtype(bfloat16))}
    """
    return {name: np.asarray(leaf) for name, leaf in named_leaves(tree)}
