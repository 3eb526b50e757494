"""The seeds' promises about mixed precision, as data, and a verdict computed from measurements.

Each `Claim` quotes a seed (in Chinese, with an English translation), says what has to be
measured to check it, and which 16-bit precisions it is about. `verdict` compares one
measured 16-bit record with its fp32 baseline -- the same framework, model and shape -- and
returns the measured value and a verdict text; `verdict_table` and `summary_table` do it for
every comparison in a list of records (from `labkit.bench.bench`, or `run_records` of
training runs). Nothing in a verdict is typed by hand: on another machine the same code may
well find that a claim holds where it did not hold here.

>>> base = dict(framework="torch", model="mlp", shape="aligned", batch_size=512, width=1024,
...             status="ok", device="cpu (example)")
>>> records = [dict(base, precision="fp32", step_time_s=0.060), dict(base, precision="bf16", step_time_s=0.020)]
>>> verdict("speed", records)
Verdict(value=3.0, text='holds here: 3.00x fp32', holds=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from labkit._validate import choice, shown
from labkit.table import Table
from labkit.memory_plots import Breakdown, measured, total_bytes

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


def _records(records, what: str = "records") -> list[dict]:
    """Records `verdict` reads: a list of dicts; a finished one (status "ok") names its framework,
    precision, model and batch size."""
    if records is None or isinstance(records, (str, bytes, dict)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"{what} must be a list of records (dicts: labkit.bench.bench records, or "
                        f"run_records(results)); got {type(records).__name__} {shown(records)}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TypeError(f"{what} must be dicts (labkit.bench.bench records, or run_records(results)); "
                            f"got {shown(r)}")
        if r.get("status") in ("ok", "emulated"):
            needed = ("framework", "precision", "model", "batch_size")
            if r["status"] == "emulated":
                needed += ("emulated_slowdown", "small_batch_size", "small_width")
            missing = [k for k in needed if k not in r]
            if missing:
                raise ValueError(f"{what}[{i}] lacks {', '.join(map(repr, missing))}")
    return list(records)


def claims_table(claims=CLAIMS) -> Table:
    """The claims as the seeds state them, and what is measured to check each one."""
    rows = tuple((c.key, c.seed, c.quote, c.english, ", ".join(c.precisions), c.measure)
                 for c in _claims(claims))
    return Table(("claim", "seed", "quote", "in English", "precisions", "measured"), rows,
                 "The seeds' claims, and how this notebook checks them")


class Verdict(NamedTuple):
    """The measured value (None when it cannot be measured), the verdict text, and whether
    the claim holds (None: not measured)."""

    value: float | None
    text: str
    holds: bool | None


# -- records ----------------------------------------------------------------------------------
def run_records(results) -> list[dict]:
    """Training runs (`labkit.train.RunResult`) as records `verdict` reads, with accuracy."""
    from labkit.train import RunResult

    if isinstance(results, RunResult):
        results = [results]
    if not isinstance(results, (list, tuple)):
        raise TypeError(f"results must be a list of labkit.train.RunResult; got {type(results).__name__} "
                        f"{shown(results)}")
    out = []
    for r in results:
        if not isinstance(r, RunResult):
            raise TypeError(f"run_records takes labkit.train.RunResult objects, got {type(r).__name__}")
        cfg = r.config
        out.append(dict(
            framework=cfg.framework, precision=cfg.precision, model=cfg.model, shape="aligned",
            batch_size=cfg.batch_size, width=cfg.width, status=r.status, device=r.device,
            step_time_s=r.median_step_time(), final_loss=r.final_loss, memory=dict(r.memory),
            accuracy=r.metric["value"] if r.metric else None,
        ))
    return out


def _device_kind(rec: dict) -> str:
    """"cpu", "gpu" or "tpu", from the device text's first word ("cpu (Intel ...)", "cuda:0 (NVIDIA H200, ...)",
    "gpu (...)", "tpu (...)"): the rest may mention other devices ("TF32 is a GPU format: ...")."""
    text = str(rec.get("device", "")).lower().strip()
    head = text.split("(", 1)[0].strip()
    if head.startswith("tpu"):
        return "tpu"
    if head.startswith(("cuda", "gpu", "nvidia")):
        return "gpu"
    if head.startswith("cpu"):
        return "cpu"
    if "tpu" in text:  # a free-form description, as a test or an old record may give
        return "tpu"
    return "gpu" if any(k in text for k in ("cuda", "nvidia")) else "cpu"


def _group(rec: dict) -> tuple:
    """What two runs must share to be compared: framework, model, width, shape, batch size."""
    return rec["framework"], rec["model"], rec.get("width"), rec.get("shape", "aligned"), rec["batch_size"]


def _pairs(claim: Claim, records) -> list[tuple[dict, dict]]:
    """(fp32 record, 16-bit record) pairs the claim compares, in the records' order."""
    if isinstance(records, dict):
        raise TypeError("records must be a list of dicts, got dict (a {claim key: records} mapping goes to "
                        "verdict_table or summary_table)")
    records = _records(records)
    ok = [r for r in records if r.get("status") == "ok"]
    if claim.metric == "accuracy_drop":  # only training runs carry a test accuracy
        ok = [r for r in ok if r.get("accuracy") is not None]
    double = claim.metric == "double_batch_ratio"
    base = {_group(r): r for r in ok if r["precision"] == "fp32"}
    pairs = []
    for r in ok:
        if r["precision"] not in claim.precisions:
            continue
        key = _group(r)
        if double:
            key = key[:-1] + (r["batch_size"] // 2,) if r["batch_size"] % 2 == 0 else None
        if key in base:
            pairs.append((base[key], r))
    return pairs


# -- verdicts ---------------------------------------------------------------------------------
_PARTIAL_WHY = "only the matmuls speed up; element-wise work, casts and the optimizer step do not"


def _native(rec: dict):
    """`labkit.hardware.native_precision` for the device a record was measured on: this machine's
    CPU for a CPU record, the GPU named in the device text (its compute capability looked up) or
    a TPU otherwise."""
    from labkit import hardware

    kind = _device_kind(rec)
    if kind == "cpu":
        report = hardware.HardwareReport(hardware.detect_cpu())
    elif kind == "tpu":
        report = hardware.HardwareReport(hardware.detect_cpu(), tpus=(hardware.TPUInfo(),))
    else:
        cc = hardware.capability_from_name(str(rec.get("device", "")))
        if cc is None:
            return hardware.Native(True, "a GPU of unknown compute capability")
        gpu = hardware.GPUInfo(str(rec.get("device")), capability=cc)
        report = hardware.HardwareReport(hardware.detect_cpu(), gpus=(gpu,))
    return hardware.native_precision(rec["framework"], rec["precision"], report)


def _step_time(rec: dict) -> float | None:
    t = rec.get("step_time_s")
    return t if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf") else None


def _speed(base: dict, rec: dict) -> Verdict:
    if _step_time(base) is None or _step_time(rec) is None:
        return _not_measured("a run has no step time (step_time_s)")
    value = base["step_time_s"] / rec["step_time_s"]
    if round(value, 2) >= SPEEDUP_CLAIMED:  # judged as shown, to two decimals
        return Verdict(value, f"holds here: {value:.2f}x fp32", True)
    native = _native(rec)
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
    if drop <= ACCURACY_SLACK:
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


def speed_table(records) -> Table:
    """What the measured step times say on this machine: each 16-bit record against fp32 in the
    same framework, model and shape, and the reading that follows from whether this device runs
    that precision natively (`labkit.hardware.native_precision`). Every word of it is computed
    from the records and the hardware, so it reads right on a CPU with bf16 instructions, on one
    without, and on a GPU."""
    records = _records(records)
    base = {_group(r): r for r in records if r.get("status") == "ok" and r["precision"] == "fp32"
            and _step_time(r) is not None}
    rows = []
    for r in records:
        if r.get("status") not in ("ok", "emulated") or r["precision"] in ("fp32", "tf32"):
            continue
        native = _native(r)
        if r["status"] == "emulated":
            measured = f"{r['emulated_slowdown']:.1f}x slower (batch {r['small_batch_size']}, width {r['small_width']})"
            ratio = 1 / r["emulated_slowdown"]
        elif _group(r) in base and _step_time(r) is not None:
            ratio = base[_group(r)]["step_time_s"] / r["step_time_s"]
            measured = f"{ratio:.2f}x fp32's speed"
        else:
            continue
        rows.append((r["framework"], r["model"], str(r["batch_size"]), r["precision"], measured,
                     _reading(ratio, native)))
    return Table(("framework", "model", "batch", "precision", "measured", "reading"), tuple(rows),
                 "What the step times say on this machine")


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


def _value(claim: Claim, v: float | None) -> str:
    if v is None:
        return "-"
    if claim.metric == "accuracy_drop":
        return _accuracy_words(v)
    return f"{v:.2f}x"


def _by_claim(records, claims) -> list[tuple[Claim, list]]:
    """(claim, records) for each claim: `records` is one list for all, or {claim key: list}."""
    claims = _claims(claims)
    if isinstance(records, dict):
        unknown = set(records) - {c.key for c in claims}
        if unknown:
            raise ValueError(f"records given for unknown claims {sorted(unknown)}; claims: "
                             f"{', '.join(c.key for c in claims)}")
        return [(c, _records(records.get(c.key, []), f"records[{c.key!r}]")) for c in claims]
    records = _records(records)
    return [(c, records) for c in claims]


def verdict_table(records, claims=CLAIMS) -> Table:
    """One row per comparison found in `records` (a list, or {claim key: list}), per claim;
    a claim with none says so."""
    rows = []
    for claim, recs in _by_claim(records, claims):
        pairs = _pairs(claim, recs)
        if not pairs:
            rows.append((claim.key, claim.seed, "-", "-", "-", "-", "-", verdict(claim, []).text))
        for base, rec in pairs:
            v = verdict(claim, [base, rec])
            batch = f"{base['batch_size']}->{rec['batch_size']}" if base["batch_size"] != rec["batch_size"] else \
                str(rec["batch_size"])
            rows.append((claim.key, claim.seed, rec["framework"], rec["model"], batch, rec["precision"],
                         _value(claim, v.value), v.text))
    cols = ("claim", "seed", "framework", "model", "batch", "precision", "measured", "verdict")
    return Table(cols, tuple(rows), "The seeds' claims, checked on this machine")


def summary_table(records, claims=CLAIMS) -> Table:
    """One row per claim, one column per framework: each 16-bit precision compared, its measured
    value and a mark -- ✓ holds, ✗ does not, n/a not measurable here (a framework that can measure
    none of them gets one "n/a"). Comparisons at several batch sizes are summed up as a range; the
    model is named when a framework ran several."""
    rows, frameworks = [], []
    for claim, recs in _by_claim(records, claims):
        groups: dict[tuple, list] = {}
        for base, rec in _pairs(claim, recs):
            key = (rec["framework"], rec["model"], rec["precision"])
            batch = base["batch_size"] if claim.metric == "double_batch_ratio" else rec["batch_size"]
            groups.setdefault(key, []).append((batch, verdict(claim, [base, rec])))
        cells: dict[str, list[str]] = {}
        for (fw, model, prec), items in groups.items():
            several = len({m for f, m, _ in groups if f == fw}) > 1
            cells.setdefault(fw, []).append(f"{model} {prec}" if several else prec)
            cells[fw][-1] += " " + _compact(claim, items)
            if fw not in frameworks:
                frameworks.append(fw)
        for fw, entries in cells.items():
            if all(e.endswith(" n/a") for e in entries):
                cells[fw] = ["n/a"]
        rows.append((claim, cells))
    frameworks.sort(key=lambda f: ("torch", "jax", "tf").index(f) if f in ("torch", "jax", "tf") else 9)
    table = tuple((c.key, c.seed, *("; ".join(cells.get(fw, [])) or "-" for fw in frameworks)) for c, cells in rows)
    return Table(("claim", "seed", *frameworks), table, "The seeds' claims on this machine (✓ holds, ✗ does not)")


def _compact(claim: Claim, items: list[tuple[int, Verdict]]) -> str:
    """'3.27x ✓', or for several batch sizes '1.31-3.29x ✓ from batch 64 (batch 16-1024)'."""
    measured = [(b, v) for b, v in sorted(items, key=lambda bv: bv[0]) if v.value is not None]
    if not measured:
        return "n/a"
    values = [v.value for _, v in measured]
    if len(measured) == 1:
        text = _value(claim, values[0])
    elif claim.metric == "accuracy_drop":
        text = f"{_value(claim, min(values))} to {_value(claim, max(values))}"
    else:
        text = f"{_value(claim, min(values)).rstrip('x')}-{_value(claim, max(values))}"
    holding = [b for b, v in measured if v.holds]
    if len(holding) in (0, len(measured)):
        mark = "✓" if holding else "✗"
    elif holding == [b for b, _ in measured][-len(holding):]:
        mark = f"✓ from batch {holding[0]}"
    else:
        mark = f"✓ at batch {', '.join(map(str, holding))}"
    batches = f" (batch {measured[0][0]}-{measured[-1][0]})" if len(measured) > 1 else ""
    return f"{text} {mark}{batches}"


__all__ = ["CLAIMS", "METRICS", "Claim", "Verdict", "claims_table", "get", "run_records", "speed_table",
           "summary_table", "verdict", "verdict_table"]
