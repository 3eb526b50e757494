"""Timings read with their spread and against what the hardware can give: `labkit.hardware.speedup_ceiling`,
`labkit.bench.batch_trend`, `labkit.bench.shape_cost`, and the "noise" marks of the emulation and speed tables."""

import sys

import pytest

from labkit import bench, claims, hardware


def rec(precision, batch, t, shape="aligned", width=256, spread=0.05, framework="torch", device="cpu (example)", **kw):
    return dict(framework=framework, model="mlp", shape=shape, width=width, batch_size=batch, precision=precision,
                status="ok", step_time_s=t, step_time_q1_s=t * (1 - spread), step_time_q3_s=t * (1 + spread),
                device=device, **kw)


# -- the hardware's ceiling -------------------------------------------------------------------
@pytest.mark.parametrize("example, framework, precision, times", [
    ("cpu", "torch", "bf16", 1.0),  # AVX2 only: emulated
    ("cpu-avx512-bf16", "torch", "bf16", 2.0),  # VDPBF16PS: twice an fp32 FMA
    ("cpu-avx512-bf16", "torch", "fp16", 1.0),
    ("cpu-amx", "torch", "bf16", 16.0),
    ("cpu-amx", "tf", "bf16-pure", 16.0),
    ("cpu-amx", "torch", "fp16", 2.0),  # AVX512-FP16; AMX-FP16 is not in this example's flags
    ("cpu-amx", "jax", "bf16", 1.0),  # XLA:CPU: every 16-bit dot is an fp32 dot
    ("apple-m2", "torch", "bf16", 4.0),  # Arm BFMMLA
    ("A100", "torch", "bf16", 16.0),
    ("A100", "jax", "tf32", 8.0),
    ("T4", "torch", "bf16", 1.0),  # no bf16 Tensor Cores
    ("T4", "torch", "fp16", 16.0),
    ("P100", "torch", "fp16", 2.0),
    ("tpu", "jax", "bf16", 6.0),
    ("cpu", "torch", "fp32", 1.0),
])
def test_speedup_ceiling_is_what_the_16_bit_units_do_against_fp32(example, framework, precision, times):
    ceiling = hardware.speedup_ceiling(framework, precision, hardware.example_report(example))
    assert ceiling.times == times and ceiling.why


def test_a_speedup_past_twice_the_ceiling_is_noise_and_below_it_is_not():
    emulated = hardware.speedup_ceiling("torch", "bf16", hardware.example_report("cpu"))
    assert "emulated" in emulated.why and str(emulated).startswith("1x (emulated")
    assert not emulated.exceeded_by(2.0) and emulated.exceeded_by(2.01)  # a slow fp32 may double it, no more
    avx512 = hardware.speedup_ceiling("torch", "bf16", hardware.example_report("cpu-avx512-bf16"))
    assert not avx512.exceeded_by(2.5) and avx512.exceeded_by(140.9)  # notebook 07's stored 256 x 256 outlier
    assert hardware.CEILING_SLACK == 2.0


def test_the_noise_bound_is_the_ceiling_times_its_slack_and_every_text_prints_it():
    avx512 = hardware.speedup_ceiling("torch", "bf16", hardware.example_report("cpu-avx512-bf16"))
    assert avx512.limit == hardware.CEILING_SLACK * avx512.times == 4.0
    assert not avx512.exceeded_by(avx512.limit) and avx512.exceeded_by(avx512.limit * 1.001)
    a100 = [rec("fp32", 64, 0.01, device="cuda:0 (NVIDIA A100-SXM4-40GB)"),
            rec("fp16", 64, 0.00025, device="cuda:0 (NVIDIA A100-SXM4-40GB)")]  # 40x: past 16x x 2
    assert claims.speed_checks(a100)[0].seen.endswith("(ceiling 16x, noise past 32x)")
    assert claims.speed_table(a100).column("reading")[0].startswith("noise: over 32x, more than the hardware can give")


def test_the_p100s_ceiling_is_its_fp16_rate_and_detection_runs_once(monkeypatch):
    p100 = hardware.example_report("P100")
    assert hardware.speedup_ceiling("torch", "fp16", p100).times == p100.gpus[0].fp16_rate == 2.0
    detect_module = sys.modules["labkit.hardware.detect"]  # labkit.hardware.detect is also the function
    calls = []
    real = detect_module.detect
    monkeypatch.setattr(detect_module, "detect", lambda *a, **k: calls.append(1) or real(*a, **k))
    hardware.speedup_ceiling("torch", "bf16")
    assert len(calls) == 1  # not once more inside native_precision


