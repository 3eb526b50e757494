"""The description of a machine: plain values that `advise()` reads and tests can build.

A `HardwareReport` holds a `CPUInfo`, `GPUInfo` and `TPUInfo` values, and a
`FrameworkInfo` per framework. Nothing here looks at the machine; `detect()` fills these in.

>>> gpu = GPUInfo("NVIDIA T4", capability=(7, 5))
>>> gpu.architecture, gpu.tensor_core_dtypes
('Turing', ('fp16',))
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from labkit import _validate

FRAMEWORKS = ("torch", "jax", "tensorflow")
"""The frameworks `detect()` can probe; ``"tf"`` is accepted for ``"tensorflow"``."""

VENDORS = ("nvidia", "amd", "apple", "other")

# CPU flags that matter for low precision, spelled as Linux's /proc/cpuinfo does.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX512-BF16, x86 AMX-BF16, Arm BF16
FP16_FLAGS = ("avx512_fp16", "amx_fp16", "asimdhp", "fp16")  # fp16 arithmetic, x86 and Arm

KNOWN_GPUS = {
    "B200": (10, 0), "H200": (9, 0), "H100": (9, 0), "L40S": (8, 9), "L40": (8, 9),
    "L4": (8, 9), "RTX 4090": (8, 9), "A100": (8, 0), "A10G": (8, 6), "A10": (8, 6),
    "RTX 3090": (8, 6), "T4": (7, 5), "RTX 2080 Ti": (7, 5), "V100": (7, 0),
    "P100": (6, 0), "P40": (6, 1), "P4": (6, 1), "GTX 1080": (6, 1), "K80": (3, 7),
}
"""NVIDIA models and their compute capability (from NVIDIA's CUDA GPUs list), used for
examples and when a tool reports a GPU's name but not its capability."""

# NVIDIA compute capability -> architecture: the first row not above the capability.
_NVIDIA_ARCHITECTURES = (
    ((13, 0), "newer than Blackwell"), ((10, 0), "Blackwell"), ((9, 0), "Hopper"),
    ((8, 9), "Ada Lovelace"), ((8, 0), "Ampere"), ((7, 5), "Turing"), ((7, 0), "Volta"),
    ((6, 0), "Pascal"), ((5, 0), "Maxwell"), ((3, 0), "Kepler"), ((0, 0), "pre-Kepler"),
)

# Instruction-set levels, lowest first, as labkit ranks the caps below. A flag that needs a
# level above the cap is not used by the libraries that honour the cap.
ISA_LEVELS = ("sse4", "avx", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx", "amx_fp16")
FLAG_LEVELS = {"avx512f": "avx512", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16",
               "amx_tile": "amx", "amx_bf16": "amx", "amx_int8": "amx", "amx_fp16": "amx_fp16"}
"""The level each x86 flag that matters here needs (Arm flags are not capped by these knobs)."""

CAP_VALUES = {  # knob -> its spellings (upper case) -> labkit's level
    "ONEDNN_MAX_CPU_ISA": {  # oneDNN (PyTorch's and TensorFlow's bf16/fp16 matmuls), docs "CPU dispatcher control"
        "SSE41": "sse4", "AVX": "avx", "AVX2": "avx2", "AVX2_VNNI": "avx2", "AVX2_VNNI_2": "avx2",
        "AVX512_CORE": "avx512", "AVX512_CORE_VNNI": "avx512_vnni", "AVX512_CORE_BF16": "avx512_bf16",
        "AVX512_CORE_FP16": "avx512_fp16", "AVX10_1_512": "avx512_fp16", "AVX512_CORE_AMX": "amx",
        "AVX10_1_512_AMX": "amx", "AVX512_CORE_AMX_FP16": "amx_fp16", "AVX10_1_512_AMX_FP16": "amx_fp16"},
    "ATEN_CPU_CAPABILITY": {"AVX2": "avx2", "AVX512": "avx512"},  # PyTorch's own vectorised kernels
    "MKL_ENABLE_INSTRUCTIONS": {  # Intel MKL (PyTorch's fp32 BLAS on x86)
        "SSE4_2": "sse4", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512", "AVX512_E1": "avx512_vnni",
        "AVX512_E2": "avx512_vnni", "AVX512_E3": "avx512_bf16", "AVX512_E4": "amx", "AVX512_E5": "amx_fp16"},
    "xla_cpu_max_isa": {  # XLA:CPU's code generator (JAX; TensorFlow with jit_compile), read from XLA_FLAGS
        "SSE4_2": "sse4", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512", "AVX512_VNNI": "avx512_vnni",
        "AVX512_BF16": "avx512_bf16", "AMX": "amx", "AMX_FP16": "amx_fp16"},
}
ISA_KNOBS = tuple(CAP_VALUES)
"""The environment settings that cap the instruction set a library uses (``xla_cpu_max_isa`` is
an XLA flag, read from ``XLA_FLAGS``)."""


def isa_cap_level(caps: Mapping[str, str]) -> str | None:
    """The lowest level (`ISA_LEVELS`) the caps allow, or None when nothing is capped.

    >>> isa_cap_level({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "AVX2"})
    'avx2'
    """
    if not isinstance(caps, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in caps.items()):
        raise TypeError(f"caps must be a mapping of knob names to levels (strings), e.g. "
                        f"{{'ONEDNN_MAX_CPU_ISA': 'AVX2'}}; got {type(caps).__name__}")
    levels = [CAP_VALUES.get(k, {}).get(v.upper()) for k, v in caps.items()]
    known = [lv for lv in levels if lv is not None]
    return min(known, key=ISA_LEVELS.index) if known else None


# NVIDIA GPUs without Tensor Cores whose CUDA cores still run fp16 (packed half2) at twice
# the fp32 rate: Jetson TX1 (5.3), GP100 -- Tesla P100, Quadro GP100 -- (6.0), Jetson TX2 (6.2).
# Consumer Pascal (6.1: GTX 10xx, Titan Xp, Tesla P4 and P40) runs fp16 at 1/64 of fp32's rate.
# (CUDA C++ Programming Guide, "Arithmetic Instructions": 16-bit floating-point add, multiply,
# multiply-add per clock per SM: 256, 128, 2, 256 against 32-bit's 128, 64, 128, 128.)
FAST_FP16_CAPABILITIES = ((5, 3), (6, 0), (6, 2))

# AMD gfx architectures with bf16 matrix instructions: MI100, MI200, MI300/MI350, RDNA3/4.
_AMD_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def check_str(value, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def check_strs(values, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be an iterable of str, not {type(values).__name__}")
    return tuple(check_str(v, what + " items") for v in values)


def framework_name(name: str) -> str:
    """``"torch"``, ``"jax"`` or ``"tensorflow"`` (``"tf"`` accepted), else ValueError."""
    key = check_str(name, "framework name").strip().lower()
    key = {"tf": "tensorflow"}.get(key, key)
    if key not in FRAMEWORKS:
        raise ValueError(f"unknown framework name {_validate.shown(name)}; choose from {', '.join(FRAMEWORKS)} (or 'tf')")
    return key


def parse_capability(value) -> tuple[int, int]:
    """``(8, 6)``, ``[8, 6]`` or ``"8.6"`` -> ``(8, 6)``."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", value)
        if not m:
            raise ValueError(f"compute capability must look like '8.6', not {_validate.shown(value)}")
        return int(m.group(1)), int(m.group(2))
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        return int(value[0]), int(value[1])
    raise TypeError(f"compute capability must be two ints (major, minor) or a 'major.minor' str, "
                    f"not {_validate.shown(value)}")


@dataclass(frozen=True)
class CPUInfo:
    """A CPU: model, architecture and instruction-set flags (stored lower case, sorted).

    ``isa_caps`` are the environment's instruction-set caps (`ISA_KNOBS`, e.g.
    ``{"ONEDNN_MAX_CPU_ISA": "AVX2"}``): a flag above the lowest cap is still in ``flags``,
    but the libraries do not use it, so `bf16_instructions`, `fp16_instructions` and `amx`
    leave it out and `capped_instructions` lists it. That is how a capped run tells the
    truth about an AVX2 machine on an AVX512-BF16 one.
    """

    model: str
    arch: str = ""
    flags: tuple[str, ...] = ()
    cores: int | None = None
    source: str = ""
    isa_caps: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        check_str(self.model, "CPUInfo.model")
        check_str(self.arch, "CPUInfo.arch")
        flags = sorted({f.lower() for f in check_strs(self.flags, "CPUInfo.flags")})
        object.__setattr__(self, "flags", tuple(flags))
        if self.cores is not None:
            _validate.integer("CPUInfo.cores", self.cores, minimum=1)
        if not isinstance(self.isa_caps, Mapping):
            raise TypeError(f"CPUInfo.isa_caps must be a mapping such as {{'ONEDNN_MAX_CPU_ISA': 'AVX2'}}, "
                            f"not {type(self.isa_caps).__name__}")
        unknown = sorted(set(self.isa_caps) - set(ISA_KNOBS))
        if unknown:
            raise ValueError(f"CPUInfo.isa_caps: unknown instruction-set knob(s) {', '.join(map(_validate.shown, unknown))}; "
                             f"choose from {', '.join(ISA_KNOBS)}")
        object.__setattr__(self, "isa_caps", {k: check_str(v, k).upper() for k, v in self.isa_caps.items()})

    @property
    def isa_cap(self) -> str | None:
        """The lowest instruction-set level the caps allow (`ISA_LEVELS`); None: not capped."""
        return isa_cap_level(self.isa_caps)

    def usable(self, flag: str) -> bool:
        """Whether the CPU has ``flag`` and the caps let the libraries use it."""
        return flag in self.flags and self._below_cap(flag)

    def _below_cap(self, flag: str) -> bool:
        cap, need = self.isa_cap, FLAG_LEVELS.get(flag)
        return cap is None or need is None or ISA_LEVELS.index(need) <= ISA_LEVELS.index(cap)

    @property
    def bf16_instructions(self) -> tuple[str, ...]:
        """Flags that give native bf16 dot products, e.g. ``('avx512_bf16', 'amx_bf16')``."""
        return tuple(f for f in BF16_FLAGS if self.usable(f))

    @property
    def fp16_instructions(self) -> tuple[str, ...]:
        """Flags that give native fp16 arithmetic, e.g. ``('avx512_fp16',)``."""
        return tuple(f for f in FP16_FLAGS if self.usable(f))

    @property
    def capped_instructions(self) -> tuple[str, ...]:
        """16-bit and AMX flags the CPU has but the caps keep the libraries from using."""
        return tuple(f for f in (*BF16_FLAGS, *FP16_FLAGS, "amx_tile") if f in self.flags and not self._below_cap(f))

    @property
    def amx(self) -> bool:
        """Intel AMX tile units (Sapphire Rapids and later): matrix multiply in bf16/int8."""
        return self.usable("amx_tile")

    @property
    def caps_text(self) -> str:
        """``"ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=AVX2"``, or "" when nothing is capped."""
        return ", ".join(f"{k}={v}" for k, v in self.isa_caps.items())


@dataclass(frozen=True)
class GPUInfo:
    """A GPU. ``capability`` is NVIDIA's compute capability, e.g. ``(8, 0)`` for an A100;
    ``arch`` is AMD's gfx name, e.g. ``"gfx90a"`` for an MI250."""

    name: str
    vendor: str = "nvidia"
    capability: tuple[int, int] | None = None
    arch: str | None = None
    memory_gib: float | None = None
    source: str = ""

    def __post_init__(self):
        if not check_str(self.name, "GPUInfo.name"):
            raise ValueError("GPUInfo.name must not be empty")
        if self.vendor not in VENDORS:
            raise ValueError(f"GPUInfo.vendor must be one of {', '.join(VENDORS)}, not {_validate.shown(self.vendor)}")
        if self.capability is not None:
            object.__setattr__(self, "capability", parse_capability(self.capability))

    @property
    def architecture(self) -> str:
        """``"Ampere"``, ``"Turing"``, ... for NVIDIA; the gfx name for AMD."""
        if self.vendor == "nvidia" and self.capability is not None:
            return next(name for cc, name in _NVIDIA_ARCHITECTURES if self.capability >= cc)
        if self.vendor == "apple":
            return "Apple GPU"
        return self.arch or "unknown architecture"

    @property
    def tensor_core_dtypes(self) -> tuple[str, ...]:
        """Formats its matrix units (Tensor Cores, AMD matrix cores) multiply natively.

        NVIDIA: Volta/Turing (7.x) fp16; Ampere (8.0) adds bf16 and tf32; Ada (8.9) and
        Hopper (9.0) add fp8.
        """
        cc = self.capability
        if self.vendor == "nvidia" and cc is not None:
            return tuple(dtype for dtype, since in
                         (("fp16", (7, 0)), ("bf16", (8, 0)), ("tf32", (8, 0)), ("fp8", (8, 9)))
                         if cc >= since)
        if self.vendor == "amd" and self.arch and self.arch.startswith(_AMD_BF16_ARCHS):
            return ("fp16", "bf16")
        return ()

    @property
    def fp16_rate(self) -> float | None:
        """fp16 arithmetic throughput on the CUDA cores relative to fp32's, for NVIDIA GPUs
        without Tensor Cores: 2.0 on GP100 (P100, 6.0) and the Jetsons (5.3, 6.2), 1/64 on
        consumer Pascal (6.1: GTX 10xx, P4, P40), None otherwise (no fp16 arithmetic, an
        unknown capability, or Tensor Cores, where `tensor_core_dtypes` says more)."""
        cc = self.capability
        if self.vendor != "nvidia" or cc is None or cc >= (7, 0):
            return None
        if cc in FAST_FP16_CAPABILITIES:
            return 2.0
        return 1 / 64 if cc[0] == 6 else None


@dataclass(frozen=True)
class TPUInfo:
    """TPU cores, e.g. ``TPUInfo("TPU v4", count=4, source="jax")``."""

    kind: str = "TPU"
    count: int | None = None
    source: str = ""

    def __post_init__(self):
        check_str(self.kind, "TPUInfo.kind")
        if self.count is not None:
            _validate.integer("TPUInfo.count", self.count, minimum=1)


@dataclass(frozen=True)
class FrameworkInfo:
    """What one framework sees and will use.

    ``version`` is None when it is not installed; ``probed`` says whether it was imported
    and asked; ``uses`` is the device it computes on by default (``"cuda"``, ``"tpu"``,
    ``"cpu"``...); ``settings`` are its precision-related defaults, read from it.
    """

    name: str
    version: str | None = None
    probed: bool = False
    uses: str | None = None
    devices: tuple[str, ...] = ()
    settings: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "name", framework_name(self.name))
        object.__setattr__(self, "devices", check_strs(self.devices, "FrameworkInfo.devices"))

    @property
    def installed(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class HardwareReport:
    """Everything `advise()` needs, as plain values. Build one by hand to ask "what if"."""

    cpu: CPUInfo
    gpus: tuple[GPUInfo, ...] = ()
    tpus: tuple[TPUInfo, ...] = ()
    frameworks: tuple[FrameworkInfo, ...] = ()
    versions: Mapping[str, str | None] = field(default_factory=dict)
    system: str = ""

    def __post_init__(self):
        if not isinstance(self.cpu, CPUInfo):
            raise TypeError(f"HardwareReport.cpu must be a CPUInfo, not {type(self.cpu).__name__}")
        for name, kind in (("gpus", GPUInfo), ("tpus", TPUInfo), ("frameworks", FrameworkInfo)):
            items = getattr(self, name)
            if isinstance(items, (str, kind)) or not isinstance(items, Iterable):
                raise TypeError(f"HardwareReport.{name} must be a tuple of {kind.__name__}")
            items = tuple(items)
            if not all(isinstance(i, kind) for i in items):
                raise TypeError(f"HardwareReport.{name} must hold {kind.__name__} values only")
            object.__setattr__(self, name, items)

    def framework(self, name: str) -> FrameworkInfo | None:
        """The entry for ``"torch"``, ``"jax"`` or ``"tensorflow"``; None if not listed."""
        key = framework_name(name)
        return next((f for f in self.frameworks if f.name == key), None)

    def to_dict(self) -> dict:
        """A JSON-ready dict (what ``labkit doctor --json`` prints)."""
        return dataclasses.asdict(self)
