"""Run logs that survive a full disk, a torn line and a bad path; RunConfig refuses bad numbers.

The disk is filled for real: ``RLIMIT_FSIZE`` caps the file size (SIGXFSZ ignored, so a write
past the cap fails with EFBIG as a full disk fails with ENOSPC), and ``/dev/full`` refuses
every write. The framework runs each go in a fresh subprocess, as a learner's kernel would.
"""

import contextlib
import importlib.util
import json
import math
import os
import resource
import signal
import subprocess
import sys
import textwrap

import pytest

from labkit.memory import MemoryReport
from labkit.train import RunConfig, RunFailed, RunResult, StepOut, run
from labkit.train.loop import train


class Counting:
    """The smallest real Stepper: its loss is 1/n at step n; `on_step(n, stepper)` runs first."""

    device = "cpu (counting stepper)"

    def __init__(self, config, data, on_step=None, on_evaluate=None):
        self.config, self.n, self.on_step, self.on_evaluate = config, 0, on_step, on_evaluate

    def step(self, x, y, inject_overflow):
        self.n += 1
        if self.on_step is not None:
            self.on_step(self.n)
        return StepOut(loss=1.0 / self.n, grad_norm=1.0)

    def evaluate(self, x, y):
        if self.on_evaluate is not None:
            self.on_evaluate()
        return 0.5

    def nonfinite_layer(self):
        return None

    def memory(self):
        return MemoryReport("torch")  # nothing measured: RunResult.memory is {}


def tiny(tmp_path, **kw):
    return RunConfig("torch", steps=kw.pop("steps", 12), progress=False, out=str(tmp_path / "run.jsonl"), **kw)