def test_speedup_ceiling_refuses_what_native_precision_refuses():
    with pytest.raises(ValueError, match="unknown framework 'mxnet'"):
        hardware.speedup_ceiling("mxnet", "bf16")
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        hardware.speedup_ceiling("torch", "fp8")
    with pytest.raises(TypeError, match="report must be a HardwareReport"):
        hardware.speedup_ceiling("torch", "bf16", report="A100")
    with pytest.raises(ValueError, match="ratio"):
        hardware.speedup_ceiling("torch", "bf16", hardware.example_report("cpu")).exceeded_by(-1.0)


# -- batch_trend -----------------------------------------------------------------------------
def test_batch_trend_reads_grows_shrinks_or_flat_only_beyond_the_timing_spread():
    grows = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.9), rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.6)]
    r = bench.batch_trend(grows, ceiling=2.0)
    assert r.finding == "grows" and str(r).startswith("bf16 against fp32 (torch mlp): 1.11x at batch 16, 1.67x")
    shrinks = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.4), rec("fp32", 64, 1.0), rec("bf16", 64, 0.5),
               rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.8)]
    assert bench.batch_trend(shrinks, ceiling=2.0).finding == "shrinks"
    wide = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.9), rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.8, spread=0.3)]
    flat = bench.batch_trend(wide, ceiling=2.0)
    assert flat.finding == "flat" and flat.text.endswith("no change beyond the timing spread here")
    assert set(bench.FINDINGS) >= {"grows", "shrinks", "flat", "noisy", "unmeasured"}


def test_batch_trend_calls_a_speedup_past_the_ceiling_noise_not_a_trend():
    wild = [rec("fp32", 16, 1.0), rec("bf16", 16, 1 / 140.9), rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.8)]
    r = bench.batch_trend(wild, ceiling=2.0)
    assert r.finding == "noisy" and "at batch 16 more than the hardware can give (2x" in r.text
    assert bench.batch_trend(wild).finding == "noisy"  # past any CPU's ceiling (AMX: 16x, with slack 32x)


def test_batch_trend_reads_one_shape_and_the_ceiling_of_the_records_device():
    # the odd cells of an odd_sizes bench are left out: batch 511 would be compared with batch 16 otherwise
    mixed = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.9), rec("fp32", 1024, 1.0), rec("bf16", 1024, 0.6),
             rec("fp32", 1023, 1.0, "odd"), rec("bf16", 1023, 1.0, "odd")]
    r = bench.batch_trend(mixed, ceiling=2.0)
    assert r.finding == "grows" and "1023" not in r.text
    assert bench.batch_trend(mixed, ceiling=2.0, shape="odd").finding == "unmeasured"  # one odd batch size
    with pytest.raises(ValueError, match="unknown shape 'slanted'"):
        bench.batch_trend(mixed, shape="slanted")
    # on an A100 (ceiling 16x, noise past 32x) a 20x speed-up is no noise, whatever this machine is
    a100 = "cuda:0 (NVIDIA A100-SXM4-40GB)"
    gpu = [rec("fp32", 16, 1.0, device=a100), rec("bf16", 16, 0.5, device=a100),
           rec("fp32", 1024, 1.0, device=a100), rec("bf16", 1024, 0.05, device=a100)]
    assert bench.batch_trend(gpu).finding == "grows"


def test_batch_trend_needs_two_batch_sizes_and_one_framework():
    assert bench.batch_trend([rec("fp32", 16, 1.0), rec("bf16", 16, 0.5)]).finding == "unmeasured"
    skipped = dict(rec("bf16", 1024, 0.5), status="skipped")
    assert bench.batch_trend([rec("fp32", 16, 1.0), rec("bf16", 16, 0.5), rec("fp32", 1024, 1.0), skipped]
                             ).finding == "unmeasured"
    two = [rec("fp32", 16, 1.0), rec("bf16", 16, 0.5), rec("fp32", 16, 1.0, framework="tf"),
           rec("bf16", 16, 0.5, framework="tf")]
    with pytest.raises(ValueError, match="one framework and one model"):
        bench.batch_trend(two)
    with pytest.raises(ValueError, match="precision"):
        bench.batch_trend([], precision="fp32")
    with pytest.raises(TypeError, match="records must be a list"):
        bench.batch_trend({"fp32": 1.0})
    with pytest.raises(ValueError, match="ceiling"):
        bench.batch_trend([], ceiling=0)


