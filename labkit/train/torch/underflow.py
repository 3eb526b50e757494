"""Loss scaling that matters in a real run: a deep narrow MLP whose fp16 gradients underflow.

Notebook 03 shows loss scaling on injected infs and on a loss multiplied by a tiny constant.
Here nothing is injected: an ordinary network, initialised the way ``nn.Linear`` initialises
itself, trained with Adam on mini-batches of the digits, has most of its backward-pass
gradients below fp16's range. Why, in three factors:

1. **The mean over the batch.** ``cross_entropy`` averages over the B samples, so the
   gradient of each logit is (softmax - one_hot) / B: about 0.1 / 512 = 2e-4 for a wrong
   class at B = 512, before any layer has touched it.
2. **Depth with PyTorch's default init.** ``nn.Linear.reset_parameters``
   (``torch/nn/modules/linear.py``) draws weights from U(-1/sqrt(n), 1/sqrt(n)) -- it calls
   ``kaiming_uniform_(a=sqrt(5))``, the same thing (pytorch/pytorch#57109) -- a variance of
   1/(3n). Going back through a Linear multiplies a gradient's variance by n/(3n) = 1/3 and
   through a ReLU by about 1/2 (half the units are off): a factor sqrt(1/6) = 0.41 in size per
   layer (He init, sqrt(2/n), would give 1). Sixteen layers: 0.41**16 = 6e-7. The forward
   pass does not shrink the same way, because each layer's bias adds a fresh O(1/sqrt(n)).
3. **fp16's floor.** fp16's smallest normal is 2**-14 = 6.1e-5 and its smallest subnormal
   2**-24 = 6.0e-8; a value at most 2**-25 rounds to zero. 2e-4 * 0.41**k is below 2**-25
   from about k = 9 layers down: the lower half of the network gets exact zeros.

Under ``torch.amp.autocast("cpu", torch.float16)`` the weights stay fp32 (their own grads
are fp32), but each Linear's output is fp16, so the gradient of every hidden activation is
an fp16 tensor computed by an fp16 matmul in backward, and there the underflow happens; the
weight gradients of the layers below are then built from those zeros. Adam makes the loss of
the signal visible: it divides each update by the gradient's own size, so in fp32 a gradient
of 1e-9 moves its weight as far as one of 1e-3 -- but a gradient of exactly 0 does not move it
at all. The deep layers freeze, the input's signal, which fades on its way up (0.41 per
layer), never reaches the head, and fp16 without a scaler learns only the class frequencies
(loss ln 10 = 2.30). ``torch.amp.GradScaler("cpu")`` (``torch/amp/grad_scaler.py``:
``init_scale=2.0**16``, ``growth_interval=2000``) multiplies the loss by 2**16 before
backward: the same gradients, 2**16 times larger, are representable, and the run tracks
fp32. bf16 has fp32's 8 exponent bits (smallest normal 2**-126): no scaler needed.

`underflow_runs` trains the four (`RUNS`) on the same data from the same weights, and hooks
every hidden activation (each ReLU's output) to count, per step, the elements of its real
gradient that are exactly 0 (``flushed``) and whose unscaled value is at most 2**-25
(``below_fp16``: what fp16 without a scaler flushes; in fp32, what a cast to fp16 would).
`plot_underflow_runs` draws them; `underflow_checks` states the claims and checks them here.

Why not ``labkit.train.run``: its fp16 always has a GradScaler (``RunConfig(init_scale=1.0)``
keeps its scale at 1 for 2000 steps, the same arithmetic as no scaler, but a step with an inf
would still be skipped), and its models have no depth or init to choose: the MLP has two
hidden layers with He init, whose backward keeps gradients near (softmax - one_hot) / B --
subnormal at worst in fp16, even at the digits' full batch of 1438, and rarely flushed (measured
once, 100 full-batch fp16 steps: over half of its activation gradients subnormal, under 0.5% flushed).
So the runs are written here, on labkit's data (`labkit.train.data.load`, ``batches``).

>>> r = underflow_runs(steps=2)
>>> r.runs["fp16"].grad_dtype, r.runs["bf16"].grad_dtype, r.runs["fp16-scaler"].scales.tolist()
('float16', 'bfloat16', [65536.0, 65536.0])
>>> bool(r.runs["fp16"].flushed[0] > 0.2), bool(r.runs["fp16-scaler"].flushed[0] < 0.01)
(True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from labkit._validate import integer, number, shown
from labkit.table import Table
from labkit.train.data import batches, load
from labkit.train.models import N_CLASSES, N_PIXELS
from labkit.train.torch.stepper import matmul_precision
from labkit.train.torch.threads import one_thread

RUNS = {"fp32": "fp32", "fp16": "fp16 autocast, no scaler", "fp16-scaler": "fp16 autocast + GradScaler",
        "bf16": "bf16 autocast, no scaler"}
"""`underflow_runs`'s four runs: key -> label."""
FP16_FLUSH = 2.0**-25
"""Half fp16's smallest subnormal 2**-24: a value of at most this size rounds to 0 in fp16 (a tie goes to even, 0)."""
_DTYPES = {"fp32": None, "fp16": torch.float16, "fp16-scaler": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class UnderflowRun:
    """One run of `underflow_runs`, per step: the loss, the share of the hidden activations' gradient
    elements that were exactly 0 (``flushed``) and whose unscaled value was at most 2**-25
    (``below_fp16``: what fp16 without a scaler flushes), and the loss scale
    its backward used (``scales``: GradScaler's, 1.0 where there is none). ``grad_dtype`` is the dtype
    of those gradients."""

    name: str
    losses: np.ndarray
    flushed: np.ndarray
    below_fp16: np.ndarray
    scales: np.ndarray
    grad_dtype: str

    @property
    def label(self) -> str:
        return RUNS[self.name]

    @property
    def final_loss(self) -> float:
        """The mean loss of the last tenth of the steps (at least one): one mini-batch is noisy."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return float(np.mean(tail))


@dataclass(frozen=True)
class UnderflowRuns:
    """`underflow_runs`'s result: ``runs[key]`` for each key of `RUNS`, and the settings."""

    runs: dict
    steps: int
    depth: int
    width: int
    batch_size: int
    lr: float
    seed: int

    def table(self) -> Table:
        """Per run: the gradients' dtype, the final loss, the mean share flushed / at most 2**-25, the last scale."""
        scale = lambda r: f"2^{math.log2(r.scales[-1]):g}" if r.name == "fp16-scaler" else "-"  # noqa: E731
        rows = tuple((r.label, r.grad_dtype, f"{r.final_loss:.3f}", f"{r.flushed.mean():.1%}",
                      f"{r.below_fp16.mean():.1%}", scale(r)) for r in self.runs.values())
        return Table(("run", "activation grads in", "loss (last 10%)", "flushed to 0", "at most 2^-25", "loss scale"),
                     rows, title=f"{self.depth} hidden layers of {self.width}, batch {self.batch_size}, "
                                 f"Adam lr {self.lr:g}, {self.steps} steps")


def deep_mlp(depth: int = 16, width: int = 64, seed: int = 0) -> nn.Module:
    """``nn.Sequential``: 64 pixels -> `depth` x (Linear(width), ReLU) -> Linear(10), fp32, on the CPU,
    initialised as ``nn.Linear`` initialises itself (weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)))
    but drawn by numpy from `seed`, so that torch's random generator is left alone.

    >>> net = deep_mlp(depth=3, width=8)
    >>> len(net), float(net[0].weight.detach().abs().max()) <= 1 / 8  # fan_in 64
    (7, True)
    """
    depth = integer("depth", depth, minimum=1, maximum=64)
    width = integer("width", width, minimum=1, maximum=1024)
    rng = np.random.default_rng(integer("seed", seed, minimum=0))
    dims = [N_PIXELS] + [width] * depth + [N_CLASSES]
    layers = []
    for k, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(fan_in, fan_out, device="meta"))
        if k < depth:
            layers.append(nn.ReLU())
    net = nn.Sequential(*layers).to_empty(device="cpu")
    with torch.no_grad():
        for layer in net[::2]:
            bound = 1 / math.sqrt(layer.in_features)
            for p in (layer.weight, layer.bias):
                p.copy_(torch.from_numpy(rng.uniform(-bound, bound, tuple(p.shape)).astype(np.float32)))
    return net


