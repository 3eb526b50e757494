"""labkit bench: real (tiny) runs, the records' schema, skips with reasons, the CLI."""

import json

import pytest

from labkit import bench, cli, memory
from labkit.bench.records import _duration, _versus

TINY = dict(batch_size=32, width=32, warmup=1, steps=2)
FIELDS = {"framework", "precision", "model", "batch_size", "step_time_s", "samples_per_s", "speedup_vs_fp32",
          "activation_bytes", "activation_bytes_model", "device", "status", "final_loss"}


def test_cells_put_fp32_first_and_multiply_out():
    plan = bench.cells("torch,jax", "bf16,fp32", "mlp", odd_sizes=True)
    assert plan[:4] == [("torch", "mlp", "aligned", "fp32"), ("torch", "mlp", "aligned", "bf16"),
                        ("torch", "mlp", "odd", "fp32"), ("torch", "mlp", "odd", "bf16")]
    assert len(plan) == 8


@pytest.mark.parametrize("args, match", [
    (("mxnet", "fp32", "mlp"), "unknown framework 'mxnet'; choose one of 'torch', 'jax', 'tf'"),
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


def test_bad_step_counts_and_budgets():
    with pytest.raises(ValueError, match="steps must be an integer from 1 to"):
        bench.bench("torch", "fp32", "mlp", steps=0)
    with pytest.raises(ValueError, match="warmup must be an integer from 0 to"):
        bench.bench("torch", "fp32", "mlp", warmup=-1)
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="max_seconds must be a finite number > 0"):
            bench.bench("torch", "fp32", "mlp", max_seconds=bad)
    for bad in ("20", True):
        with pytest.raises(TypeError, match="max_seconds must be a number"):
            bench.bench("torch", "fp32", "mlp", max_seconds=bad)


# -- adaptive timing, budgets, emulated precisions ---------------------------------------------
def test_adaptive_timing_uses_torch_benchmark_for_torch_and_labkit_s_loop_for_jax():
    # a budget a loaded CI machine can keep (JAX's compile alone took over 5 s there); each loop
    # stops on its own once the step times agree, long before it on a quiet one
    (torch_rec,) = bench.bench("torch", "fp32", "mlp", batch_size=32, width=32, max_seconds=15)
    assert torch_rec["timer"].startswith("torch.utils.benchmark adaptive_autorange")
    assert torch_rec["timed_steps"] >= 1 and torch_rec["step_time_s"] > 0
    pytest.importorskip("jax")
    (jax_rec,) = bench.bench("jax", "fp32", "mlp", batch_size=32, width=32, max_seconds=15)
    assert jax_rec["status"] == "ok", jax_rec
    assert jax_rec["timer"].startswith("labkit's adaptive loop") and jax_rec["timed_steps"] >= 1


def test_fixed_steps_are_timed_one_by_one():
    (rec,) = bench.bench("torch", "fp32", "mlp", batch_size=16, width=16, warmup=0, steps=3)
    assert (rec["timer"], rec["timed_steps"]) == ("median of 3 timed steps", 3)
    spread = [rec[k] for k in ("step_time_min_s", "step_time_q1_s", "step_time_s", "step_time_q3_s", "step_time_max_s")]
    assert spread == sorted(spread) and spread[0] > 0  # min <= q1 <= median <= q3 <= max
    assert rec["mfu"] is None and rec["peak_tflops"] is None  # a CPU has no peak in the table


def test_a_cell_whose_budget_is_gone_is_skipped_with_the_reason():
    import torch  # noqa: F401  (imported: the budget is the cell's, not the import's)

    (rec,) = bench.bench("torch", "fp32", "mlp", batch_size=64, width=256, max_seconds=1e-6)
    assert rec["status"] == "skipped" and "budget" in rec["reason"] and "max_seconds" in rec["reason"]


CAPPED = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_an_emulated_precision_is_timed_small_and_reported_as_so_many_times_slower():
    """Under a capped instruction set (what a CPU without bf16 instructions is) bf16 is
    emulated. With a budget far under what the full size needs (a minute of emulated steps even
    on a CPU ten times this one's speed) but ample for the small-size probe (well under a second
    on its own, more when the machine is busy), the cell reports the small-size slowdown instead."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import json, torch
        from labkit import bench
        print(json.dumps(bench.bench("torch", "bf16", "mlp", batch_size=1024, width=4096, max_seconds=15.0,
                                     warmup=1), default=str))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **CAPPED})
    assert out.returncode == 0, out.stderr[-2000:]
    (bf16,) = json.loads(out.stdout)
    assert bf16["status"] == "emulated" and bf16["native"] is False, bf16.get("reason")
    assert (bf16["small_batch_size"], bf16["small_width"]) == bench.SMALL["mlp"]
    assert bf16["emulated_slowdown"] == pytest.approx(bf16["small_step_time_s"] / bf16["small_fp32_step_time_s"])
    assert bf16["reason"].startswith(f"emulated here: {bf16['emulated_slowdown']:.0f}x slower than fp32")
    assert "caps the instruction set to avx2" in bf16["reason"]
    assert bf16["step_time_s"] is None and bf16["memory"] == {}
    t = bench.table([bf16])
    assert t.column("here") == ["emulated"] and t.column("status") == ["timed small"]
    assert t.column("vs fp32")[0].endswith("(at batch {}, width {})".format(*bench.SMALL["mlp"]))


def test_a_killed_bench_keeps_the_cells_it_finished(tmp_path):
    import signal
    import subprocess
    import sys

    out_json = tmp_path / "b.json"
    proc = subprocess.Popen([sys.executable, "-m", "labkit.cli", "bench", "--precision", "fp32,bf16,bf16-pure",
                             "--batch-size", "32", "--width", "32", "--json", str(out_json)],
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("[1/3]"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=120)
    doc = json.loads(out_json.read_text())
    assert doc["complete"] is False and [r["precision"] for r in doc["records"]][:1] == ["fp32"]


def test_the_time_left_reads_in_seconds_or_minutes():
    assert _duration(42.4) == "42 s" and _duration(125) == "2 min 05 s"


def test_cli_prints_a_line_per_cell_a_table_and_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    code = cli.main(["bench", "--framework", "torch", "--precision", "fp32,bf16", "--batch-size", "32",
                     "--width", "32", "--steps", "2", "--warmup", "1", "--json", str(out_json),
                     "--plot", str(out_png)])
    assert code == 0
    out = capsys.readouterr().out
    assert "[1/2] torch" in out and "[2/2] torch" in out and "ms/step" in out and "device: cpu" in out
    doc = json.loads(out_json.read_text())
    assert doc["format"] == "labkit-evidence" and doc["complete"] and doc["kind"] == "bench"
    assert doc["command"].startswith("labkit bench --framework torch") and doc["machine"]["cpu"]
    records = doc["records"]
    assert [r["precision"] for r in records] == ["fp32", "bf16"] and FIELDS <= set(records[0])
    assert "left)" in out.splitlines()[1]  # the first cell's line estimates the time left
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_bad_names_with_exit_code_2(capsys):
    assert cli.main(["bench", "--framework", "mxnet"]) == 2
    assert "choose one of 'torch', 'jax', 'tf'" in capsys.readouterr().err


@pytest.mark.parametrize("model, width, batch", [("mlp", 48, 16), ("transformer", 32, 4)])
def test_train_flops_match_torch_flop_counter(model, width, batch):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from labkit.train import models
    from labkit.train.torch.models import build

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
    assert bench.peak_tflops("cuda:0 (NVIDIA H200, compute capability 9.0)") == 989.5
    assert bench.peak_tflops("cpu (AMD EPYC)") is None


@pytest.mark.parametrize("device, precision, peak", [
    ("cuda:0 (NVIDIA H100 80GB HBM3)", "bf16", 989.5),  # SXM
    ("cuda:0 (NVIDIA H100 PCIe)", "bf16", 756.5),
    ("cuda:0 (NVIDIA H100 NVL)", "bf16", None),  # not in the table: no guess
    ("cuda:0 (NVIDIA H200 NVL)", "bf16", None),
    ("cuda:0 (NVIDIA A100-SXM4-80GB)", "tf32", 156.0),
    ("cuda:0 (NVIDIA A100 80GB PCIe)", "fp32", 19.5),
    ("cuda:0 (NVIDIA A10G)", "bf16", None),
    ("cuda:0 (NVIDIA L4)", "bf16-pure", 121.0),
    ("cuda:0 (Tesla V100-SXM2-16GB)", "fp16", 125.0),
    ("cuda:0 (Tesla V100-SXM2-16GB)", "bf16", None),  # Volta has no bf16
    ("cuda:0 (Tesla V100-PCIE-32GB)", "fp16", 112.0),
    ("cuda:0 (Tesla V100S-PCIE-32GB)", "fp16", None),
    ("cuda:0 (Tesla T4)", "fp16", 65.0),
    ("cuda:0 (Tesla T4)", "tf32", None),  # Turing has no tf32
])
def test_each_precision_is_measured_against_its_own_peak_on_its_own_chip(device, precision, peak):
    assert bench.peak_tflops(device, precision) == peak


def test_every_peak_names_its_datasheet_and_no_chip_claims_bf16_it_lacks():
    for p in bench.PEAKS:
        assert p.source.startswith("https://") and set(p.tflops) <= {"fp32", "tf32", "fp16", "bf16"}
        if p.chip.startswith(("V100", "T4")):
            assert "bf16" not in p.tflops and "tf32" not in p.tflops
    table = bench.peaks_table()
    assert table.column("chip") == [p.chip for p in bench.PEAKS] and "-" in table.column("bf16 TFLOP/s")
    with pytest.raises(ValueError, match="precision"):
        bench.peak_tflops("cuda:0 (Tesla T4)", "fp64")


def test_plot_shows_each_cells_spread_and_reads_records_without_one():
    base = dict(framework="torch", model="mlp", batch_size=8, width=8, status="ok", activation_bytes_model=1,
                samples_per_s=1.0, achieved_tflops=1e-3, activation_bytes=None, final_loss=2.0)
    recs = [dict(base, precision="fp32", step_time_s=0.02, speedup_vs_fp32=1.0, step_time_min_s=0.018,
                 step_time_q1_s=0.019, step_time_q3_s=0.021, step_time_max_s=0.03),
            dict(base, precision="bf16", step_time_s=0.01, speedup_vs_fp32=2.0)]
    fig = bench.plot(recs)
    ax = fig.axes[0]
    assert len(ax.collections) == 2  # the fp32 cell's whisker and IQR bar; the bf16 one has no spread
    assert [t.get_text() for t in ax.texts] == ["2.00x"]
    assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= 9


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
    with pytest.raises(ValueError, match="choose one of 'torch', 'jax', 'tf'"):
        bench.matmul_ms(frameworks=("mxnet",))
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        bench.matmul_ms(dtypes=("int8",))
    with pytest.raises(ValueError, match="n must be an integer from 1 to"):
        bench.matmul_ms(n=0)
    with pytest.raises(TypeError, match="dict matmul_ms returns"):
        bench.matmul_table({}, n=8)


def test_emulation_table_says_native_or_emulated_as_the_hardware_does_and_times_each_matmul():
    from labkit import hardware

    t = bench.emulation_table(("torch",), n=32, max_seconds=1)
    assert t.column("dtype") == ["bfloat16", "float16"]
    assert t.column("here") == ["native" if hardware.native_precision("torch", p).native else "emulated"
                                for p in ("bf16", "fp16")]
    # a tiny matmul on a loaded machine can time past the hardware's ceiling: the table says so ("noise")
    readings = [v.removesuffix(": noise") for v in t.column("against float32")]
    assert all(v == "as fast" or v.endswith(("x faster", "x slower")) for v in readings)


def test_versus_reads_faster_slower_or_as_fast():
    assert (_versus(1.0, 0.25), _versus(1.0, 3.0), _versus(1.0, 1.02)) == (
        "4.0x faster", "3.0x slower", "as fast")
    # one reading for the emulation table and for the bench table's emulated cells
    small = dict(framework="jax", model="mlp", precision="bf16", batch_size=512, width=1024, status="emulated",
                 activation_bytes_model=1, emulated_slowdown=1.02, small_batch_size=64, small_width=256, reason="x")
    assert bench.table([small]).column("vs fp32") == ["as fast (at batch 64, width 256)"]
    ms = {("tf", "float32"): 1.0, ("tf", "bfloat16"): 1.02, ("tf", "float16"): 3.5}
    assert bench.emulation_table(("tf",), n=64, ms=ms).column("against float32") == ["as fast", "3.5x slower"]


def test_time_in_turns_times_the_calls_in_turns_and_keeps_each_ones_best():
    log, ticks = [], iter(range(1000))
    best = bench.time_in_turns([lambda: log.append("a"), lambda: log.append("b")], repeats=[2, 3], number=[1, 2],
                               timer=lambda: next(ticks))
    assert log == ["a", "b", "b", "a", "b", "b", "b", "b"]  # a, b, a, b, b: b runs twice per timing
    assert best == [1.0, 0.5]  # one tick per timing, over the calls it ran
    assert len(bench.time_in_turns([lambda: None], repeats=1)) == 1
    with pytest.raises(ValueError, match="repeats must be one whole number for every call, or a list of 2"):
        bench.time_in_turns([lambda: None, lambda: None], repeats=[1])
    with pytest.raises(TypeError, match="calls must hold functions"):
        bench.time_in_turns([1.0])
    with pytest.raises(ValueError, match="number must be an integer from 1"):
        bench.time_in_turns([lambda: None], number=0)


def test_matmul_ms_times_a_slow_call_fewer_times_within_max_seconds():
    with pytest.raises(ValueError, match="max_seconds must be a finite number > 0"):
        bench.matmul_ms(n=8, frameworks=("torch",), max_seconds=0)
    ms = bench.matmul_ms(n=64, frameworks=("torch",), dtypes=("float32",), max_seconds=1e-9)
    assert ms[("torch", "float32")] > 0  # timed once, however slow


def test_emulation_table_reads_timings_given_to_it_and_names_what_is_missing():
    ms = {("tf", "float32"): 2.0, ("tf", "bfloat16"): 1.0, ("tf", "float16"): 8.0}
    t = bench.emulation_table(("tf",), n=64, ms=ms)
    assert t.column("against float32") == ["2.0x faster", "4.0x slower"]
    with pytest.raises(ValueError, match="ms lacks tf float16"):
        bench.emulation_table(("tf",), ms={("tf", "float32"): 1.0, ("tf", "bfloat16"): 1.0})


# -- bad values are refused before any cell runs (issue 12) --------------------------------------
@pytest.mark.parametrize("args, error, words", [
    (("x", "aligned", None, None), ValueError, "unknown model 'x'; choose one of 'mlp', 'transformer'"),  # was KeyError
    (("mlp", "slanted", None, None), ValueError, "unknown shape 'slanted'; choose one of 'aligned', 'odd'"),
    (("mlp", "aligned", 0, None), ValueError, "batch_size must be an integer from 1"),  # was: the default
    (("mlp", "aligned", None, 0), ValueError, "width must be an integer from 1"),  # was: the default
    (("mlp", "aligned", 2.5, None), TypeError, "batch_size must be an integer"),
    (("mlp", "aligned", True, None), TypeError, "batch_size must be an integer"),
    (("mlp", "odd", 1, None), ValueError, "odd sizes also run batch size - 1 .* need a batch size of 2"),
    (("transformer", "odd", None, 4), ValueError, "width of 8 or more for the transformer"),
    (("transformer", "aligned", None, 6), ValueError, "multiple of 4"),
])
def test_shape_of_refuses_what_it_cannot_shape(args, error, words):
    with pytest.raises(error, match=words):
        bench.shape_of(*args)


@pytest.mark.parametrize("args, error, words", [
    (("mlp", "a"), TypeError, "batch_size must be an integer"),  # was: a string of 506,880 'a's
    (("mlp", -1), ValueError, "batch_size must be an integer from 1"),  # was: -506880
    (("mlp", 2.0), TypeError, "batch_size must be an integer"),
    (("mlp", True), TypeError, "batch_size must be an integer"),
    (("mlp", 1, 0), ValueError, "width must be an integer from 1"),
    (("cnn", 1), ValueError, "unknown model 'cnn'"),
])
def test_train_flops_refuses_what_is_not_a_batch_of_a_model(args, error, words):
    with pytest.raises(error, match=words):
        bench.train_flops(*args)


def test_a_bad_shape_in_any_cell_is_refused_before_the_first_cell_runs():
    ran = []
    with pytest.raises(ValueError, match="need a batch size of 2"):
        bench.bench("torch", "fp32", "mlp", batch_size=1, odd_sizes=True, on_cell=ran.append, **{
            k: v for k, v in TINY.items() if k != "batch_size"})
    with pytest.raises(ValueError, match="multiple of 4"):  # the mlp cells would have run first
        bench.bench("torch", "fp32", "mlp,transformer", batch_size=8, width=6, on_cell=ran.append)
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):  # was: every cell "skipped"
        bench.bench("torch", "fp32", "mlp", device="gpu0", on_cell=ran.append)
    with pytest.raises(TypeError, match="odd_sizes must be True or False"):
        bench.bench("torch", "fp32", "mlp", odd_sizes="yes", on_cell=ran.append)
    assert ran == []


@pytest.mark.parametrize("ms, error, words", [
    ({("torch", "float32"): 0.0}, ValueError, "a time in milliseconds"),  # was ZeroDivisionError
    ({("torch", "float32"): 1.0, ("torch", "bfloat16"): 0.0}, ValueError, "a time in milliseconds"),
    ({("torch", "float32"): float("nan")}, ValueError, "a time in milliseconds"),
    ({"torch": 1.0}, TypeError, "keyed by \\(framework, dtype\\) pairs"),
    ({}, TypeError, "ms must be the dict matmul_ms returns"),
])
def test_matmul_tables_refuse_timings_that_are_not_times(ms, error, words):
    with pytest.raises(error, match=words):
        bench.matmul_table(ms, 4)
    with pytest.raises((ValueError, TypeError)):
        bench.emulation_table(("torch",), ("bfloat16",), ms=ms)


def test_tables_and_lines_name_what_a_record_lacks():
    with pytest.raises(ValueError, match="records\\[0\\] has status None"):
        bench.table([{}])
    with pytest.raises(ValueError, match="lacks 'step_time_s'"):
        bench.table([dict(framework="torch", model="mlp", precision="fp32", batch_size=8, width=8, status="ok",
                          activation_bytes_model=1)])
    with pytest.raises(TypeError, match="rec must be dicts"):
        bench.progress_line(None)
    with pytest.raises(TypeError, match="device must be a device description"):
        bench.peak_tflops(None)


def test_plot_checks_its_path_before_it_draws(tmp_path):
    with pytest.raises(ValueError, match="must end in one of .*\\.png"):
        bench.plot([], tmp_path / "bench.xyz")
    with pytest.raises(ValueError, match="does not exist"):
        bench.plot([], tmp_path / "no" / "bench.png")
    (tmp_path / "a.png").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        bench.plot([], tmp_path / "a.png")
    assert ".png" in bench.plot_suffixes() and ".svg" in bench.plot_suffixes()
