"""The hardware's ceiling: one big matmul per framework and dtype, each through the framework's own API.

`emulation_table` puts the 16-bit dtypes next to float32: on a CPU without bf16/fp16
instructions they are emulated, and several times slower.

>>> _versus(2.0, 1.0)
'2.0x faster'
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from labkit._validate import integer, number, shown
from labkit.bench.plan import MAX_STEPS, _split
from labkit.bench.records import _versus
from labkit.bench.timing import time_in_turns
from labkit.table import Table

MATMUL_FRAMEWORKS = ("torch", "jax", "tf")
MAX_MATMUL_N = 2**15  # two 32768 x 32768 float32 operands already take 8 GiB


def _seconds(name: str, value) -> float:
    """A time budget: a finite number > 0 (here, where matmul_ms's `number` argument hides _validate's)."""
    return number(name, value, minimum=0, inclusive=False)


def _check_ms(ms) -> None:
    """`matmul_ms`'s result: {(framework, dtype): milliseconds > 0}."""
    if not isinstance(ms, dict) or not ms:
        raise TypeError(f"ms must be the dict matmul_ms returns, {{(framework, dtype): milliseconds}}; got "
                        f"{type(ms).__name__} {shown(ms)}")
    for key, t in ms.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)):
            raise TypeError(f"ms must be keyed by (framework, dtype) pairs, as matmul_ms returns it; "
                            f"got key {shown(key)}")
        number(f"ms[{key!r}] (a time in milliseconds)", t, minimum=0, inclusive=False)


def matmul_ms(n: int = 1024, frameworks=MATMUL_FRAMEWORKS, dtypes=("float32", "bfloat16"),
              repeats: int = 5, number: int = 5, max_seconds: float | None = None) -> dict[tuple[str, str], float]:
    """Milliseconds of one (n, n) @ (n, n) matmul, per (framework, dtype): the best of `repeats`
    timings of `number` calls each, after a warm-up call (compilation, kernel selection).

    The repeats of a framework's dtypes take turns (fp32, bf16, fp32, bf16, ...: `time_in_turns`),
    so that other work on a shared machine does not favour one of them. Each framework runs on its default device (PyTorch: CUDA if present) with its *default*
    settings -- so on an NVIDIA GPU JAX and TensorFlow compute float32 in TF32 and PyTorch does
    not. Every call waits for its result. The operands are the same numbers in every framework.

    ``max_seconds`` bounds the timing of each (framework, dtype) after its warm-up call: a slow
    call (an emulated dtype) is then timed fewer times, down to once.
    """
    import timeit

    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    repeats = integer("repeats", repeats, minimum=1, maximum=MAX_STEPS)
    number_ = integer("number", number, minimum=1, maximum=MAX_STEPS)
    if max_seconds is not None:
        max_seconds = _seconds("max_seconds", max_seconds)
    frameworks = _split(frameworks, MATMUL_FRAMEWORKS, "framework")
    dtypes = _split(dtypes, ("float32", "bfloat16", "float16"), "dtype")
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = {}
    for framework in frameworks:
        plan = {}
        for dtype in dtypes:
            call = _matmul_call(framework, a, dtype)
            first = min(timeit.repeat(call, number=1, repeat=1))  # the warm-up, timed to size the rest
            k, r = number_, repeats
            if max_seconds is not None and first * k * r > max_seconds:
                k, r = 1, max(1, min(repeats, int(max_seconds / max(first, 1e-9))))
            plan[dtype] = (call, k, r)
        # the repeats of the dtypes take turns, so that a burst of other work on the machine
        # slows all of them alike rather than the one that happened to be timed then
        best = time_in_turns([c for c, _, _ in plan.values()], repeats=[r for _, _, r in plan.values()],
                             number=[k for _, k, _ in plan.values()])
        for dtype, seconds in zip(plan, best):
            out[framework, dtype] = 1e3 * seconds
    return out


