"""The clinic: every trigger really fails with the library's own message, every fix really works.

Each case runs once (a module fixture) on the real torch, and DeepSpeed where it is installed; the
assertions read the texts the cases captured at run time, so they fail if a library stops raising.
"""

import importlib.util
import re

import pytest

torch = pytest.importorskip("torch")

from labkit import checks  # noqa: E402
from labkit.train.torch import clinic as C  # noqa: E402

DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="module")
def ran():
    """name -> Case, each case run once (the whole clinic takes seconds)."""
    return {name: C.case(name).run() for name in C.NAMES}


@pytest.mark.parametrize("name", C.NAMES)
def test_each_trigger_reproduces_its_message(ran, name):
    case, entry = ran[name], C.case(name)
    assert case.reproduced and entry.expect in case.message, case.message
    assert C.NO_ERROR not in case.message
    assert case.name == name and case.why == entry.why and "torch " in case.versions


FIXED = {
    "fp16-forward-overflow": ["fp16, ff in fp32: ", "bf16: ", "4 of 4 steps applied"],
    "fp16-params": ["step applied: True; parameters float32, gradients float32"],
    "unscale-twice": ["norm before clipping finite: True, norm after <= 1: True; step applied: True"],
    "scheduler-warning": ["plain loop: skipped steps [1] (counting from 1)",
                          "no warning; the applied steps used lr 0.1, 0.05, 0.025"],
    "bf16-gradscaler": ["scaler.scale(loss) is loss: True"],
    "autocast-dtypes": ["-> bfloat16"],
    "qkv-dtype-mismatch": ["output bfloat16 (1, 2, 1, 8)", "under torch.autocast: no error, output bfloat16"],
    "bf16-rope-positions": ["4096 of 4096 positions have distinct angles"],
    "bf16-grad-accumulation": ["fp32 params + bf16 autocast: .grad fp32", "summed in an fp32 buffer"],
    "deepspeed-min-scale": ["the replay never stops", "('none', {})"],
    "nan-hunting": ["without anomaly mode: loss finite, gradients finite: False",
                    "no error; loss finite, gradients finite: True"],
    "cpu-slower": ["width 64: ", "\nwidth 256: ", "at this size"],
}


@pytest.mark.parametrize("name", C.NAMES)
def test_each_fix_works(ran, name):
    for text in FIXED[name]:
        assert text in ran[name].fixed_output, ran[name].fixed_output
    assert "Error" not in ran[name].fixed_output


def test_fp16_overflow_is_in_the_forward_pass_and_every_scaled_step_is_skipped(ran):
    message = ran["fp16-forward-overflow"].message
    assert "max |ff(x)| inf" in message
    assert "0 of 4 steps applied, scale 65536 at step 1, 8192 at step 4, 4096 after it" in message
    fixed = ran["fp16-forward-overflow"].fixed_output
    amax = [float(v) for v in re.findall(r"max \|ff\(x\)\| ([0-9.e+]+)", fixed)]
    assert len(amax) == 2 and all(65504 < a < 1e6 for a in amax)  # the same activation, now held


def test_qkv_mismatch_shows_both_real_errors(ran):
    sdpa, by_hand = ran["qkv-dtype-mismatch"].message.splitlines()
    assert sdpa.startswith("F.scaled_dot_product_attention: RuntimeError:") and "BFloat16" in sdpa
    assert "RuntimeError:" in by_hand and "BFloat16" in by_hand


def test_rope_positions_collide_under_bf16_autocast(ran):
    message = ran["bf16-rope-positions"].message
    distinct = int(re.search(r"(\d+) of 4096 positions have distinct", message).group(1))
    error = float(re.search(r"largest angle error ([0-9.e+-]+) rad", message).group(1))
    assert distinct < 1024 and error > 1.0
    assert float(torch.tensor(257.0).to(torch.bfloat16)) == 256.0


def test_summing_many_micro_batches_in_bf16_shortens_the_sum_and_slows_the_loss():
    from labkit.train.torch.clinic.dtypes import accumulation_run

    (bf16, kept_bf16), (fp32, kept_fp32) = (accumulation_run("bf16"), accumulation_run("fp32"))
    assert bf16[0] == fp32[0] and len(bf16) == len(fp32) == 5  # the same start, 4 steps
    assert abs(kept_fp32 - 1) < 1e-5 and kept_bf16 < 0.8  # fp32 holds the exact sum; bf16 loses the later terms
    assert all(b > f for b, f in zip(bf16[1:], fp32[1:])) and bf16[-1] > 5 * fp32[-1]
    few, _ = accumulation_run("bf16", micro_batches=16)
    few32, _ = accumulation_run("fp32", micro_batches=16)
    assert few[-1] < 1.1 * few32[-1]  # over a few micro-batches, bf16's rounding costs the loss nothing visible


