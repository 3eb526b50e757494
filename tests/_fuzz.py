"""The engine behind tests/test_public_api_fuzz.py: find every public callable, call it well, then badly.

What is public (found again on every run, so a new public function is fuzzed without a line here):

* ``labkit`` and each of its top-level modules and subpackages (``labkit.formats``, ``labkit.cli``, ...),
  plus every module named in one of their ``__all__`` (``labkit.scaling.fp8``) and every deeper module
  that declares its own ``__all__``;
* in a module with ``__all__``: the names it lists; without one: the names not starting with ``_`` that
  the module itself defines (functions and classes, not constants);
* for each public class: its constructor, and each public method or classmethod it or a labkit base
  class defines (properties and inherited library methods -- ipywidgets' -- are left out).

A module whose top level imports a framework (torch, jax, tensorflow, keras, flax, optax) is not imported
here; it is listed in `skipped_modules()` with that reason (its own tests run it with the framework).

For each callable a *baseline* call is built from known-good values (`GOOD`, keyed by parameter name;
`OVERRIDES`, keyed by callable and parameter; the fields of an example instance for a record class; the
default where there is one). Then each parameter in turn gets each value of `BAD`, the others keeping
their good values. Every call runs with stdout/stderr captured, warnings recorded (not raised), in a
scratch directory, under a `TIME_LIMIT`. The verdicts are in `judge`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import faulthandler
import importlib
import importlib.util
import inspect
import io
import math
import os
import pkgutil
import re
import signal
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import labkit  # noqa: E402
from labkit.table import Table  # noqa: E402

TIME_LIMIT = 3.0
"""Seconds one call may take. A well-behaved function answers a bad value in milliseconds; a call that
runs past this on bad input is a failure (a learner's kernel would hang)."""
BASELINE_TIME_LIMIT = 30.0
"""Seconds the known-good call may take (the smallest real benchmark builds a model first)."""
HARD_LIMIT = 120.0
"""The alarm cannot stop a call stuck inside C code (a huge int printed, a list multiplied by 65536). If one
callable's fuzz still runs after this many seconds, the process ends (`faulthandler`), so that the suite
never hangs: the call that was running and every thread's traceback are in `HANG_FILE`, in the scratch
folder (under pytest: /tmp/pytest-of-$USER/pytest-current/fuzz0/)."""
HANG_FILE = "labkit-fuzz-hang.txt"

FRAMEWORKS = ("torch", "jax", "tensorflow", "keras", "flax", "optax", "jmp", "torchao", "optimi", "bitsandbytes", "gfloat")


# -- values -------------------------------------------------------------------------------------
class Make:
    """A value built fresh for each call (a list the callee may change, a path in the scratch folder)."""

    def __init__(self, build):
        self.build = build

    def __call__(self, ctx):
        return self.build(ctx)


def _value(v, ctx):
    return v(ctx) if isinstance(v, Make) else v


# The shared set of bad values: label -> value. 1e308 * 10 is inf, so "inf" stands for it; a large
# finite float is 1e308.
BAD = {
    "None": None,
    "object()": Make(lambda ctx: object()),
    "'x'": "x",
    "''": "",
    "'no-such-name'": "no-such-name",
    "7 (a number)": 7,
    "True": True,
    "False": False,
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "1e308": 1e308,
    "-1": -1,
    "0": 0,
    "2.5": 2.5,
    "10**400": 10**400,
    "-10**400": -10**400,
    "[]": Make(lambda ctx: []),
    "[1, 2]": Make(lambda ctx: [1, 2]),
    "{'a': 1}": Make(lambda ctx: {"a": 1}),
    "[[1.0], [2.0, 3.0]] (nested, ragged)": Make(lambda ctx: [[1.0], [2.0, 3.0]]),
    "[0.5] * 10**5 (over-long)": Make(lambda ctx: [0.5] * 10**5),
}
LONG = "[0.5] * 10**5 (over-long)"
SHORTER = ("[0.5] * 10**3 (a long list)", Make(lambda ctx: [0.5] * 10**3))
"""Where the good value is not a sequence, the over-long list is a wrong type whatever its length, so it is
10**3 long there: its repr costs a tenth of a second at 10**5 (in a thousand calls), and code that
multiplies a number by it (``loss * scale``) builds a list `scale` times longer (5 GB at 10**4)."""
MESSAGE_MAX = 1000
"""Characters a message may have: one that prints a whole over-long value (not `labkit._validate.shown`)
is not one a learner can read."""
QUICK = ("None", "object()", "''", "'no-such-name'", "7 (a number)", "True", "nan", "-1", "0", "2.5", "10**400", "[]",
         LONG)
"""The values a *heavy* callable gets: one of each kind (`BAD` less its near-twins 'x', False, inf, -inf, 1e308,
-10**400, [1, 2], the dict and the nested list), so that the whole fuzz stays near a minute on two cores."""
HEAVY = re.compile(r"(\.plot\w*|_figure|^labkit\.widgets\.[A-Za-z]+|^labkit\.bench\.(bench|matmul_ms|emulation_table)|"
                   r"^labkit\.scaling\.record_gradients)$")
"""Callables that draw a figure, build a widget, or run a model or a timer: each call takes 0.1-1 s."""
UNKNOWN_KEYWORD = "no_such_option"
"""Given to every ``**options`` parameter: it must be refused, naming itself."""

# -- the parameters that mean a size or a count -------------------------------------------------
COUNT = re.compile(r"^(n|n_\w+|\w+_size|size|width|hidden|steps|bins|limit|repeats|number|count|every|length|"
                   r"period|warmup|devices|dpi|digits|index|total|hysteresis|\w+_interval|\w+_window|\w+_steps|"
                   r"\w+_len|model_size|scale_window|max_consecutive_errors)$")
"""A parameter with such a name given 0, a negative, a fraction, nan or a bool must be refused: returning
is a silent wrong result. `COUNT_OK` lists the (callable, parameter, value) where such a value is right."""
COUNT_SILENT = ("0", "-1", "-10**400", "2.5", "nan", "True", "False", "-inf")

COUNT_OK = {
    ("labkit.memory.model_state_bytes", "n_params", "0"): "no parameters take no bytes (documented: n_params >= 0)",
    ("labkit.bench.bench", "warmup", "0"): "no untimed warm-up steps is a valid choice",
    ("labkit.bench.progress_line", "index", "0"): "the first cell has index 0",
    ("labkit.scaling.OptaxApplyIfFinite", "max_consecutive_errors", "0"):
        "optax.apply_if_finite(max_consecutive_errors=0) is valid: no non-finite update is skipped",
    ("labkit.scaling.OptaxApplyIfFinite.create", "max_consecutive_errors", "0"):
        "optax.apply_if_finite(max_consecutive_errors=0) is valid: no non-finite update is skipped",
}

# Exceptions a callable may raise for bad input, besides ValueError/TypeError: {callable: (type, reason)}.
OTHER_ALLOWED = {
    "labkit.cli.main": (SystemExit, "a bad command line is refused as argparse does: the usage on stderr "
                                    "and exit status 2"),
}


# -- good values --------------------------------------------------------------------------------
def _records(ctx=None):
    """Two bench records from the stored evidence: torch mlp in fp32 and in bf16 (one pair of runs)."""
    from labkit import evidence

    recs = [dict(r) for r in evidence.stored()[0].records if r["framework"] == "torch"]
    return [next(r for r in recs if r["precision"] == p) for p in ("fp32", "bf16")]


def _stored_path(ctx=None):
    from labkit import evidence

    return str(sorted(evidence.STORED.glob("*.json"))[0])


def _config(**kw):
    from labkit.train import RunConfig

    return RunConfig("torch", progress=False, **kw)


def _result(ctx=None):
    from labkit.train import RunResult

    return RunResult(_config(steps=2), losses=[2.3, 2.2], step_times=[0.01, 0.01], grad_norms=[1.0, 0.9],
                     scales=[1.0, 1.0], skipped=[False, False], status="ok", device="cpu")


def _result_file(ctx):
    """A run log as a run writes it (see labkit/train/result.py): a header line, a start line, a step."""
    import json

    path = ctx.tmp / "run.jsonl"
    lines = [{"kind": "header", "config": _config(steps=1).to_dict(), "labkit": labkit.__version__},
             {"kind": "start", "device": "cpu"},
             {"kind": "step", "step": 0, "loss": 2.3, "time": 0.01, "scale": None, "skipped": False, "grad_norm": 1.0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _torch_optimizer(ctx=None):
    import torch

    return torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)


def _report(name="T4"):
    from labkit import hardware

    return hardware.example_report(name)


def _fp8_traces(ctx=None):
    from labkit import scaling

    return {"current": scaling.current_scaling([np.full(4, 0.5), np.full(4, 2.0)])}


def _sharded(ctx=None, **extra):
    """A 2-device torch run's result as the engines record it: FSDP2 with its all-gathers, or (with extra) ZeRO."""
    from labkit.train import RunResult

    kw = dict(devices=2, parallel="fsdp", steps=2)
    if "zero_stage" in extra:
        kw.update(parallel="zero2", precision="bf16")
    base = {"collectives": [{"op": "allgather_into_tensor", "dtype": "bf16", "elements": 8, "bytes": 16}],
            "comm_bytes_per_step": 16, "sharding": [], "compute_dtypes": {}}
    return RunResult(_config(**kw), losses=[2.3, 2.2], step_times=[0.01, 0.01], status="ok", device="cpu",
                     extra={**base, **extra})


def _zero_run(ctx=None):
    rank = {"parameter_bytes": 100, "master_weight_bytes": 100, "optimizer_state_bytes": 200}
    return _sharded(zero_stage=2, world_size=2, memory_by_rank=[dict(rank), dict(rank)])


def _grads(ctx=None):
    return {"w": np.array([1e-3, 2e-8, 0.0, 4.0])}


def _subparsers(ctx=None):
    return argparse.ArgumentParser().add_subparsers()


GOOD = {
    # formats
    "fmt": "fp16", "format": "fp16", "name": "fp16", "names": ["fp16", "bf16"], "formats": ["fp16", "bf16"],
    "x": 0.1, "value": 0.1, "values": Make(lambda ctx: [1e-3, 0.5, 2.0]), "bits": 0x3C00, "lo": 0.5, "hi": 2.0,
    "logits": Make(lambda ctx: [1.0, 2.0, 0.5]), "target": 1, "compute": "fp32", "accumulator": "fp32",
    "acc": Make(lambda ctx: __import__("labkit.formats", fromlist=["x"]).compare_accumulation([0.01] * 8)),
    # models, precisions, frameworks
    "model": "mlp", "batch_size": 8, "width": 16, "precision": "fp32", "precisions": ("fp32", "bf16"),
    "framework": "torch", "frameworks": ("torch",), "models": ("mlp",), "optimizer": "adam", "n_params": 1000,
    "model_size": 1000, "shape": "aligned", "device": "cpu", "n": 32,
    # scaling
    "preset": "torch", "overflows": Make(lambda ctx: [False, True, False]), "init_scale": 1024.0,
    "growth_interval": 10, "finite": True, "kind": "every", "amax": Make(lambda ctx: [1.0, 2.0, 0.5]),
    "tensors": Make(lambda ctx: [np.full(4, 0.5), np.full(4, 2.0)]), "scale": 1.0,
    "activations": Make(lambda ctx: [np.full(4, 0.5), np.full(4, 2.0)]),
    "gradients": Make(lambda ctx: [np.full(4, 1e-3), np.full(4, 2e-3)]),
    "traces": Make(_fp8_traces), "config": Make(lambda ctx: {"fp16": {"enabled": True}}),
    "overflow": False, "loss": 1.0,
    # records and results
    "records": Make(_records), "rec": Make(lambda ctx: _records()[0]), "results": Make(lambda ctx: [_result()]),
    "configs": Make(lambda ctx: [_config(steps=1)]),
    "mem": Make(lambda ctx: dict(_records()[0]["memory"])), "ms": {("torch", "float32"): 1.0,
                                                                  ("torch", "bfloat16"): 2.0},
    "text": "", "environ": Make(lambda ctx: {}), "caps": Make(lambda ctx: {}), "report": Make(lambda ctx: _report()),
    "gpu_type": "A100", "training_type": "training", "flag": "avx2",
    # checks and claims
    "claim": "x", "holds": True, "limit": 1.0, "reference": 0.1, "expected": 0.1, "checks": Make(
        lambda ctx: [__import__("labkit.checks", fromlist=["x"]).that("x", True)]),
    # evidence, files
    "doc": Make(lambda ctx: __import__("labkit.evidence", fromlist=["x"]).document(
        "bench", [], command="labkit bench", complete=True, machine={"system": "Linux", "cpu": "x"})),
    "path": Make(lambda ctx: str(ctx.tmp / "out.json")), "command": "labkit bench",
    "complete": True, "notebook": "00_start_here.ipynb",
    # cli
    "subparsers": Make(_subparsers), "argv": Make(lambda ctx: ["doctor", "--frameworks", "none"]),
    "args": Make(lambda ctx: argparse.Namespace(frameworks=(), json=False)),
    "rows": Make(lambda ctx: [{"a": 1, "b": "x"}]),
}

OVERRIDES = {
    # a name means a different thing in each of these
    ("labkit.scaling.get_preset", "name"): "torch",
    ("labkit.train.torch.clinic.case", "name"): "fp16-params",
    ("labkit.train.logs.logger_level", "loggers"): "labkit.fuzz",
    ("labkit.hardware.example_report", "name"): "T4",
    ("labkit.hardware.HardwareReport.framework", "name"): "torch",
    ("labkit.hardware.Advice.for_framework", "name"): "torch",
    ("labkit.bench.Peak", "chip"): "T4",
    ("labkit.bench.Peak", "pattern"): r"\bT4\b",
    ("labkit.bench.Peak", "tflops"): Make(lambda ctx: {"fp16": 65.0}),
    ("labkit.train.jax.hlo.Collective", "op"): "all-reduce",
    ("labkit.train.jax.hlo.Collective", "dtype"): "f32",
    ("labkit.train.jax.hlo.Collective", "shape"): (4,),
    ("labkit.train.jax.hlo.Collective", "bytes"): 16,
    ("labkit.train.jax.hlo.collectives", "program"): "%ar = f32[4]{0} all-reduce(%g), to_apply=%add",
    ("labkit.train.jax.hlo.hlo_text", "program"): "%ar = f32[4]{0} all-reduce(%g), to_apply=%add",
    ("labkit.train.jax.hlo.hlo_summary", "hlo_text"): "%d = f32[4,4]{1,0} dot(%a, %b)",
    ("labkit.train.jax.hlo.total_bytes", "found"): Make(lambda ctx: []),
    ("labkit.bench.Peak", "source"): "https://www.nvidia.com/",
    ("labkit.claims.get", "claim"): "speed",
    ("labkit.claims.verdict", "claim"): "speed",
    ("labkit.claims.claim_checks", "claims"): ["speed"],
    ("labkit.hardware.FrameworkInfo", "name"): "torch",
    ("labkit.hardware.GPUInfo", "name"): "NVIDIA A100",
    ("labkit.hardware.capability_from_name", "name"): "NVIDIA A100-SXM4-40GB",
    ("labkit.hardware.parse_capability", "value"): "8.0",
    ("labkit.hardware.advice_table", "names"): ["T4", "A100"],
    ("labkit.evidence.document", "kind"): "bench",
    ("labkit.evidence.document", "records"): Make(lambda ctx: []),
    ("labkit.evidence.document", "machine"): Make(lambda ctx: {"system": "Linux", "cpu": "x"}),
    ("labkit.evidence.load", "path"): Make(_stored_path),
    ("labkit.evidence.stored", "folder"): None,
    ("labkit.bench.plot", "path"): Make(lambda ctx: str(ctx.tmp / "bench.png")),
    ("labkit.bench.peak_tflops", "device"): "cuda (NVIDIA H100 80GB HBM3)",
    ("labkit.bench.shape_of", "batch_size"): 8,
    ("labkit.scaling.overflow_pattern", "steps"): 20,
    ("labkit.scaling.overflow_pattern", "every"): 5,
    ("labkit.scaling.simulate_closed_loop", "amax"): Make(lambda ctx: [1.0, 2.0, 0.5]),
    ("labkit.scaling.fp8.cast", "x"): Make(lambda ctx: [1.0, 2.0]),
    ("labkit.scaling.fp8.cast", "fmt"): "fp8_e4m3",
    ("labkit.scaling.fp8.current_scale", "amax"): 2.0,
    ("labkit.scaling.fp8.current_scale", "fmt"): "fp8_e4m3",
    ("labkit.scaling.plot_fp8", "traces"): Make(_fp8_traces),
    ("labkit.scaling.recipes.evaluate", "recipe"): "tiles",
    ("labkit.scaling.recipes.scales_for", "recipe"): "rowwise",
    ("labkit.scaling.recipes.plant_outlier", "x"): Make(lambda ctx: np.array([[1.0, -2.0], [0.0, 3.0]], np.float32)),
    ("labkit.formats.gemm.fp8_matmul", "a"): Make(lambda ctx: np.ones((2, 3))),
    ("labkit.formats.gemm.fp8_matmul", "b"): Make(lambda ctx: np.ones((3, 2))),
    ("labkit.formats.gemm.sweep", "ks"): (128, 256),  # the default sweep to 16384 takes a second a call
    ("labkit.formats.gemm.accumulation_error", "ks"): (128, 256),
    ("labkit.formats.gemm.plot_accumulation_error", "ks"): (128, 256),
    ("labkit.scaling.traces_table", "traces"): Make(
        lambda ctx: [__import__("labkit.scaling", fromlist=["x"]).simulate("torch", [False, True])]),
    ("labkit.scaling.plot_traces", "traces"): Make(
        lambda ctx: [__import__("labkit.scaling", fromlist=["x"]).simulate("torch", [False, True])]),
    ("labkit.scaling.seed004_vs_gradscaler", "overflows"): Make(lambda ctx: [False, True, False]),
    ("labkit.scaling.record_gradients", "steps"): 3,
    ("labkit.scaling.record_gradients", "batch_size"): 8,
    ("labkit.scaling.record_gradients", "hidden"): 8,
    ("labkit.scaling.seeds.DynamicLossScaler.unscale_gradients", "optimizer"): Make(_torch_optimizer),
    ("labkit.scaling.OptaxApplyIfFinite", "max_consecutive_errors"): 0,  # required, as in optax
    ("labkit.scaling.OptaxApplyIfFinite.create", "max_consecutive_errors"): 0,
    ("labkit.table.Table.column", "name"): "a",
    ("labkit.formats.plot_values", "names"): ("fp8_e4m3", "fp8_e5m2"),
    ("labkit.cli.main", "argv"): Make(lambda ctx: ["doctor", "--frameworks", "none"]),
    ("labkit.train.RunConfig", "progress"): False,
    ("labkit.train.RunConfig.from_dict", "d"): Make(lambda ctx: _config().to_dict()),
    ("labkit.train.RunResult.from_json", "text"): Make(lambda ctx: _result().to_json()),
    ("labkit.train.RunResult.load", "path"): Make(_result_file),
    ("labkit.train.launch.check_engine", "config"): Make(lambda ctx: _config(devices=2)),
    ("labkit.train.launch.check_engine", "name"): "torch",
    ("labkit.hardware.detect", "frameworks"): (),
    ("labkit.hardware.native_precision", "report"): Make(lambda ctx: _report("A100")),
    ("labkit.hardware.native_table", "report"): Make(lambda ctx: _report("A100")),
    ("labkit.hardware.Ceiling.exceeded_by", "ratio"): 1.5,
    ("labkit.widgets.FormatExplorer.bit_button", "index"): 0,
    ("labkit.widgets.BlockExplorer", "format"): "mxfp8_e4m3",
    ("labkit.widgets.LossScaleExplorer", "values"): Make(lambda ctx: [1e-3, 0.5, 2.0]),
    # the benchmarks: the smallest real run, so a bad value that slips through costs little
    ("labkit.bench.bench", "steps"): 1,
    ("labkit.bench.bench", "warmup"): 0,
    ("labkit.bench.bench", "precisions"): ("fp32",),
    ("labkit.bench.bench", "batch_size"): 8,
    ("labkit.bench.bench", "width"): 16,
    ("labkit.bench.bench", "max_seconds"): 1.0,
    ("labkit.bench.matmul_ms", "n"): 16,
    ("labkit.bench.matmul_ms", "frameworks"): ("torch",),
    ("labkit.bench.matmul_ms", "repeats"): 1,
    ("labkit.bench.matmul_ms", "number"): 1,
    ("labkit.bench.time_in_turns", "calls"): Make(lambda ctx: [lambda: None, lambda: None]),
    ("labkit.bench.emulation_table", "frameworks"): ("torch",),
    ("labkit.bench.emulation_table", "n"): 16,
    ("labkit.bench.emulation_table", "max_seconds"): 1.0,
    ("labkit.checks.close", "rel"): 0.1,
    ("labkit.memory.optimizer_state_bytes", "shapes"): Make(lambda ctx: [(64, 16), (16,)]),
    ("labkit.memory.optimizer_state_table", "shapes"): Make(lambda ctx: [(64, 16), (16,)]),
    # labkit.train: its lessons, data, models and reports
    ("labkit.train.gradient_error", "grads"): Make(lambda ctx: {"w": np.array([1e-3, 0.0, 0.0, 4.0])}),
    ("labkit.train.gradient_error", "reference"): Make(_grads),
    ("labkit.train.gradient_error_table", "results"): Make(lambda ctx: {"fp16": __import__(
        "labkit.train", fromlist=["x"]).gradient_error({"w": np.array([1e-3, 0.0, 0.0, 4.0])}, _grads(), "fp16")}),
    ("labkit.train.moved_fraction", "config"): Make(lambda ctx: _config(width=16)),  # warm: 5 s, then 0.2 s a call
    ("labkit.train.moved_fraction", "steps"): 1,
    ("labkit.train.data.batches", "data"): Make(lambda ctx: __import__("labkit.train.data", fromlist=["x"]).load()),
    ("labkit.train.data.Dataset.tokens", "x"): Make(lambda ctx: np.array([[0.0, 0.5, 1.0]], np.float32)),
    ("labkit.train.models.count_params", "params"): Make(
        lambda ctx: __import__("labkit.train.models", fromlist=["x"]).init_params("mlp", width=8)),
    ("labkit.train.models.reference_logits", "params"): Make(
        lambda ctx: __import__("labkit.train.models", fromlist=["x"]).init_params("mlp", width=8)),
    ("labkit.train.models.reference_logits", "x"): Make(lambda ctx: np.full((2, 64), 0.5, np.float32)),
    ("labkit.train.report.gathered", "result"): Make(_sharded),
    ("labkit.train.report.gather_table", "results"): Make(lambda ctx: {"fsdp": _sharded()}),
    ("labkit.train.report.step_time_table", "results"): Make(lambda ctx: {"fsdp": _sharded()}),
    ("labkit.train.report.zero_memory_table", "result"): Make(_zero_run),
    ("labkit.train.report.loss_gap", "a"): Make(lambda ctx: _result()),
    ("labkit.train.report.loss_gap", "b"): Make(lambda ctx: _result()),
    ("labkit.train.torch.deepspeed_config.engine_config", "config"): Make(lambda ctx: _zero_run().config),
    ("labkit.train.torch.deepspeed_config.zero_memory", "ranks"): 2,
    ("labkit.train.torch.deepspeed_config.zero_memory", "stage"): 2,
    ("labkit.train.torch.distributed.check", "config"): Make(lambda ctx: _config(devices=2)),
    ("labkit.train.torch.distributed.compare", "config"): Make(lambda ctx: _config(devices=2)),
    ("labkit.train.torch.distributed.collectives_table", "result"): Make(_sharded),
    ("labkit.train.torch.distributed.sharding_table", "result"): Make(_sharded),
    ("labkit.train.torch.distributed.skip_table", "result"): Make(_sharded),
    ("labkit.widgets.explorer_view", "entry"): "0x3c00",  # the function labkit.widgets exports
    # labkit.formats.blocks: one block of 32 values, block formats by their names
    ("labkit.formats.blocks.quantize", "x"): Make(lambda ctx: np.linspace(-1, 1, 32)),
    ("labkit.formats.blocks.quantize", "format"): "mxfp4",
    ("labkit.formats.blocks.rms_relative_error", "x"): Make(lambda ctx: np.linspace(-1, 1, 32)),
    ("labkit.formats.blocks.rms_relative_error", "format"): "mxfp4",
    ("labkit.formats.blocks.block_table", "x"): Make(lambda ctx: [500.0] + [1.0] * 31),
    ("labkit.formats.blocks.block_table", "format"): "mxfp8_e4m3",
    ("labkit.formats.blocks.error_table", "x"): Make(lambda ctx: np.linspace(-1, 1, 64)),
    ("labkit.formats.blocks.error_table", "formats"): ["mxfp4", "nvfp4"],
    ("labkit.formats.blocks.outlier_table", "amax"): 500.0,
    ("labkit.formats.blocks.outlier_table", "format"): "mxfp8_e4m3",
    ("labkit.formats.blocks.get_format", "name"): "mxfp4",
    ("labkit.formats.blocks.tensor_scale_from_amax", "amax"): 2688.0,
    # exercises: an id and an answer of its kind
    ("labkit.exercises.check", "exercise_id"): "bf16_of_257", ("labkit.exercises.check", "answer"): 258,
    ("labkit.exercises.show", "exercise_id"): "bf16_of_257", ("labkit.exercises.get", "exercise_id"): "bf16_of_257",
    ("labkit.exercises.Exercise.judge", "answer"): 258, ("labkit.exercises.Exercise.is_right", "answer"): 256.0,
    ("labkit.exercises.Exercise.is_right", "key"): 256.0, ("labkit.exercises.Hint.message", "answer"): 257.0,
    ("labkit.exercises.Hint.message", "key"): 256.0, ("labkit.exercises.mx_dequantize", "amax"): 500.0,
    ("labkit.exercises.mx_dequantize", "x"): 500.0, ("labkit.exercises.exercises", "notebook"): "01",
    # register is BAD_ONLY (it must not add to the registry): only bad values reach it, this one is never passed
    ("labkit.exercises.register", "exercise"): Make(lambda ctx: __import__("labkit.exercises", fromlist=["x"]).get(
        "bf16_of_257")),
}


def _clinic():
    return importlib.import_module("labkit.train.torch.clinic")


def _instances():
    """An example instance of each public class, for its methods and, for a record, its constructor."""
    from labkit import checks, claims, evidence, hardware, memory, scaling, train, widgets
    from labkit import formats as lf

    report = _report("T4")
    return {
        "labkit.formats.FloatFormat": lambda: lf.get("fp16"),
        "labkit.table.Table": lambda: Table(("a", "b"), (("1", "2"),), "t"),
        "labkit.train.torch.clinic.Entry": lambda: _clinic().case("fp16-params"),
        "labkit.train.torch.clinic.Case": lambda: _clinic().Case("x", "t()", "ValueError: x", "f()", "ok", "because"),
        "labkit.train.torch.clinic.AutocastSpeed": lambda: _clinic().AutocastSpeed("bf16", 8, 1.0, 2.0, False, "x"),
        "labkit.formats.Representation": lambda: lf.represent(0.1, "fp16"),
        "labkit.formats.Accumulation": lambda: lf.compare_accumulation([0.01] * 8, "bf16", "fp32"),
        "labkit.hardware.HardwareReport": lambda: report,
        "labkit.hardware.CPUInfo": lambda: report.cpu,
        "labkit.hardware.GPUInfo": lambda: report.gpus[0],
        "labkit.hardware.TPUInfo": lambda: _report("tpu").tpus[0],
        "labkit.hardware.FrameworkInfo": lambda: hardware.FrameworkInfo("torch"),
        "labkit.hardware.Advice": lambda: hardware.advise(report),
        "labkit.hardware.Native": lambda: hardware.native_precision("torch", "bf16", _report("A100")),
        "labkit.hardware.Ceiling": lambda: hardware.speedup_ceiling("torch", "bf16", _report("A100")),
        "labkit.bench.Reading": lambda: importlib.import_module("labkit.bench").batch_trend([]),
        "labkit.checks.Check": lambda: checks.that("x", True),
        "labkit.checks.Report": lambda: checks.report(checks.that("x", True)),
        "labkit.claims.Claim": lambda: claims.get("speed"),
        "labkit.claims.Verdict": lambda: claims.Verdict(1.0, "x", True),
        "labkit.evidence.Evidence": lambda: evidence.stored()[0],
        "labkit.memory.Breakdown": lambda: memory.modelled("mlp", 8, "fp32"),
        "labkit.memory.MemoryReport": lambda: memory.MemoryReport("torch", parameter_bytes=4, optimizer_state_bytes=8),
        "labkit.scaling.Preset": lambda: scaling.get_preset("torch"),
        "labkit.scaling.Trace": lambda: scaling.simulate("torch", [False, True]),
        "labkit.scaling.Fractions": lambda: scaling.fractions([1e-3, 1.0], "fp16"),
        "labkit.scaling.ScaleRange": lambda: scaling.safe_scale_range([1e-3, 1.0], "fp16"),
        "labkit.scaling.GradientRecord": lambda: scaling.record_gradients(3, batch_size=8, hidden=8),
        "labkit.scaling.fp8.Fp8Trace": lambda: _fp8_traces()["current"],
        "labkit.scaling.seeds.DynamicLossScaler": lambda: scaling.seeds.DynamicLossScaler(),
        "labkit.train.RunConfig": lambda: _config(),
        "labkit.exercises.Exercise": lambda: __import__("labkit.exercises", fromlist=["x"]).get("bf16_of_257"),
        "labkit.exercises.Feedback": lambda: __import__("labkit.exercises", fromlist=["x"]).check("bf16_of_257", 258),
        "labkit.exercises.Hint": lambda: __import__("labkit.exercises", fromlist=["x"]).get("bf16_of_257").hints[1],
        "labkit.train.RunResult": lambda: _result(),
        "labkit.train.StepOut": lambda: train.StepOut(1.0, 0.5),
        "labkit.widgets.FormatExplorer": lambda: widgets.FormatExplorer(),
        "labkit.widgets.LossScaleExplorer": lambda: widgets.LossScaleExplorer([1e-3, 0.5, 2.0]),
        "labkit.widgets.ScalerPlayground": lambda: widgets.ScalerPlayground(),
        "labkit.train.lessons.NanHunt": lambda: __import__("labkit.train.lessons", fromlist=["x"]).NanHunt(
            "jax", "jax_debug_nans", "jnp.log(-1.0)", "FloatingPointError", "invalid value (nan) encountered in log",
            "invalid value (nan) encountered in log", "log", "", "returns nan"),
        "labkit.train.GradientError": lambda: train.gradient_error(_grads(), _grads(), "fp16"),
        "labkit.train.data.Dataset": lambda: __import__("labkit.train.data", fromlist=["x"]).load(),
        "labkit.scaling.recipes.RecipeResult": lambda: scaling.recipes.evaluate([np.ones((2, 128), np.float32)],
                                                                                "current"),
        "labkit.widgets.BlockExplorer": lambda: widgets.BlockExplorer(),
        "labkit.formats.blocks.BlockFormat": lambda: __import__("labkit.formats.blocks", fromlist=["x"]).FORMATS["mxfp4"],
        "labkit.formats.blocks.BlockTensor": lambda: __import__("labkit.formats.blocks", fromlist=["x"]).quantize(np.linspace(-1, 1, 32), "nvfp4",
                                                                        tensor_scale="amax"),
    }


# -- what is not called, or called with bad values only -----------------------------------------
NOT_CALLED = {
    "labkit.scaling.ScalerStopped": "an exception class: its constructor takes any message",
    "labkit.train.RunFailed": "an exception class: its constructor takes any message and result",
    "labkit.train.torch.distributed.run": "launches torchrun workers for a good config with any valid timeout_s (the "
                                          "bad set's 7 and 2.5 are valid): labkit.train.launch.run_distributed, its "
                                          "public entry, is fuzzed (bad values only); tests/distributed/"
                                          "test_torch_dist.py runs it",
}
BAD_ONLY = {
    "labkit.train.run": "a good call trains a model (seconds to minutes): only bad values, each of which must "
                        "be refused before anything starts",
    "labkit.train.run_in_turns": "a good call trains models (seconds to minutes): only bad values, each of which "
                                 "must be refused before anything starts",
    "labkit.train.launch.run_distributed": "a good call launches torchrun / a device mesh: only bad values, each of which must "
                              "be refused before anything starts",
    "labkit.cli.run_bench": "a good call runs the benchmark: only bad values, each of which must be refused "
                            "before anything starts",
    "labkit.train.torch.distributed.compare": "a good call trains three runs (one on torchrun workers): only bad "
                                              "values, each of which must be refused before anything starts",
    "labkit.scaling.keras_scale_to_zero": "a good call imports TensorFlow and runs 143 real optimizer steps: only bad "
                                          "values, each of which must be refused before anything starts",
    "labkit.exercises.register": "a good call adds an exercise to the registry that every notebook and the "
                                 "solutions test read: only bad values, each of which must be refused",
}


# -- discovery ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Target:
    id: str            # "labkit.formats.get", "labkit.formats.FloatFormat" (constructor), "...FloatFormat.round"
    module: str        # the public module it is reached from
    kind: str          # "function", "constructor", "method", "classmethod"
    obj: object        # the function or class
    owner: type | None = None
    method: str | None = None


def _imports_framework(spec) -> bool:
    """Does the module's own top level import a framework? (read from its source, without importing it)"""
    try:
        tree = ast.parse(Path(spec.origin).read_text())
    except (OSError, SyntaxError, TypeError):
        return False
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        if any(n.split(".")[0] in FRAMEWORKS for n in names):
            return True
    return False


def _declares_all(spec) -> bool:
    try:
        return "__all__" in Path(spec.origin).read_text()
    except (OSError, TypeError):
        return False


NOT_WALKED = {
    "labkit.train.jax": "the JAX/Flax room: its names take JAX arrays, Flax trees, meshes and compiled programs; "
                        "tests/train/test_jax_*.py and tests/distributed/test_jax_dist.py run them with JAX",
    "labkit.train.torch": "the PyTorch room: every module in it imports torch (its __init__ through them), and "
                          "tests/train/test_torch_*.py and tests/distributed/test_{torch_dist,deepspeed_run}.py run "
                          "it with torch",
    "labkit.train.torch.recipe": "the AMP recipe, run for real: every module in it imports torch (its __init__ "
                                 "through them), a good call trains, checkpoints or compiles (seconds); "
                                 "tests/train/test_torch_recipe.py runs it with torch, bad values included",
    "labkit.train.tf": "the TensorFlow room: every module in it imports TensorFlow (its __init__ through them), "
                       "and tests/train/test_tf_*.py and tests/distributed/test_tf_dist.py run it with TensorFlow",
    "labkit.train.tf.stepper": "the TensorFlow stepper: a good TFStepper builds a Keras model and traces its step "
                               "(seconds per instance); tests/train/test_tf_*.py run it with TensorFlow",
    "labkit.train.tf.lessons": "the TensorFlow lessons: their names take Keras models, switch global policies and "
                               "train real runs; tests/train/test_tf_extras.py runs them with TensorFlow",
    "labkit.train.tf.fit": "seed 003's Keras code through model.fit(): a good call trains a Keras model and switches "
                           "global policies and set_jit; tests/train/test_tf_fit.py runs it with TensorFlow",
    "labkit.train.tf.nans": "NaN hunting with tf.debugging.enable_check_numerics(), a process-wide switch; "
                            "tests/train/test_nan_hunting.py runs it with TensorFlow",
    "labkit.train.tf.distributed": "the TensorFlow distributed engine: a good call starts a MirroredStrategy "
                                   "subprocess and its names take traced TensorFlow graphs and steppers; "
                                   "tests/distributed/test_tf_dist.py runs them with TensorFlow",
}
"""Modules that declare an __all__ but are not fuzzed here, with the reason."""

_SKIPPED_MODULES: dict[str, str] = {}


def public_modules() -> list[str]:
    """labkit, its top-level modules, the modules their __all__ names, and deeper modules with an __all__."""
    found = ["labkit"] + [f"labkit.{m.name}" for m in pkgutil.iter_modules(labkit.__path__)
                          if not m.name.startswith("_")]
    for info in pkgutil.walk_packages(labkit.__path__, "labkit."):
        parts = info.name.split(".")
        if info.name in found or any(p.startswith("_") for p in parts):
            continue
        spec = importlib.util.find_spec(info.name)
        if _declares_all(spec):
            found.append(info.name)
    out, seen = [], set()
    while found:
        name = found.pop(0)
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        if name in NOT_WALKED:
            _SKIPPED_MODULES[name] = NOT_WALKED[name]
            continue
        if _imports_framework(spec):
            _SKIPPED_MODULES[name] = "imports a framework at its top level; its own tests run it with the framework"
            continue
        out.append(name)
        mod = importlib.import_module(name)
        for attr in getattr(mod, "__all__", ()):
            v = getattr(mod, attr, None)
            if inspect.ismodule(v) and v.__name__.startswith("labkit."):
                found.append(v.__name__)
    return out


def skipped_modules() -> dict[str, str]:
    public_modules()
    return dict(_SKIPPED_MODULES)


def _public_names(mod) -> list[str]:
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return [k for k, v in vars(mod).items() if not k.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == mod.__name__]


def _methods(cls):
    """Public methods and classmethods that cls or a labkit base of it defines: name -> kind."""
    out = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("labkit"):
            continue
        for name, v in vars(base).items():
            if name.startswith("_"):
                continue
            if isinstance(v, (classmethod, staticmethod)):
                out[name] = "classmethod"
            elif inspect.isfunction(v):
                out[name] = "method"
    return out


def discover() -> list[Target]:
    """Every public callable, once each, under the first public name that reaches it."""
    targets, seen = [], set()
    for modname in public_modules():
        mod = importlib.import_module(modname)
        for name in _public_names(mod):
            v = getattr(mod, name)
            if inspect.ismodule(v) or not callable(v) or id(v) in seen:
                continue
            seen.add(id(v))
            tid = f"{modname}.{name}"
            if inspect.isclass(v):
                targets.append(Target(tid, modname, "constructor", v))
                for meth, kind in _methods(v).items():
                    targets.append(Target(f"{tid}.{meth}", modname, kind, v, owner=v, method=meth))
            else:
                targets.append(Target(tid, modname, "function", v))
    return targets


# -- calling ------------------------------------------------------------------------------------
class TookTooLong(BaseException):
    """Raised by the timer: a BaseException, so that no `except Exception` in the callee swallows it."""


WARM = ("torch", "sklearn.datasets")
"""Imported once before any call (outside the clock): a good call needs them (bench, the torch GradScaler,
record_gradients' digits), and an import cut short by the timer would leave a broken module behind."""


class Ctx:
    def __init__(self, tmp: Path):
        self.tmp = Path(tmp)
        self._instances = None
        self._made = {}
        for name in WARM:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

    def instance(self, cls_id: str, cls=None):
        """The example instance of a class: from `_instances()`, else its constructor's baseline call."""
        if self._instances is None:
            self._instances = _instances()
        if cls_id not in self._made:
            if cls_id in self._instances:
                make, args, kwargs = self._instances[cls_id], (), {}
            else:
                plan = Plan(Target(cls_id, "", "constructor", cls), self)
                if plan.skip:
                    raise LookupError(f"no example instance of {cls_id}: {plan.skip}")
                make, (args, kwargs) = cls, plan.build()
            made, exc, _, _ = call(make, args, kwargs, self, BASELINE_TIME_LIMIT)
            if exc is not None:
                raise exc
            self._made[cls_id] = made
        return self._made[cls_id]

    def has_instance(self, cls_id: str) -> bool:
        if self._instances is None:
            self._instances = _instances()
        return cls_id in self._instances


@contextlib.contextmanager
def _guarded(ctx, limit):
    """Scratch cwd, captured output, recorded warnings, no plt.show, no sys.argv of ours, and a clock."""
    old_cwd, old_argv, old_show = os.getcwd(), sys.argv, plt.show
    os.chdir(ctx.tmp)
    sys.argv = ["labkit"]
    plt.show = lambda *a, **k: None
    out = io.StringIO()

    def alarm(signum, frame):
        raise TookTooLong(f"took more than {limit:g} s")

    old_handler = signal.signal(signal.SIGALRM, alarm)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(out):
            warnings.simplefilter("always")
            yield caught
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        plt.show = old_show
        plt.close("all")
        sys.argv = old_argv
        os.chdir(old_cwd)


_hang = None


def _arm(target_id: str, ctx) -> None:
    """Arm the hard stop for one callable's whole fuzz."""
    global _hang
    path = str(ctx.tmp / HANG_FILE)
    if _hang is None or _hang.name != path:
        if _hang is not None:
            _hang.close()
        _hang = open(path, "w")  # noqa: SIM115 - kept open for faulthandler
    _note(target_id)
    faulthandler.dump_traceback_later(HARD_LIMIT, exit=True, file=_hang)


def _note(what: str) -> None:
    """Say in `HANG_FILE` which call runs now (faulthandler appends the tracebacks after it)."""
    _hang.seek(0)
    _hang.truncate()
    _hang.write(f"labkit fuzz: stopped after {HARD_LIMIT:g} s on one callable; the call running was\n  {what}\n")
    _hang.flush()


def call(fn, args, kwargs, ctx, limit=TIME_LIMIT):
    """(result, exception, seconds, warnings): the call's outcome, never raising."""
    start = time.perf_counter()
    result = exc = None
    with _guarded(ctx, limit) as caught:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            result = fn(*args, **kwargs)
        except (Exception, TookTooLong, SystemExit) as e:  # noqa: BLE001 - judged below
            exc = e
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        # a lazily computed result (a Table) must also print; an empty Table that cannot be shown is broken
        if exc is None and result is not None and type(result).__module__.startswith("labkit"):
            signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT)
            try:
                str(result)
                if hasattr(result, "_repr_html_"):
                    result._repr_html_()
            except (Exception, TookTooLong) as e:  # noqa: BLE001
                exc = e
                exc.__labkit_fuzz_note__ = f"returned a {type(result).__name__} that cannot be printed"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    return result, exc, time.perf_counter() - start, [str(w.message) for w in caught]


def _where(exc) -> str:
    """file:line of the innermost labkit frame of exc's traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/labkit/" in f.filename
              and "/tests/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('/labkit/')[-1]}:{f.lineno}"


@dataclasses.dataclass
class Outcome:
    target: str
    module: str
    param: str | None      # None: the baseline call
    value: str | None      # the bad value's label
    verdict: str           # "returned", "raised-good", "allowed", "fail", "baseline-ok", "baseline-fail"
    error: str = ""        # exception type name
    message: str = ""
    where: str = ""
    why: str = ""          # for a failure: what is wrong
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict in ("fail", "baseline-fail")

    def line(self) -> str:
        what = f"{self.param}={self.value}" if self.param else "baseline call"
        at = f" at {self.where}" if self.where else ""
        msg = self.message if len(self.message) <= 160 else self.message[:157] + "..."
        return f"{self.target}({what}): {self.why}{at}" + (f" -- {self.error}: {msg}" if self.error else "")


ABBREVIATIONS = {
    "fmt": ("format",), "acc": ("accumulation",), "doc": ("document",), "rec": ("record",), "mem": ("memory",),
    "environ": ("environment",), "argv": ("command line", "arguments"), "args": ("arguments",),
    "lo": ("low",), "hi": ("high",), "ms": ("milliseconds",),
}
"""The word each abbreviated parameter name stands for: a message may use either."""


def _aliases(param: str) -> set[str]:
    base = {param, param.replace("_", " "), param.replace("_", "-"), param.rstrip("s"), *ABBREVIATIONS.get(param, ())}
    return {a.lower() for a in base if a}


ALLOWED_WORDS = re.compile(r"\b(must|expect\w*|choose|one of|known|valid|allowed|should|needs?|takes|accepts?|"
                           r"only|give)\b", re.I)


def names_param(message: str, param: str, n_params: int, value=None) -> bool:
    """The rule for a clear message: it names the parameter -- as written, with spaces or hyphens for its
    underscores, without a plural s, or by the word an abbreviation stands for (`ABBREVIATIONS`: fmt ->
    format) -- as a whole word; or, where the callable has one parameter only (nothing to confuse it with),
    it says what is allowed ("must", "expected", "one of", "choose", "valid", ...) or quotes the string it got
    ("no evidence file at x")."""
    m = message.lower()
    for a in _aliases(param):
        if re.search(rf"(?<![a-z0-9_]){re.escape(a)}(?![a-z0-9_])", m):
            return True
    return n_params == 1 and bool(ALLOWED_WORDS.search(message) or (isinstance(value, str) and value
                                                                    and value in message))


def _is_bool_param(p: inspect.Parameter) -> bool:
    ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
    return ann == "bool" or isinstance(p.default, bool)


class Plan:
    """How to call one target: the function, its parameters, the good args; or why it cannot be called."""

    def __init__(self, target: Target, ctx: Ctx):
        self.target, self.ctx, self.skip = target, ctx, None
        t = target
        cls_id = t.id.rsplit(".", 1)[0] if t.kind in ("method", "classmethod") else t.id
        if t.id in NOT_CALLED:
            self.skip = NOT_CALLED[t.id]
            return
        if t.kind == "method":
            self.fn = getattr(ctx.instance(cls_id, t.owner), t.method)
        elif t.kind == "classmethod":
            self.fn = getattr(t.owner, t.method)
        else:
            self.fn = t.obj
        try:
            sig = inspect.signature(self.fn)
        except (TypeError, ValueError) as e:
            self.skip = f"no signature ({e})"
            return
        self.params = list(sig.parameters.values())
        record = {}
        if t.kind == "constructor" and ctx.has_instance(t.id):
            inst = ctx.instance(t.id)
            if dataclasses.is_dataclass(inst):
                record = {f.name: getattr(inst, f.name) for f in dataclasses.fields(inst) if f.init}
            elif hasattr(inst, "_asdict"):
                record = inst._asdict()
        self.good = {}
        for p in self.params:
            if p.kind is p.VAR_KEYWORD:
                continue
            if (t.id, p.name) in OVERRIDES:
                self.good[p.name] = OVERRIDES[(t.id, p.name)]
            elif p.name in record:
                self.good[p.name] = record[p.name]
            elif p.default is not p.empty:
                continue  # the default
            elif p.name in GOOD:
                self.good[p.name] = GOOD[p.name]
            elif p.kind is p.VAR_POSITIONAL:
                continue
            else:
                self.skip = f"no known-good value for its required parameter {p.name!r} (add one to GOOD)"
                return
        self.n_params = sum(p.kind is not p.VAR_KEYWORD for p in self.params)

    def is_count(self, name: str) -> bool:
        """A size or a count: its name says so (`COUNT`) and its good value is a whole number (or None where
        the annotation says int): `limit` in `checks.at_least` is a threshold, `sample_steps` a tuple."""
        if not COUNT.match(name):
            return False
        p = next(p for p in self.params if p.name == name)
        good = _value(self.good.get(name, p.default), self.ctx)
        if good is None:
            return "int" in str(p.annotation)
        return isinstance(good, (int, np.integer)) and not isinstance(good, (bool, np.bool_))

    def build(self, bad_param=None, bad_value=None, extra_kwargs=None):
        args, kwargs = [], {}
        for p in self.params:
            if p.name == bad_param:
                v = _value(bad_value, self.ctx)
            elif p.name in self.good:
                v = _value(self.good[p.name], self.ctx)
            else:
                continue
            if p.kind is p.POSITIONAL_ONLY:
                args.append(v)
            elif p.kind is p.VAR_POSITIONAL:
                args.extend([v] if p.name == bad_param else v)
            elif p.kind is p.VAR_KEYWORD:
                pass
            else:
                kwargs[p.name] = v
        kwargs.update(extra_kwargs or {})
        return args, kwargs


def judge(plan: Plan, param: str, label: str, value, result, exc, seconds) -> Outcome:
    """returned; raised a ValueError/TypeError that names the parameter; or a failure, saying why."""
    t = plan.target
    o = Outcome(t.id, t.module, param, label, "returned", seconds=round(seconds, 3))
    if exc is None:
        if t.id in BAD_ONLY:
            o.verdict, o.why = "fail", "accepted a bad value (and started the work)"
        elif label == UNKNOWN_KEYWORD:
            o.verdict, o.why = "fail", f"accepted an unknown keyword {UNKNOWN_KEYWORD}=1 without a word"
        elif label in COUNT_SILENT and plan.is_count(param) and (t.id, param, label) not in COUNT_OK:
            o.verdict, o.why = "fail", "returned for a size/count of " + label + " (a silent wrong result)"
        return o
    o.error, o.message, o.where = type(exc).__name__, str(exc), _where(exc)
    note = getattr(exc, "__labkit_fuzz_note__", "")
    if isinstance(exc, TookTooLong):
        o.verdict, o.why = "fail", f"took too long on bad input (> {TIME_LIMIT:g} s)"
    elif note:
        o.verdict, o.why = "fail", note
    elif isinstance(exc, (ValueError, TypeError)):
        name = UNKNOWN_KEYWORD if label == UNKNOWN_KEYWORD else param
        if len(o.message) > MESSAGE_MAX:
            o.verdict, o.why = "fail", f"{o.error}'s message has {len(o.message):,} characters: it prints the value whole"
        elif names_param(o.message, name, plan.n_params, None if label == UNKNOWN_KEYWORD else value):
            o.verdict = "raised-good"
        else:
            o.verdict, o.why = "fail", f"{o.error}'s message does not name {name!r}"
    elif t.id in OTHER_ALLOWED and isinstance(exc, OTHER_ALLOWED[t.id][0]):
        o.verdict = "allowed"
    else:
        o.verdict, o.why = "fail", f"raised {o.error}, not ValueError/TypeError"
    return o


def fuzz(target: Target, ctx: Ctx) -> list[Outcome]:
    """The baseline call, then every bad value in every parameter."""
    _arm(target.id, ctx)
    try:
        return _fuzz(target, ctx)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _fuzz(target: Target, ctx: Ctx) -> list[Outcome]:
    try:
        plan = Plan(target, ctx)
    except Exception as e:  # noqa: BLE001 - an example instance that cannot be built
        return [Outcome(target.id, target.module, None, None, "baseline-fail", type(e).__name__, str(e),
                        _where(e), "its example instance could not be built")]
    if plan.skip:
        return []
    out = []
    if target.id not in BAD_ONLY:
        args, kwargs = plan.build()
        result, exc, secs, _ = call(plan.fn, args, kwargs, ctx, BASELINE_TIME_LIMIT)
        if exc is not None:
            return [Outcome(target.id, target.module, None, None, "baseline-fail", type(exc).__name__, str(exc),
                            _where(exc), getattr(exc, "__labkit_fuzz_note__", "")
                            or "the known-good call raised (fix GOOD/OVERRIDES, or the callable)",
                            round(secs, 3))]
        out.append(Outcome(target.id, target.module, None, None, "baseline-ok", seconds=round(secs, 3)))
    for p in plan.params:
        if p.kind is p.VAR_KEYWORD:
            _note(f"{target.id}(**{{{UNKNOWN_KEYWORD!r}: 1}})")
            args, kwargs = plan.build(extra_kwargs={UNKNOWN_KEYWORD: 1})
            result, exc, secs, _ = call(plan.fn, args, kwargs, ctx)
            out.append(judge(plan, p.name, UNKNOWN_KEYWORD, 1, result, exc, secs))
            continue
        good = plan.good.get(p.name, p.default)
        for label, bad in BAD.items():
            if HEAVY.search(target.id) and label not in QUICK:
                continue
            if label in ("True", "False") and _is_bool_param(p):
                continue
            if not isinstance(bad, Make) and type(bad) is type(good) and bad == good:
                continue  # the good value itself
            if label == LONG and not isinstance(_value(good, ctx), (list, tuple, np.ndarray)):
                label, bad = SHORTER
            bad = _value(bad, ctx)
            _note(f"{target.id}({p.name}={label})")
            args, kwargs = plan.build(p.name, bad)
            result, exc, secs, _ = call(plan.fn, args, kwargs, ctx)
            out.append(judge(plan, p.name, label, bad, result, exc, secs))
    return out


def uncovered(targets, ctx) -> dict[str, str]:
    """target id -> why it is not fuzzed (not called at all)."""
    out = {}
    for t in targets:
        try:
            plan = Plan(t, ctx)
        except Exception as e:  # noqa: BLE001
            out[t.id] = f"its example instance could not be built: {type(e).__name__}: {e}"
            continue
        if plan.skip:
            out[t.id] = plan.skip
    return out


# -- the summary --------------------------------------------------------------------------------
def summary(outcomes: list[Outcome], targets=None, not_covered=None, seconds=None) -> str:
    calls = [o for o in outcomes]
    verdicts = Counter(o.verdict for o in calls)
    fails = [o for o in calls if o.failed]
    lines = ["labkit public API fuzz", "=" * 22]
    if targets is not None:
        lines.append(f"public callables found: {len(targets)} in {len({t.module for t in targets})} modules; "
                     f"fuzzed: {len({o.target for o in calls})}")
    lines.append(f"calls made: {len(calls)}" + (f" in {seconds:.1f} s" if seconds is not None else ""))
    for v in ("baseline-ok", "returned", "raised-good", "allowed", "fail", "baseline-fail"):
        lines.append(f"  {v:<14} {verdicts.get(v, 0)}")
    lines.append(f"failures: {len(fails)} calls in {len({o.target for o in fails})} callables")
    by_type = Counter(o.error or o.why.split(" (")[0] for o in fails)
    lines.append("failures by exception type (or kind, where the call returned):")
    lines += [f"  {n:>5}  {k}" for k, n in by_type.most_common()]
    by_kind = Counter(_kind(o) for o in fails)
    lines.append("failures by kind:")
    lines += [f"  {n:>5}  {k}" for k, n in by_kind.most_common()]
    by_mod = Counter(o.module for o in fails)
    lines.append("failures by module:")
    lines += [f"  {n:>5}  {k}" for k, n in by_mod.most_common()]
    if not_covered is not None:
        lines.append(f"not fuzzed ({len(not_covered)}):")
        lines += [f"  {k}: {v}" for k, v in sorted(not_covered.items())]
        lines.append("called with bad values only:")
        lines += [f"  {k}: {v}" for k, v in sorted(BAD_ONLY.items())]
        lines.append("modules not imported:")
        lines += [f"  {k}: {v}" for k, v in sorted(skipped_modules().items())]
    slow = sorted({o.target: 0 for o in calls}, key=lambda k: -sum(o.seconds for o in calls if o.target == k))[:8]
    lines.append("slowest callables (s, all their calls): " + ", ".join(
        f"{k} {sum(o.seconds for o in calls if o.target == k):.1f}" for k in slow))
    lines.append("")
    lines.append("failing calls, by module")
    lines.append("-" * 24)
    grouped = defaultdict(list)
    for o in fails:
        grouped[o.module].append(o)
    for mod in sorted(grouped):
        lines.append(f"[{mod}] {len(grouped[mod])}")
        lines += ["  " + o.line() for o in grouped[mod]]
    return "\n".join(lines)


def _kind(o: Outcome) -> str:
    if o.verdict == "baseline-fail":
        return "the known-good call failed"
    if o.why.startswith("took too long"):
        return "too slow"
    if o.why.startswith("returned for a size") or o.why.startswith("accepted"):
        return "silent acceptance"
    if "message does not name" in o.why or "message has" in o.why:
        return "unclear message"
    if o.why.startswith("returned a"):
        return "result cannot be printed"
    return "wrong exception type"
