"""DeepSpeed's two dynamic loss-scaling rules, and how its ``fp16`` config drives them.

DeepSpeed has two implementations that disagree in their details:

* ``DynamicLossScaler`` (``deepspeed/runtime/fp16/loss_scaler.py``) -- used by the ZeRO
  optimizers (stage 1, 2 and 3) and the unfused fp16 optimizer. It has **hysteresis**.
* ``FP16_Optimizer._update_scale`` (``deepspeed/runtime/fp16/fused_optimizer.py``) --
  the fused fp16 optimizer (no ZeRO, FusedAdam). It ignores ``hysteresis`` and grows
  one step later.

Both keep the scale in a Python number (float64), floor it at ``min_loss_scale`` and
skip the optimizer step on overflow.

>>> name, opts = deepspeed_options({"fp16": {"enabled": True, "loss_scale": 0,
...     "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
...     "min_loss_scale": 1}})
>>> name, opts["init_scale"], opts["hysteresis"]
('deepspeed', 65536, 2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.scaling import _numbers as num
from labkit.scaling.basic import ScalerStopped, _Scaler

# deepspeed/runtime/constants.py (FP16_*_DEFAULT)
CONFIG_DEFAULTS = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "consecutive_hysteresis": False,
    "min_loss_scale": 1,
}
_MIN_SCALE_MESSAGE = "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."


@dataclass(frozen=True)
class DeepSpeedLossScaler(_Scaler):
    """DeepSpeed's ``DynamicLossScaler`` as the ``fp16`` config builds it.

    Config -> arguments (``deepspeed/runtime/config.py``, ``get_dynamic_loss_scale_args``):
    ``init_scale = 2**initial_scale_power`` (16), ``scale_window = loss_scale_window``
    (1000), ``delayed_shift = hysteresis`` (2), ``consecutive_hysteresis`` (False),
    ``min_scale = min_loss_scale`` (1); ``scale_factor`` stays 2.0 and
    ``raise_error_at_min_scale`` stays True. Source of the rule,
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
            if (cur_iter - last_overflow_iter) % scale_window == 0:
                if not consecutive_hysteresis: cur_hysteresis = delayed_shift
                cur_scale *= scale_factor
        cur_iter += 1

    Where it differs: **hysteresis** -- with ``hysteresis: 2`` the first overflow only
    uses up the hysteresis (the step is still skipped, the scale kept); and it is
    restored only at the next growth (not after every good step, unless
    ``consecutive_hysteresis``), so once used, every overflow halves the scale until the
    scale grows again. A **floor** at ``min_loss_scale``, and training **stops with an
    exception** when an overflow arrives at the floor. No cap (float64 reaches inf only
    past 2**1023). Growth is periodic in ``cur_iter - last_overflow_iter``, so it lands
    on the same steps as torch's counter.

    Trap: if the ``fp16`` section names none of ``initial_scale_power``,
    ``loss_scale_window``, ``min_loss_scale``, ``hysteresis``, ``consecutive_hysteresis``,
    the arguments are None and the class defaults apply: ``init_scale=2**32`` and
    ``delayed_shift=1`` -- see :func:`deepspeed_options`.
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

    TRACKED = ("hysteresis",)
    COUNTER = None

    @classmethod
    def create(cls, init_scale=2**16, loss_scale_window=1000, hysteresis=2, consecutive_hysteresis=False,
               min_loss_scale=1, raise_error_at_min_scale=True):
        shift = num.check_interval("hysteresis", hysteresis, "overflows tolerated before the scale backs off")
        return cls(
            loss_scale=num.check_scale("init_scale", init_scale),
            loss_scale_window=num.check_interval("loss_scale_window", loss_scale_window),
            min_loss_scale=num.check_floor("min_loss_scale", min_loss_scale),
            delayed_shift=shift,
            consecutive_hysteresis=num.check_flag("consecutive_hysteresis", consecutive_hysteresis),
            raise_error_at_min_scale=num.check_flag("raise_error_at_min_scale", raise_error_at_min_scale),
            hysteresis=shift,
        )

    def adjust(self, finite: bool) -> "DeepSpeedLossScaler":
        s, hyst = self.loss_scale, self.hysteresis
        last = self.last_overflow_iter
        if not finite:
            if self.delayed_shift == 1 or hyst == 1:
                if s == self.min_loss_scale and self.raise_error_at_min_scale:
                    raise ScalerStopped(_MIN_SCALE_MESSAGE)
                s = max(s / 2.0, self.min_loss_scale)
            else:
                hyst -= 1
            last = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                hyst = self.delayed_shift
            if (self.cur_iter - last) % self.loss_scale_window == 0:
                if not self.consecutive_hysteresis:
                    hyst = self.delayed_shift
                s *= 2.0
        return dataclasses.replace(self, loss_scale=s, hysteresis=hyst, cur_iter=self.cur_iter + 1,
                                   last_overflow_iter=last)


