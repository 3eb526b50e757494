"""The JAX/Flax room: models, one stepper (a mesh is an option), the devices and mesh, HLO reading, lessons,
NaN hunting with ``jax_debug_nans`` (`find_nan`).

Notebooks import from here, e.g. ``from labkit.train import jax as ljax`` or
``from labkit.train.jax import make_stepper, hlo_summary``.
"""

from labkit.train.jax.devices import make_mesh, shard_dim
from labkit.train.jax.hlo import Collective, HloSummary, collectives, hlo_summary, hlo_text, total_bytes
from labkit.train.jax.lessons import (JmpJitTrap, dtype_tree, dtypes_of, jmp_and_flax_limits, jmp_and_flax_scales,
                                      jmp_trajectory, jmp_under_jit, ops_by_dtype, scaled_gradients)
from labkit.train.jax.models import build, named
from labkit.train.jax.nans import NanHunt, find_nan
from labkit.train.jax.seeds import SimpleDense, predict
from labkit.train.jax.stepper import JaxStepper, make_stepper

__all__ = ["NanHunt", "find_nan",
           "Collective", "HloSummary", "JaxStepper", "JmpJitTrap", "SimpleDense", "build", "collectives", "dtype_tree",
           "dtypes_of", "hlo_summary", "hlo_text", "jmp_and_flax_limits", "jmp_and_flax_scales", "jmp_trajectory",
           "jmp_under_jit", "make_mesh", "make_stepper", "named", "ops_by_dtype", "predict", "scaled_gradients",
           "shard_dim", "total_bytes"]