# -- shape_cost ------------------------------------------------------------------------------
def test_shape_cost_compares_odd_with_aligned_beside_their_flops():
    records = [rec("fp32", 512, 1.0, width=1024), rec("bf16", 512, 0.5, width=1024),
               rec("fp32", 511, 1.0, "odd", 1023), rec("bf16", 511, 0.8, "odd", 1023)]
    t = bench.shape_cost(records)
    assert t.column("precision") == ["fp32", "bf16"]
    assert t.column("odd / aligned time") == ["1.00x", "1.60x"]
    assert t.column("odd / aligned FLOPs") == ["0.996x", "0.996x"]  # 511 x 1023 does almost the same work
    assert t.column("reading") == ["no difference beyond the timing spread", "costs more, beyond the timing spread"]
    assert "torch bf16 loses more than fp32 to odd sizes (1.60x against 1.00x)" in t.title


def test_shape_cost_says_when_the_timings_cannot_tell():
    records = [rec("fp32", 512, 1.0, width=1024, spread=0.4), rec("bf16", 512, 0.5, width=1024, spread=0.4),
               rec("fp32", 511, 1.0, "odd", 1023, spread=0.4), rec("bf16", 511, 0.6, "odd", 1023, spread=0.4)]
    t = bench.shape_cost(records)
    assert set(t.column("reading")) == {"no difference beyond the timing spread"}
    assert "no more or less than (within the timing spread) fp32" in t.title
    assert bench.shape_cost([rec("fp32", 512, 1.0)]).rows == ()  # no odd cell: nothing to compare


def test_shape_cost_refuses_two_cells_of_one_shape_rather_than_keep_one():
    sweep = [rec("fp32", 512, 1.0, width=1024), rec("fp32", 64, 0.2, width=1024), rec("fp32", 511, 1.0, "odd", 1023)]
    with pytest.raises(ValueError, match="two aligned cells of torch mlp fp32 \\(batch x width 512 x 1024 and 64 x 1024\\)"):
        bench.shape_cost(sweep)


# -- noise marks in the tables ---------------------------------------------------------------
def test_emulation_table_marks_a_speedup_no_hardware_gives_as_noise():
    ms = {("torch", "float32"): 24.076, ("torch", "bfloat16"): 0.171, ("torch", "float16"): 35.329}
    t = bench.emulation_table(("torch",), n=256, ms=ms)
    assert t.column("against float32")[0] == "140.8x faster: noise"
    assert t.column("against float32")[1] == "1.5x slower"
    assert t.column("most it can gain") == [f"{hardware.speedup_ceiling('torch', p).times:g}x" for p in ("bf16", "fp16")]
    assert "'noise': over 2x the most the hardware can gain" in t.title


def test_speed_table_reads_a_speedup_no_hardware_gives_as_noise():
    records = [rec("fp32", 512, 1.0), rec("bf16", 512, 0.01)]  # 100x: past any CPU's ceiling with its slack
    (reading,) = claims.speed_table(records).column("reading")
    assert reading.startswith("noise: over ") and "a timing was disturbed" in reading


def test_bench_table_says_native_or_emulated_and_why_a_cell_was_skipped():
    ok = dict(rec("fp32", 512, 0.1), native=True, samples_per_s=5120.0, speedup_vs_fp32=1.0, achieved_tflops=1e-3,
              activation_bytes=None, activation_bytes_model=1000, final_loss=2.3)
    small = dict(framework="jax", model="mlp", precision="bf16-pure", batch_size=512, width=1024, status="emulated",
                 native=False, activation_bytes_model=1000, emulated_slowdown=3.5, small_batch_size=64,
                 small_width=256, reason="emulated here")
    skipped = dict(framework="jax", model="transformer", precision="bf16", batch_size=32, width=64,
                   status="skipped", activation_bytes_model=1000,
                   reason="a warm-up step took 25.0 s, and the 20 s budget of the cell is spent")
    t = bench.table([ok, small, skipped])
    assert t.column("here") == ["native", "emulated", ""]
    assert t.column("status") == ["ok", "timed small", "skipped"]
    assert t.column("vs fp32")[1] == "3.5x slower (at batch 64, width 256)"
    assert t.column("note")[1].endswith("timed at batch 64, width 256 only")
    assert t.column("note")[2] == skipped["reason"]
