"""The framework-independent parts of labkit.train: config, results on disk, data, models, loop.

The loop is exercised here with a small numpy softmax-regression Stepper (a real, if tiny,
trainer); each framework's own Stepper is tested in its test module.
"""

import json
import math

import numpy as np
import pytest

from labkit.memory import MemoryReport
from labkit.train import RunConfig, RunFailed, RunResult, StepOut, run
from labkit.train import data as D
from labkit.train import models as M
from labkit.train.loop import train, train_in_turns


# -- config ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, exc, match",
    [
        (dict(framework="mxnet"), ValueError, "choose one of 'torch', 'jax', 'tf'"),
        (dict(precision="fp8"), ValueError, "choose one of 'fp32', 'tf32', 'fp16', 'bf16', 'bf16-pure'"),
        (dict(model="resnet"), ValueError, "choose one of 'mlp', 'transformer'"),
        (dict(dataset="mnist"), ValueError, "choose one of 'digits', 'synthetic'"),
        (dict(device="npu"), ValueError, "choose one of 'auto', 'cpu'"),
        (dict(steps=0), ValueError, "steps must be an integer >= 1"),
        (dict(steps=2.5), TypeError, "steps must be an integer"),
        (dict(batch_size=-4), ValueError, "batch_size must be an integer from 1 to 1048576"),
        (dict(lr=0.0), ValueError, "lr must be a finite number > 0"),
        (dict(lr="1e-3"), TypeError, "lr must be a number"),
        (dict(clip_norm=math.inf), ValueError, "clip_norm must be a finite number"),
        (dict(seed=-1), ValueError, "seed must be an integer >= 0"),
        (dict(precision="fp16", inject_overflow=[99]), ValueError, "inject_overflow step must be an integer from 0 to 9"),
        (dict(precision="bf16", inject_overflow=[2]), ValueError, "needs precision='fp16'"),
    ],
)
def test_bad_configs_are_refused_with_the_allowed_values(changes, exc, match):
    base = dict(framework="torch", steps=10)
    with pytest.raises(exc, match=match):
        RunConfig(**{**base, **changes})


def test_config_round_trips_through_a_dict():
    cfg = RunConfig("jax", "fp16", model="transformer", steps=7, inject_overflow=[1, 3], clip_norm=None)
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.replace(precision="bf16", inject_overflow=()) == RunConfig(
        "jax", "bf16", model="transformer", steps=7, clip_norm=None)  # the other fields kept
    with pytest.raises(ValueError, match="needs precision='fp16'"):
        cfg.replace(precision="bf16")  # checked again: bf16 has no scaler to skip steps
    with pytest.raises(ValueError, match="unknown RunConfig fields"):
        RunConfig.from_dict({**cfg.to_dict(), "colour": "red"})


def test_run_refuses_what_is_not_a_config():
    with pytest.raises(TypeError, match="run\\(\\) takes a RunConfig"):
        run({"framework": "torch"})


