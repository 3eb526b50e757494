"""What a PyTorch training step holds, in bytes, counted from the tensors themselves.

`measure_memory` returns a `labkit.memory.MemoryReport`; `labkit.memory.activations` models
the same figures from the shapes, and tests/train/test_memory_measured.py checks one against
the other.
"""

from __future__ import annotations

import torch

from labkit.memory import MemoryReport


def storage_bytes(tensors) -> int:
    """Bytes of the storages under `tensors`, each storage counted once (views share one)."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return int(sum(seen.values()))


def measure_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch, loss_fn,
                   device: torch.device | None = None) -> MemoryReport:
    """What a training step holds, in bytes, counted from the tensors themselves.

    * ``parameter_bytes`` -- the weights (fp32 under autocast: they are the master weights;
      bf16 after ``model.to(torch.bfloat16)``);
    * ``gradient_bytes`` -- ``p.grad`` (same dtype as the weights);
    * ``optimizer_state_bytes`` -- everything in ``optimizer.state`` (Adam: ``exp_avg``,
      ``exp_avg_sq`` and a ``step`` counter per tensor; plain SGD: nothing);
    * ``saved_activation_bytes`` -- what autograd keeps from one forward pass on `batch`
      for the backward pass (found with ``torch.autograd.graph.saved_tensors_hooks``,
      counted once per storage): the activations. This is the part that autocast halves.
    * ``saved_weight_copy_bytes`` -- also kept for the backward pass: the fp16/bf16 copies
      of the weights that autocast made for the matmuls (a saved tensor whose autograd
      history leads, through casts and views only, to a parameter). Zero in fp32 and in
      pure bf16, where the saved weight *is* the parameter and is already counted.
    * ``peak_bytes`` -- on a CUDA `device`, ``torch.cuda.max_memory_allocated``.

    `batch` None (no step has run) leaves the two saved figures out.
    """
    params = list(model.parameters())
    from labkit.train.torch.optimizers import state_tensors  # torchao's 8/4-bit states: their inner tensors

    state = state_tensors(optimizer)
    out = {
        "parameter_bytes": storage_bytes(params),
        "gradient_bytes": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": storage_bytes(state),
    }
    if batch is not None:
        own = {p.untyped_storage().data_ptr() for p in params}
        saved = {"saved_activation_bytes": {}, "saved_weight_copy_bytes": {}}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in own:
                kind = "saved_weight_copy_bytes" if _copy_of_parameter(t) else "saved_activation_bytes"
                saved[kind][s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            loss = loss_fn(*batch)
        del loss
        out.update({kind: int(sum(sizes.values())) for kind, sizes in saved.items()})
    if device is not None and torch.device(device).type == "cuda":
        out.update(device="cuda", peak_bytes=int(torch.cuda.max_memory_allocated(device)))
    return MemoryReport("torch", **out)


# autograd nodes that only cast or re-view a tensor: a weight seen through these is a copy
_CAST_OR_VIEW = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0", "UnsafeViewBackward0",
                 "PermuteBackward0", "ExpandBackward0", "AliasBackward0", "UnsqueezeBackward0",
                 "SqueezeBackward0", "SqueezeBackward1"}


def _copy_of_parameter(t: torch.Tensor) -> bool:
    """Is `t` a parameter seen through casts and views only (ToCopy, T, View ... -> the leaf)?"""
    fn = t.grad_fn
    while fn is not None and fn.name() in _CAST_OR_VIEW:
        parents = [f for f, _ in fn.next_functions if f is not None]
        if len(parents) != 1:
            return False
        fn = parents[0]
    return fn is not None and t.grad_fn is not fn and hasattr(fn, "variable")  # AccumulateGrad of a leaf


__all__ = ["measure_memory", "storage_bytes"]
