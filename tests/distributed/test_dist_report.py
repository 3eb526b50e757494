"""labkit.train.report: the step-time and ZeRO memory tables of notebook 08."""

import pytest

from labkit.train import report
from labkit.train import RunConfig, RunResult


def by_hand(devices=1, parallel="dp", framework="torch", extra=None):
    """A RunResult filled in by hand: the tables only read its fields."""
    cfg = RunConfig(framework, "bf16", steps=3, batch_size=32, devices=devices, parallel=parallel, progress=False)
    return RunResult(cfg, losses=[2.0, 1.9, 1.8], step_times=[1.0, 0.004, 0.004], grad_norms=[1.0] * 3,
                     skipped=[False] * 3, status="ok", extra=extra or {})


def test_step_time_table_names_the_engine_and_reduction_and_leaves_out_the_first_step():
    runs = {"one": by_hand(), "fsdp": by_hand(2, "fsdp", extra={"reduce_dtype": "bf16", "comm_bytes_per_step": 100}),
            "keras": by_hand(2, framework="tf", extra={"reduce_dtype": ["float32", "float32"]}),
            "zero": by_hand(2, "zero2", extra={"reduce_dtype": "fp32"})}
    t = report.step_time_table(runs)
    assert t.column("engine") == ["one device", "FSDP2", "MirroredStrategy", "DeepSpeed ZeRO-2"]
    assert t.column("reduce") == ["-", "bf16", "fp32", "fp32"]
    assert t.column("bytes/step") == ["0", "100", "0", "0"]
    assert t.column("median step ms") == ["4.0"] * 4 and t.column("samples/s") == ["8000"] * 4


def test_bad_input_gets_a_clear_message():
    with pytest.raises(TypeError, match=r"dict \{label: RunResult\}"):
        report.step_time_table([by_hand()])
    with pytest.raises(ValueError, match="RunResult of a DeepSpeed run"):
        report.zero_memory_table(by_hand(2, "fsdp"))


@pytest.mark.parametrize("config", [None, "torch", {"framework": "torch", "devices": 2}])
def test_distributed_run_wants_a_run_config(config):
    from labkit.train import launch

    with pytest.raises(TypeError, match="config must be a RunConfig"):
        launch.run_distributed(config)


def test_gathered_reads_torch_profiler_rows_and_jax_program_rows():
    torch_run = by_hand(2, "fsdp", extra={"collectives": [
        {"op": "allgather_base", "dtype": "bf16", "elements": 100, "bytes": 200},
        {"op": "reduce_scatter_base", "dtype": "fp32", "elements": 100, "bytes": 400},
        {"op": "allgather_base", "dtype": "bf16", "elements": 10, "bytes": 20}]})
    jax_run = by_hand(8, "fsdp", framework="jax", extra={"collectives_requested": [
        {"op": "all-gather", "dtype": "f32", "shape": [64, 32], "bytes": 8192},
        {"op": "reduce-scatter", "dtype": "bf16", "shape": [64, 32], "bytes": 4096},
        {"op": "all-gather", "dtype": "f32", "shape": [32], "bytes": 128}]})
    assert report.gathered(torch_run) == {"dtype": "bf16", "elements": 110, "bytes": 220}
    assert report.gathered(jax_run) == {"dtype": "fp32", "elements": 2080, "bytes": 8320}
    t = report.gather_table({"torch": torch_run, "jax": jax_run})
    assert t.column("gathered in") == ["bf16", "fp32"]
    assert t.column("bytes/element") == ["2", "4"] and t.column("bytes if bf16") == ["220", "4160"]
    with pytest.raises(ValueError, match="no all-gather"):
        report.gathered(by_hand(2, "dp"))
    with pytest.raises(TypeError, match="non-empty dict"):
        report.gather_table({})
