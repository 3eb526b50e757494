"""DeepSpeed's two dynamic loss-scaling rules, and how its ``fp16`` config drives them.

Read from DeepSpeed 0.19.8 (``deepspeed/runtime/...``). Two implementations, which
disagree in their details:

* ``DynamicLossScaler`` (``fp16/loss_scaler.py``) -- the ZeRO optimizers
  (``zero/stage_1_and_2.py`` and ``zero/stage3.py`` build it with ``CreateLossScaler``).
  It has **hysteresis** and **raises** when an overflow arrives at ``min_loss_scale``.
* ``_update_scale`` of ``FP16_Optimizer`` (``fp16/fused_optimizer.py``, FusedAdam, no ZeRO)
  and of ``FP16_UnfusedOptimizer`` (``fp16/unfused_optimizer.py``, any other optimizer, no
  ZeRO) -- the same rule in both, on a ``LossScaleConfig`` (``fp16/loss_scaler.py``): no
  hysteresis, no exception at the floor.

Both grow after ``loss_scale_window + 1`` clean steps (then every ``loss_scale_window``),
keep the scale in a Python number, floor it at ``min_loss_scale`` and skip the optimizer
step on overflow. Every fp16 config gets its scaling keys' defaults (``precision_config.py``,
``DeepSpeedFP16Config.dynamic_loss_scale_args``): a dynamic scaler starts at 2**16.

>>> name, opts = deepspeed_options({"fp16": {"enabled": True, "loss_scale": 0,
...     "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
...     "min_loss_scale": 1}})
>>> name, opts["init_scale"], opts["hysteresis"]
('deepspeed', 65536, 2)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from labkit._validate import integer, number, shown
from labkit.scaling import _numbers as num
from labkit.scaling.basic import Facts, ScalerStopped, _Scaler

# deepspeed/runtime/precision_config.py, DeepSpeedFP16Config: every key of the fp16 section, its
# default and what it does -- the one table (labkit.train.torch.deepspeed_config explains configs with it;
# tests/distributed/test_deepspeed_run.py compares it with an installed DeepSpeed).
FP16_KEYS = {
    "enabled": (False, "turn on fp16: the engine casts the model to half; ZeRO keeps fp32 master weights"),
    "auto_cast": (False, "cast floating-point inputs of forward() to fp16"),
    "loss_scale": (0, "0 = dynamic loss scaling; any other value = that static scale (steps still skipped on overflow)"),
    "initial_scale_power": (16, "the dynamic scale starts at 2**initial_scale_power"),
    "loss_scale_window": (1000, "grow the scale x2 after window + 1 steps without overflow, then every window"),
    "hysteresis": (2, "the scale halves at the hysteresis-th overflow (2: the first is forgiven, its step "
                      "still skipped); the count refills only when the scale grows"),
    "consecutive_hysteresis": (False, "refill the hysteresis after every good step, not only at growth"),
    "min_loss_scale": (1, "floor of the scale; an overflow at the floor stops training with an exception"),
    "fp16_master_weights_and_grads": (False, "keep master weights and gradients in fp16 too (ZeRO-Offload only)"),
}
_SCALING_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                 "min_loss_scale")
CONFIG_DEFAULTS = {key: FP16_KEYS[key][0] for key in _SCALING_KEYS}  # the keys that loss scaling reads
_INT_KEYS = ("initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")  # pydantic int fields
_DS = "deepspeedai/DeepSpeed 0.19.8 deepspeed/runtime/"
_MIN_SCALE_MESSAGE = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


@dataclass(frozen=True)
class DeepSpeedLossScaler(_Scaler):
    """DeepSpeed's ``DynamicLossScaler`` (the ZeRO optimizers) as the ``fp16`` config builds it.

    Config -> arguments (DeepSpeed 0.19.8, ``deepspeed/runtime/precision_config.py``,
    ``DeepSpeedFP16Config.dynamic_loss_scale_args``, always a dict):
    ``init_scale = 2**initial_scale_power`` (16), ``scale_window = loss_scale_window``
    (1000), ``delayed_shift = hysteresis`` (2), ``consecutive_hysteresis`` (False),
    ``min_scale = min_loss_scale`` (1); ``CreateLossScaler`` leaves
    ``raise_error_at_min_scale=True`` and the class sets ``scale_factor = 2.0``. The rule,
    ``deepspeed/runtime/fp16/loss_scaler.py``, ``DynamicLossScaler.update_scale``::

        # cur_iter = 0, last_overflow_iter = -1, cur_hysteresis = delayed_shift
        if overflow:                               # the step is skipped
            if delayed_shift == 1 or cur_hysteresis == 1:
                if cur_scale == min_scale and raise_error_at_min_scale:
                    raise Exception("Current loss scale already at minimum ...")
                cur_scale = max(cur_scale / scale_factor, min_scale)
            else:
                cur_hysteresis -= 1                # forgive this overflow
            last_overflow_iter = cur_iter
        else:
            if consecutive_hysteresis: cur_hysteresis = delayed_shift
            stable_interval = (cur_iter - last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % scale_window == 0:
                if not consecutive_hysteresis: cur_hysteresis = delayed_shift
                cur_scale *= scale_factor
        cur_iter += 1

    Where it differs: **hysteresis** -- with ``hysteresis: 2`` the first overflow only
    uses up the hysteresis (the step is still skipped, the scale kept); and it is
    restored only at the next growth (not after every good step, unless
    ``consecutive_hysteresis``), so once used, every overflow halves the scale until the
    scale grows again. A **floor** at ``min_loss_scale``, and training **stops with an
    exception** when an overflow arrives at the floor. No cap (float64 reaches inf only
    past 2**1023). Growth: the ``- 1`` makes the first growth come after
    ``scale_window + 1`` clean steps (one step later than torch's GradScaler), then every
    ``scale_window`` steps.

    History: older DeepSpeed source grew on ``(cur_iter - last_overflow_iter) % scale_window
    == 0`` (as torch does), and its ``config.py`` ``get_dynamic_loss_scale_args`` returned
    None when the ``fp16`` section named no scaling key, so ``CreateLossScaler`` fell back to
    ``DynamicLossScaler()``'s own defaults, ``init_scale=2**32`` and ``delayed_shift=1``.
    Neither holds in 0.19.8.
    """

    loss_scale: float = 2**16
    loss_scale_window: int = 1000
    min_loss_scale: float = 1
    delayed_shift: int = 2
    consecutive_hysteresis: bool = False
    raise_error_at_min_scale: bool = True
    hysteresis: int = 2
    cur_iter: int = 0
    last_overflow_iter: int = -1

    STATE = ("loss_scale", "hysteresis", "cur_iter", "last_overflow_iter")
    TRACKED = ("hysteresis",)
    COUNTER = None
    FACTS = Facts("DeepSpeed DynamicLossScaler (fp16 config, ZeRO)",
                  _DS + "fp16/loss_scaler.py; " + _DS + "precision_config.py", "init_scale", "loss_scale_window",
                  "Python float", "min_loss_scale (1); raises at it", "none", "skip; hysteresis, then scale / 2",
                  (("initial_scale_power", "init_scale", lambda power: initial_scale(power)),))

    def __post_init__(self):
        _check_deepspeed(self)
        self._set(delayed_shift=integer("delayed_shift", self.delayed_shift, minimum=1),
                  consecutive_hysteresis=num.check_flag("consecutive_hysteresis", self.consecutive_hysteresis),
                  raise_error_at_min_scale=num.check_flag("raise_error_at_min_scale", self.raise_error_at_min_scale))
        self._set(hysteresis=integer("hysteresis", self.hysteresis, minimum=1, maximum=self.delayed_shift))

    @classmethod
    def create(cls, init_scale=2**16, loss_scale_window=1000, hysteresis=2, consecutive_hysteresis=False,
               min_loss_scale=1, raise_error_at_min_scale=True):
        shift = integer("hysteresis", hysteresis, minimum=1)  # overflows tolerated before the scale backs off
        return cls(num.check_scale("init_scale", init_scale), loss_scale_window, min_loss_scale, shift,
                   consecutive_hysteresis, raise_error_at_min_scale, shift)

    def rule(self):
        window, floor, delayed_shift = self.loss_scale_window, self.min_loss_scale, self.delayed_shift
        consecutive, stop = self.consecutive_hysteresis, self.raise_error_at_min_scale

        def step(finite, state):
            cur_scale, cur_hysteresis, cur_iter, last_overflow_iter = state
            if not finite:
                if delayed_shift == 1 or cur_hysteresis == 1:
                    if cur_scale == floor and stop:
                        raise ScalerStopped(_MIN_SCALE_MESSAGE, applied=False)
                    cur_scale = max(cur_scale / 2.0, floor)
                else:
                    cur_hysteresis -= 1
                last_overflow_iter = cur_iter
            else:
                if consecutive:
                    cur_hysteresis = delayed_shift
                stable_interval = (cur_iter - last_overflow_iter) - 1
                if stable_interval > 0 and stable_interval % window == 0:
                    if not consecutive:
                        cur_hysteresis = delayed_shift
                    cur_scale *= 2.0
            return finite, (cur_scale, cur_hysteresis, cur_iter + 1, last_overflow_iter)
        return step


def _check_deepspeed(state) -> None:
    """Both DeepSpeed scalers: a scale finite as a float64 (an int stays an int), a window, a floor, iterations."""
    state._set(loss_scale=num.check_scale("loss_scale", state.loss_scale),
               loss_scale_window=integer("loss_scale_window", state.loss_scale_window, minimum=1),
               min_loss_scale=num.check_floor("min_loss_scale", state.min_loss_scale),
               cur_iter=integer("cur_iter", state.cur_iter, minimum=0))
    state._set(last_overflow_iter=integer("last_overflow_iter", state.last_overflow_iter, minimum=-1,
                                          maximum=state.cur_iter - 1))


@dataclass(frozen=True)
class DeepSpeedFP16OptimizerScaler(_Scaler):
    """DeepSpeed's fp16 optimizers without ZeRO: ``FP16_Optimizer`` and ``FP16_UnfusedOptimizer``.

    Source (DeepSpeed 0.19.8): ``deepspeed/runtime/engine.py``, ``_configure_fp16_optimizer``
    builds a ``LossScaleConfig`` (``deepspeed/runtime/fp16/loss_scaler.py``) from
    ``dynamic_loss_scale_args()``, which is always a dict, so the profile defaults (FUSED:
    2**32, window 1000, floor 1; UNFUSED: 2**16, 1000, 0.25) are never used from a config:
    ``cur_scale = 2**initial_scale_power``, ``scale_window = loss_scale_window``,
    ``min_loss_scale = min_loss_scale``, ``scale_factor = 2.0``. ``hysteresis`` and
    ``consecutive_hysteresis`` are not read. ``_update_scale`` is the same in
    ``fp16/fused_optimizer.py`` and ``fp16/unfused_optimizer.py``::

        if skip:                                   # overflow: the step is skipped
            cur_scale = max(cur_scale / scale_factor, min_loss_scale)
            last_overflow_iter = cur_iter
        else:
            stable_interval = (cur_iter - last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % scale_window == 0:
                cur_scale *= scale_factor
        cur_iter += 1

    Where it differs from ``DynamicLossScaler``: **no hysteresis** (the config key is
    ignored) and **no exception** at the floor (the scale stays there). The growth steps
    are the same (``scale_window + 1`` clean steps, then every ``scale_window``).
    """

    loss_scale: float = 2**16
    loss_scale_window: int = 1000
    min_loss_scale: float = 1
    cur_iter: int = 0
    last_overflow_iter: int = -1

    STATE = ("loss_scale", "cur_iter", "last_overflow_iter")
    FACTS = Facts("DeepSpeed FP16_Optimizer / FP16_UnfusedOptimizer (no ZeRO)",
                  _DS + "fp16/fused_optimizer.py, unfused_optimizer.py", "init_scale", "loss_scale_window",
                  "Python float", "min_loss_scale (1)", "none", "skip; max(scale / 2, min)",
                  (("initial_scale_power", "init_scale", lambda power: initial_scale(power)),))

    def __post_init__(self):
        _check_deepspeed(self)

    @classmethod
    def create(cls, init_scale=2**16, loss_scale_window=1000, min_loss_scale=1):
        return cls(num.check_scale("init_scale", init_scale), loss_scale_window, min_loss_scale)

    def rule(self):
        window, floor = self.loss_scale_window, self.min_loss_scale

        def step(finite, state):
            cur_scale, cur_iter, last_overflow_iter = state
            if not finite:
                cur_scale = max(cur_scale / 2.0, floor)
                last_overflow_iter = cur_iter
            else:
                stable_interval = (cur_iter - last_overflow_iter) - 1
                if stable_interval > 0 and stable_interval % window == 0:
                    cur_scale *= 2.0
            return finite, (cur_scale, cur_iter + 1, last_overflow_iter)
        return step


POWERS = (-1074, 1023)  # 2**power is a float64 > 0 for these: DeepSpeed's scale arithmetic (cur_scale / 2.0) needs one


def initial_scale(power, name: str = "initial_scale_power"):
    """DeepSpeed's ``init_scale = 2**initial_scale_power`` (an int for a power >= 0, as in DeepSpeed).

    The power must be an integer from -1074 to 1023: past 1023 the int scale is too large
    for the float arithmetic DeepSpeed does with it (its first ``cur_scale / 2.0`` raises
    OverflowError); below -1074 it is 0.
    """
    lo, hi = POWERS
    return 2 ** integer(name, power, minimum=lo, maximum=hi)


def _int_key(fp16: dict, key: str) -> int:
    """A pydantic ``int`` field of DeepSpeedFP16Config: integral numbers pass (2.0 -> 2), 0.5 does not."""
    value = fp16.get(key, CONFIG_DEFAULTS[key])
    if isinstance(value, bool) and key in ("loss_scale_window", "min_loss_scale"):
        raise ValueError(f"fp16.{key} must be an integer, not bool")  # DeepSpeed's own check
    if isinstance(value, numbers.Integral):
        return int(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value) or value != int(value):
        raise ValueError(f"fp16.{key} must be an integer (DeepSpeedFP16Config); got {shown(value)}")
    return int(value)


_TRUE, _FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}


def _bool_key(fp16: dict, key: str, default) -> bool:
    """A pydantic ``bool`` field: True/False, 0/1 or pydantic's strings ("true", "off", ...)."""
    value = fp16.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ValueError(f"fp16.{key} must be a boolean (DeepSpeedFP16Config); got {value!r}")


def deepspeed_options(config: dict, optimizer: str = "zero") -> tuple[str, dict]:
    """The preset and options that a DeepSpeed config gives its loss scaler (DeepSpeed 0.19.8).

    Reproduces ``DeepSpeedFP16Config`` (``deepspeed/runtime/precision_config.py``: its
    defaults, its checks, ``initial_dynamic_scale``, ``dynamic_loss_scale_args``), the
    engine's ``loss_scale`` / ``dynamic_loss_scale`` (``deepspeed/runtime/engine.py``:
    dynamic iff ``loss_scale == 0``) and the constructors that consume them.
    ``optimizer``: "zero" (ZeRO stages 1-3: ``DynamicLossScaler``) or "fp16" (no ZeRO:
    ``FP16_Optimizer`` or ``FP16_UnfusedOptimizer``, the same rule). Accepts the whole
    config or just its ``fp16`` section. Returns ``(preset, options)`` for
    :func:`labkit.scaling.simulate`: ("none", {}) when fp16 is not enabled (its default),
    ("static", ...) for a fixed ``loss_scale`` (DeepSpeed still skips overflowing steps).

    Every scaling key that the section does not name takes its default -- also when it
    names none of them (older DeepSpeed started such a config at 2**32 with no hysteresis;
    see :class:`DeepSpeedLossScaler`):

    >>> deepspeed_options({"fp16": {"enabled": True}})
    ('deepspeed', {'init_scale': 65536, 'loss_scale_window': 1000, 'hysteresis': 2, \
'consecutive_hysteresis': False, 'min_loss_scale': 1})
    >>> deepspeed_options({"fp16": {"enabled": True, "initial_scale_power": 8}}, optimizer="fp16")
    ('deepspeed-fp16-optimizer', {'init_scale': 256, 'loss_scale_window': 1000, 'min_loss_scale': 1})
    >>> deepspeed_options({"fp16": {"enabled": True, "loss_scale": 128}})
    ('static', {'loss_scale': 128.0, 'skip_nonfinite': True})
    """
    if not isinstance(config, dict):
        raise TypeError("config must be a dict (a DeepSpeed config or its 'fp16' section); "
                        f"got {type(config).__name__}")
    if not isinstance(optimizer, str) or optimizer not in ("zero", "fp16"):
        raise (ValueError if isinstance(optimizer, str) else TypeError)(
            "optimizer must be 'zero' (DynamicLossScaler) or 'fp16' (FP16_Optimizer / "
            f"FP16_UnfusedOptimizer); got {shown(optimizer)}")
    section_keys = set(FP16_KEYS)
    if "fp16" in config:
        fp16 = config["fp16"]
    elif set(config) <= section_keys:
        fp16 = config  # the fp16 section itself
    else:  # a whole config without an fp16 section: fp16 is off, nothing is scaled
        return "none", {}
    if not isinstance(fp16, dict):
        raise TypeError(f"config['fp16'] must be a dict; got {type(fp16).__name__}")
    unknown = set(fp16) - section_keys
    if unknown:
        raise ValueError(f"unknown fp16 config keys {sorted(unknown, key=str)}; "
                         f"loss scaling reads {sorted(CONFIG_DEFAULTS)}")
    loss_scale = fp16.get("loss_scale", CONFIG_DEFAULTS["loss_scale"])  # a pydantic float field
    try:
        loss_scale = number("fp16.loss_scale", loss_scale, minimum=0)
    except (TypeError, ValueError):
        raise ValueError(f"fp16.loss_scale must be a finite number >= 0 (0 = dynamic); "
                         f"got {shown(loss_scale)}") from None
    ints = {key: _int_key(fp16, key) for key in _INT_KEYS}
    consecutive = _bool_key(fp16, "consecutive_hysteresis", CONFIG_DEFAULTS["consecutive_hysteresis"])
    enabled = _bool_key(fp16, "enabled", False)  # DeepSpeedFP16Config.enabled: False
    if enabled and loss_scale == 0:  # DeepSpeedFP16Config._validate_dynamic_loss_scale_params
        for key in ("loss_scale_window", "min_loss_scale"):
            if ints[key] <= 0:
                raise ValueError(f"fp16.{key} must be > 0 when dynamic loss scaling is enabled (loss_scale=0)")
    if not enabled:
        return "none", {}
    if loss_scale != 0:  # a static scale (LossScaler / a static LossScaleConfig); overflowing steps are skipped
        return "static", {"loss_scale": loss_scale, "skip_nonfinite": True}
    init_scale = initial_scale(ints["initial_scale_power"], "fp16.initial_scale_power")  # dynamic_loss_scale_args()
    num.check_floor("fp16.min_loss_scale", ints["min_loss_scale"])  # max(cur_scale / 2.0, min) needs a float
    if optimizer == "fp16":
        return "deepspeed-fp16-optimizer", {
            "init_scale": init_scale,
            "loss_scale_window": ints["loss_scale_window"],
            "min_loss_scale": ints["min_loss_scale"],
        }
    return "deepspeed", {
        "init_scale": init_scale,
        "loss_scale_window": ints["loss_scale_window"],
        "hysteresis": ints["hysteresis"],
        "consecutive_hysteresis": consecutive,
        "min_loss_scale": ints["min_loss_scale"],
    }
