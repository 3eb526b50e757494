"""Exercise of notebook 00: which precision to train in on a GPU that notebook 00's tables do not name.

The keys come from `labkit.hardware.advise` on `labkit.hardware.example_report` (the same rule
`labkit doctor` applies), the hints from the GPU's own entry (its Tensor Core dtypes, its fp16 rate).

>>> from labkit.exercises import check
>>> check("precision_for_rtx_4090", "bf16").correct
True
"""

from __future__ import annotations

from labkit.exercises.core import Exercise, Hint, register


def _gpu(name: str):
    from labkit import hardware

    return hardware.example_report(name).gpus[0]


def _precision_key(name: str):
    """The answers accepted for GPU `name`: `advise()`'s headline, and fp8 where it has fp8 Tensor Cores."""
    from labkit import hardware

    key = {hardware.advise(hardware.example_report(name)).headline}
    if "fp8" in _gpu(name).tensor_core_dtypes:
        key.add("fp8")
    return frozenset(key)


def _precision_hints(name: str) -> tuple[Hint, ...]:
    def gpu_text(article: str = "The") -> str:
        g = _gpu(name)
        return f"{article} {name} ({g.architecture}, compute capability {g.capability[0]}.{g.capability[1]})"

    return (
        Hint(lambda a, k: a == "bf16" and "bf16" not in _gpu(name).tensor_core_dtypes,
             lambda a, k: f"{gpu_text()} has no bf16 Tensor Cores: bf16 runs there, but emulated and slowly."),
        Hint(lambda a, k: a == "fp8" and "fp8" not in _gpu(name).tensor_core_dtypes,
             lambda a, k: f"{gpu_text()} has no fp8 Tensor Cores: they start with Ada (8.9) and Hopper (9.0)."),
        Hint(lambda a, k: a == "fp16" and "fp16 + loss scaling" in k,
             "fp16 is the right format, but its 5-bit exponent flushes small gradients to zero: without loss "
             "scaling they are lost. Say how you keep them."),
        Hint(lambda a, k: a.startswith("fp16") and "bf16" in k,
             lambda a, k: f"fp16 runs on the {name} too, but bf16 is as fast there and has fp32's exponent range: "
                          "no loss scale to manage."),
        Hint(lambda a, k: a.startswith("fp16") and "fp32" in k and (_gpu(name).fp16_rate or 1) < 1,
             lambda a, k: f"{gpu_text()} is Pascal like the P100, but consumer Pascal: it has no Tensor Cores, and "
                          f"its fp16 arithmetic runs at 1/{round(1 / _gpu(name).fp16_rate)} of its fp32 rate (only "
                          "GP100, the Tesla P100, runs fp16 at twice its fp32 rate). 16-bit compute brings no speed "
                          "there."),
        Hint(lambda a, k: a == "fp32" and "fp32" not in k,
             lambda a, k: f"fp32 is always safe, but {gpu_text('the')} has 16-bit Tensor Cores: fp32 leaves their "
                          "speed, and half the activation memory, unused."),
        Hint(lambda a, k: a != "fp32" and "fp32" in k,
             lambda a, k: f"{gpu_text()} has no Tensor Cores that 16-bit training would use."),
    )


PRECISION_GPUS = {"RTX 4090": ("00",), "GTX 1080": ("00",)}
"""The GPUs of the precision exercises (id ``precision_for_<name>``), by notebook: two that notebook 00's rule
covers but its tables do not name, so the rule must be applied (Ada: bf16 and fp8 Tensor Cores; consumer Pascal:
no Tensor Cores and fp16 at 1/64 of the fp32 rate)."""

for _name, _notebooks in PRECISION_GPUS.items():
    register(Exercise(
        f"precision_for_{_name.lower().replace(' ', '_')}", _notebooks,
        f"Which precision would you train in on an NVIDIA {_name}? (labkit.hardware.example_report('{_name}') "
        "describes it.)",
        "precision", (lambda n=_name: _precision_key(n)), accepts=lambda a, k: a in k,
        hints=_precision_hints(_name),
        why=f"labkit.hardware.advise() says {next(iter(_precision_key(_name) - {'fp8'}))} for the {_name}" + (
            "; its fp8 Tensor Cores also train the matmuls in fp8 (torchao.float8, Transformer Engine), the "
            "rest in bf16." if "fp8" in _precision_key(_name) else
            ": no Tensor Cores, and no 16-bit arithmetic faster than its fp32." if "fp32" in _precision_key(_name)
            else ".")))


__all__ = ["PRECISION_GPUS"]
