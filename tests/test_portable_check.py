"""scripts/portable_check.py: the environment of the capped, one-thread nbval run, and that the
libraries really obey it (the run itself is `make portable`, part of `make test`)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "portable_check.py"
spec = importlib.util.spec_from_file_location("portable_check", SCRIPT)
portable = importlib.util.module_from_spec(spec)
spec.loader.exec_module(portable)


def test_the_environment_caps_every_knob_and_keeps_other_xla_flags():
    env = portable.environment({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX512",
                                "PATH": "/bin"})
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX2"
    assert (env["ONEDNN_MAX_CPU_ISA"], env["ATEN_CPU_CAPABILITY"], env["MKL_ENABLE_INSTRUCTIONS"]) == ("AVX2", "avx2", "AVX2")
    assert env["OMP_NUM_THREADS"] == env["TF_NUM_INTRAOP_THREADS"] == "1" and env["PATH"] == "/bin"
    assert portable.environment({})["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"


def test_under_it_labkit_and_torch_see_an_avx2_cpu_with_one_core_and_one_thread():
    pytest.importorskip("torch")
    code = ("import importlib.util, json, torch; from labkit import hardware; "
            f"spec = importlib.util.spec_from_file_location('p', {str(SCRIPT)!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.pin_to_one_core(); "
            "c = hardware.detect_cpu(); print(json.dumps([c.isa_cap, c.cores, list(c.bf16_instructions), "
            "torch.get_num_threads(), torch.backends.cpu.get_cpu_capability()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=portable.environment())
    assert out.returncode == 0, out.stderr[-2000:]
    cap, cores, bf16, threads, torch_cap = json.loads(out.stdout)
    assert (cap, bf16, threads, torch_cap) == ("avx2", [], 1, "AVX2")
    assert cores == 1 or not hasattr(__import__("os"), "sched_setaffinity")


@pytest.mark.parametrize("flags, hidden", [
    (("avx2", "fma", "sse4_2"), ()),
    (("avx2", "avx512f"), ("avx512f",)),
    (("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"), ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")),
    (("neon", "asimd"), ()),
])
def test_the_cap_hides_only_what_lies_above_avx2(flags, hidden):
    assert portable.hidden_by_the_cap(flags) == hidden


def test_where_the_cap_hides_nothing_the_run_has_one_thread_and_no_cap():
    env = portable.environment_one_thread({"PATH": "/bin", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert env["OMP_NUM_THREADS"] == env["TF_NUM_INTRAOP_THREADS"] == env["TF_NUM_INTEROP_THREADS"] == "1"
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    assert not set(portable.CAPPED) & set(env)


def test_cap_differs_answers_by_exit_status():
    out = subprocess.run([sys.executable, str(SCRIPT), "--cap-differs"], capture_output=True, text=True, timeout=120)
    assert out.returncode == (0 if portable.hidden_by_the_cap() else portable.NOTHING_TO_CAP), out.stderr[-2000:]
    assert out.stdout.startswith("the AVX2 cap hides ")
