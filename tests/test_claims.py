"""labkit.claims: the seeds' claims as data, verdicts from records built by hand (every branch)
and from real tiny runs."""

import re

import pytest

from labkit import bench, claims
from labkit.claims import CLAIMS, Claim, Verdict, summary_table, verdict, verdict_table
from labkit.claims.records import _device_kind
from labkit.claims.verdicts import _reading
from labkit.train import PRECISIONS, RunConfig, run

# A GPU with bf16 and fp16 Tensor Cores: the verdicts below read the same whatever CPU runs the
# tests (on a CPU device, this machine's instruction set sets the ceiling a speed-up is read against).
A100 = "cuda:0 (NVIDIA A100-SXM4-40GB)"
BASE = dict(framework="torch", model="mlp", shape="aligned", batch_size=512, width=1024, status="ok", device=A100)


def rec(precision, step_time_s=0.02, **kw):
    return dict(BASE, precision=precision, step_time_s=step_time_s, **kw)


def torch_mem(params, grads, adam, acts, copies=0):
    return dict(parameter_bytes=params, gradient_bytes=grads, optimizer_state_bytes=adam,
                saved_activation_bytes=acts, saved_weight_copy_bytes=copies)


# fp32: 4+4+8 bytes per parameter for 100 parameters, 400 bytes of activations
FP32_MEM = torch_mem(400, 400, 800, 400)
AUTOCAST_MEM = torch_mem(400, 400, 800, 200, copies=180)  # fp32 weights, half the activations, copies
PURE_MEM = torch_mem(200, 200, 400, 200)


# -- the claims as data -------------------------------------------------------------------
def test_claims_have_unique_keys_quote_a_seed_in_chinese_and_name_real_precisions():
    assert len({c.key for c in CLAIMS}) == len(CLAIMS)
    for c in CLAIMS:
        assert c.seed in ("000", "003", "004")
        assert re.search(r"[\u4e00-\u9fff]", c.quote), c.key
        assert c.english and c.measure
        assert c.precisions and set(c.precisions) <= set(PRECISIONS) - {"fp32"}
        assert claims.get(c.key) is c and claims.get(c) is c


def test_claims_table_lists_every_claim_with_its_quote():
    t = claims.claims_table()
    assert t.column("claim") == [c.key for c in CLAIMS]
    assert "训练加速：2-3倍训练速度提升" in t.column("quote")


def test_unknown_claims_and_metrics_are_refused():
    with pytest.raises(ValueError, match="unknown claim 'faster'; choose one of 'speed', 'memory'"):
        claims.get("faster")
    with pytest.raises(ValueError, match="unknown metric 'joy'; choose one of 'speedup'"):
        Claim("x", "004", "快", "fast", "nothing", "joy")


# -- speed ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fp32_s, bf16_s, value, holds, words", [
    (0.060, 0.020, 3.0, True, "holds here: 3.00x fp32"),
    (0.040, 0.020, 2.0, True, "holds here: 2.00x fp32"),
    (0.030, 0.020, 1.5, False, "does not hold here: 1.50x fp32, short of 2x (only the matmuls speed up"),
    (0.03992, 0.020, 1.996, True, "holds here: 2.00x fp32"),  # judged as shown
    (0.0398, 0.020, 1.99, False, "does not hold here: 1.99x fp32"),
    (0.016, 0.020, 0.8, False, "does not hold here: 0.80x fp32, slower than fp32 (slower: native, but the casts"),
])
def test_speed_verdict_follows_the_measured_ratio(fp32_s, bf16_s, value, holds, words):
    v = verdict("speed", [rec("fp32", fp32_s), rec("bf16", bf16_s)])
    assert v.value == pytest.approx(value) and v.holds is holds and v.text.startswith(words)