# -- data --------------------------------------------------------------------------------
def test_digits_are_split_reproducibly_and_scaled_to_unit_range():
    a, b = D.load("digits", seed=3), D.load("digits", seed=3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape == (1438, 64) and a.x_test.shape == (359, 64)
    assert a.x_train.min() == 0.0 and a.x_train.max() == 1.0
    assert not np.array_equal(a.y_train, D.load("digits", seed=4).y_train)
    assert set(np.unique(D.Dataset.tokens(a.x_train))) <= set(range(D.PIXEL_LEVELS))


def test_batches_cover_an_epoch_before_repeating():
    data = D.load("synthetic")  # random rows: all distinct
    feed = D.batches(data, batch_size=100, seed=0)
    epoch = np.concatenate([next(feed)[0] for _ in range(len(data.x_train) // 100)])
    assert len(np.unique(epoch, axis=0)) == len(epoch) == 1600
    first = next(D.batches(data, batch_size=100, seed=0))[0]
    np.testing.assert_array_equal(first, next(D.batches(data, batch_size=100, seed=0))[0])
    big = next(D.batches(data, batch_size=5000, seed=0))
    assert big[0].shape == (5000, 64)


def test_unknown_dataset_and_bad_batch_size():
    with pytest.raises(ValueError, match="digits, synthetic"):
        D.load("cifar")
    with pytest.raises(ValueError, match="batch_size"):
        next(D.batches(D.load("synthetic"), 0))


# -- models ------------------------------------------------------------------------------
def test_params_are_seeded_float32_and_shaped_fan_in_fan_out():
    p = M.init_params("mlp", seed=1, width=32)
    q = M.init_params("mlp", seed=1, width=32)
    assert all(np.array_equal(p[k], q[k]) and p[k].dtype == np.float32 for k in p)
    assert not np.array_equal(p["dense1/kernel"], M.init_params("mlp", seed=2, width=32)["dense1/kernel"])
    assert p["dense1/kernel"].shape == (64, 32) and p["out/kernel"].shape == (32, 10)
    t = M.init_params("transformer", seed=0)
    assert t["embed/embedding"].shape == (17, 64) and t["block1/mlp/fc1/kernel"].shape == (64, 256)
    assert M.count_params(p) == (64 * 32 + 32) + (32 * 32 + 32) + (32 * 10 + 10)


def test_reference_forward_is_permutation_invariant_over_batches_and_sane():
    data = D.load("digits")
    for model in ("mlp", "transformer"):
        p = M.init_params(model, seed=0)
        logits = M.reference_logits(model, p, data.x_test[:8])
        assert logits.shape == (8, 10) and np.all(np.isfinite(logits))
        np.testing.assert_allclose(M.reference_logits(model, p, data.x_test[:8][::-1]), logits[::-1], rtol=1e-12)


def test_transformer_attends_to_the_pixels():
    # Changing one pixel changes the logits: the tokens really reach the head.
    p = M.init_params("transformer", seed=0)
    x = D.load("digits").x_test[:1].copy()
    before = M.reference_logits("transformer", p, x)
    x[0, 27] = 1.0 - x[0, 27]
    assert not np.allclose(before, M.reference_logits("transformer", p, x))


def test_bad_model_names_and_widths():
    with pytest.raises(ValueError, match="choose one of 'mlp', 'transformer'"):
        M.init_params("cnn")
    with pytest.raises(ValueError, match="multiple of 4"):
        M.init_params("transformer", width=30)


# -- the loop, with a small numpy trainer ---------------------------------------------------
class SoftmaxRegression:
    """Plain numpy softmax regression: a real trainer that needs no framework."""

    device = "cpu (numpy)"

    def __init__(self, config, data, blow_up_at=None, fail_at=None):
        self.w = np.zeros((64, 10))
        self.lr, self.n, self.blow_up_at, self.fail_at = config.lr, 0, blow_up_at, fail_at

    def _probs(self, x):
        z = x @ self.w
        z = np.exp(z - z.max(1, keepdims=True))
        return z / z.sum(1, keepdims=True)

    def step(self, x, y, inject_overflow):
        if self.n == self.fail_at:
            raise RuntimeError("out of memory (pretend)")
        p = self._probs(x)
        loss = -np.log(p[np.arange(len(y)), y]).mean()
        if self.n == self.blow_up_at:
            loss = math.inf
        p[np.arange(len(y)), y] -= 1
        g = x.T @ p / len(y)
        self.w -= self.lr * g
        self.n += 1
        return StepOut(loss=float(loss), grad_norm=float(np.linalg.norm(g)))

    def evaluate(self, x, y):
        return float((self._probs(x).argmax(1) == y).mean())

    def nonfinite_layer(self):
        return "w"

    def memory(self):
        return MemoryReport("torch", parameter_bytes=self.w.nbytes)  # the framework name only picks log keys


def cfg(tmp_path, **kw):
    return RunConfig("torch", steps=kw.pop("steps", 30), lr=0.5, progress=False, out=str(tmp_path / "run.jsonl"), **kw)


def test_loop_trains_records_and_writes_every_step(tmp_path):
    res = train(cfg(tmp_path), SoftmaxRegression)
    assert res.status == "ok" and res.steps_done == 30
    assert res.losses[-1] < res.losses[0] and res.metric["value"] > 0.8
    assert res.memory == {"parameter_bytes": 64 * 10 * 8}
    again = RunResult.load(tmp_path / "run.jsonl")
    assert again.losses == res.losses and again.status == "ok" and again.metric == res.metric


def test_loop_is_reproducible(tmp_path):
    assert train(cfg(tmp_path), SoftmaxRegression).losses == train(cfg(tmp_path), SoftmaxRegression).losses


def test_a_non_finite_loss_stops_the_run_as_diverged(tmp_path):
    res = train(cfg(tmp_path), lambda c, d: SoftmaxRegression(c, d, blow_up_at=5))
    assert res.status == "diverged" and res.diverged_step == 5 and res.diverged_where == "w"
    assert res.steps_done == 6 and math.isinf(res.losses[-1])
    on_disk = RunResult.load(tmp_path / "run.jsonl")
    assert on_disk.status == "diverged" and math.isinf(on_disk.losses[-1])


def test_a_failing_run_keeps_what_it_recorded(tmp_path):
    with pytest.raises(RunFailed, match="after 4 steps") as info:
        train(cfg(tmp_path), lambda c, d: SoftmaxRegression(c, d, fail_at=4))
    assert info.value.result.steps_done == 4 and info.value.result.status == "failed"
    on_disk = RunResult.load(tmp_path / "run.jsonl")
    assert on_disk.steps_done == 4 and "out of memory" in on_disk.error


def test_a_log_cut_short_loads_as_interrupted(tmp_path):
    train(cfg(tmp_path), SoftmaxRegression)
    path = tmp_path / "run.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:12]) + "\n")  # header, start + 10 steps, no end line
    res = RunResult.load(path)
    assert res.status == "interrupted" and res.steps_done == 10


def test_result_json_round_trip_keeps_infinities(tmp_path):
    res = train(cfg(tmp_path), lambda c, d: SoftmaxRegression(c, d, blow_up_at=2))
    back = RunResult.from_json(res.to_json())
    assert back.losses[:2] == res.losses[:2] and math.isinf(back.losses[2]) and back.config == res.config
    assert "diverged at step 2" in back.summary()


def test_load_refuses_a_file_that_is_not_a_run_log(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"kind": "step"}\n')
    with pytest.raises(ValueError, match="not a labkit run log"):
        RunResult.load(tmp_path / "x.jsonl")


def test_median_step_time_skips_the_warm_up():
    r = RunResult(config=RunConfig("torch"), step_times=[9.0, 1.0, 3.0, 2.0])
    assert r.median_step_time() == 2.0 and r.median_step_time(skip_first=0) == 2.5


def test_best_step_time_is_the_fastest_step_after_the_warm_up():
    r = RunResult(config=RunConfig("torch"), step_times=[0.5, 1.0, 3.0, 2.0])
    assert r.best_step_time() == 1.0 and r.best_step_time(skip_first=0) == 0.5
    assert RunResult(config=RunConfig("torch"), step_times=[4.0]).best_step_time() == 4.0  # one step: that one
    assert math.isnan(RunResult(config=RunConfig("torch")).best_step_time())


# -- several runs in turns --------------------------------------------------------------------
class Clocked(SoftmaxRegression):
    """Writes each step it takes into a shared list, to show the order the runs took turns in."""

    order: list = []

    def __init__(self, config, data, **kw):
        super().__init__(config, data, **kw)
        self.name = config.lr

    def step(self, x, y, inject_overflow):
        Clocked.order.append(self.name)
        return super().step(x, y, inject_overflow)


def turns_cfg(tmp_path, name, **kw):
    return RunConfig("torch", steps=kw.pop("steps", 6), lr=kw.pop("lr", 0.5), progress=False,
                     out=str(tmp_path / f"{name}.jsonl"), **kw)


def test_runs_in_turns_take_one_step_each_and_keep_their_own_losses(tmp_path):
    Clocked.order = []
    configs = [turns_cfg(tmp_path, "a", lr=0.5), turns_cfg(tmp_path, "b", lr=0.1), turns_cfg(tmp_path, "c", lr=0.2)]
    results = train_in_turns(configs, Clocked)
    # one step of each per round, and who goes first moves on every round
    assert Clocked.order[:9] == [0.5, 0.1, 0.2, 0.1, 0.2, 0.5, 0.2, 0.5, 0.1]
    for c, r in zip(configs, results):
        alone = train(c.replace(out=None), SoftmaxRegression)
        assert r.status == "ok" and r.losses == alone.losses and r.metric == alone.metric
        assert RunResult.load(c.out).losses == r.losses and len(r.step_times) == 6


def test_a_run_in_turns_that_diverges_ends_and_the_others_go_on(tmp_path):
    configs = [turns_cfg(tmp_path, "a", steps=8), turns_cfg(tmp_path, "b", steps=4)]
    make = lambda c, d: SoftmaxRegression(c, d, blow_up_at=2 if c.steps == 8 else None)
    a, b = train_in_turns(configs, make)
    assert a.status == "diverged" and a.diverged_step == 2 and a.steps_done == 3
    assert b.status == "ok" and b.steps_done == 4


def test_a_run_in_turns_that_fails_ends_failed_and_the_others_interrupted(tmp_path):
    configs = [turns_cfg(tmp_path, "a"), turns_cfg(tmp_path, "b", lr=0.1)]
    make = lambda c, d: SoftmaxRegression(c, d, fail_at=3 if c.lr == 0.1 else None)
    with pytest.raises(RunFailed, match=r"run 1 \(torch fp32 mlp\) failed after 3 steps: out of memory") as info:
        train_in_turns(configs, make)
    assert info.value.result.status == "failed" and info.value.result.steps_done == 3
    other = RunResult.load(configs[0].out)
    assert other.status == "interrupted" and other.steps_done == 3  # run 1 went first in round 3


def test_a_config_refused_in_turns_starts_no_run_and_leaves_no_log(tmp_path):
    def make(c, d):
        if c.lr == 0.1:
            raise ValueError("bf16 needs compute capability 8.0")
        return SoftmaxRegression(c, d)

    configs = [turns_cfg(tmp_path, "a"), turns_cfg(tmp_path, "b", lr=0.1)]
    with pytest.raises(ValueError, match="compute capability"):
        train_in_turns(configs, make)
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "b.jsonl").exists()


@pytest.mark.parametrize("configs, error, words", [
    (None, TypeError, "configs must be a list of RunConfigs"),
    (RunConfig("torch"), TypeError, "configs must be a list of RunConfigs"),
    ([], ValueError, "at least one RunConfig"),
    ([RunConfig("torch"), "fp32"], TypeError, "configs\\[1\\] is str"),
    ([RunConfig("torch", devices=2)], ValueError, "one device each"),
    ([RunConfig("torch", out="x.jsonl"), RunConfig("torch", "bf16", out="x.jsonl")], ValueError, "the same out file"),
])
def test_run_in_turns_refuses_what_it_cannot_run_before_any_work(configs, error, words):
    from labkit.train import run_in_turns

    with pytest.raises(error, match=words):
        run_in_turns(configs)


def test_a_steppers_extra_lands_in_the_result_and_the_log(tmp_path):
    class WithExtra(SoftmaxRegression):
        def extra(self):
            return {"comm_bytes_per_step": 128, "steps_seen": self.n}

    res = train(cfg(tmp_path, steps=5), WithExtra)
    assert res.extra == {"comm_bytes_per_step": 128, "steps_seen": 5}
    assert RunResult.load(tmp_path / "run.jsonl").extra == res.extra
    assert train(cfg(tmp_path, steps=2), SoftmaxRegression).extra == {}  # optional
