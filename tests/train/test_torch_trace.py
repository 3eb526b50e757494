"""The tensor trace of the digits MLP: the recorded inputs, weights and output gradients are the
ones the training step really used, checked against the data, the initial weights and a float64
reference of the loss gradient."""

import numpy as np
import pytest

pytest.importorskip("torch")

from labkit.train import data as D  # noqa: E402
from labkit.train import models  # noqa: E402
from labkit.train.torch import trace  # noqa: E402

STEPS, WIDTH, BATCH = 2, 16, 8


@pytest.fixture(scope="module")
def tr():
    return trace.capture(steps=STEPS, width=WIDTH, seed=0, batch_size=BATCH)


def test_each_linear_layer_has_one_array_per_step(tr):
    assert tr.layers == ("dense1", "dense2", "out")
    shapes = {"dense1": (64, WIDTH), "dense2": (WIDTH, WIDTH), "out": (WIDTH, 10)}
    for name, (fan_in, fan_out) in shapes.items():
        assert tr.activations[name].shape == (STEPS, BATCH, fan_in)
        assert tr.weights[name].shape == (STEPS, fan_out, fan_in)
        assert tr.gradients[name].shape == (STEPS, BATCH, fan_out)
        assert tr.activations[name].dtype == tr.weights[name].dtype == tr.gradients[name].dtype == np.float32
    assert len(tr.losses) == STEPS


def test_the_trace_holds_the_batches_the_initial_weights_and_the_loss_gradient(tr):
    data = D.load("digits", seed=0)
    feed = D.batches(data, BATCH, 0)
    for step in range(STEPS):
        x, y = next(feed)
        np.testing.assert_array_equal(tr.activations["dense1"][step], x)
    params = models.init_params("mlp", seed=0, width=WIDTH)
    for name in tr.layers:
        np.testing.assert_array_equal(tr.weights[name][0], params[f"{name}/kernel"].T)
        assert not np.array_equal(tr.weights[name][1], tr.weights[name][0])  # the step updated them
    # the gradient reaching the logits is (softmax - onehot) / batch: mean cross entropy's
    x, y = next(D.batches(data, BATCH, 0))
    logits = models.reference_logits("mlp", params, x)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = (p - np.eye(10)[y]) / BATCH
    np.testing.assert_allclose(tr.gradients["out"][0], want, atol=1e-6)
    # and the hidden layers' input is the ReLU of the layer before
    h = tr.activations["dense2"][0]
    np.testing.assert_allclose(h, np.maximum(x @ params["dense1/kernel"] + params["dense1/bias"], 0), atol=1e-5)


def test_capture_refuses_bad_sizes():
    with pytest.raises(ValueError):
        trace.capture(steps=0)
    with pytest.raises(TypeError):
        trace.capture(width=2.5)
    with pytest.raises(ValueError):
        trace.capture(batch_size=0)