def test_slow_16_bit_names_the_cause_the_hardware_gives():
    from labkit import hardware

    jax = [dict(r, framework="jax", device="cpu (example)") for r in (rec("fp32", 0.016), rec("bf16", 0.020))]
    assert "emulated (XLA:CPU runs bf16 dots as fp32 dots between conversions)" in verdict("speed", jax).text
    gpu = [dict(r, device="cuda:0 (NVIDIA H100 80GB HBM3)") for r in jax]
    assert "XLA:CPU" not in verdict("speed", gpu).text and "slower: native" in verdict("speed", gpu).text
    t4 = [dict(r, device="cuda:0 (Tesla T4)") for r in jax]
    assert "has no bf16 Tensor Cores" in verdict("speed", t4).text
    fp16 = verdict("speed", [rec("fp32", 0.02, device="cpu (example)"), rec("fp16", 2.0, device="cpu (example)")])
    here = hardware.native_precision("torch", "fp16", hardware.HardwareReport(hardware.detect_cpu()))
    assert fp16.value == pytest.approx(0.01) and _reading(0.01, here) in fp16.text


def test_a_speed_up_past_the_hardware_ceiling_decides_nothing():
    # An A100's bf16 Tensor Cores give at most 16x fp32; past twice that a timing was disturbed.
    v = verdict("speed", [rec("fp32", 0.40), rec("bf16", 0.01)])
    assert v.value == pytest.approx(40.0) and v.holds is None
    assert v.text.startswith("undecided here: 40.00x fp32 is noise: over 32x, more than the hardware can give (16x")
    just = verdict("speed", [rec("fp32", 0.32), rec("bf16", 0.01)])
    assert just.holds is True and just.text == "holds here: 32.00x fp32"
    # in the summary: noise alone is '?', and beside decided batches it is left out of the mark
    noisy = [rec("fp32", 0.40), rec("bf16", 0.01)]
    assert summary_table(noisy, ["speed"]).column("torch") == ["bf16 40.00x ? (noise: run again)"]
    small = [dict(r, batch_size=16) for r in (rec("fp32", 0.02), rec("bf16", 0.02))]
    assert summary_table(small + noisy, ["speed"]).column("torch") == ["bf16 1.00-40.00x ✗ (batch 16-512)"]
    assert "undecided here" in verdict_table(noisy, ["speed"]).column("verdict")[0]


def test_only_matching_finished_runs_are_compared():
    assert verdict("speed", [rec("fp32")]).holds is None
    assert "not measured" in verdict("speed", [rec("fp32")]).text
    other_shape = dict(rec("bf16"), batch_size=256)
    assert verdict("speed", [rec("fp32"), other_shape]).value is None
    failed = dict(rec("bf16"), status="diverged")
    skipped = dict(rec("fp16"), status="skipped", step_time_s=None)
    assert verdict("speed", [rec("fp32", 0.06), failed, skipped, rec("bf16", 0.02)]).value == pytest.approx(3.0)
    assert verdict("speed", [rec("fp32"), rec("bf16-pure")]).value is None  # not a precision this claim is about


def test_several_comparisons_are_refused_by_verdict_and_counted_by_the_table():
    records = [rec("fp32", 0.06), rec("bf16", 0.02), rec("fp16", 0.5)]
    with pytest.raises(ValueError, match="hold 2 .*use verdict_table"):
        verdict("speed", records)
    t = verdict_table(records, ["speed"])
    assert t.column("precision") == ["bf16", "fp16"] and t.column("measured") == ["3.00x", "0.12x"]


def test_records_must_be_a_list_of_dicts():
    with pytest.raises(TypeError, match="records must be dicts"):
        verdict("speed", [("torch", "fp32")])
    with pytest.raises(TypeError, match="records must be a list of dicts, got dict .*verdict_table"):
        verdict("speed", {"speed": [rec("fp32")]})


