"""The full PyTorch AMP recipe, each step run for real on the CPU (after PyTorch's "Automatic Mixed
Precision examples", ``docs/source/notes/amp_examples.rst``, https://pytorch.org/docs/stable/notes/amp_examples.html).

One function per part of the recipe, each written the way a learner writes the loop, with a wrong
version next to the right one where there is a classic mistake; one module per part:

* `accumulation` -- `accumulate` / `accumulation_ways`, gradient accumulation: one
  ``scaler.update()`` per optimizer step, the loss divided by the number of micro-batches;
* `several` -- `several_optimizers`: several models, losses and optimizers, one scaler, one ``update()``;
* `checkpoint` -- `checkpoint_resume_identical`: save model, optimizer *and* ``scaler.state_dict()``
  (and the data position), resume, and get the same run bit for bit;
* `custom_functions` -- `custom_function_dtypes`: ``torch.amp.custom_fwd`` / ``custom_bwd`` and an
  autocast-disabled region;
* `compiled` -- `compile_autocast`: ``torch.compile`` (inductor) under autocast: speed, and the casts it fuses;
* `attention` and `inference` -- `sdpa_dtypes` and `inference_agreement`: attention and inference
  (``torch.inference_mode()``) under autocast.

Every run is small -- the digits MLP of `labkit.train.torch.models` (width 16 or 32 by default, 64 for
`compile_autocast`), or a few small random tensors (`custom_function_dtypes`, `sdpa_dtypes`) -- and uses
``device="cpu"``: fp16 and bf16 autocast and ``torch.amp.GradScaler("cpu")`` all work there.

Each result that teaches a claim also checks it on this machine (a `labkit.checks.Report`, the same
lines wherever the claims hold): `AccumulationWays.checks`, `several_checks`, `resume_checks`,
`Compiled.checks` and `Inference.checks`.

>>> r = checkpoint_resume_identical(steps=4, at=2)
>>> r.identical, r.saved
(True, ('model', 'optimizer', 'scaler', 'step', 'rng'))
"""

from labkit.train.torch.recipe.accumulation import (
    WAYS, Accumulation, AccumulationWays, accumulate, accumulation_table, accumulation_ways,
)
from labkit.train.torch.recipe.attention import sdpa_dtypes
from labkit.train.torch.recipe.checkpoint import Resume, checkpoint_resume_identical, resume_checks
from labkit.train.torch.recipe.compiled import Compiled, compile_autocast
from labkit.train.torch.recipe.custom_functions import custom_function_dtypes
from labkit.train.torch.recipe.inference import Inference, inference_agreement
from labkit.train.torch.recipe.several import SeveralOptimizers, several_checks, several_optimizers

__all__ = [
    "Accumulation", "AccumulationWays", "Compiled", "Inference", "Resume", "SeveralOptimizers", "WAYS", "accumulate",
    "accumulation_table", "accumulation_ways", "checkpoint_resume_identical", "compile_autocast",
    "custom_function_dtypes", "inference_agreement", "resume_checks", "sdpa_dtypes", "several_checks",
    "several_optimizers",
]
