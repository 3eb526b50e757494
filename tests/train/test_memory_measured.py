"""The activation model of labkit.memory against what PyTorch really saves for backward."""

import pytest

from labkit import memory
from labkit.train import RunConfig, run

pytest.importorskip("torch")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "bf16-pure"])
@pytest.mark.parametrize("model, width, batch", [("mlp", 96, 24), ("transformer", 32, 8)])
def test_modelled_activation_bytes_match_torch_saved_tensors(precision, model, width, batch):
    res = run(RunConfig("torch", precision, model=model, width=width, batch_size=batch, steps=1,
                        dataset="synthetic", progress=False))
    measured = res.memory["saved_activation_bytes"]
    modelled = memory.activation_bytes(model, batch, precision, width)
    # The only thing the model leaves out is the scalar loss itself (4 bytes).
    assert 0 <= measured - modelled <= 8, (measured, modelled)


def test_autocast_halves_the_big_activations_but_not_all():
    sizes = {p: memory.activation_bytes("transformer", 64, p) for p in ("fp32", "bf16")}
    assert 0.5 < sizes["bf16"] / sizes["fp32"] < 0.6
