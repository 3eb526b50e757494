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
import sys

import labkit


def _frameworks(text: str) -> tuple[str, ...]:
    """``"torch,jax"`` -> ``("torch", "jax")``; ``"none"`` -> ``()``."""
    from labkit.hardware.report import framework_name

    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(framework_name(name) for name in text.split(",") if name.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_doctor(subparsers) -> None:
    p = subparsers.add_parser(
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

    p = subparsers.add_parser(
        "bench", help="time each framework x precision x model on this machine",
        description="Run real training steps for each framework x precision x model on synthetic data: "
                    "warm-up steps, then the median of the timed steps, samples/s, the speed-up against fp32 "
                    "in the same run, activation bytes (measured where the framework can tell, and modelled), "
                    "final loss. A combination that cannot run here is reported as skipped, with the reason.")
    p.add_argument("--framework", default="torch", metavar="LIST", help="from torch, jax, tf (default: torch)")
    p.add_argument("--precision", default="fp32,bf16", metavar="LIST",
                   help="from fp32, tf32, fp16, bf16, bf16-pure (default: fp32,bf16); fp32 always runs first")
    p.add_argument("--model", default="mlp", metavar="LIST", help="from mlp, transformer (default: mlp)")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"default {bench.DEFAULT_BATCH}")
    p.add_argument("--width", type=int, default=None,
                   help=f"hidden width (default: mlp {bench.DEFAULT_WIDTH['mlp']}, "
                        f"transformer {bench.DEFAULT_WIDTH['transformer']})")
    p.add_argument("--steps", type=int, default=20, help="timed steps per cell (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps per cell (default 5)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, gpu, tpu (default auto)")
    p.add_argument("--odd-sizes", action="store_true",
                   help="also run each cell at odd sizes (batch-1, width-1) to see what misalignment costs")
    p.add_argument("--json", metavar="FILE", help="write the records to FILE as a JSON list")
    p.add_argument("--plot", metavar="FILE", help="save a bar chart of the speed-ups to FILE (png, svg, pdf)")
    p.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from labkit import bench

    try:
        plan = bench.cells(args.framework, args.precision, args.model, args.odd_sizes)
    except ValueError as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2
    done = []

    def on_cell(rec):
        done.append(rec)
        print(bench.progress_line(rec, len(done), len(plan)), flush=True)

    try:
        records = bench.bench(args.framework, args.precision, args.model, batch_size=args.batch_size,
                              width=args.width, warmup=args.warmup, steps=args.steps, device=args.device,
                              odd_sizes=args.odd_sizes, on_cell=on_cell)
    except ValueError as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2
    print()
    print(bench.table(records))
    devices = sorted({r["device"] for r in records if r.get("device")})
    for d in devices:
        print("device:", d)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1, default=str)
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
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
