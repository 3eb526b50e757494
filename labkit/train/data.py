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

from labkit._validate import integer, number, shown
from labkit.memory.shapes import PIXEL_LEVELS  # digits pixels are integers 0..16: the transformer's token vocabulary


@dataclass(frozen=True)
class Dataset:
    """Train/test arrays: x float32 in [0, 1] (pixel / 16), y int32 class labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int = 10

    def __post_init__(self):
        integer("n_classes", self.n_classes, minimum=1)

    @staticmethod
    def tokens(x: np.ndarray) -> np.ndarray:
        """Pixel intensities in [0, 1] back to integer tokens 0..16 (the transformer's input)."""
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind not in "biuf":
            raise TypeError(f"x must be an array of pixel intensities in [0, 1]; got {type(x).__name__} {shown(x)}")
        return np.rint(arr * (PIXEL_LEVELS - 1)).astype(np.int32)


def arrays(name: str = "digits", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A data set's images (float32 pixels in [0, 1], one row of 64 per image) and labels (int32),
    unsplit, in their own order; `seed` picks the synthetic set's draw (the digits are fixed)."""
    _dataset_name(name)
    seed = integer("seed", seed, minimum=0)
    if name == "digits":
        try:
            from sklearn.datasets import load_digits
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("the digits data set ships with scikit-learn: pip install scikit-learn") from exc
        bunch = load_digits()
        return (bunch.data / (PIXEL_LEVELS - 1)).astype(np.float32), bunch.target.astype(np.int32)
    if name == "synthetic":
        rng = np.random.default_rng(1_000_003 + seed)
        x = (rng.integers(0, PIXEL_LEVELS, size=(2048, 64)) / (PIXEL_LEVELS - 1)).astype(np.float32)
        return x, rng.integers(0, 10, size=2048).astype(np.int32)
    raise AssertionError(name)  # pragma: no cover - _dataset_name refused it


def _dataset_name(name) -> None:
    if not isinstance(name, str):
        raise TypeError(f"name must be a dataset name, one of digits, synthetic; got {type(name).__name__} {shown(name)}")
    if name not in ("digits", "synthetic"):
        raise ValueError(f"unknown dataset name {shown(name)}; choose one of digits, synthetic")


def load(name: str = "digits", seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load a data set (`arrays`) and split it, reproducibly for a given seed."""
    number("test_fraction", test_fraction, minimum=0, maximum=1)
    x, y = arrays(name, seed)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return Dataset(name, x[train], y[train], x[test], y[test])


def batches(data: Dataset, batch_size: int, seed: int = 0):
    """Endless shuffled mini-batches (x, y) from the training split, epoch after epoch."""
    if not isinstance(data, Dataset):
        raise TypeError(f"data must be a Dataset (load's result); got {type(data).__name__} {shown(data)}")
    integer("batch_size", batch_size, minimum=1)
    integer("seed", seed, minimum=0)
    return _batches(data, batch_size, seed)


def _batches(data: Dataset, batch_size: int, seed: int):
    rng = np.random.default_rng(seed + 1)
    n = len(data.x_train)
    while True:
        order = rng.permutation(n)
        if batch_size > n:  # small data set, big batch: repeat the epoch
            order = np.resize(order, batch_size)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield data.x_train[idx], data.y_train[idx]


__all__ = ["Dataset", "PIXEL_LEVELS", "arrays", "batches", "load"]
