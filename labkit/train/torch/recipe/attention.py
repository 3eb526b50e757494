"""Attention under autocast: which kernel ``F.scaled_dot_product_attention`` dispatches to on the
CPU, and the dtypes it receives and returns."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from labkit.table import Table
from labkit.train.torch.recipe._common import OpLog, dtype_name


def sdpa_dtypes() -> Table:
    """``F.scaled_dot_product_attention`` under CPU autocast: the kernel it dispatches to, the dtypes
    that kernel receives, and the output dtype, from fp32 inputs and from inputs already in 16 bits.

    SDPA is on autocast's lower-precision list on the CPU as on CUDA, so fp32 q, k, v are cast to
    bf16/fp16 first (the ``_to_copy`` calls). On the CPU it then runs the fused flash-attention kernel
    (``_scaled_dot_product_flash_attention_for_cpu``, ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``),
    which keeps its softmax statistics and sums in fp32 (the "opmath" type) and writes 16-bit output.

    >>> t = sdpa_dtypes()
    >>> dict(zip(t.column("autocast"), t.column("output")))["bfloat16"]
    'bfloat16'
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 4, generator=gen) for _ in range(3))
    rows = []
    for dtype in (None, torch.bfloat16, torch.float16):
        for inputs in ((torch.float32,) if dtype is None else (torch.float32, dtype)):
            args = [t.to(inputs) for t in (q, k, v)]
            ops = OpLog()
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None), ops:
                o = F.scaled_dot_product_attention(*args)
            casts = ops.casts
            kernel = next((name, d) for name, d in ops.ops if "scaled_dot_product" in name)
            rows.append(("off" if dtype is None else dtype_name(dtype), dtype_name(inputs), str(casts), kernel[0],
                         ", ".join(kernel[1]), dtype_name(o.dtype)))
    return Table(("autocast", "q, k, v", "casts first", "kernel", "kernel sees q, k, v", "output"), tuple(rows),
                 title="F.scaled_dot_product_attention on the CPU")


__all__ = ["sdpa_dtypes"]
