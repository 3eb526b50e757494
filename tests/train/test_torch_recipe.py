"""The full AMP recipe (labkit.train.torch.recipe), run on real torch on the CPU: accumulation, several
optimizers, checkpoint/resume, custom autograd functions, torch.compile, SDPA and inference."""

import dataclasses
import math

import numpy as np
import pytest
import torch

import labkit.train.torch.recipe.compiled as compiled_module
from labkit import scaling
from labkit.train.torch.recipe import (
    WAYS, AccumulationWays, Compiled, Inference, accumulate, accumulation_table, accumulation_ways,
    checkpoint_resume_identical, compile_autocast, custom_function_dtypes, inference_agreement, resume_checks,
    sdpa_dtypes, several_checks, several_optimizers,
)

RIGHT, UPDATE_EACH, UNSCALE_EACH = WAYS


# -- 1. gradient accumulation -------------------------------------------------------------------------
def test_accumulation_keeps_one_scale_per_optimizer_step_and_matches_one_big_batch():
    r = accumulate(steps=3, micro_batches=3, growth_interval=1)
    assert all(len(set(step)) == 1 for step in r.scales)          # the scale never changes mid-step
    # one update per optimizer step: the scales are those of labkit's model of torch's scaler, step for step
    trace = scaling.simulate("torch", overflows=[False] * 3, init_scale=2.0**16, growth_interval=1)
    assert [step[0] for step in r.scales] == list(trace.scales)
    assert all(r.stepped) and max(r.grad_errors) < 0.01          # loss / micro_batches: the big batch's gradient
    assert r.error == ""


def test_updating_every_micro_batch_is_refused_by_torch_with_its_own_message():
    r = accumulate(steps=2, micro_batches=3, way=UPDATE_EACH)
    assert r.error.startswith("AssertionError") and "No inf checks were recorded prior to update" in r.error
    assert r.stepped == (False,)


def test_unscaling_every_micro_batch_runs_silently_wrong_and_changes_the_scale_mid_step():
    r = accumulate(steps=2, micro_batches=3, way=UNSCALE_EACH, growth_interval=2)
    assert r.error == "" and r.stepped[0]                         # no error from torch
    assert any(len(set(step)) > 1 for step in r.scales)           # the scale grew inside an optimizer step
    assert min(e for e in r.grad_errors if not math.isnan(e)) > 0.2  # earlier micro-batches divided again: lost


def test_accumulation_table_has_one_row_per_way_and_shows_torchs_message():
    t = accumulation_table(2, 2)
    assert t.column("way") == list(WAYS)
    assert "No inf checks" in t.column("torch says")[1] and t.column("torch says")[0] == "-"
    # one error per optimizer step, as the scales are shown: the figures a check reads are all there
    silent = accumulate(2, 2, way=WAYS[2])
    assert t.column("gradient error vs one big batch, per step")[2] == " | ".join(f"{e:.2%}" for e in silent.grad_errors)


@pytest.fixture(scope="module")
def ways():
    return accumulation_ways(steps=2, micro_batches=4)


def test_accumulation_ways_checks_hold_on_real_runs_and_show_the_same_table(ways):
    assert list(ways.runs) == list(WAYS) and ways.micro_batches == 4
    assert str(ways.table()) == str(accumulation_table(steps=2, micro_batches=4))  # the same runs, the same table
    report = ways.checks()
    assert report.all_hold and len(report) == 4, str(report)


def _ways(ways, way, **change):
    return AccumulationWays(ways.micro_batches, {**ways.runs, way: dataclasses.replace(ways.runs[way], **change)})


