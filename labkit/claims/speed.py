"""What step times may be trusted to say on any machine: two checks a notebook can print after a speed table.

A single speed-up (fp32's step time over a 16-bit one) belongs to the machine and the moment it
was measured. Two things about it hold wherever the timing is sound, and they are what a notebook
may read from it:

* no speed-up goes past what the hardware can give (`labkit.hardware.speedup_ceiling`, with its
  slack): a ratio beyond that means a timing was disturbed, not that the format is fast;
* a precision the device only *emulates* (`labkit.hardware.native_precision`) gains nothing: its
  step runs at most a given multiple of fp32's speed (``emulated_at_most``), whatever the CPU,
  the thread count or the load.

Each claim's text depends only on the arguments, never on this machine, so the ✓ line reads the
same on a CPU with bf16 instructions, on one without and on a GPU; the figures go after
``here:``. Time the runs side by side (`labkit.train.run_in_turns`) and compare their best steps
(``run_records(results, step_time="best")``): the checks assume timings that load slows alike.

>>> base = dict(framework="torch", model="mlp", shape="aligned", batch_size=64, width=256, status="ok",
...             device="cpu (example)")
>>> print(speed_checks([dict(base, precision="fp32", step_time_s=0.002)], emulated_at_most=0.8)[1])
✓ where this device emulates a 16-bit precision, its step runs at most 0.8x fp32's speed  (here: no 16-bit run)
"""

from __future__ import annotations

from labkit import checks
from labkit._validate import number
from labkit.claims.records import record_ceiling, record_native, speedups


def _name(rec: dict, several: bool) -> str:
    return f"{rec['framework']} {rec['model']} {rec['precision']}" if several else rec["precision"]


def speed_checks(records, emulated_at_most: float = 1.2) -> checks.Report:
    """The two checks of the module docstring, for every 16-bit record in `records` (a list of
    records: `run_records(results, step_time="best")`, or `labkit.bench.bench`'s) against the fp32
    record of its framework, model and shape: no speed-up past the hardware's ceiling, and none
    above ``emulated_at_most`` for a precision this device emulates. A device with nothing
    emulated holds the second claim with nothing to test (it says so after ``here:``)."""
    ratios = speedups(records)  # checks the records
    emulated_at_most = number("emulated_at_most", emulated_at_most, minimum=0, inclusive=False)
    several = len({(r["framework"], r["model"]) for r, _, _ in ratios}) > 1
    within, past, emulated = [], [], []
    for rec, _, ratio in ratios:
        ceiling = record_ceiling(rec)
        shown = f"{_name(rec, several)} {ratio:.2f}x"
        if ceiling is not None:
            (past if ceiling.exceeded_by(ratio) else within).append(
                f"{shown} (ceiling {ceiling.times:g}x, noise past {ceiling.limit:g}x)")
        if not record_native(rec).native:
            emulated.append((shown, ratio))
    return checks.report(
        checks.that("no 16-bit speed-up here goes past what the hardware can give (labkit.hardware.speedup_ceiling, "
                    "with its slack)", not past, seen=", ".join(past or within) or "no 16-bit run"),
        checks.that(f"where this device emulates a 16-bit precision, its step runs at most {emulated_at_most:g}x "
                    "fp32's speed", all(r <= emulated_at_most for _, r in emulated),
                    seen=", ".join(s for s, _ in emulated) or ("nothing emulated" if ratios else "no 16-bit run")),
    )


__all__ = ["speed_checks"]
