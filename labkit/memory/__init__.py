"""Where training memory goes: model states (the ZeRO count), activations, what a run measured, and figures.

- `labkit.memory.states`: weights, master weights, gradients and optimizer states per parameter,
  in each layout (`LAYOUTS`) and each labkit.train precision (`PRECISIONS`, through `LAYOUT`);
  seed 004's analysis next to it; the low-bit optimizers' states tensor by tensor (`optimizer_state_bytes`).
- `labkit.memory.activations`: what backward keeps, from the model shapes (`labkit.memory.shapes`).
- `labkit.memory.report`: `MemoryReport`, what every stepper's ``memory()`` returns.
- `labkit.memory.breakdown`: a step in seven parts, modelled or measured; `labkit.memory.plots`
  draws and tabulates them.

Needs only numpy (and matplotlib for the figures); it never imports `labkit.train`.

>>> model_state_bytes(1_000_000, "bf16")["total"]
16000000
"""

from labkit.memory.activations import activation_bytes, activation_elements, weight_copy_elements
from labkit.memory.breakdown import LABELS, SEGMENTS, Breakdown, measured, modelled, total_bytes
from labkit.memory.plots import COLORS, batch_figure, difference_table, memory_figure, memory_table
from labkit.memory.report import MemoryReport
from labkit.memory.shapes import check_sizes, param_count, param_shapes
from labkit.memory.states import (LAYOUT, LAYOUTS, OPTIMIZERS, PRECISIONS, QUANTIZED, TORCH_OPTIMIZERS,
                                  layout_of, model_state_bytes, optimizer_state_bytes, optimizer_state_table,
                                  seed004_comparison, seed004_memory_analysis)

__all__ = ["COLORS", "LABELS", "LAYOUT", "LAYOUTS", "OPTIMIZERS", "PRECISIONS", "SEGMENTS", "Breakdown", "MemoryReport",
           "activation_bytes", "activation_elements", "batch_figure", "check_sizes", "difference_table", "layout_of",
           "measured", "memory_figure", "memory_table", "model_state_bytes", "modelled", "optimizer_state_bytes",
           "optimizer_state_table", "param_count", "param_shapes", "QUANTIZED", "TORCH_OPTIMIZERS", "seed004_comparison",
           "seed004_memory_analysis", "total_bytes", "weight_copy_elements"]
