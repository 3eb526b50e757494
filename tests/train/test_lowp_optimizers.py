"""The low-precision optimizers (RunConfig(optimizer=...) in TORCH_OPTIMIZERS), run for real through labkit.train.run.

Width 72 puts each of the libraries' storage rules to work in one MLP: dense1 (64 x 72 = 4608 =
18 blocks of 256) is quantized by all three low-bit optimizers; dense2 (72 x 72 = 5184, not a multiple
of 256 or 128) only by bitsandbytes (a partial last block), torchao keeps it unquantized; out
(72 x 10 = 720 < 4096) and the biases stay unquantized everywhere.
"""

import importlib.util
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if any(importlib.util.find_spec(m) is None for m in ("torchao", "optimi", "bitsandbytes")):
    pytest.skip("needs labkit[lowp] (torchao, torch-optimi, bitsandbytes)", allow_module_level=True)

from labkit import memory  # noqa: E402
from labkit.train import TORCH_OPTIMIZERS, RunConfig, data, run  # noqa: E402
from labkit.train.torch import bf16_rescue, make_stepper, optimizers, rescue_checks  # noqa: E402

WIDTH = 72
SHAPES = memory.param_shapes("mlp", WIDTH)


def tiny(precision: str, optimizer: str, **changes) -> RunConfig:
    return RunConfig("torch", precision, optimizer=optimizer, width=WIDTH, batch_size=32, device="cpu",
                     progress=False, **{"steps": 4, **changes})


# -- they train, and a run records what they hold ----------------------------------------------
@pytest.mark.parametrize("optimizer, precision", [
    ("adam-sr", "bf16-pure"), ("adam-kahan", "bf16-pure"),  # where they act: bf16 weights
    ("adam-8bit", "fp32"), ("adam-4bit", "bf16-pure"), ("bnb-adam-8bit", "bf16"),
])
def test_each_optimizer_trains_the_digits_mlp_and_its_run_counts_its_states(optimizer, precision):
    res = run(tiny(precision, optimizer, steps=4, lr=3e-3))
    assert res.status == "ok" and len(res.losses) == 4
    assert np.all(np.isfinite(res.losses)) and res.losses[-1] < res.losses[0] - 0.05
    expected = memory.optimizer_state_bytes(SHAPES, optimizer, precision)["total"]
    assert res.memory["optimizer_state_bytes"] == expected


def test_the_optimizers_get_torch_adams_hyperparameters_not_their_libraries_defaults():
    p = [torch.nn.Parameter(torch.zeros(8))]
    for name in TORCH_OPTIMIZERS:
        opt = optimizers.make(name, p, lr=1e-3)
        group = opt.param_groups[0]
        betas = group["betas"] if "betas" in group else (group["beta1"], group["beta2"])  # optimi: beta1, beta2
        assert (tuple(betas)[:2], group["eps"], group["weight_decay"]) == ((0.9, 0.999), 1e-8, 0.0), name
        assert float(group["lr"]) == pytest.approx(1e-3, rel=1e-7)  # torchao holds it in a float32 tensor
    assert isinstance(optimizers.make("adam-8bit", p, 1e-3), optimizers.library("adam-8bit").AdamW8bit)


# -- the count of labkit.memory against the real state tensors ---------------------------------
def _real_parts(opt) -> dict:
    """Each state tensor's bytes, read from the optimizer itself and sorted into optimizer_state_bytes'
    parts by its key; torchao's OptimState8bit/4bit opened by hand (codes, scale, qmap); a storage
    shared by several tensors (bitsandbytes' qmaps) counted once."""
    parts = dict.fromkeys(("moments", "scales", "qmaps", "compensation", "steps"), 0)
    seen = set()

    def add(part, t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            parts[part] += t.untyped_storage().nbytes()

    for state in opt.state.values():
        for key, v in state.items():
            if not torch.is_tensor(v):
                continue
            if hasattr(v, "codes"):  # torchao's quantized state
                add("moments", v.codes), add("scales", v.scale), add("qmaps", v.qmap)
            else:
                part = {"exp_avg": "moments", "exp_avg_sq": "moments", "state1": "moments", "state2": "moments",
                        "absmax1": "scales", "absmax2": "scales", "qmap1": "qmaps", "qmap2": "qmaps",
                        "kahan_comp": "compensation", "step": "steps", "momentum_buffer": "moments"}[key]
                add(part, v)
    parts["total"] = sum(parts.values())
    return parts


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
@pytest.mark.parametrize("optimizer", ("adam",) + TORCH_OPTIMIZERS)
def test_optimizer_state_bytes_equals_the_real_state_tensors_after_a_step(optimizer, precision, digits):
    cfg = tiny(precision, optimizer, steps=1)
    stepper = make_stepper(cfg, digits)
    stepper.step(digits.x_train[:32], digits.y_train[:32])
    real = _real_parts(stepper.optimizer)
    assert real == memory.optimizer_state_bytes(SHAPES, optimizer, precision)
    assert sum(t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in
                                                      optimizers.state_tensors(stepper.optimizer)}.values()) \
        == real["total"]


