"""labkit's DeepSpeed presets against the installed DeepSpeed's own loss scalers, step for step.

A subprocess (DeepSpeed is imported there only, never in this process: its import warns)
builds each config with DeepSpeed's ``DeepSpeedConfig`` and hands it to the real optimizer
classes the way ``deepspeed/runtime/engine.py`` does (DeepSpeed 0.19.8):

* ZeRO stage 1 / 2 -- ``_configure_zero_optimizer``: ``DeepSpeedZeroOptimizer(...,
  static_loss_scale=loss_scale(), dynamic_loss_scale=dynamic_loss_scale(),
  dynamic_loss_args=dynamic_loss_scale_args())``, which calls ``CreateLossScaler``;
* no ZeRO -- ``_configure_fp16_optimizer``: a ``LossScaleConfig`` (profile FUSED with
  ``initial_dynamic_scale()``, or UNFUSED with None), then ``FP16_Optimizer`` or
  ``FP16_UnfusedOptimizer``. (The engine picks the fused one for a FusedAdam, which
  needs a GPU; both classes run their ``_update_scale`` on a CPU.)

Each optimizer's ``_update_scale(overflow)`` -- what its ``step()`` calls with the overflow
flag -- is driven over an overflow sequence; the scale before each step (and ZeRO's
hysteresis after it) is compared with ``labkit.scaling.simulate(*deepspeed_options(config))``.
The step skipping itself is not exercised here (it needs the engine's backward).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from labkit import scaling

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
pytestmark = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="DeepSpeed not installed (pip install 'labkit[deepspeed]')")

X, _ = True, False
SEED_004 = {"fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                     "hysteresis": 2, "min_loss_scale": 1}}
CONFIGS = {
    "no-scaling-key": {"fp16": {"enabled": True}},
    "seed004": SEED_004,
    "power-8": {"fp16": {"enabled": True, "initial_scale_power": 8}},
    "static-128": {"fp16": {"enabled": True, "loss_scale": 128}},
    "small-window": {"fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2,
                              "min_loss_scale": 2}},
    "consecutive": {"fp16": {"enabled": True, "initial_scale_power": 3, "loss_scale_window": 2, "hysteresis": 3,
                             "consecutive_hysteresis": True}},
}
_rng = np.random.default_rng(2024)
OVERFLOWS = {
    "short": [_, X, _, X, X, _, _, X, _, _, _, _],
    # an overflow, then exactly window + 1 clean steps: the growth lands on the last one (window 1000)
    "window": [X] + [_] * 1001 + [X, X] + [_] * 1000 + [X] + [_] * 1001,
    "random": (_rng.random(400) < 0.3).tolist(),
    "floor": [X] * 40,
}
PATHS = {"zero1": "zero", "zero2": "zero", "fused": "fp16", "unfused": "fp16"}

_REAL = r"""
import json, os, shutil, sys, tempfile, warnings
warnings.simplefilter("ignore")
import torch
import torch.distributed as tdist
from deepspeed import comm as dist
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig, LossScaleProfile
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from deepspeed.utils.timer import NoopTimer

job = json.loads(sys.stdin.read())
tmp = tempfile.mkdtemp()
tdist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"), rank=0, world_size=1)
dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # DynamicLossScaler logs via dist.get_rank()


def build(config, path):
    stage = {"zero1": 1, "zero2": 2}.get(path, 0)
    fp16 = DeepSpeedConfig({**config, "train_batch_size": 1, "zero_optimization": {"stage": stage}}).float16_config
    # DeepSpeedEngine.loss_scale / dynamic_loss_scale / dynamic_loss_scale_args / initial_dynamic_scale
    static, dynamic, args = fp16.loss_scale, fp16.loss_scale == 0, fp16.dynamic_loss_scale_args()
    model = torch.nn.Linear(4, 2).half()
    inner = torch.optim.SGD(model.parameters(), lr=0.0)
    if stage:  # DeepSpeedEngine._configure_zero_optimizer
        names = {p: n for n, p in model.named_parameters()}
        opt = DeepSpeedZeroOptimizer(inner, names, timers=NoopTimer(), optimizer_params={},
                                     static_loss_scale=static, dynamic_loss_scale=dynamic, dynamic_loss_args=args,
                                     dp_process_group=dist.get_world_group(), partition_grads=stage == 2)
        s = opt.loss_scaler
        facts = {"class": type(s).__name__, "dynamic": s.dynamic, "cur_scale": s.cur_scale}
        if s.dynamic:
            facts.update(scale_window=s.scale_window, min_scale=s.min_scale, delayed_shift=s.delayed_shift,
                         consecutive_hysteresis=s.consecutive_hysteresis, scale_factor=s.scale_factor,
                         raise_error_at_min_scale=s.raise_error_at_min_scale)
        return opt, facts
    # DeepSpeedEngine._configure_fp16_optimizer
    profile = LossScaleProfile.FUSED if path == "fused" else LossScaleProfile.UNFUSED
    lsc = LossScaleConfig(low_precision_dtype=torch.float16, dynamic_loss_scale=dynamic, static_loss_scale=static,
                          dynamic_loss_args=args, profile=profile,
                          initial_dynamic_scale=fp16.initial_dynamic_scale() if profile == LossScaleProfile.FUSED
                          else None)
    cls = FP16_Optimizer if path == "fused" else FP16_UnfusedOptimizer
    opt = cls(inner, loss_scale_config=lsc, low_precision_dtype=torch.float16)
    c = opt.loss_scale_config
    facts = {"class": cls.__name__, "dynamic": c.dynamic_loss_scale, "cur_scale": c.cur_scale}
    if c.dynamic_loss_scale:
        facts.update(scale_window=c.scale_window, min_scale=c.min_loss_scale, scale_factor=c.scale_factor)
    return opt, facts