@contextlib.contextmanager
def file_size_cap():
    """Lets the body cap this process's file size (`cap(n)`); SIGXFSZ ignored, the old cap put back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


# -- load: every complete line, a torn last line left out ------------------------------------------
def test_load_keeps_every_complete_line_and_drops_a_torn_last_one(tmp_path):
    done = train(tiny(tmp_path), Counting)
    path = tmp_path / "run.jsonl"
    lines = path.read_text().splitlines()
    torn = lines[2 + 6][:37]  # header, start, 6 steps, then step 6 cut mid-number
    path.write_text("\n".join(lines[:8]) + "\n" + torn)
    res = RunResult.load(path)
    assert res.status == "interrupted" and res.steps_done == 6 and res.losses == done.losses[:6]
    assert res.device == Counting.device
    path.write_text("\n".join(lines[:8]) + "\n" + torn + "\n")  # a torn line that did get its newline
    assert RunResult.load(path).steps_done == 6


def test_a_torn_line_in_the_middle_is_an_error_naming_the_file_and_line(tmp_path):
    train(tiny(tmp_path), Counting)
    path = tmp_path / "run.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:20]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"run\.jsonl, line 5: not a JSON line"):
        RunResult.load(path)


@pytest.mark.parametrize("text, match", [
    ("", "holds no complete line"),
    ('{"kind": "hea', "holds no complete line"),  # killed while writing the header
    ('{"kind": "step"}\n', "first line is not a header"),
    ('{"kind": "header"}\n', "first line is not a header"),
    ('{"kind": "header", "config": {"framework": "torch", "lr": -1}}\n', "line 1: the header's config.*lr must be"),
    ('{"kind": "header", "config": {"framework": "torch"}}\n{"kind": "step", "loss": 1.0}\n{}\n',
     "line 2: a 'step' record that labkit cannot read"),
    ('{"kind": "header", "config": {"framework": "torch"}}\n[1, 2]\n', "line 2: not a labkit record"),
])
def test_load_refuses_what_is_not_a_run_log_naming_the_line(tmp_path, text, match):
    (tmp_path / "x.jsonl").write_text(text)
    with pytest.raises(ValueError, match=match):
        RunResult.load(tmp_path / "x.jsonl")


def test_load_names_a_bad_path(tmp_path):
    with pytest.raises(TypeError, match="path must be a file path"):
        RunResult.load(5)
    with pytest.raises(ValueError, match="is a directory"):
        RunResult.load(tmp_path)
    with pytest.raises(ValueError, match="no such file"):
        RunResult.load(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("text, error, match", [
    ("{}", ValueError, "the key 'config' is missing"),
    ("[]", ValueError, "must hold a JSON object"),
    ("not json", ValueError, "text is not JSON"),
    (5, TypeError, "text must be a RunResult's JSON"),
    ('{"config": {}}', ValueError, "no 'framework' key"),
    ('{"config": {"framework": "torch"}, "colour": 1}', ValueError, r"keys a RunResult does not: \['colour'\]"),
    ('{"config": {"framework": "torch"}, "status": "great"}', ValueError, "unknown status 'great'"),
    ('{"config": {"framework": "torch"}, "losses": 3}', ValueError, "'losses' must be a list"),
])
def test_from_json_says_what_is_missing_or_wrong(text, error, match):
    with pytest.raises(error, match=match):
        RunResult.from_json(text)


# -- out: checked, opened and headed before the model is built ---------------------------------------
def test_the_header_is_on_disk_before_the_model_is_built(tmp_path):
    seen = []

    def make(config, data):  # a run killed here, while its model is built, leaves this log
        seen.append(RunResult.load(config.out))
        return Counting(config, data)

    train(tiny(tmp_path), make)
    assert seen[0].status == "interrupted" and seen[0].steps_done == 0 and seen[0].config == tiny(tmp_path)


@pytest.mark.parametrize("out, error", [("/dev/null/x.jsonl", ValueError), ("/dev/null/sub/x.jsonl", ValueError),
                                        (".", ValueError)])
def test_a_bad_out_is_refused_before_the_model_is_built(tmp_path, out, error):
    built = []
    config = RunConfig("torch", steps=2, progress=False, out=out)
    with pytest.raises(error, match=f"out '{out}'"):
        train(config, lambda c, d: built.append(1) or Counting(c, d))
    assert not built


@pytest.mark.parametrize("out, error, match", [(5, TypeError, "out must be None or a file path"),
                                               ("", ValueError, "out must be None or a non-empty file path"),
                                               (b"x.jsonl", TypeError, "out must be None or a file path")])
def test_an_out_that_is_no_path_is_refused_by_the_config(out, error, match):
    with pytest.raises(error, match=match):
        RunConfig("torch", out=out)


def test_a_folder_that_cannot_be_written_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write into a read-only folder: there is nothing to refuse")
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(ValueError, match="cannot be written"):
        train(RunConfig("torch", steps=2, progress=False, out=str(folder / "x.jsonl")), Counting)


def test_missing_folders_are_made_and_a_path_object_is_kept_as_a_str(tmp_path):
    out = tmp_path / "new" / "sub" / "run.jsonl"
    config = RunConfig("torch", steps=2, progress=False, out=out)
    assert config.out == str(out)
    assert train(config, Counting).status == "ok" and RunResult.load(out).steps_done == 2


def test_a_config_the_stepper_refuses_leaves_no_log(tmp_path):
    def refuse(config, data):
        raise ValueError("device 'cuda' asked for, but there is none")

    with pytest.raises(ValueError, match="there is none"):
        train(tiny(tmp_path), refuse)
    assert not (tmp_path / "run.jsonl").exists()


def test_run_checks_out_before_it_imports_the_framework():
    code = textwrap.dedent("""
        import sys
        from labkit.train import RunConfig, run
        for devices in (1, 2):
            try:
                run(RunConfig("tf", steps=2, devices=devices, batch_size=8, out="/dev/null/x.jsonl"))
            except ValueError as exc:
                print("tensorflow" in sys.modules, exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == ["False out '/dev/null/x.jsonl': its folder '/dev/null' does not exist or "
                                       "is not a folder"] * 2, out.stderr


# -- a failing write never hides RunFailed --------------------------------------------------------------
def test_a_disk_that_is_full_from_the_start_raises_run_failed_before_any_model(tmp_path):
    built = []
    config = RunConfig("torch", steps=2, progress=False, out="/dev/full")
    with pytest.raises(RunFailed, match="before its first step: could not write the run log '/dev/full'") as info:
        train(config, lambda c, d: built.append(1) or Counting(c, d))
    assert not built and info.value.result.steps_done == 0 and info.value.result.status == "failed"
    assert "No space left on device" in info.value.result.error


def test_a_disk_that_fills_midway_raises_run_failed_with_every_step(tmp_path):
    path = tmp_path / "run.jsonl"
    with file_size_cap() as cap:
        def fill(n):
            if n == 5:
                cap(path.stat().st_size + 40)  # step 4's line (about 120 bytes) gets 40 through

        with pytest.raises(RunFailed, match=r"after 5 steps: could not write the run log .*File too large") as info:
            train(tiny(tmp_path), lambda c, d: Counting(c, d, on_step=fill))
    res = info.value.result
    assert res.status == "failed" and res.steps_done == 5 and "LogWriteFailed" in res.error
    assert path.read_text().endswith("}\n")  # the 40 bytes that got through were cut off again
    on_disk = RunResult.load(path)
    assert on_disk.status == "interrupted" and on_disk.losses == res.losses[:4]


def test_an_end_line_that_cannot_be_written_still_raises_run_failed(tmp_path):
    path = tmp_path / "run.jsonl"
    with file_size_cap() as cap:
        with pytest.raises(RunFailed, match="after 12 steps: could not write") as info:
            train(tiny(tmp_path), lambda c, d: Counting(c, d, on_evaluate=lambda: cap(path.stat().st_size)))
    res = info.value.result
    assert res.status == "failed" and res.steps_done == 12 and res.metric == {"name": "accuracy", "value": 0.5}
    assert RunResult.load(path).steps_done == 12


@pytest.mark.parametrize("stop", [RuntimeError("out of memory (pretend)"), KeyboardInterrupt()])
def test_a_failure_or_an_interrupt_on_a_full_disk_keeps_its_own_outcome(tmp_path, stop):
    path = tmp_path / "run.jsonl"

    def fill_then_stop(n):
        if n == 3:
            cap(path.stat().st_size)  # the end line will not fit
            raise stop

    with file_size_cap() as cap:
        run_it = lambda: train(tiny(tmp_path), lambda c, d: Counting(c, d, on_step=fill_then_stop))  # noqa: E731
        if isinstance(stop, KeyboardInterrupt):
            res = run_it()  # returned, not an OSError from the handler
            assert res.status == "interrupted"
        else:
            with pytest.raises(RunFailed, match="after 2 steps: out of memory") as info:
                run_it()
            res = info.value.result
            assert res.status == "failed" and res.error == "RuntimeError: out of memory (pretend)"
    assert res.steps_done == 2 and RunResult.load(path).status == "interrupted"
    assert RunResult.load(path).losses == res.losses


# -- the same with each framework's real runner, in a fresh process ------------------------------------------
FRAMEWORK_MODULE = {"torch": "torch", "jax": "jax", "tf": "tensorflow"}
CAP = 4096  # bytes: the header and start line, then some 20 step lines

FULL_DISK_RUN = textwrap.dedent("""
    import importlib.abc, json, resource, signal, sys
    from labkit.train import RunConfig, RunFailed, RunResult, run

    config = RunConfig.from_dict(json.loads(sys.argv[1]))
    module, cap = sys.argv[2], int(sys.argv[3])
    at_import = []

    class Probe(importlib.abc.MetaPathFinder):  # what the log says when the framework import begins
        def find_spec(self, name, path=None, target=None):
            if name == module and not at_import:
                at_import.append(RunResult.load(config.out).steps_done)
            return None

    sys.meta_path.insert(0, Probe())
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
    try:
        run(config)
        print(json.dumps({"raised": None}))
    except RunFailed as exc:
        r = exc.result
        print(json.dumps({"raised": "RunFailed", "message": str(exc), "status": r.status, "error": r.error,
                          "losses": r.losses, "at_import": at_import}))
""")


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_MODULE))
def test_a_full_disk_in_each_framework_raises_run_failed_and_the_log_loads(tmp_path, framework):
    module = FRAMEWORK_MODULE[framework]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    path = tmp_path / "run.jsonl"
    config = RunConfig(framework, width=8, batch_size=8, steps=200, device="cpu", progress=False, out=str(path))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, json.dumps(config.to_dict()), module, str(CAP)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["raised"] == "RunFailed" and got["status"] == "failed", got
    assert "could not write the run log" in got["message"] and "File too large" in got["error"]
    assert got["at_import"] == [0]  # the header was there before the framework was imported
    assert path.stat().st_size <= CAP and path.read_text().endswith("\n")
    on_disk = RunResult.load(path)
    assert on_disk.status == "interrupted" and on_disk.device.startswith("cpu")
    assert 1 <= on_disk.steps_done == len(got["losses"]) - 1  # the step whose line did not fit is in memory
    assert on_disk.losses == got["losses"][:-1] and all(math.isfinite(x) for x in on_disk.losses)


