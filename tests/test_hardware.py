"""labkit.hardware: the advice is tested on descriptions of each kind of device, the
parsers on sample text, and detection on this machine with the real frameworks."""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from labkit import hardware
from labkit.hardware import (
    Advice, CPUInfo, FrameworkInfo, GPUInfo, HardwareReport, TPUInfo, advise, example_report,
)

HOST = CPUInfo("host", "x86_64", ("avx2",))


def gpu_report(name, capability, vendor="nvidia", arch=None, cpu=HOST):
    return HardwareReport(cpu, gpus=(GPUInfo(name, vendor, capability, arch),))


# ---------------------------------------------------------------- the advice rule


@pytest.mark.parametrize("name, capability, precision, loss_scaling", [
    ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16", False),
    ("NVIDIA H100 80GB HBM3", (9, 0), "bf16", False),
    ("NVIDIA GeForce RTX 3090", (8, 6), "bf16", False),
    ("NVIDIA L4", (8, 9), "bf16", False),
    ("NVIDIA B200", (10, 0), "bf16", False),
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16", True),
    ("Tesla T4", (7, 5), "fp16", True),
    ("Tesla P100-PCIE-16GB", (6, 0), "fp16", True),   # GP100: fp16 at twice fp32's rate
    ("Tesla P40", (6, 1), "fp32", False),              # consumer Pascal: fp16 at 1/64
    ("NVIDIA GeForce GTX 1080 Ti", (6, 1), "fp32", False),
    ("Tesla K80", (3, 7), "fp32", False),
])
def test_advise_nvidia_gpu_by_compute_capability(name, capability, precision, loss_scaling):
    advice = advise(gpu_report(name, capability))
    assert (advice.precision, advice.loss_scaling) == (precision, loss_scaling)
    assert name in advice.target


@pytest.mark.parametrize("flags, precision", [
    (("avx2", "avx512f", "avx512_bf16"), "bf16"),        # AVX512-BF16 (Cooper Lake, Zen 4)
    (("avx512f", "amx_tile", "amx_bf16"), "bf16"),       # AMX (Sapphire Rapids)
    (("fp", "asimd", "asimdhp", "bf16"), "bf16"),        # Arm BF16 (Graviton3, Neoverse V1)
    (("avx2", "avx512f", "avx512_fp16"), "fp32"),        # fp16 arithmetic alone is not enough
    (("sse4_2", "avx", "avx2", "fma", "f16c"), "fp32"),  # f16c only converts
    ((), "fp32"),
])
def test_advise_cpu_bf16_only_with_native_bf16_instructions(flags, precision):
    advice = advise(HardwareReport(CPUInfo("some CPU", "x86_64", flags)))
    assert advice.precision == precision
    assert advice.loss_scaling is False


def test_advise_cpu_with_unreadable_flags_says_so():
    advice = advise(HardwareReport(CPUInfo("mystery", "", ())))
    assert advice.precision == "fp32"
    assert any("could not be read" in note for note in advice.notes)


def test_advise_tpu_bf16_whatever_else_is_there():
    report = HardwareReport(CPUInfo("host", flags=("avx512_bf16",)),
                            gpus=(GPUInfo("Tesla T4", capability=(7, 5)),), tpus=(TPUInfo("TPU v4", 4, "jax"),))
    advice = advise(report)
    assert (advice.precision, advice.loss_scaling, advice.target) == ("bf16", False, "TPU v4 x4")


def test_gp100_runs_fp16_at_twice_fp32_and_consumer_pascal_at_one_64th():
    assert GPUInfo("Tesla P100", capability=(6, 0)).fp16_rate == 2.0
    assert GPUInfo("Jetson TX2", capability=(6, 2)).fp16_rate == 2.0
    assert GPUInfo("Tesla P4", capability=(6, 1)).fp16_rate == 1 / 64
    assert GPUInfo("V100", capability=(7, 0)).fp16_rate is None  # Tensor Cores: see tensor_core_dtypes
    assert GPUInfo("K80", capability=(3, 7)).fp16_rate is None
    p100, p40 = advise(example_report("P100")), advise(example_report("P40"))
    assert "twice the fp32 rate" in p100.reason and "1/64" in p40.reason
    assert hardware.native_precision("torch", "fp16", example_report("P100")).native
    assert not hardware.native_precision("torch", "fp16", example_report("P4")).native
    assert not hardware.native_precision("torch", "bf16", example_report("P100")).native


