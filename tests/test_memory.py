"""labkit.memory: model states as ZeRO counts them, seed 004's version, activations."""

import pytest

from labkit import memory


@pytest.mark.parametrize(
    "precision, optimizer, per_param",
    [("fp32", "adam", 16), ("mixed", "adam", 16), ("autocast", "adam", 16), ("bf16-pure", "adam", 8),
     ("fp32", "sgd", 8), ("mixed", "sgd", 8), ("fp32", "momentum", 12), ("mixed", "momentum", 12)],
)
def test_bytes_per_parameter_match_the_zero_paper(precision, optimizer, per_param):
    out = memory.model_state_bytes(1000, precision, optimizer)
    assert out["total"] == per_param * 1000
    assert out["total"] == sum(v for k, v in out.items() if k != "total")


def test_mixed_adam_is_2_2_4_4_4():
    out = memory.model_state_bytes(1, "mixed", "adam")
    assert (out["weights"], out["gradients"], out["master_weights"], out["optimizer_states"]) == (2, 2, 4, 8)


def test_seed004_analysis_claims_a_saving_that_zero_does_not():
    gib = 1024**3
    mixed = memory.seed004_memory_analysis(gib, True)
    fp32 = memory.seed004_memory_analysis(gib, False)
    assert mixed["总内存"] == 16 and fp32["总内存"] == 24  # GiB for 2^30 params: a 33% "saving"
    entries = sum(v for k, v in mixed.items() if k != "总内存")
    assert mixed["主权重内存"] == 4 and entries == 20  # the master copy, counted twice
    assert memory.model_state_bytes(gib, "mixed")["total"] == memory.model_state_bytes(gib, "fp32")["total"]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n_params=-1), ValueError, "n_params must be an integer >= 0"),
    (dict(n_params=1.5), TypeError, "n_params must be an integer"),
    (dict(n_params=True), TypeError, "n_params must be an integer"),
    (dict(n_params=10, precision="fp8"), ValueError, "choose one of 'fp32', 'mixed', 'autocast', 'bf16-pure'"),
    (dict(n_params=10, precision=[]), TypeError, "precision must be one of 'fp32'"),  # not "unhashable type"
    (dict(n_params=10, optimizer="lion"), ValueError, "choose one of 'sgd', 'momentum', 'adam'"),
])
def test_bad_input_names_what_is_allowed(kwargs, error, match):
    with pytest.raises(error, match=match):
        memory.model_state_bytes(**kwargs)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_activation_bytes_halve_in_16_bits_but_not_quite(model):
    fp32 = memory.activation_bytes(model, 64, "fp32")
    bf16 = memory.activation_bytes(model, 64, "bf16")
    pure = memory.activation_bytes(model, 64, "bf16-pure")
    assert fp32 > bf16 >= pure  # autocast keeps norm inputs and statistics in fp32
    assert bf16 / fp32 > 0.5
    assert memory.activation_bytes(model, 128, "fp32") == pytest.approx(2 * fp32, rel=1e-9)


def test_mlp_activation_elements_follow_the_layer_shapes():
    n = memory.activation_elements("mlp", 10, width=32)
    assert n == {"compute": 10 * (64 + 2 * 32), "fp32": 0, "probabilities": 0, "loss": 10 * 10, "index": 10}


def test_activation_bad_input():
    with pytest.raises(ValueError, match="'mlp', 'transformer'"):
        memory.activation_bytes("cnn", 8, "fp32")
    with pytest.raises(ValueError, match="choose one of 'fp32', 'tf32'"):
        memory.activation_bytes("mlp", 8, "mixed")
    with pytest.raises(ValueError, match="batch_size"):
        memory.activation_bytes("mlp", 0, "fp32")


