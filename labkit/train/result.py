"""What a run produced: one `RunResult` schema for every framework, written as it goes.

A run appends JSON lines to its ``out`` file: a header line, a start line, one line per
finished step, and a closing line. If the process dies midway (a kernel restart, a Colab
disconnect, a full disk), `RunResult.load` rebuilds every finished step from the file and
reports ``status="interrupted"``; a last line cut short is left out. (Logs from labkit
versions before the start line carry ``device`` in the header; they load the same way.)

    {"kind": "header", "config": {...}, "labkit": "0.1.0"}           written as the run starts
    {"kind": "start", "device": "cpu (...)"}                         the model is built
    {"kind": "step", "step": 0, "loss": 2.31, "time": 0.012, "scale": 65536.0, "skipped": false, "grad_norm": 1.7}
    ...
    {"kind": "end", "status": "ok", "metric": {"name": "accuracy", "value": 0.93}, "memory": {...}}
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from labkit._validate import choice, integer, out_path, shown
from labkit.train.config import RunConfig

STATUSES = ("ok", "diverged", "interrupted", "failed")

STEP_TIMES = ("median", "best")
"""What `RunResult.step_time` reads from a run's step times (the first step, compilation and
warm-up, left out): ``"median"``, or ``"best"``, the fastest step -- the one least disturbed by other
work on the machine, which is what to compare speeds by (runs timed side by side by
`labkit.train.run_in_turns`). `labkit.train.report.run_table` and `labkit.claims.run_records` take the same names."""


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

    def __post_init__(self):
        if not isinstance(self.config, RunConfig):
            raise TypeError(f"config must be a RunConfig; got {type(self.config).__name__} {shown(self.config)}")
        choice("status", self.status, STATUSES)

    @property
    def steps_done(self) -> int:
        return len(self.losses)

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan

    def median_step_time(self, skip_first: int = 1) -> float:
        """Median step time, leaving out the first `skip_first` (compilation, warm-up)."""
        skip_first = integer("skip_first", skip_first, minimum=0)
        times = sorted(self.step_times[skip_first:] or self.step_times)
        if not times:
            return math.nan
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2

    def best_step_time(self, skip_first: int = 1) -> float:
        """The fastest step, leaving out the first `skip_first`: the step least disturbed by other
        work on the machine, as `timeit` advises (the median of a loaded machine's steps measures
        the load). NaN when there are no steps."""
        skip_first = integer("skip_first", skip_first, minimum=0)
        times = self.step_times[skip_first:] or self.step_times
        return min(times) if times else math.nan

    def step_time(self, kind: str = "median", skip_first: int = 1) -> float:
        """The run's step time of `kind` (`STEP_TIMES`): `median_step_time` or `best_step_time`.

        >>> r = RunResult(RunConfig("torch"), step_times=[0.5, 0.03, 0.01, 0.02])
        >>> r.step_time(), r.step_time("best")
        (0.02, 0.01)
        """
        kind = choice("kind", kind, STEP_TIMES)
        return self.best_step_time(skip_first) if kind == "best" else self.median_step_time(skip_first)

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
        """The result `to_json` wrote; a ValueError names what is missing or wrong."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise TypeError(f"text must be a RunResult's JSON (a str); got {type(text).__name__}")
        try:
            d = _str_to_float(json.loads(text))
        except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
            raise ValueError(f"text is not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise ValueError(f"text must hold a JSON object (a RunResult); got a {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        if "config" not in d:
            raise ValueError("text is not a RunResult's JSON: the key 'config' is missing")
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"text has keys a RunResult does not: {sorted(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        d["config"] = RunConfig.from_dict(d["config"])
        for key in ("losses", "step_times", "grad_norms", "scales", "skipped"):
            if not isinstance(d.get(key, []), list):
                raise ValueError(f"text: {key!r} must be a list; got {shown(d[key])}")
        return cls(**d)

    @classmethod
    def load(cls, path) -> "RunResult":
        """Rebuild a result from the JSON lines a run wrote, however far it got.

        A last line cut short (the process died, or the disk filled, while writing it) is
        left out: the run loads as "interrupted" with every complete step. Any other line that
        is not a labkit record is an error naming the line.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a file path (str or os.PathLike); got {type(path).__name__} {shown(path)}")
        if os.path.isdir(path):
            raise ValueError(f"path {os.fspath(path)!r} is a directory, not a run log")
        if not os.path.isfile(path):
            raise ValueError(f"path {os.fspath(path)!r}: no such file (give the `out` a run wrote)")
        records = _read_records(Path(path))
        if not records or records[0][1].get("kind") != "header" or not isinstance(records[0][1].get("config"), dict):
            raise ValueError(f"{path} is not a labkit run log: its first line is not a header"
                             if records else f"{path} is not a labkit run log: it holds no complete line (a run "
                             "stopped before its header was written leaves such a file)")
        head = records[0][1]
        try:
            res = cls(config=RunConfig.from_dict(head["config"]), device=head.get("device", ""))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}, line {records[0][0]}: the header's config is not valid: {exc}") from None
        for number, rec in records[1:]:
            rec = _str_to_float(rec)
            kind = rec.get("kind")
            try:
                if kind == "step":
                    res._add_step(rec)
                elif kind == "start":
                    res.device = rec["device"]
                elif kind == "end":
                    for key in ("status", "diverged_step", "diverged_where", "error", "metric", "memory", "extra"):
                        if key in rec:
                            setattr(res, key, rec[key])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}, line {number}: a {kind!r} record that labkit cannot read "
                                 f"({type(exc).__name__}: {exc})") from None
        if res.status not in STATUSES:
            raise ValueError(f"{path}: status must be one of {', '.join(STATUSES)}; got {shown(res.status)}")
        return res

    def _add_step(self, rec: dict) -> None:
        loss, time, norm = float(rec["loss"]), float(rec["time"]), float(rec["grad_norm"])
        scale = None if rec.get("scale") is None else float(rec["scale"])
        self.losses.append(loss)
        self.step_times.append(time)
        self.grad_norms.append(norm)
        if scale is not None:
            self.scales.append(scale)
        self.skipped.append(bool(rec.get("skipped", False)))


def _read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) for every complete line; a torn last line is dropped."""
    lines = [(i, line) for i, line in enumerate(path.read_bytes().split(b"\n"), start=1) if line.strip()]
    records = []
    for k, (number, line) in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            if k == len(lines) - 1:
                break  # cut short while being written: the run stopped there
            raise ValueError(f"{path}, line {number}: not a JSON line ({line[:60]!r}); only the last line of a "
                             "run log may be cut short") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}, line {number}: not a labkit record (a JSON object); got {shown(rec)}")
        records.append((number, rec))
    return records


class Recorder:
    """Collects a RunResult and mirrors every record to the JSON-lines file ``config.out``.

    The file is checked and opened (a run starts its log afresh), and its header written, when
    the Recorder is made: before any model is built, so a run killed while it starts up leaves
    a log that loads as "interrupted" with 0 steps. `start` adds the device once the stepper knows it. Each line is
    written whole with ``os.write`` and fsynced. If a write fails (a full disk, a file-size
    limit), the part of the line that got through is cut off again, the file is closed, and
    `LogWriteFailed` is raised: the result in memory keeps every step.
    """

    def __init__(self, config: RunConfig):
        self.result = RunResult(config=config)
        self.path = None if config.out is None else log_path(config.out)
        self._fd = None
        self._size = 0  # bytes of complete lines in the file
        self._regular = False  # a plain file (not /dev/stdout, a pipe ...): the only kind discard() removes
        if self.path is not None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            except OSError as exc:
                raise ValueError(f"out {self.path!r} cannot be opened for writing: {exc.strerror}") from None
            self._regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
        self._write({"kind": "header", "config": config.to_dict(), "labkit": _version()})

    def start(self, device: str) -> None:
        """The stepper is built: record where the run goes on."""
        self.result.device = device
        self._write({"kind": "start", "device": device})

    def step(self, loss: float, time: float, grad_norm: float, scale: float | None, skipped: bool) -> None:
        rec = {"kind": "step", "step": self.result.steps_done, "loss": float(loss), "time": float(time),
               "scale": None if scale is None else float(scale), "skipped": bool(skipped),
               "grad_norm": float(grad_norm)}
        self.result._add_step(rec)
        self._write(rec)

    def end(self, status: str, **fields) -> RunResult:
        """Close the run with `status`. The closing line is the last word only for "ok" and
        "diverged": a failed or interrupted run whose end line cannot be written still loads as
        "interrupted", so that write failure is not raised (the result in memory has it all)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        self.result.status = status
        for key, value in fields.items():
            setattr(self.result, key, value)
        try:
            self._write({"kind": "end", "status": status, **fields})
        except LogWriteFailed:
            if status in ("ok", "diverged"):
                raise
        self.close()
        return self.result

    def discard(self) -> None:
        """Nothing ran (the config was refused while the stepper was built): remove the log."""
        self.close()
        if self._regular:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _write(self, rec: dict) -> None:
        if self._fd is None:
            return
        try:  # a step line is in the kernel's cache once written (a killed run keeps it); syncing
            # each would cost milliseconds per step
            self._size += _write_line(self._fd, rec, self._size if self._regular else None,
                                      sync=rec["kind"] != "step")
        except OSError as exc:
            self.close()
            raise LogWriteFailed(f"could not write the run log {self.path!r} ({exc.strerror or exc}); "
                                 f"nothing more is written to it") from exc


class LogWriteFailed(OSError):
    """Writing a line of the run log failed (ENOSPC, EFBIG ...); the file keeps the complete lines."""


def append_end_line(path, status: str, extra: dict) -> None:
    """Add a second "end" line carrying a distributed run's `extra` (RunResult.load reads it back).

    A failed write leaves the file ending in its last complete line and raises LogWriteFailed.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        _write_line(fd, {"kind": "end", "status": status, "extra": extra}, os.fstat(fd).st_size, sync=True)
    except OSError as exc:
        raise LogWriteFailed(f"could not write the run log {os.fspath(path)!r} ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


def _write_line(fd: int, rec: dict, size: int | None, *, sync: bool) -> int:
    """Write `rec` as one JSON line to `fd`; returns its length in bytes.

    A write may take only part of the line (a file-size limit, a full disk): on an OSError the
    torn part is cut off again when `size` (the file's length before) is given -- shrinking needs
    no space -- and the error is raised.
    """
    data = (json.dumps(_finite_or_str(rec)) + "\n").encode()
    try:
        left = memoryview(data)
        while left:
            left = left[os.write(fd, left):]
        if sync:
            _fsync(fd)
    except OSError:
        if size is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
        raise
    return len(data)


def log_path(out) -> str:
    """`out` checked as a place to write a run log, as a str; missing folders are made.

    A ValueError/TypeError names the path (`labkit._validate.out_path`'s checks).
    """
    path = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(parent):
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"out {path!r}: its folder {parent!r} cannot be made ({exc.strerror})") from None
    return out_path("out", path)


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # a pipe or /dev/stdout: nothing to sync
            raise


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