def test_advice_is_per_framework_jax_on_a_cpu_trains_in_fp32():
    advice = advise(example_report("cpu-amx"))
    assert advice.precision == "bf16"  # what the CPU's units take
    assert advice.by_framework == {"torch": "bf16", "jax": "fp32", "tensorflow": "bf16"}
    assert advice.headline == "bf16 (torch, tensorflow), fp32 (jax)"
    assert (advice.for_framework("jax"), advice.for_framework("tf")) == ("fp32", "bf16")
    assert advice.frameworks["jax"] == "plain float32 (the default dtype)"
    assert any(n.startswith("jax: fp32, not bf16: XLA:CPU") for n in advice.notes)
    with pytest.raises(ValueError, match="unknown framework"):
        advice.for_framework("mxnet")


@pytest.mark.parametrize("name", ["A100", "T4", "P100", "tpu", "cpu"])
def test_advice_is_the_same_for_every_framework_on_gpus_tpus_and_plain_cpus(name):
    advice = advise(example_report(name))
    assert set(advice.by_framework.values()) == {advice.precision}
    assert advice.headline == advice.for_framework("torch") == advice.for_framework("jax")


def test_advice_by_framework_is_checked():
    with pytest.raises(TypeError, match="by_framework"):
        Advice("bf16", False, "r", "t", by_framework={"jax": "int8"})
    assert Advice("fp32", False, "r", "t").by_framework == {"torch": "fp32", "jax": "fp32", "tensorflow": "fp32"}


def test_tf32_note_names_the_defaults_of_each_framework():
    notes = " ".join(advise(example_report("A100")).notes)
    assert "cudnn.allow_tf32 is True" in notes and 'set_float32_matmul_precision("high")' in notes
    assert "JAX's default matmul precision is TF32" in notes


def test_advise_gpu_decides_over_the_cpu():
    amx_host = CPUInfo("Sapphire Rapids", "x86_64", ("amx_tile", "amx_bf16", "avx512_bf16"))
    assert advise(gpu_report("Tesla T4", (7, 5), cpu=amx_host)).headline == "fp16 + loss scaling"


def test_advise_unlike_gpus_follows_the_least_capable():
    report = HardwareReport(HOST, gpus=(GPUInfo("NVIDIA A100", capability=(8, 0)),
                                        GPUInfo("Tesla V100", capability=(7, 0))))
    advice = advise(report)
    assert advice.precision == "fp16" and "V100" in advice.target
    assert any("differ" in note for note in advice.notes)


def test_advise_unknown_nvidia_capability_is_fp32_with_a_note():
    advice = advise(gpu_report("NVIDIA Mystery", None))
    assert advice.precision == "fp32"
    assert any("capability is unknown" in note for note in advice.notes)


@pytest.mark.parametrize("arch, precision", [("gfx90a", "bf16"), ("gfx942", "bf16"), ("gfx1100", "bf16"),
                                             ("gfx906", "fp32"), (None, "fp32")])
def test_advise_amd_gpu_by_gfx_architecture(arch, precision):
    assert advise(gpu_report("AMD Instinct", None, "amd", arch)).precision == precision


def test_advise_apple_gpu_is_fp32_and_mentions_mps():
    advice = advise(example_report("apple-m2"))
    assert advice.precision == "fp32"
    assert any("mps" in note for note in advice.notes)


def test_advice_tells_each_framework_how():
    for name, wanted in [("A100", ("bfloat16", "mixed_bfloat16")), ("T4", ("GradScaler", "mixed_float16")),
                         ("tpu", ("torch_xla", "mixed_bfloat16")), ("cpu-amx", ('"cpu"', "mixed_bfloat16"))]:
        how = advise(example_report(name)).frameworks
        assert set(how) == {"torch", "jax", "tensorflow"}
        assert wanted[0] in how["torch"] and wanted[1] in how["tensorflow"]
    fp16 = advise(example_report("V100")).frameworks
    assert "jmp.DynamicLossScale" in fp16["jax"] and "LossScaleOptimizer" in fp16["tensorflow"]
    assert "GradScaler" not in advise(example_report("A100")).frameworks["torch"].replace("no GradScaler", "")


