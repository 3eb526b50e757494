"""The ``labkit`` command: ``labkit doctor``, ``labkit bench``, ``labkit --version``.

Each subcommand is a pair of functions: ``add_<name>(subparsers)`` declares its arguments
and sets ``func`` to ``run_<name>(args) -> int``. To add one (``labkit bench``), write the
pair and list the ``add_`` function in `COMMANDS`.

    $ labkit doctor                       # devices, capabilities, versions, the advice
    $ labkit doctor --frameworks torch    # probe torch only (TensorFlow takes seconds)
    $ labkit doctor --json                # the same report as JSON, for a bug report
    $ labkit bench --framework torch,jax,tf --precision fp32,bf16,fp16 --model mlp,transformer
    $ labkit bench --framework torch --precision fp32,bf16 --json bench.json --plot bench.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import labkit
from labkit._validate import out_path, shown


def _frameworks(text: str) -> tuple[str, ...]:
    """``"torch,jax"`` -> ``("torch", "jax")``; ``"none"`` -> ``()``."""
    from labkit.hardware.report import framework_name

    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(framework_name(name) for name in text.split(",") if name.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _whole(minimum: int):
    """An argparse type: a whole number >= `minimum` (``--batch-size 0`` is an error, not "the default")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}; got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}; got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0; got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0; got {text!r}")
    return value


def _subparsers(subparsers):
    if not hasattr(subparsers, "add_parser"):
        raise TypeError(f"subparsers must be what ArgumentParser.add_subparsers() returns; got "
                        f"{type(subparsers).__name__} {shown(subparsers)}")
    return subparsers


def _args(args, *needed: str) -> argparse.Namespace:
    """The parsed command line a run_ function takes, with the options it reads."""
    if not isinstance(args, argparse.Namespace):
        raise TypeError(f"args must be the parsed command line (build_parser().parse_args(...)); got "
                        f"{type(args).__name__} {shown(args)}")
    missing = [f"--{n.replace('_', '-')}" for n in needed if not hasattr(args, n)]
    if missing:
        raise ValueError(f"args lacks {', '.join(missing)}: parse the command line with build_parser()")
    return args


def add_doctor(subparsers) -> None:
    p = _subparsers(subparsers).add_parser(
        "doctor", help="what hardware is here and which precision to train in",
        description="Print the CPU, GPUs and TPUs, what each framework sees and will use, the "
                    "versions, and the precision labkit advises for this machine.")
    p.add_argument("--frameworks", type=_frameworks, default=labkit.hardware.FRAMEWORKS,
                   metavar="LIST", help="comma-separated frameworks to probe, from torch, jax, "
                                        "tensorflow (or tf); 'none' probes none (default: all)")
    p.add_argument("--json", action="store_true", help="print the report and advice as JSON")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from labkit import hardware

    _args(args, "frameworks", "json")
    report = hardware.detect(frameworks=args.frameworks)
    advice = hardware.advise(report)
    if args.json:
        print(json.dumps({"report": report.to_dict(), "advice": _advice_dict(advice)}, indent=2))
    else:
        print(hardware.format_report(report, advice))
    return 0


def _advice_dict(advice) -> dict:
    import dataclasses

    return {**dataclasses.asdict(advice), "headline": advice.headline}


