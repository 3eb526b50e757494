"""labkit's PyTorch room: the models, the one stepper with its engines, and the lessons that run on PyTorch.

* `models`: labkit's two models as ``torch.nn.Module`` s (`build`, `torch_name`, and back:
  `module_params`); `devices`: where a run runs (`resolve_device`, `check_precision`);
* `stepper`: the one training step (`make_stepper`, `TorchStepper`) with its `Engine`: one
  device, or one process of a DDP / FSDP2 (`parallel`) or DeepSpeed ZeRO (`deepspeed_engine`)
  run that ``torchrun`` starts (`worker`); `memory`: what a step holds, counted from the tensors;
* `lessons`: notebook 04's lessons (`dtypes_of`, `autocast_dtypes`, `stalled_updates`,
  `SafeLayerNorm`, `compare_layer_norms`, ...), with the lessons every framework shares
  (`moved_fraction`, `gradient_error_table`) re-exported; `seeds`: seed 004's code, verbatim;
* `distributed`: ``RunConfig(devices >= 2)`` under ``torchrun`` and its tables
  (`collectives_table`, `sharding_table`, `skip_table`); `deepspeed_config`: DeepSpeed's
  config, explained.

>>> from labkit.train import torch as lt
>>> print(lt.dtypes_of("cpu").rows[0])
('linear', 'bfloat16', 'bfloat16')
"""

from labkit.train.lessons import GradientError, gradient_error, gradient_error_table, moved_fraction
from labkit.train.torch import deepspeed_config, distributed
from labkit.train.torch.devices import check_precision, resolve_device
from labkit.train.torch.lessons import (
    SafeLayerNorm, autocast_dtypes, compare_layer_norms, dtypes_of, missing_bias_error, naive_layer_norm,
    stalled_updates, unbiased_variance_error,
)
from labkit.train.torch.models import build, module_params, torch_name
from labkit.train.torch.seeds import SeedSafeLayerNorm
from labkit.train.torch.engine import Engine
from labkit.train.torch.stepper import TorchStepper, make_stepper

__all__ = [
    "Engine", "GradientError", "SafeLayerNorm", "SeedSafeLayerNorm", "TorchStepper", "autocast_dtypes", "build",
    "check_precision", "compare_layer_norms", "deepspeed_config", "distributed", "dtypes_of", "gradient_error",
    "gradient_error_table", "make_stepper", "missing_bias_error", "module_params", "moved_fraction",
    "naive_layer_norm", "resolve_device", "stalled_updates", "torch_name", "unbiased_variance_error",
]
