"""The two course models as ``torch.nn.Module`` s, loaded from `labkit.train.models.init_params`.

The architecture is the one `labkit.train.models.reference_logits` defines in float64
numpy; each module here has the same parameters under PyTorch names:

=================================  =================================  ===================
``init_params`` name               PyTorch name                       value
=================================  =================================  ===================
``dense1/kernel`` (fan_in, out)    ``dense1.weight`` (out, fan_in)    transposed
``dense1/bias``                    ``dense1.bias``                    as is
``block0/ln1/scale``               ``blocks.0.ln1.weight``            as is
``embed/embedding``                ``embed.weight``                   as is
=================================  =================================  ===================

Only standard layers are used (``nn.Linear``, ``nn.LayerNorm``, ``nn.Embedding``,
``nn.GELU``), so autocast treats them exactly as it treats any PyTorch model. Attention
is written out (``q @ k^T``, ``softmax``, ``@ v``) rather than calling
``scaled_dot_product_attention``, so that every op autocast sees is visible here and a
forward hook can name the layer where a value first overflows. The softmax runs in float32
and is cast back, in every precision: CUDA autocast does that by itself (softmax is on its
float32 list), CPU autocast does not (it runs softmax in bfloat16), and the JAX and Keras
models force it, so the three frameworks train the same model on any device.

>>> from labkit.train import models
>>> net = build("mlp", models.init_params("mlp", seed=0, width=32))
>>> [name for name, _ in net.named_parameters()][:2]
['dense1.weight', 'dense1.bias']
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
from torch import nn

from labkit.train.data import PIXEL_LEVELS
from labkit.train.models import LN_EPS, N_CLASSES, N_PIXELS, transformer_shape


class MLP(nn.Module):
    """64 pixels -> Linear(width) -> ReLU -> Linear(width) -> ReLU -> Linear(10)."""

    def __init__(self, width: int):
        super().__init__()
        self.dense1 = nn.Linear(N_PIXELS, width)
        self.act1 = nn.ReLU()
        self.dense2 = nn.Linear(width, width)
        self.act2 = nn.ReLU()
        self.out = nn.Linear(width, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act2(self.dense2(self.act1(self.dense1(x)))))


class Attention(nn.Module):
    """Multi-head softmax self-attention: one fused qkv projection, then an output projection."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        # float32 softmax, cast back: what CUDA autocast does by itself (softmax is on its
        # float32 list) and CPU autocast does not; JAX and Keras models do the same, so the
        # three frameworks compare like for like
        att = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.out(att.transpose(1, 2).reshape(b, t, d))


class MLPBlock(nn.Module):
    """Linear(4d) -> exact (erf) GELU -> Linear(d)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="none")
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: h + attn(LN1(h)), then h + mlp(LN2(h))."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = Attention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = MLPBlock(d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h))
        return h + self.mlp(self.ln2(h))


class Transformer(nn.Module):
    """The 8x8 digit as 64 pixel tokens: token + position embedding, pre-norm blocks,
    mean pooling, a final LayerNorm and a linear head. Takes integer tokens (batch, 64)."""

    def __init__(self, d_model: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(PIXEL_LEVELS, d_model)
        self.pos = nn.Embedding(N_PIXELS, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model, eps=LN_EPS)
        self.head = nn.Linear(d_model, N_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos.weight
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h.mean(dim=1)))


def torch_name(name: str) -> str:
    """The PyTorch parameter name of an `init_params` name.

    >>> torch_name("block1/attn/qkv/kernel")
    'blocks.1.attn.qkv.weight'
    """
    *path, leaf = re.sub(r"^block(\d+)/", r"blocks.\1/", name).split("/")
    leaf = {"kernel": "weight", "scale": "weight", "embedding": "weight"}.get(leaf, leaf)
    return ".".join([*path, leaf])


def build(model: str, params: dict[str, np.ndarray]) -> nn.Module:
    """An fp32 module of `model` ("mlp" | "transformer") on the CPU, holding exactly `params`.

    Kernels stored (fan_in, fan_out) are transposed into ``nn.Linear.weight``; every
    `init_params` entry must match one module parameter, shape for shape, and back.
    """
    if model not in ("mlp", "transformer"):
        raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")
    # built on the meta device: PyTorch's own random init would draw from (and move) the
    # learner's global RNG only to be overwritten; to_empty() then allocates real memory
    with torch.device("meta"):
        if model == "mlp":
            net = MLP(params["dense1/kernel"].shape[1])
        else:
            s = transformer_shape(params["embed/embedding"].shape[1])
            net = Transformer(s.d_model, s.heads, sum(1 for k in params if k.endswith("/ln1/scale")))
    net = net.to_empty(device="cpu")
    own = dict(net.named_parameters())
    wanted = {torch_name(k): k for k in params}
    if set(own) != set(wanted):
        raise ValueError(f"parameters do not match the {model} module: "
                         f"missing {sorted(set(own) - set(wanted))}, unexpected {sorted(set(wanted) - set(own))}")
    with torch.no_grad():
        for name, p in own.items():
            value = params[wanted[name]]
            if wanted[name].endswith("/kernel"):
                value = value.T
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"{wanted[name]} has shape {value.shape}, {name} needs {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))
    return net


def module_params(net: nn.Module) -> dict[str, np.ndarray]:
    """The inverse of `build`: `net`'s weights under `init_params` names, as stored (float32
    numpy arrays; bf16 and fp16 values are exact in float32), kernels back in (fan_in, fan_out).

    A wrapped module (DDP's ``module.`` prefix) reads as the module itself.

    >>> from labkit.train import models
    >>> params = models.init_params("mlp", seed=0, width=32)
    >>> back = module_params(build("mlp", params))
    >>> list(back) == list(params), all((back[k] == params[k].astype(np.float32)).all() for k in params)
    (True, True)
    """
    if not isinstance(net, nn.Module):
        raise TypeError(f"module_params takes a torch.nn.Module, got {type(net).__name__}")
    out = {}
    for name, p in getattr(net, "module", net).named_parameters():
        value = p.detach()
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        value = value.float().cpu().numpy()
        key = init_name(name, value.ndim)
        out[key] = value.T.copy() if key.endswith("/kernel") else value
    return out


def init_name(name: str, ndim: int) -> str:
    """The `init_params` name of a PyTorch parameter name (`torch_name` backwards; `ndim` tells a
    Linear's 2-d weight, a kernel, from a LayerNorm's 1-d scale).

    >>> init_name("blocks.1.attn.qkv.weight", 2), init_name("blocks.0.ln1.weight", 1), init_name("embed.weight", 2)
    ('block1/attn/qkv/kernel', 'block0/ln1/scale', 'embed/embedding')
    """
    *path, leaf = re.sub(r"^blocks\.(\d+)\.", r"block\1.", name).split(".")
    if leaf == "weight":
        leaf = "embedding" if path[-1:] in (["embed"], ["pos"]) else "kernel" if ndim == 2 else "scale"
    return "/".join([*path, leaf])
