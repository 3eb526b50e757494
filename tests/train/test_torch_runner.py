"""The PyTorch runner: real torch on the CPU, no mocks.

Small models and few steps: every test here trains for real, so each one stays at a
fraction of a second on two shared cores (the fp16 ones are slower on a CPU without
AVX512-FP16 or AMX-FP16: torch then converts).
"""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from labkit.train import RunConfig, RunResult, run
from labkit.train import data as D
from labkit.train import models as M
from labkit.train.torch.models import build, torch_name
from labkit.train.torch.stepper import make_stepper

TINY = dict(framework="torch", width=32, batch_size=16, progress=False)
TINY_TRANSFORMER = dict(TINY, model="transformer", width=16, batch_size=4)


def tiny(**changes) -> RunConfig:
    base = TINY_TRANSFORMER if changes.get("model") == "transformer" else TINY
    return RunConfig(**{**base, **changes})


def inputs(model, x):
    return torch.from_numpy(D.Dataset.tokens(x)).long() if model == "transformer" else torch.from_numpy(x)


# -- the models ------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_fp32_forward_at_init_matches_the_float64_reference(model):
    params = M.init_params(model, seed=1, width=16 if model == "transformer" else 32)
    x = D.load("digits", seed=0).x_test[:24]
    with torch.no_grad():
        got = build(model, params)(inputs(model, x)).double().numpy()
    np.testing.assert_allclose(got, M.reference_logits(model, params, x), rtol=0, atol=1e-5)


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


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_every_init_param_lands_in_its_module_parameter(model):
    params = M.init_params(model, seed=0)
    net = build(model, params)
    own = dict(net.named_parameters())
    assert len(own) == len(params)
    for name, value in params.items():
        expected = value.T if name.endswith("/kernel") else value
        np.testing.assert_array_equal(own[torch_name(name)].detach().numpy(), expected)


def test_build_refuses_params_of_another_shape_or_name():
    params = M.init_params("mlp", seed=0, width=8)
    with pytest.raises(ValueError, match="has shape"):
        build("mlp", {**params, "out/bias": np.zeros(11, np.float32)})
    with pytest.raises(ValueError, match="unexpected"):
        build("mlp", {**params, "extra/bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="choose one of mlp, transformer"):
        build("resnet", params)


# -- every precision, both models ------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16", "bf16-pure"])
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_every_precision_trains_a_few_real_steps(model, precision):
    res = run(tiny(model=model, precision=precision, steps=3))
    assert res.status == "ok" and res.steps_done == 3
    assert all(math.isfinite(v) for v in res.losses + res.step_times)
    assert 0.0 <= res.metric["value"] <= 1.0 and res.device.startswith("cpu (")
    if precision == "fp16":
        # GradScaler starts at 2**16 and may overflow while it calibrates (the transformer's
        # first scaled gradients exceed 65504): such a step is skipped and the scale halves
        assert res.scales[0] == 2.0**16
        for i in range(2):
            assert res.scales[i + 1] == res.scales[i] * (0.5 if res.skipped[i] else 1.0)
        assert [not math.isfinite(g) for g in res.grad_norms] == res.skipped
    else:
        assert res.scales == [] and res.skipped == [False] * 3
        assert all(math.isfinite(g) for g in res.grad_norms)
    weights = {"bf16-pure": 2}.get(precision, 4)  # bytes per parameter as stored
    n = M.count_params(M.init_params(model, width=res.config.width))
    assert res.memory["parameter_bytes"] == weights * n == res.memory["gradient_bytes"]


def test_the_same_config_gives_the_same_losses():
    for precision in ("fp32", "bf16", "fp16"):
        cfg = tiny(precision=precision, steps=8, inject_overflow=(3,) if precision == "fp16" else ())
        a, b = run(cfg), run(cfg)
        assert a.losses == b.losses and a.grad_norms == b.grad_norms and a.scales == b.scales


def test_tf32_changes_nothing_on_a_cpu():
    # "high" lets CUDA use TF32; a CPU has no TF32, so the run is fp32 bit for bit
    assert run(tiny(precision="tf32", steps=5)).losses == run(tiny(precision="fp32", steps=5)).losses


def test_bf16_trains_to_nearly_the_fp32_loss():
    cfg = RunConfig("torch", steps=60, progress=False)  # the default MLP, width 256
    fp32, bf16 = run(cfg), run(cfg.replace(precision="bf16"))
    late32, late16 = np.mean(fp32.losses[-10:]), np.mean(bf16.losses[-10:])
    assert late32 < 0.5 * fp32.losses[0]  # it learned
    assert abs(late16 - late32) < 0.02 * late32
    assert bf16.losses != fp32.losses  # and bf16 really computed in bf16
    assert abs(bf16.metric["value"] - fp32.metric["value"]) <= 0.02


def test_grad_norm_is_the_unscaled_norm_before_clipping():
    cfg = tiny(precision="fp16", steps=1, clip_norm=1e-3, optimizer="sgd", lr=0.1)
    res = run(cfg)
    data = D.load("digits", seed=cfg.seed)
    x, y = next(D.batches(data, cfg.batch_size, seed=cfg.seed))
    net = build("mlp", M.init_params("mlp", seed=cfg.seed, width=cfg.width))
    torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y).long()).backward()
    expected = float(torch.nn.utils.get_total_norm([p.grad for p in net.parameters()]))
    assert expected > 100 * cfg.clip_norm  # so clipping did something
    assert res.grad_norms[0] == pytest.approx(expected, rel=2e-2)  # fp16 forward, fp32 reference


