"""Look at this machine: the CPU, the accelerators each framework sees, and the versions.

Frameworks are imported here, lazily, and only those the caller names: importing
TensorFlow takes seconds, and a framework that is not installed is reported as absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from labkit.hardware.parse import parse_cpuinfo, parse_isa_caps, parse_nvidia_smi, parse_sysctl, tpu_from_environment
from labkit.hardware.report import (
    FRAMEWORKS, CPUInfo, FrameworkInfo, GPUInfo, HardwareReport, TPUInfo, check_strs, framework_name,
    parse_capability,
)

PACKAGES = ("numpy", "ml_dtypes", "torch", "torch_xla", "jax", "jaxlib", "flax", "optax", "jmp",
            "tensorflow", "keras")
"""Distributions whose versions a report lists (read from metadata; none is imported)."""


def detect(frameworks: Iterable[str] = FRAMEWORKS) -> HardwareReport:
    """Describe this machine, importing only the ``frameworks`` named.

    Each framework probed is asked what it sees: torch for CUDA/ROCm/MPS devices (and
    torch_xla for TPUs), JAX for its devices, TensorFlow for its devices and, where the
    environment names a TPU, its ``TPUClusterResolver``. ``nvidia-smi`` supplies the GPUs
    when no framework reported any. ``detect(frameworks=())`` imports none of them.
    """
    wanted = {framework_name(n) for n in check_strs(frameworks, "frameworks")}
    infos, gpus, tpus = [], [], []
    for name in FRAMEWORKS:
        info, found_gpus, found_tpus = _probe(name) if name in wanted else (_unprobed(name), (), ())
        infos.append(info)
        gpus.append(found_gpus)
        tpus.append(found_tpus)
    env_tpu = tpu_from_environment(os.environ)
    tpus.append((env_tpu,) if env_tpu else ())
    return HardwareReport(
        cpu=detect_cpu(),
        gpus=next((g for g in gpus if g), None) or _nvidia_smi_gpus(),  # the first source that saw any
        tpus=next((t for t in tpus if t), ()),
        frameworks=tuple(infos),
        versions=package_versions(),
        system=f"{platform.system()} {platform.release()} {platform.machine()}",
    )


def detect_cpu() -> CPUInfo:
    """The CPU, with flags from /proc/cpuinfo (Linux) or sysctl (macOS), none elsewhere; the
    cores this process may run on; and the instruction-set caps the environment sets."""
    arch = platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model, flags = parse_cpuinfo(f.read())
        source = "/proc/cpuinfo"
    elif platform.system() == "Darwin" and shutil.which("sysctl"):
        out = subprocess.run(["sysctl", "machdep.cpu", "hw.optional"], capture_output=True, text=True)
        model, flags = parse_sysctl(out.stdout)
        source = "sysctl"
    else:
        model, flags, source = "", (), "nowhere (no /proc/cpuinfo or sysctl here)"
    caps = parse_isa_caps(os.environ) if arch.lower() in ("x86_64", "amd64", "i386", "i686") else {}
    return CPUInfo(model or platform.processor() or arch or "unknown", arch, flags, cores, source, caps)


def package_versions() -> dict[str, str | None]:
    """Python's version, labkit's, and each of `PACKAGES`' (None: not installed)."""
    return {"python": platform.python_version(), "labkit": _version("labkit"), **{p: _version(p) for p in PACKAGES}}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _unprobed(name: str) -> FrameworkInfo:
    return FrameworkInfo(name, _version(name) if _importable(name) else None)


def _probe(name: str):
    """(FrameworkInfo, gpus, tpus) for one framework; an absent or broken one is reported."""
    if not _importable(name):
        return FrameworkInfo(name, None, probed=True), (), ()
    probe = {"torch": _probe_torch, "jax": _probe_jax, "tensorflow": _probe_tensorflow}[name]
    try:
        uses, devices, settings, gpus, tpus = probe()
    except Exception as e:  # a broken install is a finding to report, not a reason to crash
        return FrameworkInfo(name, _version(name), True, error=f"{type(e).__name__}: {e}"), (), ()
    info = FrameworkInfo(name, _version(name), True, uses, tuple(devices), settings)
    return info, tuple(gpus), tuple(tpus)


