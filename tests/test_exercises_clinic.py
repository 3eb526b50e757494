"""Notebook 11's exercises (labkit.exercises.clinic): keys computed from torch, labkit.formats and
labkit.scaling agree with the real libraries and with the clinic's own cases; each plausible wrong
answer gets the hint for its misconception and never the key; bad input is refused."""

import importlib.util

import pytest

from labkit import formats as lf
from labkit.exercises import EXERCISES, Feedback, check, exercises, show
from labkit.exercises.clinic import (
    DEEPSPEED_POWER, FP16_GRADIENT_FIXES, T5_ACTIVATION, T5_FIXES, T5_STEPS, fp16_fix_outcomes, t5_fix_outcomes,
)

IDS = ("clinic_fp16_gradients_fix", "t5_overflow_fix", "deepspeed_stop_step")

# (exercise, wrong answer, words its hint must contain)
WRONG = [
    ("clinic_fp16_gradients_fix", 1, "no loss scale"), ("clinic_fp16_gradients_fix", 2, "fails the same way"),
    ("clinic_fp16_gradients_fix", 4, "no fp32 master copy"), ("clinic_fp16_gradients_fix", 0, "1 to 4"),
    ("clinic_fp16_gradients_fix", 7, "1 to 4"),
    ("t5_overflow_fix", 1, "*after* the forward pass"), ("t5_overflow_fix", 2, "65504"),
    ("t5_overflow_fix", 3, "growth_interval"), ("t5_overflow_fix", 0, "options the question lists"),
    ("t5_overflow_fix", 5, "options the question lists"),
    ("deepspeed_stop_step", 18, "initial_scale_power 16"), ("deepspeed_stop_step", 9, "next overflow"),
    ("deepspeed_stop_step", 8, "hysteresis"), ("deepspeed_stop_step", 11, "given back only when the scale grows"),
    ("deepspeed_stop_step", 35, "given back only when the scale grows"), ("deepspeed_stop_step", 5, "cannot come sooner"),
]


def test_notebook_11_lists_its_exercises_and_each_shows_its_question():
    assert tuple(exercises("11").column("id")) == IDS
    for exercise_id in IDS:
        assert EXERCISES[exercise_id].notebooks == ("11",)
        text = str(show(exercise_id))
        assert text.startswith(f"Exercise {exercise_id} (notebook 11)") and f"check({exercise_id!r}" in text


@pytest.mark.parametrize("exercise_id, answer, words", WRONG, ids=[f"{e}-{a}" for e, a, _ in WRONG])
def test_a_wrong_answer_gets_the_hint_for_its_misconception_and_not_the_key(exercise_id, answer, words):
    fb = check(exercise_id, answer)
    assert isinstance(fb, Feedback) and not fb.correct
    assert words in fb.message, fb.message
    key = EXERCISES[exercise_id].solve()
    if isinstance(key, int):  # the option's number or the step is never said
        assert f" {key} " not in f" {fb.message} ".replace(".", " ").replace(",", " ")
    else:
        assert not any(k in fb.message for k in key), fb.message


def test_every_key_is_accepted_with_its_reason():
    assert check("clinic_fp16_gradients_fix", 3).correct
    assert check("t5_overflow_fix", 4).correct
    assert check("deepspeed_stop_step", 10).correct
    for exercise_id in IDS:
        assert EXERCISES[exercise_id].why


def test_bad_answers_are_refused_with_what_is_allowed():
    with pytest.raises(TypeError, match="whole number"):
        check("clinic_fp16_gradients_fix", "3")
    with pytest.raises(TypeError, match="whole number"):
        check("deepspeed_stop_step", 18.0)
    with pytest.raises(TypeError, match="whole number"):
        check("t5_overflow_fix", "4")


# ---------------------------------------------------------------- the keys against the real libraries

