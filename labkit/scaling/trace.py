"""Replay a sequence of overflow / no-overflow steps through a loss-scaling rule.

>>> from labkit import scaling
>>> t = scaling.simulate("torch", [False, True, False, False], init_scale=2**16, growth_interval=2)
>>> t.scales.tolist(), t.applied.tolist(), t.final_scale
([65536.0, 65536.0, 32768.0, 32768.0], [True, False, True, True], 65536.0)

``simulate`` runs each preset's tight loop (a million steps in well under a second);
``engine="adjust"`` replays the same rule one value at a time through
``scaler.adjust(finite)`` -- the tests check that both agree step for step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from labkit.scaling import _numbers as num
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
      engine: "fast" (a tight loop per preset) or "adjust" (the value-based scaler).
      **preset_options: the preset's own options, e.g. ``hysteresis=2`` for "deepspeed".

    >>> simulate("deepspeed", [True, True, True], init_scale=8, hysteresis=2).scales.tolist()
    [8.0, 8.0, 4.0]
    """
    p = get_preset(preset)
    flags = num.check_overflows(overflows)
    if engine not in ("fast", "adjust"):
        raise ValueError(f"engine must be 'fast' or 'adjust'; got {engine!r}")
    opts = p.resolve(init_scale=init_scale, growth_interval=growth_interval, **preset_options)
    if engine == "fast":
        scales, applied, extras, stopped, final = p.fast(flags, opts)
    else:
        scales, applied, extras, stopped, final, _ = _replay(p.scaler.create(**opts), len(flags),
                                                             lambda i, _scale: flags[i])
    return _trace(p, opts, flags, scales, applied, extras, stopped, final)


def _trace(p, opts, flags, scales, applied, extras, stopped, final) -> Trace:
    """A Trace from what a replay returned (``applied`` None: every clean step applied, no other)."""
    overflows = np.asarray(flags, dtype=bool)
    return Trace(
        preset=p.name,
        options=opts,
        overflows=overflows,
        scales=num.floats(scales),
        applied=~overflows[: len(scales)] if applied is None else np.asarray(applied, dtype=bool),
        final_scale=num.to_float(final),
        extras={k: np.asarray(v) for k, v in extras.items()},
        stopped_at=stopped,
        stop_reason=None if stopped is None else _stop_reason(p.name),
    )


def _stop_reason(name: str) -> str:
    return (f"{name}: an overflow arrived with the scale at min_loss_scale; DeepSpeed raises "
            "'Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.'")


def _replay(state, steps: int, overflow_at):
    """Step a value-based scaler: ``overflow_at(step, scale)`` says whether that step overflows.

    Returns (scales, applied, extras, stopped_at, final_scale, overflows).
    """
    names = state.TRACKED
    scales, applied, flags, extras = [], [], [], {k: [] for k in names}
    stopped = None
    for i in range(steps):
        overflow = bool(overflow_at(i, state.loss_scale))
        flags.append(overflow)
        scales.append(state.loss_scale)
        applied.append(state.applies(not overflow))
        try:
            state = state.adjust(not overflow)
        except ScalerStopped:
            stopped = i
        for k in names:
            extras[k].append(getattr(state, k))
        if stopped is not None:
            break
    return scales, applied, extras, stopped, state.loss_scale, flags


class _FormatOverflow:
    """overflow(scale, step) = the step's largest |gradient| times the scale overflows fmt."""

    def __init__(self, amax, fmt):
        from labkit import formats as lf

        self.fmt = lf.get(fmt)
        self.amax = amax

    def __call__(self, step, scale) -> bool:
        value = self.amax[step] * num.to_float(scale)
        if not math.isfinite(value):
            return True
        return not math.isfinite(float(self.fmt.round(value)))


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
    amax = np.asarray(amax, dtype=np.float64)
    if amax.ndim != 1 or not np.all(np.isfinite(amax)) or np.any(amax < 0):
        raise ValueError("amax must be a 1-D sequence of finite numbers >= 0 (the largest |gradient| of each step)")
    opts = p.resolve(init_scale=init_scale, growth_interval=growth_interval, **preset_options)
    scales, applied, extras, stopped, final, flags = _replay(p.scaler.create(**opts), len(amax),
                                                             _FormatOverflow(amax, fmt))
    return _trace(p, opts, flags, scales, applied, extras, stopped, final)


_KINDS = ("none", "every", "random", "burst")


def overflow_pattern(kind: str, steps: int | None = None, *, every: int | None = None, p: float | None = None,
                     start: int | None = None, length: int = 1, seed: int = 0) -> np.ndarray:
    """An overflow sequence: drawn as text, or generated.

    * a drawing: ``overflow_pattern("..x...xx")`` -- ``x`` overflow, ``.`` clean;
    * ``overflow_pattern("every", steps, every=k)`` -- every k-th step overflows;
    * ``overflow_pattern("random", steps, p=0.01, seed=0)`` -- each step with probability p;
    * ``overflow_pattern("burst", steps, start=i, length=n)`` -- n overflows in a row from i;
    * ``overflow_pattern("none", steps)``.

    >>> overflow_pattern("..x.x").tolist()
    [False, False, True, False, True]
    >>> overflow_pattern("every", 6, every=3).tolist()
    [False, False, True, False, False, True]
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a drawing such as '..x..' or one of {', '.join(_KINDS)}; got {kind!r}")
    if kind not in _KINDS:
        bad = sorted(set(kind) - set(".x"))
        if bad or not kind:
            raise ValueError("a drawing uses '.' (clean step) and 'x' (overflow) only; "
                             f"got {bad or 'an empty string'}; "
                             f"or give a kind: {', '.join(_KINDS)}")
        return np.array([c == "x" for c in kind], dtype=bool)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an integer >= 0 for kind {kind!r}; got {steps!r}")
    out = np.zeros(int(steps), dtype=bool)
    if kind == "every":
        k = num.check_interval("every", every, "overflow every k-th step")
        out[k - 1::k] = True
    elif kind == "random":
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"p must be a probability in [0, 1]; got {p!r}")
        out = np.random.default_rng(seed).random(int(steps)) < p
    elif kind == "burst":
        first = num.check_count("start", start) if start is not None else 0
        out[first:first + num.check_count("length", length)] = True
    return out


def _as_dict(traces) -> dict:
    """A Trace, a list of Traces or {label: Trace} as {label: Trace} (TypeError for anything else)."""
    if isinstance(traces, Trace):
        return {traces.preset: traces}
    items = traces if isinstance(traces, dict) else {t.preset: t for t in traces}
    for label, t in items.items():
        if not isinstance(t, Trace):
            raise TypeError(f"traces must be Trace objects (from simulate); {label!r} is {type(t).__name__}")
    return items


def traces_table(traces):
    """One row per trace: steps run, overflows, skipped, poisoned, smallest/final scale, stop."""
    from labkit.formats import Table

    rows = []
    for label, t in _as_dict(traces).items():
        s = t.summary()
        rows.append((str(label), str(s["steps"]), str(s["overflows"]), str(s["skipped"]), str(s["poisoned"]),
                     f"{s['min_scale']:g}", f"{s['max_scale']:g}", f"{s['final_scale']:g}",
                     "-" if t.stopped_at is None else f"step {t.stopped_at}"))
    return Table(("rule", "steps run", "overflows", "skipped", "inf/nan applied", "smallest scale", "largest scale",
                  "final scale", "stopped"), tuple(rows), "What each rule did")
