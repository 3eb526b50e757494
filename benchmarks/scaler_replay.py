"""How long `labkit.scaling.simulate` takes to replay 100,000 steps (the playground's cap), per preset.

Usage: python benchmarks/scaler_replay.py [--steps N] [--repeat R] [--limit SECONDS]

The pattern is the mixed one of tests/scaling/test_scaling_replays.py: sparse random overflows
(p = 0.002) plus bursts of 12 in a row, so every rule both grows and backs off. Each preset
replays it with its library's defaults through the one rule its scaler class states
(``rule()``). Prints the best of R wall-clock times and PASS/FAIL against the limit
(0.5 s: the playground redraws on every keystroke). No test asserts a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from labkit import scaling
from labkit.scaling.playground import MAX_STEPS

OPTIONS = {"optax": {"max_consecutive_errors": 2}, "deepspeed": {"raise_error_at_min_scale": False}}


def mixed_pattern(steps: int) -> np.ndarray:
    """Sparse random overflows with bursts (the same pattern as tests/scaling/test_scaling_replays.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "scaling"))
    from test_scaling_replays import mixed_pattern as pattern

    return pattern(steps)


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MAX_STEPS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit", type=float, default=0.5)
    args = parser.parse_args(argv)
    flags = mixed_pattern(args.steps)
    print(f"simulate(): best of {args.repeat}, {args.steps:,} steps, {int(flags.sum()):,} overflows; "
          f"limit {args.limit} s")
    failed = []
    for name in scaling.PRESETS:
        seconds = best_time(lambda: scaling.simulate(name, flags, **OPTIONS.get(name, {})), args.repeat)
        verdict = "PASS" if seconds <= args.limit else "FAIL"
        if verdict == "FAIL":
            failed.append(name)
        print(f"{name:26s} {seconds:7.3f} s  {verdict}")
    print(f"{'PASS' if not failed else 'FAIL'}: {len(scaling.PRESETS) - len(failed)} of {len(scaling.PRESETS)} "
          f"presets replay {args.steps:,} steps in <= {args.limit} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