# -- fp16: GradScaler skips a step with an inf gradient and backs off -------------------
def test_fp16_skips_the_overflowed_steps_and_halves_the_scale():
    res = run(tiny(precision="fp16", steps=8, inject_overflow=(2, 3, 6), init_scale=2.0**10))
    assert res.skipped == [False, False, True, True, False, False, True, False]
    assert res.scales == [1024.0, 1024.0, 1024.0, 512.0, 256.0, 256.0, 256.0, 128.0]
    assert [math.isinf(g) or math.isnan(g) for g in res.grad_norms] == res.skipped
    assert res.status == "ok" and all(math.isfinite(v) for v in res.losses)


def test_a_skipped_step_leaves_the_weights_alone():
    cfg = tiny(precision="fp16", steps=3, inject_overflow=(1,))
    data = D.load("digits", seed=0)
    feed = D.batches(data, cfg.batch_size, seed=0)
    stepper = make_stepper(cfg, data)
    snapshots = []
    for i in range(3):
        x, y = next(feed)
        before = [p.detach().clone() for p in stepper.model.parameters()]
        out = stepper.step(x, y, inject_overflow=i == 1)
        snapshots.append(all(torch.equal(a, b) for a, b in zip(before, stepper.model.parameters())))
        assert out.skipped is (i == 1)
    assert snapshots == [False, True, False]


# -- pure bf16: small updates are rounded away ------------------------------------------
def test_pure_bf16_rounds_small_updates_away_where_fp32_master_weights_keep_them():
    changed = {}
    for precision in ("bf16", "bf16-pure"):
        cfg = tiny(precision=precision, steps=1, optimizer="sgd", lr=1e-4, clip_norm=None)
        data = D.load("digits", seed=0)
        stepper = make_stepper(cfg, data)
        w = stepper.model.dense2.weight
        before = w.detach().clone()
        stepper.step(*next(D.batches(data, cfg.batch_size, seed=0)), inject_overflow=False)
        assert w.grad.abs().gt(0).float().mean() > 0.5  # most weights got a gradient
        changed[precision] = float((w.detach() != before).float().mean())
        assert w.dtype == (torch.bfloat16 if precision == "bf16-pure" else torch.float32)
    assert changed["bf16"] > 0.5 and changed["bf16-pure"] < 0.05


