"""Collection rules for the whole repository: labkit's own ``>>>`` examples run as tests.

``pytest tests labkit`` (``make unit``, ``make test``) collects every labkit module with
``--doctest-modules``. A module that imports a framework at its top (``labkit.train.torch.stepper``
imports torch) is left out when that framework is not installed, so the core's examples still
run on a machine with none of them.
"""

import ast
import importlib.util
import os
import sys
from pathlib import Path

FRAMEWORKS = {"torch", "jax", "flax", "optax", "jmp", "tensorflow", "keras", "deepspeed", "tf_keras",
              "torchao", "optimi", "bitsandbytes", "gfloat"}  # the last four: labkit[lowp]


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


# a framework room needs its framework in every module, its __init__ included
ROOMS = {"torch": {"torch"}, "jax": {"jax", "flax", "optax"}, "tf": {"tensorflow", "keras"}}


def _needed(path: Path) -> set[str]:
    parts = path.parts[len(path.parts) - 1 - path.parts[::-1].index("labkit"):]  # from the last "labkit" on
    room = parts[2] if len(parts) > 3 and parts[1] == "train" else None
    return (_top_level_imports(path) & FRAMEWORKS) | ROOMS.get(room, set())


def _missing_framework(path: Path) -> str | None:
    for name in sorted(_needed(path)):
        if importlib.util.find_spec(name) is None:
            return name
    return None


def pytest_configure(config):
    """Strict numerics for the tests, as equinox's tests/conftest.py sets them: JAX promotes no
    dtype silently (float16 + float32 raises TypePromotionError; a Python scalar still adapts).

    Set through JAX's own environment variable, read when jax is imported, so this file imports
    no jax (none at all where it is not installed) and the child processes the distributed
    engine starts are strict too. Not under ``--nbval``: a notebook runs as a learner runs it,
    with JAX's default promotion (optax's Adam and Flax's LayerNorm promote by design).
    """
    if getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False):
        return
    os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = "strict"
    if "jax" in sys.modules:  # imported already (a plugin): set it on the live config too
        sys.modules["jax"].config.update("jax_numpy_dtype_promotion", "strict")


def pytest_ignore_collect(collection_path, config):
    path = Path(collection_path)
    if path.suffix == ".py" and "labkit" in path.parts and "tests" not in path.parts:
        return True if _missing_framework(path) else None
    return None