def fast_deepspeed(flags, opts):
    s = opts["init_scale"]
    window, floor = opts["loss_scale_window"], opts["min_loss_scale"]
    shift, consecutive = opts["hysteresis"], opts["consecutive_hysteresis"]
    stop = opts["raise_error_at_min_scale"]
    scales, hysts = [], []
    keep, track = scales.append, hysts.append
    hyst, last, stopped = shift, -1, None
    for it, o in enumerate(flags):
        keep(s)
        if o:
            if shift == 1 or hyst == 1:
                if s == floor and stop:
                    track(hyst)
                    stopped = it
                    break
                s = max(s / 2.0, floor)
            else:
                hyst -= 1
            last = it
        else:
            if consecutive:
                hyst = shift
            if (it - last) % window == 0:
                if not consecutive:
                    hyst = shift
                s *= 2.0
        track(hyst)
    return scales, None, {"hysteresis": hysts}, stopped, s


@dataclass(frozen=True)
class DeepSpeedFP16OptimizerScaler(_Scaler):
    """DeepSpeed's fused ``FP16_Optimizer`` loss-scale rule (no ZeRO, FusedAdam).

    Source: ``deepspeed/runtime/fp16/fused_optimizer.py`` (``FP16_Optimizer.__init__``,
    ``_update_scale``). ``__init__`` reads only ``init_scale``, ``scale_window`` and
    ``min_scale`` from the config's arguments and sets ``scale_factor = 2``::

        if skip:                                   # overflow: the step is skipped
            cur_scale = max(cur_scale / scale_factor, min_loss_scale)
            last_overflow_iter = cur_iter
        else:
            stable_interval = (cur_iter - last_overflow_iter) - 1
            if stable_interval > 0 and stable_interval % scale_window == 0:
                cur_scale *= scale_factor
        cur_iter += 1

    Where it differs from ``DynamicLossScaler``: **no hysteresis** (the config key is
    ignored), **no exception** at the floor, and the ``- 1`` makes the first growth
    come after ``scale_window + 1`` finite steps (one step later than torch), then every
    ``scale_window`` steps. ``scale_factor`` is the int 2, so a scale that has only grown
    stays a Python int.
    """

    loss_scale: float = 2**16
    loss_scale_window: int = 1000
    min_loss_scale: float = 1
    cur_iter: int = 0
    last_overflow_iter: int = -1

    @classmethod
    def create(cls, init_scale=2**16, loss_scale_window=1000, min_loss_scale=1):
        return cls(
            loss_scale=num.check_scale("init_scale", init_scale),
            loss_scale_window=num.check_interval("loss_scale_window", loss_scale_window),
            min_loss_scale=num.check_floor("min_loss_scale", min_loss_scale),
        )

    def adjust(self, finite: bool) -> "DeepSpeedFP16OptimizerScaler":
        s, last = self.loss_scale, self.last_overflow_iter
        if not finite:
            s = max(s / 2, self.min_loss_scale)
            last = self.cur_iter
        else:
            stable_interval = (self.cur_iter - last) - 1
            if stable_interval > 0 and stable_interval % self.loss_scale_window == 0:
                s *= 2
        return dataclasses.replace(self, loss_scale=s, cur_iter=self.cur_iter + 1, last_overflow_iter=last)