# -- memory ---------------------------------------------------------------------------------
def test_mixed_precision_saves_activations_but_not_the_whole_step():
    base, auto, pure = rec("fp32", memory=FP32_MEM), rec("bf16", memory=AUTOCAST_MEM), rec("bf16-pure", memory=PURE_MEM)
    total = verdict("memory", [base, auto])
    assert total.value == pytest.approx((1600 + 200 + 180) / 2000) and total.holds is False
    assert "does not hold here: 0.99x" in total.text
    assert "model states 1.00x" in total.text and "activations 0.50x" in total.text
    assert "+0.00 MB weight copies" in total.text
    assert verdict("activations", [base, auto]) == Verdict(0.5, "holds here: 0.50x fp32's bytes", True)
    assert verdict("memory", [base, pure]).value == pytest.approx(0.5)
    edge = verdict("activations", [base, rec("bf16", memory=torch_mem(400, 400, 800, 221))])
    assert edge.text == "holds here: 0.55x fp32's bytes"  # 0.5525, judged as shown
    closer = verdict("memory", [base, rec("bf16", memory=torch_mem(400, 400, 800, 0))])
    assert closer.text.startswith("does not hold here: 0.80x") and closer.holds is False  # one rule: <= 0.55x


def test_a_memory_saving_short_of_half_reads_the_same_in_the_verdict_and_the_summary():
    base = rec("fp32", memory=FP32_MEM)
    close = rec("bf16", memory=torch_mem(400, 400, 800, 0))
    v = verdict("memory", [base, close])
    assert not v.text.startswith("partly") and v.holds is False
    assert summary_table({"memory": [base, close]}, ["memory"]).rows[0][2] == "bf16 0.80x ✗"


def test_gradients_of_fp32_weights_are_not_halved():
    g = verdict("gradients", [rec("fp32", memory=FP32_MEM), rec("bf16", memory=AUTOCAST_MEM)])
    assert g.value == 1.0 and g.holds is False and "each gradient takes its weight's dtype" in g.text
    assert verdict("gradients", [rec("fp32", memory=FP32_MEM), rec("bf16-pure", memory=PURE_MEM)]).holds is True


def test_what_a_framework_cannot_measure_is_said_not_guessed():
    tf = [dict(rec(p, memory={"parameter_bytes": 400, "gradient_bytes": 400, "optimizer_state_bytes": 800}),
               framework="tf", device="cpu (example)") for p in ("fp32", "bf16")]
    v = verdict("memory", tf)
    assert v.value is None and v.holds is None and "no allocator statistics on a CPU" in v.text
    assert verdict("activations", tf).holds is None
    jax_mem = {"parameter_bytes": 400, "optimizer_state_bytes": 800, "step_temp_bytes": 900}
    jax = [dict(rec(p, memory=jax_mem), framework="jax", device="cpu (example)") for p in ("fp32", "bf16")]
    assert "JAX's gradients live inside the compiled step" in verdict("gradients", jax).text
    assert verdict("activations", jax).value == 1.0
    assert "XLA:CPU's temporaries" in verdict("activations", jax).text
    assert verdict("memory", jax).value == 1.0


def test_doubling_the_batch_compares_16_bit_at_2b_with_fp32_at_b():
    fp32 = dict(rec("fp32", memory=FP32_MEM), batch_size=64)
    bf16 = dict(rec("bf16", memory=torch_mem(400, 400, 800, 400, copies=180)), batch_size=128)
    v = verdict("double-batch", [fp32, bf16])
    assert v.value == pytest.approx(2180 / 2000) and v.holds is False
    assert "fp32's bytes at batch 64" in v.text and "model states 1.00x" in v.text
    pure = dict(rec("bf16-pure", memory=PURE_MEM), batch_size=128)
    assert verdict("double-batch", [fp32, dict(pure, precision="bf16")]).holds is True
    assert verdict("double-batch", [fp32, dict(bf16, batch_size=64)]).value is None  # same batch: not this claim
    t = verdict_table([fp32, bf16], ["double-batch"])
    assert t.column("batch") == ["64->128"]


# -- accuracy -------------------------------------------------------------------------------
def test_lossless_compares_test_accuracy_within_one_point():
    base = rec("fp32", accuracy=0.950)
    assert verdict("lossless", [base, rec("bf16", accuracy=0.945)]).holds is True
    worse = verdict("lossless", [base, rec("bf16-pure", accuracy=0.90)])
    assert worse.value == pytest.approx(0.05)
    assert worse.text == "does not hold here: 90.0% vs fp32's 95.0%, worse by 5.0 pt"


