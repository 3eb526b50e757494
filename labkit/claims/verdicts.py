"""The seeds' promises about mixed precision, as data, and a verdict computed from measurements.

Each `Claim` quotes a seed (in Chinese, with an English translation), says what has to be
measured to check it, and which 16-bit precisions it is about. `verdict` compares one
measured 16-bit record with its fp32 baseline -- the same framework, model and shape -- and
returns the measured value and a verdict text; `verdict_table` and `summary_table` do it for
every comparison in a list of records (from `labkit.bench.bench`, or `run_records` of
training runs). Nothing in a verdict is typed by hand: on another machine the same code may
well find that a claim holds where it did not hold here.

>>> base = dict(framework="torch", model="mlp", shape="aligned", batch_size=512, width=1024,
...             status="ok", device="cuda:0 (NVIDIA A100-SXM4-40GB)")
>>> records = [dict(base, precision="fp32", step_time_s=0.060), dict(base, precision="bf16", step_time_s=0.020)]
>>> verdict("speed", records)
Verdict(value=3.0, text='holds here: 3.00x fp32', holds=True)
"""


from __future__ import annotations

from typing import NamedTuple

from labkit.claims.catalog import ACCURACY_SLACK, RATIO_CLAIMED, SPEEDUP_CLAIMED, Claim, get
from labkit.claims.records import _device_kind, _pairs, _step_time, record_ceiling, record_native
from labkit.memory import Breakdown, measured, total_bytes


class Verdict(NamedTuple):
    """The measured value (None when it cannot be measured), the verdict text, and whether
    the claim holds (None: not measured)."""

    value: float | None
    text: str
    holds: bool | None


_PARTIAL_WHY = "only the matmuls speed up; element-wise work, casts and the optimizer step do not"


def _noise(ratio: float, ceiling) -> str | None:
    """The reading of a speed-up past what the hardware can give (`Ceiling.exceeded_by`), else None."""
    if ceiling is None or not ceiling.exceeded_by(ratio):
        return None
    return (f"noise: over {ceiling.limit:g}x, more than the hardware can give ({ceiling.times:g}x: "
            f"{ceiling.why}) even against a slow fp32; a timing was disturbed: run it again")


def _speed(base: dict, rec: dict) -> Verdict:
    if _step_time(base) is None or _step_time(rec) is None:
        return _not_measured("a run has no step time (step_time_s)")
    value = base["step_time_s"] / rec["step_time_s"]
    noise = _noise(value, record_ceiling(rec))
    if noise:  # a disturbed timing decides nothing, either way
        return Verdict(value, f"undecided here: {value:.2f}x fp32 is {noise}", None)
    if round(value, 2) >= SPEEDUP_CLAIMED:  # judged as shown, to two decimals
        return Verdict(value, f"holds here: {value:.2f}x fp32", True)
    native = record_native(rec)
    why = _PARTIAL_WHY if native.native and value >= 1.1 else _reading(value, native)
    how = "slower than fp32" if value < 1 else "short of 2x"
    return Verdict(value, f"does not hold here: {value:.2f}x fp32, {how} ({why})", False)


def _ratio_verdict(value: float, why: str, limit: float = RATIO_CLAIMED, unit: str = "fp32's bytes") -> Verdict:
    """One rule for every memory claim: it holds at `limit` or below (judged as shown, to two
    decimals), and does not hold above it -- 0.59x is a saving, but not the half that is claimed.
    The summary's ✓/✗ and every notebook sentence follow this same verdict."""
    if round(value, 2) <= limit:
        return Verdict(value, f"holds here: {value:.2f}x {unit}", True)
    return Verdict(value, f"does not hold here: {value:.2f}x {unit} ({why})", False)


def _not_measured(why: str) -> Verdict:
    return Verdict(None, f"not measurable here: {why}", None)


def _mem(rec: dict) -> dict:
    return rec.get("memory") or {}


def _measured(rec: dict) -> Breakdown:
    return measured(rec["framework"], _mem(rec))


def _step_ratio(base: dict, rec: dict) -> tuple[float | None, str]:
    """rec's measured bytes of a whole step over base's (None when either is unknown), and
    where rec's figure comes from, or why it is unknown (`total_bytes`)."""
    a, why = total_bytes(rec["framework"], _mem(rec))
    b, _ = total_bytes(base["framework"], _mem(base))
    return (a / b if a is not None and b else None), why


def _states(b) -> int:
    return sum(b.parts[k] or 0 for k in ("weights", "master_weights", "gradients", "optimizer_states"))


def _memory(base: dict, rec: dict) -> Verdict:
    ratio, why = _step_ratio(base, rec)
    if ratio is None:
        return _not_measured(why)
    mb, mr = _measured(base), _measured(rec)
    rest = [k for k in ("weight_copies", "activations", "step_temporaries") if mb.parts[k] or mr.parts[k]]
    parts = [f"model states {_states(mr) / _states(mb):.2f}x"]
    for k in rest:
        x, y = mr.parts[k] or 0, mb.parts[k] or 0
        parts.append(f"{k.replace('_', ' ')} {x / y:.2f}x" if y else f"+{x / 1e6:.2f} MB {k.replace('_', ' ')}")
    return _ratio_verdict(ratio, ", ".join(parts))


