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
from labkit.formats.spec import FORMATS, FloatFormat, get
from labkit.formats.table import Table, comparison_table, loss_scaling_need

__all__ = [
    "FLAGS",
    "FORMATS",
    "FloatFormat",
    "Representation",
    "Table",
    "comparison_table",
    "exact_decimal",
    "get",
    "loss_scaling_need",
    "represent",
    "represent_all",
]
