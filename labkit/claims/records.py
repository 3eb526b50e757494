"""The records a verdict reads (`labkit.bench.bench` records, or `run_records` of training runs),
how one 16-bit record is paired with its fp32 baseline (`speedups`), and what the device a record
was measured on can do (`record_native`, `record_ceiling`).

>>> run_records([])
[]
"""

from __future__ import annotations

from labkit._validate import choice, shown
from labkit.claims.catalog import Claim

def _records(records, what: str = "records") -> list[dict]:
    """Records `verdict` reads: a list of dicts; a finished one (status "ok") names its framework,
    precision, model and batch size."""
    if records is None or isinstance(records, (str, bytes, dict)) or not isinstance(records, (list, tuple)):
        raise TypeError(f"{what} must be a list of records (dicts: labkit.bench.bench records, or "
                        f"run_records(results)); got {type(records).__name__} {shown(records)}")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TypeError(f"{what} must be dicts (labkit.bench.bench records, or run_records(results)); "
                            f"got {shown(r)}")
        if r.get("status") in ("ok", "emulated"):
            needed = ("framework", "precision", "model", "batch_size")
            if r["status"] == "emulated":
                needed += ("emulated_slowdown", "small_batch_size", "small_width")
            missing = [k for k in needed if k not in r]
            if missing:
                raise ValueError(f"{what}[{i}] lacks {', '.join(map(repr, missing))}")
    return list(records)


def run_records(results, step_time: str = "median") -> list[dict]:
    """Training runs (`labkit.train.RunResult`) as records `verdict` reads, with accuracy.

    A record's ``step_time_s`` is the run's median step time, or with ``step_time="best"`` its
    fastest step (`labkit.train.RunResult.step_time`): compare runs timed side by side
    (`labkit.train.run_in_turns`) by their best steps, which other work on the machine disturbs least.
    """
    from labkit.train import RunResult
    from labkit.train.result import STEP_TIMES

    if isinstance(results, RunResult):
        results = [results]
    if not isinstance(results, (list, tuple)):
        raise TypeError(f"results must be a list of labkit.train.RunResult; got {type(results).__name__} "
                        f"{shown(results)}")
    step_time = choice("step_time", step_time, STEP_TIMES)
    out = []
    for r in results:
        if not isinstance(r, RunResult):
            raise TypeError(f"results must hold labkit.train.RunResult objects (run_records takes runs), got "
                            f"{type(r).__name__}")
        cfg = r.config
        t = r.step_time(step_time)
        out.append(dict(
            framework=cfg.framework, precision=cfg.precision, model=cfg.model, shape="aligned",
            batch_size=cfg.batch_size, width=cfg.width, status=r.status, device=r.device,
            step_time_s=t, final_loss=r.final_loss, memory=dict(r.memory),
            accuracy=r.metric["value"] if r.metric else None,
        ))
    return out


def _device_kind(rec: dict) -> str:
    """"cpu", "gpu" or "tpu", from the device text's first word ("cpu (Intel ...)", "cuda:0 (NVIDIA H200, ...)",
    "gpu (...)", "tpu (...)"): the rest may mention other devices ("TF32 is a GPU format: ...")."""
    text = str(rec.get("device", "")).lower().strip()
    head = text.split("(", 1)[0].strip()
    if head.startswith("tpu"):
        return "tpu"
    if head.startswith(("cuda", "gpu", "nvidia")):
        return "gpu"
    if head.startswith("cpu"):
        return "cpu"
    if "tpu" in text:  # a free-form description, as a test or an old record may give
        return "tpu"
    return "gpu" if any(k in text for k in ("cuda", "nvidia")) else "cpu"


def _report(rec: dict):
    """A HardwareReport for the device a record was measured on: this machine's CPU for a CPU
    record, the GPU named in the device text (its compute capability looked up) or a TPU
    otherwise; None for a GPU of unknown compute capability."""
    from labkit import hardware

    kind = _device_kind(rec)
    if kind == "cpu":
        return hardware.HardwareReport(hardware.detect_cpu())
    if kind == "tpu":
        return hardware.HardwareReport(hardware.detect_cpu(), tpus=(hardware.TPUInfo(),))
    cc = hardware.capability_from_name(str(rec.get("device", "")))
    if cc is None:
        return None
    gpu = hardware.GPUInfo(str(rec.get("device")), capability=cc)
    return hardware.HardwareReport(hardware.detect_cpu(), gpus=(gpu,))


