"""labkit.train.lessons: the lessons written once for every framework (moved_fraction, gradient_error)."""

import math

import numpy as np
import pytest

from labkit.train import RunConfig, gradient_error, gradient_error_table, moved_fraction
from labkit.train.lessons import GradientError

# -- gradient_error: computed by hand ------------------------------------------------------
def test_gradient_error_counts_underflow_nonfinite_and_the_errors_by_hand():
    ref = {"a": np.array([1.0, 2.0, 0.0, 4.0]), "b": np.array([[1e-8, 3.0]])}
    low = {"a": np.array([1.0, 2.5, 0.0, np.inf]), "b": np.array([[0.0, 3.0]], np.float16)}
    e = gradient_error(low, ref, how="fp16")
    assert e.underflow == {"a": 0.0, "b": 0.5}  # b's 1e-8 flushed; a's 0 is not counted (0 in the reference)
    assert e.nonfinite == 1 / 6
    assert e.max_rel_error == math.inf  # the inf entry
    assert e.rel_error == math.inf
    assert e.dtype == "float16/float64" and e.how == "fp16"
    finite = gradient_error({"a": np.array([1.0, 2.5])}, {"a": np.array([1.0, 2.0])}, dtype="bfloat16")
    assert finite.max_rel_error == 0.25 and finite.dtype == "bfloat16"
    assert finite.rel_error == pytest.approx(0.5 / math.sqrt(5.0))


def test_gradient_error_of_the_reference_itself_is_zero_everywhere():
    ref = {"w": np.linspace(-1, 1, 7)}
    e = gradient_error(ref, ref)
    assert (e.underflow, e.nonfinite, e.max_rel_error, e.rel_error) == ({"w": 0.0}, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("grads, reference, exc, match", [
    ([1.0], {"w": [1.0]}, TypeError, "grads must be a non-empty dict"),
    ({"w": [1.0]}, {}, TypeError, "reference must be a non-empty dict"),
    ({"w": [1.0]}, {"v": [1.0]}, ValueError, "the same weights"),
    ({"w": [1.0, 2.0]}, {"w": [1.0]}, ValueError, "the same sizes"),
])
def test_gradient_error_refuses_mismatched_trees(grads, reference, exc, match):
    with pytest.raises(exc, match=match):
        gradient_error(grads, reference)


def test_gradient_error_table_prints_the_zeros_per_weight_and_refuses_other_input():
    ref = {"w": np.array([1.0, 1e-8]), "v": np.array([2.0])}
    t = gradient_error_table({"fp32": gradient_error(ref, ref), "fp16": gradient_error({"w": np.array([1.0, 0.0]), "v": np.array([2.0])}, ref)},
                             names=["w"])
    assert t.columns == ("gradients", "dtype", "w zeros", "error vs float32")
    assert t.column("w zeros") == ["0.0%", "50.0%"]
    assert gradient_error_table({"x": gradient_error(ref, ref)}, detail=True).columns[-3] == "nonfinite"
    with pytest.raises(TypeError, match="dict of label -> GradientError"):
        gradient_error_table([gradient_error(ref, ref)])
    with pytest.raises(ValueError, match="names"):
        gradient_error_table({"x": gradient_error(ref, ref)}, names=["nope"])
    with pytest.raises(TypeError, match="detail must be True or False"):
        gradient_error_table({"x": gradient_error(ref, ref)}, detail="yes")
    assert isinstance(gradient_error(ref, ref), GradientError)


# -- moved_fraction (its real runs in every framework: tests/train/test_runners.py) --------------
def test_moved_fraction_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match="takes a RunConfig"):
        moved_fraction({"framework": "torch"})
    with pytest.raises(ValueError, match="one device"):
        moved_fraction(RunConfig("torch", devices=2, progress=False))
    with pytest.raises(ValueError, match="steps must be"):
        moved_fraction(RunConfig("torch", progress=False), steps=0)
