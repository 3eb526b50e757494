"""Pure parsers of what the operating system and driver tools print about the hardware.

Each takes text (or a mapping) and returns plain values, so each is tested on sample text
from machines we do not have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from labkit.hardware.report import ISA_KNOBS, KNOWN_GPUS, GPUInfo, TPUInfo, check_str, parse_capability


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """Model name and flags of the first processor in Linux's ``/proc/cpuinfo``.

    x86 lists ``flags`` (``avx512_bf16 amx_bf16 amx_tile ...``); Arm lists ``Features``
    (``fphp asimdhp bf16 ...``).

    >>> parse_cpuinfo("model name\\t: Xeon\\nflags\\t\\t: fpu avx512f avx512_bf16\\n")
    ('Xeon', ('avx512_bf16', 'avx512f', 'fpu'))
    """
    check_str(text, "cpuinfo text")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first processor's block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("hardware") or fields.get("model") or ""
    flags = (fields.get("flags") or fields.get("features") or "").lower().split()
    return model, tuple(sorted(set(flags)))


def parse_isa_caps(environ: Mapping[str, str]) -> dict[str, str]:
    """The instruction-set caps the environment sets: ``{"ONEDNN_MAX_CPU_ISA": "AVX2", ...}``.

    Values a library does not cap with (``ATEN_CPU_CAPABILITY=default``, ``ALL``) and knobs
    that are not set are left out; an unknown spelling is kept, and `isa_cap_level` ranks it
    as no cap.

    >>> parse_isa_caps({"ONEDNN_MAX_CPU_ISA": "avx2", "XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --x=1"})
    {'ONEDNN_MAX_CPU_ISA': 'AVX2', 'xla_cpu_max_isa': 'AVX2'}
    """
    if not isinstance(environ, Mapping):
        raise TypeError(f"environ must be a mapping of str to str, not {type(environ).__name__}")
    found = {}
    for knob in ISA_KNOBS:
        if knob == "xla_cpu_max_isa":
            m = re.search(r"--xla_cpu_max_isa=(\S+)", environ.get("XLA_FLAGS") or "")
            value = m.group(1) if m else ""
        else:
            value = environ.get(knob) or ""
        value = value.strip().upper()
        if value and value not in ("DEFAULT", "ALL"):
            found[knob] = value
    return found


def parse_sysctl(text: str) -> tuple[str, tuple[str, ...]]:
    """Model name and flags from macOS ``sysctl machdep.cpu hw.optional``.

    ``hw.optional.arm.FEAT_BF16: 1`` becomes the flag ``bf16``, as Linux names it on Arm;
    Intel Macs list ``machdep.cpu.features: ... AVX2 ...``.

    >>> parse_sysctl("machdep.cpu.brand_string: Apple M2\\nhw.optional.arm.FEAT_BF16: 1\\n")
    ('Apple M2', ('bf16',))
    """
    check_str(text, "sysctl text")
    model, flags = "", set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if key == "machdep.cpu.brand_string":
            model = value
        elif key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
            flags.update(value.lower().split())
        elif key.startswith("hw.optional.") and value == "1":
            flags.add(re.sub(r"^feat_", "", key.rsplit(".", 1)[-1].lower()))
    return model, tuple(sorted(flags))


def parse_nvidia_smi(text: str) -> tuple[GPUInfo, ...]:
    """GPUs from ``nvidia-smi --query-gpu=name,compute_cap,memory.total
    --format=csv,noheader,nounits``: one ``NVIDIA A100-SXM4-40GB, 8.0, 40960`` per GPU.

    Drivers older than 510 cannot report ``compute_cap``; put anything else in that column
    and the capability is looked up from the name (`capability_from_name`).
    """
    check_str(text, "nvidia-smi output")
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"expected 'name, compute_cap, memory MiB' on each line, got {line!r}")
        name, cap, mem = parts
        capability = parse_capability(cap) if re.fullmatch(r"\d+\.\d+", cap) else capability_from_name(name)
        memory = round(float(mem) / 1024, 1) if re.fullmatch(r"\d+(\.\d+)?", mem) else None
        gpus.append(GPUInfo(name, "nvidia", capability, memory_gib=memory, source="nvidia-smi"))
    return tuple(gpus)


def capability_from_name(name: str) -> tuple[int, int] | None:
    """Compute capability of the `KNOWN_GPUS` model named in ``name``, else None.

    >>> capability_from_name("NVIDIA GeForce RTX 3090")
    (8, 6)
    """
    check_str(name, "GPU name")
    for model in sorted(KNOWN_GPUS, key=len, reverse=True):  # "A100" is tried before "A10"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", name, re.I):
            return KNOWN_GPUS[model]
    return None


def tpu_from_environment(environ: Mapping[str, str]) -> TPUInfo | None:
    """A TPU announced by the environment variables of a TPU machine, else None.

    Cloud TPU VMs set ``TPU_ACCELERATOR_TYPE`` (``"v4-8"``); TPU nodes and GKE set
    ``TPU_NAME`` / ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS``; the older Colab TPU runtime set
    ``COLAB_TPU_ADDR``.

    >>> tpu_from_environment({"TPU_ACCELERATOR_TYPE": "v5litepod-1"}).kind
    'TPU v5litepod-1'
    """
    if not isinstance(environ, Mapping):
        raise TypeError(f"environ must be a mapping of str to str, not {type(environ).__name__}")
    kind = environ.get("TPU_ACCELERATOR_TYPE")
    if kind:
        return TPUInfo(f"TPU {kind}", source="environment (TPU_ACCELERATOR_TYPE)")
    for var in ("COLAB_TPU_ADDR", "TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS"):
        if environ.get(var):
            return TPUInfo("TPU", source=f"environment ({var})")
    return None