def emulation_table(frameworks=MATMUL_FRAMEWORKS, dtypes=("bfloat16", "float16"), n: int = 256,
                    max_seconds: float = 5.0, ms: dict | None = None) -> Table:
    """Native or emulated, here: for each framework and 16-bit dtype, what `labkit.hardware`
    says about this machine (`native_precision`) and one (n, n) matmul's time against float32 in
    the same framework. An emulated dtype computes the right numbers, converted to and from
    fp32 or through a slow generic kernel: no faster than fp32, often many times slower.
    The last column is the most the hardware can gain (`labkit.hardware.speedup_ceiling`); a
    speed-up past it by more than its slack is marked "noise": a disturbed timing, not a finding.

    ``ms`` takes timings measured elsewhere ({(framework, dtype): ms}, as `matmul_ms` returns
    them, n x n, float32 included); without it the matmuls are timed here."""
    from labkit import hardware

    frameworks = _split(frameworks, MATMUL_FRAMEWORKS, "framework")
    dtypes = _split(dtypes, ("bfloat16", "float16"), "dtype")
    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    max_seconds = _seconds("max_seconds", max_seconds)
    if ms is not None:
        _check_ms(ms)
    if ms is None:
        ms = matmul_ms(n, frameworks, ("float32", *dtypes), repeats=5, number=3, max_seconds=max_seconds)
    missing = [(f, d) for f in frameworks for d in ("float32", *dtypes) if (f, d) not in ms]
    if missing:
        raise ValueError(f"ms lacks {', '.join(f'{f} {d}' for f, d in missing)}: time float32 and each 16-bit dtype")
    short = {"bfloat16": "bf16", "float16": "fp16"}
    rows, noisy = [], False
    report = hardware.detect(frameworks=())  # once: each call without a report would detect again
    for fw in frameworks:
        for d in dtypes:
            native = hardware.native_precision(fw, short[d], report)
            top = hardware.speedup_ceiling(fw, short[d], report)
            versus = _versus(ms[fw, "float32"], ms[fw, d])
            if top.exceeded_by(ms[fw, "float32"] / ms[fw, d]):
                versus, noisy = f"{versus}: noise", True
            rows.append((fw, d, "native" if native.native else "emulated", native.why,
                         f"{ms[fw, 'float32']:.3f}", f"{ms[fw, d]:.3f}", versus, f"{top.times:g}x"))
    title = f"{n} x {n} matmul: native or emulated on this machine"
    if noisy:
        title += (f" ('noise': over {hardware.CEILING_SLACK:g}x the most the hardware can gain, so a timing was "
                  "disturbed: run the cell again)")
    return Table(("framework", "dtype", "here", "why", "float32 ms", "16-bit ms", "against float32",
                  "most it can gain"), tuple(rows), title)


def _matmul_call(framework: str, a, dtype: str) -> Callable[[], object]:
    """A no-argument call that multiplies `a` by itself in `framework` and `dtype` and waits."""
    if framework == "torch":
        import torch

        gpu = torch.cuda.is_available()
        t = torch.from_numpy(a).to("cuda" if gpu else "cpu", getattr(torch, dtype))
        return lambda: (t @ t, torch.cuda.synchronize() if gpu else None)
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        j, matmul = jnp.asarray(a, dtype), jax.jit(jnp.matmul)
        return lambda: matmul(j, j).block_until_ready()
    from labkit.train.tf.models import import_tensorflow

    tf, _ = import_tensorflow()
    f = tf.constant(a, dtype)
    return lambda: tf.linalg.matmul(f, f)[0, 0].numpy()


def matmul_table(ms: dict[tuple[str, str], float], n: int) -> Table:
    """`matmul_ms`'s figures per framework: ms and GFLOP/s (2 n^3 flops) for each dtype, and each
    dtype's speed-up over the framework's own float32; the title says how the fastest run of each
    dtype, in any framework, compare -- what the hardware gives, whichever library gets it."""
    _check_ms(ms)
    n = integer("n", n, minimum=1, maximum=MAX_MATMUL_N)
    dtypes = list(dict.fromkeys(d for _, d in ms))
    rows = []
    for fw in dict.fromkeys(f for f, _ in ms):
        row = [fw]
        for d in dtypes:
            t = ms.get((fw, d))
            row += ["-", "-"] if t is None else [f"{t:.2f}", f"{2 * n**3 / t / 1e6:.0f}"]
        base = ms.get((fw, "float32"))
        row += [f"{base / ms[fw, d]:.1f}x" if base and (fw, d) in ms else "-" for d in dtypes if d != "float32"]
        rows.append(tuple(row))
    cols = ["framework"] + [c for d in dtypes for c in (f"{d} ms", f"{d} GFLOP/s")]
    cols += [f"{d} speed-up" for d in dtypes if d != "float32"]
    fastest = {d: min(t for (_, dd), t in ms.items() if dd == d) for d in dtypes}
    title = f"{n} x {n} matmul"
    if "float32" in fastest and "bfloat16" in fastest:
        title += f"; fastest float32 / fastest bfloat16, any framework: {fastest['float32'] / fastest['bfloat16']:.1f}x"
    return Table(tuple(cols), tuple(rows), title)


__all__ = ["MATMUL_FRAMEWORKS", "MAX_MATMUL_N", "emulation_table", "matmul_ms", "matmul_table"]
