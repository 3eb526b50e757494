"""The portable-truth check: nbval over the notebooks as another kind of CPU would run them.

    python scripts/portable_check.py                     # every notebook
    python scripts/portable_check.py notebooks/04_pytorch_amp.ipynb
    python scripts/portable_check.py --cap-differs       # exit 0: the cap hides something here; 3: nothing

The notebooks' stored outputs were made on one CPU; a learner's, and CI's, is another. A
stored output that nbval compares must therefore be the same on every machine (format
constants, bit patterns, dtypes, bytes, scaler traces driven by fixed patterns, the verdict
lines of `labkit.checks`), and what a notebook says must hold there too. This runs nbval
once more with the two things that differ most between machines changed at once:

**The instruction set, capped to AVX2** -- a CPU without AVX-512, AVX512-BF16, AVX512-FP16
or AMX -- through each knob that a library installed here honours:

* ``ATEN_CPU_CAPABILITY=avx2``: PyTorch's own vectorised kernels
  (``torch.backends.cpu.get_cpu_capability()`` then says ``AVX2``).
* ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN, which runs PyTorch's bf16 and fp16 matmuls and
  TensorFlow's oneDNN kernels. ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` turns False and
  PyTorch's bf16 falls back to its generic kernel: a 1024 x 1024 bf16 matmul went from 3.5 ms to
  6.3 s on the AMX Xeon this check was written on (fp32: 12 ms and 22 ms).
* ``MKL_ENABLE_INSTRUCTIONS=AVX2``: Intel MKL, PyTorch's fp32 BLAS on x86.
* ``XLA_FLAGS=--xla_cpu_max_isa=AVX2``: XLA:CPU's code generator (JAX; TensorFlow with
  ``jit_compile``). XLA accepts the flag (an unknown value only logs a warning) and it changes
  XLA's rounding: on that Xeon a JAX fp32 MLP's loss after 100 steps went from
  0.11503944545984268 to 0.11503945291042328.
* ``TF_ENABLE_ONEDNN_OPTS=0`` is not a cap but a consequence: TensorFlow 2.21 picks its oneDNN
  bf16/fp16 kernels from the CPU's own flags and crashes (SIGSEGV) once ``ONEDNN_MAX_CPU_ISA``
  hides them, so labkit sets it itself in that case
  (`labkit.hardware.detect.tensorflow_environment`); it is set here so that every process,
  labkit's or not, sees the same. TensorFlow then runs Eigen's kernels, as on an AVX2 CPU.

labkit reads the caps (`labkit.hardware.detect_cpu`), so a capped run reports "no native bf16"
and sizes its emulated cells as on a real AVX2 machine.

**One thread on one core** (``make nbval`` uses every core; CI's have two): the process is
pinned to its first allowed core (``os.sched_setaffinity``, inherited by the kernels nbval
starts), with ``OMP_NUM_THREADS=1`` for PyTorch and MKL and ``TF_NUM_INTRAOP_THREADS=1``,
``TF_NUM_INTEROP_THREADS=1`` for TensorFlow; XLA sizes its pool from the cores it may use.

**On a CPU without AVX-512** (no flag for the cap to hide: `hidden_by_the_cap` is empty) the
cap would change nothing but one thing a real AVX2 CPU does not do, TensorFlow's oneDNN kernels
switched off; the check then runs nbval with one thread on one core and no cap, and that run is
the course's only nbval run there: ``make test`` runs the notebooks natively as well only where
``--cap-differs`` says the cap hides something (a native run would repeat this one with two
threads, and the suite is slowest on exactly these CPUs).

Before the notebooks were made portable, their outputs had been stored on an AVX512-BF16 AMD
EPYC. On the AMX Xeon this check was written on, nbval failed on 5 stored cells run natively
(the CPU model alone) and on 6 run this way (07 aside): seeded losses in the 4th digit (04, 05, 08),
gradient norms (05), the largest gradients of notebook 03's lr=1.0 run and the overflow counts
that follow from them, and the share of weights three SGD steps move (05: 79.4% -> 79.3%). On
an AVX2 EPYC 7 cells had failed. The thread count alone (1 against 2, uncapped) changed none of
the fp32 losses of a 100-step MLP run in PyTorch, JAX or TensorFlow on that Xeon; it is varied
anyway, since BLAS libraries split their reductions by thread. All of those outputs are now
ignored by nbval (the cell tag ``nbval-ignore-output``) and followed by a check that is compared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CAPPED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "TF_ENABLE_ONEDNN_OPTS": "0",
}
NOTHING_TO_CAP = 3
"""``--cap-differs``' exit status on a CPU the cap would not change (any other non-zero status is a failure)."""
ONE_THREAD = {"OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the capped, one-thread run: `base` (default: this process's) with the
    knobs above set, and ``--xla_cpu_max_isa=AVX2`` added to any ``XLA_FLAGS`` already there."""
    env = environment_one_thread(base)
    env.update(CAPPED)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_max_isa=")]
    env["XLA_FLAGS"] = " ".join([*flags, "--xla_cpu_max_isa=AVX2"])
    return env


def environment_one_thread(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the one-thread run on a CPU the cap would not change: `base` (default:
    this process's) with one thread, and no cap (TensorFlow keeps its oneDNN kernels, as it does
    on such a CPU)."""
    env = dict(os.environ if base is None else base)
    env.update(ONE_THREAD)
    return env


def hidden_by_the_cap(flags=None) -> tuple[str, ...]:
    """The instruction-set flags of this CPU (or of `flags`) that the AVX2 cap hides from the
    libraries: AVX-512, AVX512-BF16/FP16, AMX. Empty on an AVX2 CPU, where the cap changes nothing."""
    from labkit.hardware import CPUInfo, detect_cpu, parse_isa_caps

    cpu = CPUInfo("this CPU", flags=detect_cpu().flags if flags is None else flags,
                  isa_caps=parse_isa_caps(environment({})))
    return tuple(f for f in cpu.flags if not cpu.usable(f))


def pin_to_one_core() -> int | None:
    """Pin this process (and so its children) to its first allowed core; None where the OS
    does not offer it (macOS)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def main(argv: list[str]) -> int:
    if argv == ["--cap-differs"]:  # exit 0: the cap hides something here (make test runs nbval natively too); 3: nothing
        hidden = hidden_by_the_cap()
        print(f"the AVX2 cap hides {', '.join(hidden)}" if hidden else "the AVX2 cap hides nothing on this CPU")
        return 0 if hidden else NOTHING_TO_CAP
    notebooks = argv or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))
    core = pin_to_one_core()
    hidden = hidden_by_the_cap()
    env = environment() if hidden else environment_one_thread()
    knobs = ", ".join(f"{k}={env[k]}" for k in ((*CAPPED, *ONE_THREAD, "XLA_FLAGS") if hidden else ONE_THREAD))
    what = f"capped (hides {', '.join(hidden)})" if hidden else "not capped (an AVX2 CPU: nothing to hide)"
    print(f"portable-truth check, {what}: nbval with {knobs}; pinned to core {core}", flush=True)
    cmd = [sys.executable, "-m", "pytest", "--nbval", *notebooks, "--nbval-sanitize-with",
           "notebooks/nbval_sanitize.cfg", "-p", "no:cacheprovider", "-q"]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
