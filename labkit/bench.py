"""`labkit bench`: step time, throughput and activation memory per framework x precision x model.

Every cell is a real `labkit.train.run` on synthetic data of the course's shapes:

    for each framework, model, shape:
        for each precision (fp32 first, the baseline):
            run warmup + steps optimizer steps          (compilation lands in the warm-up)
            step_time = median of the timed steps       (each synchronised with the device)
            speedup   = fp32 step_time / step_time      (same framework, model, shape, run)

Activation bytes are *measured* where the framework can tell (PyTorch: the bytes autograd
saves for backward; JAX: the compiled step's temporary buffers) and *modelled* from the layer
shapes (`labkit.memory.activation_bytes`) everywhere; both are in each record.

Shapes default to multiples of 64 -- what tensor cores and AVX-512/AMX tiles want;
``odd_sizes=True`` adds the same cells at odd sizes (batch - 1, width - 1 or -4) to show
what misaligned shapes cost. A combination that cannot run here is a record with
``status="skipped"`` and the reason, never a crash: bf16 on a GPU without it, a device
that is not here, a framework that is not installed. (fp16 on a CPU with no fp16 units
does run, and is timed: with TensorFlow 2.21 on an AVX512-BF16 CPU it measured 0.66x
fp32's speed on the MLP, not the orders of magnitude older guides warn of.)

>>> cells(["torch"], ["fp32", "bf16"], ["mlp"])[:2]
[('torch', 'mlp', 'aligned', 'fp32'), ('torch', 'mlp', 'aligned', 'bf16')]
"""

from __future__ import annotations

import math
from typing import Callable

from labkit import memory
from labkit.formats.table import Table
from labkit.train import FRAMEWORKS, MODELS, PRECISIONS, RunConfig, RunFailed, run

DEFAULT_WIDTH = {"mlp": 2048, "transformer": 256}
DEFAULT_BATCH = 512
_MEASURED = {  # the memory() key that holds measured activation bytes, per framework
    "torch": ("saved_activation_bytes", "measured: bytes autograd saves for backward"),
    "jax": ("step_temp_bytes", "measured: XLA temporary buffers of the compiled step"),
}


# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; fp16 for
# Volta/Turing, which have no bf16. Used only to report MFU when the device name matches.
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L4": 121.0, "A10G": 70.0,
               "V100": 125.0, "T4": 65.0}


def train_flops(model: str, batch_size: int, width: int | None = None) -> int:
    """Matmul FLOPs of one training step: 3 x the forward pass (the backward pass does two
    matmuls for each forward one), forward = 2 x multiply-adds. Element-wise work, norms and
    softmax are left out, as MFU figures usually do (the "6 N D" convention: it also counts
    the gradient with respect to the data, which a first layer does not need). Checked
    against ``torch.utils.flop_counter.FlopCounterMode`` in the tests.

    >>> train_flops("mlp", 1, 32) == 3 * 2 * (64 * 32 + 32 * 32 + 32 * 10)
    True
    """
    from labkit.train.models import DEFAULT_WIDTH as MODEL_WIDTH
    from labkit.train.models import N_CLASSES, N_PIXELS, transformer_shape

    if model == "mlp":
        w = width or MODEL_WIDTH["mlp"]  # the model's default width, not this module's DEFAULT_WIDTH
        macs = N_PIXELS * w + w * w + w * N_CLASSES
    elif model == "transformer":
        s = transformer_shape(width)
        t, d = N_PIXELS, s.d_model
        macs = s.layers * t * (12 * d * d + 2 * t * d) + d * N_CLASSES
    else:
        raise ValueError(f"unknown model {model!r}; choose one of mlp, transformer")
    return 3 * 2 * macs * batch_size


def peak_tflops(device: str) -> float | None:
    """The chip's dense bf16 (fp16 before Ampere) peak, if the device description names a known GPU."""
    text = device.upper().replace(" ", "")
    return next((v for k, v in PEAK_TFLOPS.items() if k in text), None)


def _split(values, allowed, what: str) -> list[str]:
    items = [v.strip() for v in values.split(",")] if isinstance(values, str) else list(values)
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"unknown {what} {', '.join(map(repr, bad)) or '(none given)'}; choose from {', '.join(allowed)}")
    return items


def cells(frameworks, precisions, models, odd_sizes: bool = False) -> list[tuple[str, str, str, str]]:
    """(framework, model, shape, precision) in run order: fp32 first in each group."""
    fws = _split(frameworks, FRAMEWORKS, "framework")
    precs = _split(precisions, PRECISIONS, "precision")
    precs = sorted(set(precs), key=lambda p: (p != "fp32", PRECISIONS.index(p)))
    mods = _split(models, MODELS, "model")
    shapes = ("aligned", "odd") if odd_sizes else ("aligned",)
    return [(f, m, s, p) for f in fws for m in mods for s in shapes for p in precs]


