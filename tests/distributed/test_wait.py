"""labkit.train.launch: waiting for a run's subprocess shows the progress the config asks for."""

import subprocess
import sys

import pytest

from labkit.train import launch as _wait
from labkit.train import RunConfig

WRITER = """
import json, sys, time
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"kind": "header"}) + "\\n")
    for i in range(3):
        time.sleep(0.7)
        f.write(json.dumps({"kind": "step", "step": i}) + "\\n"); f.flush()
print("done")
"""


def launch(out, code=WRITER):
    return subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_bar_follows_the_steps_the_subprocess_logs(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    stdout, _ = _wait.wait(launch(out), RunConfig("torch", steps=3, progress=True), out)
    assert stdout.strip() == "done" and _wait.steps_logged(out) == 3
    err = capsys.readouterr().err
    assert "torch fp32 mlp" in err and "3/3" in err


def test_no_bar_when_progress_is_off_and_a_timeout_is_raised_for_the_caller_to_stop(tmp_path, capsys):
    out = tmp_path / "run.jsonl"
    proc = launch(out, "import time; time.sleep(30)")
    with pytest.raises(subprocess.TimeoutExpired):
        _wait.wait(proc, RunConfig("torch", steps=3, progress=False), out, timeout_s=0.5)
    _wait.stop(proc)
    assert proc.returncode is not None and capsys.readouterr().err == ""
    assert _wait.steps_logged(tmp_path / "missing.jsonl") == 0
