"""DeepSpeed's config as data: no DeepSpeed needed (it is not installed here)."""

import json
import subprocess
import sys

import pytest

from labkit import memory, scaling
from labkit.train.torch import deepspeed_config as D


def test_the_module_does_not_import_deepspeed():
    code = "import sys, labkit.train.torch.deepspeed_config; print('deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("config, dtype", [
    (D.SEED_FP16, "float16"), (D.SEED_BF16, "bfloat16"), ({}, "float32"),
    ({**D.SEED_BF16, "communication_data_type": "fp32"}, "float32"),
    ({**D.SEED_FP16, "communication_data_type": "BF16"}, "bfloat16"),
])
def test_communication_dtype_follows_the_engine_rule(config, dtype):
    assert D.communication_dtype(config) == dtype


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="only one"):
        D.communication_dtype({**D.SEED_FP16, **D.SEED_BF16})
    with pytest.raises(ValueError, match="'fp16', 'bf16', 'fp32'"):
        D.communication_dtype({"communication_data_type": "fp8"})
    with pytest.raises(TypeError, match="dict"):
        D.explain([("fp16", True)])
    with pytest.raises(ValueError, match="unknown keys in 'fp16'"):
        D.explain({"fp16": {"enabled": True, "loss_scale_windows": 100}})


def test_explain_lists_every_seed_key_as_written_and_the_rest_as_defaults():
    rows = {(r["section"], r["key"]): r for r in D.explain(D.SEED_FP16)}
    for key, value in D.SEED_FP16["fp16"].items():
        assert rows[("fp16", key)]["value"] == value and not rows[("fp16", key)]["default"]
    assert rows[("fp16", "consecutive_hysteresis")]["default"]
    assert rows[("(top)", "train_batch_size")]["value"] is None  # the seed omits a required key


@pytest.mark.parametrize("n, ranks", [(10**9, 64), (1000, 4), (7, 3)])
def test_zero_memory_matches_the_paper_formulas(n, ranks):
    k = 12
    expected = {0: (2 + 2 + k) * n, 1: 4 * n + k * n / ranks, 2: 2 * n + (2 + k) * n / ranks, 3: 16 * n / ranks}
    for stage, total in expected.items():
        assert D.zero_memory(n, ranks, stage)["total"] == pytest.approx(total)
    assert D.zero_memory(n, 1, 3)["total"] == memory.model_state_bytes(n, "mixed")["total"]
    with pytest.raises(ValueError, match="stage"):
        D.zero_memory(n, ranks, 4)


def test_seed_fp16_scale_forgives_one_overflow_then_halves():
    trace = D.simulate_loss_scale(D.SEED_FP16, [False, True, False, True, False])
    assert list(trace.applied) == [True, False, True, False, True]
    assert list(trace.scales) == [2**16, 2**16, 2**16, 2**16, 2**15]  # hysteresis 2
    direct = scaling.simulate("deepspeed", overflows=[False, True, False, True, False],
                              **scaling.deepspeed_options(D.SEED_FP16)[1])
    assert list(direct.scales) == list(trace.scales)
    with pytest.raises(ValueError, match="bf16 needs none"):
        D.simulate_loss_scale(D.SEED_BF16, [False])


# Keys deepspeed/runtime/config.py (DeepSpeedConfig._initialize_params) and zero/config.py read.
DS_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
               "gradient_clipping", "optimizer", "zero_optimization", "fp16", "bf16", "communication_data_type"}
DS_OPTIMIZERS = {"Adam", "AdamW", "OneBitAdam", "Lamb", "OneBitLamb", "ZeroOneAdam", "Adagrad", "Lion"}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_write_ds_config_writes_a_config_deepspeed_can_parse(tmp_path, precision):
    path = tmp_path / "ds.json"
    written = D.write_ds_config(path, precision, stage=2, micro_batch_per_gpu=4, communication_data_type="fp32")
    cfg = json.loads(path.read_text())
    assert cfg == written and set(cfg) <= DS_TOP_KEYS
    assert cfg["train_micro_batch_size_per_gpu"] == 4  # DeepSpeed asserts a batch size is given
    assert cfg["optimizer"]["type"] in DS_OPTIMIZERS
    assert cfg["zero_optimization"] == {"stage": 2}
    assert cfg[precision]["enabled"] is True and (("bf16" if precision == "fp16" else "fp16") not in cfg)
    for row in D.explain(cfg):  # every key is one DeepSpeed's parser reads
        assert row["meaning"] != "not explained here (see DeepSpeed's config docs)"
    assert D.communication_dtype(cfg) == "float32"
    if precision == "fp16":
        assert cfg["fp16"] == D.SEED_FP16["fp16"]


def test_write_ds_config_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="'fp16' or 'bf16'"):
        D.write_ds_config(tmp_path / "x.json", "fp32")
    with pytest.raises(ValueError, match="micro_batch_per_gpu"):
        D.write_ds_config(tmp_path / "x.json", "bf16", micro_batch_per_gpu=0)
    assert not (tmp_path / "x.json").exists()


def test_explain_table_says_yes_or_no_default_for_each_key_and_halving_at_the_hysteresis_th_overflow():
    t = D.explain_table(D.SEED_FP16, "seed sets it?")
    assert t.columns == ("section", "key", "value", "seed sets it?", "meaning")
    rows = {(r[0], r[1]): r for r in t.rows}
    assert rows[("fp16", "enabled")][2:4] == ("True", "yes")
    assert rows[("bf16", "enabled")][2:4] == ("False", "no (default)")  # the seed's fp16 block leaves bf16 off
    assert set(t.column("seed sets it?")) == {"yes", "no (default)"}
    assert "halves at the hysteresis-th overflow (2: the first is forgiven" in rows[("fp16", "hysteresis")][4]
    with pytest.raises(TypeError, match="written must be a column name"):
        D.explain_table(D.SEED_FP16, written="")
