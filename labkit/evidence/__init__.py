"""Evidence: measurements from other machines, stored with the course and shown as such.

A learner's notebook measures the learner's machine. What the course says about machines the
learner does not have -- a GPU, a TPU, a CPU with or without bf16 instructions -- comes from
*evidence*: the JSON documents that ``labkit bench --json`` writes (and ``scripts/gpu_check.sh``
on a GPU machine), each with the machine, the library versions and the date it was measured
on. The ones kept with the course live in ``labkit/evidence/stored/`` (the format is described
in the README there); `stored()` reads them, `reference_table` shows their figures as labelled
reference rows next to the local ones, and `summary` says in one line what is stored.

>>> doc = document("bench", [], command="labkit bench", complete=True, machine={"system": "Linux", "cpu": "x"})
>>> doc["format"], doc["version"], doc["kind"]
('labkit-evidence', 1, 'bench')
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from labkit import _validate
from labkit.table import Table

FORMAT, VERSION = "labkit-evidence", 1
KINDS = ("bench",)
STORED = Path(__file__).resolve().parent / "stored"
"""The folder of stored evidence that ships with labkit."""

_REQUIRED = ("format", "version", "kind", "date", "machine", "versions", "records", "complete")
_RECORD_KEYS = ("framework", "precision", "model", "batch_size", "width", "status")


# -- writing ----------------------------------------------------------------------------------
def describe_machine() -> dict:
    """This machine, as evidence records it: system, CPU (model, cores, 16-bit flags, caps), the
    GPUs with their compute capability, the NVIDIA driver and the CUDA version torch was built
    for (when torch is already imported), the TPUs."""
    from labkit import hardware

    report = hardware.detect(frameworks=())
    cpu = report.cpu
    gpus = [{"name": g.name, "capability": list(g.capability) if g.capability else None, "memory_gib": g.memory_gib}
            for g in report.gpus]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and not gpus:
        gpus = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
                 "memory_gib": None} for i in range(torch.cuda.device_count())]
    return {
        "system": report.system,
        "cpu": cpu.model,
        "cores": cpu.cores,
        "cpu_16bit": {"bf16": list(cpu.bf16_instructions), "fp16": list(cpu.fp16_instructions), "amx": cpu.amx},
        "isa_caps": dict(cpu.isa_caps),
        "gpus": gpus,
        "driver": _nvidia_driver(),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None,
        "tpus": [t.kind for t in report.tpus],
    }


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _versions() -> dict:
    from labkit.hardware import package_versions

    return {p: v for p, v in package_versions().items() if v}


def document(kind: str, records: list, *, command: str, complete: bool, machine: dict | None = None,
             date: str | None = None) -> dict:
    """An evidence document of `records` measured on this machine (or on `machine`)."""
    kind = _validate.choice("kind", kind, KINDS)
    if not isinstance(records, (list, tuple)):
        raise TypeError(f"records must be a list of records (dicts); got {type(records).__name__}")
    if not isinstance(command, str):
        raise TypeError(f"command must be the command line that measured the records (a string); got {_validate.shown(command)}")
    return {"format": FORMAT, "version": VERSION, "kind": kind,
            "date": date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "complete": bool(complete), "machine": describe_machine() if machine is None else machine, "versions": _versions(), "records": list(records)}


def write(path, doc: dict) -> None:
    """Write `doc` to `path` at once: a reader (or a killed run) never sees half a file."""
    path = Path(_validate.out_path("path", path))
    check(doc, str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- reading ----------------------------------------------------------------------------------
def check(doc, where: str = "evidence") -> dict:
    """`doc` if it is an evidence document of this format, else ValueError saying what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: an evidence document is a JSON object, got {type(doc).__name__}")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise ValueError(f"{where}: not a labkit evidence document (missing {', '.join(missing)})")
    if doc["format"] != FORMAT or doc["version"] != VERSION:
        raise ValueError(f"{where}: format {doc['format']!r} version {doc['version']!r}; this labkit reads "
                         f"{FORMAT!r} version {VERSION}")
    if doc["kind"] not in KINDS:
        raise ValueError(f"{where}: unknown kind {doc['kind']!r}; known: {', '.join(KINDS)}")
    if not isinstance(doc["machine"], dict) or not isinstance(doc["records"], list):
        raise ValueError(f"{where}: 'machine' must be an object and 'records' a list")
    for i, rec in enumerate(doc["records"]):
        lacking = [k for k in _RECORD_KEYS if not isinstance(rec, dict) or k not in rec]
        if lacking:
            raise ValueError(f"{where}: record {i} lacks {', '.join(lacking)}")
    return doc


