"""labkit.diagrams: the master-weight loop and the sharding picture name the right steps, facts from labkit."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from labkit import diagrams  # noqa: E402
from labkit.memory import model_state_bytes  # noqa: E402


def _texts(fig):
    out = [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]
    plt.close(fig)
    return "\n".join(out)


@pytest.mark.parametrize("framework, dtype, present, absent", [
    (None, "fp16", ["FP32 master weights", "cast to fp16", "forward (fp16)", "loss x S", "backward (fp16)",
                    "gradients to fp32, / S", "fp32 update", "Micikevicius"], ["not needed"]),
    (None, "bf16", ["cast to bf16", "backward (bf16)", "not needed", "gradients to fp32"], ["/ S\n"]),
    ("torch", "fp16", ["torch.autocast", "torch.float16", "scaler.scale(loss)", "scaler.unscale_(opt)",
                       "scaler.step(opt)", "PyTorch"], ["bfloat16"]),
    ("torch", "bf16", ["torch.bfloat16", "not needed"], ["scaler."]),
    ("jax", "fp16", ["cast_to_compute", "loss_scale.scale(loss)", "loss_scale.unscale", "optax", "float16"],
     ["bfloat16"]),
    ("jax", "bf16", ["cast_to_compute", "Flax dtype=bfloat16", "optax"], ["loss_scale"]),
    ("tf", "fp16", ["mixed_float16", "LossScaleOptimizer.scale_loss", "LossScaleOptimizer.apply"], ["bfloat16"]),
    ("tf", "bf16", ["mixed_bfloat16"], ["LossScaleOptimizer"]),
])
def test_the_loop_names_each_step_and_the_frameworks_calls(framework, dtype, present, absent):
    text = _texts(diagrams.master_weight_loop(dtype, framework=framework))
    for word in present:
        assert word in text, word
    for word in absent:
        assert word not in text, word


def test_each_figure_is_closed_so_a_notebook_shows_it_once():
    for fig in (diagrams.master_weight_loop("fp16"), diagrams.sharding_diagram(2, "zero2")):
        assert not plt.fignum_exists(fig.number)  # the inline backend would draw an open figure a second time


def test_bf16_greys_the_scale_box_and_fp16_without_scaling_says_it_is_off():
    grey = [s["label"] for s in diagrams.loop_steps("bf16") if not s["active"]]
    assert grey == ["loss x S"]
    off = diagrams.loop_steps("fp16", scaled=False)
    assert not off[3]["active"] and off[3]["note"].startswith("off")
    assert all(s["active"] for s in diagrams.loop_steps("bf16", scaled=True))


@pytest.mark.parametrize("strategy", diagrams.STRATEGIES)
@pytest.mark.parametrize("world", [2, 4])
def test_each_ranks_bytes_agree_with_labkits_memory_counts(strategy, world):
    plan = diagrams.sharding_plan(world, strategy)
    if strategy.startswith("zero"):
        pytest.importorskip("torch")
        from labkit.train.torch.deepspeed_config import zero_memory

        expected = zero_memory(10**6, ranks=world, stage=int(strategy[-1]))["total"] / 10**6
    else:
        full = model_state_bytes(1, "autocast", "adam")["total"]  # DDP/FSDP2 keep fp32 weights under autocast
        expected = full if strategy == "dp" else full / world
    assert plan["bytes_per_param"] == pytest.approx(expected)


def test_collectives_move_the_dtypes_the_engines_use():
    ops = lambda *a, **k: {c["op"]: c["dtype"] for c in diagrams.sharding_plan(*a, **k)["collectives"]}  # noqa: E731
    assert ops(2, "dp") == {"all-reduce": "fp32"}  # DDP: the gradients' own dtype, fp32 under autocast
    assert ops(2, "dp", reduce_dtype="bf16") == {"all-reduce": "bf16"}  # bf16_compress_hook
    assert ops(2, "fsdp") == {"all-gather": "bf16", "reduce-scatter": "bf16"}  # FSDP2: param_dtype by default
    assert ops(2, "fsdp", reduce_dtype="fp32")["reduce-scatter"] == "fp32"
    pytest.importorskip("torch")
    from labkit.train.torch.deepspeed_config import SEED_BF16, SEED_FP16, communication_dtype

    names = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
    for dtype, config in (("fp16", SEED_FP16), ("bf16", SEED_BF16)):
        assert ops(2, "zero2", dtype)["all-reduce"] == names[communication_dtype(config)]


def test_the_sharding_diagram_draws_one_shard_per_rank():
    fig = diagrams.sharding_diagram(4, "fsdp")
    ax = fig.axes[0]
    shards = [p for p in ax.patches if abs(p.get_width() - 0.9 / 4) < 1e-9]
    assert len(shards) == 4 * len(diagrams.sharding_plan(4, "fsdp")["states"])
    text = _texts(fig)
    assert "all-gather in bf16" in text and "reduce-scatter in bf16" in text and "rank 3" in text
    assert "ranks 0-7 drawn" in _texts(diagrams.sharding_diagram(16, "zero1"))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="dtype"):
        diagrams.master_weight_loop("fp8")
    with pytest.raises(ValueError, match="framework"):
        diagrams.master_weight_loop("fp16", framework="pytorch")
    with pytest.raises(TypeError, match="scaled"):
        diagrams.master_weight_loop("fp16", scaled="yes")
    with pytest.raises(ValueError, match="world"):
        diagrams.sharding_diagram(0)
    with pytest.raises(ValueError, match="strategy"):
        diagrams.sharding_diagram(2, "zero3")
    with pytest.raises(ValueError, match="reduce_dtype"):
        diagrams.sharding_plan(2, "dp", reduce_dtype="int8")