def test_advice_notes_the_seed_errata_tf32_and_fp8():
    def notes(name):
        return " ".join(advise(example_report(name)).notes)

    assert "Seed 004" in notes("RTX 3090") and "Ampere (8.6)" in notes("RTX 3090")
    assert "Seed 003" in notes("T4") and "Turing (7.5)" in notes("T4")
    assert "TF32" in notes("A100") and "fp8" not in notes("A100")
    assert "TF32" in notes("H100") and "fp8" in notes("H100") and "fp8" in notes("L4")
    assert "TF32" not in notes("V100") and "Seed" not in notes("A100")


def test_advice_notes_a_framework_that_cannot_use_the_accelerator():
    frameworks = (FrameworkInfo("torch", "2.13.0+cpu", True, "cpu", ("cpu",)),
                  FrameworkInfo("jax", "0.10.2", True, error="ImportError: broken"))
    report = HardwareReport(HOST, gpus=(GPUInfo("NVIDIA A100", capability=(8, 0)),), frameworks=frameworks)
    notes = " ".join(advise(report).notes)
    assert "torch 2.13.0+cpu computes on the CPU" in notes
    assert "jax 0.10.2 is installed but failed to load: ImportError: broken" in notes
    cpu_only = HardwareReport(HOST, frameworks=frameworks[:1])
    assert not any("computes on the CPU" in n for n in advise(cpu_only).notes)


def test_advice_str_shows_headline_reason_and_frameworks():
    advice = advise(example_report("T4"))
    text = str(advice)
    assert text.startswith("fp16 + loss scaling  (for NVIDIA T4 (compute capability 7.5, Turing))")
    assert "torch.amp.GradScaler" in text and "note: Seed 003" in text


# ------------------------------------------------------------ the description types


@pytest.mark.parametrize("capability, architecture", [
    ((3, 7), "Kepler"), ((6, 0), "Pascal"), ((6, 1), "Pascal"), ((7, 0), "Volta"), ((7, 2), "Volta"),
    ((7, 5), "Turing"), ((8, 0), "Ampere"), ((8, 6), "Ampere"), ((8, 7), "Ampere"), ((8, 9), "Ada Lovelace"),
    ((9, 0), "Hopper"), ((10, 0), "Blackwell"), ((12, 0), "Blackwell"),
])
def test_gpu_architecture_from_compute_capability(capability, architecture):
    assert GPUInfo("g", capability=capability).architecture == architecture


def test_tensor_core_dtypes_only_grow_with_compute_capability():
    caps = sorted({cc for cc in hardware.KNOWN_GPUS.values()} | {(0, 0), (7, 2), (12, 0)})
    sets = [set(GPUInfo("g", capability=cc).tensor_core_dtypes) for cc in caps]
    assert all(a <= b for a, b in zip(sets, sets[1:]))
    assert sets[0] == set() and sets[-1] == {"fp16", "bf16", "tf32", "fp8"}


def test_capability_accepts_tuple_list_and_string():
    assert GPUInfo("g", capability="8.6").capability == (8, 6)
    assert GPUInfo("g", capability=[7, 5]).capability == (7, 5)
    assert hardware.parse_capability("10.0") == (10, 0)


def test_cpu_flags_are_normalised_and_named_properties_read_them():
    cpu = CPUInfo("Xeon", "x86_64", ["AMX_TILE", "amx_bf16", "avx512_fp16", "amx_bf16"])
    assert cpu.flags == ("amx_bf16", "amx_tile", "avx512_fp16")
    assert cpu.bf16_instructions == ("amx_bf16",) and cpu.fp16_instructions == ("avx512_fp16",) and cpu.amx


def test_report_to_dict_is_json_and_framework_lookup_accepts_tf():
    report = HardwareReport(HOST, gpus=(GPUInfo("NVIDIA A100", capability=(8, 0)),),
                            frameworks=(FrameworkInfo("tensorflow", "2.21.0"),))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["gpus"][0]["capability"] == [8, 0]
    assert report.framework("tf").version == "2.21.0" and report.framework("jax") is None


