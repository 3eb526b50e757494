"""labkit bench: real (tiny) runs, the records' schema, skips with reasons, the CLI."""

import json

import pytest

from labkit import bench, cli, memory

TINY = dict(batch_size=32, width=32, warmup=1, steps=2)
FIELDS = {"framework", "precision", "model", "batch_size", "step_time_s", "samples_per_s", "speedup_vs_fp32",
          "activation_bytes", "activation_bytes_model", "device", "status", "final_loss"}


def test_cells_put_fp32_first_and_multiply_out():
    plan = bench.cells("torch,jax", "bf16,fp32", "mlp", odd_sizes=True)
    assert plan[:4] == [("torch", "mlp", "aligned", "fp32"), ("torch", "mlp", "aligned", "bf16"),
                        ("torch", "mlp", "odd", "fp32"), ("torch", "mlp", "odd", "bf16")]
    assert len(plan) == 8


@pytest.mark.parametrize("args, match", [
    (("mxnet", "fp32", "mlp"), "unknown framework 'mxnet'; choose from torch, jax, tf"),
    (("torch", "fp8", "mlp"), "unknown precision 'fp8'"),
    (("torch", "fp32", "resnet"), "unknown model 'resnet'"),
    (("torch", "", "mlp"), "unknown precision"),
])
def test_bad_names_are_refused_with_the_choices(args, match):
    with pytest.raises(ValueError, match=match):
        bench.cells(*args)


def test_default_shapes_are_aligned_and_odd_sizes_are_not():
    assert bench.shape_of("mlp", "aligned", None, None) == (512, 2048)
    assert bench.shape_of("mlp", "odd", None, None) == (511, 2047)
    b, w = bench.shape_of("transformer", "odd", None, None)
    assert (b, w) == (511, 252) and (w // 4) % 2 == 1  # an odd head dimension


def test_torch_cells_run_for_real_and_report_speedup_and_activations():
    records = bench.bench("torch", "fp32,bf16", "mlp", **TINY)
    assert [r["precision"] for r in records] == ["fp32", "bf16"]
    for r in records:
        assert FIELDS <= set(r) and r["status"] == "ok" and r["step_time_s"] > 0
        assert r["samples_per_s"] == pytest.approx(32 / r["step_time_s"])
        assert r["activation_bytes"] > 0 and r["activation_source"].startswith("measured")
        assert r["activation_bytes_model"] == memory.activation_bytes("mlp", 32, r["precision"], 32)
    fp32, bf16 = records
    assert fp32["speedup_vs_fp32"] == 1.0
    assert bf16["speedup_vs_fp32"] == pytest.approx(fp32["step_time_s"] / bf16["step_time_s"])
    assert bf16["activation_bytes"] < fp32["activation_bytes"]


def test_tf_cells_run_and_are_timed():
    pytest.importorskip("tensorflow")
    records = bench.bench("tf", "fp32,fp16", "mlp", **TINY)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[1]["speedup_vs_fp32"] > 0 and records[1]["activation_bytes"] is None
    # TF reports no activation bytes on a CPU: the table shows the modelled figure, in parentheses
    assert all(cell.startswith("(") for cell in bench.table(records).column("activations MB"))


def test_a_device_that_is_not_here_is_a_skip_not_a_crash():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    (rec,) = bench.bench("torch", "fp32", "mlp", device="cuda", **TINY)
    assert rec["status"] == "skipped" and "cuda" in rec["reason"].lower()
    assert "skipped" in bench.progress_line(rec) and "skipped" in str(bench.table([rec]))


def test_bad_step_counts():
    with pytest.raises(ValueError, match="steps must be a whole number >= 1"):
        bench.bench("torch", "fp32", "mlp", steps=0)
    with pytest.raises(ValueError, match="warmup must be a whole number >= 0"):
        bench.bench("torch", "fp32", "mlp", warmup=-1)


def test_cli_prints_a_line_per_cell_a_table_and_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    code = cli.main(["bench", "--framework", "torch", "--precision", "fp32,bf16", "--batch-size", "32",
                     "--width", "32", "--steps", "2", "--warmup", "1", "--json", str(out_json),
                     "--plot", str(out_png)])
    assert code == 0
    out = capsys.readouterr().out
    assert "[1/2] torch" in out and "[2/2] torch" in out and "ms/step" in out and "device: cpu" in out
    records = json.loads(out_json.read_text())
    assert [r["precision"] for r in records] == ["fp32", "bf16"] and FIELDS <= set(records[0])
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_bad_names_with_exit_code_2(capsys):
    assert cli.main(["bench", "--framework", "mxnet"]) == 2
    assert "choose from torch, jax, tf" in capsys.readouterr().err


@pytest.mark.parametrize("model, width, batch", [("mlp", 48, 16), ("transformer", 32, 4)])
def test_train_flops_match_torch_flop_counter(model, width, batch):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from labkit.train import models
    from labkit.train.torch_models import build

    net = build(model, models.init_params(model, seed=0, width=width))
    x = torch.rand(batch, 64)
    if model == "transformer":
        x = torch.round(x * 16).long()
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(net(x), torch.zeros(batch, dtype=torch.long)).backward()
    # FlopCounterMode counts every matmul, forward and backward; the input layer's
    # gradient with respect to the data is not computed (x needs no grad), so leave it out.
    first_layer_input_grad = 2 * batch * 64 * width if model == "mlp" else 0
    assert bench.train_flops(model, batch, width) - first_layer_input_grad == counter.get_total_flops()


def test_mfu_is_reported_only_for_known_chips():
    assert bench.peak_tflops("cuda:0 (NVIDIA H200, compute capability 9.0)") == 989.4
    assert bench.peak_tflops("cpu (AMD EPYC)") is None


# -- one big matmul per framework --------------------------------------------------------------
def test_matmul_ms_times_every_framework_and_dtype_for_real():
    ms = bench.matmul_ms(n=64, repeats=1, number=1)
    assert set(ms) == {(f, d) for f in ("torch", "jax", "tf") for d in ("float32", "bfloat16")}
    assert all(0 < t < 10_000 for t in ms.values())


def test_matmul_table_reads_flops_speedups_and_the_fastest_of_any_framework():
    ms = {("torch", "float32"): 4.0, ("torch", "bfloat16"): 1.0, ("jax", "float32"): 2.0, ("jax", "bfloat16"): 4.0}
    t = bench.matmul_table(ms, n=100)  # 2e6 flops
    assert t.column("framework") == ["torch", "jax"]
    assert t.column("float32 GFLOP/s") == ["0", "1"] and t.column("bfloat16 ms") == ["1.00", "4.00"]
    assert t.column("bfloat16 speed-up") == ["4.0x", "0.5x"]
    assert "fastest float32 / fastest bfloat16, any framework: 2.0x" in str(t)


def test_matmul_bad_input_names_what_is_allowed():
    with pytest.raises(ValueError, match="choose from torch, jax, tf"):
        bench.matmul_ms(frameworks=("mxnet",))
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        bench.matmul_ms(dtypes=("int8",))
    with pytest.raises(ValueError, match="n must be a whole number"):
        bench.matmul_ms(n=0)
    with pytest.raises(ValueError, match="dict matmul_ms returns"):
        bench.matmul_table({}, n=8)
