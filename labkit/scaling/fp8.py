"""Per-tensor FP8 scaling as NVIDIA Transformer Engine does it: delayed and current scaling.

FP8 has too little range for one global loss scale (e4m3 spans 2**-9 .. 448), so every
tensor gets its own scale, chosen so that its largest magnitude (amax) lands near the
format's max: ``q = fp8(x * scale)``, and the matmul output is multiplied by
``1 / scale``. Two recipes (NVIDIA/TransformerEngine
``transformer_engine/common/recipe/__init__.py``):

* ``DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
  amax_compute_algo="max")`` -- the scale used at step t comes from the amaxes of
  earlier steps, kept in a history window. Cheap (no extra pass over the tensor), but a
  tensor that grows past its history saturates.
* ``Float8CurrentScaling`` -- the scale comes from this tensor's own amax (an extra
  reduction before the cast): nothing saturates.

``Format.HYBRID`` casts forward tensors (activations, weights) to e4m3 (more precision)
and gradients to e5m2 (more range); ``Format.E4M3`` uses e4m3 for both.

>>> t = delayed_scaling([[1.0, 0.5], [2.0, 1.0]], "fp8_e4m3", amax_history_len=2)
>>> t.scales.tolist(), t.saturated.tolist()
([1.0, 448.0], [0.0, 0.5])
>>> current_scaling([[1.0, 0.5], [2.0, 1.0]], "fp8_e4m3").scales.tolist()
[448.0, 224.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labkit import formats as lf
from labkit.scaling import _numbers as num

FLT_MAX = float(np.finfo(np.float32).max)
# transformer_engine/common/recipe/__init__.py, class Format: (forward format, backward format)
FP8_FORMATS = {"HYBRID": ("fp8_e4m3", "fp8_e5m2"), "E4M3": ("fp8_e4m3", "fp8_e4m3")}
AMAX_ALGOS = ("max", "most_recent")


@dataclass(frozen=True, eq=False)
class Fp8Trace:
    """Per step: the scale used for the cast, the tensor's amax, and what the cast did.

    ``saturated``: fraction of elements that a plain cast would turn into inf/nan
    (clipped to +-max by TE's saturating cast); ``underflow``: fraction of the nonzero elements that became 0;
    ``error``: relative RMS error of the dequantised tensor ``q / scale``.
    """

    format: str
    recipe: str
    scales: np.ndarray
    amax: np.ndarray
    saturated: np.ndarray
    underflow: np.ndarray
    error: np.ndarray

    def summary(self) -> dict:
        return {
            "recipe": self.recipe,
            "format": self.format,
            "steps with saturation": int((self.saturated > 0).sum()),
            "mean saturated %": 100 * float(self.saturated.mean()),
            "mean underflow %": 100 * float(self.underflow.mean()),
            "mean rel. error %": 100 * float(self.error.mean()),
        }


def _tensors(tensors) -> list[np.ndarray]:
    if isinstance(tensors, np.ndarray) and tensors.ndim >= 1:
        tensors = list(tensors)
    try:
        out = [np.asarray(t, dtype=np.float32) for t in tensors]
    except (TypeError, ValueError):
        raise TypeError("tensors must be a sequence of arrays, one per step") from None
    if not out:
        raise ValueError("tensors is empty: give one tensor per step")
    for i, t in enumerate(out):
        if t.size == 0 or not np.all(np.isfinite(t)):
            raise ValueError(f"tensor {i} must be a non-empty array of finite numbers")
    return out


def _fp8(fmt):
    f = lf.get(fmt)
    if f.bits != 8:
        raise ValueError(f"fmt must be an fp8 format (fp8_e4m3 or fp8_e5m2); got {f.name}")
    return f


def cast(x, fmt, scale) -> tuple[np.ndarray, int, int]:
    """Transformer Engine's cast: ``q = fp8_satfinite(float32(x * scale))``.

    Returns (q as float64 values on the fp8 grid, number saturated, number of nonzero
    elements flushed to zero). The multiply is float32; ``__NV_SATFINITE`` clips what
    would round past max to +-max -- those are the saturated elements (a value that
    merely rounds down to max is not counted).
    """
    f = _fp8(fmt)
    x = np.asarray(x, dtype=np.float32)
    p = (x * np.float32(scale)).astype(np.float64)
    saturated = int((~np.isfinite(f.round(p))).sum())  # past the midpoint above max
    q = f.round(np.clip(p, -f.max, f.max))
    underflow = int(((q == 0) & (x != 0)).sum())
    return q, saturated, underflow


def _record(tensors, f, scales, recipe) -> Fp8Trace:
    sat, und, err, amax = [], [], [], []
    for x, s in zip(tensors, scales):
        q, n_sat, n_und = cast(x, f, s)
        nonzero = max(int((x != 0).sum()), 1)
        deq = q / s
        ref = x.astype(np.float64)
        norm = float(np.sqrt((ref**2).sum()))
        sat.append(n_sat / x.size)
        und.append(n_und / nonzero)
        err.append(float(np.sqrt(((deq - ref) ** 2).sum())) / norm if norm > 0 else 0.0)
        amax.append(float(np.abs(x).max()))
    return Fp8Trace(f.name, recipe, np.asarray(scales, np.float64), np.asarray(amax), np.asarray(sat),
                    np.asarray(und), np.asarray(err))


def delayed_scaling(tensors, fmt="fp8_e4m3", *, amax_history_len: int = 1024, amax_compute_algo: str = "max",
                    margin: float = 0) -> Fp8Trace:
    """Replay TE's ``DelayedScaling`` for one tensor seen once per step.

    Source: ``transformer_engine/common/recipe/delayed_scaling.cu``
    (``amax_and_scale_update``, ``kernel_bulk``), run after each forward (backward) pass::

        scale = 1.0; history = zeros(amax_history_len)      # TE's initial FP8 meta
        for x in tensors:
            q = fp8(x * scale)                               # cast with the *old* scale
            history[0] = amax(x)                             # the cast records amax
            last = history[0]
            if last != 0:                                    # kernel_bulk skips the roll at 0
                window = max(history)                        # the last amax_history_len amaxes
                history = [0, history[2], ..., history[-1], last]   # roll
            amax = last if amax_compute_algo == "most_recent" else window
            if isfinite(amax) and amax > 0: scale = (fp8_max * 2**-margin) / amax   # float32
            if isinf(scale): scale = FLT_MAX

    The first step casts with scale 1: there is no history yet.
    """
    f = _fp8(fmt)
    xs = _tensors(tensors)
    n = num.check_interval("amax_history_len", amax_history_len, "steps of amax history")
    if amax_compute_algo not in AMAX_ALGOS:
        raise ValueError(f"amax_compute_algo must be one of {', '.join(AMAX_ALGOS)}; got {amax_compute_algo!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number (the scale is divided by 2**margin); got {margin!r}")
    scaled_max = num.f32(f.max * num.f32(2.0 ** -margin))
    history = [0.0] * n
    scale, scales = 1.0, []
    for x in xs:
        scales.append(scale)
        last = num.f32(float(np.abs(x).max()))
        history[0] = last
        window = 0.0
        if last != 0:
            window = max(history)
            history = [0.0] + history[2:] + [last] if n > 1 else [0.0]
        amax = last if amax_compute_algo == "most_recent" else window
        if math.isfinite(amax) and amax > 0:
            scale = num.f32(scaled_max / amax)
        if math.isinf(scale):
            scale = FLT_MAX
    return _record(xs, f, scales, f"delayed ({amax_compute_algo}, history {n}, margin {margin:g})")


def current_scale(amax: float, fmt, *, power_2_scale: bool = False, amax_epsilon: float = 0.0) -> float:
    """TE's ``compute_scale_from_amax`` (``transformer_engine/common/recipe/recipe_common.cuh``).

    ``amax < epsilon -> epsilon``; amax of 0, inf or nan -> scale 1; else
    ``fp8_max / amax`` in float32, FLT_MAX if that is inf, and with ``power_2_scale``
    the mantissa bits cleared (the scale rounded down to a power of two).

    >>> current_scale(3.0, "fp8_e4m3"), current_scale(3.0, "fp8_e4m3", power_2_scale=True)
    (149.3333282470703, 128.0)
    """
    f = _fp8(fmt)
    amax = num.f32(amax)
    if amax < amax_epsilon:
        amax = num.f32(amax_epsilon)
    if math.isinf(amax) or amax == 0 or math.isnan(amax):
        return 1.0
    scale = num.f32(f.max / amax)
    if math.isinf(scale):
        scale = FLT_MAX
    if power_2_scale:
        scale = 2.0 ** math.floor(math.log2(scale))
    return scale


def current_scaling(tensors, fmt="fp8_e4m3", *, power_2_scale: bool = False, amax_epsilon: float = 0.0) -> Fp8Trace:
    """TE's ``Float8CurrentScaling``: each tensor scaled by its own amax, just in time."""
    f = _fp8(fmt)
    xs = _tensors(tensors)
    num.check_flag("power_2_scale", power_2_scale)
    scales = [current_scale(float(np.abs(x).max()), f, power_2_scale=power_2_scale, amax_epsilon=amax_epsilon)
              for x in xs]
    return _record(xs, f, scales, "current" + (" (power of 2)" if power_2_scale else ""))


def fp8_recipe(activations, gradients, recipe: str = "delayed", fp8_format: str = "HYBRID", **options) -> dict:
    """Both directions of one layer under a TE recipe: {"forward": Fp8Trace, "backward": Fp8Trace}.

    ``fp8_format="HYBRID"`` (TE's default): activations in e4m3, gradients in e5m2;
    ``"E4M3"``: both e4m3. ``recipe``: "delayed" (options: amax_history_len,
    amax_compute_algo, margin) or "current" (options: power_2_scale, amax_epsilon).
    """
    if fp8_format not in FP8_FORMATS:
        raise ValueError(f"fp8_format must be one of {', '.join(FP8_FORMATS)} (TE has no pure-E5M2 training); "
                         f"got {fp8_format!r}")
    run = {"delayed": delayed_scaling, "current": current_scaling}.get(recipe)
    if run is None:
        raise ValueError(f"recipe must be 'delayed' or 'current'; got {recipe!r}")
    fwd, bwd = FP8_FORMATS[fp8_format]
    return {"forward": run(activations, fwd, **options), "backward": run(gradients, bwd, **options)}


def fp8_table(traces: dict):
    """One row per (label, Fp8Trace): saturation, underflow and error, as a Table."""
    from labkit.formats import Table

    rows = []
    for label, t in traces.items():
        s = t.summary()
        rows.append((label, t.format, str(s["steps with saturation"]), f"{s['mean saturated %']:.3f}%",
                     f"{s['mean underflow %']:.2f}%", f"{s['mean rel. error %']:.2f}%"))
    return Table(("tensor / recipe", "format", "steps that saturate", "saturated", "underflow", "rel. error"),
                 tuple(rows), "Per-tensor FP8 scaling on a real tensor sequence")
