"""What a float is: formats, their bit patterns, and how values round into them.

>>> import labkit.formats as lf
>>> bf16 = lf.get("bf16")
>>> bf16.round(0.1)
0.10009765625
>>> bf16.to_bitstring(bf16.encode(0.1))
'0 01111011 1001101'
>>> lf.get("fp16").classify([1e-6, 1e-9, 7e4]).tolist()
['subnormal', 'zero', 'inf']
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
from labkit.formats.spec import FORMATS, FloatFormat, get
from labkit.formats.comparison import comparison_table, loss_scaling_need
from labkit.formats.summary import feature_table, precision_comparison, representation_table

# The figures need matplotlib.pyplot, which is slow to import: load it on first use.
_PLOTS = ("plot_bit_layout", "plot_number_line", "plot_rounding_error", "plot_running_sum", "plot_values")


def __getattr__(name):
    if name in _PLOTS:
        from labkit.formats import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'labkit.formats' has no attribute {name!r}")


__all__ = [
    "FLAGS",
    "FORMATS",
    "Accumulation",
    "FloatFormat",
    "Representation",
    "binade_counts",
    "compare_accumulation",
    "comparison_table",
    "exact_decimal",
    "feature_table",
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