def test_accumulation_ways_checks_fail_where_a_claim_breaks(ways):
    right_off, mid_step, silent_close, no_change = (
        _ways(ways, RIGHT, grad_errors=(0.0004, 0.02)).checks()[0],               # 2% off at one step
        _ways(ways, RIGHT, scales=((2.0**16,) * 4, (2.0**16,) * 3 + (2.0**17,))).checks()[1],
        _ways(ways, UNSCALE_EACH, grad_errors=(0.75, 0.1)).checks()[2],           # 10% off at one step
        _ways(ways, UNSCALE_EACH, scales=((2.0**16,) * 4, (2.0**17,) * 4)).checks()[3],
    )
    assert not right_off and not mid_step and not silent_close and not no_change
    assert right_off.seen == "2%" and silent_close.seen == "10%"
    raised = _ways(ways, UNSCALE_EACH, error="RuntimeError: no").checks()[2]
    assert not raised and raised.seen == "RuntimeError: no"                       # "raises nothing" is a claim too
    assert not _ways(ways, RIGHT, error="AssertionError: no").checks()[0]        # nor may the recipe's loop raise
    for errors in ((math.nan, 0.0004), (0.0004, math.nan)):                       # a skipped step fails, in any order
        assert not _ways(ways, RIGHT, grad_errors=errors).checks()[0]
        assert not _ways(ways, UNSCALE_EACH, grad_errors=tuple(0.75 if e < 0.01 else e for e in errors)).checks()[2]


def test_accumulation_ways_refuse_runs_that_are_not_one_per_way(ways):
    with pytest.raises(TypeError, match="one Accumulation per way"):
        AccumulationWays(4, {RIGHT: ways.runs[RIGHT]})
    with pytest.raises(TypeError, match="one Accumulation per way"):
        AccumulationWays(4, {**ways.runs, RIGHT: ways.runs[UNSCALE_EACH]})
    with pytest.raises(ValueError, match="micro_batches must be an integer"):
        accumulation_ways(micro_batches=0)


def test_accumulate_refuses_bad_values_naming_what_is_allowed():
    with pytest.raises(ValueError, match="unknown way"):
        accumulate(way="sometimes")
    with pytest.raises(ValueError, match="micro_batches must be an integer"):
        accumulate(micro_batches=0)
    with pytest.raises(TypeError, match="steps must be an integer"):
        accumulate(steps=2.5)


# -- 2. several models, losses and optimizers ---------------------------------------------------------
def test_several_optimizers_decide_to_skip_each_on_its_own_and_update_once():
    r = several_optimizers(3, overflow_at=(1,))
    assert r.stepped0 == (True, False, True) and r.stepped1 == (True, True, True)
    trace = scaling.simulate("torch", overflows=[False, True, False], init_scale=2.0**12, growth_interval=2000)
    assert list(r.scales) == list(trace.scales)
    assert all(abs(x - 1) < 0.01 for x in r.ratio1)


def test_updating_between_two_optimizers_steps_doubles_the_second_ones_gradient_after_an_overflow():
    r = several_optimizers(3, way="update after each step", overflow_at=(1,))
    assert abs(r.ratio1[1] - 2) < 0.02 and abs(r.ratio1[0] - 1) < 0.01
    assert r.table().column("opt1 gradient / true")[1].startswith("2.0")


@pytest.fixture(scope="module")
def several():
    return tuple(several_optimizers(3, way=way, overflow_at=(1,)) for way in ("right", "update after each step"))


def test_several_checks_hold_on_real_runs_and_read_the_runs_settings(several):
    right, wrong = several
    assert (right.overflow_at, right.init_scale, right.growth_interval) == ((1,), 2.0**12, 2000)
    report = several_checks(right, wrong)
    assert report.all_hold and len(report) == 4, str(report)
    # another overflow step and scale: the expected skips and scales follow the run, not the notebook's
    late = [several_optimizers(4, way=w, overflow_at=(2,), init_scale=2.0**10)
            for w in ("right", "update after each step")]
    assert several_checks(*late).all_hold, str(several_checks(*late))


def test_several_checks_fail_where_a_claim_breaks(several):
    right, wrong = several
    for i, broken in enumerate([dataclasses.replace(right, stepped0=(True, True, True)),    # opt0 stepped on inf
                                dataclasses.replace(right, scales=(4096.0, 2048.0, 2048.0)),  # halved too soon
                                dataclasses.replace(right, ratio1=(1.0, 1.08, 1.0))]):        # 8% off
        assert not several_checks(broken, wrong)[i]
    assert not several_checks(right, dataclasses.replace(wrong, ratio1=(1.0, 1.0, 1.0)))[3]
    assert not several_checks(dataclasses.replace(right, ratio1=(math.nan, 1.0, 1.0)), wrong)[2]  # opt1 skipped


