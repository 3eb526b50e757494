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
    (None, "bf16", ["cast to bf16", "backward (bf16)", "not needed", "/ S", "the gradients go to fp32 unscaled"],
     ["gradients to fp32, / S"]),
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


@pytest.mark.parametrize("framework", [None, *diagrams.FRAMEWORKS])
def test_bf16_greys_both_scaling_boxes_and_fp16_without_scaling_says_they_are_off(framework):
    # notebook 00 calls them "the scaling boxes (grey)": loss x S and / S, nothing else
    steps = diagrams.loop_steps("bf16", framework=framework)
    assert [s["label"] for s in steps if not s["active"]] == ["loss x S", "/ S"]
    assert all(s["call"] is None for s in steps if not s["active"])  # no framework call does them
    assert all(s["note"].startswith("not needed") for s in steps if not s["active"])
    off = diagrams.loop_steps("fp16", scaled=False, framework=framework)
    assert [i for i, s in enumerate(off) if not s["active"]] == [3, 5]
    assert all(off[i]["note"].startswith("off") for i in (3, 5))
    assert all(s["active"] for s in diagrams.loop_steps("bf16", scaled=True, framework=framework))


@pytest.mark.parametrize("framework, call", [("jax", "jax.grad"), ("torch", ".grad"), ("tf", "tape.gradient")])
def test_with_a_framework_the_weight_gradients_leave_the_backward_pass_in_fp32(framework, call):
    # fp32 parameters cast to 16 bits: the cast's backward (JAX: its transpose) gives fp32 weight gradients,
    # so the unscale box only divides (notebook 06 prints jax.grad's float32 dtypes)
    backward, unscale = diagrams.loop_steps("fp16", framework=framework)[4:6]
    assert backward["note"].startswith("16-bit activation gradients;")
    assert call in backward["note"] and "in fp32" in backward["note"]
    assert "weight gradients" in backward["note"] and "16-bit activation and weight" not in backward["note"]
    assert unscale["label"] == "/ S (already fp32)"
    text = _texts(diagrams.master_weight_loop("fp16", framework=framework))
    assert "/ S (already fp32)" in text and "gradients to fp32" not in text
    # without a framework the figure stays the paper's: 16-bit weight gradients, converted to fp32 with the unscale
    paper = diagrams.loop_steps("fp16")
    assert paper[4]["note"] == "16-bit activation and weight gradients" and paper[5]["label"] == "gradients to fp32, / S"


def test_the_jax_weight_gradients_really_are_fp32():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    w = jnp.ones((3, 2), jnp.float32)
    grad = jax.grad(lambda w: (jnp.ones((4, 3), jnp.float16) @ w.astype(jnp.float16)).astype(jnp.float32).sum())(w)
    assert grad.dtype == jnp.float32


def _legend_labels(fig):
    labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    return labels


def test_each_diagram_has_a_colour_key_for_the_dtypes_it_draws():
    assert _legend_labels(diagrams.sharding_diagram(2, "fsdp", "bf16", reduce_dtype="fp32")) == ["fp32", "bf16"]
    assert _legend_labels(diagrams.sharding_diagram(2, "zero2", "fp16")) == ["fp32", "fp16"]
    assert _legend_labels(diagrams.sharding_diagram(2, "dp", "bf16")) == ["fp32"]  # every state and the all-reduce
    assert _legend_labels(diagrams.master_weight_loop("bf16")) == ["fp32", "bf16", "not needed"]
    assert _legend_labels(diagrams.master_weight_loop("fp16")) == ["fp32", "fp16"]
    fig = diagrams.sharding_diagram(2, "zero2")
    colours = {p.get_facecolor()[:3] for p in fig.axes[0].patches if p.get_facecolor()[3] > 0}
    keyed = {h.get_facecolor()[:3] for h in fig.axes[0].get_legend().legend_handles}
    plt.close(fig)
    assert colours == keyed  # every colour drawn is in the key, and nothing else


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
