"""Real 2-process DeepSpeed ZeRO stage 1 / 2 runs under torchrun (gloo on 127.0.0.1).

DeepSpeed is an optional extra (``labkit[deepspeed]``): without it every run here skips, and
only the checks that need no DeepSpeed (the clear error, the config) run. CI installs it.
DeepSpeed is only imported in the worker processes, never in this one.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from labkit.train.torch import deepspeed_config
from labkit.train import report
from labkit.train.torch import distributed as torch_dist
from labkit.train import RunConfig, run
from labkit.train.models import init_params

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="DeepSpeed not installed (pip install 'labkit[deepspeed]')")

BASE = {"framework": "torch", "model": "mlp", "width": 32, "batch_size": 32, "steps": 4, "progress": False}
BF16_TOL = 2e-2
N_PARAMS = sum(int(p.size) for p in init_params("mlp", seed=0, width=32).values())


@pytest.fixture(scope="module")
def single_bf16():
    return run(RunConfig(precision="bf16", **BASE))


@pytest.fixture(scope="module")
def zero2_bf16():
    return run(RunConfig(precision="bf16", devices=2, parallel="zero2", **BASE))


@pytest.fixture(scope="module")
def zero1_fp32_reduce_overflow():
    """ZeRO-1, bf16 with the reduction in fp32, and an inf in rank 1's gradient at step 1."""
    return run(RunConfig(precision="bf16", devices=2, parallel="zero1", reduce_dtype="fp32",
                         inject_overflow=(1,), **BASE))


# -- the engine really runs, and matches one process ------------------------------------------
@needs_deepspeed
def test_zero2_bf16_matches_the_single_process_bf16_run(zero2_bf16, single_bf16):
    assert zero2_bf16.status == "ok" and len(zero2_bf16.losses) == BASE["steps"]
    np.testing.assert_allclose(zero2_bf16.losses, single_bf16.losses, rtol=BF16_TOL)
    assert zero2_bf16.losses[-1] < zero2_bf16.losses[0]
    assert "DeepSpeed" in zero2_bf16.device and "ZeRO stage 2" in zero2_bf16.device and "gloo" in zero2_bf16.device
    assert zero2_bf16.extra["engine"] == "deepspeed" and zero2_bf16.extra["zero_stage"] == 2


@needs_deepspeed
def test_deepspeed_reduces_bf16_gradients_in_bf16_by_default_and_all_gathers_bf16_weights(zero2_bf16):
    extra = zero2_bf16.extra
    assert extra["communication_data_type"] == "bf16" and extra["reduce_dtype"] == "bf16"
    assert "communication_data_type" not in extra["ds_config"]  # DeepSpeed's own default, not ours
    ops = {(c["op"], c["dtype"]): c["elements"] for c in extra["collectives"]}
    assert ops[("allreduce", "bf16")] == N_PARAMS  # every gradient once
    gathered = ops[("allgather_base", "bf16")]  # the updated weights: the flat buffer, padded to split evenly
    assert N_PARAMS <= gathered < N_PARAMS + 2 * 8 and gathered % 2 == 0
    assert extra["comm_bytes_per_step"] == sum(c["bytes"] for c in extra["collectives"])


@needs_deepspeed
def test_communication_data_type_fp32_moves_the_gradients_in_fp32(zero1_fp32_reduce_overflow):
    extra = zero1_fp32_reduce_overflow.extra
    assert extra["ds_config"]["communication_data_type"] == "fp32"
    assert extra["reduce_dtype"] == "fp32" and extra["communication_data_type"] == "fp32"
    biggest = max((c for c in extra["collectives"] if c["op"] == "allreduce"), key=lambda c: c["elements"])
    assert biggest["elements"] == N_PARAMS and biggest["bytes"] == 4 * N_PARAMS


@needs_deepspeed
def test_every_rank_holds_all_bf16_weights_and_half_of_the_fp32_master_and_adam_states(zero2_bf16):
    extra = zero2_bf16.extra
    assert {p["dtype"] for p in extra["sharding"]} == {"bf16"}
    assert all(p["local_shape"] == [p["shape"], p["shape"]] for p in extra["sharding"])
    for mem in extra["memory_by_rank"]:
        assert mem["parameter_bytes"] == 2 * N_PARAMS
        master = mem["master_weight_bytes"] // 4
        assert N_PARAMS / 2 <= master < N_PARAMS / 2 + 8  # one partition, padded
        assert mem["optimizer_state_bytes"] == 2 * 4 * master  # m and v, fp32, for the partition only
    predicted = deepspeed_config.zero_memory(N_PARAMS, ranks=2, stage=2)
    assert predicted["master_weights"] == 4 * N_PARAMS / 2
    assert abs(extra["memory_by_rank"][0]["master_weight_bytes"] - predicted["master_weights"]) < 4 * 8
    table = report.zero_memory_table(zero2_bf16)
    assert table.column("rank 1 bytes") == [str(extra["memory_by_rank"][1][k]) for k in
                                            ("parameter_bytes", "master_weight_bytes", "optimizer_state_bytes")]
    assert table.column(f"ZeRO-2 formula, {N_PARAMS} params") == [
        f"{predicted[k]:.0f}" for k in ("weights", "master_weights", "optimizer_states")]


