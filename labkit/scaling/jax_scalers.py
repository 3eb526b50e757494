"""JAX's loss scaling: ``jmp.DynamicLossScale`` and optax's ``apply_if_finite`` skip rule.

In JAX nothing is automatic: jmp adjusts the scale, the training step itself decides
whether to keep the new parameters (``jmp.select_tree(grads_finite, new, old)``), and
optax can wrap an optimizer so that non-finite updates are dropped.

>>> s = JmpLossScale.create(loss_scale=2.0**15, period=2)
>>> [(s := s.adjust(f)).loss_scale for f in (True, True, False)]
[32768.0, 65536.0, 32768.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit._validate import integer
from labkit.scaling import _numbers as num
from labkit.scaling.basic import _Scaler

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class JmpLossScale(_Scaler):
    """``jmp.DynamicLossScale(loss_scale, counter=0, period=2000, factor=2,
    min_loss_scale=1.0)`` -- the initial scale has no default (jmp's docstring uses 2**15).

    Source: google-deepmind/jmp ``jmp/_src/loss_scale.py`` (``DynamicLossScale.adjust``)::

        first_finite = lambda a, b: a if isfinite(a) else b
        if grads_finite:
            if counter == period - 1:
                loss_scale = first_finite(loss_scale * factor, loss_scale)
        else:
            loss_scale = maximum(min_loss_scale, loss_scale / factor)
        counter = ((counter + 1) % period) * grads_finite
        # the caller skips the update: params = jmp.select_tree(grads_finite, new, old)

    Where it differs: a **floor** (``min_loss_scale``, default 1) and growth into inf
    **refused**; the scale keeps the dtype it was given (float32 here). One trap found
    by replaying the real package: ``DynamicLossScale.tree_unflatten`` rebuilds the
    state from ``(loss_scale, counter)`` and ``(period, factor)`` only, so inside
    ``jax.jit`` or ``lax.scan`` a custom ``min_loss_scale`` silently becomes 1. And
    under jit XLA turns the division by the constant ``factor`` into a multiplication by
    its float32 reciprocal (for factor 3: 5 / 3 -> 1.6666667 instead of 1.6666666; no
    difference for factor 2). ``under_jit=True`` reproduces both.
    """

    loss_scale: float = 2.0**15
    period: int = 2000
    factor: int = 2
    min_loss_scale: float = 1.0
    under_jit: bool = False
    counter: int = 0

    TRACKED = ("counter",)
    COUNTER = "counter"

    def __post_init__(self):
        self._set(
            loss_scale=num.check_scale("loss_scale", self.loss_scale, float32=True),
            period=integer("period", self.period, minimum=1),
            factor=num.f32(num.check_growth("factor", self.factor)),  # jnp casts a weak float to float32
            min_loss_scale=num.check_floor("min_loss_scale", self.min_loss_scale, float32=True),
            under_jit=num.check_flag("under_jit", self.under_jit),
        )
        if not math.isfinite(self.factor):
            raise ValueError(f"factor must be a number > 1 that float32 holds (at most {num.F32_MAX:.8g}); "
                             f"got {self.factor!r}")
        if self.under_jit and self.min_loss_scale != 1.0:
            raise ValueError("under_jit=True means min_loss_scale=1.0 (jit rebuilds jmp's state without it); "
                             f"got min_loss_scale={self.min_loss_scale!r} -- create() sets it for you")
        self._set(counter=num.check_counter("counter", self.counter, self.period, "period"))

    @classmethod
    def create(cls, loss_scale=2.0**15, period=2000, factor=2, min_loss_scale=1.0, under_jit=False):
        floor = num.check_floor("min_loss_scale", min_loss_scale, float32=True)
        jit = num.check_flag("under_jit", under_jit)
        return cls(loss_scale, period, factor, 1.0 if jit else floor, jit)

    def _shrink(self, s: float) -> float:
        if self.under_jit:
            return num.f32(s * num.f32(1.0 / self.factor))
        return num.f32(s / self.factor)

    def _adjust(self, finite: bool) -> "JmpLossScale":
        if not finite:
            return self._next(loss_scale=max(self.min_loss_scale, self._shrink(self.loss_scale)), counter=0)
        scale = self.loss_scale
        if self.counter == self.period - 1:
            grown = num.f32(scale * self.factor)
            scale = grown if math.isfinite(grown) else scale
        return self._next(loss_scale=scale, counter=(self.counter + 1) % self.period)


def fast_jmp(flags, opts):
    f32, isfinite = num.f32, math.isfinite
    s = f32(opts["loss_scale"])
    n, k = opts["period"], f32(opts["factor"])
    jit = opts["under_jit"]
    floor = 1.0 if jit else f32(opts["min_loss_scale"])
    inv = f32(1.0 / k)
    last = n - 1
    scales, counters = [], []
    keep, track = scales.append, counters.append
    c = 0
    for o in flags:
        keep(s)
        if o:
            s = max(floor, f32(s * inv) if jit else f32(s / k))
            c = 0
        else:
            if c == last:
                grown = f32(s * k)
                if isfinite(grown):
                    s = grown
            c = (c + 1) % n
        track(c)
    return scales, None, {"counter": counters}, None, s


@dataclass(frozen=True)
class OptaxApplyIfFinite(_Scaler):
    """``optax.apply_if_finite(inner, max_consecutive_errors)`` -- a skip rule, no scale.

    Source: google-deepmind/optax ``optax/transforms/_conditionality.py``
    (``apply_if_finite``; the counters use ``numerics.safe_increment``, which saturates
    at the int32 maximum)::

        notfinite_count = 0 if isfinite else notfinite_count + 1
        if isfinite or notfinite_count > max_consecutive_errors:
            updates = inner.update(updates)    # applied -- even if they are inf/nan!
        else:
            updates = zeros                    # skipped
        total_notfinite += 0 if isfinite else 1

    Where it differs: optax never scales the loss (use it with jmp for that), and after
    ``max_consecutive_errors`` skipped steps in a row it **gives up and applies** the
    non-finite update. optax has no default for ``max_consecutive_errors``.
    """

    max_consecutive_errors: int = 0
    notfinite_count: int = 0
    total_notfinite: int = 0
    loss_scale: float = 1.0

    TRACKED = ("notfinite_count", "total_notfinite")
    COUNTER = None

    def __post_init__(self):
        self._set(max_consecutive_errors=integer("max_consecutive_errors", self.max_consecutive_errors,
                                                 minimum=0, maximum=INT32_MAX))
        self._set(notfinite_count=integer("notfinite_count", self.notfinite_count, minimum=0, maximum=INT32_MAX),
                  total_notfinite=integer("total_notfinite", self.total_notfinite, minimum=0, maximum=INT32_MAX))
        if self.total_notfinite < self.notfinite_count:
            raise ValueError(f"total_notfinite ({self.total_notfinite}) counts every non-finite step: it must be at "
                             f"least notfinite_count ({self.notfinite_count}), the ones in a row")
        if num.check_scale("loss_scale", self.loss_scale) != 1:
            raise ValueError(f"loss_scale of OptaxApplyIfFinite is always 1 (optax scales nothing); "
                             f"got {self.loss_scale!r}")

    @classmethod
    def create(cls, max_consecutive_errors=None):
        if max_consecutive_errors is None:
            raise ValueError("preset 'optax' needs max_consecutive_errors (an integer >= 0); optax has no default")
        return cls(max_consecutive_errors)

    def _applies(self, finite: bool) -> bool:
        return finite or min(self.notfinite_count + 1, INT32_MAX) > self.max_consecutive_errors

    def _adjust(self, finite: bool) -> "OptaxApplyIfFinite":
        if finite:
            return self._next(notfinite_count=0)
        return self._next(notfinite_count=min(self.notfinite_count + 1, INT32_MAX),
                          total_notfinite=min(self.total_notfinite + 1, INT32_MAX))


def fast_optax(flags, opts):
    m = opts["max_consecutive_errors"]
    applied, counts, totals = [], [], []
    apply_, track, total_ = applied.append, counts.append, totals.append
    c = t = 0
    for o in flags:
        if o:
            c = min(c + 1, INT32_MAX)
            t = min(t + 1, INT32_MAX)
            apply_(c > m)
        else:
            c = 0
            apply_(True)
        track(c)
        total_(t)
    return [1.0] * len(flags), applied, {"notfinite_count": counts, "total_notfinite": totals}, None, 1.0