def shape_of(model: str, shape: str, batch_size: int | None, width: int | None) -> tuple[int, int]:
    """Batch size and width for a cell: aligned defaults, or odd neighbours of them."""
    b = batch_size or DEFAULT_BATCH
    w = width or DEFAULT_WIDTH[model]
    if shape == "odd":
        b = b - 1
        w = w - 4 if model == "transformer" else w - 1  # transformer: 4 heads, so d_head becomes odd
    return b, w


def bench(frameworks=("torch",), precisions=("fp32", "bf16"), models=("mlp",), *, batch_size: int | None = None,
          width: int | None = None, warmup: int = 5, steps: int = 20, device: str = "auto",
          odd_sizes: bool = False, on_cell: Callable[[dict], None] | None = None) -> list[dict]:
    """Run every cell and return one record per cell (see the module docstring)."""
    for name, value, low in (("warmup", warmup, 0), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    plan = cells(frameworks, precisions, models, odd_sizes)
    records, baseline = [], {}
    for framework, model, shape, precision in plan:
        b, w = shape_of(model, shape, batch_size, width)
        rec = dict(framework=framework, precision=precision, model=model, shape=shape, batch_size=b, width=w,
                   warmup=warmup, steps=steps, activation_bytes_model=memory.activation_bytes(model, b, precision, w))
        reason, result = None, None
        cfg = RunConfig(framework, precision, model=model, dataset="synthetic", steps=warmup + steps,
                        batch_size=b, width=w, device=device, progress=False, seed=0)
        try:
            result = run(cfg)
        except (ValueError, ImportError) as exc:  # cannot run here: say why
            reason = str(exc)
        except RunFailed as exc:
            result = exc.result
        if result is None:
            rec.update(status="skipped", reason=reason)
        else:
            rec.update(_measure(result, framework, b, warmup))
            rec["flops_per_step"] = train_flops(model, b, w)
            rec["achieved_tflops"] = rec["flops_per_step"] / rec["step_time_s"] / 1e12 if rec["step_time_s"] > 0 else None
            peak = peak_tflops(rec["device"])
            rec["mfu"] = rec["achieved_tflops"] / peak if peak and rec["achieved_tflops"] else None
            if precision == "fp32" and result.status == "ok":
                baseline[(framework, model, shape)] = rec["step_time_s"]
            base = baseline.get((framework, model, shape))
            rec["speedup_vs_fp32"] = base / rec["step_time_s"] if base and rec["step_time_s"] > 0 else None
        records.append(rec)
        if on_cell:
            on_cell(rec)
    return records


def _measure(result, framework: str, batch_size: int, warmup: int) -> dict:
    step = result.median_step_time(skip_first=warmup)
    key, source = _MEASURED.get(framework, (None, None))
    measured = result.memory.get(key) if key else None
    return dict(
        status=result.status,
        device=result.device,
        step_time_s=step,
        samples_per_s=batch_size / step if step > 0 else math.nan,
        final_loss=result.final_loss,
        activation_bytes=measured,
        activation_source=source if measured is not None else "not measurable here (see activation_bytes_model)",
        memory=result.memory,
    )


def progress_line(rec: dict, index: int | None = None, total: int | None = None) -> str:
    head = f"[{index}/{total}] " if index else ""
    name = f"{rec['framework']:5} {rec['model']:11} {rec['precision']:9} b={rec['batch_size']} w={rec['width']}"
    if rec["status"] == "skipped":
        return f"{head}{name}  skipped: {rec['reason']}"
    speed = f"x{rec['speedup_vs_fp32']:.2f}" if rec.get("speedup_vs_fp32") else "  -  "
    mfu = f"  MFU {100 * rec['mfu']:.1f}%" if rec.get("mfu") else ""
    return (f"{head}{name}  {rec['step_time_s'] * 1e3:9.2f} ms/step  {speed}  "
            f"{rec['achieved_tflops'] * 1e3:.1f} GFLOP/s{mfu}  {rec['status']}")


def table(records: list[dict]) -> Table:
    """The records as a Table (one row per cell)."""
    rows = []
    for r in records:
        if r["status"] == "skipped":
            rows.append((r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]),
                         "skipped", "", "", "", "", _mb(r["activation_bytes_model"]), ""))
            continue
        rows.append((
            r["framework"], r["model"], r["precision"], str(r["batch_size"]), str(r["width"]), r["status"],
            f"{r['step_time_s'] * 1e3:.2f}", f"{r['samples_per_s']:.0f}",
            f"{r['speedup_vs_fp32']:.2f}x" if r.get("speedup_vs_fp32") else "-",
            f"{r['achieved_tflops'] * 1e3:.1f}" + (f" ({100 * r['mfu']:.0f}% MFU)" if r.get("mfu") else ""),
            _mb(r["activation_bytes"]) if r["activation_bytes"] is not None else f"({_mb(r['activation_bytes_model'])})",
            f"{r['final_loss']:.3f}",
        ))
    cols = ("framework", "model", "precision", "batch", "width", "status", "ms/step", "samples/s",
            "vs fp32", "GFLOP/s", "activations MB", "final loss")
    return Table(cols, tuple(rows), "labkit bench (activation MB in parentheses: modelled, not measured)")


