"""Model states -- weights, master weights, gradients, optimizer states -- counted as the ZeRO paper does.

Bytes per parameter in each layout (`LAYOUTS`; Rajbhandari et al. 2020, "ZeRO", section 3.1):

==============  =======  ==============  =========  =================  =====
layout          weights  master weights  gradients  Adam (m, v)        total
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
are stored in 16 bits (`labkit.memory.activations`). Seed 004's `seed004_memory_analysis` gets
this wrong; see its docstring.

A labkit.train precision (`PRECISIONS`: fp32 tf32 fp16 bf16 bf16-pure) names its layout through
`LAYOUT`: every labkit runner keeps fp32 weights under fp16/bf16 (autocast, Keras' mixed policies,
Flax ``param_dtype=float32``), so those are ``autocast``. `model_state_bytes` takes either name.

Optimizers that keep less (`TORCH_OPTIMIZERS`, run by labkit.train's PyTorch room): ``adam-8bit`` /
``bnb-adam-8bit`` keep m and v as 8-bit codes with an fp32 scale per block of 256 (2.03 bytes per
parameter instead of 8), ``adam-4bit`` as 4-bit codes per block of 128 (1.06); ``adam-kahan`` adds a
compensation buffer to bf16 weights; ``adam-sr`` keeps what Adam keeps. Small tensors stay
unquantized (`QUANTIZED` has each library's rules), so `optimizer_state_bytes` counts from the
shapes, tensor by tensor, exactly as the libraries allocate.

>>> model_state_bytes(1_000_000, "mixed", "adam")["total"]
16000000
>>> model_state_bytes(1_000_000, "fp32", "adam")["total"]
16000000
>>> model_state_bytes(1_000_000, "bf16") == model_state_bytes(1_000_000, "autocast")
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit._validate import choice, integer, shown

_STATES_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adam-sr": 2, "adam-kahan": 2}
# bytes per parameter: (weights, master weights, gradients, one optimizer state)
_BYTES = {"fp32": (4, 0, 4, 4), "mixed": (2, 4, 2, 4), "autocast": (4, 0, 4, 4), "bf16-pure": (2, 0, 2, 2)}
LAYOUTS = tuple(_BYTES)  # ("fp32", "mixed", "autocast", "bf16-pure")
TORCH_OPTIMIZERS = ("adam-sr", "adam-kahan", "adam-8bit", "adam-4bit", "bnb-adam-8bit")
"""labkit.train's low-precision optimizers (`labkit.train.config.TORCH_OPTIMIZERS`; a test keeps the two equal)."""
OPTIMIZERS = ("sgd", "momentum", "adam") + TORCH_OPTIMIZERS


@dataclass(frozen=True)
class Quantized:
    """How a library stores Adam's m and v in a few bits (`QUANTIZED`), read from its source.

    bits: bits per code; block: elements per fp32 scale; min_size: a tensor with fewer elements
    keeps m and v unquantized; divisible: only a tensor whose size `block` divides is quantized
    (else the last block is partial); qmap: fp32 entries of each state's lookup table; shared_qmap:
    one pair of tables for the whole optimizer (else one per state tensor); fallback_fp32: an
    unquantized tensor's m and v are fp32 (else in the weights' dtype); step_bytes: the step
    counter kept per tensor (a float32 tensor; 0: a Python int).
    """

    bits: int
    block: int
    min_size: int
    divisible: bool
    qmap: int
    shared_qmap: bool
    fallback_fp32: bool
    step_bytes: int


QUANTIZED = {
    # torchao/optim/adam.py (_AdamBase._new_buffer: ">= 4096 values" and size % block_size == 0;
    # AdamW8bit block_size=256, AdamW4bit 128), subclass_8bit.py / subclass_4bit.py (uint8 codes,
    # two 4-bit codes per byte; fp32 scales; qmaps of 256 / 16 fp32 entries, one per state)
    "adam-8bit": Quantized(8, 256, 4096, True, 256, False, False, 4),
    "adam-4bit": Quantized(4, 128, 4096, True, 16, False, False, 4),
    # bitsandbytes/optim/optimizer.py (Optimizer2State.init_state: p.numel() < min_8bit_size = 4096
    # keeps float32 states; blocksize = 256, blocks rounded up; qmap1/qmap2 = name2qmap, shared)
    "bnb-adam-8bit": Quantized(8, 256, 4096, False, 256, True, True, 0),
}
"""The low-bit optimizers' storage rules: `optimizer_state_bytes` counts bytes with them."""
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "bf16-pure")
"""labkit.train's precision names (`labkit.train.config.PRECISIONS`; a test keeps the two equal)."""
LAYOUT = {"fp32": "fp32", "tf32": "fp32", "fp16": "autocast", "bf16": "autocast", "bf16-pure": "bf16-pure"}
"""labkit.train precision -> the model-state layout its runners keep."""


