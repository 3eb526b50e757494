"""Where training memory goes: model states (counted as the ZeRO paper does) and activations.

Model states, in bytes per parameter (Rajbhandari et al. 2020, "ZeRO", section 3.1):

==============  =======  ==============  =========  =================  =====
precision       weights  master weights  gradients  Adam (m, v)        total
==============  =======  ==============  =========  =================  =====
``fp32``        4        0               4          4 + 4              16
``mixed``       2        4               2          4 + 4              16
``autocast``    4        0               4          4 + 4              16
``bf16-pure``   2        0               2          2 + 2              8
==============  =======  ==============  =========  =================  =====

``mixed`` is the ZeRO/Megatron/DeepSpeed layout: fp16/bf16 weights and gradients, an fp32
master copy. ``autocast`` is what ``torch.amp.autocast`` and Keras' ``mixed_*`` policies
do: the variables stay fp32 and each op casts its inputs on the fly (those casts are
transient, and show up with the activations). Either way, mixed precision Adam costs as
much model-state memory as fp32 Adam: **the saving comes from the activations**, which
are stored in 16 bits. Seed 004's `seed004_memory_analysis` gets this wrong; see its docstring.

>>> model_state_bytes(1_000_000, "mixed", "adam")["total"]
16000000
>>> model_state_bytes(1_000_000, "fp32", "adam")["total"]
16000000
"""

from __future__ import annotations

from labkit._validate import choice, integer

_STATES_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2}
# bytes per parameter: (weights, master weights, gradients, one optimizer state)
_LAYOUT = {"fp32": (4, 0, 4, 4), "mixed": (2, 4, 2, 4), "autocast": (4, 0, 4, 4), "bf16-pure": (2, 0, 2, 2)}
PRECISIONS = tuple(_LAYOUT)  # ("fp32", "mixed", "autocast", "bf16-pure")
OPTIMIZERS = tuple(_STATES_PER_PARAM)  # ("sgd", "momentum", "adam")


def _check(precision: str, optimizer: str) -> None:
    choice("precision", precision, PRECISIONS)
    choice("optimizer", optimizer, OPTIMIZERS)


def check_sizes(model: str, batch_size: int, width: int | None) -> tuple[str, int, int | None]:
    """A labkit model's name, batch size and width (None: the model's default), checked against
    RunConfig's limits (batch size up to 2**20, width up to 2**16); returned as given.

    >>> check_sizes("mlp", 8, None)
    ('mlp', 8, None)
    """
    from labkit.train.config import MAX_BATCH_SIZE, MAX_WIDTH, MODELS

    model = choice("model", model, MODELS)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=MAX_BATCH_SIZE)
    if width is not None:
        width = integer("width", width, minimum=1, maximum=MAX_WIDTH)
    return model, batch_size, width


def model_state_bytes(n_params: int, precision: str = "mixed", optimizer: str = "adam") -> dict[str, int]:
    """Bytes of weights, master weights, gradients and optimizer states for `n_params` parameters."""
    n_params = integer("n_params", n_params, minimum=0)
    _check(precision, optimizer)
    w, master, g, state = _LAYOUT[precision]
    out = {
        "weights": w * n_params,
        "master_weights": master * n_params,
        "gradients": g * n_params,
        "optimizer_states": state * _STATES_PER_PARAM[optimizer] * n_params,
    }
    out["total"] = sum(out.values())
    return out