# -- RunConfig: numbers a run cannot use are refused up front -----------------------------------------------
@pytest.mark.parametrize("field", ["lr", "clip_norm", "init_scale"])
@pytest.mark.parametrize("value, error", [pytest.param(10**400, ValueError, id="10**400"), (math.nan, ValueError),
                                          (math.inf, ValueError),
                                          (-1e-3, ValueError), (0, ValueError), (1e39, ValueError),
                                          (True, TypeError), ("1e-3", TypeError), ([1e-3], TypeError)])
def test_numbers_a_framework_cannot_hold_are_refused(field, value, error):
    with pytest.raises(error, match=f"^{field} must be a"):
        RunConfig("tf", "fp16", **{field: value})


@pytest.mark.parametrize("field", ["steps", "batch_size", "devices", "width", "seed"])
@pytest.mark.parametrize("value, error", [(True, TypeError), (2.5, TypeError), (4.0, TypeError), ("8", TypeError),
                                          (None, TypeError), (-1, ValueError),
                                          pytest.param(-(10**400), ValueError, id="-10**400")])
def test_counts_must_be_whole_numbers_in_range(field, value, error):
    if field == "width" and value is None:
        assert RunConfig("torch", width=None).width is None  # the model's default width
        return
    with pytest.raises(error, match=f"^{field} must be an integer"):
        RunConfig("torch", **{field: value})


