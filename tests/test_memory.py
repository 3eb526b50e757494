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
