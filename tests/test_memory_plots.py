"""labkit.memory.breakdown and labkit.memory.plots: the modelled breakdown against real PyTorch runs, the reading of each
runner's memory dict, the table and the figures."""


import pytest

from labkit import bench, memory
from labkit.memory import (
    SEGMENTS,
    batch_figure,
    measured,
    memory_figure,
    memory_table,
    modelled,
)
from labkit.train import RunConfig, models, run

torch = pytest.importorskip("torch")

WIDTH = {"mlp": 48, "transformer": 32}


def torch_memory(model, precision, batch=16):
    res = run(RunConfig("torch", precision, model=model, width=WIDTH[model], batch_size=batch, steps=1,
                        dataset="synthetic", progress=False))
    return res.memory


@pytest.mark.parametrize("model", ["mlp", "transformer"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "bf16-pure"])
def test_modelled_breakdown_matches_what_torch_holds_part_by_part(model, precision):
    params = models.init_params(model, width=WIDTH[model])
    got = measured("torch", torch_memory(model, precision)).parts
    want = modelled(model, 16, precision, WIDTH[model]).parts
    for part in ("weights", "master_weights", "gradients", "weight_copies"):
        assert got[part] == want[part], part
    # torch's Adam keeps a float32 step counter per parameter tensor; the ZeRO count leaves it out
    assert got["optimizer_states"] - want["optimizer_states"] == 4 * len(params)
    # and autograd keeps one more float32 scalar with the loss (nll_loss's total weight)
    assert got["activations"] - want["activations"] == 4


def test_autocast_keeps_fp32_weights_and_adds_16_bit_copies_that_pure_bf16_does_not():
    fp32, bf16, pure = (modelled("mlp", 64, p, 256) for p in ("fp32", "bf16", "bf16-pure"))
    n = models.count_params(models.init_params("mlp", width=256))
    assert bf16.parts["weights"] == fp32.parts["weights"] == 4 * n
    assert bf16.parts["weight_copies"] == 2 * (256 * 256 + 256 * 10)  # not the first layer: its input is data
    assert fp32.parts["weight_copies"] == pure.parts["weight_copies"] == 0
    assert pure.parts["weights"] == 2 * n and pure.parts["optimizer_states"] == 4 * n
    assert fp32.total == sum(fp32.parts.values())


def test_the_states_are_the_zero_count_and_activations_the_activation_model():
    b = modelled("transformer", 8, "bf16", 32)
    n = models.count_params(models.init_params("transformer", width=32))
    states = memory.model_state_bytes(n, "autocast", "adam")
    assert all(b.parts[k] == states[k] for k in ("weights", "master_weights", "gradients", "optimizer_states"))
    assert b.parts["activations"] == memory.activation_bytes("transformer", 8, "bf16", 32)


def test_jax_memory_is_read_from_the_compiled_step_and_folds_gradients_into_temporaries():
    pytest.importorskip("jax")
    res = run(RunConfig("jax", "bf16", width=32, batch_size=16, steps=1, dataset="synthetic", progress=False))
    b = measured("jax", res.memory)
    assert b.complete and b.parts["step_temporaries"] == res.memory["step_temp_bytes"] > 0
    assert b.parts["gradients"] is None and b.parts["activations"] is None
    assert b.total == res.memory["parameter_bytes"] + res.memory["optimizer_state_bytes"] + res.memory["step_temp_bytes"]
    assert "temporaries" in b.note


def test_tensorflow_on_a_cpu_has_no_activation_count_so_no_total():
    mem = {"parameter_bytes": 400, "gradient_bytes": 400, "optimizer_state_bytes": 812}
    b = measured("tf", mem)
    assert b.total is None and not b.complete and "CPU" in b.note
    assert memory.total_bytes("tf", mem) == (None, b.note)
    on_gpu = measured("tf", dict(mem, gpu_peak_bytes=5000))
    assert memory.total_bytes("tf", dict(mem, gpu_peak_bytes=5000)) == (5000, "allocator peak")
    assert on_gpu.peak == 5000


def test_a_cuda_peak_is_preferred_to_the_sum_of_parts():
    mem = dict(parameter_bytes=4, gradient_bytes=4, optimizer_state_bytes=8, saved_activation_bytes=4,
               saved_weight_copy_bytes=0)
    assert memory.total_bytes("torch", mem) == (20, "sum of measured parts")
    assert memory.total_bytes("torch", dict(mem, cuda_max_memory_allocated_bytes=99)) == (99, "allocator peak")