@pytest.mark.parametrize("field, low, high", [("steps", 1, None), ("batch_size", 1, 2**20), ("devices", 1, None),
                                              ("width", 1, 2**16), ("seed", 0, None)])
def test_counts_have_their_bounds(field, low, high):
    with pytest.raises(ValueError, match=f"^{field} must be an integer (>= {low}|from {low} to {high})"):
        RunConfig("torch", **{field: low - 1})
    if high is not None:
        with pytest.raises(ValueError, match=f"^{field} must be an integer from {low} to {high}; got an integer of"):
            RunConfig("torch", **{field: 10**400})


def test_numpy_numbers_are_stored_as_python_ones_so_the_log_is_json():
    np = pytest.importorskip("numpy")
    cfg = RunConfig("torch", steps=np.int64(5), batch_size=np.int32(8), lr=np.float32(0.5), seed=np.uint8(3))
    assert json.loads(json.dumps(cfg.to_dict()))["steps"] == 5 and type(cfg.lr) is float and cfg.lr == 0.5


@pytest.mark.parametrize("value, error, match", [
    (5, TypeError, r"inject_overflow must be a list of step numbers \(0-based\), e.g. \(3,\)"),
    ("12", TypeError, "inject_overflow must be a list of step numbers"),
    ({1: 2}, TypeError, "inject_overflow must be a list of step numbers"),
    ([1.0], TypeError, "inject_overflow step must be an integer"),
    ([True], TypeError, "inject_overflow step must be an integer"),
    ([-1], ValueError, "inject_overflow step must be an integer from 0 to 9"),
    ([10], ValueError, "inject_overflow step must be an integer from 0 to 9"),
])
def test_inject_overflow_says_what_is_allowed(value, error, match):
    with pytest.raises(error, match=match):
        RunConfig("torch", "fp16", steps=10, inject_overflow=value)


def test_inject_overflow_takes_any_list_of_steps():
    assert RunConfig("torch", "fp16", steps=10, inject_overflow=range(2, 4)).inject_overflow == (2, 3)
    assert RunConfig("torch", "fp16", steps=10, inject_overflow=[7]).inject_overflow == (7,)


@pytest.mark.parametrize("changes, error, match", [
    (dict(framework=None), TypeError, "framework must be one of 'torch', 'jax', 'tf'"),
    (dict(model="transformer", width=6), ValueError, "width must be a multiple of 4"),
    (dict(progress="no"), TypeError, "progress must be True or False"),
    (dict(reduce_dtype="fp8"), ValueError, "unknown reduce_dtype 'fp8'"),
    (dict(batch_size=10, devices=3), ValueError, "batch_size 10 must divide evenly over 3 devices"),
])
def test_the_other_fields_say_what_is_allowed(changes, error, match):
    with pytest.raises(error, match=match):
        RunConfig(**{"framework": "torch", **changes})


def test_a_result_checks_its_config_status_and_skip_first():
    with pytest.raises(TypeError, match="config must be a RunConfig"):
        RunResult(config={"framework": "torch"})
    with pytest.raises(ValueError, match="unknown status 'great'; choose one of 'ok'"):
        RunResult(config=RunConfig("torch"), status="great")
    with pytest.raises(ValueError, match="skip_first must be an integer >= 0"):
        RunResult(config=RunConfig("torch"), step_times=[1.0]).median_step_time(-1)


def test_from_dict_names_what_is_missing():
    with pytest.raises(ValueError, match="no 'framework' key"):
        RunConfig.from_dict({})
    with pytest.raises(TypeError, match="takes a dict of fields"):
        RunConfig.from_dict(["torch"])


def test_the_extra_end_line_of_a_distributed_run_is_all_or_nothing(tmp_path):
    """The second end line (a distributed run's extras) under a file-size limit: the file keeps its
    complete lines and the write is a LogWriteFailed naming the log."""
    from labkit.train.result import LogWriteFailed, append_end_line

    path = tmp_path / "run.jsonl"
    path.write_text('{"kind": "header"}\n')
    size = path.stat().st_size
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, old_limit[1]))
    try:
        with pytest.raises(LogWriteFailed, match="could not write the run log"):
            append_end_line(path, "ok", {"comm_bytes_per_step": 123456789})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.read_text() == '{"kind": "header"}\n'
    append_end_line(path, "ok", {"x": 1})
    assert json.loads(path.read_text().splitlines()[-1]) == {"kind": "end", "status": "ok", "extra": {"x": 1}}