@needs_deepspeed
def test_a_bf16_overflow_on_one_rank_skips_the_step_on_every_rank(zero1_fp32_reduce_overflow):
    res = zero1_fp32_reduce_overflow
    extra = res.extra
    assert extra["skipped_by_rank"] == [[False, True, False, False]] * 2
    assert extra["local_grads_finite_by_rank"] == [[True] * 4, [True, False, True, True]]
    assert res.status == "ok" and all(math.isfinite(x) for x in res.losses)
    assert math.isinf(res.grad_norms[1]) and all(math.isfinite(g) for i, g in enumerate(res.grad_norms) if i != 1)


# -- fp16: a real run where DeepSpeed takes it, a clear refusal where it does not ----------------
@needs_deepspeed
def test_fp16_runs_deepspeeds_scaler_or_is_refused_with_the_reason():
    config = RunConfig(precision="fp16", devices=2, parallel="zero2", inject_overflow=(1,), **BASE)
    if not torch_dist._cpu_has_fp16():
        with pytest.raises(ValueError, match="DeepSpeed refuses fp16 on this CPU.*AVX512-FP16"):
            run(config)
        return
    res = run(config)  # a CPU with fp16 kernels: DeepSpeed's own DynamicLossScaler, on every rank
    trace = deepspeed_config.simulate_loss_scale(deepspeed_config.SEED_FP16, [i == 1 for i in range(BASE["steps"])])
    assert res.scales == list(trace.scales)
    assert res.extra["skipped_by_rank"] == [[i == 1 for i in range(BASE["steps"])]] * 2


# -- checks that need no DeepSpeed ------------------------------------------------------------
def test_without_deepspeed_a_zero_run_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install 'labkit\[deepspeed\]'"):
        run(RunConfig(precision="bf16", devices=2, parallel="zero2", **BASE))


@pytest.mark.parametrize("changes, message", [
    ({"framework": "jax"}, "DeepSpeed ZeRO, which runs PyTorch models"),
    ({"devices": 1}, "set devices >= 2"),
    ({"precision": "bf16-pure"}, "DeepSpeed's engine runs precision fp32, bf16, fp16"),
    ({"precision": "fp32", "inject_overflow": (1,)}, "inject_overflow needs precision='fp16'"),
])
def test_zero_configs_deepspeed_cannot_run_are_refused_before_anything_starts(changes, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**{**BASE, "precision": "bf16", "devices": 2, "parallel": "zero2", **changes})


def test_engine_config_carries_the_seeds_blocks_and_the_run_settings():
    bf16 = deepspeed_config.engine_config(RunConfig(precision="bf16", devices=2, parallel="zero1", **BASE))
    assert bf16["bf16"] == deepspeed_config.SEED_BF16["bf16"] and "fp16" not in bf16
    assert bf16["train_micro_batch_size_per_gpu"] == 16 and bf16["zero_optimization"] == {"stage": 1}
    assert bf16["gradient_clipping"] == 1.0 and bf16["optimizer"]["params"]["torch_adam"] is True
    fp16 = deepspeed_config.engine_config(RunConfig(precision="fp16", devices=2, parallel="zero2",
                                                    init_scale=1024.0, reduce_dtype="fp32", clip_norm=None, **BASE))
    assert fp16["fp16"] == {**deepspeed_config.SEED_FP16["fp16"], "initial_scale_power": 10}
    assert fp16["communication_data_type"] == "fp32" and fp16["gradient_clipping"] == 0.0
    sgd = deepspeed_config.engine_config(RunConfig(precision="fp32", devices=2, parallel="zero2", optimizer="sgd",
                                                   **BASE))
    assert "optimizer" not in sgd and sgd["zero_allow_untested_optimizer"] is True
    with pytest.raises(ValueError, match="power of two"):
        deepspeed_config.engine_config(RunConfig(precision="fp16", devices=2, parallel="zero2", init_scale=1000.0,
                                                 **BASE))
    with pytest.raises(ValueError, match="zero1' or 'zero2"):
        deepspeed_config.engine_config(RunConfig(precision="bf16", devices=2, parallel="dp", **BASE))
    with pytest.raises(TypeError, match="RunConfig"):
        deepspeed_config.engine_config({"bf16": {"enabled": True}})


# -- labkit's account of DeepSpeed's keys is DeepSpeed's own ----------------------------------
_DUMP = """
import json, warnings
warnings.simplefilter("ignore")
from deepspeed.runtime import constants
from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
fields = lambda m: {k: f.default for k, f in m.model_fields.items()}
top = {"gradient_clipping": constants.GRADIENT_CLIPPING_DEFAULT,
       "communication_data_type": constants.COMMUNICATION_DATA_TYPE_DEFAULT,
       "prescale_gradients": constants.PRESCALE_GRADIENTS_DEFAULT,
       "gradient_accumulation_steps": constants.GRADIENT_ACCUMULATION_STEPS_DEFAULT}
print(json.dumps({"fp16": fields(DeepSpeedFP16Config), "bf16": fields(DeepSpeedBF16Config),
                  "zero_optimization": fields(DeepSpeedZeroConfig), "": top}, default=str))
"""


@needs_deepspeed
def test_keys_and_defaults_are_the_installed_deepspeeds():
    out = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, timeout=300, check=True)
    real = json.loads(out.stdout.strip().splitlines()[-1])
    for section in ("fp16", "bf16"):  # every key, exactly
        assert {k: v[0] for k, v in deepspeed_config.KEYS[section].items()} == real[section]
    for key, (default, _) in deepspeed_config.KEYS["zero_optimization"].items():
        assert str(real["zero_optimization"][key]).replace(",", "") == str(default)
    for key, value in real[""].items():
        assert deepspeed_config.KEYS[""][key][0] == value
