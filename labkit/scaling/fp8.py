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
from collections import deque
from dataclasses import dataclass

import numpy as np

from labkit import formats as lf
from labkit._validate import choice, integer, number, shown
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


def _float32_values(name: str, x) -> np.ndarray:
    """Finite real numbers within float32's range (TE's inputs are fp32/bf16/fp16), as float32."""
    arr = num.real_array(name, x)
    if not np.all(np.isfinite(arr)) or np.any(np.abs(arr) > FLT_MAX):
        raise ValueError(f"{name} must hold finite numbers within float32's range (|x| <= {FLT_MAX:.8g})")
    return arr.astype(np.float32)


class _Steps:
    """Every step's tensor, checked, as one flat float32 array: ``flat[starts[i]:starts[i] + sizes[i]]``."""

    def __init__(self, tensors, name: str = "tensors"):
        what = f"{name} must be a sequence of arrays, one per step"
        if isinstance(tensors, (str, bytes, dict)):
            raise TypeError(f"{what}; got {type(tensors).__name__}")
        if not isinstance(tensors, np.ndarray):
            try:
                tensors = list(tensors)
            except TypeError:
                raise TypeError(f"{what}; got {type(tensors).__name__}") from None
        try:  # the quick way: one rectangular array, a row per step
            whole = np.asarray(tensors)
        except ValueError:  # ragged: tensors of different shapes
            whole = None
        if whole is not None and whole.dtype.kind in "iuf" and whole.ndim >= 1:
            whole = _float32_values(name, whole)
            self.flat, self.sizes = whole.reshape(-1), np.full(len(whole), whole[0].size if len(whole) else 0)
        else:
            parts = [_float32_values(f"{name}[{i}]", t).ravel() for i, t in enumerate(tensors)]
            self.flat = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            self.sizes = np.array([t.size for t in parts], dtype=np.int64)
        if not len(self.sizes):
            raise ValueError(f"{name} is empty: give one tensor per step")
        if not self.sizes.all():
            raise ValueError(f"{name}[{int(np.argmin(self.sizes))}] is empty: each step's tensor needs a value")
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def sum(self, a) -> np.ndarray:
        """Per step: the sum (a count, for booleans) of ``a``, one value per element of ``flat``."""
        return np.add.reduceat(np.asarray(a, np.float64), self.starts)

    def amax(self) -> np.ndarray:
        """Per step: the largest |x| (a float32 value), as float64."""
        return np.maximum.reduceat(np.abs(self.flat), self.starts).astype(np.float64)


def _fp8(fmt):
    f = lf.get(fmt)
    if f.bits != 8:
        raise ValueError(f"fmt must be an fp8 format (fp8_e4m3 or fp8_e5m2); got {f.name}")
    return f


def _cast_scale(scale) -> float:
    """A cast's scale: a number > 0 that float32 holds (TE keeps it in float32)."""
    if scale is None:
        raise TypeError("scale must be a number > 0 (q = fp8(x * scale)); got None")
    return num.check_scale("scale", scale, float32=True)


def cast(x, fmt, scale) -> tuple[np.ndarray, int, int]:
    """Transformer Engine's cast: ``q = fp8_satfinite(float32(x * scale))``.

    Returns (q as float64 values on the fp8 grid, number saturated, number of nonzero
    elements flushed to zero). The multiply is float32; ``__NV_SATFINITE`` clips what
    would round past max to +-max -- those are the saturated elements (a value that
    merely rounds down to max is not counted). ``x``: finite numbers within float32's
    range; ``scale``: a number > 0 that float32 holds.

    >>> cast([1.0, 500.0, 2.0**-12], "fp8_e4m3", 1.0)[1:]
    (1, 1)
    """
    f = _fp8(fmt)
    s = _cast_scale(scale)
    x = _float32_values("x", x)
    with np.errstate(over="ignore"):  # a product past float32's max is inf: that is what saturates
        p = (x * np.float32(s)).astype(np.float64)
    saturated = int((~np.isfinite(f.round(p))).sum())  # past the midpoint above max
    q = f.round(np.clip(p, -f.max, f.max))
    underflow = int(((q == 0) & (x != 0)).sum())
    return q, saturated, underflow


