"""``torch.compile`` (inductor) under autocast on the CPU: the casts eager autocast makes op by op,
the ones inductor fuses into its generated C++ kernels, and the step times, eager and compiled."""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit._validate import choice, integer, names
from labkit.bench.timing import time_in_turns
from labkit.table import Table
from labkit.train.torch.recipe._common import DTYPE, LOW, OpLog, batches, mlp
from labkit.train.torch.threads import one_thread


@dataclass(frozen=True)
class Compiled:
    """`compile_autocast`'s figures per precision; `available` False (with `reason`) where inductor
    could not compile here. ``ms[(precision, "eager" | "compiled")]`` is the best step time (ms),
    ``compile_s[precision]`` the seconds the first compiled step took."""

    available: bool
    reason: str
    ms: dict
    compile_s: dict
    eager_casts: dict
    kernels: dict
    fused_cast_kernels: dict
    converts: dict
    library_calls: dict

    def table(self) -> Table:
        if not self.available:
            return Table(("torch.compile",), (("not available here: " + self.reason,),))
        rows = tuple((p, f"{self.ms[p, 'eager']:.3f}", f"{self.ms[p, 'compiled']:.3f}",
                      f"{self.ms[p, 'eager'] / self.ms[p, 'compiled']:.2f}x", f"{self.compile_s[p]:.1f}",
                      str(self.eager_casts[p]), str(self.kernels[p]), str(self.fused_cast_kernels[p]),
                      str(self.converts[p]), self.library_calls[p]) for p in self.eager_casts)
        return Table(("precision", "eager ms/step", "compiled ms/step", "speed-up", "compile s",
                      "eager casts (aten._to_copy)", "inductor C++ kernels", "kernels with a fused cast",
                      "convert<> in code", "library calls"), rows,
                     title="an MLP train step (forward + backward), CPU inductor")

    def checks(self, precision: str = "bf16"):
        """What `compile_autocast` shows in `precision` (one of the 16-bit precisions it ran: fp32 makes no
        casts, so it has no claims here) that holds on every CPU, loaded or idle, with AVX-512 or without (a
        `labkit.checks.Report`, one line per claim):

        * eager autocast casts op by op: its train step makes ``aten._to_copy`` calls;
        * where inductor compiles, it fuses those casts into its generated C++ kernels, and the matmuls
          stay library calls (``extern_kernels``);
        * compiling costs at least 100 eager steps (the first compiled step against the best eager one;
          1,500 to 7,000 where measured, compiling taking a second or more even from a warm cache), so
          it pays only over a long run;
        * on a step this small, compiling changes the step time by less than 3x, up or down (0.7-0.9x
          measured on one thread, natively and capped to AVX2, at loads of 2 to 7 on 2 cores): the step
          is mostly the matmuls and Python's overhead; what compiling saves, passes over memory, counts
          where the tensors are large.

        Where inductor could not compile here, the claims about compiling hold trivially and say why.

        >>> c = Compiled(True, "", {("bf16", "eager"): 0.5, ("bf16", "compiled"): 0.6}, {"bf16": 1.2},
        ...              {"bf16": 15}, {"bf16": 6}, {"bf16": 6}, {"bf16": 29}, {"bf16": "addmm x3, mm x5"})
        >>> print(c.checks("bf16"))
        ✓ eager bf16 autocast casts op by op (aten._to_copy)  (here: 15 per step)
        ✓ where inductor compiles, its C++ kernels take those casts in  (here: 6 of 6 kernels, 29 convert<>)
        ✓ where inductor compiles, the matmuls stay library calls  (here: addmm x3, mm x5)
        ✓ compiling costs at least 100 eager steps  (here: 2,400 steps)
        ✓ at this size, compiling changes the step time by less than 3x, up or down  (here: 0.833x eager's speed)
        """
        from labkit import checks

        precision = choice("precision", precision, tuple(p for p in self.eager_casts if p in LOW))  # fp32 casts nothing
        casts = checks.that(f"eager {precision} autocast casts op by op (aten._to_copy)",
                            self.eager_casts[precision] > 0, f"{self.eager_casts[precision]} per step")
        fused = "where inductor compiles, its C++ kernels take those casts in"
        library = "where inductor compiles, the matmuls stay library calls"
        cost = "compiling costs at least 100 eager steps"
        speed = "at this size, compiling changes the step time by less than 3x, up or down"
        if not self.available:
            why = f"not compiled here: {self.reason}"
            return checks.report(casts, *(checks.that(claim, True, why) for claim in (fused, library, cost, speed)))
        eager, compiled = self.ms[precision, "eager"], self.ms[precision, "compiled"]
        return checks.report(
            casts,
            checks.that(fused, self.fused_cast_kernels[precision] > 0 and self.converts[precision] > 0,
                        f"{self.fused_cast_kernels[precision]} of {self.kernels[precision]} kernels, "
                        f"{self.converts[precision]} convert<>"),
            checks.that(library, "mm" in self.library_calls[precision], self.library_calls[precision]),
            checks.at_least(cost, 1e3 * self.compile_s[precision] / eager, 100,
                            seen=f"{1e3 * self.compile_s[precision] / eager:,.0f} steps"),
            checks.that(speed, 1 / 3 < eager / compiled < 3, f"{eager / compiled:.3g}x eager's speed"),
        )


