"""labkit: a course and lab environment on mixed precision training.

The public surface is small and curated:

>>> import labkit.formats as lf
>>> lf.get("bf16").mantissa_bits
7

Framework code (torch, jax, tensorflow) is imported lazily, inside the parts that
need it, so ``import labkit`` needs only numpy, ml_dtypes and matplotlib.
"""

__version__ = "0.1.0"

import importlib

from labkit import formats, hardware, memory, table

_LAZY = ("bench", "checks", "claims", "colab", "diagrams", "evidence", "exercises", "scaling", "train", "widgets")  # heavier, or need the rest


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"labkit.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


__all__ = ["__version__", "formats", "hardware", "memory", "table", *_LAZY]
