"""Exercises of notebook 08: the bytes of model state a ZeRO-2 rank holds, and the dtypes FSDP2's collectives
move under a MixedPrecisionPolicy.

Both keys come from `labkit.diagrams.sharding_plan` (tested against DeepSpeed's ZeRO formula and torch's
``fully_shard`` source).

>>> from labkit.exercises import check
>>> print(check("fsdp2_gather_dtype", "fp32").message)  # doctest: +ELLIPSIS
The shards are stored in fp32, but FSDP2 casts each shard to param_dtype *before* it gathers...
"""

from __future__ import annotations

from labkit.exercises.core import Exercise, Hint, register

def _plan(*args, **kwargs) -> dict:
    from labkit.diagrams import sharding_plan

    return sharding_plan(*args, **kwargs)


FSDP2_PARAM_DTYPE = "fp16"
"""param_dtype of the FSDP2 exercises (08): fp16, where notebook 08's own examples use bf16."""


def _collective_dtype(op: str, reduce_dtype: str | None) -> str:
    """The dtype FSDP2 (two ranks, `FSDP2_PARAM_DTYPE`) moves `op`'s tensors in."""
    return next(c["dtype"] for c in _plan(2, "fsdp", FSDP2_PARAM_DTYPE, reduce_dtype)["collectives"]
                if c["op"] == op)


ZERO_RANKS = 64
"""Ranks of the ZeRO exercise (08)."""


def _zero_bytes(strategy: str) -> float:
    return float(_plan(ZERO_RANKS, strategy, "bf16")["bytes_per_param"])


def _mixed_total() -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, "mixed", "adam")["total"])


register(Exercise(
    "zero2_bytes_per_param", ("08",),
    f"DeepSpeed trains with mixed-precision Adam: bf16 weights and gradients, fp32 master weights, fp32 m and v -- "
    f"16 bytes per parameter in all. Under ZeRO stage 2 on {ZERO_RANKS} ranks, how many bytes of model state per "
    f"parameter does each rank hold? (labkit.diagrams.sharding_plan counts them.)",
    "number", lambda: _zero_bytes("zero2"), rel_tol=1e-9,
    hints=(
        Hint(lambda a, k: a == _mixed_total() / ZERO_RANKS,
             "That shards everything, the 16-bit weights included: ZeRO stage 3 (or FSDP). Stages 1 and 2 keep "
             "every rank's full copy of the bf16 weights."),
        Hint(lambda a, k: a == _mixed_total(), "That is plain data parallelism (stage 0): nothing is sharded."),
        Hint(lambda a, k: a == _zero_bytes("zero1"),
             "That is stage 1, which shards the master weights and Adam's states; stage 2 shards the gradients too."),
        Hint(lambda a, k: a == k - 2, "Count the bf16 weights: every rank keeps all of them under stage 2."),
        Hint(lambda a, k: a == k - 4 / ZERO_RANKS,
             "Count the fp32 master weights: DeepSpeed keeps them besides the bf16 weights, sharded from stage 1."),
        Hint(lambda a, k: a == k + 2 / ZERO_RANKS,
             "The gradients are bf16 here, not fp32: DeepSpeed casts the whole model to bf16, gradients included."),
    ),
    otherwise="Go state by state: which of weights, gradients, master weights and m/v does stage 2 split into "
              "1/N shards, and which does every rank keep whole?",
    why=f"2 (bf16 weights, whole) + (2 gradients + 4 master + 8 m and v) / {ZERO_RANKS}: stage 2 shards everything "
        "but the 16-bit weights."))

register(Exercise(
    "fsdp2_gather_dtype", ("08",),
    "FSDP2 with MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32): each rank stores its "
    "parameter shards in fp32. In which dtype does the all-gather before a layer's forward pass move the parameters? "
    "(labkit.diagrams.sharding_plan describes the collectives.)",
    "dtype", lambda: _collective_dtype("all-gather", "fp32"),
    hints=(
        Hint(lambda a, k: a == "fp32",
             "The shards are stored in fp32, but FSDP2 casts each shard to param_dtype *before* it gathers "
             "(FSDPParam.all_gather_inputs): half the bytes. reduce_dtype is for the gradients."),
        Hint(lambda a, k: a == "bf16",
             "bf16 is what this notebook's examples ask for; this policy's param_dtype is another 16-bit dtype."),
    ),
    why="FSDP2 casts each fp32 shard to param_dtype, then all-gathers it: fp16 here, 2 bytes per element (this "
        "notebook's JAX example gathers fp32 and casts after: twice the bytes)."))

register(Exercise(
    "fsdp2_default_reduce_dtype", ("08",),
    "Now MixedPrecisionPolicy(param_dtype=torch.float16) with reduce_dtype left at its default, None. In which "
    "dtype are the gradients reduce-scattered?",
    "dtype", lambda: _collective_dtype("reduce-scatter", None),
    hints=(
        Hint(lambda a, k: a == "fp32",
             "None does not mean fp32: MixedPrecisionPolicy's docstring says the reduction then uses the compute "
             "dtype. Ask for reduce_dtype=torch.float32 to sum the gradients in fp32."),
        Hint(lambda a, k: a == "bf16",
             "bf16 is what this notebook's examples compute in; this policy's param_dtype, its compute dtype, is "
             "another 16-bit dtype."),
    ),
    why="reduce_dtype=None reduces in the compute dtype, fp16 here (foreach_reduce takes reduce_dtype or the "
        "gradient's dtype): 11 significant bits and fp16's range for the sum, unless you ask for fp32."))


__all__ = ["FSDP2_PARAM_DTYPE", "ZERO_RANKS"]
