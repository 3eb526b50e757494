"""labkit.train.torch.deepspeed_config refuses bad input with a ValueError/TypeError naming it (issue 12)."""

import json

import pytest

from labkit.train.torch import deepspeed_config as D


@pytest.mark.parametrize("name, bad, error", [
    ("n_params", 10**400, ValueError), ("n_params", 2.5, TypeError), ("ranks", 10**400, ValueError),
    ("ranks", True, TypeError), ("stage", 2.0, TypeError), ("stage", -1, ValueError),
])
def test_zero_memory_refuses_counts_it_cannot_divide(name, bad, error):
    with pytest.raises(error, match=name):
        D.zero_memory(**{"n_params": 1000, "ranks": 2, "stage": 2, name: bad})


@pytest.mark.parametrize("name, bad, error", [
    ("lr", 10**400, ValueError), ("lr", float("nan"), ValueError), ("lr", -1e-3, ValueError), ("lr", "1e-3", TypeError),
    ("clip", -1.0, ValueError), ("clip", float("inf"), ValueError), ("stage", 1.5, TypeError),
    ("grad_accum", 0, ValueError), ("communication_data_type", ["fp32"], TypeError),
    ("communication_data_type", "float32", ValueError), ("precision", None, TypeError),
])
def test_write_ds_config_checks_every_setting_before_writing(tmp_path, name, bad, error):
    path = tmp_path / "ds.json"
    with pytest.raises(error, match=name):
        D.write_ds_config(path, **{name: bad})
    assert not path.exists()


@pytest.mark.parametrize("bad, error", [("", ValueError), (5, TypeError), ("/dev/null/ds.json", ValueError)])
def test_write_ds_config_checks_the_path_first(bad, error):
    with pytest.raises(error, match="path"):
        D.write_ds_config(bad)


def test_the_written_config_does_not_share_the_seed_dicts(tmp_path):
    written = D.write_ds_config(tmp_path / "ds.json", "fp16")
    written["fp16"]["loss_scale"] = 128
    assert D.SEED_FP16["fp16"]["loss_scale"] == 0
    assert json.loads((tmp_path / "ds.json").read_text())["fp16"]["loss_scale"] == 0


def test_unknown_keys_of_mixed_types_are_listed_not_a_sort_error():
    with pytest.raises(ValueError, match=r"unknown keys in 'fp16': \[1, 'x'\]"):
        D.explain({"fp16": {1: 2, "x": 3}})
    assert D.explain({1: 2, "y": 3})[-1]["key"] == "1, y"


def test_simulate_loss_scale_says_what_overflows_must_be():
    with pytest.raises(TypeError, match="overflows must be a sequence of booleans"):
        D.simulate_loss_scale(D.SEED_FP16, 5)
    with pytest.raises(TypeError, match="not a string"):
        D.simulate_loss_scale(D.SEED_FP16, "..x")
