"""The presets: which scaler imitates which library, with which defaults, from which file.

``PRESETS[name]`` is a :class:`Preset`. Its options are the imitated library's own
argument names, with the library's defaults; ``simulate`` also accepts the generic
``init_scale=`` and ``growth_interval=`` and maps them to those names.

>>> PRESETS["torch"].defaults
{'init_scale': 65536.0, 'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': 2000}
>>> PRESETS["keras"].interval_option
'dynamic_growth_steps'
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields

import numpy as np

from labkit._validate import names as _names
from labkit._validate import shown
from labkit.scaling import basic, deepspeed, jax_scalers, keras_lso, seed004, torch_amp
from labkit.scaling.basic import Facts, _Scaler


@dataclass(frozen=True)
class Preset:
    """One library's loss-scaling rule: a name for a scaler class, and that class's facts.

    Attributes:
      name: the key in PRESETS.
      scaler: the value class (``create(**options)``, ``rule``, ``adjust``, ``applies``).
      imitates, source, init_option, interval_option, storage, floor, ceiling,
        on_overflow, aliases: read from ``scaler.FACTS`` (see :class:`labkit.scaling.basic.Facts`),
        where each class states them beside the docstring that explains them.
    """

    name: str
    scaler: type
    imitates: str = field(init=False)
    source: str = field(init=False)
    init_option: str | None = field(init=False)
    interval_option: str | None = field(init=False)
    storage: str = field(init=False)
    floor: str = field(init=False)
    ceiling: str = field(init=False)
    on_overflow: str = field(init=False)
    aliases: tuple = field(init=False)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string (the key in PRESETS); got {type(self.name).__name__}")
        if not (isinstance(self.scaler, type) and issubclass(self.scaler, _Scaler) and hasattr(self.scaler, "FACTS")):
            raise TypeError(f"scaler must be a scaler class of labkit.scaling (with FACTS); got {shown(self.scaler)}")
        for f in fields(Facts):
            object.__setattr__(self, f.name, getattr(self.scaler.FACTS, f.name))

    @property
    def defaults(self) -> dict:
        """The options and their defaults (those of the imitated library)."""
        params = inspect.signature(self.scaler.create).parameters
        return {k: p.default for k, p in params.items()}

    @property
    def counter(self) -> str | None:
        """The name of the state's growth counter (recorded in ``Trace.extras``)."""
        return self.scaler.COUNTER

    def resolve(self, init_scale=None, growth_interval=None, **options) -> dict:
        """All options, defaults filled in and checked (ValueError/TypeError naming what is allowed)."""
        allowed = self.defaults
        names = list(allowed) + [a for a, _, _ in self.aliases]
        for key in options:
            if key not in names:
                listed = ", ".join(names) if names else "none"
                raise ValueError(f"preset {self.name!r} has no option {key!r}; its options are: {listed}")
        given_as = {}
        for alias, target, convert in self.aliases:
            if alias in options:
                if target in options:
                    raise ValueError(f"give either {alias} or {target} to preset {self.name!r}, not both")
                options[target] = convert(options.pop(alias))
                given_as[target] = alias
        for generic, target, value in (("init_scale", self.init_option, init_scale),
                                       ("growth_interval", self.interval_option, growth_interval)):
            if value is None:
                continue
            if target is None:
                listed = ", ".join(names) or "none"
                raise ValueError(f"preset {self.name!r} has no {generic}; its options are: {listed}")
            if target in options:
                other = given_as.get(target, target)
                raise ValueError(f"give either {generic} or {other} to preset {self.name!r}, not both")
            options[target] = value
            if target != generic:
                given_as[target] = generic
        resolved = {**allowed, **{k: (v.item() if isinstance(v, np.generic) else v) for k, v in options.items()}}
        try:
            self.scaler.create(**resolved)  # validates every option
        except (TypeError, ValueError) as e:
            alias = next((a for target, a in given_as.items() if str(e).startswith(target + " ")), None)
            if alias is None:
                raise
            raise type(e)(f"{e} (given as {alias})") from None
        return resolved

    def create(self, **options):
        """The initial scaler state with these options."""
        return self.scaler.create(**self.resolve(**options))


PRESETS: dict[str, Preset] = {name: Preset(name, scaler) for name, scaler in (
    ("torch", torch_amp.TorchGradScaler),
    ("keras", keras_lso.KerasLossScale),
    ("tf-keras", keras_lso.TFKerasLossScale),
    ("deepspeed", deepspeed.DeepSpeedLossScaler),
    ("deepspeed-fp16-optimizer", deepspeed.DeepSpeedFP16OptimizerScaler),
    ("jmp", jax_scalers.JmpLossScale),
    ("apex", torch_amp.ApexLossScaler),
    ("optax", jax_scalers.OptaxApplyIfFinite),
    ("seed004", seed004.SeedLossScale),
    ("static", basic.StaticLossScale),
    ("dynamic", basic.DynamicLossScale),
    ("none", basic.NoOpLossScale),
)}

LIBRARY_PRESETS = ("torch", "keras", "tf-keras", "deepspeed", "deepspeed-fp16-optimizer", "jmp", "apex")


def get_preset(name) -> Preset:
    """PRESETS[name] (a Preset is returned as is), or an error that lists the presets."""
    if isinstance(name, Preset):
        return name
    if not isinstance(name, str) or name not in PRESETS:
        error = ValueError if isinstance(name, str) else TypeError
        raise error(f"unknown preset name {shown(name)}; presets are: {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_table(names=None):
    """The presets side by side: defaults, bounds, what happens on overflow, where from.

    ``names``: one preset name, a list of them, or None for all.
    """
    from labkit.table import Table
    from labkit.scaling.underflow import _pow2

    rows = []
    for name in list(PRESETS) if names is None else _names("names", names, PRESETS):
        p = get_preset(name)
        d = p.defaults
        init = d.get(p.init_option) if p.init_option else None
        interval = d.get(p.interval_option) if p.interval_option else None
        rows.append((
            p.name,
            p.imitates,
            _pow2(init),
            "-" if interval is None else str(interval),
            p.storage,
            p.floor,
            p.ceiling,
            p.on_overflow,
            p.source,
        ))
    columns = ("preset", "imitates", "init scale", "growth interval", "scale stored as", "floor", "ceiling",
               "on overflow", "source")
    return Table(columns, tuple(rows), "Loss-scaling rules, read from each library's source")