def _probe_torch():
    import torch

    gpus, tpus, settings = [], [], {}
    if torch.cuda.is_available():
        amd = bool(torch.version.hip)
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(GPUInfo(p.name, "amd" if amd else "nvidia", None if amd else (p.major, p.minor),
                                getattr(p, "gcnArchName", None) if amd else None,
                                round(p.total_memory / 2**30, 1), "torch"))
        uses = "cuda"
        settings["toolkit"] = f"ROCm/HIP {torch.version.hip}" if amd else f"CUDA {torch.version.cuda}"
        try:  # the default, including_emulation=True, also says True on a T4, where bf16 is emulated
            native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch has no including_emulation and never counted emulation
            native_bf16 = torch.cuda.is_bf16_supported()
        settings["bf16 without emulation"] = str(native_bf16)
        settings["TF32 in convolutions (cudnn.allow_tf32)"] = str(torch.backends.cudnn.allow_tf32)
    elif torch.backends.mps.is_available():
        gpus.append(GPUInfo("Apple GPU (MPS)", "apple", source="torch"))
        uses = "mps"
    else:
        uses = "cpu"
    settings[f"autocast dtype ({uses})"] = str(torch.get_autocast_dtype(uses)).removeprefix("torch.")
    matmul = torch.get_float32_matmul_precision()
    meaning = {"highest": "full fp32", "high": "TF32 allowed", "medium": "bf16 allowed"}.get(matmul, "?")
    settings["float32 matmul precision"] = f"{matmul} ({meaning})"
    settings["CPU kernels"] = torch.backends.cpu.get_cpu_capability()
    if _importable("torch_xla"):
        import torch_xla.runtime as xr

        if xr.device_type() == "TPU":
            tpus.append(TPUInfo("TPU", xr.global_runtime_device_count(), "torch_xla"))
            uses = "xla (TPU, through torch_xla)"
    devices = [f"cuda:{i} {g.name}" for i, g in enumerate(gpus)] if uses == "cuda" else [uses]
    return uses, devices, settings, gpus, tpus


def _probe_jax():
    import jax

    devices = jax.devices()
    gpus = []
    for d in devices:
        plat = d.platform.lower()
        if plat in ("gpu", "cuda", "rocm"):
            amd = plat == "rocm" or "rocm" in str(getattr(d.client, "platform_version", "")).lower()
            cap = None if amd else getattr(d, "compute_capability", None)
            gpus.append(GPUInfo(d.device_kind, "amd" if amd else "nvidia",
                                parse_capability(cap) if cap else None, source="jax"))
        elif plat == "metal":
            gpus.append(GPUInfo(d.device_kind or "Apple GPU (Metal)", "apple", source="jax"))
    kinds = sorted({d.device_kind for d in devices if d.platform.lower() == "tpu"})
    tpus = [TPUInfo(k, sum(d.device_kind == k for d in devices), "jax") for k in kinds]
    backend = jax.default_backend()
    meaning = {"tpu": "float32 inputs rounded to bf16", "gpu": "TF32 on Ampere and newer",
               "cpu": "full fp32"}.get(backend, "platform default")
    settings = {
        "default matmul precision": jax.config.jax_default_matmul_precision or f"default ({meaning})",
        "x64 enabled": str(jax.config.jax_enable_x64),
    }
    names = [f"{d.platform}:{d.id} ({d.device_kind})" for d in devices]
    return backend, names, settings, gpus, tpus


TF_STARTUP_NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine",
    "failed call to cuInit",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions",
    "Unable to register cuDNN factory",
    "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory",
    "computation placer already registered",
    "TF-TRT Warning: Could not find TensorRT",
    # x86 CPUs without AVX512-FP16: oneDNN has no float16 kernels, Eigen's are used instead.
    "oneDNN supports DT_HALF only on platforms with AVX-512",
)
"""TensorFlow's C++ notices (oneDNN, "no CUDA drivers", cuInit on a CPU machine): written straight to
file descriptor 2, some before its logging is set up, so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them."""


@contextlib.contextmanager
def quiet_native_logs(drop=None, log_level: str | None = "3"):
    """Silence what native code (TensorFlow's C++ runtime) writes to file descriptor 2, for the block.

    Descriptor 2 is sent to a temporary file inside the block and restored afterwards, so later
    errors still reach the terminal (always descriptor 2, where native libraries write: in
    Jupyter, ``sys.stderr`` is a Python stream and the kernel forwards descriptor 2 on its own).
    `drop`: None hides everything written; a tuple of substrings (such as `TF_STARTUP_NOISE`)
    hides only the lines holding one, and the other lines are written to ``sys.stderr`` after
    the block. `log_level`: ``TF_CPP_MIN_LOG_LEVEL`` inside the block ("3" hides most of
    TensorFlow's C++ log; recent releases log through absl before reading it, hence the
    descriptor), put back afterwards; None leaves the variable alone.
    """
    if drop is not None and (isinstance(drop, str) or not isinstance(drop, tuple)
                             or not all(isinstance(d, str) for d in drop)):
        raise TypeError(f"drop must be None or a tuple of strings (the lines to hide contain one), not {drop!r:.80}")
    if log_level is not None and log_level not in ("0", "1", "2", "3"):
        raise ValueError(f"log_level must be None or one of '0', '1', '2', '3' (TF_CPP_MIN_LOG_LEVEL), "
                         f"not {log_level!r:.80}")
    saved_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    if log_level is not None:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = log_level
    sink = tempfile.TemporaryFile()
    try:
        sys.stderr.flush()
        saved_fd = os.dup(2)
    except (OSError, ValueError):
        saved_fd = None
    try:
        if saved_fd is not None:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
        if drop is not None:
            sink.seek(0)
            kept = [ln for ln in sink.read().decode(errors="replace").splitlines(keepends=True)
                    if ln.strip() and not any(d in ln for d in drop)]
            if kept:
                sys.stderr.write("".join(kept))
        sink.close()
        if log_level is not None:
            if saved_level is None:
                os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
            else:
                os.environ["TF_CPP_MIN_LOG_LEVEL"] = saved_level


