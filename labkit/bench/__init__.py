"""`labkit bench`: step time, throughput and activation memory per framework x precision x model.

Every cell trains the course's real model (the runner's own stepper: model, optimizer, loss
scaler) on synthetic data of the course's shapes, within a time budget (``max_seconds``);
`labkit.bench.runs` says how each is timed. The rest of the room:

- `labkit.bench.plan`: the cells and their sizes (`cells`, `shape_of`), checked before any import;
- `labkit.bench.peaks`: each GPU's dense peaks and a step's FLOPs, for MFU;
- `labkit.bench.records`: the progress line, `table` and `plot` of the records;
- `labkit.bench.matmul`: one big matmul per framework, the hardware's ceiling.
- `labkit.bench.readings`: what the records say in words (`batch_trend`, `shape_cost`), beyond the timing spread.
- `labkit.bench.timing`: calls timed side by side, each call's best time (`time_in_turns`).

>>> cells(["torch"], ["fp32", "bf16"], ["mlp"])[:2]
[('torch', 'mlp', 'aligned', 'fp32'), ('torch', 'mlp', 'aligned', 'bf16')]
"""

from labkit.bench.matmul import MATMUL_FRAMEWORKS, MAX_MATMUL_N, emulation_table, matmul_ms, matmul_table
from labkit.bench.peaks import PEAK_PRECISION, PEAK_TFLOPS, PEAKS, Peak, peak, peak_tflops, peaks_table, train_flops
from labkit.bench.readings import FINDINGS, Reading, batch_trend, shape_cost
from labkit.bench.plan import DEFAULT_BATCH, DEFAULT_WIDTH, MAX_STEPS, MIN_STEPS, SHAPES, SMALL, cells, shape_of
from labkit.bench.records import plot, plot_suffixes, progress_line, table
from labkit.bench.runs import bench
from labkit.bench.timing import time_in_turns

__all__ = ["DEFAULT_BATCH", "DEFAULT_WIDTH", "FINDINGS", "MATMUL_FRAMEWORKS", "MAX_MATMUL_N", "MAX_STEPS", "MIN_STEPS", "PEAKS",
           "PEAK_PRECISION", "PEAK_TFLOPS", "Reading", "SHAPES", "SMALL", "Peak", "batch_trend", "bench", "cells", "emulation_table", "matmul_ms",
           "matmul_table", "peak", "peak_tflops", "peaks_table", "plot", "plot_suffixes", "progress_line", "shape_cost", "shape_of",
           "table", "time_in_turns", "train_flops"]
