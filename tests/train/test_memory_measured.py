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
    # the attention probabilities stay fp32 (the forced fp32 softmax) and gain a bf16 copy: 6 bytes, not 4
    assert 0.7 < sizes["bf16"] / sizes["fp32"] < 0.8
    mlp = {p: memory.activation_bytes("mlp", 64, p) for p in ("fp32", "bf16")}
    assert 0.5 < mlp["bf16"] / mlp["fp32"] < 0.55


@pytest.mark.parametrize("framework", ["torch", "jax", "tf"])
def test_each_runner_s_memory_is_a_memory_report_s_dict(framework):
    """One type for every framework: RunResult.memory reads back into a MemoryReport, key for key."""
    pytest.importorskip({"torch": "torch", "jax": "jax", "tf": "tensorflow"}[framework])
    res = run(RunConfig(framework, "bf16", width=16, batch_size=8, steps=1, dataset="synthetic", progress=False))
    report = memory.MemoryReport.from_dict(framework, res.memory)
    assert report.to_dict() == res.memory and report.parameter_bytes > 0 and report.optimizer_state_bytes > 0
