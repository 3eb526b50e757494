"""FP8 and MXFP8 training through torchao, for real, on the CPU (emulated kernels, real torchao layers).

Each recipe trains the digits MLP through `labkit.train.run`; the scales the run records are checked
against the tensors the layer really saw (captured with hooks of the test's own) and against the
layer's output, recomputed here from those scales with torch's own fp8 casts. Small: width 32,
batches of 32, a few steps (torchao's import is the slowest part).
"""

import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

from labkit.train import RunConfig, RunResult, TORCH_PRECISIONS, run  # noqa: E402
from labkit.train import data as D  # noqa: E402
from labkit.train.report import run_table  # noqa: E402
from labkit.train.torch import fp8  # noqa: E402
from labkit.train.torch.devices import check_precision  # noqa: E402
from labkit.train.torch.stepper import make_stepper  # noqa: E402

SMALL = dict(framework="torch", width=32, batch_size=32, steps=6, lr=3e-3, progress=False)
E4M3_MAX, E5M2_MAX = 448.0, 57344.0


@pytest.fixture(scope="module")
def runs():
    """fp32 and the four recipes, the same seed, batches and steps: run once, read by several tests."""
    return {p: run(RunConfig(precision=p, **SMALL)) for p in ("fp32", *TORCH_PRECISIONS)}


def fp8_round(x: torch.Tensor, dtype) -> torch.Tensor:
    """x rounded to `dtype` the way a saturating cast does (clamp to its max, then cast), back in fp32."""
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(dtype).float()


class Seen:
    """What one layer saw in one step: its input, weight (before the update), output and output gradient."""

    def __init__(self, module):
        self.handles = [module.register_forward_pre_hook(self.pre), module.register_forward_hook(self.post)]

    def pre(self, module, args):
        self.x, self.w, self.b = args[0].detach().clone(), module.weight.detach().clone(), module.bias.detach().clone()

    def post(self, module, args, out):
        self.y = out.detach().clone()
        out.register_hook(self.grad)

    def grad(self, g):
        self.g = g.detach().clone()

    def remove(self):
        for h in self.handles:
            h.remove()


def one_step(precision: str, **changes):
    """A stepper for `precision` after one step, with what its dense2 saw."""
    cfg = RunConfig(precision=precision, **{**SMALL, **changes})
    data = D.load("digits", seed=0)
    stepper = make_stepper(cfg, data)
    seen = Seen(stepper.model.dense2)
    x, y = next(D.batches(data, cfg.batch_size, seed=0))
    stepper.step(x, y)
    seen.remove()
    return stepper, seen


# -- training, for real ------------------------------------------------------------------------
@pytest.mark.parametrize("precision", TORCH_PRECISIONS)
def test_each_recipe_trains_the_mlp_close_to_fp32_but_not_identically(runs, precision):
    r, ref = runs[precision], runs["fp32"]
    assert r.status == "ok" and all(math.isfinite(v) for v in r.losses)
    assert np.mean(r.losses[-2:]) < np.mean(r.losses[:2])  # it learns
    assert abs(r.final_loss - ref.final_loss) < 0.05  # like fp32 ...
    assert r.losses != ref.losses  # ... but its matmuls really ran on 8-bit operands
    assert r.extra["fp8"]["converted"] == ["dense1", "dense2"] and r.extra["fp8"]["kept"] == ["out"]
    assert "emulated on CPU" in r.device


@pytest.mark.parametrize("precision, layer", [("fp8-tensorwise", "Float8Linear"), ("mxfp8", "MXFP8Linear")])
def test_the_layers_are_torchaos_own_over_the_same_fp32_parameters(precision, layer):
    stepper, _ = one_step(precision)
    m = stepper.model
    assert type(m.dense1).__name__ == type(m.dense2).__name__ == layer
    assert type(m.out) is torch.nn.Linear  # 10 wide: left in fp32
    assert all(p.dtype == torch.float32 for p in m.parameters())
    assert {id(p) for p in m.parameters()} == {id(p) for g in stepper.optimizer.param_groups for p in g["params"]}
    assert stepper.fp8.steps == 1


