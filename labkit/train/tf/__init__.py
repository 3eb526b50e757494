"""labkit's TensorFlow/Keras room: the models, the stepper and the lessons that run on TensorFlow.

* `models`: labkit's two models in Keras 3, a dtype policy per layer (`build`, `policies`,
  `load_params`), and `import_tensorflow`, which imports TensorFlow quietly;
* `stepper`: the one training step (`make_stepper`), on one device or through a
  ``tf.distribute`` strategy; `devices`: where it runs (`find_tpu`, `make_strategy`);
* `lessons`: notebook 05's lessons (`dtypes_of`, `softmax_table`, `gradient_underflow`, ...),
  with the lessons every framework shares (`moved_fraction`, `gradient_error_table`) re-exported;
* `fit`: seed 003's Keras code through ``model.fit()`` (`fit_seed`, the loss scale per batch by
  `ScaleLog`), ``set_jit``'s real effect (`autoclustering`), no bf16 -> fp16 fallback (`bf16_fallback`);
  `nans`: a planted NaN found by ``tf.debugging.enable_check_numerics()`` (`find_nan`);
* `distributed`: ``RunConfig(devices >= 2)`` runs on ``MirroredStrategy`` in a subprocess
  (imported on first use: its subprocess runs it with ``python -m``).

>>> from labkit.train import tf as ltf
>>> ltf.policies("fp16")
{'body': 'mixed_float16', 'embed': 'float32', 'head': 'float32'}
"""

from labkit.train.lessons import GradientError, gradient_error, gradient_error_table, moved_fraction
from labkit.train.tf.devices import find_tpu, make_strategy
from labkit.train.tf.fit import Autoclustering, BF16Fallback, FitRun, ScaleLog, autoclustering, bf16_fallback, fit_seed
from labkit.train.tf.lessons import (
    cross_entropies, dtypes_of, global_policy, gradient_underflow, jit_settings, matmul_ms, normalization_check,
    run_with_xla, softmax_probabilities, softmax_table,
)
from labkit.train.tf.models import build, import_tensorflow, load_params, model_inputs, policies, variable_map
from labkit.train.tf.nans import NanHunt, find_nan
from labkit.train.tf.stepper import TFStepper, framework_state, make_stepper

__all__ = [
    "Autoclustering", "BF16Fallback", "FitRun", "NanHunt", "ScaleLog", "autoclustering", "bf16_fallback",
    "find_nan", "fit_seed",
    "GradientError", "TFStepper", "build", "cross_entropies", "distributed", "dtypes_of", "find_tpu",
    "framework_state", "global_policy", "gradient_error", "gradient_error_table", "gradient_underflow",
    "import_tensorflow", "jit_settings", "load_params", "make_stepper", "make_strategy", "matmul_ms",
    "model_inputs", "moved_fraction", "normalization_check", "policies", "run_with_xla", "softmax_probabilities",
    "softmax_table", "variable_map",
]


def __getattr__(name: str):
    if name == "distributed":  # imported on first use, so that `python -m` can run it as __main__
        import importlib

        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
