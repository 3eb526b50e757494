"""The optimizers that make low precision work (``RunConfig(optimizer=...)``, `TORCH_OPTIMIZERS`), from their libraries.

=================  ===================================================  ==================================
option             built as                                              what changes
=================  ===================================================  ==================================
``adam-sr``        ``torchao.optim._AdamW(bf16_stochastic_round=True)``  bf16 weights rounded stochastically
``adam-kahan``     ``optimi.AdamW(kahan_sum=True)``                      a Kahan compensation per bf16 weight
``adam-8bit``      ``torchao.optim.AdamW8bit``                           m and v in 8 bits, per block of 256
``adam-4bit``      ``torchao.optim.AdamW4bit``                           m and v in 4 bits, per block of 128
``bnb-adam-8bit``  ``bitsandbytes.optim.AdamW8bit``                      m and v in 8 bits, per block of 256
=================  ===================================================  ==================================

**The same Adam as labkit's "adam".** ``torch.optim.Adam``'s defaults are betas (0.9, 0.999),
eps 1e-8, weight_decay 0, and every option here is given exactly those, so that runs compare.
The libraries' own defaults differ: the three AdamW classes of torchao (``torchao/optim/adam.py``)
and bitsandbytes' (``bitsandbytes/optim/adamw.py``) decay weights by 1e-2; torch-optimi's AdamW
(``optimi/adamw.py``) also has betas (0.9, 0.99) and eps 1e-6. With weight_decay 0, AdamW is Adam.
(optimi folds Adam's bias corrections into debiased betas, ``optimi/utils.py: debias_beta``:
the same update, written differently.)

**Where each acts** (read in the libraries' source):

* ``adam-sr`` -- torchao's update runs in fp32 and writes the weight back with
  ``_fp32_to_bf16_sr`` (``torchao/optim/quant_utils.py``: add random low bits, truncate) *only
  for bf16 weights* (``bf16_stochastic_round and p.dtype is torch.bfloat16``). An update of a
  fifth of a bf16 spacing then moves the weight one spacing a fifth of the time: right on
  average, where rounding to nearest drops it every time. Its m and v are kept in the
  weights' dtype. With fp32 weights (every precision but ``bf16-pure``) it is plain Adam.
* ``adam-kahan`` -- optimi keeps, per bf16/fp16 weight, a buffer of what rounding the weight
  lost (``kahan_comp``, in the weights' dtype) and adds it back at the next step
  (``optimi/adam.py: _single_param_adam``). With fp32 weights optimi keeps no buffer (its
  ``_init_state`` sets ``kahan_comp = None``) and it is plain Adam.
* ``adam-8bit`` / ``adam-4bit`` -- torchao keeps m and v as ``OptimState8bit`` / ``OptimState4bit``
  (``torchao/optim/subclass_8bit.py``, ``subclass_4bit.py``): codes (one byte, or two 4-bit codes per
  byte), one fp32 scale per block (256 / 128 elements: ``block_size``) and a lookup table (256 / 16
  fp32 values) per state. "Follow bitsandbytes, only quantize tensors >= 4096 values" -- and only a
  tensor whose size the block divides (``_AdamBase._new_buffer``); any other tensor keeps m and v
  in the weights' dtype. The update itself runs in fp32, and rounds the weight to nearest.
* ``bnb-adam-8bit`` -- bitsandbytes keeps m and v as uint8 codes with an fp32 absmax per block of
  256 (``bitsandbytes/optim/optimizer.py: Optimizer2State.init_state``, ``blocksize = 256``) and two
  256-entry fp32 lookup tables shared by every tensor (``name2qmap``); a tensor of fewer than
  ``min_8bit_size = 4096`` elements keeps m and v in fp32, whatever the weights' dtype.

`labkit.memory.optimizer_state_bytes` counts all of this from the shapes; the tests check it
against these optimizers' real state tensors (`state_tensors`).

**Eager, not compiled.** torchao's ``step`` calls ``torch.compile(single_param_adam)`` for each
tensor. On this course's CPU that compiled one graph per parameter shape and took 20-40 s before
the first step (and needs a C++ compiler); labkit runs the same torchao function eagerly
(``torch.compiler.set_stance("force_eager")`` around the step), op by op on the same tensors.

>>> LIBRARY["adam-kahan"], BETAS, EPS, WEIGHT_DECAY
('optimi', (0.9, 0.999), 1e-08, 0.0)
"""

from __future__ import annotations

import contextlib
import importlib

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from labkit._validate import choice, integer, number
from labkit.train.config import TORCH_OPTIMIZERS
from labkit.train.torch.quiet import quiet_import

BETAS, EPS, WEIGHT_DECAY = (0.9, 0.999), 1e-8, 0.0
"""``torch.optim.Adam``'s defaults (weight decay: labkit's "adam" has none), given to every option."""
LIBRARY = {"adam-sr": "torchao", "adam-kahan": "optimi", "adam-8bit": "torchao", "adam-4bit": "torchao",
           "bnb-adam-8bit": "bitsandbytes"}
