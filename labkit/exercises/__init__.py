"""Learners check themselves: short exercises a notebook cell answers, with feedback aimed at the misconception.

>>> from labkit.exercises import check, show
>>> print(show("bf16_of_257"))                    # doctest: +ELLIPSIS
Exercise bf16_of_257 (notebook 01)
Predict the value 257.0 becomes when it is stored in bf16...
>>> check("bf16_of_257", 258)                     # doctest: +ELLIPSIS
✗ not yet (bf16_of_257): 258 is what round-half-up would give...

Each `Exercise` computes its key from labkit (formats from ml_dtypes, `labkit.hardware`'s GPU tables,
`labkit.scaling`'s replays of GradScaler, Keras', jmp's and DeepSpeed's scalers, `labkit.memory`'s byte
counts) or the real library (Flax, Keras, torch: imported only when checked) when it is checked; a wrong
answer of the right kind is `Feedback` (``correct=False``) whose message names the likely mistake and
never prints the key; an unknown id or an answer of the wrong kind raises ValueError/TypeError, and
``None``, a notebook's placeholder, asks for an answer. The answer kinds are `KINDS`: a "dtype" answer
is one of `DTYPE_ANSWERS` ('fp32', 'bf16', 'fp16'; 'float32', 'torch.float16', ... and a dtype itself, such
as ``p.grad.dtype``, work too), a "precision" answer one of `PRECISION_ANSWERS`. `exercises()` lists them,
per notebook; `gradient_sample()` builds the loss-scale exercise's gradients; `mx_dequantize()` is the
MXFP8 rule the block-format exercise checks against.

The exercises live in one module per topic (`numbers`, `precision`, `amp`, `frameworks`, `memory`,
`sharding`, `blocks`, `clinic`), each registering its own when imported.
"""

from labkit.exercises.core import (
    AMP_CALLS, DTYPE_ANSWERS, EXERCISES, KINDS, PRECISION_ANSWERS, Exercise, Feedback, Hint, check, exercises, get,
    register, show,
)
from labkit.exercises.numbers import gradient_sample  # 01-03 and 10: rounding, underflow, loss scales
# one module per topic, each registering its exercises when imported, in course order
from labkit.exercises import precision as _precision  # noqa: F401 -- 00: which precision on which GPU
from labkit.exercises.amp import AMP_ORDER  # 04: torch.amp's step, a resumed GradScaler
from labkit.exercises import frameworks as _frameworks  # noqa: F401 -- 05, 06: Keras' and JAX's loss scales, dtypes
from labkit.exercises import memory as _memory  # noqa: F401 -- 07: model states, MFU
from labkit.exercises import sharding as _sharding  # noqa: F401 -- 08: ZeRO's bytes, FSDP2's collective dtypes
from labkit.exercises.blocks import BLOCK_8BIT, SCALE_BYTES, mx_dequantize  # 09, 10: block formats, 8-bit states
from labkit.exercises import clinic as _clinic  # noqa: F401 -- 11: the clinic

__all__ = ["AMP_CALLS", "AMP_ORDER", "BLOCK_8BIT", "DTYPE_ANSWERS", "EXERCISES", "KINDS", "PRECISION_ANSWERS",
           "SCALE_BYTES", "Exercise", "Feedback", "Hint", "check", "exercises", "get", "gradient_sample",
           "mx_dequantize", "register", "show"]
