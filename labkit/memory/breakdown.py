"""A step's memory in seven parts (`SEGMENTS`), modelled from the shapes or read from what a run measured.

====================  ==============================================================
``weights``           the parameters the optimizer updates (fp32 under autocast and
                      Keras/Flax mixed policies: they are the master copy; bf16 in pure bf16)
``master_weights``    a separate fp32 copy, in the ZeRO/DeepSpeed "mixed" layout only
``gradients``         one per weight, in the weight's dtype
``optimizer_states``  Adam's m and v (plus a step counter per tensor in torch)
``weight_copies``     the 16-bit copies of the weights that autocast makes for each
                      matmul and keeps for the backward pass
``activations``       what the forward pass keeps for the backward pass
``step_temporaries``  XLA's temporary buffers of a compiled step (JAX): activations,
                      gradients and casts together -- the compiler does not tell them apart
====================  ==============================================================

`modelled` counts them from the shapes (`labkit.memory.states`: the ZeRO model-state count;
`labkit.memory.activations`); `measured` reads them from a run's `MemoryReport` (PyTorch: the
tensors themselves and autograd's saved tensors; JAX: the compiled step's
``memory_analysis()``; TensorFlow: its variables and gradients -- on a CPU it reports no
activations, so its total is unknown). On a GPU the measured side also carries the
allocator's peak.

>>> fp32, bf16 = (modelled("mlp", 512, p, width=1024) for p in ("fp32", "bf16"))
>>> bf16.parts["weights"] == fp32.parts["weights"]      # autocast keeps the weights in fp32
True
>>> round(bf16.parts["activations"] / fp32.parts["activations"], 2)
0.5
>>> round(bf16.total / fp32.total, 2)   # autocast's weight copies take back what activations save
1.0
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit._validate import choice
from labkit.memory.activations import activation_bytes, counts
from labkit.memory.report import FRAMEWORKS, MemoryReport
from labkit.memory.shapes import check_sizes
from labkit.memory.states import LAYOUT, PRECISIONS, model_state_bytes

SEGMENTS = ("weights", "master_weights", "gradients", "optimizer_states", "weight_copies", "activations",
            "step_temporaries")
LABELS = {
    "weights": "weights",
    "master_weights": "fp32 master copy",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "weight_copies": "16-bit weight copies",
    "activations": "activations",
    "step_temporaries": "XLA step temporaries",
}
@dataclass(frozen=True)
class Breakdown:
    """Bytes per segment of one step; ``None`` marks a part that cannot be measured here.

    ``total`` is the sum when every part is known (or folded into ``step_temporaries``),
    else None; ``peak`` is the device allocator's peak where one is reported (a GPU);
    ``note`` says what is missing and why.
    """

    parts: dict = field(default_factory=dict)
    source: str = "modelled"
    complete: bool = True
    peak: int | None = None
    note: str = ""

    @property
    def total(self) -> int | None:
        if not self.complete:
            return None
        return int(sum(v for v in self.parts.values() if v is not None))


def modelled(model: str, batch_size: int, precision: str, width: int | None = None,
             optimizer: str = "adam") -> Breakdown:
    """The step's memory from the shapes: `labkit.memory.model_state_bytes` in the layout the
    runners use (`labkit.memory.LAYOUT`), `labkit.memory.activation_bytes`, and autocast's weight copies."""
    choice("precision", precision, PRECISIONS)
    model, batch_size, width = check_sizes(model, batch_size, width)
    activations = activation_bytes(model, batch_size, precision, width)
    n, copies, _ = counts(model, width)
    layout = LAYOUT[precision]
    states = model_state_bytes(n, layout, optimizer)
    parts = {k: states[k] for k in ("weights", "master_weights", "gradients", "optimizer_states")}
    parts["weight_copies"] = 2 * copies if layout == "autocast" else 0
    parts["activations"] = activations
    parts["step_temporaries"] = 0
    return Breakdown(parts, "modelled")


def measured(framework: str, mem: dict | MemoryReport) -> Breakdown:
    """Read what a run measured -- its `MemoryReport`, or ``RunResult.memory`` / a bench record's
    ``memory`` (that report's dict) -- into segments."""
    choice("framework", framework, FRAMEWORKS)
    r = mem if isinstance(mem, MemoryReport) else MemoryReport.from_dict(framework, mem)
    if r.framework != framework:
        raise ValueError(f"this MemoryReport is {r.framework!r}'s, not {framework!r}'s")
    if framework == "torch":
        parts = dict(weights=r.parameter_bytes, master_weights=0, gradients=r.gradient_bytes,
                     optimizer_states=r.optimizer_state_bytes, weight_copies=r.saved_weight_copy_bytes,
                     activations=r.saved_activation_bytes, step_temporaries=0)
        note = "" if parts["activations"] is not None else "no step has run: nothing saved for backward yet"
    elif framework == "jax":
        parts = dict(weights=r.parameter_bytes, master_weights=0, gradients=None,
                     optimizer_states=r.optimizer_state_bytes, weight_copies=None, activations=None,
                     step_temporaries=r.step_temp_bytes)
        note = "gradients, activations and casts are inside the compiled step's temporaries"
        if parts["step_temporaries"] is None:
            note = "the step has not been compiled yet: no memory_analysis()"
    else:
        parts = dict(weights=r.parameter_bytes, master_weights=0, gradients=r.gradient_bytes,
                     optimizer_states=r.optimizer_state_bytes, weight_copies=None, activations=None,
                     step_temporaries=0)
        note = "TensorFlow reports no allocator statistics on a CPU: activations not counted"
        if r.peak_bytes is not None:
            note = f"activations are inside the {r.device.upper()} allocator's peak"
    required = ("weights", "optimizer_states") + (("step_temporaries",) if framework == "jax" else
                                                   ("gradients", "activations"))
    complete = all(parts[k] is not None for k in required)
    if not r.to_dict():
        note = "the run reported no memory figures"
    return Breakdown(parts, "measured", complete, r.peak_bytes, note)


def total_bytes(framework: str, mem: dict) -> tuple[int | None, str]:
    """The step's measured memory and where it comes from: the GPU allocator's peak when
    reported, else the sum of the measured parts, else (None, why not)."""
    b = measured(framework, mem)
    if b.peak is not None:
        return b.peak, "allocator peak"
    if b.total is not None:
        return b.total, "sum of measured parts"
    return None, b.note


__all__ = ["LABELS", "SEGMENTS", "Breakdown", "measured", "modelled", "total_bytes"]