# -- sizes are whole numbers >= 1, never a silent default or a negative count (issue 12) -----------
@pytest.mark.parametrize("call, error, words", [
    (lambda: memory.activation_elements("transformer", 1, -8), ValueError, "width must be an integer from 1"),
    (lambda: memory.activation_bytes("mlp", 1, "fp32", -5), ValueError, "width must be an integer from 1"),  # was 264
    (lambda: memory.activation_bytes("mlp", 1, "fp32", 0), ValueError, "width must be an integer from 1"),  # default
    (lambda: memory.activation_bytes("mlp", 1, "fp32", 2.5), TypeError, "width must be an integer"),
    (lambda: memory.activation_bytes("mlp", 1, "fp32", True), TypeError, "width must be an integer"),
    (lambda: memory.activation_bytes("mlp", 2**21, "fp32"), ValueError, "batch_size must be an integer from 1 to"),
    (lambda: memory.activation_elements("transformer", 1, 6), ValueError, "multiple of 4"),
    (lambda: memory.activation_bytes("mlp", 1, ["fp32"]), TypeError, "precision must be one of"),
    (lambda: memory.model_state_bytes(10, "fp32", ["adam"]), TypeError, "optimizer must be one of"),
    (lambda: memory.seed004_memory_analysis(0), ValueError, "model_size must be an integer from 1"),
    (lambda: memory.seed004_memory_analysis(10**400), ValueError, "model_size must be an integer from 1"),
    (lambda: memory.seed004_memory_analysis(10, "yes"), TypeError, "use_mixed_precision must be True or False"),
])
def test_sizes_and_names_are_checked(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_the_default_width_is_none_and_an_explicit_one_is_used():
    assert memory.activation_elements("mlp", 2) == memory.activation_elements("mlp", 2, 256)
    assert memory.check_sizes("transformer", 4, 64) == ("transformer", 4, 64)


def test_seed004_comparison_shows_the_mixed_total_right_and_the_fp32_total_wrong():
    t = memory.seed004_comparison(10**9)
    rows = {r[0]: r[1:] for r in t.rows}
    # (seed mixed, ZeRO mixed, seed fp32, ZeRO fp32), bytes per parameter
    assert rows["total"] == ("16", "16", "24", "16")  # the seed's mixed total is right, its fp32 total is not
    assert rows["sum of the rows above"] == ("20", "16", "24", "16")  # its mixed rows list the master copy twice
    assert rows["optimizer states (Adam)"] == ("12", "8", "16", "8")
    with pytest.raises(ValueError):
        memory.seed004_comparison(0)


# -- the shapes and the vocabulary are labkit.train's, without importing it ------------------------
def test_memory_never_imports_labkit_train():
    import subprocess
    import sys

    code = ("import sys, labkit.memory, labkit.memory.plots; "
            "print(sorted(m for m in sys.modules if m.startswith('labkit.train') or m in ('torch', 'jax', 'tensorflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_shapes_are_the_ones_labkit_train_builds():
    from labkit.memory import shapes
    from labkit.train import config, data, models

    for model in config.MODELS:
        for width in (None, 32, 64):
            assert shapes.param_shapes(model, width) == [(n, s) for n, s, _ in models.param_layout(model, width)]
    assert (shapes.N_CLASSES, shapes.N_PIXELS, shapes.DEFAULT_WIDTH) == (models.N_CLASSES, models.N_PIXELS,
                                                                      models.DEFAULT_WIDTH)
    assert shapes.PIXEL_LEVELS == data.PIXEL_LEVELS
    for width in (None, 32):
        a, b = shapes.transformer_shape(width), models.transformer_shape(width)
        assert (a.d_model, a.heads, a.layers, a.d_head) == (b.d_model, b.heads, b.layers, b.d_head)
    assert (shapes.MODELS, shapes.MAX_BATCH_SIZE, shapes.MAX_WIDTH) == (config.MODELS, config.MAX_BATCH_SIZE,
                                                                       config.MAX_WIDTH)


def test_one_vocabulary_for_precision_labkit_train_s():
    from labkit.train.config import PRECISIONS

    assert memory.PRECISIONS == PRECISIONS
    assert set(memory.LAYOUT) == set(PRECISIONS) and set(memory.LAYOUT.values()) <= set(memory.LAYOUTS)
    for precision in PRECISIONS:  # a train precision counts as its layout
        assert memory.model_state_bytes(10, precision) == memory.model_state_bytes(10, memory.LAYOUT[precision])
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose one of 'fp32', 'mixed'"):
        memory.model_state_bytes(10, "fp8")


# -- MemoryReport ------------------------------------------------------------------------------------
def test_a_memory_report_writes_the_keys_run_logs_have_always_had():
    r = memory.MemoryReport("tf", parameter_bytes=4, optimizer_state_bytes=8, device="gpu", peak_bytes=64,
                            current_bytes=32)
    assert r.to_dict() == {"parameter_bytes": 4, "optimizer_state_bytes": 8, "gpu_peak_bytes": 64,
                           "gpu_current_bytes": 32}
    assert memory.MemoryReport.from_dict("tf", r.to_dict()) == r
    jax = {"parameter_bytes": 4, "optimizer_state_bytes": 8, "step_temp_bytes": 3, "process_device_bytes_limit": 9,
           "parameter_bytes_per_device": [2, 2]}
    assert memory.MemoryReport.from_dict("jax", jax).to_dict() == jax
    assert memory.MemoryReport.from_dict("torch", {"parameter_bytes": 1e3, "replicas_of_nothing": 1}).to_dict() == \
        {"parameter_bytes": 1000}  # a float read back from JSON is its integer; an unknown key is left out


@pytest.mark.parametrize("call, error, message", [
    (lambda: memory.MemoryReport("mxnet"), ValueError, "unknown framework .mxnet.; choose one of"),
    (lambda: memory.MemoryReport("torch", parameter_bytes=-1), ValueError, "parameter_bytes must be an integer >= 0"),
    (lambda: memory.MemoryReport("torch", parameter_bytes=1.5), TypeError, "parameter_bytes must be an integer"),
    (lambda: memory.MemoryReport("torch", peak_bytes=5), ValueError, "need the device"),
    (lambda: memory.MemoryReport("torch", device="tpu", peak_bytes=5), ValueError, "need the device"),
    (lambda: memory.MemoryReport("jax", parameter_bytes_per_device=3), TypeError, "a list of byte counts"),
    (lambda: memory.MemoryReport.from_dict("torch", [1]), TypeError, "mem must be a runner's memory dict"),
    (lambda: memory.MemoryReport.from_dict("torch", {"gradient_bytes": "x"}), TypeError, "gradient_bytes"),
])
def test_a_memory_report_refuses_what_is_not_a_byte_count(call, error, message):
    with pytest.raises(error, match=message):
        call()
