"""labkit.memory's count of the low-precision optimizers' states (no framework needed).

The count is checked against the libraries' real state tensors in tests/train/test_lowp_optimizers.py;
here: its identities, the libraries' small-tensor rules at their edges, and bad input.
"""

import math

import pytest

from labkit import memory
from labkit.train import config

BIG = 4096 * 16  # a multiple of every block size, above every library's minimum


def test_the_optimizer_names_are_labkit_trains():
    assert memory.TORCH_OPTIMIZERS == config.TORCH_OPTIMIZERS
    assert set(config.OPTIMIZERS + config.TORCH_OPTIMIZERS) <= set(memory.OPTIMIZERS)


@pytest.mark.parametrize("layout", memory.LAYOUTS)
@pytest.mark.parametrize("optimizer", memory.OPTIMIZERS)
def test_one_large_tensor_costs_what_model_state_bytes_says_plus_its_tables_and_step(optimizer, layout):
    per_tensor = memory.optimizer_state_bytes([(BIG,)], optimizer, layout)
    assert per_tensor["total"] == sum(v for k, v in per_tensor.items() if k != "total")
    states = per_tensor["moments"] + per_tensor["scales"] + per_tensor["compensation"]
    assert states == memory.model_state_bytes(BIG, layout, optimizer)["optimizer_states"]


@pytest.mark.parametrize("layout", memory.LAYOUTS)
def test_the_new_optimizers_leave_the_other_model_states_as_adams(layout):
    adam = memory.model_state_bytes(1000, layout, "adam")
    for optimizer in memory.TORCH_OPTIMIZERS:
        other = memory.model_state_bytes(1000, layout, optimizer)
        assert {k: other[k] for k in ("weights", "master_weights", "gradients")} == \
            {k: adam[k] for k in ("weights", "master_weights", "gradients")}
    assert memory.model_state_bytes(1000, layout, "adam-sr") == adam  # stochastic rounding keeps nothing more


@pytest.mark.parametrize("optimizer, fp32_weights, bf16_weights", [
    ("adam", 8, 4), ("adam-sr", 8, 4), ("adam-kahan", 8, 6),  # Kahan: a buffer for 16-bit weights only
    ("adam-8bit", 2 + 8 / 256, 2 + 8 / 256), ("bnb-adam-8bit", 2 + 8 / 256, 2 + 8 / 256),
    ("adam-4bit", 1 + 8 / 128, 1 + 8 / 128),
])
def test_bytes_per_parameter_of_each_optimizer(optimizer, fp32_weights, bf16_weights):
    for layout, expected in (("fp32", fp32_weights), ("bf16-pure", bf16_weights)):
        assert memory.model_state_bytes(BIG, layout, optimizer)["optimizer_states"] / BIG == expected


@pytest.mark.parametrize("optimizer, quantized", [
    # torchao: >= 4096 elements and a multiple of the block (256 for 8-bit, 128 for 4-bit)
    ("adam-8bit", {4095: False, 4096: True, 4096 + 128: False, 4096 + 256: True}),
    ("adam-4bit", {4095: False, 4096: True, 4096 + 64: False, 4096 + 128: True}),
    # bitsandbytes: >= min_8bit_size = 4096, any size (the last block partial)
    ("bnb-adam-8bit", {4095: False, 4096: True, 4096 + 1: True, 4096 + 128: True}),
])
def test_small_or_ragged_tensors_stay_unquantized_as_each_library_decides(optimizer, quantized):
    q = memory.QUANTIZED[optimizer]
    for n, expected in quantized.items():
        b = memory.optimizer_state_bytes([(n,)], optimizer, "bf16-pure")
        assert (b["scales"] > 0) == expected, n
        if expected:
            assert b["moments"] == 2 * math.ceil(n * q.bits / 8) and b["scales"] == 8 * math.ceil(n / q.block)
        else:  # torchao: m and v in the weights' dtype (bf16); bitsandbytes: fp32 whatever the weights
            assert b["moments"] == 2 * n * (4 if optimizer == "bnb-adam-8bit" else 2)


def test_bitsandbytes_shares_one_pair_of_tables_torchao_has_a_pair_per_tensor():
    shapes = [(BIG,), (BIG,), (BIG,)]
    assert memory.optimizer_state_bytes(shapes, "bnb-adam-8bit")["qmaps"] == 2 * 256 * 4
    assert memory.optimizer_state_bytes(shapes, "adam-8bit")["qmaps"] == 3 * 2 * 256 * 4
    assert memory.optimizer_state_bytes(shapes, "adam-4bit")["qmaps"] == 3 * 2 * 16 * 4
    assert memory.optimizer_state_bytes([(10,)], "bnb-adam-8bit")["qmaps"] == 0  # nothing quantized, no table


def test_shapes_may_be_a_dict_pairs_or_plain_shapes():
    pairs = memory.param_shapes("mlp", 72)
    counts = {memory.optimizer_state_bytes(form, "adam-8bit", "bf16")["total"]
              for form in (pairs, dict(pairs), [s for _, s in pairs], tuple(s for _, s in pairs))}
    assert len(counts) == 1
    assert memory.optimizer_state_bytes([7], "adam") == memory.optimizer_state_bytes([(7,)], "adam")
    assert memory.optimizer_state_bytes([()], "adam")["moments"] == 8  # a scalar is one element
    assert memory.optimizer_state_bytes([], "adam")["total"] == 0


def test_optimizer_state_table_rows_follow_the_counts():
    t = memory.optimizer_state_table(memory.param_shapes("mlp"), "bf16-pure")
    assert t.column("optimizer") == list(memory.OPTIMIZERS[2:])
    totals = [int(v.replace(",", "")) for v in t.column("total bytes")]
    assert totals == [memory.optimizer_state_bytes(memory.param_shapes("mlp"), o, "bf16-pure")["total"]
                      for o in memory.OPTIMIZERS[2:]]
    assert memory.optimizer_state_table([], "fp32", ["adam"]).column("bytes per weight") == ["-"]


@pytest.mark.parametrize("call, error, match", [
    (lambda: memory.optimizer_state_bytes(3, "adam"), TypeError, "shapes must be a dict of name -> shape"),
    (lambda: memory.optimizer_state_bytes("mlp", "adam"), TypeError, "shapes must be a dict"),
    (lambda: memory.optimizer_state_bytes([(4, -1)], "adam"), ValueError, "a shape's size must be an integer"),
    (lambda: memory.optimizer_state_bytes([(4, 2.0)], "adam"), TypeError, "a shape's size must be an integer"),
    (lambda: memory.optimizer_state_bytes([{"a": 1}], "adam"), TypeError, "each shape must be a tuple"),
    (lambda: memory.optimizer_state_bytes([(4,)], "lion"), ValueError, "choose one of 'sgd', 'momentum', 'adam', 'adam-sr'"),
    (lambda: memory.optimizer_state_bytes([(4,)], "adam", "fp8"), ValueError, "unknown precision 'fp8'"),
    (lambda: memory.model_state_bytes(10, "fp32", "adam-2bit"), ValueError, "'bnb-adam-8bit'"),
    (lambda: memory.optimizer_state_table([(4,)], "fp32", ["adam", "lion"]), ValueError, "optimizers"),
])
def test_bad_input_names_what_is_allowed(call, error, match):
    with pytest.raises(error, match=match):
        call()
