"""The records a verdict reads (`labkit.bench.bench` records, or `run_records` of training runs),
and how one 16-bit record is paired with its fp32 baseline.

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
    fastest step (`labkit.train.report.STEP_TIMES`): compare runs timed side by side
    (`labkit.train.run_in_turns`) by their best steps, which other work on the machine disturbs least.
    """
    from labkit.train import RunResult
    from labkit.train.report import STEP_TIMES

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
        t = r.best_step_time() if step_time == "best" else r.median_step_time()
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


def _group(rec: dict) -> tuple:
    """What two runs must share to be compared: framework, model, width, shape, batch size."""
    return rec["framework"], rec["model"], rec.get("width"), rec.get("shape", "aligned"), rec["batch_size"]


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


__all__ = ["run_records"]
