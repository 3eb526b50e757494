"""How long the scaler playground takes to redraw (goal: at most 1 s for any pattern it accepts).

Usage: python benchmarks/bench_playground.py [--repeat N] [--preset NAME]

For each pattern of issue 12's table (and a few more, all within the 100,000-step cap),
prints the median and the slowest time of
  * the whole widget update: setting the pattern box of a real `ScalerPlayground`, which
    parses, simulates, draws the figure and encodes the PNG, and
  * its parts: `playground.run` (parse + simulate), `plots.plot_traces` and the PNG.
Without a browser attached, the widget update does not include drawing in the page.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from labkit.scaling import playground, plots
from labkit.widgets.scaling import ScalerPlayground, _png

PATTERNS = [
    "random 100000 p=1",
    "every 100000 k=1",
    "x" * 100_000,
    "random 100000 p=0.5",
    "random 20000 p=1",
    "every 100000 k=2",
    ".x" * 50_000,
    "none 100000",
    "random 300 p=0.02 seed=1",  # the widget's default
]


def _label(pattern: str) -> str:
    if len(pattern) <= 28:
        return pattern
    unit = next(pattern[:n] for n in range(1, len(pattern) + 1) if pattern[:n] * (len(pattern) // n) == pattern)
    return f"{unit!r} x {len(pattern) // len(unit):,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timings per pattern (default 3)")
    parser.add_argument("--preset", default="torch", help="the preset to replay (default torch)")
    args = parser.parse_args()

    widget = ScalerPlayground(args.preset, pattern="none 1")  # warm up imports, fonts and caches
    print(f"{'pattern':<28} {'widget update':>20} {'run':>8} {'plot':>8} {'png':>8}   (seconds, median of "
          f"{args.repeat}; preset {args.preset})")
    for pattern in PATTERNS:
        # "none 1" first, so that every set really changes the text box
        whole = timeit.repeat(lambda: setattr(widget.pattern, "value", pattern), number=1, repeat=args.repeat,
                              setup=lambda: setattr(widget.pattern, "value", "none 1"))
        if widget.message.value:
            raise SystemExit(f"{_label(pattern)}: the widget refused it: {widget.message.value}")
        trace = playground.run(args.preset, {}, pattern)
        fig = plots.plot_traces({args.preset: trace})
        run, plot, png = (timeit.repeat(fn, number=1, repeat=args.repeat) for fn in (
            lambda: playground.run(args.preset, {}, pattern), lambda: plots.plot_traces({args.preset: trace}),
            lambda: _png(fig)))
        med = statistics.median
        print(f"{_label(pattern):<28} {med(whole):6.2f} (max {max(whole):5.2f}) {med(run):8.3f} {med(plot):8.3f} "
              f"{med(png):8.3f}", flush=True)


if __name__ == "__main__":
    main()