def test_a_16_bit_run_more_accurate_than_fp32_reads_as_better_not_as_a_loss():
    base = rec("fp32", accuracy=0.978)
    better = rec("bf16-pure", accuracy=0.983)
    v = verdict("lossless", [base, better])
    assert v.holds is True and v.text == "holds here: 98.3% vs fp32's 97.8%, better by 0.5 pt"
    assert verdict_table([base, better], ["lossless"]).column("measured") == ["better by 0.5 pt"]
    assert summary_table({"lossless": [base, better]}, ["lossless"]).rows[0][2] == "bf16-pure better by 0.5 pt ✓"
    same = verdict("lossless", [base, rec("bf16", accuracy=0.978)])
    assert same.text == "holds here: 97.8% vs fp32's 97.8%, the same"


def test_a_cpu_record_that_mentions_gpus_is_read_as_a_cpu_record():
    cpu = "cpu (Xeon, native bf16: amx_bf16; TF32 is a GPU format: tf32 runs as fp32 here)"
    assert _device_kind({"device": cpu}) == "cpu"
    assert _device_kind({"device": "cuda:0 (NVIDIA H200, compute capability 9.0)"}) == "gpu"
    assert _device_kind({"device": "tpu (TPU v4)"}) == "tpu"
    records = [dict(BASE, device=cpu, precision=p, step_time_s=t) for p, t in (("fp32", 0.06), ("bf16", 0.02))]
    assert "GPU" not in claims.speed_table(records).column("reading")[0]
    assert "needs training runs" in verdict("lossless", [rec("fp32"), rec("bf16")]).text


# -- tables ---------------------------------------------------------------------------------
def test_tables_take_one_list_for_all_claims_or_a_list_per_claim():
    records = [rec("fp32", 0.06, memory=FP32_MEM), rec("bf16", 0.02, memory=AUTOCAST_MEM)]
    t = verdict_table(records)
    assert t.column("claim") == [c.key for c in CLAIMS]  # one comparison each, or one "not measured" row
    assert t.column("verdict")[-1].startswith("not measured: needs training runs with a test accuracy")
    assert t.column("verdict")[CLAIMS.index(claims.get("double-batch"))].startswith("not measured: needs an fp32 run")
    s = summary_table({"speed": records, "gradients": records})
    assert s.columns == ("claim", "seed", "torch")
    torch = dict(zip(s.column("claim"), s.column("torch")))
    assert torch["speed"] == "bf16 3.00x ✓" and torch["gradients"] == "bf16 1.00x ✗" and torch["memory"] == "-"
    with pytest.raises(ValueError, match="unknown claims \\['fast'\\]"):
        summary_table({"fast": records})


def test_summary_sums_up_batch_sizes_as_a_range_and_says_from_where_a_claim_holds():
    records = [rec("fp32", 0.06), rec("bf16", 0.02), dict(rec("fp32", 0.01), batch_size=16),
               dict(rec("bf16", 0.01), batch_size=16)]
    s = summary_table(records, ["speed"])
    assert s.column("torch") == ["bf16 1.00-3.00x ✓ from batch 512 (batch 16-512)"]
    middle = [dict(rec("fp32", 0.06), batch_size=64), dict(rec("bf16", 0.05), batch_size=64)]
    assert summary_table(records + middle, ["speed"]).column("torch") == [
        "bf16 1.00-3.00x ✓ from batch 512 (batch 16-512)"]
    dip = [dict(rec("fp32", 0.06), batch_size=64), dict(rec("bf16", 0.02), batch_size=64),
           dict(rec("fp32", 0.01), batch_size=1024), dict(rec("bf16", 0.01), batch_size=1024)]
    assert summary_table(records + dip, ["speed"]).column("torch") == [
        "bf16 1.00-3.00x ✓ at batch 64, 512 (batch 16-1024)"]