def _record(steps: _Steps, f, scales, recipe) -> Fp8Trace:
    """Cast every step's tensor with its scale (all steps in one pass) and measure what the cast did."""
    x = steps.flat
    s = np.repeat(np.asarray(scales, np.float32), steps.sizes)
    with np.errstate(over="ignore"):  # a product past float32's max is inf: that is what saturates
        p = (x * s).astype(np.float64)
    saturated = steps.sum(~np.isfinite(f.round(p)))
    q = f.round(np.clip(p, -f.max, f.max))
    underflow = steps.sum((q == 0) & (x != 0))
    ref = x.astype(np.float64)
    norm = np.sqrt(steps.sum(ref**2))
    diff = np.sqrt(steps.sum((q / s.astype(np.float64) - ref) ** 2))
    error = np.divide(diff, norm, out=np.zeros_like(diff), where=norm > 0)
    return Fp8Trace(f.name, recipe, np.asarray(scales, np.float64), steps.amax(), saturated / steps.sizes,
                    underflow / np.maximum(steps.sum(x != 0), 1), error)


MAX_MARGIN = 30  # past it, fp8_max * 2**-margin / amax can round to a float32 scale of 0


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

    The first step casts with scale 1: there is no history yet. ``window`` is the largest
    of the last ``amax_history_len`` nonzero amaxes, kept here as a sliding maximum (the
    tests check it against the roll above). ``margin``: from 0 to 30.

    The recipe's documented formula (``DelayedScaling``'s notes in
    ``transformer_engine/common/recipe/__init__.py``, and the Python fallback
    ``_default_sf_compute`` in ``transformer_engine/pytorch/fp8.py``) is
    ``(fp8_max / amax) / 2**margin``; the kernel's ``scaled_max / amax`` with ``scaled_max =
    fp8_max * 2**-margin`` is the same float32 value, since a power of two divides exactly
    (unless the scale falls below float32's smallest normal). tests/scaling/test_recipes.py
    checks the formula as written.
    """
    f = _fp8(fmt)
    steps = tensors if isinstance(tensors, _Steps) else _Steps(tensors)
    n = integer("amax_history_len", amax_history_len, minimum=1)
    choice("amax_compute_algo", amax_compute_algo, AMAX_ALGOS)
    margin = number("margin", margin, minimum=0, maximum=MAX_MARGIN)
    amaxes = steps.amax()
    if amax_compute_algo == "most_recent":
        used = amaxes
    else:
        used, recent, k = np.zeros(len(amaxes)), deque(), 0  # recent: (k, amax), amaxes decreasing; front = window
        for t, last in enumerate(amaxes.tolist()):
            if last != 0:
                while recent and recent[-1][1] <= last:
                    recent.pop()
                recent.append((k, last))
                while recent[0][0] <= k - n:
                    recent.popleft()
                used[t], k = recent[0][1], k + 1
    # the scale after step t comes from step t's amax; a step with amax 0 keeps the one before
    scaled_max = np.float32(f.max) * np.float32(2.0 ** -margin)
    with np.errstate(divide="ignore", over="ignore"):
        new = np.where(used > 0, scaled_max / used.astype(np.float32), np.float32(1))
    new = np.where(np.isinf(new), np.float32(FLT_MAX), new)
    last_set = np.maximum.accumulate(np.where(used > 0, np.arange(len(used)), -1))
    after = np.where(last_set >= 0, new[np.maximum(last_set, 0)], np.float32(1))
    scales = np.concatenate([[np.float32(1)], after[:-1]]).astype(np.float64)
    return _record(steps, f, scales, f"delayed ({amax_compute_algo}, history {n}, margin {margin:g})")


def _scales_from_amax(amax, fp8_max: float, power_2_scale: bool, amax_epsilon: float) -> np.ndarray:
    """TE's ``compute_scale_from_amax`` in float32, for each amax (returned as float64)."""
    with np.errstate(over="ignore"):  # TE's amax is a float32: a larger one is inf there
        a = np.asarray(amax, np.float64).astype(np.float32)
    eps = np.float32(amax_epsilon)
    a = np.where(a < eps, eps, a)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.float32(fp8_max) / a  # float32 division, as __fdiv_rn
    scale = np.where(np.isinf(scale), np.float32(FLT_MAX), scale)
    scale = np.where(np.isinf(a) | (a == 0) | np.isnan(a), np.float32(1), scale)
    if power_2_scale:  # clear the mantissa bits: the power of two at or below
        scale = np.ldexp(np.float32(1), np.frexp(scale)[1] - 1)
    return scale.astype(np.float64)


def _current_options(power_2_scale, amax_epsilon) -> tuple[bool, float]:
    return (num.check_flag("power_2_scale", power_2_scale),
            number("amax_epsilon", amax_epsilon, minimum=0, maximum=FLT_MAX))


def current_scale(amax: float, fmt, *, power_2_scale: bool = False, amax_epsilon: float = 0.0) -> float:
    """TE's ``compute_scale_from_amax`` (``transformer_engine/common/recipe/recipe_common.cuh``).

    ``amax < epsilon -> epsilon``; amax of 0, inf or nan -> scale 1; else
    ``fp8_max / amax`` in float32, FLT_MAX if that is inf, and with ``power_2_scale``
    the mantissa bits cleared (the scale rounded down to a power of two). ``amax`` is a
    number >= 0 (inf and nan allowed, as TE meets them); ``amax_epsilon`` one from 0 to
    float32's max.

    >>> current_scale(3.0, "fp8_e4m3"), current_scale(3.0, "fp8_e4m3", power_2_scale=True)
    (149.3333282470703, 128.0)
    """
    f = _fp8(fmt)
    if isinstance(amax, (float, np.floating)) and math.isnan(amax):
        value = math.nan
    else:
        try:
            value = number("amax", amax, minimum=0, finite=False)
        except ValueError:
            raise ValueError(f"amax must be a number >= 0 (the largest |x|; inf and nan give scale 1); "
                             f"got {shown(amax)}") from None
    return float(_scales_from_amax([value], f.max, *_current_options(power_2_scale, amax_epsilon))[0])


def current_scaling(tensors, fmt="fp8_e4m3", *, power_2_scale: bool = False, amax_epsilon: float = 0.0) -> Fp8Trace:
    """TE's ``Float8CurrentScaling``: each tensor scaled by its own amax, just in time."""
    f = _fp8(fmt)
    steps = tensors if isinstance(tensors, _Steps) else _Steps(tensors)
    p2, eps = _current_options(power_2_scale, amax_epsilon)
    scales = _scales_from_amax(steps.amax(), f.max, p2, eps)
    return _record(steps, f, scales, "current" + (" (power of 2)" if p2 else ""))


RECIPE_OPTIONS = {"delayed": ("amax_history_len", "amax_compute_algo", "margin"),
                  "current": ("power_2_scale", "amax_epsilon")}


def fp8_recipe(activations, gradients, recipe: str = "delayed", fp8_format: str = "HYBRID", **options) -> dict:
    """Both directions of one layer under a TE recipe: {"forward": Fp8Trace, "backward": Fp8Trace}.

    ``fp8_format="HYBRID"`` (TE's default): activations in e4m3, gradients in e5m2;
    ``"E4M3"``: both e4m3 (TE has no pure-E5M2 training). ``recipe``: "delayed" (options:
    amax_history_len, amax_compute_algo, margin) or "current" (options: power_2_scale,
    amax_epsilon).
    """
    choice("fp8_format", fp8_format, FP8_FORMATS)
    choice("recipe", recipe, RECIPE_OPTIONS)
    unknown = [k for k in options if k not in RECIPE_OPTIONS[recipe]]
    if unknown:
        raise TypeError(f"recipe {recipe!r} has no option {unknown[0]!r}; its options are: "
                        f"{', '.join(RECIPE_OPTIONS[recipe])}")
    run = {"delayed": delayed_scaling, "current": current_scaling}[recipe]
    fwd, bwd = FP8_FORMATS[fp8_format]
    return {"forward": run(_Steps(activations, "activations"), fwd, **options),
            "backward": run(_Steps(gradients, "gradients"), bwd, **options)}


def fp8_table(traces: dict):
    """One row per (label, Fp8Trace) of ``{label: Fp8Trace}``: saturation, underflow and error, as a Table."""
    from labkit.table import Table

    if isinstance(traces, Fp8Trace):
        traces = {traces.recipe: traces}
    if not isinstance(traces, dict):
        raise TypeError(f"traces must be a dict {{label: Fp8Trace}} (from delayed_scaling / current_scaling); "
                        f"got {type(traces).__name__}")
    rows = []
    for label, t in traces.items():
        if not isinstance(t, Fp8Trace):
            raise TypeError(f"traces must map labels to Fp8Trace objects; {label!r} is {type(t).__name__}")
        s = t.summary()
        rows.append((str(label), t.format, str(s["steps with saturation"]), f"{s['mean saturated %']:.3f}%",
                     f"{s['mean underflow %']:.2f}%", f"{s['mean rel. error %']:.2f}%"))
    return Table(("tensor / recipe", "format", "steps that saturate", "saturated", "underflow", "rel. error"),
                 tuple(rows), "Per-tensor FP8 scaling on a real tensor sequence")
