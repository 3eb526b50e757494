"""labkit.exercises: keys computed from the real libraries, hints that fire and never leak the key, bad input refused."""

import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from labkit import exercises as ex
from labkit.exercises import EXERCISES, Feedback, check, exercises, show

NOTEBOOKS = ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11")


def _key_texts(key):
    """How a key could appear in a message (scalar keys, and a dtype's names)."""
    if isinstance(key, bool):
        return []
    if isinstance(key, str) and key in ex.DTYPE_ANSWERS:
        return [key] + [alias for alias, name in ex.core.DTYPE_ALIASES.items() if name == key and alias != "half"]
    if isinstance(key, (int, float)):
        return [f"{key:g}", repr(float(key))] if math.isfinite(key) else ["inf"]
    return []


# (exercise, wrong answer, words its hint must contain)
WRONG = [
    ("bf16_of_257", 257, "9"), ("bf16_of_257", 258, "round-half-up"), ("bf16_of_257", 259, "not a bf16 value"),
    ("fp16_of_65520", 65504.0, "even mantissa"), ("fp16_of_65520", math.nan, "never turns"),
    ("e4m3_values_in_1_2", 16, "3"), ("e4m3_values_in_1_2", 7, "includes 1.0"), ("e4m3_values_in_1_2", 9, "2.0"),
    ("fp16_smallest_subnormal", 6.1e-5, "normal"), ("fp16_smallest_subnormal", 2.98e-8, "threshold"),
    ("fp16_smallest_subnormal", 1.4e-45, "fp32"),
    ("fp16_of_5e_8", 0.0, "up"), ("fp16_of_5e_8", 5e-8, "multiples"),
    ("loss_scale_for_sample", 3e5, "power of two"), ("loss_scale_for_sample", 2.0**16, "common default"),
    ("loss_scale_for_sample", 2.0**30, "overflow"), ("loss_scale_for_sample", 2.0**18, "Scale up"),
    ("gradscaler_after_2_overflows", 2.0**16, "halves"), ("gradscaler_after_2_overflows", 2.0**14, "doubles"),
    ("bf16_update_1e_3", 1.001, "2^-7"), ("bf16_update_1e_3", 1.0078125, "half the gap"),
    ("precision_for_rtx_4090", "fp16 + loss scaling", "exponent range"), ("precision_for_rtx_4090", "fp16", "bf16"),
    ("precision_for_rtx_4090", "fp32", "Tensor Cores"), ("precision_for_gtx_1080", "fp16 + loss scaling", "1/64"),
    ("precision_for_gtx_1080", "fp16", "consumer Pascal"), ("precision_for_gtx_1080", "bf16", "no bf16"),
    ("precision_for_gtx_1080", "fp8", "Ada"),
    ("flax_grad_dtype", "bf16", "seed's claim"), ("flax_grad_dtype", "float16", "Nothing here is float16"),
    ("resume_scale_without_state", 2.0**10, "left it out"), ("resume_scale_without_state", 1, "unscaled"),
    ("resume_scale_without_state", 2.0**15, "Keras"), ("resume_scale_without_state", 2.0**9, "init_scale default"),
    ("resume_scale_without_state", 1000, "powers of two"),
    ("keras_scale_after_overflows", 2.0**15, "halves"), ("keras_scale_after_overflows", 2.0**13, "torch's 2^16"),
    ("keras_scale_after_overflows", 2.0**22, "not one per batch"),
    ("keras_scale_after_overflows", 2.0**11, "too often"),
    ("keras_scale_after_overflows", 2.0**14, "Count the halvings"),
    ("keras_scale_after_overflows", 5000, "power of two"),
    ("keras_logits_dtype", "fp32", "compute_dtype"), ("keras_logits_dtype", "bfloat16", "mixed_bfloat16"),
    ("jmp_scale_after_overflows", 2.0**12, "exactly one period"), ("jmp_scale_after_overflows", 2.0**14, "too high"),
    ("jmp_scale_after_overflows", 2.0**16, "where the overflows left"),
    ("jmp_scale_after_overflows", 2.0**15, "divides"),
    ("jmp_scale_after_overflows", 2.0**40, "once per period"), ("jmp_scale_after_overflows", 2.0**10, "Count"),
    ("jmp_scale_after_overflows", 8000, "power of two"),
    ("amp_step_order", ["backward", "clip", "unscale_", "step", "update"], "clips the *scaled* gradients"),
    ("amp_step_order", ["backward", "unscale_", "clip", "update", "step"], "update() before step()"),
    ("amp_step_order", ["backward", "unscale_", "clip", "step"], "never moves"),
    ("amp_step_order", ["backward", "step", "unscale_", "clip", "update"], "after step()"),
    ("amp_step_order", ["backward", "unscale_", "step", "clip", "update"], "already used"),
    ("bf16_needs_grad_scaler", True, "exponent"),
    ("mxfp8_floor_500", 500.0, "below 500"), ("mxfp8_floor_500", math.nan, "clamp"), ("mxfp8_floor_500", 512.0, "RCEIL"),
    ("mxfp8_floor_500", 480.0, "NaN"),
    ("adam_state_bytes_fp32", 4.0, "two states"), ("adam_state_bytes_fp32", 16.0, "only"),
    ("e2m1_values", 16, "once"), ("e2m1_values", 8, "negative"),
    ("adam_state_bytes_8bit", 2, "block scales"), ("adam_state_bytes_8bit", 2.015625, "own blocks"),
    ("model_states_7b_gb", 56, "pure bf16"), ("model_states_7b_gb", 140, "master copy"),
    ("model_states_7b_gb", 98, "weight's dtype"), ("model_states_7b_gb", 84, "all four"),
    ("model_states_7b_gb", 126, "16-bit copy"), ("model_states_7b_gb", 104.3, "GiB"),
    ("model_states_7b_gb", 168, "seed 004"), ("model_states_7b_gb", 16, "bytes per parameter"),
    ("model_states_7b_gb", 1.12e11, "unit"),
    ("mfu_h100_transformer", 25.26, "percentage"), ("mfu_h100_transformer", 3.73, "fp32 peak"),
    ("mfu_h100_transformer", 0.1263, "sparsity"), ("mfu_h100_transformer", 0.0842, "forward pass only"),
    ("mfu_h100_transformer", 0.0002526, "1000"), ("mfu_h100_transformer", 0.505, "TF32"),
    ("zero2_bytes_per_param", 0.25, "stage 3"), ("zero2_bytes_per_param", 4.1875, "stage 1"),
    ("zero2_bytes_per_param", 16, "stage 0"), ("zero2_bytes_per_param", 0.21875, "bf16 weights"),
    ("zero2_bytes_per_param", 2.15625, "master weights"), ("zero2_bytes_per_param", 2.25, "gradients are bf16"),
    ("fsdp2_gather_dtype", "fp32", "before* it gathers"), ("fsdp2_gather_dtype", "bf16", "examples"),
    ("fsdp2_default_reduce_dtype", "fp32", "compute dtype"),
    ("fsdp2_default_reduce_dtype", "torch.bfloat16", "examples"),
]