def _record(rec, what: str = "rec") -> dict:
    """One record: a dict that names its framework and precision."""
    if not isinstance(rec, dict):
        raise TypeError(f"{what} must be a record (a dict: labkit.bench.bench's, or run_records(results)'s); got "
                        f"{type(rec).__name__} {shown(rec)}")
    missing = [k for k in ("framework", "precision") if k not in rec]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(map(repr, missing))}: a record names its framework and precision")
    return rec


def record_native(rec: dict):
    """`labkit.hardware.native_precision` of a record's framework and precision on the device it
    was measured on (its ``device`` text, not this machine's GPU); a GPU of unknown compute
    capability counts as native.

    >>> record_native(dict(framework="torch", precision="bf16", device="cuda:0 (Tesla T4)")).native
    False
    """
    from labkit import hardware

    rec = _record(rec)
    report = _report(rec)
    if report is None:
        return hardware.Native(True, "a GPU of unknown compute capability")
    return hardware.native_precision(rec["framework"], rec["precision"], report)


def record_ceiling(rec: dict):
    """`labkit.hardware.speedup_ceiling` of a record's framework and precision on the device it was
    measured on (its ``device`` text); None where that is unknown (a GPU of unknown compute
    capability). The one ceiling every speed-up of a record is read against.

    >>> record_ceiling(dict(framework="torch", precision="bf16", device="cuda:0 (NVIDIA A100-SXM4-40GB)")).times
    16.0
    """
    from labkit import hardware

    rec = _record(rec)
    report = _report(rec)
    return None if report is None else hardware.speedup_ceiling(rec["framework"], rec["precision"], report)


def _step_time(rec: dict) -> float | None:
    """A record's ``step_time_s`` where it is a time (a finite number > 0), else None."""
    t = rec.get("step_time_s")
    return t if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf") else None


def _group(rec: dict) -> tuple:
    """What two runs must share to be compared: framework, model, width, shape, batch size."""
    return rec["framework"], rec["model"], rec.get("width"), rec.get("shape", "aligned"), rec["batch_size"]


def speedups(records, precision: str | None = None) -> list[tuple[dict, dict, float]]:
    """(record, its fp32 record, fp32's step time / its step time) for every finished record of
    `precision` -- None: every precision but fp32 and tf32 (the 16-bit ones) -- that has a finished
    fp32 record of the same framework, model, width, shape (none given: "aligned") and batch size,
    both with a step time; in the records' order. The pairing that `speed_table`, `speed_checks` and
    `labkit.bench.batch_trend` read (the claims' verdicts pair by the same `_group` in `_pairs`, which
    also pairs across batch sizes and without step times, for the memory and double-batch claims).

    >>> base = dict(framework="torch", model="mlp", batch_size=64, status="ok", device="cpu (example)")
    >>> pairs = speedups([dict(base, precision="fp32", step_time_s=0.2), dict(base, precision="bf16", step_time_s=0.1)])
    >>> [(rec["precision"], fp32["precision"], ratio) for rec, fp32, ratio in pairs]
    [('bf16', 'fp32', 2.0)]
    """
    from labkit.train.config import PRECISIONS, TORCH_PRECISIONS

    records = _records(records)
    if precision is not None:
        precision = choice("precision", precision, [p for p in PRECISIONS + TORCH_PRECISIONS if p != "fp32"])
    timed = [r for r in records if r.get("status") == "ok" and _step_time(r) is not None]
    base = {_group(r): r for r in timed if r["precision"] == "fp32"}
    out = []
    for r in timed:
        wanted = r["precision"] == precision if precision else r["precision"] not in ("fp32", "tf32")
        if wanted and _group(r) in base:
            fp32 = base[_group(r)]
            out.append((r, fp32, fp32["step_time_s"] / r["step_time_s"]))
    return out


def _pairs(claim: Claim, records) -> list[tuple[dict, dict]]:
    """(fp32 record, 16-bit record) pairs the claim compares, in the records' order."""
    if isinstance(records, dict):
        raise TypeError("records must be a list of dicts, got dict (a {claim key: records} mapping goes to "
                        "verdict_table or summary_table)")
    records = _records(records)
    ok = [r for r in records if r.get("status") == "ok"]
    if claim.metric == "accuracy_drop":  # only training runs carry a test accuracy
        ok = [r for r in ok if r.get("accuracy") is not None]
    double = claim.metric == "double_batch_ratio"
    base = {_group(r): r for r in ok if r["precision"] == "fp32"}
    pairs = []
    for r in ok:
        if r["precision"] not in claim.precisions:
            continue
        key = _group(r)
        if double:
            key = key[:-1] + (r["batch_size"] // 2,) if r["batch_size"] % 2 == 0 else None
        if key in base:
            pairs.append((base[key], r))
    return pairs


__all__ = ["record_ceiling", "record_native", "run_records", "speedups"]
