"""The clinic's speed entry: bf16 autocast on a CPU that is slower than fp32 (`autocast_speed`), with the
verdict that reads the same on every CPU (`speed_verdict`).

Whether autocast gains on a CPU depends on what labkit.hardware detects: where bf16 is emulated, autocast
is no faster than fp32 (at least `EMULATED_AT_LEAST` times its time, the course's claim); where it is
native, the gain depends on the size.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from torch import nn

from labkit._validate import choice, integer, number, shown
from labkit.bench.timing import time_in_turns
from labkit.train.torch.clinic.case import Entry, linear
from labkit.train.torch.collectives import DTYPES
from labkit.train.torch.threads import one_thread

EMULATED_AT_LEAST = 0.9
"""Where labkit.hardware says the format is emulated, autocast takes at least this many times fp32's time."""


def _emulated_claim(precision: str, where: str = "") -> str:
    return (f"where labkit.hardware says {precision} is emulated, {precision} autocast is no faster than fp32{where} "
            f"(at least {EMULATED_AT_LEAST:g}x its time)")


def _emulated_state(native: bool) -> str:
    return "native, so this line does not apply" if native else "emulated"


@dataclass(frozen=True)
class AutocastSpeed:
    """Seconds per training step of an MLP in fp32 and under ``torch.autocast("cpu", dtype)`` (the
    best of `autocast_speed`'s repeats), with what `labkit.hardware.native_precision` says about that
    dtype here."""

    precision: str
    size: int
    fp32_s: float
    autocast_s: float
    native: bool
    why: str

    def __post_init__(self):
        choice("precision", self.precision, ("bf16", "fp16"))
        integer("size", self.size, minimum=1)
        for name in ("fp32_s", "autocast_s"):
            object.__setattr__(self, name, number(name, getattr(self, name), minimum=0, inclusive=False))
        if not isinstance(self.native, bool):
            raise TypeError(f"native must be True or False; got {type(self.native).__name__} {shown(self.native)}")
        if not isinstance(self.why, str):
            raise TypeError(f"why must be a string; got {type(self.why).__name__} {shown(self.why)}")

    @property
    def ratio(self) -> float:
        """Autocast's time over fp32's: above 1 means slower."""
        return self.autocast_s / self.fp32_s

    @property
    def no_gain_where_emulated(self) -> bool:
        """The course's claim for an emulated format, on this timing: the format is native here (the claim
        does not apply), or autocast took at least `EMULATED_AT_LEAST` times fp32's time."""
        return self.native or self.ratio >= EMULATED_AT_LEAST

    def check(self):
        """The course's claim for an emulated format, checked here (a `labkit.checks.Check`): where
        labkit.hardware says the format is emulated, autocast is no faster than fp32 (at least 0.9x its
        time). Where it is native the line does not apply (it says so after ``here:``): whether autocast
        gains then depends on the size (`speed_verdict` checks that with two sizes)."""
        from labkit import checks

        return checks.that(_emulated_claim(self.precision), self.no_gain_where_emulated,
                           f"{_emulated_state(self.native)}; {self.ratio:.2f}x fp32's time at width {self.size}")

    def __str__(self) -> str:
        return (f"width {self.size}: fp32 step {self.fp32_s * 1e3:.3g} ms, {self.precision} autocast step "
                f"{self.autocast_s * 1e3:.3g} ms ({self.ratio:.2f}x fp32's time)")


def autocast_speed(precision: str = "bf16", size: int = 128, repeats: int = 3) -> AutocastSpeed:
    """Time one SGD step of a 2-layer MLP (batch and width `size`) in fp32 and under CPU autocast in
    `precision` ("bf16" or "fp16"): one warm-up step each, then `repeats` steps each, the fp32 and the
    autocast steps taking turns (a burst of other work slows both alike); the best time counts. On one
    thread (``torch.set_num_threads(1)``, restored after), and the time is that thread's CPU time
    (``time.thread_time``): what the step costs, without the time slices a busy machine makes it wait
    for a core.

    Where the CPU has bf16 instructions (AVX512-BF16, AMX), oneDNN runs the bf16 matmuls on them, and
    whether a step gains depends on its size: autocast casts each fp32 weight to bf16 in every forward
    (work that grows as width**2), while the matmuls that speed up grow as width**3. Without them bf16 is
    emulated: on a CPU without AVX-512, PyTorch's bf16 matmul falls back to a generic kernel, many times
    slower than fp32 (notebook 07); with AVX-512 but no bf16 instructions, oneDNN converts to fp32 around
    fp32 arithmetic. The figures depend on this machine (show them in a cell nbval ignores; the `check`
    line is what reads the same everywhere).

    >>> s = autocast_speed(size=32, repeats=1)
    >>> s.precision, s.fp32_s > 0 < s.autocast_s
    ('bf16', True)
    """
    from labkit.hardware import native_precision

    precision = choice("precision", precision, ("bf16", "fp16"))
    size = integer("size", size, minimum=8, maximum=4096)
    repeats = integer("repeats", repeats, minimum=1, maximum=100)
    dtype = DTYPES[precision]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=gen)
    runs = []
    for low in (False, True):
        model = nn.Sequential(linear(size, size, gen), nn.ReLU(), linear(size, size, gen))
        runs.append((model, torch.optim.SGD(model.parameters(), lr=1e-3), low))

    def step(model, opt, low) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=low):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()

    with one_thread():
        for run in runs:
            step(*run)  # warm-up: oneDNN builds its kernels for these shapes
        fp32_s, autocast_s = time_in_turns([lambda run=run: step(*run) for run in runs], repeats=repeats,
                                           timer=time.thread_time)
    native = native_precision("torch", precision)
    return AutocastSpeed(precision, size, fp32_s, autocast_s, bool(native.native), native.why)


