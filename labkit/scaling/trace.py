"""Replay a sequence of overflow / no-overflow steps through a loss-scaling rule.

>>> from labkit import scaling
>>> t = scaling.simulate("torch", [False, True, False, False], init_scale=2**16, growth_interval=2)
>>> t.scales.tolist(), t.applied.tolist(), t.final_scale
([65536.0, 65536.0, 32768.0, 32768.0], [True, False, True, True], 65536.0)

Each scaler class states its library's rule once, as ``rule()``: a pure function of plain
numbers. ``simulate`` loops over it (100,000 steps, the playground's cap, in well under
half a second: ``benchmarks/scaler_replay.py``); ``engine="adjust"`` replays the same rule
one value at a time through ``scaler.adjust(finite)``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from labkit._validate import choice, integer, number, shown
from labkit.scaling import _numbers as num
from labkit.scaling import seed004
from labkit.scaling.basic import ScalerStopped
from labkit.scaling.registry import get_preset


@dataclass(frozen=True, eq=False)
class Trace:
    """What a loss-scaling rule did, step by step.

    Attributes:
      preset: the preset's name; options: every option, defaults filled in.
      overflows: the input, one flag per step (True = inf/nan gradients); all of it,
        even when the run stopped early.
      scales: the loss scale used in each step's backward pass (float64).
      applied: whether each step's optimizer update was applied.
      final_scale: the scale the next step would use.
      extras: other state after each step, under the library's own names
        ("growth_tracker", "hysteresis", "notfinite_count", ...); also readable as
        attributes (``trace.hysteresis``).
      stopped_at: the step at which the library stopped training (DeepSpeed raises when
        an overflow arrives at ``min_loss_scale``); the arrays end there. None otherwise.
    """

    preset: str
    options: dict
    overflows: np.ndarray
    scales: np.ndarray
    applied: np.ndarray
    final_scale: float
    extras: dict = field(default_factory=dict)
    stopped_at: int | None = None
    stop_reason: str | None = None

    def __post_init__(self):
        """Check and normalise the fields (a Trace comes from simulate; one built by hand must hold together)."""
        if not isinstance(self.options, dict):
            raise TypeError(f"options must be a dict of the preset's options; got {type(self.options).__name__}")
        num.set_fields(self, preset=get_preset(self.preset).name, overflows=_flags("overflows", self.overflows),
             scales=_steps("scales", self.scales), applied=_flags("applied", self.applied))
        n = len(self.scales)
        if len(self.applied) != n or n > len(self.overflows):
            raise ValueError(f"applied ({len(self.applied)}) must have one flag per scale ({n}), and there are at "
                             f"most as many scales as overflows ({len(self.overflows)})")
        if isinstance(self.final_scale, (bool, np.bool_)) or not isinstance(self.final_scale, numbers.Real):
            raise TypeError(f"final_scale must be a number; got {type(self.final_scale).__name__}")
        if not isinstance(self.extras, dict) or not all(isinstance(k, str) for k in self.extras):
            raise TypeError("extras must be a dict {state name: one value per step}")
        extras = {k: np.asarray(v) for k, v in self.extras.items()}
        for k, v in extras.items():
            if v.shape != (n,) or v.dtype.kind not in "biuf":
                raise ValueError(f"extras[{k!r}] must hold one number per step ({n}); got shape {v.shape}")
        num.set_fields(self, final_scale=num.to_float(self.final_scale), extras=extras)
        if self.stopped_at is not None:
            num.set_fields(self, stopped_at=integer("stopped_at", self.stopped_at, minimum=0, maximum=max(n - 1, 0)))
        if self.stop_reason is not None and not isinstance(self.stop_reason, str):
            raise TypeError(f"stop_reason must be None or a string; got {type(self.stop_reason).__name__}")

    def __getattr__(self, name):
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"Trace has no attribute {name!r}; tracked here: {', '.join(extras) or 'nothing'}")

    def __len__(self) -> int:
        return len(self.scales)

    @property
    def skipped(self) -> np.ndarray:
        """Steps whose update was not applied."""
        return ~self.applied

    @property
    def poisoned(self) -> np.ndarray:
        """Steps whose non-finite gradients were applied to the weights anyway."""
        return self.applied & self.overflows[: len(self.applied)]

    @property
    def counter(self) -> np.ndarray | None:
        """The growth counter after each step (the library's own counter), if the rule has one."""
        name = get_preset(self.preset).counter
        return self.extras.get(name) if name else None

    def summary(self) -> dict:
        """Counts and extremes: steps, overflows, skipped, poisoned, min/max/final scale."""
        scales = self.scales
        return {
            "preset": self.preset,
            "steps": len(self),
            "overflows": int(self.overflows[: len(self)].sum()),
            "skipped": int(self.skipped.sum()),
            "poisoned": int(self.poisoned.sum()),
            "min_scale": float(scales.min()) if len(scales) else self.final_scale,
            "max_scale": float(scales.max()) if len(scales) else self.final_scale,
            "final_scale": self.final_scale,
            "stopped_at": self.stopped_at,
        }

    def __repr__(self) -> str:
        s = self.summary()
        stop = f", stopped at step {self.stopped_at}" if self.stopped_at is not None else ""
        return (f"Trace({self.preset!r}: {s['steps']} steps, {s['overflows']} overflows, {s['skipped']} skipped, "
                f"{s['poisoned']} poisoned, final_scale={self.final_scale:g}{stop})")


def simulate(preset, overflows, init_scale=None, growth_interval=None, *, engine: str = "fast",
             **preset_options) -> Trace:
    """Replay ``overflows`` (True = that step's gradients had an inf/nan) through a preset.

    Args:
      preset: a name in ``PRESETS`` ("torch", "keras", "tf-keras", "deepspeed",
        "deepspeed-fp16-optimizer", "jmp", "apex", "optax", "seed004", "static",
        "dynamic", "none").
      overflows: a sequence (or 1-D numpy array) of booleans, one per step.
      init_scale, growth_interval: generic names for the preset's own options
        (torch ``init_scale`` / ``growth_interval``, Keras ``initial_scale`` /
        ``dynamic_growth_steps``, DeepSpeed ``init_scale`` / ``loss_scale_window``,
        jmp ``loss_scale`` / ``period``, Apex ``init_scale`` / ``scale_window``).
      engine: "fast" (a loop over the scaler's ``rule()`` on plain numbers) or "adjust"
        (one scaler value per step, through ``adjust``): the same rule, the same trace.
      **preset_options: the preset's own options, e.g. ``hysteresis=2`` for "deepspeed".

    >>> simulate("deepspeed", [True, True, True], init_scale=8, hysteresis=2).scales.tolist()
    [8.0, 8.0, 4.0]
    """
    p = get_preset(preset)
    flags = num.check_overflows(overflows)
    choice("engine", engine, ("fast", "adjust"))
    opts = p.resolve(init_scale=init_scale, growth_interval=growth_interval, **preset_options)
    state = p.scaler.create(**opts)
    scales, applied, extras, stopped, final, _ = _replay(state, len(flags), lambda i, _scale: flags[i],
                                                         _one_by_one(state) if engine == "adjust" else None)
    return _trace(p, opts, flags, scales, applied, extras, stopped, final)


def _trace(p, opts, flags, scales, applied, extras, stopped, final) -> Trace:
    """A Trace from what a replay returned."""
    overflows = np.asarray(flags, dtype=bool)
    return Trace(
        preset=p.name,
        options=opts,
        overflows=overflows,
        scales=num.floats(scales),
        applied=np.asarray(applied, dtype=bool),
        final_scale=num.to_float(final),
        extras={k: np.asarray(v) for k, v in extras.items()},
        stopped_at=stopped,
        stop_reason=None if stopped is None else _stop_reason(p.name),
    )


def _stop_reason(name: str) -> str:
    if name == "seed004":
        return (f"{name}: the int scale grew past float64's range, and the seed's `scale /= 2` raises "
                f"'{seed004.STOP_MESSAGE}'")
    return (f"{name}: an overflow arrived with the scale at min_loss_scale; DeepSpeed raises "
            "'Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.'")


def _replay(state, steps: int, overflow_at, step=None):
    """Run ``state.rule()`` (or ``step``) on plain tuples; ``overflow_at(step, scale)``: does that step overflow?

    Returns (scales, applied, extras, stopped_at, final_scale, overflows).
    """
    step = state.rule() if step is None else step
    values = state.state_values()
    scales, applied, flags, after = [], [], [], []
    keep, apply, flag, track = scales.append, applied.append, flags.append, after.append
    stopped = None
    for i in range(steps):
        overflow = overflow_at(i, values[0])  # a bool (check_overflows' list, _FormatOverflow)
        flag(overflow)
        keep(values[0])
        try:
            done, values = step(not overflow, values)
        except ScalerStopped as stop:
            apply(stop.applied)
            track(values)
            stopped = i
            break
        apply(done)
        track(values)
    extras = {k: [v[j] for v in after] for j, k in ((state.STATE.index(k), k) for k in state.TRACKED)}
    return scales, applied, extras, stopped, values[0], flags


def _one_by_one(state):
    """The rule stepped through scaler values: ``adjust`` and ``applies``, one new value per step."""
    current = [state]

    def step(finite, _values):
        done = current[0].applies(finite)
        current[0] = current[0].adjust(finite)
        return done, current[0].state_values()
    return step


def _flags(name: str, values) -> np.ndarray:
    """One bool per step, as a 1-D numpy array."""
    if isinstance(values, np.ndarray) and values.dtype == bool and values.ndim == 1:
        return values
    return np.asarray(num.check_overflows(values, name), dtype=bool)


def _steps(name: str, values) -> np.ndarray:
    """One number per step, as a 1-D float64 array."""
    arr = num.real_array(name, values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per step); got shape {arr.shape}")
    return arr


class _FormatOverflow:
    """overflow(scale, step) = the step's largest |gradient| times the scale overflows fmt.

    Rounding to fmt is monotone, so "rounds to inf/nan" is "at least the smallest float64
    that does": found once by bisecting float64 bit patterns with ``fmt.round`` (the
    tests check it against ``fmt.round`` value by value).
    """

    def __init__(self, amax, fmt):
        from labkit import formats as lf

        self.fmt = lf.get(fmt)
        self.amax = amax.tolist()
        self.limit = overflow_threshold(self.fmt)

    def __call__(self, step, scale) -> bool:
        return not self.amax[step] * num.to_float(scale) < self.limit  # nan (0 * inf) overflows too


def overflow_threshold(fmt) -> float:
    """The smallest float64 that ``fmt.round`` turns into inf/nan (just above fmt's max)."""
    as_float = lambda bits: float(np.array(bits, np.int64).view(np.float64))  # noqa: E731
    lo = int(np.array(fmt.max, np.float64).view(np.int64))  # rounds to max: finite
    hi = int(np.array(np.inf, np.float64).view(np.int64))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if math.isfinite(float(fmt.round(as_float(mid)))):
            lo = mid
        else:
            hi = mid
    return as_float(hi)


def simulate_closed_loop(preset, amax, fmt="fp16", init_scale=None, growth_interval=None, **preset_options) -> Trace:
    """Let the gradients decide: step t overflows if ``amax[t] * scale_t`` overflows ``fmt``.

    ``amax`` is the largest |gradient| of each step (e.g. ``record_gradients().amax``),
    computed in fp32; the model of an fp16 step is "the scaled gradients are stored in
    fmt, and the largest one decides". The dynamic scale climbs until it overflows, backs
    off, and so hovers just under ``fmt.max / amax`` -- the top of the range of scales
    that lose nothing (see ``safe_scale_range``).

    >>> t = simulate_closed_loop("torch", [1.0] * 6, "fp16", init_scale=2**17, growth_interval=2)
    >>> t.scales.tolist(), t.overflows.tolist()
    ([131072.0, 65536.0, 32768.0, 32768.0, 65536.0, 32768.0], [True, True, False, False, True, False])
    """
    p = get_preset(preset)
    amax = num.real_array("amax", amax)
    if amax.ndim != 1 or not np.all(np.isfinite(amax)) or np.any(amax < 0):
        raise ValueError("amax must be a 1-D sequence of finite numbers >= 0 (the largest |gradient| of each step)")
    opts = p.resolve(init_scale=init_scale, growth_interval=growth_interval, **preset_options)
    overflow = _FormatOverflow(amax, fmt)
    scales, applied, extras, stopped, final, flags = _replay(p.scaler.create(**opts), len(amax), overflow)
    return _trace(p, opts, flags, scales, applied, extras, stopped, final)


_KINDS = ("none", "every", "random", "burst")
MAX_PATTERN_STEPS = 10_000_000  # a million steps replay in about a second


def overflow_pattern(kind: str, steps: int | None = None, *, every: int | None = None, p: float | None = None,
                     start: int | None = None, length: int = 1, seed: int = 0) -> np.ndarray:
    """An overflow sequence: drawn as text, or generated.

    * a drawing: ``overflow_pattern("..x...xx")`` -- ``x`` overflow, ``.`` clean;
    * ``overflow_pattern("every", steps, every=k)`` -- every k-th step overflows;
    * ``overflow_pattern("random", steps, p=0.01, seed=0)`` -- each step with probability p;
    * ``overflow_pattern("burst", steps, start=i, length=n)`` -- n overflows in a row from i;
    * ``overflow_pattern("none", steps)``.

    ``steps`` is from 1 to ten million. Every setting given is checked, also one the kind
    does not use.

    >>> overflow_pattern("..x.x").tolist()
    [False, False, True, False, True]
    >>> overflow_pattern("every", 6, every=3).tolist()
    [False, False, True, False, False, True]
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a drawing such as '..x..' or one of {', '.join(_KINDS)}; got {shown(kind)}")
    if every is not None:
        every = integer("every", every, minimum=1)
    if p is not None:
        p = number("p", p, minimum=0, maximum=1)
    first = 0 if start is None else integer("start", start, minimum=0)
    length = integer("length", length, minimum=1)
    seed = integer("seed", seed, minimum=0)
    if kind not in _KINDS:
        bad = sorted(set(kind) - set(".x"))
        if bad or not kind:
            raise ValueError("a drawing uses '.' (clean step) and 'x' (overflow) only; "
                             f"got {bad or 'an empty string'}; "
                             f"or give a kind: {', '.join(_KINDS)}")
        if steps is not None:
            raise ValueError(f"steps is for a kind ({', '.join(_KINDS)}); a drawing is as long as it is drawn")
        return np.array([c == "x" for c in kind], dtype=bool)
    if steps is None:
        raise TypeError(f"overflow_pattern({kind!r}, steps) needs steps: an integer from 1 to {MAX_PATTERN_STEPS}")
    steps = integer("steps", steps, minimum=1, maximum=MAX_PATTERN_STEPS)
    out = np.zeros(steps, dtype=bool)
    if kind == "every":
        if every is None:
            raise TypeError("kind 'every' needs every=k (an integer >= 1): every k-th step overflows")
        out[every - 1::every] = True
    elif kind == "random":
        if p is None:
            raise TypeError("kind 'random' needs p=... (a probability in [0, 1]) for each step to overflow")
        out = np.random.default_rng(seed).random(steps) < p
    elif kind == "burst":
        out[first:first + length] = True
    return out


def _as_dict(traces) -> dict:
    """A Trace, a list of Traces or {label: Trace} as {label: Trace} (TypeError for anything else).

    A list is labelled by preset; two traces of one preset need a dict to tell them apart.
    """
    if isinstance(traces, Trace):
        return {traces.preset: traces}
    if isinstance(traces, dict):
        items = traces
    elif isinstance(traces, (list, tuple)):
        items = {}
        for i, t in enumerate(traces):
            if not isinstance(t, Trace):
                raise TypeError(f"traces must be a Trace, a list of Traces or {{label: Trace}} (from simulate); "
                                f"item {i} is {type(t).__name__}")
            if t.preset in items:
                raise ValueError(f"traces holds two {t.preset!r} traces: give a dict {{label: Trace}} "
                                 "to label them apart")
            items[t.preset] = t
    else:
        raise TypeError("traces must be a Trace, a list of Traces or {label: Trace} (from simulate); "
                        f"got {type(traces).__name__}")
    for label, t in items.items():
        if not isinstance(t, Trace):
            raise TypeError(f"traces must be Trace objects (from simulate); {label!r} is {type(t).__name__}")
    return items


def traces_table(traces):
    """One row per trace: steps run, overflows, skipped, poisoned, smallest/final scale, stop."""
    from labkit.table import Table

    rows = []
    for label, t in _as_dict(traces).items():
        s = t.summary()
        rows.append((str(label), str(s["steps"]), str(s["overflows"]), str(s["skipped"]), str(s["poisoned"]),
                     f"{s['min_scale']:g}", f"{s['max_scale']:g}", f"{s['final_scale']:g}",
                     "-" if t.stopped_at is None else f"step {t.stopped_at}"))
    return Table(("rule", "steps run", "overflows", "skipped", "inf/nan applied", "smallest scale", "largest scale",
                  "final scale", "stopped"), tuple(rows), "What each rule did")