@pytest.mark.parametrize("make, error, words", [
    (lambda: advise("A100"), TypeError, "HardwareReport"),
    (lambda: example_report("GTX 9999"), ValueError, "choose from"),
    (lambda: example_report(3090), TypeError, "str"),
    (lambda: GPUInfo("g", vendor="intel"), ValueError, "nvidia, amd, apple, other"),
    (lambda: GPUInfo(""), ValueError, "empty"),
    (lambda: GPUInfo("g", capability="8"), ValueError, "'8.6'"),
    (lambda: GPUInfo("g", capability=(8,)), TypeError, "major, minor"),
    (lambda: GPUInfo("g", capability=(8.0, 0)), TypeError, "major, minor"),
    (lambda: CPUInfo("c", flags="avx2"), TypeError, "iterable of str"),
    (lambda: CPUInfo("c", cores=0), ValueError, "CPUInfo.cores must be an integer >= 1"),
    (lambda: TPUInfo("TPU", count=0), ValueError, "TPUInfo.count must be an integer >= 1"),
    (lambda: HardwareReport("cpu"), TypeError, "CPUInfo"),
    (lambda: HardwareReport(HOST, gpus=GPUInfo("g")), TypeError, "tuple of GPUInfo"),
    (lambda: HardwareReport(HOST, tpus=("TPU v4",)), TypeError, "TPUInfo"),
    (lambda: FrameworkInfo("pytorch"), ValueError, "torch, jax, tensorflow"),
    (lambda: Advice("fp8", False, "", ""), ValueError, "bf16, fp16, fp32"),
    (lambda: Advice("bf16", 0, "", ""), TypeError, "Advice.loss_scaling must be True or False"),
    (lambda: Advice("bf16", False, None, ""), TypeError, "Advice.reason must be a str"),
    (lambda: Advice("bf16", False, "", "", frameworks=["torch"]), TypeError, "Advice.frameworks must map"),
    (lambda: Advice("bf16", False, "", "", notes="one"), TypeError, "Advice.notes must be a tuple of str"),
    (lambda: TPUInfo("TPU", count=True), TypeError, "TPUInfo.count must be an integer"),
    (lambda: CPUInfo("c", isa_caps={"NO_SUCH": "AVX2"}), ValueError, "CPUInfo.isa_caps: unknown"),
    (lambda: hardware.detect(frameworks="torch"), TypeError, "iterable of str"),
    (lambda: hardware.detect(frameworks=["pytorch"]), ValueError, "torch, jax, tensorflow"),
    (lambda: hardware.format_report(None), TypeError, "HardwareReport"),
    (lambda: hardware.format_report(HardwareReport(HOST), "bf16"), TypeError, "Advice"),
    (lambda: hardware.parse_cpuinfo(b"flags: avx"), TypeError, "str"),
    (lambda: hardware.parse_nvidia_smi("just a name"), ValueError, "compute_cap"),
    (lambda: hardware.tpu_from_environment(None), TypeError, "mapping"),
    (lambda: hardware.seed_004_select_precision("A100", None), TypeError, "training_type"),
    (lambda: hardware.advice_table("A100"), TypeError, "iterable of str"),
])
def test_bad_input_is_refused_with_what_is_allowed(make, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()


# ------------------------------------------------------------------------- parsers

X86_CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_2 avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Another CPU
flags\t\t: fpu
"""

ARM_CPUINFO = """\
processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve i8mm bf16
CPU implementer\t: 0x41
"""


def test_parse_cpuinfo_reads_the_first_x86_processor():
    model, flags = hardware.parse_cpuinfo(X86_CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16"} <= set(flags)
    assert flags == tuple(sorted(flags))
    cpu = CPUInfo(model, "x86_64", flags)
    assert cpu.bf16_instructions == ("avx512_bf16", "amx_bf16") and cpu.amx


def test_parse_cpuinfo_reads_arm_features():
    model, flags = hardware.parse_cpuinfo(ARM_CPUINFO)
    assert model == ""
    cpu = CPUInfo("Neoverse-V1", "aarch64", flags)
    assert cpu.bf16_instructions == ("bf16",) and cpu.fp16_instructions == ("asimdhp",)
    assert hardware.parse_cpuinfo("") == ("", ())


def test_parse_sysctl_apple_silicon_and_intel_mac():
    apple = "machdep.cpu.brand_string: Apple M2\nhw.optional.arm.FEAT_BF16: 1\nhw.optional.arm.FEAT_FP16: 1\n" \
            "hw.optional.arm.FEAT_SME: 0\nhw.optional.floatingpoint: 1\n"
    assert hardware.parse_sysctl(apple) == ("Apple M2", ("bf16", "floatingpoint", "fp16"))
    intel = ("machdep.cpu.brand_string: Intel(R) Core(TM) i9-9980HK\nmachdep.cpu.features: FPU SSE4.2 AVX1.0\n"
             "machdep.cpu.leaf7_features: AVX2 BMI1\nhw.optional.avx512f: 0\n")
    model, flags = hardware.parse_sysctl(intel)
    assert model.startswith("Intel") and {"avx2", "sse4.2"} <= set(flags) and "avx512f" not in flags


def test_parse_nvidia_smi_with_and_without_compute_cap():
    gpus = hardware.parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 8.0, 40960\nTesla T4, 7.5, 15360\n")
    assert [(g.name, g.capability, g.memory_gib) for g in gpus] == [
        ("NVIDIA A100-SXM4-40GB", (8, 0), 40.0), ("Tesla T4", (7, 5), 15.0)]
    old_driver = hardware.parse_nvidia_smi("Tesla P100-PCIE-16GB, Tesla P100-PCIE-16GB, 16280\n")
    assert old_driver[0].capability == (6, 0)
    assert hardware.parse_nvidia_smi("NVIDIA Future X, [N/A], [N/A]")[0].capability is None
    assert hardware.parse_nvidia_smi("") == ()


def test_capability_from_name_knows_every_listed_model_and_keeps_a10_apart_from_a100():
    for model, cc in hardware.KNOWN_GPUS.items():
        assert hardware.capability_from_name(f"NVIDIA GeForce {model} 24GB") == cc
    assert hardware.capability_from_name("NVIDIA A10") == (8, 6)
    assert hardware.capability_from_name("NVIDIA A100-PCIE-40GB") == (8, 0)
    assert hardware.capability_from_name("NVIDIA L40S") == (8, 9)
    assert hardware.capability_from_name("Radeon") is None


def test_tpu_from_environment():
    assert hardware.tpu_from_environment({}) is None
    assert hardware.tpu_from_environment({"TPU_ACCELERATOR_TYPE": "v4-8"}).kind == "TPU v4-8"
    colab = hardware.tpu_from_environment({"COLAB_TPU_ADDR": "10.0.0.2:8470"})
    assert colab.kind == "TPU" and colab.source.endswith("(COLAB_TPU_ADDR)")
    assert hardware.tpu_from_environment({"TPU_NAME": ""}) is None


# ---------------------------------------------------------- seed 004 and examples


def test_seed_004_function_reproduces_the_seed_including_its_fallback():
    assert hardware.seed_004_select_precision("RTX3090", "微调") == "FP16"
    assert hardware.seed_004_select_precision("CPU", "任何") == "FP32"
    assert hardware.seed_004_select_precision("H100", "预训练") == "FP32"  # not listed: falls through
    assert len(hardware.SEED_004_TABLE) == 7


def test_seed_004_comparison_marks_each_row_against_advise():
    table = hardware.seed_004_comparison()
    rows = {(r[0], r[4]): r for r in table.rows}
    for (device, _), (_, seed, labkit, verdict, _) in rows.items():
        assert labkit == advise(example_report(device)).headline
        assert verdict == ("CORRECT" if seed.lower() == labkit.split()[0] else "INCORRECT")
    verdicts = dict(zip(table.column("device"), table.column("seed 004 is")))
    assert verdicts == {"A100": "CORRECT", "V100": "CORRECT", "RTX3090": "INCORRECT", "CPU": "CORRECT",
                        "H100": "INCORRECT", "L4": "INCORRECT", "T4": "INCORRECT"}
    assert len(table.rows) == len(hardware.SEED_004_TABLE) + 3


def test_every_example_has_advice_and_the_colab_runtimes_table_matches_it():
    expected = {"cpu": "fp32", "cpu-avx512-bf16": "bf16", "cpu-amx": "bf16", "apple-m2": "fp32", "tpu": "bf16"}
    for model, cc in hardware.KNOWN_GPUS.items():  # the rule: 8.0 and newer bf16, 7.x and GP100 fp16, older fp32
        expected[model] = "bf16" if cc >= (8, 0) else "fp16" if cc >= (7, 0) or cc == (6, 0) else "fp32"
    assert {name: advise(example_report(name)).precision for name in hardware.EXAMPLES} == expected
    assert example_report("rtx3090") == example_report("RTX 3090")
    table = hardware.advice_table(["cpu", "T4", "A100", "tpu"])
    assert table.column("train in") == ["fp32", "fp16 + loss scaling", "bf16", "bf16"]


# ------------------------------------------------------------- detection, for real


def test_detect_without_frameworks_reads_the_cpu_and_versions():
    import numpy

    report = hardware.detect(frameworks=())
    assert report.versions["numpy"] == numpy.__version__
    assert report.versions["python"] == platform.python_version()
    assert all(not f.probed for f in report.frameworks)
    assert [f.name for f in report.frameworks] == list(hardware.FRAMEWORKS)
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            assert report.cpu.flags == hardware.parse_cpuinfo(f.read())[1]
        assert report.cpu.source == "/proc/cpuinfo"
    assert advise(report).precision in hardware.PRECISIONS


def test_importing_and_detecting_without_frameworks_imports_none():
    code = ("import sys; from labkit import hardware; hardware.detect(frameworks=()); "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_detect_torch_reports_what_torch_itself_says():
    torch = pytest.importorskip("torch")
    info = hardware.detect(frameworks=["torch"]).framework("torch")
    assert info.probed and info.error is None and info.version.split("+")[0] == torch.__version__.split("+")[0]
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert info.uses == expected
    assert info.settings[f"autocast dtype ({expected})"] == str(torch.get_autocast_dtype(expected))[6:]
    assert info.settings["float32 matmul precision"].split()[0] == torch.get_float32_matmul_precision()


def test_detect_jax_reports_what_jax_itself_says():
    jax = pytest.importorskip("jax")
    report = hardware.detect(frameworks=["jax"])
    info = report.framework("jax")
    assert info.uses == jax.default_backend() and len(info.devices) == len(jax.devices())
    assert report.framework("torch").probed is False


def test_detect_tensorflow_is_quiet_and_restores_the_log_level():
    pytest.importorskip("tensorflow")
    code = textwrap.dedent("""
        import os
        from labkit import hardware
        info = hardware.detect(frameworks=["tf"]).framework("tensorflow")
        import tensorflow as tf
        print(info.uses, info.version == tf.__version__, info.error, os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    uses, same_version, error, level = out.stdout.split()
    assert uses in ("cpu", "gpu", "tpu") and same_version == "True" and error == "None" and level == "None"
    assert out.stderr == ""


def test_an_absent_framework_is_reported_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # Python's own way to make an import fail
    info = hardware.detect(frameworks=["tensorflow"]).framework("tensorflow")
    assert (info.installed, info.probed, info.uses) == (False, True, None)
    assert "tensorflow" in hardware.format_report(HardwareReport(HOST, frameworks=(info,)))


def test_quiet_native_logs_hides_fd2_only_inside_and_restores_env(capfd, monkeypatch):
    from labkit.hardware.detect import quiet_native_logs

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    with quiet_native_logs():
        os.write(2, b"native noise\n")
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


def test_format_report_shows_devices_frameworks_and_advice():
    report = HardwareReport(
        CPUInfo("Xeon", "x86_64", ("avx512f",), 8, "/proc/cpuinfo"),
        gpus=(GPUInfo("NVIDIA A100-SXM4-40GB", capability=(8, 0), memory_gib=40.0, source="torch"),),
        frameworks=(FrameworkInfo("torch", "2.13.0", True, "cuda", ("cuda:0",),
                                  {"autocast dtype (cuda)": "float16"}),
                    FrameworkInfo("jax", "0.10.2"), FrameworkInfo("tensorflow")),
        versions={"python": "3.11.7", "numpy": "2.4.6", "torch_xla": None}, system="Linux x86_64")
    text = hardware.format_report(report)
    for part in ["NVIDIA A100-SXM4-40GB (compute capability 8.0, Ampere), 40.0 GiB; "
                 "tensor cores: fp16, bf16, tf32",
                 "autocast dtype (cuda): float16", "jax         0.10.2 (not probed)",
                 "tensorflow  not installed", "not installed: torch_xla", "Advice      bf16  (for NVIDIA A100",
                 "TPUs        none found"]:
        assert part in text


# ------------------------------------------------------- instruction-set caps, native 16 bits

AMX_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def test_parse_isa_caps_reads_each_knob_and_the_xla_flag():
    env = {"ONEDNN_MAX_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX512_BF16", "OTHER": "AVX2"}
    caps = hardware.parse_isa_caps(env)
    assert caps == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "xla_cpu_max_isa": "AVX512_BF16"}
    assert hardware.isa_cap_level(caps) == "avx2"
    assert hardware.parse_isa_caps({"ONEDNN_MAX_CPU_ISA": "ALL", "XLA_FLAGS": "--xla_dump_to=x"}) == {}
    assert hardware.isa_cap_level({}) is None and hardware.isa_cap_level({"ONEDNN_MAX_CPU_ISA": "NEWER"}) is None


@pytest.mark.parametrize("caps, bf16, fp16, amx", [
    ({}, ("avx512_bf16", "amx_bf16"), ("avx512_fp16",), True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, ("avx512_bf16",), (), False),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"}, ("avx512_bf16",), ("avx512_fp16",), False),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, (), (), False),
    ({"xla_cpu_max_isa": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, (), (), False),
])
def test_a_capped_cpu_reports_only_the_instructions_under_the_cap(caps, bf16, fp16, amx):
    cpu = CPUInfo("Xeon", "x86_64", AMX_FLAGS, isa_caps=caps)
    assert (cpu.bf16_instructions, cpu.fp16_instructions, cpu.amx) == (bf16, fp16, amx)
    assert set(cpu.capped_instructions) == {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"} - set(bf16 + fp16) - (
        {"amx_tile"} if amx else set())
    assert cpu.flags == tuple(sorted(AMX_FLAGS))  # the hardware's flags stay as they are


def test_arm_flags_are_not_capped_by_x86_knobs():
    cpu = CPUInfo("Graviton3", "aarch64", ("bf16", "asimdhp"), isa_caps={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert cpu.bf16_instructions == ("bf16",) and cpu.fp16_instructions == ("asimdhp",)


def test_the_advice_for_a_capped_cpu_is_fp32_and_says_why():
    report = HardwareReport(CPUInfo("Xeon", "x86_64", AMX_FLAGS, isa_caps={"ONEDNN_MAX_CPU_ISA": "AVX2"}))
    advice = advise(report)
    assert advice.precision == "fp32"
    assert any("caps the instruction set (ONEDNN_MAX_CPU_ISA=AVX2)" in n for n in advice.notes)
    text = hardware.format_report(report)
    assert "bf16 instructions: none" in text and "capped to avx2 by ONEDNN_MAX_CPU_ISA=AVX2" in text
    assert advise(HardwareReport(CPUInfo("Xeon", "x86_64", AMX_FLAGS))).precision == "bf16"


@pytest.mark.parametrize("framework, precision, example, native", [
    ("torch", "fp32", "cpu", True), ("torch", "bf16", "cpu", False), ("torch", "bf16-pure", "cpu-amx", True),
    ("tf", "bf16", "cpu-avx512-bf16", True), ("torch", "fp16", "cpu-avx512-bf16", False),
    ("jax", "bf16", "cpu-amx", False), ("jax", "bf16", "A100", True), ("torch", "bf16", "T4", False),
    ("torch", "fp16", "T4", True), ("tf", "bf16", "tpu", True), ("jax", "fp16", "tpu", False),
])
def test_native_precision_follows_the_device(framework, precision, example, native):
    result = hardware.native_precision(framework, precision, example_report(example))
    assert result.native is native and result.why


def test_native_precision_on_a_capped_cpu_names_the_cap():
    report = HardwareReport(CPUInfo("Xeon", "x86_64", AMX_FLAGS, isa_caps={"ONEDNN_MAX_CPU_ISA": "AVX2"}))
    result = hardware.native_precision("torch", "bf16", report)
    assert not result.native and "caps the instruction set to avx2" in result.why
    assert str(result).startswith("emulated (avx512_bf16, amx_bf16 unused")


@pytest.mark.parametrize("call, error, words", [
    (lambda: hardware.native_precision("mxnet", "bf16"), ValueError, "torch, jax, tf"),
    (lambda: hardware.native_precision("torch", "fp8"), ValueError, "fp32, tf32, fp16, bf16, bf16-pure"),
    (lambda: hardware.native_precision("torch", "bf16", "cpu"), TypeError, "HardwareReport"),
    (lambda: CPUInfo("c", isa_caps="AVX2"), TypeError, "mapping"),
    (lambda: CPUInfo("c", isa_caps={"MAX_ISA": "AVX2"}), ValueError, "ONEDNN_MAX_CPU_ISA"),
    (lambda: hardware.parse_isa_caps(None), TypeError, "mapping"),
])
def test_bad_native_and_cap_arguments_name_what_is_allowed(call, error, words):
    with pytest.raises(error, match=words):
        call()


def _run(code: str, **env) -> str:
    """Run `code` in a fresh Python with this environment, less any instruction-set cap, plus `env`."""
    base = {k: v for k, v in os.environ.items() if k not in (*hardware.ISA_KNOBS, "XLA_FLAGS", "TF_ENABLE_ONEDNN_OPTS")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**base, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_detect_cpu_reads_the_caps_from_the_environment():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the caps are x86 knobs")
    code = "from labkit import hardware; c = hardware.detect_cpu(); print(c.isa_cap, c.caps_text)"
    assert _run(code, ONEDNN_MAX_CPU_ISA="AVX2", XLA_FLAGS="--xla_cpu_max_isa=AVX512").split(maxsplit=1) == [
        "avx2", "ONEDNN_MAX_CPU_ISA=AVX2, xla_cpu_max_isa=AVX512\n"]


def test_the_cap_is_what_torch_itself_obeys():
    pytest.importorskip("torch")
    if not hardware.detect_cpu().bf16_instructions:
        pytest.skip("this CPU has no bf16 instructions to cap")
    code = """
        import torch
        from labkit import hardware
        print(torch.ops.mkldnn._is_mkldnn_bf16_supported(), hardware.native_precision("torch", "bf16").native)
    """
    assert _run(code).split() == ["True", "True"]
    assert _run(code, ONEDNN_MAX_CPU_ISA="AVX2").split() == ["False", "False"]


def test_a_capped_onednn_does_not_crash_tensorflow_on_16_bit_matmuls():
    pytest.importorskip("tensorflow")
    if not hardware.detect_cpu().capped_instructions and not hardware.detect_cpu().bf16_instructions:
        pytest.skip("this CPU has no 16-bit instructions for the cap to hide")
    code = """
        import os
        from labkit.train.tf.models import import_tensorflow
        tf, _ = import_tensorflow()
        x = [float(tf.linalg.matmul(tf.ones((32, 32), d), tf.ones((32, 32), d))[0, 0]) for d in (tf.bfloat16, tf.float16)]
        print(os.environ.get("TF_ENABLE_ONEDNN_OPTS"), x)
    """
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"}, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-1500:]}"  # -11 before the fix
    assert out.stdout.split(maxsplit=1) == ["0", "[32.0, 32.0]\n"]


def test_native_table_lists_every_framework_and_16_bit_precision():
    t = hardware.native_table(example_report("cpu-amx"))
    assert list(zip(t.column("framework"), t.column("precision"), t.column("here"))) == [
        ("torch", "bf16", "native"), ("torch", "fp16", "native"), ("jax", "bf16", "emulated"),
        ("jax", "fp16", "emulated"), ("tf", "bf16", "native"), ("tf", "fp16", "native")]  # AVX512-FP16 too
    assert set(hardware.native_table(example_report("tpu")).column("here")) == {"native", "emulated"}


@pytest.mark.parametrize("caps, environ, changed", [
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {}, True),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, {}, False),  # hides nothing 16-bit
    ({"ATEN_CPU_CAPABILITY": "AVX2"}, {}, False),  # not oneDNN's cap: TensorFlow is safe
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"TF_ENABLE_ONEDNN_OPTS": "1"}, False),  # the user chose
])
def test_tensorflow_environment_turns_onednn_off_only_where_its_cap_hides_16_bit_kernels(caps, environ, changed):
    from labkit.hardware.detect import tensorflow_environment

    cpu = CPUInfo("Xeon", "x86_64", AMX_FLAGS, isa_caps=caps)
    env = dict(environ)
    note = tensorflow_environment(cpu, env)
    assert (note is not None) is changed
    assert env.get("TF_ENABLE_ONEDNN_OPTS") == ("0" if changed else environ.get("TF_ENABLE_ONEDNN_OPTS"))
    if changed:
        assert note.startswith("TF_ENABLE_ONEDNN_OPTS=0: ONEDNN_MAX_CPU_ISA=AVX2 hides avx512_bf16")


@pytest.mark.parametrize("caps", [None, "AVX2", [("ONEDNN_MAX_CPU_ISA", "AVX2")], {"ONEDNN_MAX_CPU_ISA": 2}])
def test_isa_cap_level_wants_a_mapping_of_knobs_to_levels(caps):
    with pytest.raises(TypeError, match="caps must be a mapping of knob names to levels"):
        hardware.isa_cap_level(caps)
