"""Timing calls side by side: each call's best time, the calls taking turns.

Timed one after the other, a call that happens to meet a burst of other work on a shared machine
(another program, a notebook next door) is slowed alone, and its ratio to the others is that
burst's. Taking turns -- a timing of the first call, one of the second, ..., then the first again --
a burst slows all of them alike; and the best of several timings is the one such work disturbed
least (as `timeit` advises).

>>> best = time_in_turns([lambda: sum(range(100)), lambda: sum(range(1000))], repeats=3)
>>> len(best), all(t > 0 for t in best)
(2, True)
"""

from __future__ import annotations

import time
import timeit
from typing import Callable

from labkit._validate import integer, shown
from labkit.bench.plan import MAX_STEPS


def _per_call(name: str, value, n: int) -> list[int]:
    """One whole number >= 1 per call: `value` itself for each, or a list of n of them."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} must be one whole number for every call, or a list of {n} (one per call); "
                             f"got a list of {len(value)}")
        return [integer(f"{name}[{i}]", v, minimum=1, maximum=MAX_STEPS) for i, v in enumerate(value)]
    return [integer(name, value, minimum=1, maximum=MAX_STEPS)] * n


def time_in_turns(calls, repeats=5, number=1, timer: Callable[[], float] = time.perf_counter) -> list[float]:
    """The best time, in seconds per call, of each of `calls` (functions of no arguments), the calls
    taking turns: round i times each call that has an i-th repeat left, in the order given, until
    every call has been timed `repeats` times. A timing runs a call `number` times in a row (as
    `timeit.Timer.timeit` does, with the garbage collector off) and counts the mean.

    ``repeats`` and ``number`` are one whole number for every call, or a list of one per call (a slow
    call timed fewer times). ``timer`` reads the clock (``time.perf_counter``; ``time.thread_time``
    counts this thread's CPU time only, without the slices a busy machine makes it wait). Warm-up
    calls (compilation, kernel selection) are the caller's, before this.
    """
    if isinstance(calls, (str, bytes, dict)) or not isinstance(calls, (list, tuple)):
        raise TypeError(f"calls must be a list of functions of no arguments; got {type(calls).__name__} "
                        f"{shown(calls)}")
    if not calls:
        raise ValueError("calls must hold at least one function to time")
    for i, call in enumerate(calls):
        if not callable(call):
            raise TypeError(f"calls must hold functions of no arguments; calls[{i}] is {type(call).__name__} "
                            f"{shown(call)}")
    if not callable(timer):
        raise TypeError(f"timer must be a clock, a function of no arguments that returns seconds (such as "
                        f"time.perf_counter); got {type(timer).__name__} {shown(timer)}")
    repeats = _per_call("repeats", repeats, len(calls))
    number = _per_call("number", number, len(calls))
    timers = [timeit.Timer(call, timer=timer) for call in calls]
    times: list[list[float]] = [[] for _ in calls]
    for i in range(max(repeats)):
        for clock, k, r, mine in zip(timers, number, repeats, times):
            if i < r:
                mine.append(clock.timeit(k) / k)
    return [min(mine) for mine in times]


__all__ = ["time_in_turns"]