def _activations(base: dict, rec: dict) -> Verdict:
    def act(m):
        return m.parts["activations"] if m.parts["activations"] is not None else m.parts["step_temporaries"]

    mr, mb = _measured(rec), _measured(base)
    a, b = act(mr), act(mb)
    if a is None or not b:
        return _not_measured(mr.note)
    if rec["framework"] == "jax" and _device_kind(rec) == "cpu":
        why = "XLA:CPU's temporaries hold f32 copies of the 16-bit operands"
    elif rec["model"] == "transformer":
        why = ("the attention probabilities stay fp32 (the fp32 softmax) and gain a 16-bit copy; the LayerNorm "
               "inputs and the loss stay fp32")
    else:
        why = "the fp32 loss and the values kept in fp32 do not shrink"
    return _ratio_verdict(a / b, why)


def _gradients(base: dict, rec: dict) -> Verdict:
    mr, mb = _measured(rec), _measured(base)
    a, b = mr.parts["gradients"], mb.parts["gradients"]
    if a is None or not b:
        return _not_measurable_gradients(rec)
    why = "each gradient takes its weight's dtype, and the weights stay fp32"
    if mr.parts["weights"] is not None and a != mr.parts["weights"]:
        why = "the gradients are not in their weights' dtype"
    return _ratio_verdict(a / b, why)


def _not_measurable_gradients(rec: dict) -> Verdict:
    if rec["framework"] == "jax":
        return _not_measured("JAX's gradients live inside the compiled step (its temporary buffers)")
    return _not_measured("the run reported no gradient bytes")


def _double_batch(base: dict, rec: dict) -> Verdict:
    ratio, why = _step_ratio(base, rec)
    if ratio is None:
        return _not_measured(why)
    mr, mb = _measured(rec), _measured(base)
    why = f"model states {_states(mr) / _states(mb):.2f}x: they do not shrink in {rec['precision']}"
    return _ratio_verdict(ratio, why, limit=1.0, unit=f"fp32's bytes at batch {base['batch_size']}")


def _accuracy(base: dict, rec: dict) -> Verdict:
    a, b = rec["accuracy"], base["accuracy"]
    drop = b - a
    text = f"{a:.1%} vs fp32's {b:.1%}, {_accuracy_words(drop)}"
    if round(drop, 4) <= ACCURACY_SLACK:  # to 0.01 pt: 0.978 - 0.968 is 0.010000000000000009 in floats
        return Verdict(drop, f"holds here: {text}", True)
    return Verdict(drop, f"does not hold here: {text}", False)


_NONE = {
    "accuracy_drop": "not measured: needs training runs with a test accuracy (run_records(results))",
    "double_batch_ratio": "not measured: needs an fp32 run at a batch and a 16-bit run at twice that batch",
}

_RULES = {"speedup": _speed, "memory_ratio": _memory, "activation_ratio": _activations,
          "gradient_ratio": _gradients, "double_batch_ratio": _double_batch, "accuracy_drop": _accuracy}


def verdict(claim, records) -> Verdict:
    """Check `claim` on one comparison: `records` must hold one fp32 record and one 16-bit
    record of the claim's precisions that match it (same framework, model, width and shape;
    for "double-batch", the 16-bit record at twice the fp32 batch). Records that did not
    finish are ignored. Use `verdict_table` for many comparisons at once.
    """
    claim = get(claim)
    pairs = _pairs(claim, records)
    if not pairs:
        return Verdict(None, _NONE.get(claim.metric, "not measured: no finished fp32 run and "
                                       f"{'/'.join(claim.precisions)} run that match"), None)
    if len(pairs) > 1:
        found = ", ".join(f"{r['framework']} {r['model']} {r['precision']} batch {r['batch_size']}" for _, r in pairs)
        raise ValueError(f"verdict compares one pair of runs; these records hold {len(pairs)} ({found}): "
                         "pass the records of one comparison, or use verdict_table")
    base, rec = pairs[0]
    return _RULES[claim.metric](base, rec)


def _reading(ratio: float, native) -> str:
    if not native.native:
        if ratio >= 1.1:
            return f"faster, although emulated ({native.why}): the fp32 it is measured against is slow"
        return f"{'slower' if ratio < 0.9 else 'no faster'}: emulated ({native.why})"
    if ratio >= 1.1:
        return f"faster: {native.why}"
    if ratio >= 0.9:
        return "about as fast: native, but at this size the matmuls are too small a share of the step to gain"
    if ratio >= 0.5:
        return "slower: native, but the casts and the element-wise work cost more than the matmuls save"
    return ("much slower, although native: a kernel on this path does not use the 16-bit units well here "
            "(measure before you train this way)")


def _accuracy_words(drop: float) -> str:
    """fp32's accuracy minus the 16-bit run's, in words: a negative drop is a gain.

    >>> _accuracy_words(-0.006), _accuracy_words(0.012), _accuracy_words(0.0)
    ('better by 0.6 pt', 'worse by 1.2 pt', 'the same')
    """
    points = round(100 * drop, 1)
    if points == 0:
        return "the same"
    return f"{'worse' if points > 0 else 'better'} by {abs(points):.1f} pt"


__all__ = ["Verdict", "verdict"]
