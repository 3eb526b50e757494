"""labkit.hardware.runtime: TF32 defaults and subnormal handling, read from the real frameworks."""

import pytest

from labkit import hardware


def test_tf32_defaults_read_torch_and_jax_as_they_ship():
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    rows = {(r[0], r[1]): (r[2], r[3]) for r in hardware.tf32_defaults(["torch", "jax"]).rows}
    assert rows["torch", "torch.backends.cuda.matmul.allow_tf32"] == ("False", "matmuls in full fp32")
    assert rows["torch", "torch.get_float32_matmul_precision()"] == ("'highest'", "matmuls in full fp32")
    assert rows["torch", "torch.backends.cudnn.allow_tf32"] == ("True", "convolutions in TF32")
    assert rows["jax", "jax_default_matmul_precision"][0] == "None"
    assert rows["jax", "jax_default_matmul_precision"][1].startswith("matmuls and convolutions in TF32")


def test_tf32_defaults_follow_a_changed_setting():
    torch = pytest.importorskip("torch")
    torch.set_float32_matmul_precision("high")
    try:
        rows = {r[1]: r[3] for r in hardware.tf32_defaults(["torch"]).rows}
        assert rows["torch.get_float32_matmul_precision()"].startswith("matmuls may use TF32")
    finally:
        torch.set_float32_matmul_precision("highest")


def test_subnormals_are_kept_by_numpy_and_torch_and_flushed_by_ftz():
    torch = pytest.importorskip("torch")
    rows = {(r[0], r[1]): r[3] for r in hardware.subnormal_behaviour(["torch"]).rows}
    assert rows["numpy", "float32"] == rows["torch", "default"] == "kept: gradual underflow"
    if ("torch", "after torch.set_flush_denormal(True)") in rows:  # x86 with SSE3, AArch64
        assert rows["torch", "after torch.set_flush_denormal(True)"] == "flushed to zero"
    assert float((torch.tensor([1e-39]) * 2)[0]) > 0  # switched off again


def test_xla_cpu_flushes_float32_subnormals():
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "cpu":
        pytest.skip("XLA:CPU only")
    rows = {r[0]: r[3] for r in hardware.subnormal_behaviour(["jax"]).rows}
    assert rows["jax"] == "flushed to zero"


@pytest.mark.parametrize("bad, error", [(None, TypeError), ("torch", TypeError), (["mxnet"], ValueError)])
def test_runtime_tables_refuse_bad_framework_lists(bad, error):
    for fn in (hardware.tf32_defaults, hardware.subnormal_behaviour):
        with pytest.raises(error):
            fn(bad)