@dataclass(frozen=True)
class Evidence:
    """One stored document: where it came from and its records."""

    path: str
    doc: dict

    @property
    def machine(self) -> dict:
        return self.doc["machine"]

    @property
    def records(self) -> list[dict]:
        return self.doc["records"]

    @property
    def accelerator(self) -> bool:
        """Measured on a GPU or TPU (else: a CPU reference)."""
        return bool(self.machine.get("gpus") or self.machine.get("tpus"))

    @property
    def label(self) -> str:
        """"NVIDIA H200 (compute capability 9.0), driver 550.90.07, CUDA 12.4; torch 2.13.0; 2026-12-01"."""
        m, v = self.machine, self.doc["versions"]
        if m.get("gpus"):
            g = m["gpus"][0]
            cc = f" (compute capability {g['capability'][0]}.{g['capability'][1]})" if g.get("capability") else ""
            what = f"{len(m['gpus'])} x " if len(m["gpus"]) > 1 else ""
            what += g["name"] + cc
            what += "".join(f", {name} {m[k]}" for k, name in (("driver", "driver"), ("cuda", "CUDA")) if m.get(k))
        elif m.get("tpus"):
            what = m["tpus"][0]
        else:
            from labkit.hardware import isa_cap_level

            bf16 = ", ".join(m.get("cpu_16bit", {}).get("bf16", [])) or "no bf16 instructions"
            caps = m.get("isa_caps") or {}
            capped = f", instruction set capped to {isa_cap_level(caps) or '?'}" if caps else ""
            what = f"CPU {m.get('cpu', '?')} ({m.get('cores', '?')} cores, {bf16}{capped})"
        libs = ", ".join(f"{k} {v[k]}" for k in ("torch", "jax", "tensorflow") if v.get(k))
        return f"{what}; {libs}; {self.doc['date'][:10]}"


def load(path) -> Evidence:
    """Read and check one evidence file."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"path must be the path of an evidence file (str or os.PathLike); got {_validate.shown(path)}")
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no evidence file at {path}") from None
    except IsADirectoryError:
        raise ValueError(f"path {str(path)!r} is a folder; give an evidence file (stored() reads a folder)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return Evidence(str(path), check(doc, str(path)))


def stored(folder=None) -> list[Evidence]:
    """Every evidence file in `folder` (default: the one shipped with labkit), oldest first."""
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a folder path or None (the stored evidence); got {_validate.shown(folder)}")
    folder = STORED if folder is None else Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no evidence folder at {folder}")
    found = [load(p) for p in sorted(folder.glob("*.json"))]
    return sorted(found, key=lambda e: e.doc["date"])


# -- showing ----------------------------------------------------------------------------------
def _evidence_list(evidence) -> list[Evidence]:
    if evidence is None:
        return stored()
    if isinstance(evidence, Evidence):
        return [evidence]
    if not isinstance(evidence, (list, tuple)) or not all(isinstance(e, Evidence) for e in evidence):
        raise TypeError("evidence must be a list of Evidence (from load() or stored()), or None for the stored "
                        f"evidence; got {_validate.shown(evidence)}")
    return list(evidence)


def summary(evidence: list[Evidence] | None = None) -> str:
    """One line (two at most) on what is stored: how many accelerator and CPU documents."""
    evidence = _evidence_list(evidence)
    gpu = [e for e in evidence if e.accelerator]
    cpu = [e for e in evidence if not e.accelerator]
    if not gpu:
        line = ("No accelerator evidence is stored with this copy of the course: no GPU or TPU figure here "
                "has been measured (scripts/gpu_check.sh on a GPU machine writes it).")
    else:
        line = "Stored accelerator evidence: " + "; ".join(sorted({e.label for e in gpu})) + "."
    if cpu:
        line += f"\nStored CPU references: {len(cpu)} document(s) from " + "; ".join(
            sorted({e.label for e in cpu})) + "."
    return line


def reference_table(evidence: list[Evidence] | None = None, *, models=None, precisions=None) -> Table:
    """The stored bench records as labelled reference rows: a letter per document in the
    "machine" column, and in the title what each letter was measured on and when; then the
    figures (ms per step, the speed-up over fp32 in the same run)."""
    evidence = _evidence_list(evidence)
    models = None if models is None else _validate.names("models", models)
    precisions = None if precisions is None else _validate.names("precisions", precisions)
    rows, legend = [], []
    for letter, e in zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", evidence):
        legend.append(f"{letter} = {e.label}")
        for r in e.records:
            if (models and r["model"] not in models) or (precisions and r["precision"] not in precisions):
                continue
            if r["status"] == "ok":
                ms, vs = f"{r['step_time_s'] * 1e3:.2f}", f"{r['speedup_vs_fp32']:.2f}x" if r.get(
                    "speedup_vs_fp32") else "-"
            elif r["status"] == "emulated":
                ms, vs = "-", f"{r['emulated_slowdown']:.0f}x slower (emulated, batch {r['small_batch_size']})"
            else:
                ms, vs = "-", r["status"]
            rows.append((letter, r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]),
                         ms, vs))
    cols = ("machine", "framework", "model", "precision", "batch", "width", "ms/step", "vs fp32")
    title = "Reference rows, measured on other machines (stored evidence): " + ("; ".join(legend) or "none stored")
    return Table(cols, tuple(rows), title)


__all__ = ["FORMAT", "KINDS", "STORED", "VERSION", "Evidence", "check", "describe_machine", "document", "load",
           "reference_table", "stored", "summary", "write"]