def seed004_memory_analysis(model_size, use_mixed_precision=True):
    """Seed 004's ``analyze_mixed_precision_memory``, verbatim in logic (returns GiB).

    What is right and what is wrong with it (`seed004_comparison` puts it next to ZeRO's count):
    - mixed precision: its 12 bytes of "optimizer" memory are ZeRO's K = 12 -- the fp32
      master weights *and* Adam's m and v. It also lists 4 bytes of master weights
      (``主权重内存``) beside them, so its rows add up to 20 bytes/param; but its total leaves
      that row out, and the **total, 16 bytes/param, is right**;
    - fp32: it gives Adam 16 bytes/param of state, where m and v take 8, so its **fp32
      total is 24 bytes/param instead of 16** -- the one wrong total;
    - it has no activations at all, which is where mixed precision saves memory.
    So it reports 16 vs 24 bytes/param, a 33% saving of model-state memory that does not
    exist: ZeRO's count is 16 vs 16 (`model_state_bytes`).

    (The arguments are checked, as the seed does not: `model_size` a number of parameters from 1 to 2**53,
    `use_mixed_precision` True or False.)
    """
    integer("model_size", model_size, minimum=1, maximum=2**53)
    if not isinstance(use_mixed_precision, bool):
        raise TypeError(f"use_mixed_precision must be True or False; got {type(use_mixed_precision).__name__}")
    if use_mixed_precision:
        model_memory = model_size * 2
        master_weights = model_size * 4
        gradient_memory = model_size * 2
        optimizer_memory = model_size * 12
    else:
        model_memory = model_size * 4
        gradient_memory = model_size * 4
        optimizer_memory = model_size * 16
    return {
        "模型内存": model_memory / 1024**3,
        "主权重内存": master_weights / 1024**3 if use_mixed_precision else 0,
        "梯度内存": gradient_memory / 1024**3,
        "优化器内存": optimizer_memory / 1024**3,
        "总内存": (model_memory + gradient_memory + optimizer_memory) / 1024**3,
    }


def seed004_comparison(n_params: int = 10**9):
    """Seed 004's ``analyze_mixed_precision_memory`` next to ZeRO's count (`model_state_bytes`,
    Adam), in bytes per parameter, for mixed precision and fp32: one row per entry, then the
    seed's total and the sum of its rows. Returns a `labkit.table.Table`.

    >>> t = seed004_comparison()
    >>> t.rows[-2]
    ('total', '16', '16', '24', '16')
    """
    from labkit.table import Table

    n_params = integer("n_params", n_params, minimum=1, maximum=2**53)
    seed = {mixed: [v * 2**30 / n_params for v in seed004_memory_analysis(n_params, mixed).values()]
            for mixed in (True, False)}
    zero = {p: model_state_bytes(n_params, p, "adam") for p in ("mixed", "fp32")}
    names = ("weights", "master weights", "gradients", "optimizer states (Adam)")
    keys = ("weights", "master_weights", "gradients", "optimizer_states")
    fmt = lambda x: f"{x:.0f}"  # noqa: E731
    rows = [(name, fmt(seed[True][i]), fmt(zero["mixed"][k] / n_params), fmt(seed[False][i]),
             fmt(zero["fp32"][k] / n_params)) for i, (name, k) in enumerate(zip(names, keys))]
    rows.append(("total", fmt(seed[True][4]), fmt(zero["mixed"]["total"] / n_params), fmt(seed[False][4]),
                 fmt(zero["fp32"]["total"] / n_params)))
    rows.append(("sum of the rows above", fmt(sum(seed[True][:4])), fmt(zero["mixed"]["total"] / n_params),
                 fmt(sum(seed[False][:4])), fmt(zero["fp32"]["total"] / n_params)))
    return Table(("bytes per parameter", "seed: mixed", "ZeRO: mixed", "seed: fp32", "ZeRO: fp32"), tuple(rows),
                 "Seed 004's analyze_mixed_precision_memory against ZeRO's count (Adam)")


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
    from labkit.train.models import DEFAULT_WIDTH, N_CLASSES, N_PIXELS, transformer_shape

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
    from labkit.train.config import PRECISIONS as RUN_PRECISIONS

    choice("precision", precision, RUN_PRECISIONS)
    n = activation_elements(model, batch_size, width)
    compute_bytes = 4 if precision in ("fp32", "tf32") else 2
    fp32_bytes = 2 if precision == "bf16-pure" else 4
    prob_bytes = 4 if precision in ("fp32", "tf32") else 4 + 2
    return (n["compute"] * compute_bytes + n["fp32"] * fp32_bytes + n["probabilities"] * prob_bytes
            + n["loss"] * 4 + n["index"] * 8)
