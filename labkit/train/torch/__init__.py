"""labkit's PyTorch room: the models, the one stepper with its engines, and the lessons that run on PyTorch.

* `models`: labkit's two models as ``torch.nn.Module`` s (`build`, `torch_name`, and back:
  `module_params`); `devices`: where a run runs (`resolve_device`, `check_precision`);
* `stepper`: the one training step (`make_stepper`, `TorchStepper`) with its `Engine`: one
  device, or one process of a DDP / FSDP2 (`parallel`) or DeepSpeed ZeRO (`deepspeed_engine`)
  run that ``torchrun`` starts (`worker`); `memory`: what a step holds, counted from the tensors;
* `lessons`: notebook 04's lessons (`dtypes_of`, `autocast_dtypes`, `stalled_updates`,
  `SafeLayerNorm`, `compare_layer_norms`, ...), with the lessons every framework shares
  (`moved_fraction`, `gradient_error_table`) re-exported; `seeds`: seed 004's code, verbatim;
  `bf16_rescue`: pure bf16 trained by stochastic rounding and Kahan summation, `rescue_checks`
  its claims (notebook 10);
* `optimizers`: ``RunConfig(optimizer=...)``'s low-precision optimizers from torchao, torch-optimi and
  bitsandbytes (`optimizers.make`, `optimizers.state_tensors`);
* `trace`: the tensors each Linear of the digits MLP really sees while it trains (`trace.capture`,
  `TensorTrace`), for `labkit.scaling.recipes` (notebook 09); `quiet`: torchao's and bitsandbytes'
  import without their noise; `threads`: `one_thread`, the small runs' one thread;
* `fp8`: the fp8 and MX precisions through torchao (`convert`, the `ScaleRecorder` whose scales land
  in ``RunResult.extra["fp8"]``, `plot_fp8_scales`, `fp8_scale_table`);
* `distributed`: ``RunConfig(devices >= 2)`` under ``torchrun`` and its tables
  (`collectives_table`, `sharding_table`, `skip_table`); `deepspeed_config`: DeepSpeed's
  config, explained;
* `underflow`: a deep narrow MLP whose fp16 gradients really underflow: fp16 without a scaler stalls,
  with GradScaler and in bf16 it tracks fp32 (`underflow_runs`, `plot_underflow_runs`, `underflow_checks`);
* `clinic`: the errors people hit in mixed precision, reproduced with the library's own message and
  fixed (`clinic.clinic()` lists them, ``clinic.case(name).run()`` shows one);
* `recipe`: the full AMP recipe run on the CPU: accumulation, several optimizers, checkpoint/resume,
  custom autograd functions, ``torch.compile``, SDPA, inference (``recipe.accumulation_table``, ...).

>>> from labkit.train import torch as lt
>>> print(lt.dtypes_of("cpu").rows[0])
('linear', 'bfloat16', 'bfloat16')
"""

from labkit.train.lessons import GradientError, gradient_error, gradient_error_table, moved_fraction
from labkit.train.torch import clinic, deepspeed_config, distributed, fp8, optimizers, quiet, trace
from labkit.train.torch.devices import check_precision, resolve_device
from labkit.train.torch.lessons import (
    SafeLayerNorm, autocast_dtypes, bf16_rescue, compare_layer_norms, dtypes_of, missing_bias_error, naive_layer_norm,
    rescue_checks, stalled_updates, unbiased_variance_error,
)
from labkit.train.torch.models import build, module_params, torch_name
from labkit.train.torch.seeds import SeedSafeLayerNorm
from labkit.train.torch.engine import Engine
from labkit.train.torch.fp8 import fp8_scale_table, plot_fp8_scales
from labkit.train.torch.stepper import TorchStepper, make_stepper
from labkit.train.torch.trace import TensorTrace
from labkit.train.torch import underflow  # loss scaling that matters in a real run (issue 15)
from labkit.train.torch.underflow import plot_underflow_runs, underflow_checks, underflow_runs
from labkit.train.torch import recipe

__all__ = [
    "Engine", "GradientError", "SafeLayerNorm", "SeedSafeLayerNorm", "TensorTrace", "TorchStepper", "autocast_dtypes",
    "bf16_rescue", "build", "check_precision", "compare_layer_norms", "deepspeed_config", "distributed", "dtypes_of",
    "fp8", "fp8_scale_table", "gradient_error", "gradient_error_table", "make_stepper", "missing_bias_error",
    "module_params", "moved_fraction", "naive_layer_norm", "optimizers", "plot_fp8_scales", "quiet", "recipe",
    "rescue_checks", "resolve_device", "stalled_updates", "torch_name", "trace", "unbiased_variance_error", "clinic",
    "underflow", "underflow_runs", "plot_underflow_runs", "underflow_checks",
]