def test_several_checks_refuse_the_runs_swapped_or_without_an_overflow(several):
    right, wrong = several
    with pytest.raises(ValueError, match="right must be the run with way='right'"):
        several_checks(wrong, right)
    with pytest.raises(TypeError, match="must be a SeveralOptimizers"):
        several_checks(right, [wrong])
    with pytest.raises(ValueError, match="run with an overflow"):
        several_checks(right, several_optimizers(2, way="update after each step", overflow_at=()))


# -- 3. checkpoint and resume -------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    dict(),                                                       # nothing special
    dict(overflow_at=(1,), growth_interval=2),                    # the scale backed off and grew before `at`
    dict(init_scale=2.0**20),                                     # real overflows: the first steps back off
    dict(precision="bf16"),                                       # no scaler at all (enabled=False)
])
def test_resuming_from_a_full_checkpoint_is_bit_identical(case):
    r = checkpoint_resume_identical(steps=6, at=3, **case)
    assert np.array_equal(np.array(r.straight_losses, np.float64), np.array(r.resumed_losses, np.float64))
    assert r.straight_scales == r.resumed_scales and r.identical and r.first_difference is None
    assert r.saved == ("model", "optimizer", "scaler", "step", "rng") and r.checkpoint_bytes > 0
    if case.get("precision", "fp16") == "fp16" and case:
        assert r.straight_scales[r.at] != r.straight_scales[0]    # the scale had changed before the checkpoint


def test_forgetting_the_scaler_state_restarts_the_scale_and_a_large_one_overflows_again():
    r = checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20, forget="scaler")
    assert "scaler" not in r.saved and not r.identical and r.first_difference == 3
    assert r.resumed_scales[3] == 2.0**20 != r.straight_scales[3]
    assert r.resumed_losses[4:] != r.straight_losses[4:]         # the overflowing steps were skipped
    small = checkpoint_resume_identical(steps=6, at=3, overflow_at=(1,), forget=("scaler",))
    assert small.resumed_scales[3] == 2.0**16 and small.straight_scales[3] == 2.0**15 and not small.identical


@pytest.mark.parametrize("part, first", [("optimizer", 4), ("data position", 3)])
def test_forgetting_the_optimizer_or_the_data_position_breaks_identity(part, first):
    r = checkpoint_resume_identical(steps=5, at=3, forget=part)
    assert not r.identical and r.first_difference == first      # Adam's moments act one step later
    assert "DIFFERENT" in r.table().column("")


def test_checkpoint_resume_leaves_the_rng_and_determinism_setting_as_they_were():
    rng, det = torch.get_rng_state(), torch.are_deterministic_algorithms_enabled()
    checkpoint_resume_identical(steps=3, at=1)
    assert torch.equal(torch.get_rng_state(), rng) and torch.are_deterministic_algorithms_enabled() == det


@pytest.fixture(scope="module")
def resumes():
    return (checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20),
            checkpoint_resume_identical(steps=6, at=3, init_scale=2.0**20, forget="scaler"))


def test_resume_checks_hold_on_real_runs_reading_the_runs_init_scale(resumes):
    full, forgot = resumes
    assert forgot.init_scale == 2.0**20
    report = resume_checks(full, forgot)
    assert report.all_hold and len(report) == 3, str(report)


def test_resume_checks_fail_where_a_claim_breaks(resumes):
    full, forgot = resumes
    k = forgot.at
    assert not resume_checks(dataclasses.replace(full, resumed_losses=full.resumed_losses[:-1] + (0.0,)), forgot)[0]
    assert not resume_checks(full, dataclasses.replace(forgot, init_scale=2.0**16))[1]   # read from the record
    same_after = forgot.resumed_losses[:k + 1] + forgot.straight_losses[k + 1:]
    assert not resume_checks(full, dataclasses.replace(forgot, resumed_losses=same_after))[2]


def test_resume_checks_refuse_the_runs_swapped(resumes):
    full, forgot = resumes
    with pytest.raises(ValueError, match="full must be a run whose checkpoint held the scaler"):
        resume_checks(forgot, full)
    with pytest.raises(TypeError, match="forgot must be a Resume"):
        resume_checks(full, None)