@pytest.mark.parametrize("kwargs, error", [({"buffer": "fp8"}, ValueError), ({"buffer": torch.bfloat16}, TypeError),
                                           ({"micro_batches": 0}, ValueError), ({"steps": 2.5}, TypeError)])
def test_accumulation_run_refuses_bad_input(kwargs, error):
    from labkit.train.torch.clinic.dtypes import accumulation_run

    with pytest.raises(error, match=next(iter(kwargs))):
        accumulation_run(**kwargs)


def test_autocast_lists_show_the_promote_list_and_the_cuda_difference(ran):
    message = ran["autocast-dtypes"].message
    assert "torch.cat([bf16 h, fp32 e]) -> float32" in message
    assert "fp32 e.index_copy(0, idx, bf16 h) -> float32 (outside autocast: RuntimeError:" in message
    assert "on CUDA, sum and softmax run in fp32" in C.case("autocast-dtypes").symptom


def test_a_case_runs_on_one_thread_and_restores_the_thread_count():
    from labkit.train.torch.threads import one_thread

    threads = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    with pytest.raises(KeyError), one_thread():
        raise KeyError("the count comes back when the block raises too")
    assert torch.get_num_threads() == threads
    C.case("fp16-params").run()
    assert torch.get_num_threads() == threads
    # an entry's trigger, fix and verdict run on one thread, whatever the count outside
    seen = lambda: str(torch.get_num_threads())  # noqa: E731
    torch.set_num_threads(2)
    try:
        case = C.Entry("threads", "s", "1", "t", "f", "w", seen, seen, portable=False,
                       verdict=lambda: checks.that("one thread", True, seen())).run()
        assert (case.message, case.fixed_output, case.verdict.seen) == ("1", "1", "1")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_the_runs_the_exercises_share_say_applied_when_the_weights_changed():
    from labkit.train.torch.clinic.amp import FF_MODES, ff_run, scaler_step

    fp16, fixed, bf16 = (ff_run(mode) for mode in FF_MODES)
    assert fp16.applied == (False,) * 4 and fixed.applied == bf16.applied == (True,) * 4
    assert fp16.scales == (65536.0, 32768.0, 16384.0, 8192.0) and fp16.final_scale == 4096.0
    assert bf16.scales == (1.0,) * 4 and "(no GradScaler)" in str(bf16)
    assert ff_run("fp16", 2, init_scale=8.0, growth_interval=1).scales == (8.0, 4.0)  # GradScaler's options
    assert scaler_step("fp32").applied and not scaler_step("fp16").applied  # fp16 parameters: it raised
    assert scaler_step("fp16", scaler=False).grad_dtype == "float16" and scaler_step("fp16").params == "float16"


@pytest.mark.parametrize("call, kwargs, error", [
    ("ff_run", {"mode": "fp8"}, ValueError), ("ff_run", {"steps": 0}, ValueError),
    ("ff_run", {"init_scale": -1.0}, ValueError), ("ff_run", {"growth_interval": 1.5}, TypeError),
    ("scaler_step", {"params": "half"}, ValueError), ("scaler_step", {"scaler": 1}, TypeError),
    ("scaler_step", {"unscale_first": None}, TypeError)])
def test_the_shared_runs_refuse_bad_settings(call, kwargs, error):
    from labkit.train.torch.clinic import amp

    with pytest.raises(error, match=next(iter(kwargs))):
        getattr(amp, call)(**kwargs)


def test_bf16_accumulation_error_grows_and_fp32_stays_tiny(ran):
    def errors(text):
        return {int(n): float(e) for n, e in re.findall(r"N=(\d+): ([0-9.e+-]+)", text)}

    bf16, fp32 = errors(ran["bf16-grad-accumulation"].message), errors(ran["bf16-grad-accumulation"].fixed_output)
    assert bf16[1] == 0 == fp32[1]  # one micro-batch: nothing was added
    assert bf16[256] > bf16[4] > 1e-4 and bf16[256] > 1e-3
    assert max(fp32.values()) < 1e-5 and bf16[256] > 100 * max(fp32[256], 1e-9)


