"""labkit.formats.blocks against torchao's emulation: quantize + dequantize of the same float32 array.

Usage: python benchmarks/bench_blocks.py [--log2-size 22] [--repeat 5]

For mxfp8_e4m3, mxfp4 (``MXTensor.to_mx`` + ``dequantize``, FLOOR) and nvfp4
(``NVFP4Tensor.to_nvfp4`` + ``dequantize``), prints the median of `--repeat` timings of each
side, their ratio (labkit / torchao: the goal is <= 2), and torch's thread count (torchao runs
on that many threads; numpy on one). Asserts nothing: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np

from labkit.formats import blocks
from labkit.hardware.detect import quiet_native_logs

FORMATS = ("mxfp8_e4m3", "mxfp4", "nvfp4")


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-size", type=int, default=22, help="2^N float32 values (default 22)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per side (default 5)")
    args = parser.parse_args()

    with warnings.catch_warnings(), quiet_native_logs():
        warnings.simplefilter("ignore")
        import torch
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

    x = np.random.default_rng(0).standard_normal((2 ** args.log2_size // 1024, 1024)).astype(np.float32)
    xt = torch.from_numpy(x)
    torchao = {
        "mxfp8_e4m3": lambda: MXTensor.to_mx(xt, torch.float8_e4m3fn, 32).dequantize(torch.float32),
        "mxfp4": lambda: MXTensor.to_mx(xt, torch.float4_e2m1fn_x2, 32).dequantize(torch.float32),
        "nvfp4": lambda: NVFP4Tensor.to_nvfp4(xt).dequantize(torch.float32),
    }
    print(f"quantize + dequantize of 2^{args.log2_size} float32 values, median of {args.repeat}; "
          f"torch threads: {torch.get_num_threads()}")
    print(f"{'format':<12} {'labkit ms':>10} {'torchao ms':>11} {'labkit/torchao':>15}")
    for name in FORMATS:
        ours = _median_ms(lambda: blocks.quantize(x, name).dequantize(), args.repeat)
        theirs = _median_ms(torchao[name], args.repeat)
        print(f"{name:<12} {ours:>10.1f} {theirs:>11.1f} {ours / theirs:>15.2f}")


if __name__ == "__main__":
    main()