def test_checkpoint_resume_refuses_bad_values():
    with pytest.raises(ValueError, match="at must be an integer from 1 to 3"):
        checkpoint_resume_identical(steps=4, at=4)
    with pytest.raises(ValueError, match="unknown forget 'weights'"):
        checkpoint_resume_identical(forget="weights")
    with pytest.raises(ValueError, match="overflow_at must be an integer from 0 to 7"):
        checkpoint_resume_identical(overflow_at=(9,))


# -- 4. custom autograd functions ---------------------------------------------------------------------
@pytest.mark.parametrize("precision, name, c10", [("bf16", "bfloat16", "BFloat16"), ("fp16", "float16", "Half")])
def test_custom_fwd_and_bwd_fix_what_a_plain_function_breaks(precision, name, c10):
    t = custom_function_dtypes(precision)
    rows = {r[0]: dict(zip(t.columns, r)) for r in t.rows}
    mismatch = f"expected m1 and m2 to have the same dtype, but got: c10::{c10} != float"  # torch's own words
    plain = rows["plain autograd.Function"]
    assert plain["autocast in forward"] == "True" and plain["autocast in backward"] == "False"
    assert mismatch in plain["result"]                            # backward ran outside autocast
    both = rows["custom_fwd + custom_bwd"]
    assert both["autocast in backward"] == "True" and both["output"] == name and both["result"].startswith("grads")
    cast = rows["custom_fwd(cast_inputs=float32)"]
    assert cast["forward sees a, b"] == "float32, float32" and cast["autocast in forward"] == "False"
    assert cast["output"] == cast["backward sees grad"] == "float32"
    assert rows["autocast(enabled=False) + .float()"]["output"] == "float32"
    assert mismatch in rows["autocast(enabled=False), no cast"]["result"]


# -- 5. torch.compile ---------------------------------------------------------------------------------
def test_compile_under_bf16_autocast_fuses_the_casts_into_its_kernels(monkeypatch):
    timed_on, time_in_turns = [], compiled_module.time_in_turns

    def recording(*args, **kwargs):                               # the threads torch has while it times
        timed_on.append(torch.get_num_threads())
        return time_in_turns(*args, **kwargs)

    monkeypatch.setattr(compiled_module, "time_in_turns", recording)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = compile_autocast(("bf16",), width=32, batch_size=32, steps=3, warmup=1)
        assert torch.get_num_threads() == 2                       # restored after
    finally:
        torch.set_num_threads(threads)
    assert timed_on == ([1] if r.available else [])               # timed on one thread
    if not r.available:
        assert "Warning" not in r.reason.split(":")[0], r.reason  # a warning is ours to silence, not a reason
        pytest.skip(f"torch.compile (inductor) cannot compile here: {r.reason}")
    assert r.eager_casts["bf16"] > 0                              # eager autocast casts op by op
    assert r.fused_cast_kernels["bf16"] > 0 and r.converts["bf16"] > 0
    assert all(ms > 0 and math.isfinite(ms) for ms in r.ms.values())
    assert r.table().column("precision") == ["bf16"]
    checks = r.checks("bf16")
    casts, fused, library, cost, speed = checks
    assert casts.holds and fused.holds and library.holds, str(checks)  # what the code shows holds everywhere
    # the two timing lines read a clock (a loaded machine may break them): here their form, not their verdict
    assert cost.claim == "compiling costs at least 100 eager steps" and cost.seen.endswith(" steps")
    assert speed.claim == "at this size, compiling changes the step time by less than 3x, up or down"
    assert speed.seen.endswith("x eager's speed")


def _compiled(eager_ms, compiled_ms, compile_s, fused=6):
    return Compiled(True, "", {("bf16", "eager"): eager_ms, ("bf16", "compiled"): compiled_ms}, {"bf16": compile_s},
                    {"bf16": 15}, {"bf16": 6}, {"bf16": fused}, {"bf16": 29 if fused else 0}, {"bf16": "addmm x3, mm x5"})