def test_summary_has_a_column_per_framework_names_models_and_marks_what_cannot_be_measured():
    tf_mem = {"parameter_bytes": 400, "gradient_bytes": 400, "optimizer_state_bytes": 800}
    records = [dict(rec(p, memory=tf_mem), framework="tf") for p in ("fp32", "bf16")]
    records += [rec("fp32", 0.06, memory=FP32_MEM), rec("bf16", 0.02, memory=AUTOCAST_MEM)]
    records += [dict(rec("fp32", 0.03), model="transformer"), dict(rec("bf16", 0.02), model="transformer")]
    s = summary_table(records, ["speed", "memory"])
    assert s.columns == ("claim", "seed", "torch", "tf")
    assert s.column("torch") == ["mlp bf16 3.00x ✓; transformer bf16 1.50x ✗",
                                 "mlp bf16 0.99x ✗; transformer bf16 n/a"]  # no memory recorded for it
    assert "reported no memory figures" in verdict("memory", records[-2:]).text
    assert s.column("tf") == ["bf16 1.00x ✗", "n/a"]


# -- real runs ------------------------------------------------------------------------------
def test_verdicts_from_a_real_tiny_torch_benchmark():
    pytest.importorskip("torch")
    records = bench.bench("torch", "fp32,bf16,bf16-pure", "mlp", batch_size=32, width=32, warmup=1, steps=2)
    fp32, bf16, pure = records
    speed = verdict("speed", [fp32, bf16])
    assert speed.value == fp32["step_time_s"] / bf16["step_time_s"]
    assert speed.holds is (round(speed.value, 2) >= 2)  # judged as shown, to two decimals
    act = verdict("activations", [fp32, bf16])
    assert act.value == bf16["memory"]["saved_activation_bytes"] / fp32["memory"]["saved_activation_bytes"]
    assert act.holds is True  # autocast stores the big activations in bf16
    assert verdict("gradients", [fp32, bf16]).value == 1.0  # fp32 master weights, fp32 gradients
    assert verdict("gradients", [fp32, pure]).value == 0.5
    states = verdict("memory", [fp32, bf16])
    assert states.holds is False and "model states 1.00x" in states.text
    assert len(verdict_table(records).rows) == 1 + 2 + 2 + 2 + 1 + 1


def test_run_records_carry_accuracy_from_real_training_runs():
    pytest.importorskip("torch")
    results = [run(RunConfig("torch", p, steps=3, batch_size=32, progress=False)) for p in ("fp32", "bf16")]
    records = claims.run_records(results)
    assert [r["precision"] for r in records] == ["fp32", "bf16"]
    assert records[0]["accuracy"] == results[0].metric["value"]
    v = verdict("lossless", records)
    assert v.value == pytest.approx(results[0].metric["value"] - results[1].metric["value"])
    with pytest.raises(TypeError, match="results must hold labkit.train.RunResult objects \\(run_records takes runs\\), got dict"):
        claims.run_records(records)


# -- what the step times say on this machine ---------------------------------------------------
def test_the_reading_follows_the_hardware_and_the_measurement():
    from labkit.hardware import Native

    native, emulated = Native(True, "the CPU's avx512_bf16 instructions"), Native(False, "bf16 is emulated")
    assert _reading(3.1, native) == "faster: the CPU's avx512_bf16 instructions"
    assert _reading(1.0, native).startswith("about as fast: native")
    assert _reading(0.6, native).startswith("slower: native, but the casts")
    assert _reading(0.02, native).startswith("much slower, although native")
    assert _reading(0.02, emulated) == "slower: emulated (bf16 is emulated)"
    assert _reading(1.0, emulated) == "no faster: emulated (bf16 is emulated)"
    assert _reading(1.5, emulated).startswith("faster, although emulated")


