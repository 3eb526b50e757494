"""Loss scalers as values: a state plus a pure ``adjust(finite) -> new state``.

This is jmp's design (``jmp.NoOpLossScale``, ``StaticLossScale``, ``DynamicLossScale``
in ``jmp/_src/loss_scale.py``): a scaler is a frozen dataclass, and a training step
replaces it with ``scaler.adjust(grads_finite)``. A value is easy to replay, to test
and to plot. Every scaler in ``labkit.scaling`` answers the same three questions:

* ``loss_scale`` -- the scale multiplied into the loss before this step's backward;
* ``applies(finite)`` -- is this step's optimizer update applied (or skipped)?
* ``adjust(finite)`` -- the scaler for the next step.

The three textbook scalers live here; the library presets (torch, Keras, jmp, Apex,
DeepSpeed, optax) live in their own modules and keep each library's exact rules.

>>> s = DynamicLossScale(loss_scale=8.0, growth_interval=2)
>>> for finite in [True, True, False, True]:
...     s = s.adjust(finite)
...     print(s.loss_scale, s.counter)
8.0 1
16.0 0
8.0 0
8.0 1
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit._validate import integer
from labkit.scaling import _numbers as num


class ScalerStopped(RuntimeError):
    """Raised by ``adjust`` where the real library stops training (DeepSpeed at its floor)."""


class _Scaler:
    """Shared behaviour: the checks, and the update applied only when the gradients are finite.

    ``adjust(finite)`` and ``applies(finite)`` take the step's flag -- True when every
    gradient was finite -- as a bool (a string or a NaN is not a flag) and hand it to the
    class's ``_adjust`` / ``_applies``. A state built by hand is checked in
    ``__post_init__`` (a scale must be finite and > 0, a counter within its interval);
    the states ``adjust`` returns are not re-checked: a replay may reach a scale of 0 or
    inf, exactly as the library does.
    """

    TRACKED: tuple[str, ...] = ()  # state fields recorded after every step
    COUNTER: str | None = None  # the field that counts steps towards the next growth

    def applies(self, finite: bool) -> bool:
        """Is this step's optimizer update applied?"""
        return self._applies(num.check_finite_flag(finite))

    def adjust(self, finite: bool):
        """The scaler for the next step."""
        return self._adjust(num.check_finite_flag(finite))

    def _applies(self, finite: bool) -> bool:
        return finite

    def _set(self, **values) -> None:
        num.set_fields(self, **values)

    def _next(self, **changes):
        """The next state: ``dataclasses.replace`` without ``__post_init__``'s checks (see the class docstring)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


@dataclass(frozen=True)
class NoOpLossScale(_Scaler):
    """No loss scaling and no finite check: scale 1, every update applied (jmp.NoOpLossScale).

    Right for fp32 and bf16, whose exponent range is fp32's. With fp16 an inf gradient
    goes straight into the weights.

    >>> NoOpLossScale().adjust(False).loss_scale
    1.0
    """

    loss_scale: float = 1.0

    def __post_init__(self):
        if num.check_scale("loss_scale", self.loss_scale) != 1:
            raise ValueError(f"loss_scale of NoOpLossScale is always 1 (no scaling); got {self.loss_scale!r}")
        self._set(loss_scale=1.0)

    @classmethod
    def create(cls) -> "NoOpLossScale":
        return cls()

    def _applies(self, finite: bool) -> bool:
        return True

    def _adjust(self, finite: bool) -> "NoOpLossScale":
        return self


@dataclass(frozen=True)
class StaticLossScale(_Scaler):
    """A fixed scale S, as in seed 000 (``S = 2**15``) and ``jmp.StaticLossScale``.

    Algorithm::

        loss *= S; grads = grad(loss) / S       # the same S on every step
        if skip_nonfinite and not all_finite(grads): skip the update
        # jmp's StaticLossScale.adjust returns self; nothing checks the grads for you

    ``skip_nonfinite`` defaults to False because a static scale, as seed 000 describes
    it, has no overflow check: one overflow puts inf/nan into the weights.

    >>> StaticLossScale(2.0**15).adjust(False).loss_scale
    32768.0
    """

    loss_scale: float = 2.0**15
    skip_nonfinite: bool = False

    def __post_init__(self):
        self._set(loss_scale=num.check_scale("loss_scale", self.loss_scale),
                  skip_nonfinite=num.check_flag("skip_nonfinite", self.skip_nonfinite))

    @classmethod
    def create(cls, loss_scale=2.0**15, skip_nonfinite=False) -> "StaticLossScale":
        return cls(loss_scale, skip_nonfinite)

    def _applies(self, finite: bool) -> bool:
        return finite or not self.skip_nonfinite

    def _adjust(self, finite: bool) -> "StaticLossScale":
        return self


@dataclass(frozen=True)
class DynamicLossScale(_Scaler):
    """Textbook dynamic loss scaling (Micikevicius et al. 2018, section 3.3), in float64.

    Algorithm::

        if grads are finite:
            apply the update; counter += 1
            if counter == growth_interval: scale *= growth_factor; counter = 0
        else:
            skip the update; scale *= backoff_factor; counter = 0
        scale = clip(scale, min_scale, max_scale)   # bounds optional (None = none)

    Each library adds its own details (float32 storage, a floor, a cap, hysteresis, an
    off-by-one in the counter); the presets reproduce those exactly. Built directly or with
    ``create``, every field is checked: a ``backoff_factor`` of 2 would double the scale
    on an overflow, so it must lie in (0, 1).

    >>> s = DynamicLossScale(loss_scale=4.0, growth_interval=1, min_scale=2.0)
    >>> [s := s.adjust(f) for f in (False, False, True)][-1].loss_scale
    4.0
    """

    loss_scale: float = 2.0**15
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float | None = None
    max_scale: float | None = None
    counter: int = 0

    TRACKED = ("counter",)
    COUNTER = "counter"

    def __post_init__(self):
        self._set(
            loss_scale=float(num.check_scale("loss_scale", self.loss_scale)),
            growth_interval=integer("growth_interval", self.growth_interval, minimum=1),
            growth_factor=num.check_growth("growth_factor", self.growth_factor),
            backoff_factor=num.check_backoff("backoff_factor", self.backoff_factor),
            min_scale=num.check_floor("min_scale", self.min_scale, allow_none=True),
            max_scale=num.check_scale("max_scale", self.max_scale, allow_none=True),
        )
        lo, hi = self.min_scale, self.max_scale
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_scale ({lo}) must not exceed max_scale ({hi})")
        self._set(counter=num.check_counter("counter", self.counter, self.growth_interval, "growth_interval"))

    @classmethod
    def create(cls, loss_scale=2.0**15, growth_interval=2000, growth_factor=2.0, backoff_factor=0.5,
               min_scale=None, max_scale=None) -> "DynamicLossScale":
        return cls(loss_scale, growth_interval, growth_factor, backoff_factor, min_scale, max_scale)

    def _clip(self, s: float) -> float:
        if self.min_scale is not None:
            s = max(s, self.min_scale)
        if self.max_scale is not None:
            s = min(s, self.max_scale)
        return float(s)

    def _adjust(self, finite: bool) -> "DynamicLossScale":
        if not finite:
            return self._next(loss_scale=self._clip(self.loss_scale * self.backoff_factor), counter=0)
        counter = self.counter + 1
        if counter == self.growth_interval:
            return self._next(loss_scale=self._clip(self.loss_scale * self.growth_factor), counter=0)
        return self._next(counter=counter)


# -- fast replays (one tight loop each; tests check them against adjust() step by step) --

def fast_none(flags, opts):
    return [1.0] * len(flags), [True] * len(flags), {}, None, 1.0


def fast_static(flags, opts):
    s = opts["loss_scale"]
    applied = [not o for o in flags] if opts["skip_nonfinite"] else [True] * len(flags)
    return [s] * len(flags), applied, {}, None, s


def fast_dynamic(flags, opts):
    s = float(opts["loss_scale"])
    n, g, b = opts["growth_interval"], opts["growth_factor"], opts["backoff_factor"]
    lo = -num.INF if opts["min_scale"] is None else opts["min_scale"]
    hi = num.INF if opts["max_scale"] is None else opts["max_scale"]
    scales, counters = [], []
    keep, track = scales.append, counters.append
    c = 0
    for o in flags:
        keep(s)
        if o:
            s = float(min(max(s * b, lo), hi))
            c = 0
        else:
            c += 1
            if c == n:
                s = float(min(max(s * g, lo), hi))
                c = 0
        track(c)
    return scales, None, {"counter": counters}, None, s