def layout_of(precision: str) -> str:
    """The model-state layout of a labkit.train precision, or of a layout name (returned as is).

    >>> layout_of("bf16"), layout_of("mixed")
    ('autocast', 'mixed')
    """
    choice("precision", precision, LAYOUTS + PRECISIONS[1:4])
    return LAYOUT.get(precision, precision)


def model_state_bytes(n_params: int, precision: str = "mixed", optimizer: str = "adam") -> dict[str, int]:
    """Bytes of weights, master weights, gradients and optimizer states for `n_params` parameters.

    `precision` is a layout (`LAYOUTS`) or a labkit.train precision (`PRECISIONS`, see `LAYOUT`).
    `optimizer`: one of `OPTIMIZERS`; the optimizer keeps its states in the dtype of the weights
    it updates (the fp32 master copy in ``mixed``). ``adam-sr`` keeps Adam's m and v; ``adam-kahan``
    adds a compensation buffer for 16-bit weights (``bf16-pure``: 2 + 2 + 2 bytes); the low-bit
    ones (`QUANTIZED`) are counted as one large tensor, codes plus an fp32 scale per block, so
    per parameter 2 + 8/256 bytes (8-bit), 1 + 8/128 (4-bit). A real model's small tensors stay
    unquantized, and each state has its lookup table: `optimizer_state_bytes` counts per tensor.

    >>> model_state_bytes(10**9, "bf16-pure", "adam-8bit")["optimizer_states"] / 10**9
    2.03125
    >>> model_state_bytes(10**9, "bf16-pure", "adam-kahan")["optimizer_states"] / 10**9
    6.0
    """
    n_params = integer("n_params", n_params, minimum=0)
    layout = layout_of(precision)
    choice("optimizer", optimizer, OPTIMIZERS)
    w, master, g, state = _BYTES[layout]
    if optimizer in QUANTIZED:  # one large tensor: codes, and an fp32 scale per block (the last one partial)
        q = QUANTIZED[optimizer]
        states = 2 * (math.ceil(n_params * q.bits / 8) + 4 * math.ceil(n_params / q.block))
    else:  # Kahan's compensation is kept for 16-bit weights only (optimi/adam.py: _init_state)
        states = state * (_STATES_PER_PARAM[optimizer] + (optimizer == "adam-kahan" and state == 2)) * n_params
    out = {
        "weights": w * n_params,
        "master_weights": master * n_params,
        "gradients": g * n_params,
        "optimizer_states": states,
    }
    out["total"] = sum(out.values())
    return out


def _numels(shapes) -> list[int]:
    """Element counts of `shapes`: a dict of name -> shape, a list of (name, shape) pairs
    (`labkit.memory.shapes.param_shapes`' result) or a list of shapes; a shape is a tuple of
    sizes >= 0 (or one size)."""
    if isinstance(shapes, dict):
        shapes = list(shapes.values())
    elif isinstance(shapes, (list, tuple)):
        shapes = [s[1] if isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str) else s
                  for s in shapes]
    else:
        raise TypeError(f"shapes must be a dict of name -> shape or a list of shapes (tuples of sizes); got "
                        f"{type(shapes).__name__} {shown(shapes)}")
    out = []
    for shape in shapes:
        dims = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
        if not isinstance(dims, (list, tuple)):
            raise TypeError(f"each shape must be a tuple of sizes (integers >= 0); got {type(shape).__name__} "
                            f"{shown(shape)}")
        out.append(math.prod(integer("a shape's size", d, minimum=0, maximum=2**48) for d in dims))
    return out


