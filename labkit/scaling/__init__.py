"""Loss scaling: the rules real libraries use, replayed; and what a scale saves.

>>> from labkit import scaling
>>> t = scaling.simulate("torch", overflows=[False, True, False], init_scale=2**16, growth_interval=2000)
>>> t.scales.tolist(), t.applied.tolist(), t.final_scale
([65536.0, 65536.0, 32768.0], [True, False, True], 32768.0)
>>> sorted(scaling.LIBRARY_PRESETS)[:3]
['apex', 'deepspeed', 'deepspeed-fp16-optimizer']

Scalers are values (``adjust(finite) -> new scaler``, as jmp does); ``PRESETS`` maps a
library name to its exact rule; ``simulate`` replays overflow flags; the underflow
helpers measure what a scale S saves in each format; ``fp8`` reproduces Transformer
Engine's per-tensor delayed and current scaling; ``recipes`` sets per-tensor, rowwise
(torchao) and tile (DeepSeek-V3) FP8 scaling side by side; ``seeds`` keeps seed 004's scaler verbatim.
"""

from labkit.scaling import fp8
from labkit.scaling.basic import DynamicLossScale, NoOpLossScale, ScalerStopped, StaticLossScale
from labkit.scaling.deepspeed import DeepSpeedFP16OptimizerScaler, DeepSpeedLossScaler, deepspeed_options
from labkit.scaling.fp8 import current_scaling, delayed_scaling, fp8_recipe, fp8_table
from labkit.scaling import recipes
from labkit.scaling.gradients import GradientRecord, record_gradients
from labkit.scaling.jax_scalers import JmpLossScale, OptaxApplyIfFinite
from labkit.scaling.keras_lso import KerasLossScale, TFKerasLossScale, keras_scale_to_zero
from labkit.scaling.registry import LIBRARY_PRESETS, PRESETS, Preset, get_preset, preset_table
from labkit.scaling import seeds
from labkit.scaling.seed004 import SEED004_DIFFERENCES, SeedLossScale, seed004_differences, seed004_vs_gradscaler
from labkit.scaling.torch_amp import ApexLossScaler, TorchGradScaler
from labkit.scaling.trace import Trace, overflow_pattern, simulate, simulate_closed_loop, traces_table
from labkit.scaling.underflow import Fractions, ScaleRange, fractions, fractions_table, safe_range_table, \
    safe_scale_range

# The figures need matplotlib.pyplot, which is slow to import: load it on first use (as labkit.formats does).
_PLOTS = ("plot_fp8", "plot_gradient_histogram", "plot_traces")


def __getattr__(name):
    if name in _PLOTS:
        from labkit.scaling import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'labkit.scaling' has no attribute {name!r}")


__all__ = [
    "ApexLossScaler",
    "current_scaling",
    "deepspeed_options",
    "DeepSpeedFP16OptimizerScaler",
    "DeepSpeedLossScaler",
    "delayed_scaling",
    "DynamicLossScale",
    "fp8",
    "fp8_recipe",
    "fp8_table",
    "Fractions",
    "fractions",
    "fractions_table",
    "get_preset",
    "GradientRecord",
    "JmpLossScale",
    "KerasLossScale",
    "keras_scale_to_zero",
    "LIBRARY_PRESETS",
    "NoOpLossScale",
    "OptaxApplyIfFinite",
    "overflow_pattern",
    "plot_fp8",
    "plot_gradient_histogram",
    "plot_traces",
    "Preset",
    "preset_table",
    "PRESETS",
    "recipes",
    "record_gradients",
    "safe_range_table",
    "safe_scale_range",
    "ScaleRange",
    "ScalerStopped",
    "seed004_differences",
    "SEED004_DIFFERENCES",
    "seed004_vs_gradscaler",
    "SeedLossScale",
    "seeds",
    "simulate",
    "simulate_closed_loop",
    "StaticLossScale",
    "TFKerasLossScale",
    "TorchGradScaler",
    "Trace",
    "traces_table",
]
