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
is one of `DTYPE_ANSWERS` ('fp32', 'bf16', 'fp16'; 'float32', 'torch.float16', ... work too), a
"precision" answer one of `PRECISION_ANSWERS`. `exercises()` lists them, per notebook; `gradient_sample()` builds the loss-scale exercise's gradients;
`mx_dequantize()` is the MXFP8 rule the block-format exercise checks against.
"""

from labkit.exercises.core import (
    AMP_CALLS, DTYPE_ANSWERS, EXERCISES, KINDS, PRECISION_ANSWERS, Exercise, Feedback, Hint, check, exercises, get,
    register, show,
)
from labkit.exercises.numbers import gradient_sample
from labkit.exercises.training import AMP_ORDER, BLOCK_8BIT, SCALE_BYTES, mx_dequantize
from labkit.exercises import clinic as _clinic  # noqa: F401 -- registers notebook 11's exercises

__all__ = ["AMP_CALLS", "AMP_ORDER", "BLOCK_8BIT", "DTYPE_ANSWERS", "EXERCISES", "KINDS", "PRECISION_ANSWERS",
           "SCALE_BYTES", "Exercise", "Feedback", "Hint", "check", "exercises", "get", "gradient_sample",
           "mx_dequantize", "register", "show"]
