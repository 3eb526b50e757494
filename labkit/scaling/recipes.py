"""FP8 scaling recipes side by side: one scale per tensor, per row, or per tile, on the same tensors.

Every recipe casts ``q = fp8(float32(x * s))`` (saturating at +-max) and dequantises ``q / s``;
they differ in how many scales there are and where each comes from:

=========  ==========================================================  =============================
recipe     scale                                                       source
=========  ==========================================================  =============================
delayed    one per tensor, ``(fp8_max / amax) / 2**margin`` from the    Transformer Engine
           max of the last ``amax_history_len`` steps' amaxes           ``DelayedScaling``
current    one per tensor, ``fp8_max / amax(x)`` in float32             TE ``Float8CurrentScaling``
rowwise    one per row (last axis), ``fp8_max / amax(row)``, rounded    torchao ``Float8LinearConfig.
           down to a power of two                                       from_recipe_name("rowwise")``
tiles      one per 1x128 tile (activations, gradients) or 128x128       DeepSeek-V3 report §3.3.1
           block (weights), ``fp8_max / amax(tile)``
=========  ==========================================================  =============================

Sources. TE: ``transformer_engine/common/recipe/__init__.py`` (``DelayedScaling`` notes:
``new_scaling_factor = (FP8_MAX / amax) / (2 ^ margin)``; defaults margin 0, history 1024,
"max"), ``transformer_engine/pytorch/fp8.py`` ``_default_sf_compute`` (the same formula,
amax 0 or inf keeps the old scale, an inf scale becomes FLT_MAX) -- `labkit.scaling.fp8`
replays both recipes. torchao: ``torchao/float8/float8_utils.py`` ``amax_to_scale``
(``float32(float64(fp8_max) / clamp(float64(amax), min=EPS=1e-12))``, then
``_round_scale_down_to_power_of_2``: ``exp2(floor(log2(scale)))``); the rowwise recipe
(``torchao/float8/config.py``) scales input, weight and grad_output axiswise along dim -1 and
sets ``round_scales_to_power_of_2=True``; the cast is ``float32(x) * scale`` then a saturated
cast (``float8_training_tensor.py``). DeepSeek-V3 (arXiv 2412.19437, §3.3.1 "Fine-Grained
Quantization"): activations "on a 1x128 tile basis (i.e., per token per 128 channels)",
weights "on a 128x128 block basis (i.e., per 128 input channels per 128 output channels)",
the scale from each tile's online amax, E4M3 for all tensors. Here its scale is computed as
TE's (float32 ``fp8_max / amax``, amax 0 -> 1); ``power_2_scale=True`` gives TE
``Float8BlockScaling``'s default power-of-two scales.

Tiles at an edge. A last axis (or, for weights, a first axis) not divisible by the tile size
ends in a partial tile; it is scaled from its own elements' amax, which is what zero-padding
to the next multiple of 128 gives (zeros change no amax). So the digits MLP's 64-pixel input
is one 1x64 tile per row.

Measures, per step: relative RMS error ``||q/s - x|| / ||x||``, the fraction of elements that
saturate (would round past max; clipped), and the fraction of nonzero elements that become 0.

>>> rng = np.random.default_rng(0)
>>> steps = [rng.standard_normal((4, 256)).astype(np.float32) for _ in range(3)]
>>> r = evaluate(steps, "tiles")
>>> r.scales_per_tensor, float(r.saturated.max())
(8, 0.0)
>>> bad = plant_outlier(steps[2], factor=1000, seed=0)
>>> int((bad != steps[2]).sum())
1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit._validate import choice, integer, number, shown
from labkit.scaling import fp8 as _fp8

RECIPES = ("delayed", "current", "rowwise", "tiles")
KINDS = ("activation", "weight", "gradient")
TILE = 128  # DeepSeek-V3's tile: 1x128 (activations), 128x128 (weights)
TORCHAO_EPS = 1e-12  # torchao/float8/float8_utils.py, EPS: amax is clamped to it


@dataclass(frozen=True, eq=False)
class RecipeResult:
    """One recipe on a sequence of tensors: per step, the error and what the cast did.

    ``scales``: each step's scales (an array shaped like the scale grid: (1, 1) per tensor,
    (rows, 1) per row, (row tiles, column tiles) per tile).
    """

    recipe: str
    format: str
    kind: str
    scales: tuple
    error: np.ndarray
    saturated: np.ndarray
    underflow: np.ndarray

    @property
    def scales_per_tensor(self) -> int:
        return int(self.scales[0].size)


def _steps(tensors, name: str = "tensors") -> list[np.ndarray]:
    """A sequence of tensors (one per step) as float32 2-d arrays (a 1-d tensor is one row)."""
    what = f"{name} must be a sequence of arrays, one per step (or one 2-d array per step)"
    if isinstance(tensors, (str, bytes, dict)) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what}; got {type(tensors).__name__} {shown(tensors)}")
    out = []
    for i, t in enumerate(tensors):
        arr = _fp8._float32_values(f"{name}[{i}]", t)
        if arr.ndim == 0 or arr.size == 0:
            raise ValueError(f"{name}[{i}] must be a non-empty array of at least one dimension; got shape {arr.shape}")
        out.append(arr.reshape(-1, arr.shape[-1]))
    if not out:
        raise ValueError(f"{name} is empty: give one tensor per step")
    return out


def _torchao_scale(amax, fp8_max: float, power_2: bool) -> np.ndarray:
    """torchao's ``amax_to_scale``: float64 quotient, clamped amax, float32, then a power of 2 below."""
    scale = (fp8_max / np.maximum(np.asarray(amax, np.float64), TORCHAO_EPS)).astype(np.float32)
    if power_2:
        scale = np.exp2(np.floor(np.log2(scale))).astype(np.float32)
    return scale