def test_deepspeed_min_scale_messages_from_labkit_and_deepspeed(ran):
    message = ran["deepspeed-min-scale"].message
    assert "stopped at step 18, counting from 1 (scale 1 = min_loss_scale" in message
    assert "ScalerStopped: Current loss scale already at minimum" in message
    if DEEPSPEED:
        assert "\n  Exception: Current loss scale already at minimum - cannot decrease scale anymore." in message
    else:
        assert "DeepSpeed is not installed here" in message


def test_anomaly_mode_names_the_backward_function(ran):
    assert ran["nan-hunting"].message == "RuntimeError: Function 'SqrtBackward0' returned nan values in its 0th output."


def test_running_a_case_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    C.case("fp16-params").run()
    C.case("bf16-gradscaler").run()
    assert torch.equal(state, torch.random.get_rng_state())


def test_clinic_lists_every_entry_and_case_refuses_unknown_names():
    table = C.clinic()
    assert tuple(table.column("name")) == C.NAMES and len(set(C.NAMES)) == len(C.NAMES)
    with pytest.raises(ValueError, match="fp16-params"):
        C.case("fp16")
    with pytest.raises(TypeError, match="name must be one of"):
        C.case(3)


def test_a_case_prints_every_part_and_marks_one_that_did_not_reproduce():
    case = C.Case("x", "t()", "ValueError: boom\nsecond line", "f()", "ok", "because", reproduced=False)
    text = str(case)
    assert text.splitlines()[0] == "x  (did not reproduce with this version)"
    assert "message  ValueError: boom\n         second line" in text
    for label in ("trigger  t()", "fix      f()", "output   ok", "why      because"):
        assert label in text


def test_autocast_speed_check_claims_no_speedup_only_where_emulated():
    slow = C.AutocastSpeed("bf16", 8, 1.0, 2.0, False, "emulated")
    fast = C.AutocastSpeed("bf16", 8, 1.0, 0.5, False, "emulated")
    native = C.AutocastSpeed("bf16", 8, 1.0, 0.5, True, "AMX")
    assert slow.check().holds and not fast.check().holds and native.check().holds
    assert str(fast.check()).startswith("✗ expected: where labkit.hardware says bf16 is emulated, bf16 autocast is "
                                        "no faster than fp32")
    assert "native, so this line does not apply" in str(native.check())
    assert "0.50x fp32's time" in str(native)


def _speeds(native, small_ratio, large_ratio):
    return (C.AutocastSpeed("bf16", 64, 1.0, small_ratio, native, "x"),
            C.AutocastSpeed("bf16", 256, 1.0, large_ratio, native, "x"))


@pytest.mark.parametrize("native, small, large, holds", [
    (True, 1.5, 0.7, (True, True)),     # native: the gain grows with the size -- line 2 applies and holds
    (True, 0.7, 1.5, (True, False)),    # native, but relatively slower at the larger width: line 2 fails
    (True, 3.0, 3.0, (True, False)),    # native and no change with size: the claim is "lower", so it fails
    (False, 2.3, 12.0, (True, True)),   # emulated (a generic kernel): slower at both widths
    (False, 2.3, 0.8, (False, True)),   # emulated yet faster at one width: line 1 fails
])
def test_speed_verdict_says_something_on_native_and_on_emulated_cpus(native, small, large, holds):
    from labkit.train.torch.clinic.speed import speed_verdict

    verdict = speed_verdict(*_speeds(native, small, large))
    assert tuple(c.holds for c in verdict) == holds
    lines = str(verdict).splitlines()
    assert len(lines) == 2 and "width 256 than at width 64" in lines[1]
    skipped = ["so this line does not apply" in line for line in lines]
    assert skipped == [native, not native]  # on each machine exactly one line applies


def test_speed_verdict_refuses_what_it_cannot_compare():
    from labkit.train.torch.clinic.speed import speed_verdict

    small, large = _speeds(True, 1.5, 0.7)
    with pytest.raises(ValueError, match="smaller width"):
        speed_verdict(large, small)
    with pytest.raises(TypeError, match="must be an AutocastSpeed"):
        speed_verdict(small, 0.7)


