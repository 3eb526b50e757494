"""Seed 004's code kept verbatim, to be shown wrong next to the corrected code in
`labkit.train.torch.lessons` (`SafeLayerNorm`, `compare_layer_norms`, `unbiased_variance_error`,
`missing_bias_error`).

>>> import torch
>>> hasattr(SeedSafeLayerNorm(4), "bias")
False
"""

import torch
from torch import nn


class SeedSafeLayerNorm(nn.Module):
    """Seed 004's ``SafeLayerNorm``, verbatim. INCORRECT in two ways: ``x.var()`` is the
    *unbiased* variance (divides by n - 1; ``nn.LayerNorm`` divides by n), and there is
    no bias (beta) parameter."""

    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        x_fp32 = x.float()
        mean = x_fp32.mean(dim=-1, keepdim=True)
        var = x_fp32.var(dim=-1, keepdim=True)
        x_norm = (x_fp32 - mean) / torch.sqrt(var + self.eps)
        return (self.weight * x_norm).to(x.dtype)
