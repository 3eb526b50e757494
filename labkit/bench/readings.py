"""What a set of bench records says, in words chosen by the figures: does a speed-up grow with the
batch, do odd sizes cost a precision more than fp32 -- or can this machine's timings not tell?

A speed-up is a ratio of two step times, each with a spread (`bench` keeps the interquartile range
of the timed steps). A difference counts only when the ranges do not overlap: the ratio's low end
is fp32's first quartile over the other cell's third, its high end the reverse. A speed-up above
what the hardware can give (`labkit.hardware.speedup_ceiling`, with its slack) is reported as a
disturbed timing, not as a finding. So the sentence a notebook shows is computed on the reader's
machine, and says "cannot tell" rather than invent a trend from noise.

>>> rec = lambda p, b, t: dict(framework="torch", model="mlp", shape="aligned", width=256, batch_size=b,
...                            precision=p, status="ok", step_time_s=t, device="cpu (example)")
>>> sweep = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.9), rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.6)]
>>> print(batch_trend(sweep, ceiling=2.0))
bf16 against fp32 (torch mlp): 1.11x at batch 16, 1.67x at batch 1024: the speed-up grows with the batch here
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit._validate import choice, number, shown
from labkit.bench.peaks import train_flops
from labkit.bench.plan import SHAPES
from labkit.claims.records import _step_time, record_ceiling, speedups
from labkit.table import Table
from labkit.train.config import PRECISIONS

FINDINGS = ("grows", "shrinks", "flat", "noisy", "unmeasured")
"""`Reading.finding` of `batch_trend`: the speed-up grows or shrinks with the batch beyond the
timing spread; stays within it (flat); a speed-up past the hardware's ceiling (noisy); or there
is not enough to compare (unmeasured)."""


@dataclass(frozen=True)
class Reading:
    """A finding (one of `FINDINGS`) and the sentence that says it, with the figures."""

    finding: str
    text: str

    def __post_init__(self):
        choice("finding", self.finding, FINDINGS)
        if not isinstance(self.text, str):
            raise TypeError(f"text must be a string, got {type(self.text).__name__} {shown(self.text)}")

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, p, cycle):  # IPython shows the sentence
        p.text(self.text)


def _ok(records, what: str = "records") -> list[dict]:
    if isinstance(records, (str, bytes, dict)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"{what} must be a list of the dicts labkit.bench.bench returns; got "
                        f"{type(records).__name__} {shown(records)}")
    for r in records:
        if not isinstance(r, dict):
            raise TypeError(f"{what} must be dicts, as labkit.bench.bench returns them; got {shown(r)}")
        missing = [k for k in ("framework", "model", "precision", "batch_size", "width", "status") if k not in r]
        if missing:
            raise ValueError(f"{what}: a record lacks {', '.join(map(repr, missing))} (labkit.bench.bench "
                             "records have it)")
    return [r for r in records if r["status"] == "ok" and _step_time(r) is not None]


def _range(r: dict) -> tuple[float, float, float]:
    """(q1, median, q3) of a record's step time; the median thrice where no spread was kept."""
    t = r["step_time_s"]
    return r.get("step_time_q1_s") or t, t, r.get("step_time_q3_s") or t


def _ratio(num: dict, den: dict) -> tuple[float, float, float]:
    """num's time over den's: (low, median, high), the low end from the quartiles that bring
    the two closest together, the high end from the farthest."""
    a, b = _range(num), _range(den)
    return a[0] / b[2], a[1] / b[1], a[2] / b[0]


