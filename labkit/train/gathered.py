"""Tables a notebook prints about multi-device runs: step time per engine, what the parameter
all-gathers move, ZeRO memory measured vs predicted."""

from __future__ import annotations

import math

from labkit.table import Table
from labkit.train.result import RunResult


_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # tf.distribute reports dtype names


def _engine(r: RunResult) -> str:
    if r.config.devices < 2:
        return "one device"
    if r.config.parallel.startswith("zero"):
        return f"DeepSpeed ZeRO-{r.config.parallel[-1]}"
    names = {"torch": {"dp": "DDP", "fsdp": "FSDP2"}, "jax": {"dp": "jit, data parallel", "fsdp": "jit, FSDP-style"},
             "tf": {"dp": "MirroredStrategy"}}
    return names.get(r.config.framework, {}).get(r.config.parallel, r.config.parallel)


def step_time_table(results: dict) -> Table:
    """One row per run ({label: RunResult}): framework, devices, engine, gradient-reduction dtype,
    bytes the collectives moved per step, median step time (first step left out) and samples/s.

    The time is wall-clock on *this* machine: on one CPU, N "devices" share its cores and every
    collective is a memory copy, so more devices are slower here; on N GPUs the same runs measure
    what the collectives really cost.
    """
    if not isinstance(results, dict) or not all(isinstance(r, RunResult) for r in results.values()):
        raise TypeError("step_time_table takes a dict {label: RunResult}")
    rows = []
    for label, r in results.items():
        t = r.median_step_time()
        ok = t > 0 and math.isfinite(t)
        reduce = r.extra.get("reduce_dtype", "-")
        reduce = reduce if isinstance(reduce, (list, tuple)) else [reduce or "-"]
        reduce = "/".join(sorted({_SHORT.get(d, d) for d in reduce}))
        rows.append((str(label), r.config.framework, str(r.config.devices), _engine(r), reduce,
                     str(r.extra.get("comm_bytes_per_step", 0)), f"{1e3 * t:.1f}" if ok else "-",
                     f"{r.config.batch_size / t:.0f}" if ok else "-"))
    cols = ("run", "framework", "devices", "engine", "reduce", "bytes/step", "median step ms", "samples/s")
    return Table(cols, tuple(rows))


_GATHER_DTYPES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}  # HLO names -> labkit's


def gathered(result: RunResult) -> dict:
    """The parameter all-gathers of one step of a sharded run: their dtype, elements and bytes.

    torch (FSDP2): the collectives the profiler saw (``extra["collectives"]``); jax: the
    program as labkit wrote it (``extra["collectives_requested"]``, before XLA optimises it).
    Returns ``{"dtype": "bf16" | "fp32" | "bf16/fp32", "elements": int, "bytes": int}``.
    """
    if not isinstance(result, RunResult):
        raise TypeError(f"gathered takes a RunResult; got {type(result).__name__}")
    if result.config.framework == "jax":
        rows = [{"dtype": c["dtype"], "elements": math.prod(c["shape"]), "bytes": c["bytes"]}
                for c in result.extra.get("collectives_requested", []) if c["op"] == "all-gather"]
    elif result.config.framework == "torch":
        rows = [c for c in result.extra.get("collectives", []) if c["op"].startswith("allgather")]
    else:
        raise ValueError(f"gathered reads torch and jax runs; got framework={result.config.framework!r}")
    if not rows:
        raise ValueError("gathered needs a sharded run (parallel='fsdp') whose collectives were recorded; "
                         "this one has no all-gather")
    dtypes = sorted({_GATHER_DTYPES.get(r["dtype"], r["dtype"]) for r in rows})
    return {"dtype": "/".join(dtypes), "elements": sum(int(r["elements"]) for r in rows),
            "bytes": sum(int(r["bytes"]) for r in rows)}


def gather_table(results: dict) -> Table:
    """One row per sharded run ({label: RunResult}): what its parameter all-gathers moved in one
    step -- dtype, elements, bytes, bytes per element -- and what the same gathers would move in
    bf16 (2 bytes per element)."""
    if not isinstance(results, dict) or not results or not all(isinstance(r, RunResult) for r in results.values()):
        raise TypeError("gather_table takes a non-empty dict {label: RunResult}")
    rows = []
    for label, r in results.items():
        g = gathered(r)
        rows.append((str(label), g["dtype"], str(g["elements"]), str(g["bytes"]),
                     f"{g['bytes'] / g['elements']:g}", str(2 * g["elements"])))
    cols = ("run", "gathered in", "elements/step", "bytes/step", "bytes/element", "bytes if bf16")
    return Table(cols, tuple(rows))


def zero_memory_table(result: RunResult) -> Table:
    """A DeepSpeed ZeRO run: each rank's bytes as read from DeepSpeed's buffers, next to the
    ZeRO paper's formula (`deepspeed_config.zero_memory`) for the same parameter count, stage
    and ranks. The measured partitions are a few elements larger: DeepSpeed pads the flat buffer
    so that it splits evenly. Gradients are not listed: ZeRO frees them after each step."""
    from labkit.train.torch.deepspeed_config import zero_memory
    from labkit.train.models import count_params, init_params

    if not isinstance(result, RunResult) or "zero_stage" not in result.extra:
        raise ValueError("zero_memory_table needs the RunResult of a DeepSpeed run (parallel='zero1' or 'zero2')")
    n = count_params(init_params(result.config.model, width=result.config.width))
    world, stage = result.extra["world_size"], result.extra["zero_stage"]
    model = zero_memory(n, ranks=world, stage=stage)
    parts = (("16-bit working weights", "parameter_bytes", model["weights"]),
             ("fp32 master weights", "master_weight_bytes", model["master_weights"]),
             ("Adam m and v (fp32)", "optimizer_state_bytes", model["optimizer_states"]))
    rows = []
    for name, measured_key, predicted in parts:
        if name.startswith("16-bit") and result.config.precision == "fp32":
            predicted *= 2  # an fp32 run keeps fp32 working weights
        measured = [m[measured_key] for m in result.extra["memory_by_rank"]]
        rows.append((name, *map(str, measured), f"{predicted:.0f}"))
    cols = ("model state", *(f"rank {i} bytes" for i in range(world)), f"ZeRO-{stage} formula, {n} params")
    return Table(cols, tuple(rows))