def fast_deepspeed_fp16(flags, opts):
    s = opts["init_scale"]
    window, floor = opts["loss_scale_window"], opts["min_loss_scale"]
    scales = []
    keep = scales.append
    last = -1
    for it, o in enumerate(flags):
        keep(s)
        if o:
            s = max(s / 2, floor)
            last = it
        else:
            stable = it - last - 1
            if stable > 0 and stable % window == 0:
                s *= 2
    return scales, None, {}, None, s


def deepspeed_options(config: dict, optimizer: str = "zero") -> tuple[str, dict]:
    """The preset and options that a DeepSpeed config gives its loss scaler.

    Reproduces ``get_loss_scale``, ``get_initial_dynamic_scale`` and
    ``get_dynamic_loss_scale_args`` (``deepspeed/runtime/config.py``) and the
    constructors that consume them. ``optimizer``: "zero" (ZeRO stages, unfused fp16:
    ``DynamicLossScaler``) or "fp16" (fused ``FP16_Optimizer``). Accepts the whole
    config or just its ``fp16`` section. Returns ``(preset, options)`` for
    :func:`labkit.scaling.simulate`: ("none", {}) when fp16 is not enabled (its default),
    ("static", ...) for a fixed ``loss_scale`` (DeepSpeed still skips overflowing steps).

    >>> deepspeed_options({"fp16": {"enabled": True}})   # no scaling key: class defaults
    ('deepspeed', {'init_scale': 4294967296, 'loss_scale_window': 1000, 'hysteresis': 1, \
'consecutive_hysteresis': False, 'min_loss_scale': 1})
    """
    if not isinstance(config, dict):
        raise TypeError("config must be a dict (a DeepSpeed config or its 'fp16' section); "
                        f"got {type(config).__name__}")
    if optimizer not in ("zero", "fp16"):
        raise ValueError("optimizer must be 'zero' (DynamicLossScaler) or 'fp16' (fused FP16_Optimizer); "
                         f"got {optimizer!r}")
    section_keys = set(CONFIG_DEFAULTS) | {"enabled", "auto_cast", "fp16_master_weights_and_grads"}
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
        raise ValueError(f"unknown fp16 config keys {sorted(unknown)}; loss scaling reads {sorted(CONFIG_DEFAULTS)}")
    if not fp16.get("enabled", False):  # FP16_ENABLED_DEFAULT = False
        return "none", {}
    get = lambda key: fp16.get(key, CONFIG_DEFAULTS[key])  # noqa: E731  (get_scalar_param)
    if get("loss_scale") != 0:  # a static scale; both optimizers still skip overflowing steps
        return "static", {"loss_scale": get("loss_scale"), "skip_nonfinite": True}
    keys = ("initial_scale_power", "loss_scale_window", "min_loss_scale", "hysteresis", "consecutive_hysteresis")
    given = any(key in fp16 for key in keys)
    if optimizer == "fp16":
        return "deepspeed-fp16-optimizer", {
            "init_scale": 2 ** get("initial_scale_power"),
            "loss_scale_window": get("loss_scale_window") if given else 1000,
            "min_loss_scale": get("min_loss_scale") if given else 1,
        }
    if not given:  # DynamicLossScaler(dtype=torch.half): its own defaults
        return "deepspeed", {"init_scale": 2**32, "loss_scale_window": 1000, "hysteresis": 1,
                             "consecutive_hysteresis": False, "min_loss_scale": 1}
    return "deepspeed", {
        "init_scale": 2 ** get("initial_scale_power"),
        "loss_scale_window": get("loss_scale_window"),
        "hysteresis": get("hysteresis"),
        "consecutive_hysteresis": get("consecutive_hysteresis"),
        "min_loss_scale": get("min_loss_scale"),
    }
