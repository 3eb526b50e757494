"""The shapes of labkit's two models, as plain values: what the memory count needs, and nothing more.

`labkit.memory` counts bytes from these shapes without importing `labkit.train` (which
builds the models, and owns their initial values and forward pass). The names and
limits are the ones `labkit.train.RunConfig` accepts; a test checks that
`param_shapes` lists exactly what `labkit.train.models.param_layout` builds.

>>> [(name, shape) for name, shape in param_shapes("mlp", 32)][:2]
[('dense1/kernel', (64, 32)), ('dense1/bias', (32,))]
>>> transformer_shape().d_model, transformer_shape().heads, transformer_shape().layers
(64, 4, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit._validate import choice, integer

MODELS = ("mlp", "transformer")
N_CLASSES = 10
N_PIXELS = 64  # an 8x8 digit: the MLP's inputs, the transformer's tokens
PIXEL_LEVELS = 17  # pixel intensities 0..16: the transformer's token vocabulary
DEFAULT_WIDTH = {"mlp": 256, "transformer": 64}
MAX_BATCH_SIZE = 2**20  # far past any batch here; beyond it one batch's index array alone is gigabytes
MAX_WIDTH = 2**16  # an MLP this wide already holds 2**32 weights (17 GB in fp32)


@dataclass(frozen=True)
class TransformerShape:
    d_model: int = 64
    heads: int = 4
    layers: int = 2

    @property
    def d_head(self) -> int:
        return self.d_model // self.heads


def transformer_shape(width: int | None = None) -> TransformerShape:
    """The transformer's shape at `width` (its d_model, up to 2**16; None: 64)."""
    d = DEFAULT_WIDTH["transformer"] if width is None else integer("width", width, minimum=1, maximum=MAX_WIDTH)
    if d % 4:
        raise ValueError(f"transformer width must be a multiple of 4 (4 heads), got {d}")
    return TransformerShape(d_model=d)


def check_sizes(model: str, batch_size: int, width: int | None) -> tuple[str, int, int | None]:
    """A labkit model's name, batch size and width (None: the model's default), checked against
    RunConfig's limits (batch size up to 2**20, width up to 2**16); returned as given.

    >>> check_sizes("mlp", 8, None)
    ('mlp', 8, None)
    """
    model = choice("model", model, MODELS)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
    if width is not None:
        width = integer("width", width, minimum=1, maximum=MAX_WIDTH)
    return model, batch_size, width


def param_shapes(model: str, width: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """Each parameter's (name, shape), in the order `labkit.train.models.param_layout` builds them."""
    model, _, width = check_sizes(model, 1, width)
    out: list[tuple[str, tuple[int, ...]]] = []

    def dense(name, fan_in, fan_out):
        out.extend([(f"{name}/kernel", (fan_in, fan_out)), (f"{name}/bias", (fan_out,))])

    def norm(name, d):
        out.extend([(f"{name}/scale", (d,)), (f"{name}/bias", (d,))])

    if model == "mlp":
        w = width or DEFAULT_WIDTH["mlp"]
        dense("dense1", N_PIXELS, w)
        dense("dense2", w, w)
        dense("out", w, N_CLASSES)
        return out
    s = transformer_shape(width)
    d = s.d_model
    out += [("embed/embedding", (PIXEL_LEVELS, d)), ("pos/embedding", (N_PIXELS, d))]
    for i in range(s.layers):
        norm(f"block{i}/ln1", d)
        dense(f"block{i}/attn/qkv", d, 3 * d)
        dense(f"block{i}/attn/out", d, d)
        norm(f"block{i}/ln2", d)
        dense(f"block{i}/mlp/fc1", d, 4 * d)
        dense(f"block{i}/mlp/fc2", 4 * d, d)
    norm("ln_f", d)
    dense("head", d, N_CLASSES)
    return out


def param_count(model: str, width: int | None = None) -> int:
    """How many parameters the model has, from `param_shapes` (nothing allocated).

    >>> param_count("mlp", 32) == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    True
    """
    return sum(math.prod(shape) for _, shape in param_shapes(model, width))


__all__ = ["DEFAULT_WIDTH", "MAX_BATCH_SIZE", "MAX_WIDTH", "MODELS", "N_CLASSES", "N_PIXELS", "PIXEL_LEVELS",
           "TransformerShape", "check_sizes", "param_count", "param_shapes", "transformer_shape"]