def test_the_fix_key_is_the_one_option_that_real_torch_runs_with_scaling_and_fp32_weights():
    torch = pytest.importorskip("torch")
    from labkit.train.torch.clinic import case

    outcomes = fp16_fix_outcomes()
    assert len(outcomes) == len(FP16_GRADIENT_FIXES) == 4
    assert all(isinstance(text, str) and isinstance(settings, dict) for text, settings in FP16_GRADIENT_FIXES)
    disabled, unscale_first, autocast, bf16 = ((o.error, o.grad_dtype, o.scaling, o.params) for o in outcomes)
    # (1) enabled=False: no error, because nothing is unscaled: fp16 gradients, no scale
    assert disabled == (None, "float16", False, "float16")
    # (2) unscale_ by hand raises the very message of the clinic's case
    assert unscale_first[0] == case("fp16-params").run().message == "ValueError: Attempting to unscale FP16 gradients."
    # (3) fp32 parameters under fp16 autocast: runs, fp32 gradients, scaler on
    assert autocast == (None, "float32", True, "float32")
    # (4) pure bf16: GradScaler accepts bf16 gradients, but the weights are bf16
    assert bf16 == (None, "bfloat16", True, "bfloat16")
    assert [o.applied for o in outcomes] == [True, False, True, True]  # applied: the step changed the weights
    assert EXERCISES["clinic_fp16_gradients_fix"].solve() == 3
    assert str(torch.finfo(torch.float16).max) == "65504.0"


def test_the_question_quotes_the_messages_the_clinic_reproduces():
    pytest.importorskip("torch")
    from labkit.train.torch.clinic import case

    assert case("fp16-params").expect in EXERCISES["clinic_fp16_gradients_fix"].question
    assert case("deepspeed-min-scale").expect in EXERCISES["deepspeed_stop_step"].question


def test_the_t5_key_is_the_one_fix_under_which_a_real_gradscaler_applies_every_step():
    torch = pytest.importorskip("torch")
    assert lf.get("fp16").max < T5_ACTIVATION < lf.get("bf16").max
    outcomes = t5_fix_outcomes()
    assert len(outcomes) == len(T5_FIXES) == 4
    higher, lower, growth, ff_fp32 = outcomes
    for scaled in (higher, lower, growth):  # no loss scale reaches the forward pass: nan, every step skipped
        assert scaled.steps_applied == scaled.finite_losses == 0 and max(scaled.amax) == float("inf")
    assert higher.scales[0] == 2.0**24 and lower.scales[0] == 1.0
    assert all(b == a / 2 for a, b in zip(growth.scales, growth.scales[1:]))  # halved at each skipped step
    assert ff_fp32.steps_applied == ff_fp32.finite_losses == T5_STEPS  # the feed-forward in fp32 holds it
    amax = max(ff_fp32.amax)
    assert abs(amax / T5_ACTIVATION - 1) < 0.05 and amax > float(torch.finfo(torch.float16).max)
    assert EXERCISES["t5_overflow_fix"].solve() == 4
    import re

    from labkit.train.torch.clinic import case

    ran = case("fp16-forward-overflow").run()  # the clinic's own case: the same block, the same two outcomes
    assert "max |ff(x)| inf" in ran.message
    held = [float(v) for v in re.findall(r"max \|ff\(x\)\| ([0-9.e+]+)", ran.fixed_output)]
    assert held and all(abs(v / T5_ACTIVATION - 1) < 0.05 for v in held)  # "about 80,000"


def test_the_deepspeed_key_is_where_the_replay_stops_and_real_deepspeed_raises():
    from labkit import scaling

    key = EXERCISES["deepspeed_stop_step"].solve()
    trace = scaling.simulate("deepspeed", overflows=[True] * 40, init_scale=2**DEEPSPEED_POWER)
    assert key == trace.stopped_at + 1 == DEEPSPEED_POWER + 2 and trace.scales[trace.stopped_at] == 1
    assert f"initial_scale_power {DEEPSPEED_POWER}" in EXERCISES["deepspeed_stop_step"].question
    default = scaling.simulate("deepspeed", overflows=[True] * 40, init_scale=2**16)  # the clinic's case
    # the replay follows DeepSpeed's own DynamicLossScaler step for step down to this floor (40 overflows:
    # tests/scaling/test_deepspeed_real.py); the clinic raises DeepSpeed's exception in the state it reached
    pytest.importorskip("torch")
    import re

    from labkit.train.torch.clinic import case

    ran = case("deepspeed-min-scale").run()
    assert re.search(r"stopped at step (\d+)", ran.message).group(1) == str(default.stopped_at + 1)
    assert key != default.stopped_at + 1  # the exercise is not answered by the case's printed step
    if importlib.util.find_spec("deepspeed") is not None:
        assert "Exception: Current loss scale already at minimum - cannot decrease scale anymore." in ran.message
