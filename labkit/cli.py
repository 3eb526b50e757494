"""The ``labkit`` command: ``labkit doctor``, ``labkit --version``.

Each subcommand is a pair of functions: ``add_<name>(subparsers)`` declares its arguments
and sets ``func`` to ``run_<name>(args) -> int``. To add one (``labkit bench``), write the
pair and list the ``add_`` function in `COMMANDS`.

    $ labkit doctor                       # devices, capabilities, versions, the advice
    $ labkit doctor --frameworks torch    # probe torch only (TensorFlow takes seconds)
    $ labkit doctor --json                # the same report as JSON, for a bug report
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
    p.add_argument("--frameworks", type=_frameworks, default=("torch", "jax", "tensorflow"),
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


COMMANDS = (add_doctor,)
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
