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
from labkit.scaling.basic import Facts, _Scaler

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

    STATE = ("loss_scale", "counter")
    TRACKED = ("counter",)
    COUNTER = "counter"
    FACTS = Facts("jmp.DynamicLossScale(loss_scale) (no default scale: 2**15 as in its docstring)",
                  "google-deepmind/jmp jmp/_src/loss_scale.py", "loss_scale", "period", "float32 array",
                  "min_loss_scale (1)", "refuses to grow into inf", "caller skips; max(min, scale / factor)")

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

    def rule(self):
        f32, isfinite = num.f32, math.isfinite
        period, factor, floor, jit = self.period, self.factor, self.min_loss_scale, self.under_jit
        inverse = f32(1.0 / factor)  # what XLA multiplies by under jit

        def step(finite, state):
            loss_scale, counter = state
            if not finite:
                return False, (max(floor, f32(loss_scale * inverse) if jit else f32(loss_scale / factor)), 0)
            if counter == period - 1:
                grown = f32(loss_scale * factor)
                loss_scale = grown if isfinite(grown) else loss_scale
            return True, (loss_scale, (counter + 1) % period)
        return step


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

    max_consecutive_errors: int | None = None  # required: optax has no default
    notfinite_count: int = 0
    total_notfinite: int = 0
    loss_scale: float = 1.0

    STATE = ("loss_scale", "notfinite_count", "total_notfinite")
    TRACKED = ("notfinite_count", "total_notfinite")
    COUNTER = None
    FACTS = Facts("optax.apply_if_finite(inner, max_consecutive_errors)",
                  "google-deepmind/optax optax/transforms/_conditionality.py", None, None,
                  "no scale", "-", "-", "skip, until max_consecutive_errors in a row")

    def __post_init__(self):
        if self.max_consecutive_errors is None:
            raise ValueError("preset 'optax' needs max_consecutive_errors (an integer >= 0); optax has no default")
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
        return cls(max_consecutive_errors)

    def rule(self):
        max_errors = self.max_consecutive_errors

        def step(finite, state):
            if finite:
                return True, (state[0], 0, state[2])
            notfinite_count = min(state[1] + 1, INT32_MAX)  # numerics.safe_increment
            return notfinite_count > max_errors, (state[0], notfinite_count, min(state[2] + 1, INT32_MAX))
        return step
