"""What several exercise modules compute their keys and hints with: a loss scaler replayed to its last scale,
a scaler's default, and the power-of-two test a loss scale answer must pass."""

from __future__ import annotations

import math


def final_scale(preset: str, overflows: int, clean: int, **options) -> float:
    """The scale of `preset`'s loss scaler (as `labkit.scaling.simulate` replays it, tested against the
    library) after `overflows` overflowing steps, then `clean` finite ones; `options` are the preset's own."""
    from labkit.scaling import simulate

    return float(simulate(preset, [True] * overflows + [False] * clean, **options).final_scale)


def default(preset: str, option: str) -> float:
    """A loss scaler's default `option`, as labkit.scaling's `preset` imitates it (tested against the library)."""
    from labkit.scaling import PRESETS

    return float(PRESETS[preset].defaults[option])


def is_pow2(a: float) -> bool:
    """`a` is a positive, finite power of two (a loss scale: scaling by it is exact)."""
    return a > 0 and math.isfinite(a) and math.frexp(a)[0] == 0.5


def log2(x: float) -> int:
    return int(math.log2(x))


__all__ = ["default", "final_scale", "is_pow2", "log2"]
