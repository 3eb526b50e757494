"""Where a PyTorch run runs: the device a RunConfig names, what it is, what it can run natively.

>>> resolve_device("cpu")[0]
device(type='cpu')
"""

from __future__ import annotations

import importlib.util

import torch

from labkit.hardware import detect_cpu
from labkit.train.config import TORCH_PRECISIONS


def resolve_device(requested: str) -> tuple[torch.device, str]:
    """The torch.device for a RunConfig device name, and a description of it.

    "auto" takes CUDA if ``torch.cuda.is_available()``, else an XLA device (a TPU through
    ``torch_xla``) if ``torch_xla`` is installed, else the CPU.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "tpu" if _has_torch_xla() else "cpu"
    if requested == "cpu":
        return torch.device("cpu"), describe_cpu()
    if requested in ("cuda", "gpu"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} asked for, but torch.cuda.is_available() is False "
                             f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                             "use device='cpu' or 'auto'")
        index = torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        major, minor = torch.cuda.get_device_capability(index)
        return torch.device("cuda", index), (f"cuda:{index} ({name}, compute capability {major}.{minor}, "
                                             f"torch {torch.__version__}, CUDA {torch.version.cuda})")
    if requested == "tpu":
        if not _has_torch_xla():
            raise ValueError("device 'tpu' needs torch_xla (pip install torch_xla on a TPU VM); "
                             "it is not installed here. Use device='cpu' or 'auto'")
        import torch_xla

        device = torch_xla.device() if hasattr(torch_xla, "device") else xla_model().xla_device()
        kind = xla_model().xla_device_hw(device)
        return device, f"xla ({kind}, torch {torch.__version__}, torch_xla {torch_xla.__version__})"
    raise ValueError(f"unknown device {requested!r}; choose one of auto, cpu, cuda, gpu, tpu")


def check_precision(precision: str, device: torch.device) -> None:
    """Raise ValueError if `precision` cannot run natively on `device`.

    The fp8 and MX precisions (`TORCH_PRECISIONS`) train through torchao: an ImportError naming
    ``pip install 'labkit[lowp]'`` if it is missing. They run on a CUDA GPU with fp8 tensor cores
    (compute capability >= 8.9, Ada / Hopper; MX: >= 10.0, Blackwell) and, emulated, on a CPU: fp8
    values multiplied in fp32, right in value, not in speed (`labkit.train.torch.fp8`). A GPU without
    them is refused rather than emulated, so that its step times are never read as fp8's.

    >>> check_precision("mxfp8", torch.device("xla"))
    Traceback (most recent call last):
    ...
    ValueError: mxfp8 trains through torchao on a CUDA GPU with fp8 tensor cores, or emulated on the CPU (device='cpu'); not on xla
    """
    if precision in TORCH_PRECISIONS:
        from labkit.train.torch.fp8 import import_torchao

        import_torchao()  # the ImportError with the install hint, before anything is built
        if device.type == "cuda":
            need, kind = ((10, 0), "MX tensor cores (compute capability >= 10.0, Blackwell)") if precision == "mxfp8" \
                else ((8, 9), "fp8 tensor cores (compute capability >= 8.9: Ada, Hopper, Blackwell)")
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) < need:
                raise ValueError(f"{precision} needs a GPU with {kind}; {torch.cuda.get_device_name(device)} is "
                                 f"{major}.{minor}. Run it emulated on device='cpu', or choose precision='bf16'")
        elif device.type != "cpu":
            raise ValueError(f"{precision} trains through torchao on a CUDA GPU with fp8 tensor cores, or emulated "
                             f"on the CPU (device='cpu'); not on {device.type}")
        return
    if device.type == "cuda" and precision in ("bf16", "bf16-pure"):
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(f"{precision} needs a GPU with native bf16 (compute capability >= 8.0, "
                             f"Ampere or newer); {torch.cuda.get_device_name(device)} is {major}.{minor}. "
                             "Use precision='fp16' (with loss scaling) or 'fp32'")
    if device.type == "xla" and precision == "fp16":
        raise ValueError("fp16 is not a TPU format (the MXU multiplies in bf16); use precision='bf16'")


def _has_torch_xla() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def xla_model():
    """torch_xla's ``xla_model`` module (imported when asked for: only a TPU VM has it)."""
    import torch_xla.core.xla_model as xm

    return xm


def describe_cpu() -> str:
    cpu = detect_cpu()
    bf16, fp16 = sorted(cpu.bf16_instructions), sorted(cpu.fp16_instructions)
    capped = f"; instruction set capped: {cpu.caps_text}" if cpu.isa_caps else ""
    return (f"cpu ({cpu.model}, {torch.get_num_threads()} threads, native bf16: {', '.join(bf16) or 'no'}, "
            f"native fp16: {', '.join(fp16) or 'no'}{capped}; torch {torch.__version__}; TF32 is a GPU format: "
            "tf32 runs as fp32 here)")


def where(device: torch.device) -> str:
    """What one rank runs on: the CPU (with its bf16/fp16 support) or the GPU's name."""
    return describe_cpu() if device.type == "cpu" else f"cuda ({torch.cuda.get_device_name(device)})"
