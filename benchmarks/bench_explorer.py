"""How long the format explorer takes to recompute its view (goal: well under 50 ms).

Usage: python benchmarks/bench_explorer.py [--repeat N]

Prints the median and the slowest time over a set of inputs, for
  * the pure function `explorer_view` (parse + every format's row), and
  * the whole widget update: setting the text box of a real `FormatExplorer`, which
    recomputes the view and rewrites every label and bit button.
Without a browser attached, the widget update does not include drawing in the page.
"""

from __future__ import annotations

import argparse
import statistics
import time

from labkit.widgets.explorer import FormatExplorer
from labkit.widgets.explorer_view import explorer_view

INPUTS = ["0.1", "1e-8", "-inf", "nan", "0x3c00", "256**2", "1e-5*1e-5", "-0", "65504", "3.14159",
          "1e38", "2^-24", "0b0 01111 0000000001", "garbage"]


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timings per input (default 30)")
    args = parser.parse_args()

    explorer_view("0.1")  # warm up imports and caches
    explorer = FormatExplorer("0.1")
    pure, widget = [], []
    for i, text in enumerate(INPUTS):
        pure += _time(lambda: explorer_view(text, "fp16"), args.repeat)
        # alternate with a neighbour so that every set really changes the text box
        texts = iter([text, "1"] * args.repeat)
        widget += _time(lambda: setattr(explorer.text, "value", next(texts)), 2 * args.repeat)
    n = len(INPUTS)
    for label, times in (("explorer_view (pure)", pure), ("FormatExplorer update", widget)):
        ms = [t * 1e3 for t in times]
        print(f"{label:<24} median {statistics.median(ms):6.2f} ms   "
              f"max {max(ms):6.2f} ms   ({len(ms)} timings, {n} inputs, 6 formats)")


if __name__ == "__main__":
    main()