@pytest.mark.parametrize("exercise_id, answer, words", WRONG, ids=[f"{e}-{a}" for e, a, _ in WRONG])
def test_a_wrong_answer_gets_the_hint_for_its_misconception_and_not_the_key(exercise_id, answer, words):
    fb = check(exercise_id, answer)
    assert isinstance(fb, Feedback) and not fb.correct and not fb
    assert words in fb.message
    exercise = EXERCISES[exercise_id]
    for text in _key_texts(exercise.solve()):  # a number the question itself states may be said again
        assert text not in fb.message or text in exercise.question, f"the message prints the key {text}"


def test_the_keys_agree_with_ml_dtypes_and_numpy():
    bf16 = lambda x: float(np.float64(x).astype(ml_dtypes.bfloat16))  # noqa: E731
    with np.errstate(over="ignore"):
        assert EXERCISES["fp16_of_65520"].solve() == float(np.float16(65520.0)) == math.inf
    assert EXERCISES["bf16_of_257"].solve() == bf16(257.0) == 256.0
    assert EXERCISES["fp16_smallest_subnormal"].solve() == float(np.finfo(np.float16).smallest_subnormal)
    assert EXERCISES["bf16_update_1e_3"].solve() == bf16(1.0 + 1e-3)
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(float)
    assert EXERCISES["e4m3_values_in_1_2"].solve() == np.count_nonzero((e4m3 >= 1) & (e4m3 < 2))
    assert not EXERCISES["bf16_needs_grad_scaler"].solve()
    e2m1 = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(float)
    assert EXERCISES["e2m1_values"].solve() == len(np.unique(e2m1)) == 15  # np.unique: -0.0 == 0.0


