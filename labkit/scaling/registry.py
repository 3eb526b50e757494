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
from dataclasses import dataclass
from typing import Callable

import numpy as np

from labkit._validate import names as _names
from labkit._validate import shown
from labkit.scaling import basic, deepspeed, jax_scalers, keras_lso, seed004, torch_amp


@dataclass(frozen=True)
class Preset:
    """One library's loss-scaling rule.

    Attributes:
      name: the key in PRESETS.
      imitates: the library object, as a user writes it.
      source: the file(s) the rule was read from (repository and path).
      scaler: the value class (``create(**options)``, ``adjust``, ``applies``).
      fast: the tight-loop replay used by ``simulate`` (tested against ``scaler``).
      init_option / interval_option: the option that ``init_scale=`` /
        ``growth_interval=`` stand for (None where the rule has none).
      storage, floor, ceiling, on_overflow: one-line facts for the comparison table
        (each one checked by a test that replays the rule).
    """

    name: str
    imitates: str
    source: str
    scaler: type
    fast: Callable
    init_option: str | None
    interval_option: str | None
    storage: str
    floor: str
    ceiling: str
    on_overflow: str
    aliases: tuple[tuple[str, str, Callable], ...] = ()

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


_DS = "deepspeedai/DeepSpeed 0.19.8 deepspeed/runtime/"
PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("torch", "torch.amp.GradScaler(device)",
           "pytorch/pytorch torch/amp/grad_scaler.py; aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp",
           torch_amp.TorchGradScaler, torch_amp.fast_torch, "init_scale", "growth_interval",
           "float32 tensor", "none (reaches 0.0)", "refuses to grow into inf", "skip; scale * backoff_factor"),
    Preset("keras", "keras.optimizers.LossScaleOptimizer (Keras 3)",
           "keras-team/keras keras/src/optimizers/loss_scale_optimizer.py",
           keras_lso.KerasLossScale, keras_lso.fast_keras, "initial_scale", "dynamic_growth_steps",
           "float32 variable", "none (reaches 0.0)", "none (grows into inf)", "skip; scale * 0.5"),
    Preset("tf-keras", "tf.keras.mixed_precision.LossScaleOptimizer (TF 2.x, tf-keras)",
           "keras-team/tf-keras tf_keras/mixed_precision/loss_scale_optimizer.py",
           keras_lso.TFKerasLossScale, keras_lso.fast_tf_keras, "initial_scale", "dynamic_growth_steps",
           "float32 variable", "1", "refuses to grow into inf", "skip; max(scale / 2, 1)"),
    Preset("deepspeed", "DeepSpeed DynamicLossScaler (fp16 config, ZeRO)",
           _DS + "fp16/loss_scaler.py; " + _DS + "precision_config.py",
           deepspeed.DeepSpeedLossScaler, deepspeed.fast_deepspeed, "init_scale", "loss_scale_window",
           "Python float", "min_loss_scale (1); raises at it", "none", "skip; hysteresis, then scale / 2",
           (("initial_scale_power", "init_scale", deepspeed.initial_scale),)),
    Preset("deepspeed-fp16-optimizer", "DeepSpeed FP16_Optimizer / FP16_UnfusedOptimizer (no ZeRO)",
           _DS + "fp16/fused_optimizer.py, unfused_optimizer.py",
           deepspeed.DeepSpeedFP16OptimizerScaler, deepspeed.fast_deepspeed_fp16, "init_scale", "loss_scale_window",
           "Python float", "min_loss_scale (1)", "none", "skip; max(scale / 2, min)",
           (("initial_scale_power", "init_scale", deepspeed.initial_scale),)),
    Preset("jmp", "jmp.DynamicLossScale(loss_scale) (no default scale: 2**15 as in its docstring)",
           "google-deepmind/jmp jmp/_src/loss_scale.py",
           jax_scalers.JmpLossScale, jax_scalers.fast_jmp, "loss_scale", "period",
           "float32 array", "min_loss_scale (1)", "refuses to grow into inf", "caller skips; max(min, scale / factor)"),
    Preset("apex", "apex.amp LossScaler('dynamic')",
           "NVIDIA/apex apex/amp/scaler.py",
           torch_amp.ApexLossScaler, torch_amp.fast_apex, "init_scale", "scale_window",
           "Python float", "none unless min_loss_scale", "max_loss_scale (2**24)", "skip; scale / 2"),
    Preset("optax", "optax.apply_if_finite(inner, max_consecutive_errors)",
           "google-deepmind/optax optax/transforms/_conditionality.py",
           jax_scalers.OptaxApplyIfFinite, jax_scalers.fast_optax, None, None,
           "no scale", "-", "-", "skip, until max_consecutive_errors in a row"),
    Preset("seed004", "seed 004's hand-written DynamicLossScaler",
           "seeds/004 (the course's source document)",
           seed004.SeedLossScale, seed004.fast_seed004, "initial_scale", "growth_interval",
           "Python number", "none", "none", "applied (no check); scale / 2"),
    Preset("static", "a fixed scale S (seed 000: S = 2**15; jmp.StaticLossScale)",
           "google-deepmind/jmp jmp/_src/loss_scale.py (StaticLossScale)",
           basic.StaticLossScale, basic.fast_static, "loss_scale", None,
           "any", "-", "-", "applied unless skip_nonfinite"),
    Preset("dynamic", "textbook dynamic scaling (Micikevicius et al. 2018)",
           "labkit/scaling/basic.py",
           basic.DynamicLossScale, basic.fast_dynamic, "loss_scale", "growth_interval",
           "float64", "min_scale (none)", "max_scale (none)", "skip; scale * backoff_factor"),
    Preset("none", "no loss scaling (jmp.NoOpLossScale)",
           "google-deepmind/jmp jmp/_src/loss_scale.py (NoOpLossScale)",
           basic.NoOpLossScale, basic.fast_none, None, None,
           "-", "-", "-", "applied (no check)"),
]}

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