def compile_autocast(precisions=("fp32", "bf16"), *, width: int = 64, batch_size: int = 64, steps: int = 10,
                     warmup: int = 2, seed: int = 0) -> Compiled:
    """``torch.compile`` (inductor, the CPU's C++ backend) of the digits MLP under autocast, against eager.

    Per precision (``fp32``: no autocast), one train step ``loss = F.cross_entropy(model(x), y);
    loss.backward()``, eager and compiled, timed `steps` times each after `warmup`: the eager and the
    compiled steps take turns, so that a burst of other work on a shared machine slows both alike, and
    the best time counts (ms; `labkit.bench.matmul_ms` times the same way). All on one thread
    (``torch.set_num_threads(1)``, restored after): steps this small gain nothing from threads, and
    on a busy machine a thread that waits for a core costs each op a time slice. Eager
    autocast casts at every op (``aten._to_copy`` calls per step, counted with a dispatch mode);
    inductor sees the casts as graph nodes and fuses them into its generated C++ kernels
    (``cpp_fused__to_copy_...``; the element casts are ``convert<>`` in the code, read with
    ``torch._inductor.utils.run_and_get_code``). The matmuls stay library calls
    (``extern_kernels.mm``/``addmm``). Compiling takes seconds per precision (C++ compiler); dynamo's
    caches are reset first (``torch.compiler.reset()``) so the code is generated afresh. Where compiling
    fails (no C++ compiler, ...) the result says so, with the reason, instead of raising.

    >>> r = compile_autocast(("bf16",), steps=3)                        # doctest: +SKIP
    >>> r.eager_casts["bf16"] > 0, r.fused_cast_kernels["bf16"] > 0     # doctest: +SKIP
    (True, True)
    """
    precisions = names("precisions", precisions, ("fp32", "bf16", "fp16"))
    width = integer("width", width, minimum=1, maximum=4096)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=4096)
    steps = integer("steps", steps, minimum=1, maximum=1000)
    warmup = integer("warmup", warmup, minimum=0, maximum=100)
    seed = integer("seed", seed, minimum=0)
    net = mlp(width, seed)
    x, y = next(batches(batch_size, seed))

    def step(model, precision):
        with torch.autocast("cpu", dtype=DTYPE.get(precision, torch.bfloat16), enabled=precision != "fp32"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        net.zero_grad(set_to_none=True)
        return loss

    def best_ms(models, precision) -> list[float]:
        for _ in range(warmup):
            for model in models:
                step(model, precision)
        # taking turns: a burst of load slows every model alike
        return [1e3 * t for t in time_in_turns([lambda m=m: step(m, precision) for m in models], repeats=steps)]

    out = {k: {} for k in ("ms", "compile_s", "eager_casts", "kernels", "fused_cast_kernels", "converts",
                           "library_calls")}
    try:
        with one_thread():  # steps this small gain nothing from threads, and on busy cores they lose much
            for p in precisions:
                counter = OpLog()
                with counter:
                    step(net, p)
                out["eager_casts"][p] = counter.casts
                try:
                    compiled, out["compile_s"][p], code = _compile(step, net, p)
                except Exception as err:  # noqa: BLE001 - any compile failure is the answer, not a crash
                    text = str(err).strip().splitlines()
                    return Compiled(False, f"{type(err).__name__}: {text[0] if text else ''}"[:300], **out)
                for key, value in _read(code).items():
                    out[key][p] = value
                out["ms"][p, "eager"], out["ms"][p, "compiled"] = best_ms((net, compiled), p)
    finally:
        torch.compiler.reset()
    return Compiled(True, "", **out)


def _compile(step, net, precision):
    """``torch.compile(net)`` afresh, and its first `step`: the compiled module, the seconds that step took
    (compiling included), and the code inductor generated."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import run_and_get_code

    # no cache hits: the code must be generated (and seen) here; and inductor's first import
    # (torch/utils/mkldnn.py) calls torch.jit.script_method, which torch 2.13 marks deprecated
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script_method` is deprecated", DeprecationWarning)
        torch.compiler.reset()
        compiled = torch.compile(net)
        t0 = time.perf_counter()
        _, codes = run_and_get_code(step, compiled, precision)
    return compiled, time.perf_counter() - t0, "\n".join(codes)


def _read(code: str) -> dict:
    """What inductor's generated code holds: its C++ kernels, those that fuse a cast, the element casts
    (``convert<>``), and the library calls (the matmuls)."""
    kernels = set(re.findall(r"^(cpp_fused_\w+) = async_compile", code, re.M))
    calls = sorted(re.findall(r"\bextern_kernels\.(\w+)\(", code))
    return {"kernels": len(kernels), "fused_cast_kernels": sum("_to_copy" in k for k in kernels),
            "converts": len(re.findall(r"\bconvert<", code)),
            "library_calls": ", ".join(f"{c} x{calls.count(c)}" for c in sorted(set(calls))) or "-"}


__all__ = ["Compiled", "compile_autocast"]
