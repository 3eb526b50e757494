"""Collectives counted, not guessed: one profiled step's ``c10d::`` ops with their dtypes and sizes.

A distributed run (`labkit.train.torch.engines`) profiles one step (the third, or the last if
fewer) with ``torch.profiler`` and lists every ``c10d::`` collective it launched with its dtype
and element count, the size a collective moves counted as nccl-tests does (the full buffer:
all-reduce input, all-gather output, reduce-scatter input).

>>> gradient_reduce_dtype([{"op": "allgather_base", "dtype": "bf16", "elements": 90},
...                        {"op": "reduce_scatter_base", "dtype": "fp32", "elements": 64}])
'fp32'
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {"float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16", "double": "fp64",
               "int": "int32", "long int": "int64", "unsigned char": "uint8", "bool": "bool"}
ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp64": 8, "int32": 4, "int64": 8, "uint8": 1, "bool": 1}
# dispatcher-level collectives; (index of the argument whose size is the "size" moved)
COLLECTIVES = {"c10d::allreduce_": 0, "c10d::allreduce_coalesced_": 0, "c10d::_allgather_base_": 0,
               "c10d::allgather_": 0, "c10d::allgather_into_tensor_coalesced_": 0,
               "c10d::_reduce_scatter_base_": 1, "c10d::reduce_scatter_": 1,
               "c10d::reduce_scatter_tensor_coalesced_": 1, "c10d::broadcast_": 0, "c10d::reduce_": 0}


def dtype_name(dtype: torch.dtype) -> str:
    """labkit's short name of a torch dtype ("fp32", "bf16", "fp16"; else torch's own name).

    >>> dtype_name(torch.bfloat16), dtype_name(torch.int8)
    ('bf16', 'int8')
    """
    return {v: k for k, v in DTYPES.items()}.get(dtype, str(dtype).replace("torch.", ""))


@contextlib.contextmanager
def profile(enabled: bool):
    """Profile the block (CPU ops, with input dtypes) and yield a box that holds its Chrome trace
    after the block (None when not `enabled`)."""
    if not enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        box = [None]
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            yield box
        prof.export_chrome_trace(path)
        with open(path) as f:
            box[0] = json.load(f)


def read_collectives(box) -> list[dict]:
    """The c10d collectives in a profiled step: op, dtype, elements, bytes (nccl-tests' size).

    A ``c10d::`` op that takes a list of tensors (DDP's bucket all-reduce) records its type as
    "TensorList"; its dtype is then read from the backend's own event for it ("gloo:all_reduce",
    "nccl:all_reduce": the same element count, started at or after it, on the worker thread).
    """
    events = sorted((box[0] or {}).get("traceEvents", []), key=lambda e: e.get("ts", 0))
    backend = [e for e in events if e.get("name", "").startswith(("gloo:", "nccl:"))]
    out = []
    for ev in events:
        idx = COLLECTIVES.get(ev.get("name"))
        args = ev.get("args", {})
        dims, types = args.get("Input Dims", []), args.get("Input type", [])
        if idx is None or idx >= len(dims):
            continue
        shape = dims[idx][0] if types[idx] == "TensorList" and dims[idx] else dims[idx]
        n = int(np.prod(shape)) if shape else 1
        dtype = types[idx]
        if dtype == "TensorList":
            match = next((b for b in backend if b.get("ts", 0) >= ev.get("ts", 0)
                          and int(np.prod(b["args"]["Input Dims"][0] or [1])) == n), None)
            dtype = match["args"]["Input type"][0] if match else "unknown"
            if match:
                backend.remove(match)
        dtype = DTYPE_NAMES.get(dtype, dtype)
        out.append({"op": ev["name"].removeprefix("c10d::").strip("_"), "dtype": dtype, "elements": n,
                    "bytes": n * ITEMSIZE.get(dtype, 0)})
    return out


def gradient_reduce_dtype(collectives: list[dict]) -> str | None:
    """The dtype of the largest reduction (all-reduce / reduce-scatter): the gradients'."""
    reductions = [c for c in collectives if c["op"].startswith(("allreduce", "reduce_scatter"))]
    return max(reductions, key=lambda c: c["elements"])["dtype"] if reductions else None
