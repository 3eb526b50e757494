"""The verdicts as tables: step times read against the hardware, each comparison, and a summary per claim."""

from __future__ import annotations

from labkit.claims.catalog import CLAIMS, Claim, _claims
from labkit.claims.records import _pairs, _records, record_ceiling, record_native, speedups
from labkit.claims.verdicts import Verdict, _accuracy_words, _noise, _reading, verdict
from labkit.table import Table


def speed_table(records) -> Table:
    """What the measured step times say on this machine: each 16-bit record against fp32 in the
    same framework, model and shape, and the reading that follows from whether this device runs
    that precision natively (`labkit.hardware.native_precision`); a speed-up past what the
    hardware can give (`labkit.hardware.speedup_ceiling`, with its slack) reads as noise. Every word of it is computed
    from the records and the hardware, so it reads right on a CPU with bf16 instructions, on one
    without, and on a GPU."""
    records = _records(records)
    paired = {id(rec): ratio for rec, _, ratio in speedups(records)}
    rows = []
    for r in records:
        if r.get("status") not in ("ok", "emulated") or r["precision"] in ("fp32", "tf32"):
            continue
        native = record_native(r)
        if r["status"] == "emulated":
            measured = f"{r['emulated_slowdown']:.1f}x slower (batch {r['small_batch_size']}, width {r['small_width']})"
            ratio = 1 / r["emulated_slowdown"]
        elif id(r) in paired:
            ratio = paired[id(r)]
            measured = f"{ratio:.2f}x fp32's speed"
        else:
            continue
        rows.append((r["framework"], r["model"], str(r["batch_size"]), r["precision"], measured,
                     _noise(ratio, record_ceiling(r)) or _reading(ratio, native)))
    return Table(("framework", "model", "batch", "precision", "measured", "reading"), tuple(rows),
                 "What the step times say on this machine")


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
    value and a mark -- ✓ holds, ✗ does not, ? noise (a speed-up past the hardware's ceiling), n/a
    not measurable here (a framework that can measure none of them gets one "n/a"). Comparisons at
    several batch sizes are summed up as a range; the model is named when a framework ran several."""
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
    """'3.27x ✓', or for several batch sizes '1.31-3.29x ✓ from batch 64 (batch 16-1024)'; a speed-up
    read as noise (past the hardware's ceiling) neither holds nor fails."""
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
    decided = [b for b, v in measured if v.holds is not None]  # a timing read as noise decides nothing
    holding = [b for b, v in measured if v.holds]
    if not decided:
        mark = "? (noise: run again)"
    elif len(holding) in (0, len(decided)):
        mark = "✓" if holding else "✗"
    elif holding == decided[-len(holding):]:
        mark = f"✓ from batch {holding[0]}"
    else:
        mark = f"✓ at batch {', '.join(map(str, holding))}"
    batches = f" (batch {measured[0][0]}-{measured[-1][0]})" if len(measured) > 1 else ""
    return f"{text} {mark}{batches}"


__all__ = ["speed_table", "summary_table", "verdict_table"]