def test_speed_table_pairs_each_16_bit_record_with_its_fp32_and_asks_the_hardware():
    from labkit import hardware

    base = dict(model="mlp", shape="aligned", batch_size=512, width=1024, device="cpu (example)")
    records = [dict(base, framework="torch", precision="fp32", status="ok", step_time_s=0.1),
               dict(base, framework="torch", precision="bf16", status="ok", step_time_s=0.05),
               dict(base, framework="torch", precision="fp16", status="emulated", emulated_slowdown=40.0,
                    small_batch_size=64, small_width=256),
               dict(base, framework="jax", precision="bf16", status="ok", step_time_s=0.2),  # no jax fp32: left out
               dict(base, framework="torch", precision="bf16-pure", status="skipped", reason="x")]
    t = claims.speed_table(records)
    assert t.column("precision") == ["bf16", "fp16"]
    assert t.column("measured") == ["2.00x fp32's speed", "40.0x slower (batch 64, width 256)"]
    here = hardware.HardwareReport(hardware.detect_cpu())
    bf16, fp16 = (hardware.native_precision("torch", p, here) for p in ("bf16", "fp16"))
    assert t.column("reading") == [_reading(2.0, bf16), _reading(1 / 40, fp16)]
    with pytest.raises(TypeError, match="list of records"):
        claims.speed_table({"speed": records})


def test_run_records_give_the_median_or_the_best_step():
    from labkit.train import RunConfig, RunResult

    r = RunResult(RunConfig("torch", steps=4), losses=[2.0] * 4, step_times=[9.0, 0.003, 0.001, 0.002], status="ok",
                  device="cpu (example)")
    assert claims.run_records([r])[0]["step_time_s"] == 0.002
    assert claims.run_records([r], step_time="best")[0]["step_time_s"] == 0.001
    with pytest.raises(ValueError, match="unknown step_time 'mean'; choose one of 'median', 'best'"):
        claims.run_records([r], step_time="mean")


def test_speedups_pair_each_16_bit_record_with_its_fp32_once_for_every_table_and_check():
    from labkit.claims.records import record_ceiling, record_native, speedups

    base = dict(framework="torch", model="mlp", batch_size=64, width=256, status="ok", device="cpu (example)")
    records = [dict(base, precision="fp32", step_time_s=0.2),  # no shape: "aligned", as bench's own records say
               dict(base, precision="bf16", shape="aligned", step_time_s=0.1),
               dict(base, precision="tf32", step_time_s=0.2),  # TF32 is no 16-bit precision
               dict(base, precision="fp16", shape="odd", step_time_s=0.1),  # no odd fp32: left out
               dict(base, precision="bf16-pure", step_time_s=float("inf"))]  # no step time: left out
    assert [(r["precision"], f["precision"], x) for r, f, x in speedups(records)] == [("bf16", "fp32", 2.0)]
    assert [r["precision"] for r, _, _ in speedups(records, "tf32")] == ["tf32"]
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        speedups(records, "fp8")
    with pytest.raises(TypeError, match="records must be a list of records"):
        speedups(None)
    # what the record's device can do, not this machine's
    t4 = dict(framework="torch", precision="bf16", device="cuda:0 (Tesla T4)")
    assert not record_native(t4).native and record_ceiling(t4).times == 1.0
    assert record_ceiling(dict(t4, device="cuda:0 (some new GPU)")) is None  # unknown compute capability
    with pytest.raises(ValueError, match="rec lacks 'framework'"):
        record_ceiling({"precision": "bf16"})


def test_speed_checks_import_no_private_name_of_their_siblings():
    import ast
    import inspect

    import labkit.claims.speed

    tree = ast.parse(inspect.getsource(labkit.claims.speed))
    private = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
               if a.name.startswith("_")]
    assert private == []


def gpu_records(device, **times):
    """fp32 and 16-bit records on a named GPU: the device text, not this machine, decides native and ceiling."""
    base = dict(framework="torch", model="mlp", shape="aligned", batch_size=64, width=256, status="ok", device=device)
    return [dict(base, precision=p.replace("_", "-"), step_time_s=t) for p, t in times.items()]


