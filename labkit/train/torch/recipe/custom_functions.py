"""Custom autograd functions under autocast (amp_examples, "Autocast and Custom Autograd
Functions"): ``torch.amp.custom_fwd`` / ``custom_bwd``, and an autocast-disabled region."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from labkit._validate import choice
from labkit.table import Table
from labkit.train.torch.recipe._common import DTYPE, LOW, dtype_name


def _mm(fwd_wrap, bwd_wrap):
    """amp_examples' ``MyMM`` (``a @ b``), its forward and backward wrapped, logging the dtypes they see."""

    def forward(ctx, a, b, log):
        log.forward = (dtype_name(a.dtype), dtype_name(b.dtype), torch.is_autocast_enabled("cpu"))
        ctx.save_for_backward(a, b)
        ctx.log = log
        return a.mm(b)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        ctx.log.backward = (dtype_name(grad.dtype), torch.is_autocast_enabled("cpu"))
        return grad.mm(b.t()), a.t().mm(grad), None

    return type("MyMM", (torch.autograd.Function,), {"forward": staticmethod(fwd_wrap(forward)),
                                                      "backward": staticmethod(bwd_wrap(backward))})


_FUNCTIONS = {
    "plain autograd.Function": _mm(lambda f: f, lambda f: f),
    "custom_fwd + custom_bwd": _mm(torch.amp.custom_fwd(device_type="cpu"), torch.amp.custom_bwd(device_type="cpu")),
    "custom_fwd(cast_inputs=float32)": _mm(torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32),
                                           torch.amp.custom_bwd(device_type="cpu")),
}


def custom_function_dtypes(precision: str = "bf16") -> Table:
    """What a custom ``torch.autograd.Function`` sees under autocast, and what fixes it.

    Input ``a`` comes out of an autocast ``Linear`` (so it is in `precision`), ``b`` is an fp32
    parameter, and ``MyMM`` computes ``a @ b`` (amp_examples, "Autocast and Custom Autograd Functions")::

        class MyMM(torch.autograd.Function):
            @staticmethod
            @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a.mm(b)

            @staticmethod
            @torch.amp.custom_bwd(device_type="cpu")
            def backward(ctx, grad):
                a, b = ctx.saved_tensors
                return grad.mm(b.t()), a.t().mm(grad)

    * undecorated, ``forward`` runs under autocast (its ``mm`` is cast to `precision`) but
      ``backward`` runs where ``loss.backward()`` is called, outside autocast: ``grad`` (in
      `precision`) times the fp32 ``b`` fails, with torch's dtype-mismatch error;
    * ``custom_fwd`` / ``custom_bwd`` (no ``cast_inputs``) run backward under forward's autocast state;
    * ``custom_fwd(cast_inputs=torch.float32)`` turns autocast *off* inside forward and casts its
      floating inputs to fp32 (``torch/amp/autocast_mode.py``: ``_cast``): the op runs in fp32;
    * an autocast-disabled region, ``with torch.autocast("cpu", enabled=False):``, does the same for a
      few lines, but casts nothing: the inputs must be made fp32 by hand (``h.float()``), or the same
      dtype error.

    >>> t = custom_function_dtypes("bf16")
    >>> dict(zip(t.column("variant"), t.column("forward sees a, b")))["custom_fwd(cast_inputs=float32)"]
    'float32, float32'
    """
    precision = choice("precision", precision, LOW)
    dtype = DTYPE[precision]
    gen = torch.Generator().manual_seed(0)
    x, w0, w = (torch.randn(*s, generator=gen) for s in ((4, 8), (8, 8), (8, 3)))
    rows = []

    def row(variant, run):
        w0.grad = w.grad = None
        w0.requires_grad_(True)
        w.requires_grad_(True)
        log, out = types.SimpleNamespace(forward=None, backward=None), None
        try:
            with torch.autocast("cpu", dtype=dtype):
                out = run(F.linear(x, w0), log)
            out.register_hook(lambda g: setattr(log, "backward",
                                                (dtype_name(g.dtype), torch.is_autocast_enabled("cpu"))))
            out.float().sum().backward()
            result = f"grads: {dtype_name(w0.grad.dtype)} (Linear), {dtype_name(w.grad.dtype)} (b)"
        except RuntimeError as err:
            result = f"RuntimeError: {str(err).splitlines()[0]}"
        fwd, bwd = log.forward, log.backward
        rows.append((variant, ", ".join(fwd[:2]) if fwd else "-", str(fwd[2]) if fwd else "-",
                     "-" if out is None else dtype_name(out.dtype),
                     bwd[0] if bwd else "-", str(bwd[1]) if bwd else "-", result))

    for variant, fn in _FUNCTIONS.items():
        row(variant, lambda a, log, fn=fn: fn.apply(a, w, log))

    def region(a, log, cast):
        with torch.autocast("cpu", enabled=False):
            a, b = (a.float(), w.float()) if cast else (a, w)
            log.forward = (dtype_name(a.dtype), dtype_name(b.dtype), torch.is_autocast_enabled("cpu"))
            return a @ b

    row("autocast(enabled=False) + .float()", lambda a, log: region(a, log, True))
    row("autocast(enabled=False), no cast", lambda a, log: region(a, log, False))
    return Table(("variant", "forward sees a, b", "autocast in forward", "output", "backward sees grad",
                  "autocast in backward", "result"), tuple(rows),
                 title=f"a (from an autocast Linear, {dtype_name(dtype)}) @ b (fp32 parameter), "
                       f"under autocast('cpu', {dtype_name(dtype)})")


__all__ = ["custom_function_dtypes"]
