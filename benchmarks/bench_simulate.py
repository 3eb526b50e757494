"""How fast `labkit.scaling.simulate` replays long runs: one million steps per preset.

Usage: python benchmarks/bench_simulate.py [--steps N] [--repeat R]

Prints, for each preset, the best of R wall-clock times to replay N steps (fast engine)
on a sparse pattern (p = 0.001 overflow per step, a healthy run) and a dense one
(p = 0.5), and, for reference, the value-based ``engine="adjust"`` on N / 10 steps.
The goal is under one second per million steps; no test asserts it.
"""

from __future__ import annotations

import argparse
import time

from labkit import scaling

OPTIONS = {"optax": {"max_consecutive_errors": 5}, "deepspeed": {"raise_error_at_min_scale": False}}


def best_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.steps
    sparse = scaling.overflow_pattern("random", n, p=0.001, seed=0)
    dense = scaling.overflow_pattern("random", n, p=0.5, seed=0)
    small = sparse[: n // 10]
    print(f"simulate(): best of {args.repeat}, {n:,} steps (adjust engine: {n // 10:,} steps)")
    print(f"{'preset':26s} {'p=0.001':>9s} {'p=0.5':>9s} {'adjust':>9s}   steps/s (p=0.001)")
    worst = 0.0
    for name in scaling.PRESETS:
        opts = OPTIONS.get(name, {})
        t_sparse = best_time(lambda: scaling.simulate(name, sparse, **opts), args.repeat)
        t_dense = best_time(lambda: scaling.simulate(name, dense, **opts), args.repeat)
        t_adjust = best_time(lambda: scaling.simulate(name, small, engine="adjust", **opts), 1)
        worst = max(worst, t_sparse, t_dense)
        print(f"{name:26s} {t_sparse:8.3f}s {t_dense:8.3f}s {t_adjust:8.3f}s   {n / t_sparse:,.0f}")
    print(f"slowest fast replay of {n:,} steps: {worst:.3f} s (goal: < 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
