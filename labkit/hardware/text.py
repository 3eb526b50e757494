"""The report as text: what ``labkit doctor`` prints and notebook 00 shows."""

from __future__ import annotations

import textwrap

from labkit.hardware.advice import Advice, advise, describe_gpu, wrap
from labkit.hardware.report import HardwareReport

_INDENT = " " * 12


def format_report(report: HardwareReport, advice: Advice | None = None) -> str:
    """Devices, capabilities, what each framework will use, versions, and the advice
    (``advise(report)`` unless given)."""
    if not isinstance(report, HardwareReport):
        raise TypeError(f"report must be a HardwareReport (from detect() or example_report()), not {type(report).__name__}")
    if advice is None:
        advice = advise(report)
    elif not isinstance(advice, Advice):
        raise TypeError(f"advice must be an Advice or None, not {type(advice).__name__}")
    cpu, v = report.cpu, report.versions
    lines = [
        f"System      {report.system or 'unknown'}; Python {v.get('python') or '?'}; "
        f"labkit {v.get('labkit') or '?'}",
        f"CPU         {cpu.model} ({cpu.arch or '?'}, {_cores(cpu.cores)}; "
        f"flags from {cpu.source or '?'})",
        f"{_INDENT}bf16 instructions: {', '.join(cpu.bf16_instructions) or 'none'}; "
        f"fp16: {', '.join(cpu.fp16_instructions) or 'none'}; AMX: {'yes' if cpu.amx else 'no'}; "
        f"AVX-512: {'yes' if cpu.usable('avx512f') else 'no'}",
    ]
    if cpu.isa_caps:
        unused = ", ".join(cpu.capped_instructions) or "none of the 16-bit ones"
        lines += wrap(f"instruction set capped to {cpu.isa_cap or '?'} by {cpu.caps_text}; not used: {unused}",
                      _INDENT, 92)
    for i, g in enumerate(report.gpus):
        mem = f", {g.memory_gib} GiB" if g.memory_gib else ""
        units = ", ".join(g.tensor_core_dtypes) or "none"
        label = "GPUs" if i == 0 else ""
        lines.append(f"{label:12}{describe_gpu(g)}{mem}; tensor cores: {units} [{g.source}]")
    for i, t in enumerate(report.tpus):
        label, count = "TPUs" if i == 0 else "", f" x{t.count}" if t.count else ""
        lines.append(f"{label:12}{t.kind}{count} [{t.source}]")
    lines += [] if report.gpus else ["GPUs        none found"]
    lines += [] if report.tpus else ["TPUs        none found"]
    lines.append("Frameworks")
    for f in report.frameworks:
        head = f"  {f.name:<11} "
        if not f.installed:
            lines.append(f"{head}not installed")
        elif not f.probed:
            lines.append(f"{head}{f.version} (not probed)")
        elif f.error:
            lines += wrap(f"{f.version} FAILED to load: {f.error}", head)
        else:
            lines.append(f"{head}{f.version}: computes on {f.uses}; devices: {', '.join(f.devices)}")
            lines += [f"{'':14}{key}: {value}" for key, value in f.settings.items()]
    have = [f"{k} {val}" for k, val in v.items() if val and k not in ("python", "labkit")]
    missing = [k for k, val in v.items() if not val and k != "labkit"]
    packages = ", ".join(have) + (f"; not installed: {', '.join(missing)}" if missing else "")
    lines += textwrap.wrap(packages, 92, initial_indent="Packages    ", subsequent_indent=_INDENT)
    lines.append("Advice      " + str(advice).replace("\n", "\n" + _INDENT))
    return "\n".join(lines)


def _cores(n: int | None) -> str:
    return "? cores" if n is None else f"{n} core" + ("s" if n != 1 else "")