def test_the_transformer_trains_in_mxfp8_with_every_block_projection_converted():
    # labkit's own stepper, as run() drives it, without run()'s evaluation of the whole test set
    # (359 digits x 64 tokens through emulated MX: seconds on two shared cores)
    cfg = RunConfig("torch", "mxfp8", model="transformer", width=32, batch_size=2, lr=3e-3, progress=False)
    data = D.load("digits", seed=0)
    stepper = make_stepper(cfg, data)
    x, y = next(D.batches(data, 2, seed=0))
    losses = [stepper.step(x, y).loss for _ in range(3)]  # one batch, three times: its loss must fall
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    record = stepper.extra()["fp8"]
    assert len(record["converted"]) == 8 and "blocks.1.mlp.fc2" in record["converted"] and record["kept"] == ["head"]
    e = record["layers"]["blocks.0.attn.qkv"]["grad_output"]
    assert len(e["exponent_median"]) == 3 and all(math.isfinite(v) for v in e["exponent_median"])


# -- the recorded scales are the ones torchao used --------------------------------------------
def test_tensorwise_scales_are_the_amax_rule_and_reproduce_the_layers_output():
    stepper, seen = one_step("fp8-tensorwise")
    rec = stepper.fp8.to_dict()["layers"]["dense2"]
    amax_x, amax_g = float(seen.x.abs().max()), float(seen.g.abs().max())
    assert rec["input"]["amax"] == [amax_x] and rec["grad_output"]["amax"] == [amax_g]
    # amax_to_scale: max / amax in float64, then float32 (torchao/float8/float8_utils.py)
    assert rec["input"]["scale"] == [float(np.float32(E4M3_MAX / amax_x))]
    assert rec["grad_output"]["scale"] == [float(np.float32(E5M2_MAX / amax_g))]
    assert rec["grad_output"]["dtype"] == "float8_e5m2" and rec["weight"]["dtype"] == "float8_e4m3fn"
    assert rec["weight_for_grad_input"]["scale"] == rec["weight"]["scale"]  # tensorwise: the same cast again
    # the output from the recorded scales: (q(x*sx)/sx) @ (q(W*sw)/sw)^T + b
    sx, sw = (stepper.fp8.last["dense2"][k] for k in ("input", "weight"))
    xq = fp8_round(seen.x * sx, torch.float8_e4m3fn) / sx
    wq = fp8_round(seen.w * sw, torch.float8_e4m3fn) / sw
    torch.testing.assert_close(xq @ wq.T + seen.b, seen.y, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(seen.x @ seen.w.T + seen.b, seen.y, rtol=1e-6, atol=1e-6)  # fp32 would differ


def test_rowwise_scales_are_one_power_of_two_per_row():
    stepper, seen = one_step("fp8-rowwise")
    sx = stepper.fp8.last["dense2"]["input"]
    rows = seen.x.abs().amax(dim=-1, keepdim=True).double()
    expected = torch.exp2(torch.floor(torch.log2((E4M3_MAX / rows).float())))  # rounded down to 2**k
    torch.testing.assert_close(sx, expected, rtol=0, atol=0)
    e = stepper.fp8.to_dict()["layers"]["dense2"]["input"]
    assert (e["scale_min"], e["scale_max"]) == ([float(expected.min())], [float(expected.max())])


def test_mx_exponents_are_the_rceil_rule_per_block_and_reproduce_the_layers_output():
    stepper, seen = one_step("mxfp8")
    stored = stepper.fp8.last["dense2"]["input"].view(torch.uint8)  # E8M0 bytes, one per block of 32
    blocks = seen.x.numpy().reshape(seen.x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    want = np.clip(np.ceil(np.log2(amax.astype(np.float32) / np.float32(E4M3_MAX))), -127, 127) + 127
    np.testing.assert_array_equal(stored.numpy(), want.astype(np.uint8))
    e = stepper.fp8.to_dict()["layers"]["dense2"]["input"]
    assert e["exponent_max"] == [float(want.max() - 127)] and e["exponent_min"] == [float(want.min() - 127)]

    def dequant(t, stored_bytes):
        s = torch.exp2(stored_bytes.to(torch.float32) - 127).repeat_interleave(32, dim=-1)
        return fp8_round(t / s, torch.float8_e4m3fn) * s

    w_bytes = stepper.fp8.last["dense2"]["weight"].view(torch.uint8)
    y = dequant(seen.x, stored) @ dequant(seen.w, w_bytes).T + seen.b
    torch.testing.assert_close(y, seen.y, rtol=1e-6, atol=1e-6)


def test_recording_puts_torchao_back_after_each_step_even_when_the_step_fails():
    stepper, _ = one_step("fp8-tensorwise")
    owner = fp8.import_torchao("torchao.float8.float8_linear")
    original = owner.hp_tensor_to_float8_dynamic
    with pytest.raises(RuntimeError), stepper.fp8.recording():
        assert owner.hp_tensor_to_float8_dynamic is not original
        raise RuntimeError("boom")
    assert owner.hp_tensor_to_float8_dynamic is original
    before = stepper.fp8.to_dict()["layers"]["dense2"]["input"]["scale"][:1]
    stepper.evaluate(*next(D.batches(D.load("digits"), 32)))  # outside a step: not recorded
    assert stepper.fp8.to_dict()["layers"]["dense2"]["input"]["scale"][:1] == before


# -- what the run keeps, shows and refuses ------------------------------------------------------
def test_the_scales_survive_the_runs_json_and_draw(runs):
    r = runs["fp8-rowwise-gw-hp"]
    back = RunResult.from_json(r.to_json())
    assert back.extra["fp8"] == json.loads(json.dumps(r.extra["fp8"]))
    assert len(back.extra["fp8"]["layers"]["dense1"]["input"]["scale_median"]) == SMALL["steps"]
    # gw-hp keeps the weight-gradient gemm in high precision: its two casts are never made
    assert "input_for_grad_weight" not in back.extra["fp8"]["layers"]["dense1"]
    fig = fp8.plot_fp8_scales(back, casts=("input", "input_for_grad_weight"))
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2 and not fig.axes[1].lines
    assert fp8.fp8_scale_table(back).rows[0][:2] == ("dense1", "input")
    with pytest.raises(ValueError, match="no fp8 scales"):
        fp8.plot_fp8_scales(runs["fp32"])
    with pytest.raises(ValueError, match="cast"):
        fp8.plot_fp8_scales(back, casts=("bias",))


def test_run_table_says_emulated_on_cpu_only_when_it_shows_fp8_runs(runs):
    assert run_table([runs["fp32"]]).title == ""
    title = run_table(list(runs.values())).title
    assert title.startswith("fp8-tensorwise, fp8-rowwise, fp8-rowwise-gw-hp, mxfp8: emulated on CPU")


@pytest.mark.parametrize("changes, match", [
    (dict(precision="fp8-tensorwise", width=24), "multiples of 16.*width 24"),
    (dict(precision="mxfp8", width=48), "multiples of 32.*width 48"),
    (dict(precision="mxfp8", batch_size=20), "rows .*20.* multiples of 32.*batch_size=32"),
])
def test_sizes_torchao_cannot_run_are_refused_before_any_work(changes, match):
    cfg = RunConfig(**{**SMALL, **changes})
    with pytest.raises(ValueError, match=match):
        run(cfg)


def test_check_precision_refuses_fp8_off_cuda_and_cpu_and_other_frameworks_refuse_it():
    with pytest.raises(ValueError, match="CUDA GPU with fp8 tensor cores, or emulated on the CPU.*not on xla"):
        check_precision("fp8-rowwise", torch.device("xla"))
    check_precision("mxfp8", torch.device("cpu"))  # emulated: accepted
    with pytest.raises(ValueError, match="runs in PyTorch only"):
        RunConfig("jax", "fp8-tensorwise")
    with pytest.raises(ValueError, match="devices=1"):
        RunConfig("torch", "mxfp8", devices=2)


def test_without_torchao_the_fp8_precisions_name_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # what `import torchao` meets where it is not installed
    with pytest.raises(ImportError, match=r"pip install 'labkit\[lowp\]'"):
        check_precision("fp8-tensorwise", torch.device("cpu"))
    check_precision("bf16", torch.device("cpu"))  # the other precisions need no torchao
