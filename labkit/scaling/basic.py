"""Loss scalers as values: a state plus a pure ``adjust(finite) -> new state``.

This is jmp's design (``jmp.NoOpLossScale``, ``StaticLossScale``, ``DynamicLossScale``
in ``jmp/_src/loss_scale.py``): a scaler is a frozen dataclass, and a training step
replaces it with ``scaler.adjust(grads_finite)``. A value is easy to replay, to test
and to plot. Every scaler in ``labkit.scaling`` answers the same three questions:

* ``loss_scale`` -- the scale multiplied into the loss before this step's backward;
* ``applies(finite)`` -- is this step's optimizer update applied (or skipped)?
* ``adjust(finite)`` -- the scaler for the next step.

Each class writes its library's rule once, as ``rule()`` (a pure function of plain
numbers that ``adjust``, ``applies`` and ``simulate``'s replay loop all call), and states
the facts of the library it imitates in ``FACTS``, beside the docstring that explains them.

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
    """Raised by ``adjust`` where the real library stops training (DeepSpeed at its floor).

    ``applied``: whether that last step's update was applied before the library stopped.
    """

    def __init__(self, message: str = "", applied: bool = False):
        super().__init__(message)
        self.applied = applied


@dataclass(frozen=True)
class Facts:
    """What a scaler imitates, from where, and how it behaves at the extremes: one row of ``preset_table``.

    Each scaler class holds its own (``FACTS``), beside the docstring that explains them;
    ``labkit.scaling.registry`` reads them from there, and tests replay each claim.

    Attributes:
      imitates: the library object, as a user writes it.
      source: the file(s) the rule was read from (repository and path).
      init_option / interval_option: the ``create`` option that ``simulate``'s generic
        ``init_scale=`` / ``growth_interval=`` stand for (None where the rule has none).
      storage, floor, ceiling, on_overflow: one-line facts for the comparison table.
      aliases: ``(alias, option, convert)``: another way to give an option
        (DeepSpeed's ``initial_scale_power`` for ``init_scale``).
    """

    imitates: str
    source: str
    init_option: str | None
    interval_option: str | None
    storage: str
    floor: str
    ceiling: str
    on_overflow: str
    aliases: tuple = ()


class _Scaler:
    """Shared behaviour: the checks, and ``adjust`` / ``applies`` from the class's one ``rule()``.

    Each class writes its library's rule once, in ``rule()``: a small pure function of
    plain numbers, its options fixed, ``step(finite, state) -> (applied, new_state)``,
    where ``state`` is the tuple of the fields named in ``STATE`` (the loss scale first).
    It raises ScalerStopped where the library stops training. ``adjust`` and ``applies``
    call it on one value; ``simulate`` calls it in a loop over plain tuples (fast enough
    for a million steps), so the two cannot drift apart.

    ``adjust(finite)`` and ``applies(finite)`` take the step's flag -- True when every
    gradient was finite -- as a bool (a string or a NaN is not a flag). A state built by
    hand is checked in ``__post_init__`` (a scale must be finite and > 0, a counter within
    its interval) with the same checks as ``create``; the states ``adjust`` returns are not
    re-checked: a replay may reach a scale of 0 or inf, exactly as the library does.
    """

    STATE: tuple[str, ...] = ("loss_scale",)  # the fields the rule moves, the scale first
    TRACKED: tuple[str, ...] = ()  # state fields recorded after every step (a part of STATE)
    COUNTER: str | None = None  # the field that counts steps towards the next growth
    FACTS: Facts

    def rule(self):
        """This scaler's rule, options fixed: ``step(finite, state) -> (applied, new_state)`` on plain numbers."""
        raise NotImplementedError

    def applies(self, finite: bool) -> bool:
        """Is this step's optimizer update applied?"""
        try:
            return self.rule()(num.check_finite_flag(finite), self.state_values())[0]
        except ScalerStopped as stop:
            return stop.applied

    def adjust(self, finite: bool):
        """The scaler for the next step."""
        _, new = self.rule()(num.check_finite_flag(finite), self.state_values())
        return self._next(**dict(zip(self.STATE, new)))

    def state_values(self) -> tuple:
        """The fields named in STATE, as the tuple that ``rule()``'s step takes and returns."""
        return tuple(getattr(self, k) for k in self.STATE)

    def _set(self, **values) -> None:
        num.set_fields(self, **values)

    def _next(self, **changes):
        """The next state: ``dataclasses.replace`` without ``__post_init__``'s checks (see the class docstring)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


_JMP = "google-deepmind/jmp jmp/_src/loss_scale.py"


@dataclass(frozen=True)
class NoOpLossScale(_Scaler):
    """No loss scaling and no finite check: scale 1, every update applied (jmp.NoOpLossScale).

    Right for fp32 and bf16, whose exponent range is fp32's. With fp16 an inf gradient
    goes straight into the weights.

    >>> NoOpLossScale().adjust(False).loss_scale
    1.0
    """

    loss_scale: float = 1.0

    FACTS = Facts("no loss scaling (jmp.NoOpLossScale)", _JMP + " (NoOpLossScale)", None, None,
                  "-", "-", "-", "applied (no check)")

    def __post_init__(self):
        if num.check_scale("loss_scale", self.loss_scale) != 1:
            raise ValueError(f"loss_scale of NoOpLossScale is always 1 (no scaling); got {self.loss_scale!r}")
        self._set(loss_scale=1.0)

    @classmethod
    def create(cls) -> "NoOpLossScale":
        return cls()

    def rule(self):
        def step(finite, state):
            return True, state
        return step


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

    FACTS = Facts("a fixed scale S (seed 000: S = 2**15; jmp.StaticLossScale)", _JMP + " (StaticLossScale)",
                  "loss_scale", None, "any", "-", "-", "applied unless skip_nonfinite")

    def __post_init__(self):
        self._set(loss_scale=num.check_scale("loss_scale", self.loss_scale),
                  skip_nonfinite=num.check_flag("skip_nonfinite", self.skip_nonfinite))

    @classmethod
    def create(cls, loss_scale=2.0**15, skip_nonfinite=False) -> "StaticLossScale":
        return cls(loss_scale, skip_nonfinite)

    def rule(self):
        always = not self.skip_nonfinite

        def step(finite, state):
            return finite or always, state
        return step


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

    STATE = ("loss_scale", "counter")
    TRACKED = ("counter",)
    COUNTER = "counter"
    FACTS = Facts("textbook dynamic scaling (Micikevicius et al. 2018)", "labkit/scaling/basic.py",
                  "loss_scale", "growth_interval", "float64", "min_scale (none)", "max_scale (none)",
                  "skip; scale * backoff_factor")

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

    def rule(self):
        n, g, b = self.growth_interval, self.growth_factor, self.backoff_factor
        lo = -num.INF if self.min_scale is None else self.min_scale
        hi = num.INF if self.max_scale is None else self.max_scale

        def step(finite, state):
            s, counter = state
            if not finite:
                return False, (float(min(max(s * b, lo), hi)), 0)
            counter += 1
            if counter == n:
                return True, (float(min(max(s * g, lo), hi)), 0)
            return True, (s, counter)
        return step