def test_the_keras_exercises_match_a_real_keras_loss_scale_optimizer_and_dense():
    # Keras' import takes seconds (tests/scaling's conformance tests import it too); its steps are milliseconds
    pytest.importorskip("tensorflow")
    from labkit.train.tf.models import keras

    v = keras.Variable(np.zeros(1, np.float32))
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=1.0))  # its defaults
    opt.build([v])
    overflows, clean = ex.frameworks.KERAS_OVERFLOWS
    for overflow in [True] * overflows + [False] * clean:
        opt.apply([keras.ops.convert_to_tensor(np.full(1, np.inf if overflow else 1.0, np.float32))], [v])
    final = float(opt.dynamic_scale.numpy())
    assert check("keras_scale_after_overflows", final) and EXERCISES["keras_scale_after_overflows"].solve() == final
    assert not check("keras_scale_after_overflows", 2 * final)

    old = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")  # seed 003, section 2.1
    try:
        model = keras.Sequential([keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
        logits = model(np.zeros((4, 64), np.float32))
    finally:
        keras.mixed_precision.set_global_policy(old)
    assert check("keras_logits_dtype", keras.backend.standardize_dtype(logits.dtype))
    assert not check("keras_logits_dtype", "float32")


def test_the_jmp_exercise_matches_a_real_jmp_dynamic_loss_scale():
    jax = pytest.importorskip("jax")
    jmp = pytest.importorskip("jmp")
    import jax.numpy as jnp

    overflows, clean = ex.frameworks.JMP_STEPS
    finite = jnp.array([False] * overflows + [True] * clean)
    scale = jmp.DynamicLossScale(jnp.float32(2**15), period=2000, factor=2)  # as the question writes it
    with jax.numpy_dtype_promotion("standard"):  # jmp's adjust multiplies an int32 by a bool; the suite is strict
        scale, _ = jax.lax.scan(lambda s, ok: (s.adjust(ok), None), scale, finite)  # 2003 eager adjusts: seconds
    assert check("jmp_scale_after_overflows", float(scale.loss_scale))
    assert not check("jmp_scale_after_overflows", float(scale.loss_scale) / 2)


def test_the_resume_exercise_matches_a_real_gradscaler_that_was_not_saved():
    torch = pytest.importorskip("torch")
    import inspect

    # GradScaler("cuda") on a machine without CUDA warns and disables itself: read the default, run one on the CPU
    assert inspect.signature(torch.amp.GradScaler).parameters["init_scale"].default == 2.0**16
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=0.1)
    old = torch.amp.GradScaler("cpu")
    for _ in range(6):  # six overflows: the old run's scale moves down to 2^10
        opt.zero_grad()
        old.scale((w * torch.tensor([1.0, math.inf])).sum()).backward()
        old.step(opt)
        old.update()
    assert old.get_scale() == ex.amp.RESUME_SETTLED
    saved = old.state_dict()
    fresh = torch.amp.GradScaler("cpu")  # resumed without loading the scaler's state
    assert check("resume_scale_without_state", fresh.get_scale())
    fresh.load_state_dict(saved)  # what saving it would have kept
    assert not check("resume_scale_without_state", fresh.get_scale())


def test_every_exercise_accepts_its_own_key_and_says_why():
    for exercise_id, exercise in EXERCISES.items():
        key = exercise.solve()
        if exercise.kind == "precision":
            answers = sorted(key)
        elif exercise.kind == "dtype":
            answers = [key, key.upper(), *[alias for alias, name in ex.core.DTYPE_ALIASES.items() if name == key]]
        elif exercise_id == "loss_scale_for_sample":
            lo, hi = key[:2]
            answers = [2.0**e for e in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
        else:
            answers = [list(key) if exercise.kind == "calls" else key]
        assert answers, exercise_id
        for answer in answers:
            fb = check(exercise_id, answer)
            assert fb.correct and fb.message and str(fb).startswith("✓"), (exercise_id, answer)


def test_numbers_within_the_stated_tolerance_are_right_and_outside_it_wrong():
    assert check("fp16_smallest_subnormal", 5.96e-8)
    assert check("fp16_smallest_subnormal", 6e-8)
    assert not check("fp16_smallest_subnormal", 6.2e-8)
    assert check("adam_state_bytes_8bit", 2.031)


def test_the_loss_scale_range_follows_the_sample():
    g = np.abs(ex.gradient_sample()).astype(np.float64)
    assert np.array_equal(ex.gradient_sample(), ex.gradient_sample())  # deterministic
    ok = [e for e in range(40) if g.max() * 2.0**e <= 65504 and g.min() * 2.0**e >= 2.0**-14]
    assert len(ok) >= 2
    assert [e for e in range(40) if check("loss_scale_for_sample", 2.0**e)] == ok


def test_precision_keys_come_from_labkit_hardware():
    from labkit import hardware

    from labkit.exercises.precision import PRECISION_GPUS

    for gpu, notebooks in PRECISION_GPUS.items():
        exercise_id = f"precision_for_{gpu.lower().replace(' ', '_')}"
        assert EXERCISES[exercise_id].notebooks == notebooks
        headline = hardware.advise(hardware.example_report(gpu)).headline
        assert check(exercise_id, headline)
        fp8 = "fp8" in hardware.example_report(gpu).gpus[0].tensor_core_dtypes
        assert bool(check(exercise_id, "fp8")) is fp8
    assert check("precision_for_rtx_4090", " bfloat16 ") and check("precision_for_gtx_1080", "float32")
    assert not check("precision_for_gtx_1080", "FP16 with loss scaling")
    # applying 00's rule, not reading its tables: the GPUs are none of the rows notebook 00 prints
    assert not set(PRECISION_GPUS) & {"T4", "L4", "A100", "P100", "P40", "RTX 3090", "V100", "H100"}


def test_the_gradient_dtype_exercise_follows_a_real_flax_dense_and_not_the_seed():
    pytest.importorskip("flax")
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    model = nn.Dense(3, dtype=jnp.bfloat16, param_dtype=jnp.float32)  # seed 000's SimpleDense layer
    x = jnp.ones((2, 5), jnp.bfloat16)
    params = model.init(jax.random.PRNGKey(1), x)
    grads = jax.grad(lambda p: model.apply(p, x).astype(jnp.float32).sum())(params)
    assert {g.dtype.name for g in jax.tree.leaves(grads)} == {"float32"}
    assert check("flax_grad_dtype", "float32") and check("flax_grad_dtype", "fp32")
    assert not check("flax_grad_dtype", "bfloat16")


def test_gradscaler_exercise_matches_a_real_torch_gradscaler():
    torch = pytest.importorskip("torch")
    # GradScaler.update() runs this kernel (torch/amp/grad_scaler.py): call it directly, 2002 backward passes
    # through a real GradScaler take 14 s on two cores.
    scale, tracker = torch.full((1,), 2.0**16), torch.zeros(1, dtype=torch.int32)
    for step in range(2002):
        torch._amp_update_scale_(scale, tracker, torch.full((1,), float(step < 2)), 2.0, 0.5, 2000)
    assert torch.amp.GradScaler("cpu").get_growth_interval() == 2000
    assert check("gradscaler_after_2_overflows", float(scale))
    assert not check("gradscaler_after_2_overflows", float(scale) * 2)


def _run_amp_order(torch, order):
    """One step of `order` with a real torch.amp.GradScaler: the update it made, or the error it raised."""
    g = torch.tensor([0.3, 0.4])  # norm 0.5, clipped to max_norm=0.25: clipping changes the update
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    calls = {"scaler.scale(loss).backward()": lambda: scaler.scale((w * g).sum()).backward(),
             "scaler.unscale_(opt)": lambda: scaler.unscale_(opt),
             "clip": lambda: torch.nn.utils.clip_grad_norm_([w], max_norm=0.25),
             "scaler.step(opt)": lambda: scaler.step(opt), "scaler.update()": lambda: scaler.update()}
    try:
        for _ in range(2):  # two iterations: a missing update() shows in the second
            opt.zero_grad()
            for name in order:
                calls[name]()
    except (RuntimeError, AssertionError) as e:
        return str(e)
    return w.detach().clone()


def test_amp_order_verdicts_match_what_a_real_gradscaler_does():
    torch = pytest.importorskip("torch")
    right = _run_amp_order(torch, ex.AMP_ORDER)
    assert torch.allclose(right, torch.tensor([-0.3, -0.4]))  # two SGD steps on the true gradient, clipped to half
    import itertools

    orders = [[ex.AMP_ORDER[0], *p] for p in itertools.permutations(ex.AMP_ORDER[1:])] + [  # backward first
        [*p] for p in itertools.permutations(ex.AMP_ORDER[:3])] + [
        [n for n in ex.AMP_ORDER if n != drop] for drop in ex.AMP_ORDER[1:]]
    for order in orders:
        outcome = _run_amp_order(torch, order)
        same = not isinstance(outcome, str) and torch.allclose(outcome, right)
        fb = check("amp_step_order", order)
        if fb.correct:
            assert same, (order, outcome)
        elif "clip" in order:  # an order judged wrong really breaks the step (raises, or updates differently)
            assert not same, (order, fb.message)
        quoted = fb.message.split("RuntimeError ('")[1].split("')")[0] if "RuntimeError ('" in fb.message else None
        if quoted:  # a hint that quotes torch's error: torch raises it for this order
            assert isinstance(outcome, str) and quoted in outcome, (order, outcome, quoted)


def test_mx_dequantize_matches_torchao_to_mx():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from labkit.train.torch.quiet import quiet_import

    with quiet_import():
        from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode, to_mx
    block = torch.tensor([500.0, 300.0, 1.0, -77.0, 0.01] + [2.0] * 27)
    for mode in ("floor", "rceil"):
        scale, data = to_mx(block, torch.float8_e4m3fn, 32, getattr(ScaleCalculationMode, mode.upper()))
        theirs = data.float() * 2.0 ** (scale.view(torch.uint8).float() - 127)
        ours = [ex.mx_dequantize(float(x), 500.0, mode) for x in block]
        assert theirs.flatten().tolist() == ours, mode
    assert check("mxfp8_floor_500", ex.mx_dequantize(500.0, 500.0))


def test_8bit_adam_state_bytes_match_torchao():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao")
    from labkit.train.torch.quiet import quiet_import

    with quiet_import():
        from torchao.optim import Adam8bit
        from torchao.optim.subclass_8bit import OptimState8bit
    import inspect

    block = inspect.signature(Adam8bit).parameters["block_size"].default
    assert block == ex.BLOCK_8BIT
    n = 4096  # Adam8bit quantizes a tensor of >= 4096 values divisible by the block (torchao/optim/adam.py)
    # Its step is torch.compile'd (minutes on two cores): build m and v as its _new_buffer does, by
    # OptimState8bit.zeros(shape, signed, block_size) -- m signed, v unsigned.
    states = [OptimState8bit.zeros((n,), signed, block) for signed in (True, False)]
    nbytes = sum(s.codes.nbytes + s.scale.nbytes for s in states)
    assert all(s.scale.dtype == torch.float32 for s in states)
    assert check("adam_state_bytes_8bit", nbytes / n)
    assert check("adam_state_bytes_fp32", 2 * torch.zeros(1).element_size())


def test_the_model_state_exercise_counts_what_a_real_torch_adam_holds_under_autocast():
    torch = pytest.importorskip("torch")
    layer = torch.nn.Linear(64, 32)  # fp32 weights: autocast leaves them so
    opt = torch.optim.Adam(layer.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = layer(torch.randn(8, 64)).float().square().mean()
    loss.backward()
    opt.step()
    params = list(layer.parameters())
    n = sum(p.numel() for p in params)
    nbytes = sum(t.numel() * t.element_size() for p in params
                 for t in (p, p.grad, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]))
    assert all(p.grad.dtype == torch.float32 for p in params)
    from labkit.exercises.memory import MODEL_PARAMS

    assert nbytes / n == 16
    assert check("model_states_7b_gb", MODEL_PARAMS * nbytes / n / 1e9)
    assert not check("model_states_7b_gb", MODEL_PARAMS * nbytes / n / 2**30)  # GiB


def test_the_mfu_exercise_follows_labkit_bench_and_the_dense_peak():
    from labkit import bench
    from labkit.exercises.memory import MFU_STEP

    # an H100 SXM names itself "NVIDIA H100 80GB HBM3" to torch.cuda.get_device_name()
    assert bench.peak("cuda:0 (NVIDIA H100 80GB HBM3)").chip == bench.peak(MFU_STEP["device"]).chip == "H100 SXM"
    peak = bench.PEAK_TFLOPS["H100 SXM"]["bf16"] * 1e12  # dense: half the datasheet's 1979 "with sparsity"
    flops = bench.train_flops("transformer", 256, 1024)
    mfu = flops / MFU_STEP["seconds"] / peak
    assert 0 < mfu < 1 and check("mfu_h100_transformer", mfu) and check("mfu_h100_transformer", round(mfu, 3))
    assert "sparsity" in check("mfu_h100_transformer", flops / MFU_STEP["seconds"] / (2 * peak)).message


def test_the_zero_exercise_agrees_with_the_zero_formula_of_each_stage():
    pytest.importorskip("torch")  # labkit.train.torch imports torch
    from labkit.exercises.sharding import ZERO_RANKS
    from labkit.train.torch.deepspeed_config import zero_memory

    per_rank = {s: zero_memory(10**6, ZERO_RANKS, s)["total"] / 10**6 for s in range(4)}
    assert check("zero2_bytes_per_param", per_rank[2])
    for stage, words in ((0, "stage 0"), (1, "stage 1"), (3, "stage 3")):
        assert words in check("zero2_bytes_per_param", per_rank[stage]).message


def test_the_fsdp2_exercises_follow_torchs_fully_shard_source():
    pytest.importorskip("torch")
    import inspect

    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    gather = inspect.getsource(FSDPParam.all_gather_inputs.fget)
    assert "_to_dtype_if_needed(sharded_param_data, self.param_dtype)" in gather  # cast, then gather
    assert check("fsdp2_gather_dtype", "fp16") and not check("fsdp2_gather_dtype", "fp32")
    assert not check("fsdp2_gather_dtype", "bf16")
    assert MixedPrecisionPolicy().reduce_dtype is None
    assert "reduction\n            uses the compute dtype" in MixedPrecisionPolicy.__doc__
    assert "reduce_dtype = reduce_dtype or grad_dtype" in inspect.getsource(_fsdp_collectives.foreach_reduce)
    assert check("fsdp2_default_reduce_dtype", "torch.float16") and not check("fsdp2_default_reduce_dtype", "fp32")
    assert "torch.float16" in EXERCISES["fsdp2_gather_dtype"].question  # not the notebook's bf16 examples


def test_bad_input_raises_and_names_what_is_allowed():
    with pytest.raises(ValueError, match="bf16_of_257"):
        check("no_such_exercise", 1)
    with pytest.raises(TypeError, match="exercise_id"):
        check(7, 1)
    with pytest.raises(TypeError, match="a number"):
        check("bf16_of_257", "256")
    with pytest.raises(TypeError, match="True or False"):
        check("bf16_needs_grad_scaler", 1)
    with pytest.raises(TypeError, match="whole number"):
        check("e4m3_values_in_1_2", 8.0)
    with pytest.raises(ValueError, match="'bf16'"):
        check("precision_for_rtx_4090", "tf32-ish")
    with pytest.raises(ValueError, match="a dtype name: 'fp32', 'bf16' or 'fp16'"):
        check("flax_grad_dtype", "fp16 + loss scaling")
    with pytest.raises(TypeError, match="a dtype name"):
        check("flax_grad_dtype", 32)
    with pytest.raises(ValueError, match="scaler.update"):
        check("amp_step_order", ["backward", "optimizer.zero_grad()"])
    with pytest.raises(TypeError, match="list of call names"):
        check("amp_step_order", "backward")
    with pytest.raises(ValueError, match="choose one of"):
        exercises("99")
    with pytest.raises(ValueError, match="taken"):
        ex.register(EXERCISES["bf16_of_257"])


def test_exercises_cover_the_notebooks_and_show_their_questions():
    table = exercises()
    assert len(table.rows) == len(EXERCISES) >= 18
    for nb in NOTEBOOKS:
        assert exercises(nb).rows, nb
    assert exercises(1).rows == exercises("01").rows
    text = str(show("bf16_of_257"))
    assert "257" in text and "check('bf16_of_257'" in text and "256" not in text
    fb = check("bf16_of_257", 258)
    assert "✗" in fb._repr_html_() and "258" in repr(fb)


def test_exercises_import_no_framework():
    code = ("import sys, labkit.exercises, labkit.diagrams; "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'keras', 'torchao') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("exercise_id", sorted(EXERCISES))
def test_none_is_the_placeholder_it_asks_for_an_answer_and_gives_nothing_away(exercise_id):
    fb = check(exercise_id, None)
    assert not fb and not fb.answered and str(fb).startswith("… your turn")
    assert "replace None with" in fb.message and "✗" not in fb._repr_html_()
    assert all(not isinstance(h.say, str) or h.say not in fb.message for h in EXERCISES[exercise_id].hints)


def test_feedback_without_an_answer_cannot_be_right():
    with pytest.raises(ValueError, match="no answer"):
        ex.Feedback("bf16_of_257", True, "x", answered=False)
    with pytest.raises(TypeError, match="answered"):
        ex.Feedback("bf16_of_257", False, "x", answered="no")


def test_the_dtype_kind_takes_the_names_a_learner_would_write():
    for answer in ("fp32", "float32", " Float32 ", "torch.float32", "jnp.float32", np.dtype("float32")):
        assert check("flax_grad_dtype", answer), answer
    assert check("fsdp2_gather_dtype", "half") and check("fsdp2_gather_dtype", np.dtype("float16"))
    assert not check("flax_grad_dtype", np.dtype(ml_dtypes.bfloat16))
    # dtype objects too, by their names, no framework imported
    assert check("flax_grad_dtype", np.float32) and not check("flax_grad_dtype", ml_dtypes.bfloat16)
    for exercise in EXERCISES.values():  # a dtype question does not list its answers: the footer does
        if exercise.kind == "dtype":
            assert "'fp32'" not in exercise.question and "work too" not in exercise.question, exercise.id
            assert "'fp32', 'bf16' or 'fp16'" in str(exercise)


class _Printed:
    """An object that prints as a framework's dtype does (no framework is imported for it)."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.mark.parametrize("text, right", [("torch.float32", True), ("torch.bfloat16", False),
                                         ("<dtype: 'float32'>", True), ("<class 'jax.numpy.float32'>", True),
                                         ("<dtype: 'float16'>", False)])
def test_the_dtype_kind_takes_a_framework_dtype_by_the_name_it_prints(text, right):
    assert bool(check("flax_grad_dtype", _Printed(text))) is right  # a learner's p.grad.dtype, x.dtype, tf.float32


def test_the_dtype_kind_refuses_what_is_not_a_dtype_and_names_the_answers():
    with pytest.raises(ValueError, match="a dtype name"):
        check("flax_grad_dtype", _Printed("torch.int32"))  # a dtype, but none of the answers
    for answer in (object(), ["fp32"], 16, 1.5, True):
        with pytest.raises(TypeError, match="a dtype name"):
            check("flax_grad_dtype", answer)


def test_a_real_torch_dtype_is_an_answer():
    torch = pytest.importorskip("torch")
    assert check("fsdp2_gather_dtype", torch.float16) and check("fsdp2_gather_dtype", torch.zeros(1).half().dtype)
    assert not check("fsdp2_gather_dtype", torch.float32)
