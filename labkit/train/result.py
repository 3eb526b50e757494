"""What a run produced: one `RunResult` schema for every framework, written as it goes.

A run appends JSON lines to its ``out`` file: a header line, one line per finished step,
and a closing line. If the process dies midway (a kernel restart, a Colab disconnect),
`RunResult.load` rebuilds every finished step from the file and reports
``status="interrupted"``.

    {"kind": "header", "config": {...}, "device": "cpu (...)", "labkit": "0.1.0"}
    {"kind": "step", "step": 0, "loss": 2.31, "time": 0.012, "scale": 65536.0, "skipped": false, "grad_norm": 1.7}
    ...
    {"kind": "end", "status": "ok", "metric": {"name": "accuracy", "value": 0.93}, "memory": {...}}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.train.config import RunConfig

STATUSES = ("ok", "diverged", "interrupted", "failed")


@dataclass
class RunResult:
    """Per-step records and the outcome of one run.

    Attributes:
      losses, step_times, grad_norms: one float per finished step (step_times in
        seconds, measured around the whole step, device-synchronised on accelerators).
      scales: the loss scale used in each step's backward pass (empty without scaling).
      skipped: whether each step's update was skipped for non-finite gradients.
      status: "ok"; "diverged" (a non-finite loss: `diverged_step` says when and
        `diverged_where` names the first layer found non-finite, where it can tell);
        "interrupted" (stopped early, e.g. KeyboardInterrupt or a dead kernel);
        "failed" (an exception; `error` holds its message).
      metric: the final evaluation, e.g. {"name": "accuracy", "value": 0.95}.
      device: a description of where it ran.
      memory: byte counts the framework could report (keys vary by framework/device).
    """

    config: RunConfig
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    status: str = "interrupted"
    diverged_step: int | None = None
    diverged_where: str | None = None
    error: str | None = None
    metric: dict | None = None
    device: str = ""
    memory: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def steps_done(self) -> int:
        return len(self.losses)

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan

    def median_step_time(self, skip_first: int = 1) -> float:
        """Median step time, leaving out the first `skip_first` (compilation, warm-up)."""
        times = sorted(self.step_times[skip_first:] or self.step_times)
        if not times:
            return math.nan
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2

    def summary(self) -> str:
        cfg = self.config
        metric = f"{self.metric['name']} {self.metric['value']:.3f}" if self.metric else "no metric"
        where = f" at step {self.diverged_step}" if self.diverged_step is not None else ""
        return (
            f"{cfg.framework}/{cfg.precision}/{cfg.model}: {self.status}{where}, "
            f"{self.steps_done} steps, final loss {self.final_loss:.4f}, {metric}, "
            f"skipped {sum(self.skipped)}"
        )

    # -- JSON -------------------------------------------------------------------------
    def to_json(self) -> str:
        d = asdict(self)
        d["config"] = self.config.to_dict()
        return json.dumps(_finite_or_str(d))

    @classmethod
    def from_json(cls, text: str) -> "RunResult":
        d = _str_to_float(json.loads(text))
        d["config"] = RunConfig.from_dict(d["config"])
        return cls(**d)

    @classmethod
    def load(cls, path) -> "RunResult":
        """Rebuild a result from the JSON lines a run wrote, however far it got."""
        lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        if not lines or lines[0].get("kind") != "header":
            raise ValueError(f"{path} is not a labkit run log: its first line is not a header")
        head = lines[0]
        res = cls(config=RunConfig.from_dict(head["config"]), device=head.get("device", ""))
        for rec in map(_str_to_float, lines[1:]):
            if rec["kind"] == "step":
                res._add_step(rec)
            elif rec["kind"] == "end":
                for key in ("status", "diverged_step", "diverged_where", "error", "metric", "memory", "extra"):
                    if key in rec:
                        setattr(res, key, rec[key])
        return res

    def _add_step(self, rec: dict) -> None:
        self.losses.append(rec["loss"])
        self.step_times.append(rec["time"])
        self.grad_norms.append(rec["grad_norm"])
        if rec.get("scale") is not None:
            self.scales.append(rec["scale"])
        self.skipped.append(bool(rec.get("skipped", False)))


class Recorder:
    """Collects a RunResult and mirrors every record to a JSON-lines file, flushed per line."""

    def __init__(self, config: RunConfig, device: str):
        self.result = RunResult(config=config, device=device)
        self._file = None
        if config.out:
            path = Path(config.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w")
        self._write({"kind": "header", "config": config.to_dict(), "device": device, "labkit": _version()})

    def step(self, loss: float, time: float, grad_norm: float, scale: float | None, skipped: bool) -> None:
        rec = {"kind": "step", "step": self.result.steps_done, "loss": float(loss), "time": float(time),
               "scale": None if scale is None else float(scale), "skipped": bool(skipped),
               "grad_norm": float(grad_norm)}
        self.result._add_step(rec)
        self._write(rec)

    def end(self, status: str, **fields) -> RunResult:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        self.result.status = status
        for key, value in fields.items():
            setattr(self.result, key, value)
        self._write({"kind": "end", "status": status, **fields})
        if self._file:
            self._file.close()
            self._file = None
        return self.result

    def _write(self, rec: dict) -> None:
        if self._file:
            self._file.write(json.dumps(_finite_or_str(rec)) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())


def _version() -> str:
    from labkit import __version__

    return __version__


def _finite_or_str(obj):
    """JSON has no inf/NaN: write them as the strings "inf", "-inf", "nan"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite_or_str(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_str(v) for v in obj]
    return obj


def _str_to_float(obj):
    if isinstance(obj, str) and obj in ("inf", "-inf", "nan"):
        return float(obj)
    if isinstance(obj, dict):
        return {k: _str_to_float(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_str_to_float(v) for v in obj]
    return obj
