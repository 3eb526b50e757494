"""Shared tiny configs for the runner tests: one size of model for every framework.

`framework` is parametrised over torch, jax and tf; a framework that is not installed is
skipped (pytest.importorskip), never failed. A per-framework test module overrides it::

    @pytest.fixture
    def framework():
        return "torch"

and then takes `tiny` (a RunConfig factory), `digits` and `first_batch` like test_runners.py.
Every config is small (an MLP of width 32, a transformer of width 8, batches of 16 and 8), so
that each real run stays a fraction of a second on two shared cores.
"""

import pytest

from labkit.train import RunConfig
from labkit.train import data as D

FRAMEWORKS = ("torch", "jax", "tf")
NEEDS = {"torch": ("torch",), "jax": ("jax", "flax", "optax", "jmp"), "tf": ("tensorflow", "keras")}

TINY = dict(width=32, batch_size=16, progress=False)
# width 8: XLA's compile time on a CPU grows with the transformer's width, and it dominates a run
TINY_TRANSFORMER = dict(TINY, model="transformer", width=8, batch_size=8)


def needs(framework: str) -> None:
    """Skip the calling test cleanly when `framework`'s packages are not installed."""
    for module in NEEDS[framework]:
        pytest.importorskip(module)


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    needs(request.param)
    return request.param


@pytest.fixture
def tiny(framework):
    """``tiny(**changes)``: a small RunConfig for `framework` (the transformer's when model="transformer")."""

    def make(**changes) -> RunConfig:
        base = TINY_TRANSFORMER if changes.get("model") == "transformer" else TINY
        return RunConfig(**{"framework": framework, **base, **changes})

    return make


@pytest.fixture(scope="session")
def digits():
    return D.load("digits", seed=0)


@pytest.fixture
def first_batch(digits):
    """``first_batch(cfg)``: the first (x, y) batch a run of `cfg` trains on (seed 0 digits)."""

    def make(cfg: RunConfig):
        assert cfg.dataset == "digits" and cfg.seed == 0, "first_batch holds the seed-0 digits"
        return next(D.batches(digits, cfg.batch_size, seed=cfg.seed))

    return make
