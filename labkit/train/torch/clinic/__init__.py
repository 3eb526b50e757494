"""The clinic: the errors people actually hit in mixed precision training, reproduced and fixed.

Each entry (`Entry`) makes a real library fail the way a learner meets it -- an exception, a warning,
a nan, a slow step -- then runs the fix. `clinic()` lists the entries; ``case(name).run()`` returns the
`Case` a notebook prints: trigger, message, fix, the fix's output, and why. Where the library raises or
warns, the message is its own, caught at run time and never copied: what the torch (and DeepSpeed)
installed here print; `Case.reproduced` says whether it still holds the entry's stable part. Where the
failure is quiet (a nan loss, a drifting sum, a slow step), the message is labkit's summary of the run;
DeepSpeed's entry replays its scaler with `labkit.scaling`, which raises DeepSpeed's words.

* `amp`: GradScaler -- an activation past fp16's max that no scale fixes (T5), fp16 parameters,
  ``unscale_`` twice, the scheduler warning after a skipped step, GradScaler with bf16;
* `dtypes`: what autocast casts and what it leaves alone, q/k/v of two dtypes, RoPE positions in
  bf16, gradients accumulated in bf16;
* `debug`: DeepSpeed's "Current loss scale already at minimum", NaN hunting with anomaly mode;
* `speed`: mixed precision slower than fp32 on a CPU (`autocast_speed`, with its verdict).

JAX's and TensorFlow's own errors live in their rooms. Everything runs on the CPU, on one thread
(`labkit.train.torch.threads.one_thread`: the tensors are tiny, and threads only wait for cores on a busy
machine).

>>> print(case("fp16-params").run().message)
ValueError: Attempting to unscale FP16 gradients.
>>> clinic().rows[0][0]
'fp16-forward-overflow'
"""

from __future__ import annotations

from labkit._validate import choice
from labkit.table import Table
from labkit.train.torch.clinic import amp, debug, dtypes, speed
from labkit.train.torch.clinic.case import NO_ERROR, Case, Entry
from labkit.train.torch.clinic.speed import AutocastSpeed, autocast_speed

ENTRIES: tuple[Entry, ...] = amp.ENTRIES + dtypes.ENTRIES + debug.ENTRIES + speed.ENTRIES
"""Every entry, in the order `clinic()` lists them."""
NAMES: tuple[str, ...] = tuple(e.name for e in ENTRIES)
"""The entries' names, for `case`."""


def clinic() -> Table:
    """The clinic's entries: each name, what a learner sees, and the fix (nothing is run).

    >>> print(clinic().rows[1])
    ('fp16-params', 'ValueError at scaler.step(optimizer) after model.half()', 'fp32 parameters, fp16 only \
inside torch.autocast: model stays fp32, scaler.step(optimizer)')
    """
    return Table(("name", "what you see", "fix"), tuple((e.name, e.symptom, e.fix) for e in ENTRIES),
                 title=f"The clinic: {len(ENTRIES)} errors of mixed precision training, reproduced (case(name).run())")


def case(name: str) -> Entry:
    """The entry called `name` (one of `NAMES`); ``.run()`` reproduces it and returns its `Case`.

    >>> case("unscale-twice").expect
    'unscale_() has already been called on this optimizer since the last update().'
    """
    return ENTRIES[NAMES.index(choice("name", name, NAMES))]


__all__ = ["NAMES", "NO_ERROR", "AutocastSpeed", "Case", "Entry", "autocast_speed", "case", "clinic"]