def _mb(n) -> str:
    return f"{n / 1e6:.2f}"


def plot(records: list[dict], path: str | None = None):
    """Bar chart of speed-up vs fp32 per cell; saved to `path` if given. Returns the Figure."""
    import matplotlib.pyplot as plt

    done = [r for r in records if r["status"] != "skipped" and r.get("speedup_vs_fp32")]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(done) + 2), 3.2), dpi=90)
    labels = [f"{r['framework']}\n{r['model']}\n{r['precision']}" for r in done]
    ax.bar(range(len(done)), [r["speedup_vs_fp32"] for r in done], color="#4C78A8")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(done)), labels, fontsize=7)
    ax.set_ylabel("speed-up vs fp32")
    ax.set_title("Measured step-time speed-up (same framework, model and shape)", fontsize=9)
    fig.tight_layout()
    if path:
        fig.savefig(path)
    plt.close(fig)
    return fig


# -- the hardware's ceiling: one big matmul per framework ----------------------------------------
MATMUL_FRAMEWORKS = ("torch", "jax", "tf")


def matmul_ms(n: int = 1024, frameworks=MATMUL_FRAMEWORKS, dtypes=("float32", "bfloat16"),
              repeats: int = 5, number: int = 5) -> dict[tuple[str, str], float]:
    """Milliseconds of one (n, n) @ (n, n) matmul, per (framework, dtype): the best of `repeats`
    timings of `number` calls each, after a warm-up call (compilation, kernel selection).

    Each framework runs on its default device (PyTorch: CUDA if present) with its *default*
    settings -- so on an NVIDIA GPU JAX and TensorFlow compute float32 in TF32 and PyTorch does
    not. Every call waits for its result. The operands are the same numbers in every framework.
    """
    import timeit

    import numpy as np

    for name, value in (("n", n), ("repeats", repeats), ("number", number)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    frameworks = _split(frameworks, MATMUL_FRAMEWORKS, "framework")
    dtypes = _split(dtypes, ("float32", "bfloat16", "float16"), "dtype")
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    out = {}
    for framework in frameworks:
        for dtype in dtypes:
            call = _matmul_call(framework, a, dtype)
            call()
            out[framework, dtype] = 1e3 * min(timeit.repeat(call, number=number, repeat=repeats)) / number
    return out


def _matmul_call(framework: str, a, dtype: str) -> Callable[[], object]:
    """A no-argument call that multiplies `a` by itself in `framework` and `dtype` and waits."""
    if framework == "torch":
        import torch

        gpu = torch.cuda.is_available()
        t = torch.from_numpy(a).to("cuda" if gpu else "cpu", getattr(torch, dtype))
        return lambda: (t @ t, torch.cuda.synchronize() if gpu else None)
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        j, matmul = jnp.asarray(a, dtype), jax.jit(jnp.matmul)
        return lambda: matmul(j, j).block_until_ready()
    from labkit.train.tf_models import import_tensorflow

    tf, _ = import_tensorflow()
    f = tf.constant(a, dtype)
    return lambda: tf.linalg.matmul(f, f)[0, 0].numpy()


def matmul_table(ms: dict[tuple[str, str], float], n: int) -> Table:
    """`matmul_ms`'s figures per framework: ms and GFLOP/s (2 n^3 flops) for each dtype, and each
    dtype's speed-up over the framework's own float32; the title says how the fastest run of each
    dtype, in any framework, compare -- what the hardware gives, whichever library gets it."""
    if not isinstance(ms, dict) or not ms:
        raise ValueError("matmul_table takes the dict matmul_ms returns")
    dtypes = list(dict.fromkeys(d for _, d in ms))
    rows = []
    for fw in dict.fromkeys(f for f, _ in ms):
        row = [fw]
        for d in dtypes:
            t = ms.get((fw, d))
            row += ["-", "-"] if t is None else [f"{t:.2f}", f"{2 * n**3 / t / 1e6:.0f}"]
        base = ms.get((fw, "float32"))
        row += [f"{base / ms[fw, d]:.1f}x" if base and (fw, d) in ms else "-" for d in dtypes if d != "float32"]
        rows.append(tuple(row))
    cols = ["framework"] + [c for d in dtypes for c in (f"{d} ms", f"{d} GFLOP/s")]
    cols += [f"{d} speed-up" for d in dtypes if d != "float32"]
    fastest = {d: min(t for (_, dd), t in ms.items() if dd == d) for d in dtypes}
    title = f"{n} x {n} matmul"
    if "float32" in fastest and "bfloat16" in fastest:
        title += f"; fastest float32 / fastest bfloat16, any framework: {fastest['float32'] / fastest['bfloat16']:.1f}x"
    return Table(tuple(cols), tuple(rows), title)