def test_speed_checks_flag_a_speed_up_past_the_hardware_and_a_gain_from_emulation():
    # an A100: bf16 and fp16 native, ceiling 16x; 40x is more than any hardware explains
    sound, noise = claims.speed_checks(gpu_records("cuda:0 (NVIDIA A100-SXM4-40GB)", fp32=0.01, bf16=0.004, fp16=0.00025))
    assert not sound.holds and noise.holds and noise.seen == "nothing emulated"
    assert sound.seen == "fp16 40.00x (ceiling 16x, noise past 32x)"
    # a T4 emulates bf16: 1.25x is a gain no emulation gives, beyond the 1.2x allowed
    ceiling, emulated = claims.speed_checks(gpu_records("cuda:0 (Tesla T4)", fp32=0.01, bf16=0.008, fp16=0.004))
    assert ceiling.holds and not emulated.holds and emulated.seen == "bf16 1.25x"
    assert claims.speed_checks(gpu_records("cuda:0 (Tesla T4)", fp32=0.01, bf16=0.05), emulated_at_most=0.8).all_hold
    # the claims read the same on every device: only the figures after "here:" differ
    assert [c.claim for c in (ceiling, emulated)] == [c.claim for c in (sound, noise)]
    assert "at most 1.2x" in emulated.claim
    none = claims.speed_checks(gpu_records("cuda:0 (Tesla T4)", fp32=0.01))
    assert none.all_hold and none[1].seen == "no 16-bit run"
    with pytest.raises(ValueError, match="emulated_at_most"):
        claims.speed_checks([], emulated_at_most=0)


def test_lossless_holds_at_exactly_one_point_despite_float_rounding():
    assert 0.978 - 0.968 > 0.01  # 0.010000000000000009
    v = verdict("lossless", [rec("fp32", accuracy=0.978), rec("bf16", accuracy=0.968)])
    assert v.holds is True and v.text == "holds here: 96.8% vs fp32's 97.8%, worse by 1.0 pt"


# -- claim_checks: each comparison's verdict as a check line ----------------------------------
def test_claim_checks_print_each_comparison_with_the_claims_threshold_and_the_verdicts_figures():
    records = [rec("fp32", accuracy=0.978), rec("bf16", accuracy=0.978), rec("fp16", accuracy=0.968),
               rec("bf16-pure", accuracy=0.95)]
    report = claims.claim_checks(records, "lossless")
    assert [c.holds for c in report] == [True, True, False] and not report.all_hold
    assert str(report[0]) == ("✓ bf16 loses at most 1 point of fp32's test accuracy (the claim's threshold)  "
                              "(here: 97.8% vs fp32's 97.8%, the same)")
    assert str(report[2]) == ("✗ expected: bf16-pure loses at most 1 point of fp32's test accuracy (the claim's "
                              "threshold); saw: 95.0% vs fp32's 97.8%, worse by 2.8 pt")
    # the same rule as the verdicts and the tables: a line holds exactly where the verdict does
    assert [c.holds for c in report] == [verdict("lossless", [records[0], r]).holds for r in records[1:]]


def test_claim_check_lines_read_the_same_on_every_machine_where_the_claim_holds():
    here = [rec("fp32", accuracy=0.978), rec("bf16", accuracy=0.972)]
    there = [rec("fp32", accuracy=0.991, device="cpu (another)"), rec("bf16", accuracy=0.994, device="cpu (another)")]
    a, b = claims.claim_checks(here, ["lossless"]), claims.claim_checks(there, ["lossless"])
    assert a.all_hold and b.all_hold and [c.claim for c in a] == [c.claim for c in b]
    assert a[0].seen != b[0].seen  # only the figures after "here:" differ


