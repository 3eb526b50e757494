"""The data every framework trains on: the same arrays, the same batches, in the same order.

``digits`` is scikit-learn's copy of the UCI handwritten digits (1,797 images of 8x8
pixels with values 0..16, ten classes), which ships inside the scikit-learn package: no
download. ``synthetic`` has the same shapes with random content, for throughput runs.

>>> data = load("digits", seed=0)
>>> data.x_train.shape, data.x_train.dtype, data.n_classes
((1438, 64), dtype('float32'), 10)
>>> xb, yb = next(batches(data, batch_size=32, seed=0))
>>> xb.shape, yb.shape
((32, 64), (32,))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PIXEL_LEVELS = 17  # digits pixels are integers 0..16: the transformer's token vocabulary


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays: x float32 in [0, 1] (pixel / 16), y int32 class labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int = 10

    @staticmethod
    def tokens(x: np.ndarray) -> np.ndarray:
        """Pixel intensities in [0, 1] back to integer tokens 0..16 (the transformer's input)."""
        return np.rint(x * (PIXEL_LEVELS - 1)).astype(np.int32)


def load(name: str = "digits", seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load a data set and split it, reproducibly for a given seed."""
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("the digits data set ships with scikit-learn: pip install scikit-learn") from exc
        bunch = load_digits()
        x = (bunch.data / (PIXEL_LEVELS - 1)).astype(np.float32)
        y = bunch.target.astype(np.int32)
    elif name == "synthetic":
        rng = np.random.default_rng(1_000_003 + seed)
        x = (rng.integers(0, PIXEL_LEVELS, size=(2048, 64)) / (PIXEL_LEVELS - 1)).astype(np.float32)
        y = rng.integers(0, 10, size=2048).astype(np.int32)
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of digits, synthetic")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(name, x[train], y[train], x[test], y[test])


def batches(data: Dataset, batch_size: int, seed: int = 0):
    """Endless shuffled mini-batches (x, y) from the training split, epoch after epoch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    rng = np.random.default_rng(seed + 1)
    n = len(data.x_train)
    while True:
        order = rng.permutation(n)
        if batch_size > n:  # small data set, big batch: repeat the epoch
            order = np.resize(order, batch_size)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield data.x_train[idx], data.y_train[idx]