def speed_verdict(small: AutocastSpeed, large: AutocastSpeed):
    """The cpu-slower entry's claims on two timings of `autocast_speed` (`small` at a smaller width than
    `large`), as a `labkit.checks.Report` whose lines read the same on every CPU: where bf16 is emulated,
    autocast is no faster at either width; where it is native, the gain depends on the size -- autocast's
    time relative to fp32's is lower at the larger width (its casts grow as width**2, the matmuls that
    gain as width**3). On each machine one line is the one that applies; the other says so after
    ``here:``.

    >>> s, l = AutocastSpeed("bf16", 64, 1.0, 2.3, False, "x"), AutocastSpeed("bf16", 256, 1.0, 12.0, False, "x")
    >>> print(speed_verdict(s, l))  # doctest: +ELLIPSIS
    ✓ where labkit.hardware says bf16 is emulated, bf16 autocast is no faster than fp32 at either width ...
    ✓ where it says native, the gain depends on the size: ...  (here: emulated, so this line does not apply; ...)
    """
    from labkit import checks

    for name, s in (("small", small), ("large", large)):
        if not isinstance(s, AutocastSpeed):
            raise TypeError(f"{name} must be an AutocastSpeed (from autocast_speed); got {type(s).__name__} "
                            f"{shown(s)}")
    if small.size >= large.size or small.precision != large.precision or small.native != large.native:
        raise ValueError(f"small and large must time one precision on one machine, small at the smaller width; got "
                         f"{small.precision} at {small.size} and {large.precision} at {large.size}")
    p, native = small.precision, small.native
    seen = f"{small.ratio:.2f}x fp32's time at width {small.size}, {large.ratio:.2f}x at width {large.size}"
    return checks.report(
        checks.that(_emulated_claim(p, " at either width"),
                    small.no_gain_where_emulated and large.no_gain_where_emulated,
                    f"{_emulated_state(native)}; {seen}"),
        checks.that(f"where it says native, the gain depends on the size: {p} autocast's time relative to fp32's "
                    f"is lower at width {large.size} than at width {small.size}",
                    not native or large.ratio < small.ratio,
                    ("native; " if native else "emulated, so this line does not apply; ") + seen))


SPEED_SIZES = (64, 256)
"""The cpu-slower entry times bf16 autocast at these two widths (batch = width)."""


@functools.cache
def _measured() -> tuple[AutocastSpeed, AutocastSpeed]:
    """The cpu-slower case's timings at both `SPEED_SIZES`: its trigger measures afresh (it clears this
    cache), its fix and verdict read the figures the trigger printed."""
    return autocast_speed(size=SPEED_SIZES[0], repeats=9), autocast_speed(size=SPEED_SIZES[1], repeats=5)


def _speed_text() -> str:
    _measured.cache_clear()  # each run of the case times the steps anew
    small, large = _measured()
    return "\n".join([str(small), str(large),
                      f"(one SGD step of a 2-layer MLP, batch = width, on one thread, the best of several)",
                      f"labkit.hardware.native_precision('torch', 'bf16'): "
                      f"{'native' if small.native else 'emulated'} ({small.why})"])


def _speed_fix() -> str:
    def pick(s: AutocastSpeed) -> str:
        if s.native and s.ratio < 1:
            return f"native and {s.ratio:.2f}x fp32's time: bf16 autocast gains at this size"
        why = f"{s.ratio:.2f}x fp32's time" + ("" if s.native else ", and bf16 is emulated")
        return f"{why}: train in fp32 at this size"

    return "\n".join(f"width {s.size}: {pick(s)}" for s in _measured())


ENTRIES = (
    Entry("cpu-slower",
          "bf16 autocast on a CPU is slower than fp32",
          "autocast step",
          "the same MLP step in fp32 and under torch.autocast('cpu', dtype=torch.bfloat16), at two widths",
          "bf16 autocast on a CPU only where labkit.hardware.native_precision('torch', 'bf16') says native and a "
          "timing at your size shows a gain; otherwise fp32",
          "Mixed precision is faster where the hardware multiplies 16-bit numbers faster (Tensor Cores, a TPU, "
          "CPUs with AMX or AVX512-BF16). Without those instructions bf16 is emulated: on a CPU without AVX-512 "
          "PyTorch's bf16 matmul falls back to a generic kernel, many times slower than fp32 (notebook 07), and "
          "with AVX-512 but no bf16 instructions oneDNN converts to fp32 around fp32 arithmetic. Where bf16 is "
          "native, the gain depends on the size: autocast casts every weight to bf16 in every forward, work "
          "that grows as width**2, while the matmuls that speed up grow as width**3, so small layers can lose "
          "what large ones gain. Time it at your size.",
          _speed_text, _speed_fix, portable=False, verdict=lambda: speed_verdict(*_measured())),
)

__all__ = ["EMULATED_AT_LEAST", "ENTRIES", "SPEED_SIZES", "AutocastSpeed", "autocast_speed", "speed_verdict"]
