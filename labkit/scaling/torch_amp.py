"""PyTorch's loss scalers: ``torch.amp.GradScaler`` and NVIDIA Apex amp's ``LossScaler``.

Both skip the optimizer step when a gradient is inf/nan and halve the scale; they differ
in where the scale lives (a float32 tensor vs a Python float), in the bounds (none vs a
cap of 2**24 and an optional floor) and in who may grow the scale into inf.

>>> s = TorchGradScaler.create(init_scale=2.0**16, growth_interval=2)
>>> [(s := s.adjust(f)).loss_scale for f in (True, True, False)]
[65536.0, 131072.0, 65536.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit._validate import integer
from labkit.scaling import _numbers as num
from labkit.scaling.basic import Facts, _Scaler

INT64_MAX = 2**63 - 1  # torch passes growth_interval to its kernel as an int64 (larger: "Overflow when unpacking")


@dataclass(frozen=True)
class TorchGradScaler(_Scaler):
    """``torch.amp.GradScaler(device, init_scale=2.**16, growth_factor=2., backoff_factor=.5,
    growth_interval=2000)``.

    Sources: ``torch/amp/grad_scaler.py`` (``GradScaler.__init__``, ``update``) and the
    CPU kernel ``_amp_update_scale_cpu_kernel`` in
    ``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp`` (the CUDA kernel is the same)::

        # scale: float32 tensor, growth_tracker: int32 tensor, both on the device
        if found_inf:                       # any inf/nan after unscale_
            scale = float32(scale * backoff_factor); growth_tracker = 0
            # and scaler.step() did not call optimizer.step()
        else:
            successful = growth_tracker + 1
            if successful == growth_interval:
                new_scale = float32(scale * growth_factor)
                if isfinite(new_scale): scale = new_scale   # never grows into inf
                growth_tracker = 0
            else:
                growth_tracker = successful

    Where it differs from the others: the scale is a **float32** tensor (each new value is
    rounded to float32; 166 overflows in a row from 2**16 halve it to exactly 0.0);
    there is **no floor** (the docstring of ``update`` warns the scale may fall below 1);
    growth that would reach inf is **refused**; the tracker is compared **after** the
    increment (``== growth_interval``), so growth happens on the growth_interval-th
    consecutive finite step.
    """

    loss_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0

    STATE = ("loss_scale", "growth_tracker")
    TRACKED = ("growth_tracker",)
    COUNTER = "growth_tracker"
    FACTS = Facts("torch.amp.GradScaler(device)",
                  "pytorch/pytorch torch/amp/grad_scaler.py; aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp",
                  "init_scale", "growth_interval", "float32 tensor", "none (reaches 0.0)",
                  "refuses to grow into inf", "skip; scale * backoff_factor")

    def __post_init__(self):
        self._set(
            loss_scale=num.check_scale("loss_scale", self.loss_scale, float32=True),
            growth_factor=num.check_growth("growth_factor", self.growth_factor),
            backoff_factor=num.check_backoff("backoff_factor", self.backoff_factor),
            growth_interval=integer("growth_interval", self.growth_interval, minimum=1, maximum=INT64_MAX),
        )
        self._set(growth_tracker=num.check_counter("growth_tracker", self.growth_tracker, self.growth_interval,
                                                   "growth_interval"))

    @classmethod
    def create(cls, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        return cls(num.check_scale("init_scale", init_scale, float32=True), growth_factor, backoff_factor,
                   growth_interval)

    def rule(self):
        f32, isfinite = num.f32, math.isfinite
        growth_factor, backoff_factor, growth_interval = self.growth_factor, self.backoff_factor, self.growth_interval

        def step(finite, state):
            scale, growth_tracker = state
            if not finite:
                return False, (f32(scale * backoff_factor), 0)
            successful = growth_tracker + 1
            if successful == growth_interval:
                new_scale = f32(scale * growth_factor)
                return True, (new_scale if isfinite(new_scale) else scale, 0)
            return True, (scale, successful)
        return step


@dataclass(frozen=True)
class ApexLossScaler(_Scaler):
    """Apex amp's dynamic ``LossScaler("dynamic", init_scale=2.**16, scale_factor=2.,
    scale_window=2000, min_loss_scale=None, max_loss_scale=2.**24)``.

    Source: NVIDIA/apex ``apex/amp/scaler.py`` (``LossScaler.__init__``,
    ``update_scale``); ``amp.initialize(..., min_loss_scale=None, max_loss_scale=2.**24)``
    passes the bounds, and ``scale_window`` stays 2000. Python floats (float64)::

        loss_scale = min(max_loss_scale, init_scale)
        if has_overflow:                          # update_scale() returns should_skip
            should_skip = True
            if min_loss_scale: loss_scale = max(min_loss_scale, loss_scale / 2.)
            else:              loss_scale = loss_scale / 2.
            unskipped = 0
        else:
            should_skip = False; unskipped += 1
        if unskipped == scale_window:
            loss_scale = min(max_loss_scale, loss_scale * 2.); unskipped = 0

    Where it differs: a **cap** of 2**24 (the initial scale is clamped to it too, in the
    versions since 2019; the first ones started at ``init_scale`` unclamped); the
    floor is optional and tested by truthiness (``min_loss_scale=0`` means no floor);
    ``scale_factor`` is accepted but the code always uses 2; the scale is a **float64**
    Python float (no float32 rounding; without a floor it reaches 0.0 only after 1091
    halvings).
    """

    loss_scale: float = 2.0**16
    scale_window: int = 2000
    min_loss_scale: float | None = None
    max_loss_scale: float = 2.0**24
    unskipped: int = 0

    STATE = ("loss_scale", "unskipped")
    TRACKED = ("unskipped",)
    COUNTER = "unskipped"
    FACTS = Facts("apex.amp LossScaler('dynamic')", "NVIDIA/apex apex/amp/scaler.py", "init_scale", "scale_window",
                  "Python float", "none unless min_loss_scale", "max_loss_scale (2**24)", "skip; scale / 2")

    def __post_init__(self):
        self._set(
            loss_scale=num.check_scale("loss_scale", self.loss_scale),
            scale_window=integer("scale_window", self.scale_window, minimum=1),
            min_loss_scale=num.check_floor("min_loss_scale", self.min_loss_scale, allow_none=True),
            max_loss_scale=num.check_scale("max_loss_scale", self.max_loss_scale),
        )
        if self.loss_scale > self.max_loss_scale:
            raise ValueError(f"loss_scale ({self.loss_scale}) must not exceed max_loss_scale ({self.max_loss_scale}): "
                             "Apex clamps its scale to the cap (create() clamps init_scale the same way)")
        self._set(unskipped=num.check_counter("unskipped", self.unskipped, self.scale_window, "scale_window"))

    @classmethod
    def create(cls, init_scale=2.0**16, scale_window=2000, min_loss_scale=None, max_loss_scale=2.0**24):
        init = num.check_scale("init_scale", init_scale)
        cap = num.check_scale("max_loss_scale", max_loss_scale)
        return cls(min(cap, init), scale_window, min_loss_scale, cap)

    def rule(self):
        min_loss_scale, max_loss_scale, scale_window = self.min_loss_scale, self.max_loss_scale, self.scale_window

        def step(finite, state):
            s, unskipped = state
            if not finite:
                s = max(min_loss_scale, s / 2.0) if min_loss_scale else s / 2.0
                unskipped = 0
            else:
                unskipped += 1
            if unskipped == scale_window:
                s = min(max_loss_scale, s * 2.0)
                unskipped = 0
            return finite, (s, unskipped)
        return step