def test_compile_checks_fail_where_compiling_is_cheap_fast_or_unfused():
    assert _compiled(0.5, 0.6, 1.2).checks().all_hold
    assert not _compiled(0.5, 0.6, 0.02).checks()[3]              # 40 steps' worth of compiling: fails
    assert not _compiled(0.5, 0.1, 1.2).checks()[4] and not _compiled(0.5, 2.0, 1.2).checks()[4]  # 5x, 4x
    assert not _compiled(0.5, 0.6, 1.2, fused=0).checks()[1]


def test_compile_checks_take_only_a_16_bit_precision_it_ran():
    r = Compiled(True, "", {(p, k): 0.5 for p in ("fp32", "bf16") for k in ("eager", "compiled")},
                 {"fp32": 1.2, "bf16": 1.2}, {"fp32": 0, "bf16": 15}, {"fp32": 6, "bf16": 6}, {"fp32": 0, "bf16": 6},
                 {"fp32": 0, "bf16": 29}, {"fp32": "addmm x3", "bf16": "addmm x3, mm x5"})
    assert r.checks("bf16").all_hold
    with pytest.raises(ValueError, match="choose one of 'bf16'"):  # fp32 makes no casts: its claims cannot hold
        r.checks("fp32")


def test_compile_checks_say_why_where_inductor_could_not_compile():
    r = Compiled(False, "RuntimeError: no C++ compiler", {}, {}, {"bf16": 15}, {}, {}, {}, {})
    lines = str(r.checks()).splitlines()
    assert len(lines) == 5 and all(line.startswith("✓") for line in lines)
    assert all("not compiled here: RuntimeError: no C++ compiler" in line for line in lines[1:])
    with pytest.raises(ValueError, match="precision"):
        r.checks("fp16")


def test_compile_autocast_refuses_an_unknown_precision_before_compiling():
    with pytest.raises(ValueError, match="unknown precisions 'fp8'"):
        compile_autocast(("fp8",))


# -- 6. attention and inference -----------------------------------------------------------------------
def test_sdpa_is_lowered_by_cpu_autocast_and_runs_the_fused_cpu_kernel():
    t = sdpa_dtypes()
    for autocast, inputs, casts, kernel, sees, out in t.rows:
        assert "scaled_dot_product" in kernel
        want = "float32" if autocast == "off" else autocast
        assert out == want and sees == ", ".join([want] * 3)
        assert casts == ("3" if inputs != want else "0")


def test_inference_mode_with_autocast_agrees_with_fp32_and_tracks_no_gradients():
    r = inference_agreement(("bf16", "fp16"), train_steps=40)
    assert list(r.agreement) == ["fp32", "bf16", "fp16"] and r.agreement["fp32"] == 1.0
    for p, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):
        assert r.agreement[p] >= 0.95 and abs(r.accuracy[p] - r.accuracy["fp32"]) <= 0.05
        assert r.logits_dtype[p] == dtype
        assert r.requires_grad[p] is False and r.inference_tensor[p] is True
    rows = {row[0]: dict(zip(r.table().columns, row)) for row in r.table().rows}
    assert rows["fp16"]["logits dtype"] == "float16" and rows["fp32"]["agreement with fp32"] == "100.00%"
    report = r.checks()
    assert report.all_hold and len(report) == 4, str(report)


def test_inference_checks_fail_where_a_claim_breaks():
    def record(agreement=0.99, dtype="bfloat16", requires_grad=False, inference_tensor=True):
        return Inference(359, {"fp32": 1.0, "bf16": agreement}, {"fp32": 0.9, "bf16": 0.9}, {"fp32": 0.0, "bf16": 0.1},
                         {"fp32": "float32", "bf16": dtype}, {"fp32": False, "bf16": requires_grad},
                         {"fp32": True, "bf16": inference_tensor})

    assert record().checks().all_hold and len(record().checks()) == 3
    agree, dtype, recorded = (record(agreement=0.94).checks()[0], record(dtype="float32").checks()[1],
                              record(requires_grad=True).checks()[2])
    assert not agree and agree.seen == "94%" and not dtype and not recorded
    assert not record(inference_tensor=False).checks()[2]