def test_the_quantized_tensors_are_the_ones_the_rules_say(digits):
    stepper = make_stepper(tiny("fp32", "adam-8bit", steps=1), digits)
    stepper.step(digits.x_train[:32], digits.y_train[:32])
    kinds = [type(s["exp_avg"]).__name__ for s in stepper.optimizer.state.values()]
    assert kinds == ["OptimState8bit"] + ["Tensor"] * 5  # dense1 only: 5184 is not a multiple of 256
    stepper = make_stepper(tiny("bf16-pure", "bnb-adam-8bit", steps=1), digits)
    stepper.step(digits.x_train[:32], digits.y_train[:32])
    dtypes = [str(s["state1"].dtype) for s in stepper.optimizer.state.values()]
    assert dtypes == ["torch.uint8", "torch.float32", "torch.uint8"] + ["torch.float32"] * 3  # fp32 under bf16 too


# -- stochastic rounding: seeded, and the learner's generator left alone -----------------------
def test_adam_sr_runs_are_reproducible_and_leave_torchs_generator_alone():
    before = torch.random.get_rng_state()
    a, b = (run(tiny("bf16-pure", "adam-sr", steps=3)).losses for _ in range(2))
    assert a == b
    assert torch.equal(torch.random.get_rng_state(), before)


# -- pure bf16 rescued ----------------------------------------------------------------------------
def test_bf16_rescue_moves_what_plain_pure_bf16_rounds_away():
    table = bf16_rescue(steps=3, width=WIDTH)
    rows = {(r[0], r[1]): r for r in table.rows}
    col = table.columns.index("dense2/kernel moved")
    moved = {k: float(r[col].rstrip("%")) / 100 for k, r in rows.items()}
    master, stalled = moved[("bf16", "adam")], moved[("bf16-pure", "adam")]
    assert stalled < 0.5 * master  # most of pure bf16's updates are rounded away
    for fix in ("adam-sr", "adam-kahan"):
        assert moved[("bf16-pure", fix)] > 2 * stalled, fix
    checks = rescue_checks(table)  # the notebook's verdicts, read from the same table
    assert [c.holds for c in checks[:3]] == [True] * 3  # the loss claims need the default 50 steps
    assert len(checks) == 6
    with pytest.raises(ValueError, match="four runs"):
        rescue_checks(type(table)(table.columns, table.rows[:2]))
    with pytest.raises(TypeError, match="bf16_rescue's Table"):
        rescue_checks("table")


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", TORCH_OPTIMIZERS)
def test_a_missing_library_is_an_import_error_naming_the_extra_before_any_step(optimizer, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, optimizers.LIBRARY[optimizer], None)  # hides the package, as if not installed
    out = tmp_path / "run.jsonl"
    with pytest.raises(ImportError, match=r"pip install 'labkit\[lowp\]'"):
        run(tiny("fp32", optimizer, out=str(out)))
    assert not out.exists()  # nothing ran: the log is removed


@pytest.mark.parametrize("call, error, match", [
    (lambda: optimizers.make("adam-9bit", [], 1e-3), ValueError, "choose one of 'adam-sr', 'adam-kahan'"),
    (lambda: optimizers.make("adam", [], 1e-3), ValueError, "choose one of 'adam-sr'"),
    (lambda: optimizers.make("adam-sr", [], 0.0), ValueError, "lr must be a finite number > 0"),
    (lambda: optimizers.make("adam-sr", [torch.nn.Parameter(torch.ones(2))], 1e-3, seed=-1), ValueError, "seed"),
    (lambda: optimizers.make("adam-sr", [torch.nn.Parameter(torch.ones(2, device="meta"))], 1e-3), ValueError,
     "runs on a CPU or a CUDA GPU"),
    (lambda: optimizers.state_tensors([1]), TypeError, "optimizer must be a torch.optim.Optimizer"),
    (lambda: RunConfig("jax", optimizer="adam-8bit"), ValueError, "runs in PyTorch only"),
    (lambda: RunConfig("torch", optimizer="bnb-adam-8bit", devices=2), ValueError, "one device"),
    (lambda: bf16_rescue(steps=0), ValueError, "steps must be an integer from 1"),
    (lambda: bf16_rescue(lr=-1.0), ValueError, "lr"),
])
def test_bad_input_names_what_is_allowed(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.fixture(scope="module")
def digits():
    return data.load("digits", seed=0)
