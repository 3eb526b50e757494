"""The verdicts as tables -- step times read against the hardware, each comparison, and a summary per
claim -- and as check lines (`claim_checks`) for a notebook to print after a table nbval ignores."""

from __future__ import annotations

from labkit import checks
from labkit.claims.catalog import ACCURACY_SLACK, CLAIMS, RATIO_CLAIMED, SPEEDUP_CLAIMED, Claim, _claims
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


def _threshold(claim: Claim, name: str, base: dict, rec: dict) -> str:
    """What `claim` promises of one comparison, as a check's claim: the verdict's threshold, in words
    that depend on the claim and the records' names only."""
    if claim.metric == "speedup":
        return f"{name} runs at least {SPEEDUP_CLAIMED:g}x fp32's speed (the claim's threshold)"
    if claim.metric == "memory_ratio":
        return f"{name} takes at most {RATIO_CLAIMED:g}x fp32's memory for a whole step (the claim's threshold)"
    if claim.metric == "activation_ratio":
        return f"{name} keeps at most {RATIO_CLAIMED:g}x fp32's bytes for the backward pass (the claim's threshold)"
    if claim.metric == "gradient_ratio":
        return f"{name}'s gradients take at most {RATIO_CLAIMED:g}x fp32's bytes (the claim's threshold)"
    if claim.metric == "double_batch_ratio":
        return (f"{name} at batch {rec['batch_size']} takes at most fp32's memory at batch {base['batch_size']} "
                "(the claim's threshold)")
    points = round(100 * ACCURACY_SLACK, 6)
    unit = "point" if points == 1 else "points"
    return f"{name} loses at most {points:g} {unit} of fp32's test accuracy (the claim's threshold)"


def _names(claim: Claim, pairs: list[tuple[dict, dict]]) -> list[str]:
    """Each comparison's 16-bit run, named by what tells it apart from the others: its precision, after
    its framework and model where the pairs hold several, with its batch, width or shape where those vary."""
    def varies(key):
        return len({r.get(key) for _, r in pairs}) > 1

    several = len({(r["framework"], r["model"]) for _, r in pairs}) > 1
    named = ("width", "shape") if claim.metric == "double_batch_ratio" else ("batch_size", "width", "shape")
    which = [k for k in named if varies(k)]  # a double-batch claim names both batches already
    out = []
    for _, r in pairs:
        name = f"{r['framework']} {r['model']} {r['precision']}" if several else r["precision"]
        extra = [f"{r['shape']} shape" if k == "shape" else f"{k.split('_')[0]} {r[k]}" for k in which]
        out.append(name + (f" ({', '.join(extra)})" if extra else ""))
    return out


def _measured(text: str) -> str:
    """A verdict's text after its "holds here: " or "does not hold here: " (the figures)."""
    for head in ("holds here: ", "does not hold here: "):
        if text.startswith(head):
            return text[len(head):]
    return text


def claim_checks(records, claims) -> checks.Report:
    """Each comparison of `claims` (a claim key or `Claim`, or a list of them) found in `records`
    (a list of records, or {claim key: list}, as `verdict_table` takes them) as a `labkit.checks`
    line: its verdict's threshold as the claim -- ``bf16 loses at most 1 point of fp32's test
    accuracy (the claim's threshold)`` -- and the verdict's figures after ``here:``. Print it after
    a `verdict_table` that nbval ignores, for claims the notebook says hold: the claim's words come
    from the claim and the records' names, never from a measurement, so the ✓ line reads the same
    on every machine where the claim holds, and a ✗ line says where it does not.

    * A verdict that holds gives ✓; one that does not hold gives ✗ (the notebook said something
      that is not true here).
    * A verdict that decides nothing (``holds`` None: a value this framework cannot measure, or a
      speed-up read as noise) is no failure: its line holds with nothing tested, and says why after
      ``here:`` -- as `speed_checks` does on a device that emulates nothing.
    * A claim with no comparison at all in `records` (no finished fp32 run and 16-bit run that
      match -- a run failed, or the records are not the ones the claim reads, as bench records
      without an accuracy for "lossless") gives one ✗ line: nothing was checked, and the notebook
      must not print a ✓ for it.

    >>> base = dict(framework="torch", model="mlp", shape="aligned", batch_size=64, width=256, status="ok",
    ...             device="cpu (example)")
    >>> records = [dict(base, precision="fp32", accuracy=0.978), dict(base, precision="bf16", accuracy=0.972)]
    >>> print(claim_checks(records, "lossless")[0].claim)
    bf16 loses at most 1 point of fp32's test accuracy (the claim's threshold)
    >>> claim_checks(records, "lossless")[0].seen
    "97.2% vs fp32's 97.8%, worse by 0.6 pt"
    """
    by_claim = _by_claim(records, claims)
    if not by_claim:
        raise ValueError(f"claims must name at least one claim (a key such as 'speed' or 'lossless'); got {claims!r}")
    lines = []
    for claim, recs in by_claim:
        pairs = _pairs(claim, recs)
        if not pairs:
            lines.append(checks.that(f"{claim.key}: a finished fp32 run and a {'/'.join(claim.precisions)} run "
                                     "to compare", False, seen=verdict(claim, []).text))
        for (base, rec), name in zip(pairs, _names(claim, pairs)):
            v = verdict(claim, [base, rec])
            lines.append(checks.that(_threshold(claim, name, base, rec), v.holds is not False,
                                     seen=v.text if v.holds is None else _measured(v.text)))
    return checks.report(*lines)


__all__ = ["claim_checks", "speed_table", "summary_table", "verdict_table"]