# -- divergence -------------------------------------------------------------------------
def test_an_fp16_overflow_in_the_forward_pass_stops_the_run_and_names_the_layer():
    cfg = RunConfig("torch", "fp16", optimizer="sgd", lr=5.0, clip_norm=None, steps=40, progress=False)
    res = run(cfg)
    assert res.status == "diverged" and res.diverged_step == res.steps_done - 1 < 40
    assert not math.isfinite(res.losses[-1]) and all(math.isfinite(v) for v in res.losses[:-1])
    module = res.diverged_where.split(" ")[0]
    assert module in dict(build("mlp", M.init_params("mlp")).named_modules())
    assert "output" in res.diverged_where and res.metric is None
    # the same run in fp32 stays finite: the overflow is fp16's 65504 limit
    assert run(cfg.replace(precision="fp32")).status == "ok"


def test_a_healthy_run_names_no_nonfinite_layer():
    cfg = tiny(steps=2)
    data = D.load("digits", seed=0)
    stepper = make_stepper(cfg, data)
    stepper.step(*next(D.batches(data, cfg.batch_size)), inject_overflow=False)
    assert stepper.nonfinite_layer() is None


# -- memory -----------------------------------------------------------------------------
def test_memory_is_counted_from_the_real_tensors():
    w = 64
    mem = {p: run(tiny(precision=p, width=w, batch_size=256, steps=1)).memory for p in ("fp32", "bf16", "bf16-pure")}
    n = M.count_params(M.init_params("mlp", width=w))
    adam_steps = 4 * 6  # one float32 "step" counter per parameter tensor
    assert mem["fp32"]["parameter_bytes"] == mem["bf16"]["parameter_bytes"] == 4 * n  # autocast: fp32 masters
    assert mem["bf16-pure"]["parameter_bytes"] == 2 * n
    assert mem["fp32"]["optimizer_state_bytes"] == 8 * n + adam_steps  # exp_avg + exp_avg_sq
    assert mem["bf16-pure"]["optimizer_state_bytes"] == 4 * n + adam_steps
    # activations: fp32 in fp32; bf16 (half) under autocast and in pure bf16
    assert mem["bf16"]["saved_activation_bytes"] < 0.6 * mem["fp32"]["saved_activation_bytes"]
    # autocast keeps bf16 copies of the weights whose input needs a gradient: dense2, out
    assert mem["bf16"]["saved_weight_copy_bytes"] == 2 * (w * w + w * 10)
    assert mem["fp32"]["saved_weight_copy_bytes"] == mem["bf16-pure"]["saved_weight_copy_bytes"] == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_measured_mlp_activations_match_labkit_memorys_model(precision):
    from labkit import memory

    res = run(tiny(precision=precision, width=48, batch_size=24, steps=1))
    modelled = memory.activation_bytes("mlp", 24, precision, width=48)
    # the one 4-byte extra is the 0-d float32 total weight that nll_loss saves
    assert res.memory["saved_activation_bytes"] == modelled + 4


def test_sgd_keeps_no_optimizer_state():
    assert run(tiny(optimizer="sgd", steps=1)).memory["optimizer_state_bytes"] == 0


# -- global state -----------------------------------------------------------------------
def test_a_run_restores_the_global_flags_it_changes():
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
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_cuda_without_cuda_is_refused_before_any_work(device, tmp_path):
    out = tmp_path / "run.jsonl"
    with pytest.raises(ValueError, match="torch.cuda.is_available\\(\\) is False"):
        run(tiny(device=device, out=str(out)))
    assert not out.exists()


@pytest.mark.skipif(bool(__import__("importlib").util.find_spec("torch_xla")), reason="torch_xla is installed")
def test_tpu_without_torch_xla_is_refused():
    with pytest.raises(ValueError, match="needs torch_xla"):
        run(tiny(device="tpu"))


def test_the_runner_refuses_another_frameworks_config():
    with pytest.raises(ValueError, match="framework='torch'"):
        make_stepper(RunConfig("jax", steps=1), D.load("digits"))
    with pytest.raises(TypeError, match="RunConfig"):
        make_stepper({"framework": "torch"}, D.load("digits"))


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