out = {}
for cname, config in job["configs"].items():
    for path in job["paths"]:
        for sname, flags in job["overflows"].items():
            opt, facts = build(config, path)
            scaler = getattr(opt, "loss_scaler", None)
            scales, hyst, stopped = [], [], None
            for i, overflow in enumerate(flags):
                scales.append(opt.loss_scale)
                try:
                    opt._update_scale(overflow)
                except Exception as e:  # DynamicLossScaler at min_scale
                    if "minimum" not in str(e):
                        raise
                    stopped = i
                if scaler is not None and scaler.dynamic:
                    hyst.append(scaler.cur_hysteresis)
                if stopped is not None:
                    break
            out[f"{cname}|{path}|{sname}"] = {"facts": facts, "scales": scales, "hysteresis": hyst,
                                               "stopped": stopped, "final": opt.loss_scale,
                                               "types": sorted({type(v).__name__ for v in scales + [opt.loss_scale]})}
tdist.destroy_process_group()
shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real():
    job = json.dumps({"configs": CONFIGS, "paths": list(PATHS), "overflows": OVERFLOWS})
    done = subprocess.run([sys.executable, "-c", _REAL], input=job, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seq", list(OVERFLOWS))
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cname", list(CONFIGS))
def test_simulate_matches_deepspeeds_own_scaler_step_for_step(real, cname, path, seq):
    ref = real[f"{cname}|{path}|{seq}"]
    preset, options = scaling.deepspeed_options(CONFIGS[cname], optimizer=PATHS[path])
    ours = scaling.simulate(preset, OVERFLOWS[seq], **options)
    assert ours.scales.tolist() == ref["scales"]
    assert ours.final_scale == ref["final"]
    assert ours.stopped_at == ref["stopped"]
    if preset == "deepspeed":
        assert ours.hysteresis.tolist() == ref["hysteresis"]
    else:
        assert ref["hysteresis"] == []  # no hysteresis outside ZeRO


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("cname", list(CONFIGS))
def test_options_are_the_arguments_deepspeed_builds_its_scaler_with(real, cname, path):
    facts = real[f"{cname}|{path}|short"]["facts"]
    preset, options = scaling.deepspeed_options(CONFIGS[cname], optimizer=PATHS[path])
    if preset == "static":
        assert facts["dynamic"] is False and facts["cur_scale"] == options["loss_scale"]
        assert facts["class"] in ("LossScaler", "FP16_Optimizer", "FP16_UnfusedOptimizer")
        return
    assert facts["dynamic"] is True and facts["scale_factor"] == 2.0
    assert (facts["cur_scale"], facts["scale_window"], facts["min_scale"]) == (
        options["init_scale"], options["loss_scale_window"], options["min_loss_scale"])
    if preset == "deepspeed":
        assert facts["class"] == "DynamicLossScaler"
        assert facts["delayed_shift"] == options["hysteresis"]
        assert facts["consecutive_hysteresis"] == options["consecutive_hysteresis"]
        assert facts["raise_error_at_min_scale"] is scaling.PRESETS["deepspeed"].defaults["raise_error_at_min_scale"]


def test_an_fp16_section_without_scaling_keys_starts_at_2_16_with_hysteresis_2(real):
    # DeepSpeed 0.19.8: DeepSpeedFP16Config.dynamic_loss_scale_args() always returns the defaults;
    # the 2**32 of DynamicLossScaler's docstring and of LOSS_SCALE_PROFILE_DEFAULTS[FUSED] is not reached.
    for path in PATHS:
        facts = real[f"no-scaling-key|{path}|short"]["facts"]
        assert facts["cur_scale"] == 2**16 and facts["scale_window"] == 1000 and facts["min_scale"] == 1
    assert real["no-scaling-key|zero2|short"]["facts"]["delayed_shift"] == 2
    assert real["no-scaling-key|zero2|short"]["facts"] == real["seed004|zero2|short"]["facts"]


def test_zero_raises_at_the_floor_and_the_optimizers_without_zero_stay_there(real):
    # 2**16 -> 1 takes 16 halvings after the one overflow hysteresis 2 forgives; the 18th raises
    assert real["seed004|zero1|floor"]["stopped"] == 17 and real["seed004|zero1|floor"]["final"] == 1
    fused = real["seed004|fused|floor"]
    assert fused["stopped"] is None and fused["scales"][16:] == [1] * 24


def test_the_scale_is_a_python_int_until_it_first_changes_then_a_float(real):
    assert real["seed004|zero2|short"]["types"] == ["float", "int"]  # 65536, then 32768.0 ...
    assert real["static-128|fused|short"]["types"] == ["float"]  # loss_scale is a pydantic float: 128.0