@pytest.mark.parametrize("call, error, match", [
    (lambda: modelled("mlp", 8, "fp8"), ValueError, "unknown precision 'fp8'; choose one of 'fp32'"),
    (lambda: modelled("resnet", 8, "fp32"), ValueError, "unknown model 'resnet'"),
    (lambda: modelled("mlp", 0, "fp32"), ValueError, "batch_size must be an integer from 1 to 1048576"),
    (lambda: modelled("mlp", 8, "fp32", width=-3), ValueError, "width must be an integer from 1 to 65536"),
    (lambda: modelled("transformer", 8, "fp32", width=30), ValueError, "multiple of 4"),
    (lambda: measured("mxnet", {}), ValueError, "unknown framework 'mxnet'; choose one of 'torch', 'jax', 'tf'"),
    (lambda: measured("torch", [1, 2]), TypeError, "memory dict"),
    (lambda: memory_table([("torch", "fp32")]), TypeError, "records must be dicts"),
    (lambda: memory_table([{"status": "ok", "memory": {}}]), ValueError, "needs 'framework'"),
    (lambda: memory_figure([]), ValueError, "at least one finished record"),
])
def test_bad_input_is_refused_with_what_is_allowed(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.fixture(scope="module")
def records():
    return bench.bench("torch", "fp32,bf16,bf16-pure", "mlp", batch_size=32, width=32, warmup=0, steps=1)


def test_table_has_a_modelled_and_a_measured_row_per_record(records):
    t = memory_table(records)
    assert t.column("source") == ["modelled", "measured"] * 3
    assert t.column("precision") == ["fp32", "fp32", "bf16", "bf16", "bf16-pure", "bf16-pure"]
    fp32_model, fp32_measured = (float(v) for v in t.column("weights")[:2])
    assert fp32_model == fp32_measured == pytest.approx(records[0]["memory"]["parameter_bytes"] / 1e6, abs=0.005)


def test_table_can_show_the_model_alone_and_refuses_other_sources(records):
    t = memory_table(records, sources=("modelled",))
    assert t.column("source") == ["modelled"] * 3 and set(t.column("peak")) == {"n/a"}
    with pytest.raises(ValueError, match="sources must name 'modelled' and/or 'measured'"):
        memory_table(records, sources=("guessed",))


def test_difference_table_explains_every_byte_the_model_leaves_out(records):
    t = memory.difference_table(records)
    assert t.column("precision") == ["fp32", "bf16", "bf16-pure"]
    assert set(t.column("weights")) == set(t.column("gradients")) == set(t.column("16-bit weight copies")) == {"+0"}
    assert set(t.column("optimizer states")) == {"+24"} and set(t.column("activations")) == {"+4"}
    assert set(t.column("what the model leaves out")) == {
        "Adam's step counters, 4 B x 6 tensors; nll_loss's total-weight scalar, 4 B"}
    odd = dict(records[0], memory=dict(records[0]["memory"], saved_activation_bytes=1))
    assert "activations: " in memory.difference_table([odd]).column("what the model leaves out")[0]
    assert "unexplained" in memory.difference_table([odd]).column("what the model leaves out")[0]
    with pytest.raises(ValueError, match="needs finished PyTorch records"):
        memory.difference_table([dict(r, framework="jax") for r in records])


def test_memory_figure_stacks_each_part_of_each_bar(records):
    fig = memory_figure(records)
    (ax,) = fig.axes
    assert len(ax.get_xticks()) == 6
    bars = ax.patches
    nonzero = sum(1 for r in records for b in memory.plots._record_pair(r) for s in SEGMENTS if b.parts[s])
    assert len(bars) == nonzero
    # the top of the measured bf16 bar is its total
    m = measured("torch", records[1]["memory"])
    tops = [p.get_y() + p.get_height() for p in bars if abs(p.get_x() + p.get_width() / 2 - 4) < 1e-9]
    assert max(tops) == pytest.approx(m.total / 1e6)
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["weights", "gradients"]


def test_skipped_records_are_left_out_of_the_table_and_figure(records):
    skipped = dict(records[0], status="skipped", memory=None)
    assert len(memory_table([skipped, *records]).rows) == 6


def test_batch_figure_plots_speedup_and_memory_ratio_per_batch():
    recs = bench.bench("torch", "fp32,bf16", "mlp", batch_size=8, width=32, warmup=0, steps=1)
    recs += bench.bench("torch", "fp32,bf16", "mlp", batch_size=64, width=32, warmup=0, steps=1)
    fig = batch_figure(recs)
    ax, bx = fig.axes
    (speed,) = [line for line in ax.get_lines() if line.get_label() == "bf16"]
    assert list(speed.get_xdata()) == [8, 64]
    want = [recs[0]["step_time_s"] / recs[1]["step_time_s"], recs[2]["step_time_s"] / recs[3]["step_time_s"]]
    assert list(speed.get_ydata()) == pytest.approx(want)
    (ratio,) = [line for line in bx.get_lines() if line.get_label() == "bf16 measured"]
    totals = [measured("torch", r["memory"]).total for r in recs]
    assert list(ratio.get_ydata()) == pytest.approx([totals[1] / totals[0], totals[3] / totals[2]])
    (model,) = [line for line in bx.get_lines() if line.get_label() == "bf16 modelled"]
    assert model.get_ydata()[1] < model.get_ydata()[0]  # activations grow with the batch, the states do not


def test_batch_figure_can_draw_the_memory_alone():
    recs = bench.bench("torch", "fp32,bf16", "mlp", batch_size=8, width=32, warmup=0, steps=1)
    recs += bench.bench("torch", "fp32,bf16", "mlp", batch_size=64, width=32, warmup=0, steps=1)
    (bx,) = batch_figure(recs, speed=False).axes
    assert {line.get_label() for line in bx.get_lines()} >= {"bf16 measured", "bf16 modelled"}
    assert "memory" in bx.get_title()


def test_batch_figure_wants_one_framework_and_matching_batches(records):
    other = [dict(r, framework="jax") for r in records]
    with pytest.raises(ValueError, match="one framework, model and width"):
        batch_figure(records + other)
    with pytest.raises(ValueError, match="fp32 records and 16-bit records at the same batch sizes"):
        batch_figure(records[:1])


@pytest.mark.parametrize("call, error, words", [
    (lambda: measured("torch", {"parameter_bytes": float("inf")}), TypeError,
     "mem\\['parameter_bytes'\\] \\(a byte count\\) must be an integer"),  # was OverflowError
    (lambda: measured("torch", {"parameter_bytes": -1}), ValueError, "must be an integer >= 0"),
    (lambda: measured("torch", {"parameter_bytes": "10"}), TypeError, "must be an integer"),
    (lambda: modelled("mlp", 8, "fp32", width=[]), TypeError, "width must be an integer"),  # was "unhashable"
    (lambda: memory.weight_copy_elements("mlp", 0), ValueError, "width must be an integer from 1"),
    (lambda: memory_table(None), TypeError, "records must be a list"),
    (lambda: memory_table([], "modelled, measured"), ValueError, "sources must name 'modelled' and/or 'measured'"),
    (lambda: memory_figure([], dpi=0), ValueError, "dpi must be an integer from 10 to 1000"),
    (lambda: memory_figure([], dpi=2.5), TypeError, "dpi must be an integer"),
    (lambda: memory.batch_figure([], speed="no"), TypeError, "speed must be True or False"),
])
def test_bad_parts_and_figure_options_are_refused(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_byte_count_read_back_from_json_as_a_float_is_kept():
    assert measured("torch", {"parameter_bytes": 1e9}).parts["weights"] == 10**9


def test_the_model_is_counted_from_its_layout_not_built():
    """modelled() at the widest width allowed counts parameters without allocating them (a 2**16-wide
    transformer would be about 16 GB of float32 weights), and agrees with the built model where small."""
    from labkit.train.models import count_params, init_params, param_layout

    for model, width in (("mlp", 64), ("transformer", 32)):
        params = init_params(model, width=width)
        assert [(n, s) for n, s, _ in param_layout(model, width)] == [(n, v.shape) for n, v in params.items()]
        assert memory.activations.counts(model, width)[0] == count_params(params)
    n, copies, tensors = memory.activations.counts("transformer", 2**16)
    assert n > 4 * 10**9 and copies < n and tensors > 10


def test_figure_text_is_legible_at_notebook_width(records):
    ax = memory_figure(records).axes[0]
    texts = [*ax.get_xticklabels(), *ax.texts, *ax.get_legend().get_texts(), ax.title]
    assert min(t.get_fontsize() for t in texts) >= 10


def test_speed_labels_of_nearly_equal_values_do_not_overlap():
    base = dict(framework="torch", model="mlp", width=32, status="ok", memory=FP32_MEM_FOR_LABELS)
    recs = [dict(base, batch_size=b, precision=p, step_time_s=t)
            for b in (8, 64) for p, t in (("fp32", 0.02), ("bf16", 0.0100), ("bf16-pure", 0.0099))]
    fig = batch_figure(recs)
    ax = fig.axes[0]
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == 4
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert min(t.get_fontsize() for t in ax.texts) >= 10


FP32_MEM_FOR_LABELS = dict(parameter_bytes=400, gradient_bytes=400, optimizer_state_bytes=800,
                           saved_activation_bytes=400, saved_weight_copy_bytes=0)