"""The module each option imports (the packages: torchao, torch-optimi, bitsandbytes; ``labkit[lowp]``)."""
_PACKAGE = {"torchao": "torchao", "optimi": "torch-optimi", "bitsandbytes": "bitsandbytes"}
def library(optimizer: str):
    """The module `optimizer` is built from (``torchao.optim``, ``optimi``, ``bitsandbytes.optim``),
    imported now; an ImportError naming ``pip install 'labkit[lowp]'`` if it is not installed.

    >>> library("adam-2bit")
    Traceback (most recent call last):
    ...
    ValueError: unknown optimizer 'adam-2bit'; choose one of 'adam-sr', 'adam-kahan', 'adam-8bit', 'adam-4bit', 'bnb-adam-8bit'
    """
    top = LIBRARY[choice("optimizer", optimizer, TORCH_OPTIMIZERS)]
    try:
        with quiet_import():
            importlib.import_module(top)  # the package first: a hidden or missing one fails here
            return importlib.import_module({"torchao": "torchao.optim", "optimi": "optimi",
                                            "bitsandbytes": "bitsandbytes.optim"}[top])
    except ImportError as exc:
        raise ImportError(f"optimizer={optimizer!r} needs {_PACKAGE[top]}: pip install 'labkit[lowp]' ({exc})") from exc


def _eager(opt: torch.optim.Optimizer, seed: int | None) -> torch.optim.Optimizer:
    """`opt` (a torchao optimizer) whose ``step`` runs torchao's per-tensor update eagerly; with
    a `seed`, each step draws its random bits from torch's generator seeded with ``(seed, step)``
    inside ``torch.random.fork_rng``, so that the learner's generator is left as it was.

    The instance's ``step`` wraps the class's (which torch's ``Optimizer`` has already wrapped
    with its step hooks), so hooks run once, and ``opt`` stays an instance of torchao's class."""
    step = opt.step
    devices = sorted({p.device.index or 0 for g in opt.param_groups for p in g["params"] if p.device.type == "cuda"})
    taken = [0]

    def eager_step(closure=None):
        rng = contextlib.nullcontext() if seed is None else torch.random.fork_rng(devices=devices)
        with rng, torch.compiler.set_stance("force_eager"):
            if seed is not None:
                torch.manual_seed((seed * 1_000_003 + taken[0]) % 2**63)
            taken[0] += 1
            return step(closure)

    opt.step = eager_step
    return opt


def make(optimizer: str, parameters, lr: float, seed: int = 0) -> torch.optim.Optimizer:
    """The optimizer `optimizer` (one of `TORCH_OPTIMIZERS`) over `parameters` at learning rate `lr`,
    with torch.optim.Adam's betas and eps and no weight decay (see the module docstring).

    ``adam-sr`` draws random bits at every step (``torch.randint`` on torch's global generator, in
    ``_fp32_to_bf16_sr``); here step k draws them from a generator seeded with (`seed`, k), the
    learner's own generator put back afterwards: a seeded run is reproducible, as labkit's other
    runs are, and draws nothing from the session's random stream.

    The library is imported first: a missing one is an ImportError before anything is built.
    """
    lib = library(optimizer)
    lr = number("lr", lr, minimum=0, inclusive=False)
    seed = integer("seed", seed, minimum=0)
    parameters = list(parameters)
    for p in parameters:
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError(f"optimizer={optimizer!r} runs on a CPU or a CUDA GPU; this parameter is on {p.device}")
    common = dict(lr=lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    if optimizer == "adam-kahan":
        return lib.AdamW(parameters, kahan_sum=True, **common)
    if optimizer == "bnb-adam-8bit":
        return lib.AdamW8bit(parameters, **common)
    cls = {"adam-sr": lib._AdamW, "adam-8bit": lib.AdamW8bit, "adam-4bit": lib.AdamW4bit}[optimizer]
    sr = optimizer == "adam-sr"
    return _eager(cls(parameters, bf16_stochastic_round=sr, **common), seed if sr else None)


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in ``optimizer.state``, as the plain tensors that hold its bytes.

    torchao's ``OptimState8bit`` looks like a tensor of the weight's shape and dtype but holds
    none of it: its bytes are in the tensors it wraps (``__tensor_flatten__`` names them: ``codes``,
    ``scale``, ``qmap``), and its own ``untyped_storage()`` has no data to point to. Such a
    wrapper is replaced by what it wraps (recursively); plain tensors are kept, non-tensors
    (bitsandbytes' ``step``, optimi's ``kahan_comp = None``) left out.

    >>> p = torch.nn.Parameter(torch.ones(4))
    >>> opt = torch.optim.Adam([p]); p.grad = torch.ones(4); opt.step()
    >>> [tuple(t.shape) for t in state_tensors(opt)]
    [(), (4,), (4,)]
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    out: list[torch.Tensor] = []

    def add(t):
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                add(getattr(t, name))
        else:
            out.append(t)

    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                add(value)
    return out


__all__ = ["BETAS", "EPS", "LIBRARY", "WEIGHT_DECAY", "library", "make", "state_tensors"]