def optimizer_state_bytes(shapes, optimizer: str = "adam", precision: str = "fp32") -> dict[str, int]:
    """Bytes of everything an optimizer keeps for weights of these `shapes`, tensor by tensor, as
    its library allocates it (`QUANTIZED`'s rules for the low-bit ones; the module docstring of
    ``labkit.train.torch.optimizers`` cites the sources).

    `shapes`: a dict of name -> shape, a list of (name, shape) pairs (`labkit.memory.param_shapes`)
    or a list of shapes. `precision`: as `model_state_bytes`'; the optimizer updates 16-bit weights
    in ``bf16-pure`` only, fp32 ones (the master copy) in every other layout. Returns:

    * ``moments`` -- Adam's m and v (SGD with momentum: its buffer), as codes where quantized;
    * ``scales`` -- the fp32 scale (absmax) of each block of codes;
    * ``qmaps`` -- the lookup tables from code to value (bitsandbytes: one pair for all tensors);
    * ``compensation`` -- ``adam-kahan``'s buffer, for 16-bit weights;
    * ``steps`` -- a float32 step counter per tensor (torch.optim.Adam, torchao; optimi keeps one
      per group, bitsandbytes a Python int: not in ``optimizer.state``);
    * ``total``.

    The tests check each count against the real optimizer's state tensors after a step.

    >>> mlp = [(64, 256), (256,), (256, 256), (256,), (256, 10), (10,)]    # 85,002 weights
    >>> optimizer_state_bytes(mlp, "adam")                 # m and v in fp32, six step counters
    {'moments': 680016, 'scales': 0, 'qmaps': 0, 'compensation': 0, 'steps': 24, 'total': 680040}
    >>> b = optimizer_state_bytes(mlp, "bnb-adam-8bit")    # (256, 10): 2560 < 4096 elements, fp32
    >>> b["moments"] == 2 * (64 * 256 + 256 * 256) + 8 * (256 + 256 + 2560 + 10), b["qmaps"]
    (True, 2048)
    """
    numels = _numels(shapes)
    choice("optimizer", optimizer, OPTIMIZERS)
    param_bytes = _BYTES[layout_of(precision)][3]  # the dtype of the weights the optimizer updates
    out = dict.fromkeys(("moments", "scales", "qmaps", "compensation", "steps"), 0)
    q = QUANTIZED.get(optimizer)
    # a float32 step tensor per weight: torch.optim.Adam and torchao's; optimi and SGD keep none
    step_bytes = q.step_bytes if q is not None else 4 * (optimizer in ("adam", "adam-sr"))
    for n in numels:
        out["steps"] += step_bytes
        if optimizer in ("sgd", "momentum"):
            out["moments"] += _STATES_PER_PARAM[optimizer] * param_bytes * n
        elif q is not None and n >= q.min_size and (n % q.block == 0 or not q.divisible):
            out["moments"] += 2 * math.ceil(n * q.bits / 8)
            out["scales"] += 2 * 4 * math.ceil(n / q.block)
            out["qmaps"] += 0 if q.shared_qmap else 2 * 4 * q.qmap
        else:
            out["moments"] += 2 * n * (4 if q is not None and q.fallback_fp32 else param_bytes)
            if optimizer == "adam-kahan" and param_bytes == 2:
                out["compensation"] += n * param_bytes
    if q is not None and q.shared_qmap and any(n >= q.min_size for n in numels):
        out["qmaps"] = 2 * 4 * q.qmap
    out["total"] = sum(out.values())
    return out


def optimizer_state_table(shapes, precision: str = "fp32", optimizers=OPTIMIZERS[2:]):
    """`optimizer_state_bytes` for each of `optimizers` as a `labkit.table.Table`: the bytes of
    each part and per weight (against ``adam``'s in the same `precision`).

    >>> t = optimizer_state_table([(4096, 4096)], "bf16-pure", ["adam", "adam-8bit", "adam-4bit"])
    >>> t.column("bytes per weight")
    ['4.00', '2.03', '1.06']
    """
    from labkit._validate import names
    from labkit.table import Table

    optimizers = names("optimizers", optimizers, OPTIMIZERS)
    n = sum(_numels(shapes))
    rows = []
    for opt in optimizers:
        b = optimizer_state_bytes(shapes, opt, precision)
        rows.append((opt, *(f"{b[k]:,}" for k in ("moments", "scales", "qmaps", "compensation", "steps", "total")),
                     f"{b['total'] / n:.2f}" if n else "-"))
    return Table(("optimizer", "moments", "scales", "qmaps", "compensation", "steps", "total bytes",
                  "bytes per weight"), tuple(rows),
                 f"Optimizer states for {n:,} weights in {len(_numels(shapes))} tensor(s) ({precision})")


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


__all__ = ["LAYOUT", "LAYOUTS", "OPTIMIZERS", "PRECISIONS", "QUANTIZED", "TORCH_OPTIMIZERS", "layout_of",
           "model_state_bytes", "optimizer_state_bytes", "optimizer_state_table", "seed004_comparison",
           "seed004_memory_analysis"]