def tensorflow_environment(cpu: CPUInfo | None = None, environ=None) -> str | None:
    """Make a capped oneDNN safe for TensorFlow, before TensorFlow is imported.

    TensorFlow 2.21 picks its oneDNN bf16 and fp16 kernels from the CPU's own flags, not from
    what oneDNN may use: with ``ONEDNN_MAX_CPU_ISA`` below the CPU's 16-bit instructions a
    bf16 or fp16 matmul crashes the process (SIGSEGV; seen with ``AVX2`` and ``AVX512_CORE``
    on an AMX CPU). In that case, unless the user chose, this sets ``TF_ENABLE_ONEDNN_OPTS=0``
    in `environ` (default: this process's): TensorFlow's Eigen kernels then run every dtype, as
    on a CPU without those instructions. Returns what it did, or None when nothing was needed.
    """
    environ = os.environ if environ is None else environ
    cpu = detect_cpu() if cpu is None else cpu
    onednn = cpu.isa_caps.get("ONEDNN_MAX_CPU_ISA")
    if onednn is None or "TF_ENABLE_ONEDNN_OPTS" in environ:
        return None
    only_onednn = dataclasses.replace(cpu, isa_caps={"ONEDNN_MAX_CPU_ISA": onednn})
    hidden = [f for f in only_onednn.capped_instructions if f != "amx_tile"]
    if not hidden:
        return None
    environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    return (f"TF_ENABLE_ONEDNN_OPTS=0: ONEDNN_MAX_CPU_ISA={onednn} hides {', '.join(hidden)} from oneDNN, "
            "and TensorFlow's oneDNN kernels would crash")


def _probe_tensorflow():
    tensorflow_environment()
    with quiet_native_logs():
        import tensorflow as tf

        physical = tf.config.list_physical_devices()
        vendor = "amd" if tf.sysconfig.get_build_info().get("is_rocm_build") else "nvidia"
        gpus = []
        for d in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(d)
            cap = details.get("compute_capability") if vendor == "nvidia" else None
            gpus.append(GPUInfo(details.get("device_name") or d.name, vendor, cap or None,
                                source="tensorflow"))
        n_tpu = len(tf.config.list_physical_devices("TPU"))
        tpus = [TPUInfo("TPU", n_tpu, "tensorflow")] if n_tpu else _tf_cluster_resolver_tpu(tf)
        import keras

    settings = {
        "TF32 execution enabled": str(tf.config.experimental.tensor_float_32_execution_enabled()),
        "keras backend": keras.config.backend(),
        "keras global policy": keras.mixed_precision.global_policy().name,
        "oneDNN (TF_ENABLE_ONEDNN_OPTS)": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on for x86)"),
    }
    uses = "tpu" if tpus else "gpu" if gpus else "cpu"
    names = [f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in physical]
    return uses, names, settings, gpus, tpus


def _tf_cluster_resolver_tpu(tf) -> list[TPUInfo]:
    """Ask TensorFlow's TPUClusterResolver, only where the environment names a TPU:
    elsewhere it would go looking for the GCE metadata server over the network."""
    hint = tpu_from_environment(os.environ)
    if hint is None:
        return []
    addr = os.environ.get("COLAB_TPU_ADDR")
    tpu = f"grpc://{addr}" if addr else "local" if os.environ.get("TPU_ACCELERATOR_TYPE") else None
    try:
        tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    except (ValueError, RuntimeError, OSError, ImportError):
        return []
    return [TPUInfo(hint.kind, source="tensorflow (TPUClusterResolver)")]


def _nvidia_smi_gpus() -> tuple[GPUInfo, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    query = [exe, "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=20)
        if out.returncode != 0:  # drivers before 510 do not know compute_cap: ask for the name twice
            query[1] = "--query-gpu=name,name,memory.total"
            out = subprocess.run(query, capture_output=True, text=True, timeout=20)
        return parse_nvidia_smi(out.stdout) if out.returncode == 0 else ()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return ()
