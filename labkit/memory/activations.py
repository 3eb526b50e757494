"""What a step keeps for its backward pass: activations and autocast's weight copies, from the shapes.

Counted from `labkit.memory.shapes` (plain values: no model is built, nothing allocated),
in labkit.train's precision names (`labkit.memory.states.PRECISIONS`).

>>> activation_bytes("mlp", 8, "bf16", width=32) < activation_bytes("mlp", 8, "fp32", width=32)
True
"""

from __future__ import annotations

import math
from functools import lru_cache

from labkit._validate import choice
from labkit.memory.shapes import DEFAULT_WIDTH, N_CLASSES, N_PIXELS, check_sizes, param_shapes, transformer_shape
from labkit.memory.states import PRECISIONS


def activation_elements(model: str, batch_size: int, width: int | None = None) -> dict[str, int]:
    """Elements autograd keeps for the backward pass of one step of a labkit model.

    Counted per tensor that backward needs (a tensor two ops share counts once), in four
    kinds: 'compute' elements are stored in the compute dtype (2 bytes under bf16/fp16);
    'probabilities' are the attention probabilities (below);
    'fp32' elements stay fp32 under autocast (LayerNorm inputs -- the residual stream is
    fp32 -- and LayerNorm statistics); 'loss' elements are the log-softmax of the logits,
    which the runners compute in fp32 in every precision; 'index' elements are token ids
    and labels (int64 in torch). Checked against PyTorch's own count
    (``saved_tensors_hooks``) in tests/train/test_memory_measured.py.

    Attention probabilities: every labkit transformer (torch, JAX, Keras) runs its softmax in
    float32 and casts the result back, as CUDA autocast does by itself; backward keeps the
    fp32 softmax output (4 bytes) and, in a 16-bit precision, the 16-bit copy that ``@ v``
    takes (2 more bytes) -- on a CPU and on a GPU alike.
    """
    model, b, width = check_sizes(model, batch_size, width)
    if model == "mlp":
        w = DEFAULT_WIDTH["mlp"] if width is None else width
        # dense1's input, the two ReLU outputs (also the next layers' inputs), log-softmax
        return {"compute": b * (N_PIXELS + 2 * w), "fp32": 0, "probabilities": 0, "loss": b * N_CLASSES,
                "index": b}
    if model == "transformer":
        s = transformer_shape(width)
        t, d, h = N_PIXELS, s.d_model, s.heads
        per_block_compute = (
            b * t * d  # LN1 output (qkv's input)
            + b * t * 3 * d  # q, k, v
            + b * t * d  # attention output (out-projection's input)
            + b * t * d  # LN2 output (fc1's input)
            + 2 * b * t * 4 * d  # fc1 output (GELU's input) and GELU output (fc2's input)
        )
        per_block_fp32 = 2 * b * t * d + 2 * 2 * b * t  # LayerNorm inputs; their mean and rstd
        compute = s.layers * per_block_compute + b * d  # + the pooled features (head's input)
        fp32 = s.layers * per_block_fp32 + b * d + 2 * b  # final LayerNorm: input, mean, rstd
        probabilities = s.layers * b * h * t * t  # softmax output (fp32), and its 16-bit copy for @ v
        return {"compute": compute, "fp32": fp32, "probabilities": probabilities, "loss": b * N_CLASSES,
                "index": b * t + b}


def activation_bytes(model: str, batch_size: int, precision: str, width: int | None = None) -> int:
    """Modelled bytes saved for backward in one step, for a labkit.train precision.

    fp32/tf32: every float element 4 bytes; fp16/bf16 (autocast): 'compute' elements 2
    bytes, 'fp32' and 'loss' elements 4; bf16-pure: 2 bytes but for the fp32 loss. Attention
    probabilities: 4 bytes in fp32/tf32, 4 + 2 in every 16-bit precision (the fp32 softmax
    output and its 16-bit copy).
    Token ids and labels: 8 bytes.
    """
    choice("precision", precision, PRECISIONS)
    n = activation_elements(model, batch_size, width)
    compute_bytes = 4 if precision in ("fp32", "tf32") else 2
    fp32_bytes = 2 if precision == "bf16-pure" else 4
    prob_bytes = 4 if precision in ("fp32", "tf32") else 4 + 2
    return (n["compute"] * compute_bytes + n["fp32"] * fp32_bytes + n["probabilities"] * prob_bytes
            + n["loss"] * 4 + n["index"] * 8)


def weight_copy_elements(model: str, width: int | None = None) -> int:
    """Weight elements autocast copies to 16 bits *and keeps* for the backward pass.

    A matmul ``y = x @ W`` needs ``W`` again only to send a gradient back to ``x``; autocast
    saves its 16-bit copy of ``W`` for that. The MLP's first layer takes the data, which
    needs no gradient, so its copy is dropped; the transformer's first op is an embedding
    lookup (no matmul, no copy) and every kernel after it keeps one. Checked against
    PyTorch's ``saved_weight_copy_bytes`` in the tests.

    >>> weight_copy_elements("mlp", 32) == 32 * 32 + 32 * 10
    True
    """
    return counts(model, width)[1]


def counts(model: str, width: int | None = None) -> tuple[int, int, int]:
    """(parameters, weight-copy elements, parameter tensors) of a labkit model, from its shapes.

    >>> counts("mlp", 32)
    (3466, 1344, 6)
    """
    model, _, width = check_sizes(model, 1, width)
    return _counts(model, width)


@lru_cache(maxsize=32)
def _counts(model: str, width: int | None) -> tuple[int, int, int]:
    layout = [(name, math.prod(shape)) for name, shape in param_shapes(model, width)]
    first = "dense1/kernel" if model == "mlp" else None
    copies = sum(size for name, size in layout if name.endswith("/kernel") and name != first)
    return sum(size for _, size in layout), int(copies), len(layout)


__all__ = ["activation_bytes", "activation_elements", "counts", "weight_copy_elements"]
