"""The seeds' promises about mixed precision, as data: each `Claim` quotes its seed (in Chinese,
with an English translation), says what has to be measured to check it, and which 16-bit
precisions it is about.

>>> get("speed").precisions
('bf16', 'fp16')
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit._validate import choice, shown
from labkit.table import Table

METRICS = ("speedup", "memory_ratio", "activation_ratio", "gradient_ratio", "double_batch_ratio", "accuracy_drop")


@dataclass(frozen=True)
class Claim:
    """A seed's promise: where it is said (seed, quote), what it means, and how to measure it.

    ``metric`` names the measurement (`METRICS`); ``precisions`` the 16-bit precisions the
    claim is about, each compared with fp32.
    """

    key: str
    seed: str
    quote: str
    english: str
    measure: str
    metric: str
    precisions: tuple[str, ...] = ("bf16", "fp16")

    def __post_init__(self):
        choice("metric", self.metric, METRICS)
        for name in ("key", "seed", "quote", "english", "measure"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a string; got {type(getattr(self, name)).__name__} "
                                f"{shown(getattr(self, name))}")
        if isinstance(self.precisions, str):  # one precision, not its letters
            object.__setattr__(self, "precisions", (self.precisions,))
        if not isinstance(self.precisions, (list, tuple)) or not all(isinstance(p, str) for p in self.precisions):
            raise TypeError(f"precisions must be a tuple of precision names; got {shown(self.precisions)}")
        object.__setattr__(self, "precisions", tuple(self.precisions))


_HALVES = "这种方法几乎能将激活和梯度的内存消耗减半"
_HALVES_EN = "this method almost halves the memory that activations and gradients take"

CLAIMS = (
    Claim("speed", "004", "训练加速：2-3倍训练速度提升", "training speed-up: 2-3x faster training",
          "step time of fp32 / step time in 16 bits (same framework, model and shape); holds at >= 2x",
          "speedup"),
    Claim("memory", "004", "内存节省：减少50%内存占用", "memory saving: 50% less memory",
          "measured memory of a whole step (weights, gradients, optimizer states, activations) relative to "
          "fp32; holds at <= 0.55x", "memory_ratio", ("bf16", "fp16", "bf16-pure")),
    Claim("activations", "000", _HALVES, _HALVES_EN,
          "bytes kept for the backward pass relative to fp32 (torch: autograd's saved tensors; JAX: the compiled "
          "step's temporary buffers); holds at <= 0.55x", "activation_ratio", ("bf16", "fp16", "bf16-pure")),
    Claim("gradients", "000", _HALVES, _HALVES_EN,
          "bytes of the gradients the optimizer receives, relative to fp32; holds at <= 0.55x",
          "gradient_ratio", ("bf16", "fp16", "bf16-pure")),
    Claim("double-batch", "003", "float16/bfloat16占用的内存约为float32的一半，可尝试将批量大小加倍",
          "float16/bfloat16 take about half the memory of float32: try doubling the batch size",
          "measured memory of a step at twice the batch in 16 bits, relative to fp32 at the batch; holds at <= 1x",
          "double_batch_ratio"),
    Claim("lossless", "004", "精度影响：几乎无损", "effect on accuracy: almost lossless",
          "test accuracy after the same training run: fp32's minus the 16-bit run's; holds within 1 point",
          "accuracy_drop", ("bf16", "fp16", "bf16-pure")),
)
"""Seed 004's 2-3x speed, 50% memory and "almost lossless"; seed 000's halved activations and
gradients; seed 003's "double the batch size"."""

_BY_KEY = {c.key: c for c in CLAIMS}
SPEEDUP_CLAIMED = 2.0  # seed 004: "2-3x"; 2x is where the claim starts to hold
RATIO_CLAIMED = 0.55  # "half the memory", with 5 points of slack
ACCURACY_SLACK = 0.01  # "almost lossless": within one percentage point


def get(claim) -> Claim:
    """A claim by key (``"speed"``, ``"memory"``, ...) or the Claim itself."""
    if isinstance(claim, Claim):
        return claim
    return _BY_KEY[choice("claim", claim, _BY_KEY)]


def _claims(claims) -> list[Claim]:
    """One claim (a key or a Claim) or a list of them, as Claims."""
    if isinstance(claims, (str, Claim)):
        return [get(claims)]
    if not isinstance(claims, (list, tuple)):
        raise TypeError(f"claims must be a claim key, a Claim, or a list of them; got {type(claims).__name__} "
                        f"{shown(claims)}")
    try:
        return [get(c) for c in claims]
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"claims: {exc}") from None


def claims_table(claims=CLAIMS) -> Table:
    """The claims as the seeds state them, and what is measured to check each one."""
    rows = tuple((c.key, c.seed, c.quote, c.english, ", ".join(c.precisions), c.measure)
                 for c in _claims(claims))
    return Table(("claim", "seed", "quote", "in English", "precisions", "measured"), rows,
                 "The seeds' claims, and how this notebook checks them")


__all__ = ["ACCURACY_SLACK", "CLAIMS", "METRICS", "RATIO_CLAIMED", "SPEEDUP_CLAIMED", "Claim", "claims_table", "get"]