def test_autocast_speed_times_cpu_time_on_one_thread_and_restores_the_thread_count(monkeypatch):
    import time

    from labkit.train.torch.clinic import speed

    timed = []

    def time_in_turns(calls, **kw):
        timed.append((torch.get_num_threads(), kw.get("timer")))
        return speed_time_in_turns(calls, **kw)

    speed_time_in_turns = speed.time_in_turns
    monkeypatch.setattr(speed, "time_in_turns", time_in_turns)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        s = C.autocast_speed(size=16, repeats=2)
        assert timed == [(1, time.thread_time)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert s.fp32_s > 0 and s.autocast_s > 0


@pytest.mark.parametrize("kwargs, error", [({"precision": "fp8"}, ValueError), ({"size": 0}, ValueError),
                                           ({"repeats": 1.5}, TypeError), ({"precision": None}, TypeError)])
def test_autocast_speed_refuses_bad_input(kwargs, error):
    with pytest.raises(error):
        C.autocast_speed(**kwargs)


NOT_PORTABLE = ("bf16-grad-accumulation", "deepspeed-min-scale", "cpu-slower")
TIMED = ("cpu-slower",)
"""Entries whose verdict reads a clock: on a loaded machine it may not hold, so only its form is tested here
(test_speed_verdict_says_something_on_native_and_on_emulated_cpus tests what it decides)."""


def test_exactly_the_machine_dependent_entries_carry_a_verdict_that_holds_here(ran):
    from labkit import checks

    assert tuple(e.name for e in C.ENTRIES if not e.portable) == NOT_PORTABLE
    for name in C.NAMES:
        verdict = ran[name].verdict
        if name in TIMED:
            assert isinstance(verdict, checks.Report) and all(isinstance(c, checks.Check) for c in verdict), name
            assert [c.claim for c in verdict] == [c.claim for c in C.speed.speed_verdict(*_speeds(True, 1.5, 0.7))]
        elif name in NOT_PORTABLE:
            assert isinstance(verdict, (checks.Check, checks.Report)), name
            assert (verdict.all_hold if isinstance(verdict, checks.Report) else verdict.holds), str(verdict)
            assert str(verdict).startswith("✓ ") and "\n✗" not in str(verdict)
        else:
            assert verdict is None, name


def test_the_verdicts_check_the_figures_the_case_printed(ran):
    accumulation = ran["bf16-grad-accumulation"]
    printed = float(re.search(r"N=256: ([0-9.e+-]+)", accumulation.message).group(1))  # 2 digits
    checked = float(re.search(r"\(here: ([0-9.e+-]+)\)", str(accumulation.verdict).splitlines()[0]).group(1))
    assert float(f"{checked:.2g}") == printed  # the same measurement, not a second one
    speed = ran["cpu-slower"]
    ratios = re.findall(r"\(([0-9.]+)x fp32's time\)", speed.message)
    assert len(ratios) == 2
    assert f"{ratios[0]}x fp32's time at width 64, {ratios[1]}x at width 256" in str(speed.verdict)
    loss = re.search(r"buffer \(the rest fp32\): the sums hold ([0-9.]+)%", accumulation.message).group(1)
    kept = float(re.search(r"exact sum's size \(the later ones are rounded away\)  \(here: ([0-9.]+)\)",
                           str(accumulation.verdict)).group(1))
    assert abs(kept * 100 - float(loss)) < 0.1
    deepspeed = ran["deepspeed-min-scale"]
    assert "stops at step 18 (counting from 1)" in str(deepspeed.verdict)
    assert "'Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.'" in str(
        deepspeed.verdict)
    assert ("deepspeed " if DEEPSPEED else "DeepSpeed is not installed") in str(deepspeed.verdict)


def test_an_entry_that_is_not_portable_needs_a_verdict_and_a_case_takes_only_checks():
    entry = C.case("fp16-params")
    with pytest.raises(ValueError, match="give it a verdict"):
        C.Entry("x", "s", "e", "t", "f", "w", entry.run_trigger, entry.run_fix, portable=False)
    with pytest.raises(TypeError, match="verdict must be None or a function"):
        C.Entry("x", "s", "e", "t", "f", "w", entry.run_trigger, entry.run_fix, verdict="✓ yes")
    with pytest.raises(TypeError, match="verdict must be None or a labkit.checks Check"):
        C.Case("x", "t()", "m", "f()", "ok", "because", verdict="✓ yes")


def test_a_case_renders_as_a_table_with_its_texts_verbatim_and_escaped():
    case = C.Case("x", "a < b", "ValueError: <boom>\n  second line", "f(x) & g(x)", "ok\nok too", "because",
                  reproduced=False)
    page = case._repr_html_()
    for label in ("trigger", "message", "fix", "output", "why"):
        assert f">{label}</th>" in page
    assert "<pre" in page and "ValueError: &lt;boom&gt;\n  second line</pre>" in page  # line breaks kept
    assert "a &lt; b" in page and "f(x) &amp; g(x)" in page and "ok\nok too</pre>" in page
    assert "did not reproduce" in page
    assert "did not reproduce" not in C.Case("x", "t", "m", "f", "o", "w")._repr_html_()
