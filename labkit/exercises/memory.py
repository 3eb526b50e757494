"""Exercises of notebook 07: the model states of a 7B model under bf16 autocast, and the MFU of a step.

The bytes come from `labkit.memory.model_state_bytes`, the FLOPs and peaks from `labkit.bench`.

>>> from labkit.exercises import check
>>> print(check("model_states_7b_gb", 56).message)  # doctest: +ELLIPSIS
That halves everything: pure bf16...
"""

from __future__ import annotations

import math

from labkit.exercises.core import Exercise, Hint, register

MFU_STEP = {"model": "transformer", "batch_size": 256, "width": 1024, "seconds": 0.010, "device": "NVIDIA H100 SXM",
            "precision": "bf16"}
"""The step of the MFU exercise (07): the GPU size of notebook 07's transformer, timed on an H100 SXM."""


def _mfu() -> float:
    from labkit import bench

    s = MFU_STEP
    flops = bench.train_flops(s["model"], s["batch_size"], s["width"])
    return flops / s["seconds"] / (bench.peak_tflops(s["device"], s["precision"]) * 1e12)


def _near(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isclose(a, b, rel_tol=0.01)


MODEL_PARAMS = 7 * 10**9
"""Parameters of the model-state exercise (07): a 7B model."""


def _state_gb(precision: str) -> float:
    """GB (1e9 bytes) of the model states of `MODEL_PARAMS` parameters trained with Adam in `precision`."""
    from labkit.memory import model_state_bytes

    return model_state_bytes(MODEL_PARAMS, precision, "adam")["total"] / 1e9


def _per_param_gb(nbytes: float) -> float:
    return MODEL_PARAMS * nbytes / 1e9


register(Exercise(
    "model_states_7b_gb", ("07",),
    f"A {MODEL_PARAMS / 1e9:g}B-parameter model trains with bf16 autocast and Adam, its weights in fp32 (PyTorch's "
    "torch.autocast, Keras' mixed_bfloat16, Flax with param_dtype=float32). How many GB (1e9 bytes) do its model "
    "states take -- weights, gradients and Adam's m and v, activations left out? (labkit.memory.model_state_bytes "
    "counts them; within 1% is right.)",
    "number", lambda: _state_gb("bf16"), rel_tol=0.01,
    hints=(
        Hint(lambda a, k: _near(a, _state_gb("bf16-pure")),
             "That halves everything: pure bf16, where weights, gradients and Adam's moments are all bf16. Under "
             "autocast the weights stay fp32, and so do their gradients and Adam's moments."),
        Hint(lambda a, k: _near(a, k * 1e9 / 2**30),
             "That is GiB (2^30 bytes): the question asks for GB, 1e9 bytes."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(4)),
             "That counts an fp32 master copy besides the weights, as seed 004's rows do. Under autocast the fp32 "
             "weights *are* the master copy: there is no other."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(2)),
             "That adds a 16-bit copy of the weights. Autocast makes those copies during the step (notebook 07 "
             "counts them beside the states); they are not kept as model state."),
        Hint(lambda a, k: _near(a, k - _per_param_gb(2)),
             "A gradient takes its weight's dtype: the weights are fp32, so their gradients are fp32 too, not bf16."),
        Hint(lambda a, k: _near(a, k - _per_param_gb(4)),
             "Count all four: the weight, its gradient, and Adam's two moments m and v."),
        Hint(lambda a, k: _near(a, k + _per_param_gb(8)),
             "That is seed 004's fp32 total, which gives Adam twice the bytes its m and v take."),
        Hint(lambda a, k: _near(a, k * 1e3) or _near(a, k * 1e9) or _near(a, k / 1e3),
             "Check the unit: GB, 1e9 bytes."),
        Hint(lambda a, k: _near(a, k / MODEL_PARAMS * 1e9),
             "That is bytes per parameter: multiply by the parameters, then divide by 1e9."),
    ),
    otherwise="Count four tensors per parameter -- weight, gradient, m, v -- each in the dtype autocast leaves it, "
              "times the parameters.",
    why="fp32 weights (4 bytes) + fp32 gradients (4) + Adam's m and v (8): 16 bytes per parameter, as in fp32 "
        "training. Autocast saves memory in the activations, not in the model states; ZeRO and FSDP (notebook 08) "
        "shard these states."))


register(Exercise(
    "mfu_h100_transformer", ("07",),
    "One bf16 training step of the course's transformer at d_model 1024, batch 256 (notebook 07's GPU size) takes "
    "10 ms on an NVIDIA H100 SXM. What is its MFU, as a fraction from 0 to 1? (labkit.bench.train_flops counts a "
    "step's FLOPs; labkit.bench.peaks_table() lists the dense peaks. Within 1% is right.)",
    "number", _mfu, rel_tol=0.01,
    hints=(
        Hint(lambda a, k: _near(a, 100 * k), "That looks like a percentage: give MFU as a fraction (0.5, not 50)."),
        Hint(lambda a, k: _near(a, 1000 * k) or _near(a, k / 1000),
             "Off by a factor of 1000: the step takes 10 milliseconds, and a TFLOP/s is 1e12 FLOP per second."),
        Hint(lambda a, k: a > 1,
             "More than the chip can do: did you divide by its fp32 peak (no tensor cores)? A bf16 step is measured "
             "against the chip's bf16 peak."),
        Hint(lambda a, k: _near(a, k / 2),
             "Half of it: either you divided by the datasheet's figure 'with sparsity' (twice the dense peak that "
             "MFU uses), or you counted multiply-adds as one FLOP (a multiply-add is 2; train_flops counts FLOPs)."),
        Hint(lambda a, k: _near(a, k / 3),
             "That counts the forward pass only: a training step is about 3x the forward's FLOPs (backward does two "
             "matmuls for each forward one)."),
        Hint(lambda a, k: _near(a, 2 * k),
             "Twice too high: did you divide by the TF32 peak? A bf16 run is measured against the bf16 peak."),
    ),
    otherwise="MFU = the step's FLOPs / its time in seconds / the dense peak for the run's precision (in FLOP/s).",
    why="train_flops / 0.010 s is about a quarter of the H100 SXM's dense bf16 peak: a typical MFU for a model this "
        "small; large transformers reach 0.4-0.6."))


__all__ = ["MFU_STEP", "MODEL_PARAMS"]
