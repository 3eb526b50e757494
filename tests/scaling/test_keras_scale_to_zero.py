"""The real Keras 3 LossScaleOptimizer has no floor: its scale reaches 0.0, then a clean step writes NaN."""

import math

import numpy as np
import pytest

from labkit import scaling

keras = pytest.importorskip("keras")


def test_the_real_keras_scale_reaches_zero_and_a_clean_step_then_writes_nan():
    r = scaling.keras_scale_to_zero()
    scales = r["scales"]
    assert scales[0] == 2.0**15 and scales[-1] == 0.0
    np.testing.assert_array_equal(scales[1:-1], scales[:-2] / 2)  # halved, exactly, on every overflow
    # TensorFlow flushes subnormals to zero in its CPU kernels: the last nonzero scale is then
    # float32's smallest normal, 2**-126 (142 halvings); with gradual underflow it is 2**-149 (165)
    assert (scales[-2], r["halvings"]) in ((2.0**-126, 142), (2.0**-149, 165))
    assert r["gradient"] == 0.0 and r["weight_before"] == 1.0 and math.isnan(r["weight_after"])


def test_labkits_keras_replay_with_subnormals_needs_more_halvings():
    t = scaling.simulate("keras", [True] * 170)
    zero = int(np.argmax(t.scales == 0.0))
    assert t.scales[zero - 1] == 2.0**-149 and zero == 165  # gradual underflow: 23 halvings more than TF


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, 2.0**200, "2**15", 3.0])
def test_keras_scale_to_zero_refuses_a_scale_float32_cannot_hold(bad):
    with pytest.raises((ValueError, TypeError)):
        scaling.keras_scale_to_zero(bad)