def _train(name: str, net: nn.Module, data, steps: int, batch_size: int, lr: float, seed: int) -> UnderflowRun:
    dtype = _DTYPES[name]
    scaler = torch.amp.GradScaler("cpu") if name == "fp16-scaler" else None
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    grads: list[torch.Tensor] = []

    def watch(module, inputs, out):  # each ReLU's output: keep the gradient backward gives it
        out.register_hook(grads.append)

    hooks = [m.register_forward_hook(watch) for m in net if isinstance(m, nn.ReLU)]
    losses, flushed, below, scales, grad_dtype = [], [], [], [], ""
    try:
        for _, (x, y) in zip(range(steps), batches(data, batch_size, seed)):
            grads.clear()
            xb, yb = torch.from_numpy(x), torch.from_numpy(y).long()
            with torch.amp.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(net(xb).float(), yb)  # the loss in fp32, as autocast computes it
            opt.zero_grad(set_to_none=True)
            scale = scaler.get_scale() if scaler else 1.0  # the scale this backward uses
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            size = torch.cat([g.detach().flatten().float().abs() for g in grads])
            losses.append(float(loss.detach()))
            flushed.append(int((size == 0).sum()) / size.numel())
            below.append(int((size <= FP16_FLUSH * scale).sum()) / size.numel())
            scales.append(float(scale))
            grad_dtype = str(grads[0].dtype).removeprefix("torch.")
    finally:
        for h in hooks:
            h.remove()
    return UnderflowRun(name, *(np.array(v) for v in (losses, flushed, below, scales)), grad_dtype)