def add_bench(subparsers) -> None:
    from labkit import bench
    from labkit.train.config import DEVICES

    p = _subparsers(subparsers).add_parser(
        "bench", help="time each framework x precision x model on this machine",
        description="Run real training steps for each framework x precision x model on synthetic data and time "
                    "them adaptively within a budget per cell (torch.utils.benchmark for PyTorch): step time, "
                    "samples/s, the speed-up against fp32 in the same run, activation bytes (measured where the "
                    "framework can tell, and modelled), final loss. A precision this device only emulates is "
                    "timed at a small size first and reported as 'emulated here: N x slower than fp32' when the "
                    "full size would not fit the budget. A combination that cannot run here is reported as "
                    "skipped, with the reason. One line per cell as it finishes; --json is rewritten after "
                    "each cell, so a stopped bench keeps what it measured.")
    p.add_argument("--framework", default="torch", metavar="LIST", help="from torch, jax, tf (default: torch)")
    p.add_argument("--precision", default="fp32,bf16", metavar="LIST",
                   help="from fp32, tf32, fp16, bf16, bf16-pure (default: fp32,bf16); fp32 always runs first")
    p.add_argument("--model", default="mlp", metavar="LIST", help="from mlp, transformer (default: mlp)")
    p.add_argument("--batch-size", type=_whole(1), default=None, metavar="N",
                   help=f"default {bench.DEFAULT_BATCH}; with --odd-sizes at least 2")
    p.add_argument("--width", type=_whole(1), default=None, metavar="N",
                   help=f"hidden width (default: mlp {bench.DEFAULT_WIDTH['mlp']}, "
                        f"transformer {bench.DEFAULT_WIDTH['transformer']}; the transformer's a multiple of 4)")
    p.add_argument("--max-seconds", type=_seconds, default=20.0, metavar="S",
                   help="time budget of each cell: building, warm-up and timing (default 20)")
    p.add_argument("--steps", type=_whole(1), default=None, metavar="N",
                   help="time exactly this many steps per cell (default: adaptive, until the times agree)")
    p.add_argument("--warmup", type=_whole(0), default=2, metavar="N",
                   help="untimed warm-up steps per cell (default 2)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto, cpu, cuda, gpu, tpu (default auto)")
    p.add_argument("--odd-sizes", action="store_true",
                   help="also run each cell at odd sizes (batch-1, width-1) to see what misalignment costs")
    p.add_argument("--json", metavar="FILE", help="write a labkit evidence document (the records, this machine, "
                                                  "the versions, the date) to FILE, after every cell")
    p.add_argument("--plot", metavar="FILE", help="save a bar chart of the speed-ups to FILE (png, svg, pdf, ...)")
    p.set_defaults(func=run_bench)


def _check_bench(args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    """Everything `labkit bench` can check before it imports a framework: the lists, the sizes of
    every cell (--odd-sizes runs batch - 1 and width - 1 too), the --json and --plot paths. Returns
    the plan (`bench.cells`); a bad value is a ValueError that names the option."""
    from labkit import bench

    _args(args, "framework", "precision", "model", "batch_size", "width", "max_seconds", "steps", "warmup",
          "device", "odd_sizes", "json", "plot")
    plan = bench.cells(args.framework, args.precision, args.model, args.odd_sizes)
    for model, shape in dict.fromkeys((m, s) for _, m, s, _ in plan):
        bench.shape_of(model, shape, args.batch_size, args.width)  # --odd-sizes: batch - 1 and width - 1 too
    if args.json is not None:
        out_path("--json", args.json)
    if args.plot is not None:
        out_path("--plot", args.plot, suffixes=bench.plot_suffixes())
    return plan


def run_bench(args: argparse.Namespace) -> int:
    import time

    try:
        plan = _check_bench(args)
    except ValueError as e:
        print(f"labkit bench: error: {e}", file=sys.stderr)
        return 2
    from labkit import bench, evidence

    done, start = [], time.perf_counter()
    command = "labkit " + " ".join(getattr(args, "argv", None) or sys.argv[1:])
    where = evidence.describe_machine() if args.json else None

    def save(complete: bool) -> None:
        if args.json:
            evidence.write(args.json, evidence.document("bench", done, command=command, complete=complete,
                                                        machine=where))

    def on_cell(rec):
        done.append(rec)
        spent = time.perf_counter() - start
        left = spent / len(done) * (len(plan) - len(done))
        save(complete=False)  # before the line: whoever sees the line finds the row on disk
        print(bench.progress_line(rec, len(done), len(plan), left), flush=True)

    print(f"labkit bench: {len(plan)} cells, at most {args.max_seconds:g} s each", flush=True)
    try:
        records = bench.bench(args.framework, args.precision, args.model, batch_size=args.batch_size,
                              width=args.width, warmup=args.warmup, steps=args.steps, device=args.device,
                              odd_sizes=args.odd_sizes, max_seconds=args.max_seconds, on_cell=on_cell)
    except ValueError as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2
    save(complete=True)
    print()
    print(bench.table(records))
    devices = sorted({r["device"] for r in records if r.get("device")})
    for d in devices:
        print("device:", d)
    print(f"{len(records)} cells in {time.perf_counter() - start:.0f} s")
    if args.plot:
        bench.plot(records, args.plot)
    return 0


COMMANDS = (add_doctor, add_bench)
"""The ``add_`` function of each subcommand, in the order ``labkit --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labkit", description="labkit: a course and lab on "
                                     "mixed precision training.")
    parser.add_argument("--version", action="version", version=f"labkit {labkit.__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``labkit`` with ``argv`` (default: the command line); return the exit status."""
    if argv is not None and (isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple))
                             or not all(isinstance(a, str) for a in argv)):
        raise TypeError(f"argv must be a list of strings, the command line after 'labkit' (e.g. ['doctor']); "
                        f"got {type(argv).__name__} {shown(argv)}")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
