"""What only the PyTorch runner does: real torch on the CPU, no mocks.

What every runner does (forward pass against the float64 reference, every precision, loss
scaling, pure bf16, divergence, Adam's memory, refusals) is tested once for all three
frameworks in test_runners.py, with the tiny configs of conftest.py. Each test here trains
for real, so each one stays at a fraction of a second on two shared cores.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from labkit.train import RunResult, run
from labkit.train import data as D
from labkit.train import models as M
from labkit.train.torch.models import build


@pytest.fixture
def framework():
    return "torch"


def inputs(model, x):
    return torch.from_numpy(D.Dataset.tokens(x)).long() if model == "transformer" else torch.from_numpy(x)


# -- the models ------------------------------------------------------------------------
class _SoftmaxDtypes(torch.overrides.TorchFunctionMode):
    """Records the dtype of every softmax's input and output (a real torch function mode)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax):
            self.seen.append((args[0].dtype, out.dtype))
        return out


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure"])
def test_the_transformers_softmax_runs_in_fp32_and_is_cast_back(precision):
    # CPU autocast would run softmax in bf16 (CUDA's keeps it in fp32): the model forces fp32,
    # as the JAX and Keras transformers do, so the three frameworks train the same model
    params = M.init_params("transformer", seed=0, width=16)
    net = build("transformer", params)
    x = inputs("transformer", D.load("digits", seed=0).x_test[:4])
    with torch.no_grad(), _SoftmaxDtypes() as mode:
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                net(x)
        else:
            net.to(torch.bfloat16)(x)
    assert mode.seen and all(seen == (torch.float32, torch.float32) for seen in mode.seen)


def test_build_refuses_params_of_another_shape_or_name():
    params = M.init_params("mlp", seed=0, width=8)
    with pytest.raises(ValueError, match="has shape"):
        build("mlp", {**params, "out/bias": np.zeros(11, np.float32)})
    with pytest.raises(ValueError, match="unexpected"):
        build("mlp", {**params, "extra/bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="choose one of mlp, transformer"):
        build("resnet", params)


# -- memory -----------------------------------------------------------------------------
def test_memory_counts_autocasts_fp32_masters_its_activations_and_its_weight_copies(tiny):
    # the weights and Adam's state in fp32 and pure bf16: test_runners.py
    w = 64
    mem = {p: run(tiny(precision=p, width=w, batch_size=256, steps=1)).memory for p in ("fp32", "bf16", "bf16-pure")}
    n = M.count_params(M.init_params("mlp", width=w))
    assert mem["fp32"]["parameter_bytes"] == mem["bf16"]["parameter_bytes"] == 4 * n  # autocast: fp32 masters
    assert mem["bf16"]["optimizer_state_bytes"] == mem["fp32"]["optimizer_state_bytes"]
    # activations: fp32 in fp32; bf16 (half) under autocast and in pure bf16
    assert mem["bf16"]["saved_activation_bytes"] < 0.6 * mem["fp32"]["saved_activation_bytes"]
    # autocast keeps bf16 copies of the weights whose input needs a gradient: dense2, out
    assert mem["bf16"]["saved_weight_copy_bytes"] == 2 * (w * w + w * 10)
    assert mem["fp32"]["saved_weight_copy_bytes"] == mem["bf16-pure"]["saved_weight_copy_bytes"] == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_measured_mlp_activations_match_labkit_memorys_model(precision, tiny):
    from labkit import memory

    res = run(tiny(precision=precision, width=48, batch_size=24, steps=1))
    modelled = memory.activation_bytes("mlp", 24, precision, width=48)
    # the one 4-byte extra is the 0-d float32 total weight that nll_loss saves
    assert res.memory["saved_activation_bytes"] == modelled + 4


# -- global state -----------------------------------------------------------------------
def test_a_run_restores_the_global_flags_it_changes(tiny):
    old = torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()
    rng = torch.get_rng_state()
    try:
        torch.set_float32_matmul_precision("medium")
        torch.use_deterministic_algorithms(False)
        for precision in ("fp32", "tf32", "bf16"):
            run(tiny(precision=precision, steps=1))
            assert torch.get_float32_matmul_precision() == "medium"
            assert not torch.are_deterministic_algorithms_enabled()
            assert not torch.is_autocast_enabled("cpu")
        assert torch.equal(torch.get_rng_state(), rng)  # a run draws nothing from torch's RNG
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.use_deterministic_algorithms(old[1])


def test_a_run_keeps_a_learners_per_backend_tf32_setting(tmp_path):
    # torch refuses to read the old API once the new one is used, so this runs apart
    script = textwrap.dedent("""
        import torch
        from labkit.train import RunConfig, run
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        res = run(RunConfig("torch", "fp32", width=8, batch_size=4, steps=2, progress=False))
        print(res.status, torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)
    """)
    out = subprocess.run([sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "tf32", "none"]


# -- bad configs ------------------------------------------------------------------------
@pytest.mark.skipif(bool(__import__("importlib").util.find_spec("torch_xla")), reason="torch_xla is installed")
def test_tpu_without_torch_xla_is_refused(tiny):
    with pytest.raises(ValueError, match="needs torch_xla"):
        run(tiny(device="tpu"))


# -- a killed run keeps its finished steps ----------------------------------------------
def test_a_run_killed_midway_leaves_its_finished_steps_on_disk(tmp_path):
    path = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        from labkit.train import RunConfig, run
        run(RunConfig("torch", "bf16", width=16, batch_size=8, steps=1_000_000, progress=False, out={str(path)!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if path.exists() and path.read_text().count('"kind": "step"') >= 5:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the run wrote no steps in 120 s")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [rec for rec in lines if rec["kind"] == "step"]
    res = RunResult.load(path)
    assert res.status == "interrupted" and res.steps_done == len(steps) >= 5
    assert res.losses == [rec["loss"] for rec in steps] and res.device.startswith("cpu (")