def test_claim_checks_name_the_threshold_of_every_claim_and_tell_comparisons_apart():
    records = [rec("fp32", 0.06, memory=FP32_MEM), rec("bf16", 0.02, memory=AUTOCAST_MEM),
               rec("bf16-pure", 0.03, memory=PURE_MEM), rec("fp32", 0.06, batch_size=1024, memory=FP32_MEM),
               rec("bf16", 0.05, batch_size=1024, memory=AUTOCAST_MEM)]
    report = claims.claim_checks(records, ["speed", "memory", "activations", "gradients", "double-batch"])
    lines = {c.claim: c.holds for c in report}
    assert lines["bf16 (batch 512) runs at least 2x fp32's speed (the claim's threshold)"] is True
    assert lines["bf16 (batch 1024) runs at least 2x fp32's speed (the claim's threshold)"] is False
    assert lines["bf16-pure (batch 512) takes at most 0.55x fp32's memory for a whole step (the claim's threshold)"]
    assert "bf16 (batch 512) keeps at most 0.55x fp32's bytes for the backward pass (the claim's threshold)" in lines
    assert lines["bf16 (batch 512)'s gradients take at most 0.55x fp32's bytes (the claim's threshold)"] is False
    assert "bf16 at batch 1024 takes at most fp32's memory at batch 512 (the claim's threshold)" in lines
    two = claims.claim_checks([rec("fp32"), rec("bf16"), dict(rec("fp32"), framework="jax"),
                               dict(rec("bf16"), framework="jax")], "speed")
    assert [c.claim.split(" runs")[0] for c in two] == ["torch mlp bf16", "jax mlp bf16"]


def test_a_verdict_that_decides_nothing_is_no_failure_and_says_why():
    # a speed-up past what an A100 can give is noise; JAX's gradients cannot be measured
    noise = claims.claim_checks([rec("fp32", 0.01), rec("bf16", 0.0002)], "speed")
    assert noise.all_hold and noise[0].seen.startswith("undecided here: 50.00x fp32 is noise")
    jax = [dict(rec("fp32"), framework="jax", memory={}), dict(rec("bf16"), framework="jax", memory={})]
    unmeasured = claims.claim_checks(jax, "gradients")
    assert unmeasured.all_hold and unmeasured[0].seen.startswith("not measurable here: JAX's gradients")


def test_a_claim_with_nothing_to_compare_fails_and_says_what_is_missing():
    report = claims.claim_checks([rec("fp32"), rec("bf16")], ["lossless"])  # no accuracy: not training runs
    assert len(report) == 1 and not report.all_hold
    assert str(report[0]) == ("✗ expected: lossless: a finished fp32 run and a bf16/fp16/bf16-pure run to compare; "
                              "saw: not measured: needs training runs with a test accuracy (run_records(results))")


@pytest.mark.parametrize("args, error, words", [
    (([rec("fp32")], None), TypeError, "claims must be a claim key"),
    (([rec("fp32")], ["fast"]), ValueError, "claims: unknown claim 'fast'"),
    ((None, "lossless"), TypeError, "records must be a list of records"),
    (({"fast": []}, "lossless"), ValueError, "unknown claims \\['fast'\\]"),
])
def test_claim_checks_name_bad_records_and_claims(args, error, words):
    with pytest.raises(error, match=words):
        claims.claim_checks(*args)


# -- bad input is named, one key is a list of one (issue 12) ------------------------------------
def test_one_claim_key_is_a_list_of_one():
    assert claims.claims_table("speed").column("claim") == ["speed"]
    assert claims.verdict_table([], "lossless").column("claim") == ["lossless"]


@pytest.mark.parametrize("call, error, words", [
    (lambda: claims.get(["speed"]), TypeError, "claim must be one of 'speed'"),  # was "unhashable type"
    (lambda: claims.claims_table(None), TypeError, "claims must be a claim key"),
    (lambda: claims.claims_table(["speed", "faster"]), ValueError, "claims: unknown claim 'faster'"),
    (lambda: claims.run_records(None), TypeError, "results must be a list of labkit.train.RunResult"),
    (lambda: claims.speed_table(True), TypeError, "records must be a list of records"),
    (lambda: claims.verdict("speed", [{"status": "ok"}]), ValueError, "records\\[0\\] lacks 'framework'"),
    (lambda: claims.summary_table({"speed": None}), TypeError, "records\\['speed'\\] must be a list"),
])
def test_bad_records_and_claims_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_run_without_a_step_time_is_not_measured_rather_than_a_crash():
    base = dict(framework="torch", model="mlp", shape="aligned", batch_size=8, width=8, status="ok", device="cpu")
    v = claims.verdict("speed", [dict(base, precision="fp32", step_time_s=0.1), dict(base, precision="bf16",
                                                                                    step_time_s=0.0)])
    assert v.value is None and v.text.startswith("not measurable here")