def underflow_runs(steps: int = 60, *, depth: int = 16, width: int = 64, batch_size: int = 512,
                   lr: float = 2e-3, seed: int = 0) -> UnderflowRuns:
    """The four runs of `RUNS` on the digits: the same `deep_mlp` weights (from `seed`), the same
    mini-batches of `batch_size`, Adam at `lr` (torch's defaults otherwise) for `steps` steps, on the CPU.

    Per step it records the loss, the share of the hidden activations' gradient elements that are exactly
    zero and that are at most 2**-25 times the loss scale (the real gradients, read by hooks on each ReLU's
    output), and GradScaler's scale. The defaults (16 layers of 64, batch 512, 60 steps of Adam at 2e-3) take a
    few seconds for all four on a CPU with native bf16, 10-20 s capped to AVX2 (there fp16 and bf16 matmuls run
    torch's generic kernels); see the module docstring for why fp16's gradients underflow there. Nothing is
    stored: every figure is measured here. Torch's global state (its random generator, autocast, the fp32
    matmul precision, which is "highest" during the runs, and its thread count, which is 1: matmuls this
    small only lose from threads) is left as it was.
    """
    steps = integer("steps", steps, minimum=1, maximum=10_000)
    depth = integer("depth", depth, minimum=1, maximum=64)
    width = integer("width", width, minimum=1, maximum=1024)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=4096)
    lr = number("lr", lr, minimum=0, maximum=1, inclusive=False)
    seed = integer("seed", seed, minimum=0, maximum=2**32 - 1)
    data = load("digits", seed=seed)
    # matmuls this small gain nothing from threads, and lose much on busy cores
    with one_thread(), matmul_precision("highest"):
        runs = {name: _train(name, deep_mlp(depth, width, seed), data, steps, batch_size, lr, seed) for name in RUNS}
    return UnderflowRuns(runs, steps, depth, width, batch_size, lr, seed)