def _tile_amax(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """amax of each (rows x cols) tile of x, partial tiles at the edges (zero padding)."""
    r, c = -(-x.shape[0] // rows), -(-x.shape[1] // cols)
    padded = np.zeros((r * rows, c * cols), np.float32)
    padded[:x.shape[0], :x.shape[1]] = np.abs(x)
    return padded.reshape(r, rows, c, cols).max(axis=(1, 3))


def _expand(scales: np.ndarray, shape, rows: int, cols: int) -> np.ndarray:
    return np.repeat(np.repeat(scales, rows, axis=0), cols, axis=1)[:shape[0], :shape[1]]


def _measure(x: np.ndarray, s: np.ndarray, f) -> tuple[float, float, float]:
    """Cast x with the (broadcast) float32 scales s; (relative RMS error, saturated, underflow fractions)."""
    with np.errstate(over="ignore"):
        p = (x * s.astype(np.float32)).astype(np.float64)
    saturated = float((~np.isfinite(f.round(p, saturate=False))).mean())
    q = f.round(np.clip(p, -f.max, f.max), saturate=True)
    nonzero = x != 0
    underflow = float(((q == 0) & nonzero).sum() / max(int(nonzero.sum()), 1))
    ref = x.astype(np.float64)
    norm = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(q / s.astype(np.float64) - ref) / norm) if norm > 0 else 0.0
    return err, saturated, underflow


def scales_for(tensors, recipe: str, fmt: str = "fp8_e4m3", *, kind: str = "activation", tile: int = TILE,
               amax_history_len: int = 16, margin: float = 0, power_2_scale: bool | None = None) -> list[np.ndarray]:
    """Each step's scale grid under `recipe` (see the module docstring); float32 values as float64.

    ``power_2_scale``: None takes each recipe's default (rowwise: True, as torchao's recipe;
    the others: False). ``amax_history_len`` 16 rather than TE's 1024: a short trace.
    """
    steps = tensors if isinstance(tensors, list) and all(isinstance(t, np.ndarray) and t.ndim == 2
                                                         and t.dtype == np.float32 for t in tensors) \
        else _steps(tensors)
    choice("recipe", recipe, RECIPES)
    choice("kind", kind, KINDS)
    f = _fp8._fp8(fmt)
    tile = integer("tile", tile, minimum=1, maximum=2**16)
    p2 = recipe == "rowwise" if power_2_scale is None else _flag(power_2_scale)
    amax_history_len = integer("amax_history_len", amax_history_len, minimum=1)  # checked for every recipe:
    margin = number("margin", margin, minimum=0, maximum=_fp8.MAX_MARGIN)  # a typo is never ignored
    if recipe in ("delayed", "current"):
        flat = _fp8._Steps([t.ravel() for t in steps])
        if recipe == "delayed":
            s = _fp8.delayed_scaling(flat, f, amax_history_len=amax_history_len, margin=margin).scales
            if p2:
                s = np.exp2(np.floor(np.log2(s)))
        else:
            s = _fp8.current_scaling(flat, f, power_2_scale=p2).scales
        return [np.full((1, 1), v) for v in s]
    if recipe == "rowwise":
        return [_torchao_scale(np.abs(t).max(axis=1, keepdims=True), f.max, p2).astype(np.float64) for t in steps]
    rows = tile if kind == "weight" else 1
    return [_fp8._scales_from_amax(_tile_amax(t, rows, tile), f.max, p2, 0.0).reshape(-(-t.shape[0] // rows), -1)
            for t in steps]


def _flag(value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"power_2_scale must be True, False or None (the recipe's default); got {shown(value)}")
    return bool(value)


def _grid(recipe: str, kind: str, tile: int, shape) -> tuple[int, int]:
    """The block each scale covers: (rows, cols)."""
    if recipe in ("delayed", "current"):
        return shape
    if recipe == "rowwise":
        return 1, shape[1]
    return (tile if kind == "weight" else 1), tile


def evaluate(tensors, recipe: str, fmt: str = "fp8_e4m3", *, kind: str = "activation", tile: int = TILE,
             amax_history_len: int = 16, margin: float = 0, power_2_scale: bool | None = None) -> RecipeResult:
    """Cast each step's tensor under `recipe` and measure it (`RecipeResult`); options: `scales_for`."""
    steps = _steps(tensors)
    grids = scales_for(steps, recipe, fmt, kind=kind, tile=tile, amax_history_len=amax_history_len, margin=margin,
                       power_2_scale=power_2_scale)
    f = _fp8._fp8(fmt)
    stats = np.array([_measure(x, _expand(g, x.shape, *_grid(recipe, kind, tile, x.shape)), f)
                      for x, g in zip(steps, grids)])
    return RecipeResult(recipe, f.name, kind, tuple(grids), stats[:, 0], stats[:, 1], stats[:, 2])


def _recipes(recipes) -> list[str]:
    from labkit._validate import names

    out = names("recipes", recipes, RECIPES)
    if not out:
        raise ValueError(f"recipes must name at least one of {', '.join(RECIPES)}")
    return out


def _labelled(tensors) -> dict:
    if isinstance(tensors, dict):
        if not tensors:
            raise ValueError("tensors is an empty dict: give {label: one tensor per step}")
        return {str(k): _steps(v, f"tensors[{k!r}]") for k, v in tensors.items()}
    return {"": _steps(tensors)}


def compare(tensors, fmt: str = "fp8_e4m3", recipes=RECIPES, kind: str = "activation", **options):
    """The recipes side by side on the same tensors, as a Table (means over the steps).

    ``tensors``: one tensor per step, or ``{label: one tensor per step}`` (a row per label and
    recipe), e.g. `labkit.train.torch.trace.capture`'s ``activations``. ``options``: `scales_for`'s.

    >>> rng = np.random.default_rng(0)
    >>> print(compare([rng.standard_normal((2, 128)) for _ in range(2)], recipes=("current", "tiles")))
    ... # doctest: +NORMALIZE_WHITESPACE
    FP8 scaling recipes (fp8_e4m3, activation tensors, mean over 2 steps)
    recipe   scales / tensor  rel. RMS error  worst step  saturated  underflow
    -------  ---------------  --------------  ----------  ---------  ---------
    current  1                2.65%           2.66%       0.000%     0.00%
    tiles    2                2.54%           2.71%       0.000%     0.00%
    """
    from labkit.table import Table

    groups, chosen = _labelled(tensors), _recipes(recipes)
    choice("kind", kind, KINDS)
    rows, f = [], _fp8._fp8(fmt)
    for label, steps in groups.items():
        for recipe in chosen:
            r = evaluate(steps, recipe, f.name, kind=kind, **options)
            rows.append((label, recipe, str(r.scales_per_tensor), f"{100 * r.error.mean():.2f}%",
                         f"{100 * r.error.max():.2f}%", f"{100 * r.saturated.mean():.3f}%",
                         f"{100 * r.underflow.mean():.2f}%"))
    n = len(next(iter(groups.values())))
    columns = ("recipe", "scales / tensor", "rel. RMS error", "worst step", "saturated", "underflow")
    if "" in groups:  # one unlabelled sequence: no tensor column
        return Table(columns, tuple(r[1:] for r in rows), f"FP8 scaling recipes ({f.name}, {kind} tensors, mean over {n} steps)")
    return Table(("tensor", "recipe", "scales / tensor", "rel. RMS error", "worst step", "saturated", "underflow"),
                 tuple(rows), f"FP8 scaling recipes ({f.name}, {kind} tensors, mean over {n} steps)")


def plant_outlier(x, factor: float = 1000, seed: int = 0) -> np.ndarray:
    """A float32 copy of ``x`` with one nonzero element (picked by ``seed``) multiplied by ``factor``.

    The product must stay within float32's range. Use it on one step's tensor to watch a
    per-tensor scale shrink for everyone while a row or tile scale keeps the damage local.
    """
    arr = _fp8._float32_values("x", x)
    factor = number("factor", factor, minimum=0, inclusive=False, maximum=_fp8.FLT_MAX)
    rng = np.random.default_rng(integer("seed", seed, minimum=0))
    nonzero = np.flatnonzero(arr)
    if not nonzero.size:
        raise ValueError("x has no nonzero element to make an outlier of")
    i = int(rng.choice(nonzero))
    out = arr.copy()
    value = float(out.flat[i]) * factor
    if abs(value) > _fp8.FLT_MAX:
        raise ValueError(f"factor {factor:g} takes x's element {float(out.flat[i]):g} past float32's range")
    out.flat[i] = np.float32(value)
    return out


def outlier_errors(tensors, fmt: str = "fp8_e4m3", recipes=RECIPES, kind: str = "activation", factor: float = 1000,
                   seed: int = 0, step: int | None = None, **options) -> dict[str, dict[str, float]]:
    """What one outlier (`plant_outlier` in step ``step``, default the middle one) does to each
    recipe, as numbers: ``{recipe: {"clean", "with_outlier", "underflow", "outlier", "later_clean",
    "later"}}`` -- the relative RMS error of the *other* elements of the planted step without and
    with the outlier, their underflow fraction with it, the outlier's own relative error, and the
    mean error of the steps after it without and with it (NaN when the outlier is in the last step).
    A delayed scale remembers the outlier's amax for ``amax_history_len`` steps; the other recipes
    forget it at once. Also ``"step"``: the planted step.

    >>> x = [np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 128)] * 3
    >>> e = outlier_errors(x, factor=1e6)
    >>> e["current"]["with_outlier"] > 10 * e["current"]["clean"], e["tiles"]["with_outlier"] < e["current"]["with_outlier"]
    (True, True)
    """
    steps, chosen = _steps(tensors), _recipes(recipes)
    choice("kind", kind, KINDS)
    f = _fp8._fp8(fmt)
    at = len(steps) // 2 if step is None else integer("step", step, minimum=0, maximum=len(steps) - 1)
    planted = list(steps)
    planted[at] = plant_outlier(steps[at], factor, seed)
    where = planted[at] != steps[at]
    rest = ~where
    out = {}
    for recipe in chosen:
        clean, dirty = (scales_for(s, recipe, f.name, kind=kind, **options) for s in (steps, planted))
        grid = _grid(recipe, kind, options.get("tile", TILE), steps[at].shape)
        s_clean, s_dirty = (_expand(g[at], steps[at].shape, *grid) for g in (clean, dirty))
        e_dirty, _, u_dirty = _measure(planted[at][rest], s_dirty[rest], f)
        later = [_measure(planted[t], _expand(dirty[t], planted[t].shape, *grid), f)[0] for t in range(at + 1, len(steps))]
        later_clean = [_measure(steps[t], _expand(clean[t], steps[t].shape, *grid), f)[0] for t in range(at + 1, len(steps))]
        out[recipe] = {"clean": float(_measure(steps[at][rest], s_clean[rest], f)[0]), "with_outlier": float(e_dirty),
                       "underflow": float(u_dirty), "outlier": float(_measure(planted[at][where], s_dirty[where], f)[0]),
                       "later_clean": float(np.mean(later_clean)) if later else float("nan"),
                       "later": float(np.mean(later)) if later else float("nan"), "step": at}
    return out


def outlier_effect(tensors, fmt: str = "fp8_e4m3", recipes=RECIPES, kind: str = "activation", factor: float = 1000,
                   seed: int = 0, step: int | None = None, **options):
    """`outlier_errors` as a table: per recipe, the other elements' error without and with the
    outlier, its growth, their underflow, the outlier's own error, and the later steps' error."""
    from labkit.table import Table

    errors = outlier_errors(tensors, fmt, recipes, kind, factor, seed, step, **options)
    rows = []
    for recipe, e in errors.items():
        rows.append((recipe, f"{100 * e['clean']:.2f}%", f"{100 * e['with_outlier']:.2f}%",
                     f"{e['with_outlier'] / e['clean']:.1f}x" if e["clean"] else "-", f"{100 * e['underflow']:.2f}%",
                     f"{100 * e['outlier']:.2f}%",
                     "-" if np.isnan(e["later"]) else f"{100 * e['later_clean']:.2f}% -> {100 * e['later']:.2f}%"))
    at = next(iter(errors.values()))["step"]
    return Table(("recipe", "others' error (clean)", "with outlier", "growth", "others' underflow", "outlier's error",
                  "later steps' error"), tuple(rows),
                 f"One element x{factor:g} in step {at} ({_fp8._fp8(fmt).name}, {kind} tensors)")


__all__ = ["KINDS", "RECIPES", "RecipeResult", "TILE", "compare", "evaluate", "outlier_effect", "outlier_errors", "plant_outlier",
           "scales_for"]
