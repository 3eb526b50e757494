"""Seed 000's two examples, kept as the seed wrote them, with its comments corrected.

* `SimpleDense`: a Flax module with ``param_dtype``/``dtype`` (float32 master weights,
  bfloat16 compute);
* `predict`: manual casting without a library. A gradient taken w.r.t. float32 parameters is
  float32 (the seed said bfloat16).

>>> import jax, jax.numpy as jnp
>>> model = SimpleDense(features=5)
>>> params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 10), jnp.bfloat16))["params"]
>>> jax.tree_util.tree_map(lambda a: str(a.dtype), params)
{'dense_layer': {'bias': 'float32', 'kernel': 'float32'}}
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class SimpleDense(nn.Module):
    """Seed 000's module: float32 parameters (``param_dtype``), bfloat16 compute (``dtype``).

    ``nn.Dense(dtype=bfloat16)`` casts the input, the float32 kernel and the bias to bfloat16
    before the matmul, so the output is bfloat16 while the stored parameters stay float32.
    """

    features: int
    param_dtype: Any = jnp.float32  # master weights in float32
    dtype: Any = jnp.bfloat16  # computation in bfloat16

    @nn.compact
    def __call__(self, x):
        x = x.astype(self.dtype)  # the input is cast to the compute dtype
        y = nn.Dense(features=self.features, param_dtype=self.param_dtype, dtype=self.dtype,
                     name="dense_layer")(x)  # float32 kernel, bfloat16 matmul and result
        return nn.relu(y)  # still bfloat16


def predict(params_f32, inputs_bf16):
    """Seed 000's manual casting: a list of float32 (W, b) layers, computed in bfloat16.

    Gradients of a loss of this function w.r.t. ``params_f32`` are float32: the backward
    pass of ``astype(bfloat16)`` casts the cotangent back to the parameter's dtype.
    """
    activations = inputs_bf16
    for w_f32, b_f32 in params_f32:
        w_bf16 = w_f32.astype(jnp.bfloat16)  # cast the weights for the computation
        b_bf16 = b_f32.astype(jnp.bfloat16)
        outputs = jnp.dot(activations, w_bf16) + b_bf16  # bfloat16 matmul
        activations = jax.nn.relu(outputs)
    return activations  # bfloat16


__all__ = ["SimpleDense", "predict"]
