"""DeepSpeed's mixed precision config (seed 004), explained as data, and the config of a real run.

Seed 004 passes ``{"fp16": {...}}`` or ``{"bf16": {"enabled": True}}`` to ``deepspeed.initialize``.
What each key does, which dtype the gradient collectives move, what ZeRO stages 0-3 keep per
rank, and how the loss scale moves -- all read from DeepSpeed 0.19.8's source (microsoft/DeepSpeed):

* ``deepspeed/runtime/precision_config.py`` (``DeepSpeedFP16Config`` / ``DeepSpeedBF16Config``:
  the keys, their defaults, ``dynamic_loss_scale_args``), ``deepspeed/runtime/config.py``
  (``get_communication_data_type``: "fp32" | "fp16" | "bf16", default None) and
  ``deepspeed/runtime/constants.py`` (the top-level defaults);
* ``deepspeed/runtime/engine.py``, ``DeepSpeedEngine.communication_data_type``: the config's
  value if set, **else fp16 when fp16 is enabled, else bf16 when bf16 is enabled, else fp32**;
  the engine hands it to ``DeepSpeedZeroOptimizer`` (``deepspeed/runtime/zero/stage_1_and_2.py``),
  which casts each gradient bucket to it before reducing it (an all-reduce of the bucket, each
  rank keeping its partition, with ``use_multi_rank_bucket_allreduce``, the default).
  So by default a bf16 run reduces gradients in bf16 -- summing in 8 significant bits -- unless you
  write ``"communication_data_type": "fp32"``; an fp16 run reduces the *scaled* fp16 gradients.

The real engine: ``RunConfig("torch", "bf16", devices=2, parallel="zero2")`` (or "zero1") runs
DeepSpeed itself under torchrun (`labkit.train.torch.worker` with `deepspeed_engine`, config from
`engine_config`) once ``pip install "labkit[deepspeed]"`` has installed it. On a CPU DeepSpeed
runs fp32 and bf16 over gloo, but refuses fp16 ("Type fp16 is not supported on your device")
unless oneDNN reports fp16 support (on x86: AVX512-FP16 or AVX-NE-CONVERT) -- so on such a CPU the fp16 block
is only simulated: `explain` and `zero_memory` are DeepSpeed's rules written as data and the
ZeRO paper's arithmetic; the loss scale comes from `labkit.scaling`'s "deepspeed" preset (a
replay of ``DynamicLossScaler`` tested against its source, step for step), fed with overflow
flags you choose, not with real fp16 gradients.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from labkit import memory, scaling
from labkit._validate import choice, integer, number, out_path, shown
from labkit.scaling.deepspeed import FP16_KEYS

SOURCE = ("microsoft/DeepSpeed 0.19.8: deepspeed/runtime/config.py, constants.py, precision_config.py, "
          "engine.py, zero/config.py, zero/stage_1_and_2.py")
CHECKED_AGAINST = "0.19.8"  # tests/distributed/test_deepspeed_config.py compares KEYS with an installed DeepSpeed

SEED_FP16 = {"fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                      "hysteresis": 2, "min_loss_scale": 1}}
SEED_BF16 = {"bf16": {"enabled": True}}

# The keys DeepSpeed's config parser reads for these sections (precision_config.py's pydantic
# models for fp16/bf16, zero/config.py for zero_optimization, constants.py for the top level),
# with their defaults and meaning; zero_optimization lists only the keys that matter here.
KEYS = {
    "fp16": FP16_KEYS,  # labkit.scaling.deepspeed holds the fp16 table: the loss scaler reads it too
    "bf16": {
        "enabled": (False, "turn on bf16: model in bf16, fp32 master weights in the optimizer; no loss scaling"),
        "immediate_grad_update": (False, "apply each gradient to the fp32 copy as soon as it is reduced"),
        "check_grad_overflow": (True, "look for inf/NaN gradients (all-reduced over ranks) and skip that step, "
                                      "as fp16 does"),
        "bf16_master_weights_and_grads": (False, "keep the ZeRO master weights and gradients in bf16, not fp32"),
        "bf16_optimizer_states": (False, "keep optimizer states in bf16 too (needs bf16_master_weights_and_grads)"),
    },
    "zero_optimization": {
        "stage": (0, "0 off, 1 shard optimizer states, 2 + gradients, 3 + parameters"),
        "reduce_scatter": (True, "stage 2: reduce-scatter gradients (each rank gets its shard) instead of all-reduce"),
        "reduce_bucket_size": (500_000_000, "elements per gradient-reduction bucket"),
        "allgather_bucket_size": (500_000_000, "elements per all-gather of updated parameters (stages 1, 2)"),
        "overlap_comm": (None, "overlap gradient reduction with the backward pass (None: True at stage 3 only)"),
        "contiguous_gradients": (True, "copy gradients into one contiguous buffer as they are produced"),
    },
    "": {  # top level
        "train_batch_size": (None, "global batch; this or train_micro_batch_size_per_gpu is required"),
        "train_micro_batch_size_per_gpu": (None, "batch per rank per forward/backward"),
        "gradient_accumulation_steps": (None, "micro-steps per optimizer step (None: from the two batch sizes, else 1)"),
        "gradient_clipping": (1.0, "clip the global norm of the unscaled gradients to this (0.0 = off)"),
        "communication_data_type": (None, "dtype of gradient collectives: 'fp32' | 'fp16' | 'bf16'; "
                                    "None = fp16 if fp16 on, else bf16 if bf16 on, else fp32"),
        "prescale_gradients": (False, "divide gradients by the world size before the reduction, not after"),
        "optimizer": (None, "{'type': 'Adam', 'params': {...}}: DeepSpeed builds the optimizer (and its scaler)"),
    },
}
_COMM = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _sections(config: dict) -> tuple[dict, dict, dict]:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (a DeepSpeed config), got {type(config).__name__}")
    fp16, bf16 = config.get("fp16", {}), config.get("bf16", config.get("bfloat16", {}))
    zero = config.get("zero_optimization", {})
    for name, sec in (("fp16", fp16), ("bf16", bf16), ("zero_optimization", zero)):
        if not isinstance(sec, dict):
            raise TypeError(f"config[{name!r}] must be a dict, got {type(sec).__name__}")
    if fp16.get("enabled") and bf16.get("enabled"):
        raise ValueError("fp16 and bf16 are both enabled; DeepSpeed accepts only one of them")
    return fp16, bf16, zero


def communication_dtype(config: dict) -> str:
    """The dtype DeepSpeed reduces gradients in for `config` (``DeepSpeedEngine.communication_data_type``).

    >>> communication_dtype(SEED_FP16), communication_dtype(SEED_BF16)
    ('float16', 'bfloat16')
    >>> communication_dtype({**SEED_BF16, "communication_data_type": "fp32"})
    'float32'
    """
    fp16, bf16, _ = _sections(config)
    value = config.get("communication_data_type")
    if value is not None:
        if not isinstance(value, str) or value.lower() not in _COMM:
            raise ValueError(f"communication_data_type must be one of 'fp16', 'bf16', 'fp32'; got {value!r}")
        return _COMM[value.lower()]
    return "float16" if fp16.get("enabled") else "bfloat16" if bf16.get("enabled") else "float32"


def explain(config: dict) -> list[dict]:
    """One row per key DeepSpeed reads from `config`'s fp16/bf16/zero/top-level sections.

    Each row: ``section``, ``key``, ``value`` (as written, or the default), ``default`` (True when
    not written), ``meaning``. Unknown keys in those sections raise ValueError (DeepSpeed would
    ignore some and reject others; a typo here is always a mistake).
    """
    _sections(config)
    rows, known_top = [], set(KEYS[""]) | {"fp16", "bf16", "bfloat16", "zero_optimization"}
    for section, keys in KEYS.items():
        given = config if section == "" else config.get(section, config.get("bfloat16") if section == "bf16" else None)
        if section == "zero_optimization" and given is None:
            continue
        given = given or {}
        if section:
            unknown = set(given) - set(keys)
            if unknown:
                raise ValueError(f"unknown keys in {section!r}: {sorted(unknown, key=str)}; "
                                 f"DeepSpeed reads {sorted(keys)}")
        for key, (default, meaning) in keys.items():
            rows.append({"section": section or "(top)", "key": key, "value": given.get(key, default),
                         "default": key not in given, "meaning": meaning})
    extra = set(config) - known_top
    if extra:
        rows.append({"section": "(top)", "key": ", ".join(sorted(map(str, extra))), "value": "...", "default": False,
                     "meaning": "not explained here (see DeepSpeed's config docs)"})
    return rows


def explain_table(config: dict, written: str = "in the config?"):
    """`explain` as a Table: section, key, value, whether `config` writes the key -- "yes", or
    "no (default)" where the value shown is DeepSpeed's default -- and its meaning. `written`
    names that column (notebook 08: "seed sets it?").

    >>> explain_table(SEED_FP16, "seed sets it?").column("seed sets it?")[:2]
    ['yes', 'no (default)']
    """
    from labkit.table import Table

    if not isinstance(written, str) or not written.strip():
        raise TypeError(f"written must be a column name (a non-empty string), got {shown(written)}")
    rows = [{**row, written: "no (default)" if row["default"] else "yes"} for row in explain(config)]
    return Table.from_dicts(rows, ["section", "key", "value", written, "meaning"])


def zero_memory(n_params: int, ranks: int, stage: int, optimizer: str = "adam") -> dict[str, float]:
    """Bytes of model states per rank under ZeRO `stage` over `ranks` (ZeRO paper, Rajbhandari et al. 2020).

    Mixed precision with Adam: 2 bytes fp16/bf16 weights, 2 gradients, K = 12 for the fp32 master
    weights and Adam's m and v (`labkit.memory.model_state_bytes(n, "mixed")`). Stage 0 keeps all
    of it on every rank: 16 bytes/param. Stage 1 shards the K part, stage 2 also the gradients,
    stage 3 also the weights:

        stage 0: (2 + 2 + K) * P      stage 1: (2 + 2) * P + K * P / N
        stage 2: 2 * P + (2 + K) * P / N          stage 3: (2 + 2 + K) * P / N

    >>> zero_memory(10**9, ranks=64, stage=3)["total"] / 1e9    # 16 GB / 64
    0.25
    """
    n_params = integer("n_params", n_params, minimum=1, maximum=2**63 - 1)  # counts that a float64 divides
    ranks = integer("ranks", ranks, minimum=1, maximum=2**63 - 1)
    stage = integer("stage", stage, minimum=0, maximum=3)
    full = memory.model_state_bytes(n_params, "mixed", optimizer)
    shard = {"weights": stage >= 3, "gradients": stage >= 2, "master_weights": stage >= 1, "optimizer_states": stage >= 1}
    out = {k: full[k] / ranks if shard[k] else float(full[k]) for k in shard}
    out["total"] = sum(out.values())
    return out


def simulate_loss_scale(config: dict, overflows) -> "scaling.Trace":
    """Replay `config`'s fp16 loss scaling over a list of overflow flags (labkit's "deepspeed" preset).

    Under ZeRO every rank all-reduces its overflow flag before the decision, so one rank's
    overflow is a True here for all of them. ValueError if fp16 is not enabled (bf16 has no scaler).
    """
    preset, options = scaling.deepspeed_options(config)
    if preset == "none":
        raise ValueError("this config does not enable fp16, so DeepSpeed does no loss scaling (bf16 needs none)")
    return scaling.simulate(preset, overflows=overflows, **options)


def write_ds_config(path, precision: str = "bf16", *, stage: int = 2, micro_batch_per_gpu: int = 8,
                    grad_accum: int = 1, lr: float = 1e-3, clip: float = 1.0,
                    communication_data_type: str | None = None) -> dict:
    """Write a DeepSpeed JSON config a GPU user can pass to ``deepspeed.initialize(config=path)``.

    `precision`: "fp16" (the seed's block: dynamic scaling from 2**16, window 1000, hysteresis 2)
    or "bf16". Adds what the seed's config lacks and DeepSpeed needs: a batch size (required),
    an optimizer (without one, ``deepspeed.initialize`` builds no optimizer and no loss scaler)
    and a ``zero_optimization`` stage. Returns the dict written.
    """
    path = out_path("path", path)
    if not isinstance(precision, str) or precision not in ("fp16", "bf16"):
        raise (ValueError if isinstance(precision, str) else TypeError)(
            f"precision must be 'fp16' or 'bf16', got {shown(precision)}")
    stage = integer("stage", stage, minimum=0, maximum=3)
    micro_batch_per_gpu = integer("micro_batch_per_gpu", micro_batch_per_gpu, minimum=1)
    grad_accum = integer("grad_accum", grad_accum, minimum=1)
    lr = number("lr", lr, minimum=0, inclusive=False)
    clip = number("clip", clip, minimum=0)
    if communication_data_type is not None:
        choice("communication_data_type", communication_data_type, tuple(_COMM))
    config = {"train_micro_batch_size_per_gpu": micro_batch_per_gpu, "gradient_accumulation_steps": grad_accum,
              "gradient_clipping": clip,
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                        "weight_decay": 0.0}},
              "zero_optimization": {"stage": stage},
              **{k: dict(v) for k, v in (SEED_FP16 if precision == "fp16" else SEED_BF16).items()}}
    if communication_data_type is not None:
        config["communication_data_type"] = communication_data_type
    Path(path).write_text(json.dumps(config, indent=2) + "\n")
    return config


def deepspeed_installed() -> bool:
    """Whether the optional DeepSpeed extra is installed (without importing it: that is slow)."""
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


INSTALL_HINT = "DeepSpeed is not installed here: pip install 'labkit[deepspeed]' to run this part for real."


def engine_config(config) -> dict:
    """The DeepSpeed config for a labkit ``RunConfig`` with ``parallel="zero1"`` or ``"zero2"``.

    The precision block is the seed's (fp16: dynamic scaling, window 1000, hysteresis 2, starting
    at ``config.init_scale`` if given -- a power of two -- else 2**16; bf16: enabled). Added:
    the per-rank batch, ``gradient_clipping`` (``config.clip_norm``; 0.0 = off -- DeepSpeed's own
    default is 1.0), ``communication_data_type`` when ``config.reduce_dtype`` is set, and Adam
    built by DeepSpeed from its ``optimizer`` block as torch's (``torch_adam``: no compiled op).

    >>> from labkit.train import RunConfig
    >>> engine_config(RunConfig("torch", "bf16", devices=2, parallel="zero2", batch_size=64))["zero_optimization"]
    {'stage': 2}
    """
    from labkit.train.config import RunConfig

    if not isinstance(config, RunConfig):
        raise TypeError(f"engine_config takes a labkit RunConfig, got {type(config).__name__}")
    if not config.parallel.startswith("zero"):
        raise ValueError(f"engine_config is for parallel='zero1' or 'zero2', got {config.parallel!r}")
    out = {"train_micro_batch_size_per_gpu": config.batch_size // config.devices, "gradient_accumulation_steps": 1,
           "gradient_clipping": 0.0 if config.clip_norm is None else float(config.clip_norm),
           "zero_optimization": {"stage": int(config.parallel[-1])},
           "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if config.optimizer == "adam":  # Adam, not AdamW (no weight decay), as the other runners
        out["optimizer"] = {"type": "Adam", "params": {"lr": float(config.lr), "betas": [0.9, 0.999], "eps": 1e-8,
                                                       "weight_decay": 0.0, "adam_w_mode": False, "torch_adam": True}}
    else:  # the worker hands DeepSpeed a torch.optim.SGD; ZeRO calls that "untested" and needs this to take it
        out["zero_allow_untested_optimizer"] = True
    if config.precision == "fp16":
        fp16 = dict(SEED_FP16["fp16"])
        if config.init_scale is not None:
            power = math.log2(config.init_scale)
            if power != int(power):
                raise ValueError(f"DeepSpeed starts its scale at 2**initial_scale_power: init_scale must be a power "
                                 f"of two, got {config.init_scale!r}")
            fp16["initial_scale_power"] = int(power)
        out["fp16"] = fp16
    elif config.precision == "bf16":
        out["bf16"] = dict(SEED_BF16["bf16"])
    if config.reduce_dtype is not None:
        out["communication_data_type"] = config.reduce_dtype
    return out


__all__ = ["CHECKED_AGAINST", "INSTALL_HINT", "KEYS", "SEED_BF16", "SEED_FP16", "SOURCE", "communication_dtype", "deepspeed_installed",
           "engine_config", "explain", "explain_table", "simulate_loss_scale", "write_ds_config", "zero_memory"]
