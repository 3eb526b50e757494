"""What a float is: formats, their bit patterns, and how values round into them.

>>> import labkit.formats as lf
>>> bf16 = lf.get("bf16")
>>> bf16.round(0.1)
0.10009765625
>>> bf16.to_bitstring(bf16.encode(0.1))
'0 01111011 1001101'
>>> lf.get("fp16").classify([1e-6, 1e-9, 7e4]).tolist()
['subnormal', 'zero', 'inf']
>>> list(lf.SUBBYTE_FORMATS)
['fp4_e2m1', 'fp6_e2m3', 'fp6_e3m2', 'e8m0', 'fp8_e4m3fnuz', 'fp8_e5m2fnuz']
"""

from labkit.formats.describe import FLAGS, Representation, exact_decimal, represent, represent_all
from labkit.formats.numerics import (
    Accumulation,
    binade_counts,
    compare_accumulation,
    normalization_stats,
    representable_values,
    running_sum,
    softmax_cross_entropy,
)
from labkit.formats.spec import COURSE_FORMATS, FORMATS, SUBBYTE_FORMATS, FloatFormat, get
from labkit.formats.comparison import comparison_table, loss_scaling_need
from labkit.formats.summary import feature_table, precision_comparison, representation_table
from labkit.formats import blocks, gemm  # MX / NVFP4 block formats; an fp8 GEMM's accumulator

# The figures need matplotlib.pyplot, which is slow to import: load it on first use.
_PLOTS = ("plot_bit_layout", "plot_number_line", "plot_rounding_error", "plot_running_sum", "plot_values")


def __getattr__(name):
    if name in _PLOTS:
        from labkit.formats import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'labkit.formats' has no attribute {name!r}")


__all__ = [
    "COURSE_FORMATS",
    "FLAGS",
    "FORMATS",
    "SUBBYTE_FORMATS",
    "Accumulation",
    "FloatFormat",
    "Representation",
    "binade_counts",
    "blocks",
    "compare_accumulation",
    "comparison_table",
    "exact_decimal",
    "feature_table",
    "gemm",
    "get",
    "loss_scaling_need",
    "normalization_stats",
    "precision_comparison",
    "representable_values",
    "represent",
    "represent_all",
    "representation_table",
    "running_sum",
    "softmax_cross_entropy",
    *_PLOTS,
]