def batch_trend(records, precision: str = "bf16", ceiling: float | None = None, shape: str = "aligned") -> Reading:
    """Does `precision`'s speed-up over fp32 grow or shrink with the batch size, in `records`
    (from `bench`: fp32 and `precision` cells at several batch sizes, one framework and model)?
    Only the cells of one `shape` are read ("aligned"; "odd" for the odd sizes of
    ``bench(..., odd_sizes=True)``).

    Compares the smallest batch with the largest: "grows" when the largest batch's speed-up
    range lies wholly above the smallest's, "shrinks" when below, "flat" when they overlap;
    "noisy" when a speed-up exceeds the hardware's ceiling (``ceiling``, default
    `labkit.hardware.speedup_ceiling` of the device the records were measured on,
    `labkit.claims.records.record_ceiling`) by its slack."""
    from labkit import hardware

    choice("precision", precision, [p for p in PRECISIONS if p != "fp32"])
    if ceiling is not None:
        ceiling = number("ceiling", ceiling, minimum=0, inclusive=False)
    shape = choice("shape", shape, SHAPES)
    # speedups pairs only records of one shape (it is part of what two runs must share)
    pairs = sorted(((r["batch_size"], f, r) for r, f, _ in speedups(records, precision)
                    if r.get("shape", "aligned") == shape), key=lambda x: x[0])
    if len({(f["framework"], f["model"]) for _, f, _ in pairs}) > 1:
        raise ValueError("records must hold one framework and one model; got "
                         f"{sorted({(f['framework'], f['model']) for _, f, _ in pairs})}")
    if len(pairs) < 2:
        return Reading("unmeasured", f"not enough to tell: {precision} and fp32 finished at {len(pairs)} batch "
                                     "size(s) here, and a trend needs two")
    fw, model = pairs[0][1]["framework"], pairs[0][1]["model"]
    top = hardware.Ceiling(ceiling, "as given") if ceiling is not None else record_ceiling(pairs[0][2])
    ratios = [(b, _ratio(f, r)) for b, f, r in pairs]  # fp32's time over precision's: a speed-up
    head = f"{precision} against fp32 ({fw} {model}): " + ", ".join(f"{s[1]:.2f}x at batch {b}" for b, s in ratios)
    wild = [b for b, s in ratios if top is not None and top.exceeded_by(s[1])]
    if wild:
        return Reading("noisy", f"{head}: at batch {', '.join(map(str, wild))} more than the hardware can give "
                                f"({top.times:g}x, {top.why}, with its slack): disturbed timings, no trend to "
                                "read; run the cell again on a quiet machine")
    (_, first), (_, last) = ratios[0], ratios[-1]
    if last[0] > first[2]:
        return Reading("grows", f"{head}: the speed-up grows with the batch here")
    if last[2] < first[0]:
        return Reading("shrinks", f"{head}: the speed-up shrinks as the batch grows here")
    return Reading("flat", f"{head}: no change beyond the timing spread here")


def shape_cost(records) -> Table:
    """What odd sizes cost, from `bench(..., odd_sizes=True)` records: per framework, model and
    precision, the odd cell's step time over the aligned cell's, next to its FLOPs over theirs
    (batch - 1 and width - 1 do almost the same work), and a reading that counts a difference
    only beyond the timing spread. The title says whether a 16-bit precision lost more to the
    odd sizes than fp32 did -- or that this machine's timings cannot tell. Records with two cells
    of one shape for a framework, model and precision (a sweep over batch sizes) are refused:
    which two to compare would be a guess."""
    runs = _ok(records)
    cells: dict[tuple, dict] = {}
    for r in runs:
        by = cells.setdefault((r["framework"], r["model"], r["precision"]), {})
        shape = r.get("shape", "aligned")
        if shape in by:
            twice = by[shape]
            raise ValueError(f"records hold two {shape} cells of {r['framework']} {r['model']} {r['precision']} "
                             f"(batch x width {twice['batch_size']} x {twice['width']} and {r['batch_size']} x "
                             f"{r['width']}): shape_cost compares one aligned and one odd cell per framework, model "
                             "and precision; pass the records of one bench(..., odd_sizes=True) run")
        by[shape] = r
    rows, cost, notes = [], {}, []
    for (fw, model, prec), by in cells.items():
        if not {"aligned", "odd"} <= set(by):
            continue
        a, o = by["aligned"], by["odd"]
        lo, mid, hi = _ratio(o, a)
        cost[fw, model, prec] = (lo, mid, hi)
        flops = train_flops(model, o["batch_size"], o["width"]) / train_flops(model, a["batch_size"], a["width"])
        reading = ("costs more, beyond the timing spread" if lo > 1 else
                   "faster, beyond the timing spread" if hi < 1 else "no difference beyond the timing spread")
        rows.append((fw, model, prec, f"{a['batch_size']} x {a['width']}", f"{o['batch_size']} x {o['width']}",
                     f"{a['step_time_s'] * 1e3:.2f}", f"{o['step_time_s'] * 1e3:.2f}", f"{mid:.2f}x",
                     f"{lo:.2f}-{hi:.2f}x", f"{flops:.3f}x", reading))
    for (fw, model, prec), (lo, mid, hi) in cost.items():
        if prec == "fp32" or (fw, model, "fp32") not in cost:
            continue
        flo, fmid, fhi = cost[fw, model, "fp32"]
        rel_lo, rel_hi = lo / fhi, hi / flo
        word = ("more than" if rel_lo > 1 else "less than" if rel_hi < 1 else
                "no more or less than (within the timing spread)")
        notes.append(f"{fw} {prec} loses {word} fp32 to odd sizes ({mid:.2f}x against {fmid:.2f}x)")
    title = "Odd sizes against aligned ones" + (": " + "; ".join(notes) if notes else "")
    cols = ("framework", "model", "precision", "aligned", "odd", "aligned ms", "odd ms", "odd / aligned time",
            "spread", "odd / aligned FLOPs", "reading")
    return Table(cols, tuple(rows), title)


__all__ = ["FINDINGS", "Reading", "batch_trend", "shape_cost"]
