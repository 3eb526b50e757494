"""Exercises of notebooks 09 and 10, block formats: the values of fp4 E2M1, an MXFP8 block's dequantized
maximum, and the bytes of Adam's states in fp32 and in 8-bit blocks.

The MX key follows torchao's ``to_mx`` (`mx_dequantize`, from ml_dtypes), the state bytes
`labkit.memory.model_state_bytes` and the 8-bit optimizers' block layout (`BLOCK_8BIT`, `SCALE_BYTES`).

>>> from labkit.exercises import check
>>> print(check("e2m1_values", 16).message)
16 bit patterns, but +0 and -0 are the same value: count it once.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from labkit._validate import choice, number
from labkit.exercises.core import Exercise, Hint, register


# -- 09: MX block scaling ----------------------------------------------------------------------------
def _e2m1_values() -> int:
    values = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    return len({float(v) for v in values if np.isfinite(v)})  # -0.0 == 0.0: one value


register(Exercise(
    "e2m1_values", ("09",),
    "How many distinct values does fp4 E2M1 (the elements of MXFP4 and NVFP4; ml_dtypes.float4_e2m1fn) have? "
    "Count +0 and -0 as one value.",
    "integer", _e2m1_values,
    hints=(
        Hint(lambda a, k: a == 16, "16 bit patterns, but +0 and -0 are the same value: count it once."),
        Hint(lambda a, k: a in (k // 2, k // 2 + 1), "Count the negative values too: the sign bit doubles them."),
        Hint(lambda a, k: a in (k - 2, k - 1 - 2), "E2M1 has no inf and no NaN: every pattern is a finite number."),
    ),
    otherwise="Decode all 16 patterns: 1 sign, 2 exponent, 1 mantissa bit, with subnormals.",
    why="0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives: 16 patterns, 15 values."))


def mx_dequantize(x: float, amax: float, rounding: str = "floor") -> float:
    """`x` after MXFP8-E4M3 quantization in a block whose largest magnitude is `amax`, dequantized.

    The shared scale is a power of two (E8M0). FLOOR (torchao's default,
    ``torchao/prototype/mx_formats/mx_tensor.py``, ``to_mx``): ``2^(floor(log2 amax) - 8)``, 8 being
    ``floor(log2 448)``, e4m3's largest power of two; RCEIL: ``2^ceil(log2(amax / 448))``. The
    scaled value is clamped to +-448 before the cast (a plain ml_dtypes cast of 500 to
    float8_e4m3fn gives NaN: e4m3fn has no inf), then multiplied back.

    >>> mx_dequantize(500.0, 500.0), mx_dequantize(500.0, 500.0, "rceil")
    (448.0, 512.0)
    """
    x = number("x", x)
    amax = number("amax", amax, minimum=0, inclusive=False)
    rounding = choice("rounding", rounding, ("floor", "rceil"))
    if abs(x) > amax:
        raise ValueError(f"x ({x:g}) must lie in the block: |x| <= amax ({amax:g})")
    top = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    exp = (math.floor(math.log2(amax)) - math.floor(math.log2(top)) if rounding == "floor"
           else math.ceil(math.log2(amax / top)))
    scale = 2.0 ** min(max(exp, -127), 127)
    q = np.clip(np.float32(x / scale), -top, top).astype(ml_dtypes.float8_e4m3fn)
    return float(q.astype(np.float64) * scale)


register(Exercise(
    "mxfp8_floor_500", ("09",),
    "A 32-value block whose largest magnitude is 500 is quantized to MXFP8 (E4M3 elements, one E8M0 scale) "
    "with torchao's default FLOOR scale. What does the 500 dequantize to? (mx_dequantize checks you.)",
    "number", lambda: mx_dequantize(500.0, 500.0, "floor"),
    hints=(
        Hint(lambda a, k: a == 500.0,
             "With FLOOR the scale is 2^(floor(log2 500) - 8) = 2^0, so the element must hold 500 itself, and "
             "e4m3's largest finite value (ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) is below 500."),
        Hint(lambda a, k: math.isnan(a),
             "A plain ml_dtypes cast of 500 to float8_e4m3fn does give NaN (e4m3fn has no inf), but MX "
             "quantizers (torchao's to_mx) clamp to +-max before casting."),
        Hint(lambda a, k: a == mx_dequantize(500.0, 500.0, "rceil"),
             "That is RCEIL's answer (scale rounded up so that amax fits, 2^1): FLOOR rounds the scale down."),
        Hint(lambda a, k: a == 480.0,
             "e4m3fn has no 480: at exponent 8 its top pattern S.1111.111 is NaN, so 1.75 x 2^8 is its max."),
        Hint(lambda a, k: math.isinf(a), "e4m3fn has no infinity: its overflow is NaN, or a clamp."),
    ),
    why="floor(log2 500) = 8 = e4m3's top exponent, so the scale is 1 and 500 saturates: FLOOR loses the top "
        "of the block (the OCP spec's known weakness; RCEIL avoids it)."))


# -- 10: optimizer-state bytes -----------------------------------------------------------------------
BLOCK_8BIT = 256
"""Values per block of the 8-bit optimizers' states: bitsandbytes (``bitsandbytes/optim/optimizer.py``,
``Optimizer2State.init_state``: ``blocksize = 256``, one fp32 ``absmax`` per block) and torchao
(``torchao/optim/adam.py``, ``Adam8bit(block_size=256)``, one fp32 scale per block)."""
SCALE_BYTES = 4
"""Bytes of one block scale: float32 in both libraries."""


def _adam_state_bytes_8bit() -> float:
    return 2 * (1 + SCALE_BYTES / BLOCK_8BIT)  # m and v: one byte each, plus each block's fp32 scale


def _fp32_state_bytes() -> float:
    from labkit.memory import model_state_bytes

    return float(model_state_bytes(1, "fp32", "adam")["optimizer_states"])


register(Exercise(
    "adam_state_bytes_fp32", ("10",),
    "How many bytes per parameter do Adam's optimizer states (m and v) take in fp32? (Only the states: not the "
    "weights, not the gradients.)",
    "number", _fp32_state_bytes,
    hints=(
        Hint(lambda a, k: a == k / 2, "Adam keeps two states per parameter: m (momentum) and v (squared gradients)."),
        Hint(lambda a, k: a == k + 8, "That counts all of fp32 training's model states (weights + gradients + m + v): "
                                      "the question asks for the optimizer's states only."),
        Hint(lambda a, k: a == k + 4, "That is ZeRO's K = 12: fp32 master weights with m and v. No master copy here."),
    ),
    otherwise="Count the states (how many per parameter?) times the bytes of an fp32.",
    why="m and v, 4 bytes each."))

register(Exercise(
    "adam_state_bytes_8bit", ("10",),
    "With 8-bit Adam (bitsandbytes' or torchao's Adam8bit) each of m and v is stored as 1-byte codes plus one "
    "fp32 scale per block of 256 values. Bytes per parameter of the states, *including* the block scales? "
    "(A number within 0.1% is right.)",
    "number", _adam_state_bytes_8bit, rel_tol=0.001,
    hints=(
        Hint(lambda a, k: a == 2, "Nearly: add the block scales -- one fp32 (4 bytes) per 256 values, for m and "
                                  "for v."),
        Hint(lambda a, k: a == 1 or math.isclose(a, k / 2, rel_tol=1e-3), "Adam has two states, m and v."),
        Hint(lambda a, k: math.isclose(a, 2 + SCALE_BYTES / BLOCK_8BIT, rel_tol=1e-4),
             "That counts one scale per block for one state: m and v each have their own blocks."),
        Hint(lambda a, k: a == 8, "That is fp32 Adam's count; the 8-bit states take 1 byte per value."),
    ),
    why="2 x (1 + 4/256) = 2.03125: about a quarter of fp32 Adam's 8 bytes (bitsandbytes keeps fp32 states for "
        "tensors under 4096 values, torchao for those under 4096 or not divisible by the block)."))


__all__ = ["BLOCK_8BIT", "SCALE_BYTES", "mx_dequantize"]
