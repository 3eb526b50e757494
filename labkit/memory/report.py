"""`MemoryReport`: what a stepper measured of its own memory, one type for every framework.

Each stepper's ``memory()`` returns one (see `labkit.train.loop.Stepper`); `RunResult.memory`
stores its `to_dict`, so a run's JSON log keeps the keys it always had. A figure a framework
cannot report here is None, and left out of the dict:

===========================  ====================================================================
``parameter_bytes``          the weights the optimizer updates, in their stored dtype
``gradient_bytes``           one step's gradients (torch, tf; inside XLA's temporaries in JAX)
``optimizer_state_bytes``    every optimizer tensor (Adam's m and v, step counters ...)
``master_weight_bytes``      a separate fp32 master copy (DeepSpeed's partition)
``saved_activation_bytes``   what autograd saves for backward (torch)
``saved_weight_copy_bytes``  autocast's 16-bit weight copies saved for backward (torch)
``step_*_bytes``             the compiled step's ``memory_analysis()`` (JAX): argument, output,
                             alias, temp, generated_code
``peak_bytes``               this run's device-allocator peak, on the `device` that reports one
``current_bytes``            that allocator's bytes in use now
``process_device_*``         JAX's device statistics, which cover the whole process
``*_per_device``             on a JAX mesh: the bytes each device holds (a list)
``replicas``, ``*_per_replica``  under a tf.distribute strategy: each replica's full copy
===========================  ====================================================================

>>> r = MemoryReport("torch", parameter_bytes=400, gradient_bytes=400, optimizer_state_bytes=800,
...                  device="cuda", peak_bytes=4096)
>>> r.to_dict()
{'parameter_bytes': 400, 'gradient_bytes': 400, 'optimizer_state_bytes': 800, 'cuda_max_memory_allocated_bytes': 4096}
>>> MemoryReport.from_dict("torch", r.to_dict()) == r
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit._validate import choice, integer, shown

FRAMEWORKS = ("torch", "jax", "tf")
DEVICES = ("cuda", "gpu", "tpu")
STEP_KINDS = ("argument", "output", "alias", "temp", "generated_code")
# (framework, device) -> the keys its peak and current bytes have in RunResult.memory
_PER_DEVICE = ("parameter_bytes_per_device", "optimizer_state_bytes_per_device")
_ALLOCATOR_KEYS = {("torch", "cuda"): ("cuda_max_memory_allocated_bytes", None),
                   ("tf", "gpu"): ("gpu_peak_bytes", "gpu_current_bytes"),
                   ("tf", "tpu"): ("tpu_peak_bytes", "tpu_current_bytes")}


@dataclass(frozen=True)
class MemoryReport:
    """Bytes one stepper measured (the fields are in the module's table); None: not reported here."""

    framework: str
    _: dataclasses.KW_ONLY
    parameter_bytes: int | None = None
    gradient_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    master_weight_bytes: int | None = None
    saved_activation_bytes: int | None = None
    saved_weight_copy_bytes: int | None = None
    step_argument_bytes: int | None = None
    step_output_bytes: int | None = None
    step_alias_bytes: int | None = None
    step_temp_bytes: int | None = None
    step_generated_code_bytes: int | None = None
    device: str | None = None
    peak_bytes: int | None = None
    current_bytes: int | None = None
    process_device_peak_bytes_in_use: int | None = None
    process_device_bytes_in_use: int | None = None
    process_device_bytes_limit: int | None = None
    parameter_bytes_per_device: tuple[int, ...] | None = None
    optimizer_state_bytes_per_device: tuple[int, ...] | None = None
    replicas: int | None = None
    parameter_bytes_per_replica: int | None = None
    gradient_bytes_per_replica: int | None = None
    optimizer_state_bytes_per_replica: int | None = None

    def __post_init__(self):
        choice("framework", self.framework, FRAMEWORKS)
        if self.device is not None:
            choice("device", self.device, DEVICES)
        for name in _names():
            value = getattr(self, name)
            if name in _PER_DEVICE and value is not None:
                if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
                    raise TypeError(f"{name} must be a list of byte counts, one per device; got "
                                    f"{type(value).__name__} {shown(value)}")
                object.__setattr__(self, name, tuple(integer(f"{name}[i]", v, minimum=0) for v in value))
            elif value is not None:
                object.__setattr__(self, name, integer(name, value, minimum=0))
        if (self.peak_bytes is not None or self.current_bytes is not None) and \
                (self.framework, self.device) not in _ALLOCATOR_KEYS:
            raise ValueError(f"peak_bytes/current_bytes need the device whose allocator reports them: one of "
                             f"{sorted(_ALLOCATOR_KEYS)} as (framework, device); got ({self.framework!r}, "
                             f"{self.device!r})")

    def to_dict(self) -> dict:
        """The byte counts under the keys `RunResult.memory` has always used (None left out)."""
        out = {}
        peak_key, current_key = _ALLOCATOR_KEYS.get((self.framework, self.device), (None, None))
        for name in _names():
            value = getattr(self, name)
            key = {"peak_bytes": peak_key, "current_bytes": current_key}.get(name, name)
            if value is not None and key is not None:
                out[key] = list(value) if name in _PER_DEVICE else value
        return out

    @classmethod
    def from_dict(cls, framework: str, mem: dict) -> MemoryReport:
        """Read `RunResult.memory` (or a bench record's ``memory``) back; keys it does not know (a
        distributed run's per-device figures) are left out. A count read back from JSON as a float
        (1e9) is taken as the integer it is."""
        choice("framework", framework, FRAMEWORKS)
        if not isinstance(mem, dict):
            raise TypeError(f"mem must be a runner's memory dict, got {type(mem).__name__} {shown(mem)}")

        def get(key):
            value = mem.get(key)
            if isinstance(value, list):
                return [_count(f"mem[{key!r}][i]", v) for v in value]
            return None if value is None else _count(f"mem[{key!r}]", value)

        fields = {name: get(name) for name in _names() if name not in ("peak_bytes", "current_bytes")}
        for (fw, device), (peak_key, current_key) in _ALLOCATOR_KEYS.items():
            if fw == framework and (peak_key in mem or current_key in mem):
                fields.update(device=device, peak_bytes=get(peak_key), current_bytes=get(current_key or ""))
        return cls(framework, **fields)


def _count(name: str, value) -> int:
    if isinstance(value, float) and value.is_integer():  # a count read back from JSON as 1e9
        value = int(value)
    return integer(f"{name} (a byte count)", value, minimum=0)


def _names() -> list[str]:
    return [f.name for f in dataclasses.fields(MemoryReport) if f.name not in ("framework", "device")]


__all__ = ["MemoryReport"]