def _result(result) -> UnderflowRuns:
    if not isinstance(result, UnderflowRuns):
        raise TypeError(f"result must be underflow_runs()'s UnderflowRuns; got {type(result).__name__} {shown(result)}")
    if not isinstance(result.runs, dict) or set(result.runs) != set(RUNS) or not all(
            isinstance(r, UnderflowRun) for r in result.runs.values()):
        raise ValueError(f"result must hold the four runs {', '.join(RUNS)}; it holds {shown(result.runs)}")
    return result


def plot_underflow_runs(result: UnderflowRuns, dpi: int = 80):
    """Two panels over the steps: each run's loss, and the share of its hidden activations' gradient
    elements flushed to zero (fp32's share at most 2**-25, what fp16 would flush, dashed). Returns the Figure."""
    import matplotlib.pyplot as plt

    result = _result(result)
    dpi = integer("dpi", dpi, minimum=10, maximum=1000)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.2), dpi=dpi)
    styles = {"fp32": ("k", "-"), "fp16": ("C3", "-"), "fp16-scaler": ("C0", "--"), "bf16": ("C2", ":")}
    for name, run in result.runs.items():
        color, ls = styles[name]
        label = run.label
        if name == "fp16-scaler":
            lo, hi = (f"2^{math.log2(s):g}" for s in (run.scales.min(), run.scales.max()))
            label += f" (scale {hi})" if lo == hi else f" (scale {lo}..{hi})"
        steps = np.arange(len(run.losses))
        left.plot(steps, run.losses, color=color, ls=ls, lw=1.5, label=label)
        right.plot(steps, 100 * run.flushed, color=color, ls=ls, lw=1.5, label=run.label)
    fp32 = result.runs["fp32"]
    right.plot(np.arange(len(fp32.below_fp16)), 100 * fp32.below_fp16, color="0.5", ls="--", lw=1,
               label="fp32's gradients at most 2^-25\n(what a cast to fp16 flushes)")
    left.set(xlabel="step", ylabel="training loss (one mini-batch)", title="loss")
    right.set(xlabel="step", ylabel="% of elements", ylim=(-2, 100),
              title="hidden activations' gradients flushed to 0")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=7)
    fig.suptitle(f"{result.depth} hidden layers of {result.width} (nn.Linear's default init), batch "
                 f"{result.batch_size}, Adam lr {result.lr:g}", fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def underflow_checks(result: UnderflowRuns):
    """The claims of `underflow_runs`, checked on `result` (a `labkit.checks.Report`, one line each):

    * without a scaler, at least 20% of the hidden activations' fp16 gradient elements are flushed to 0
      (mean over the steps); at the first step, from the same weights and batch, at least 20% of fp32's are
      at most 2**-25, so small that a cast to fp16 flushes them: the gradients are that small;
    * with GradScaler at most 1% are, and in bf16 at most 1% are (its range is fp32's);
    * fp16 without a scaler ends at least 1.1x above fp32's loss; with GradScaler, and in bf16 without
      one, at most 1.1x fp32's (`UnderflowRun.final_loss`; these need enough steps for fp32 to learn: the
      defaults, 60 steps at lr 2e-3). One-sided, with margin: a deep net's escape from its first plateau moves
      by a few steps with the last bits of the kernels (seeds 0-3, natively on an AVX512-BF16 CPU and capped to
      AVX2 on one thread: fp16 without a scaler 1.20-1.33x fp32's loss, GradScaler 0.96-1.01x, bf16
      0.95-1.01x; the earlier defaults, 100 steps at 1e-3, take 5/3 as long for the same verdicts);
    * fp16 without a scaler ends within 0.05 of ln 10 = 2.303, the loss of a model that has learned only
      how frequent each class is (the digits' ten classes are near equally frequent): its frozen lower
      layers pass the head nothing to learn from (seeds 0-3, natively and capped as above: 2.3019-2.3024).

    >>> mk = lambda name, loss, flushed, below, dtype: UnderflowRun(name, np.array([2.3, loss]), np.array(
    ...     [flushed] * 2), np.array([below] * 2), np.array([65536.0] * 2), dtype)
    >>> runs = {"fp32": mk("fp32", 1.8, 0.0, 0.45, "float32"), "fp16": mk("fp16", 2.3, 0.45, 0.45, "float16"),
    ...         "fp16-scaler": mk("fp16-scaler", 1.82, 0.0, 0.45, "float16"),
    ...         "bf16": mk("bf16", 1.81, 0.0, 0.4, "bfloat16")}
    >>> print(underflow_checks(UnderflowRuns(runs, 2, 16, 64, 512, 1e-3, 0)))  # doctest: +NORMALIZE_WHITESPACE
    ✓ without a scaler, at least 20% of the backward pass's fp16 activation gradients are flushed to zero  (here: 45%)
    ✓ at the first step, at least 20% of fp32's are at most 2^-25, which fp16 rounds to zero  (here: 45%)
    ✓ with GradScaler, at most 1% of them are flushed  (here: 0%)
    ✓ in bf16 (fp32's exponent range), at most 1% of them are flushed  (here: 0%)
    ✓ fp16 without a scaler ends at least 1.1x above fp32's loss  (here: 1.28x)
    ✓ with GradScaler, fp16 ends at most 1.1x fp32's loss  (here: 1.01x)
    ✓ bf16 autocast, without a scaler, ends at most 1.1x fp32's loss  (here: 1.01x)
    ✓ fp16 without a scaler ends within 0.05 of ln 10 = 2.303, the loss of knowing only how frequent each class is
      (here: 2.300)
    """
    from labkit import checks

    r = _result(result).runs
    pct = lambda x: 100 * float(np.mean(x))  # noqa: E731
    fp32 = r["fp32"].final_loss
    ratio = lambda name: r[name].final_loss / fp32 if fp32 > 0 else math.nan  # noqa: E731
    return checks.report(
        checks.at_least("without a scaler, at least 20% of the backward pass's fp16 activation gradients are flushed "
                        "to zero", pct(r["fp16"].flushed), 20, unit="%", digits=2),
        checks.at_least("at the first step, at least 20% of fp32's are at most 2^-25, which fp16 rounds to zero",
                        100 * float(r["fp32"].below_fp16[0]), 20, unit="%", digits=2),
        checks.at_most("with GradScaler, at most 1% of them are flushed", pct(r["fp16-scaler"].flushed), 1, unit="%",
                       digits=2),
        checks.at_most("in bf16 (fp32's exponent range), at most 1% of them are flushed", pct(r["bf16"].flushed), 1,
                       unit="%", digits=2),
        checks.at_least("fp16 without a scaler ends at least 1.1x above fp32's loss", ratio("fp16"), 1.1, unit="x"),
        checks.at_most("with GradScaler, fp16 ends at most 1.1x fp32's loss", ratio("fp16-scaler"), 1.1, unit="x"),
        checks.at_most("bf16 autocast, without a scaler, ends at most 1.1x fp32's loss", ratio("bf16"), 1.1, unit="x"),
        checks.close("fp16 without a scaler ends within 0.05 of ln 10 = 2.303, the loss of knowing only how "
                     "frequent each class is", r["fp16"].final_loss, math.log(N_CLASSES), abs=0.05,
                     seen=f"{r['fp16'].final_loss:.3f}"))


__all__ = ["FP16_FLUSH", "RUNS", "UnderflowRun", "UnderflowRuns", "deep_mlp", "plot_underflow_runs",
           "underflow_checks", "underflow_runs"]
