"""PyTorch demonstrations for notebook 04 (seed 004), each a small function over real torch.

* `dtypes_of` -- which ops autocast runs in bf16/fp16 and which it keeps in fp32, read from
  the output dtypes of real calls on this device, as a table (`autocast_dtypes`: the same as a
  dict, which notebooks 02 and 04 print line by line);
* `stalled_updates` -- pure bf16 (``model.to(torch.bfloat16)``) rounds small updates
  away; autocast with fp32 master weights keeps them; `bf16_rescue` -- stochastic rounding
  (``adam-sr``) and Kahan summation (``adam-kahan``) make pure bf16 train (notebook 10), with
  its claims checked on this machine by `rescue_checks`;
* `SafeLayerNorm` (seed 004's idea, corrected) next to `labkit.train.torch.seeds.SeedSafeLayerNorm`
  (the seed's code) and `compare_layer_norms`, which shows where a LayerNorm really breaks in fp16;
  `unbiased_variance_error` gives the size of the seed's ``x.var()`` mistake per width
  (about 1/(2n)), and `missing_bias_error` the size of its bigger one, the missing bias;

>>> import torch
>>> autocast_dtypes("cpu", torch.bfloat16)["linear"]
('bfloat16', 'bfloat16')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from labkit._validate import integer, number
from labkit.table import Table
from labkit.train.torch.seeds import SeedSafeLayerNorm

# -- which ops autocast lowers ----------------------------------------------------------
_OPS = {
    "linear": lambda a, w, y: F.linear(a, w),
    "matmul": lambda a, w, y: a @ w.T,
    "relu": lambda a, w, y: F.relu(a),
    "gelu": lambda a, w, y: F.gelu(a),
    "add": lambda a, w, y: a + a,
    "exp": lambda a, w, y: a.exp(),
    "pow": lambda a, w, y: a.pow(2),
    "sum": lambda a, w, y: a.sum(),
    "mean": lambda a, w, y: a.mean(),
    "softmax": lambda a, w, y: F.softmax(a, dim=-1),
    "log_softmax": lambda a, w, y: F.log_softmax(a, dim=-1),
    "layer_norm": lambda a, w, y: F.layer_norm(a, a.shape[-1:]),
    "cross_entropy": lambda a, w, y: F.cross_entropy(a, y),
    "nll_loss": lambda a, w, y: F.nll_loss(a, y),
    "mse_loss": lambda a, w, y: F.mse_loss(a, a.detach()),
}


def autocast_dtypes(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[str, str]]:
    """Output dtype of common ops under ``torch.amp.autocast(device_type, dtype)``.

    Each op is called twice: on float32 tensors, and on tensors already in `dtype` (as
    they arrive inside a model, from a matmul autocast has lowered). Returns
    ``{op: (dtype from fp32 inputs, dtype from low-precision inputs)}``. An op on
    autocast's lower-precision list gives `dtype` both times; an op on its fp32 list
    gives float32 both times; any other op just follows its inputs. The lists differ
    between devices (``torch/csrc/autograd/autocast_mode`` registers them per device):
    run this where you train.
    """
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast lowers to torch.bfloat16 or torch.float16, got {dtype}")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device_type 'cuda' needs a CUDA GPU; torch.cuda.is_available() is False here")
    gen = torch.Generator().manual_seed(0)  # a private generator: the learner's RNG is left alone
    a32 = torch.randn(8, 16, generator=gen).to(device_type)
    w32 = torch.randn(16, 16, generator=gen).to(device_type)
    y = torch.randint(0, 16, (8,), generator=gen).to(device_type)
    out = {}
    with torch.amp.autocast(device_type, dtype=dtype):
        for name, op in _OPS.items():
            from32 = op(a32, w32, y).dtype
            fromlow = op(a32.to(dtype), w32.to(dtype), y).dtype
            out[name] = (str(from32).removeprefix("torch."), str(fromlow).removeprefix("torch."))
    return out


def dtypes_of(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Table:
    """`autocast_dtypes` as a table: each op (``name``) and its output dtype from float32 inputs
    and from inputs already in `dtype`.

    >>> print(dtypes_of("cpu", torch.bfloat16).rows[0])
    ('linear', 'bfloat16', 'bfloat16')
    """
    rows = autocast_dtypes(device_type, dtype)
    low = str(dtype).removeprefix("torch.")
    return Table(("name", "from float32", f"from {low}"), tuple((op, *pair) for op, pair in rows.items()),
                 title=f"torch.amp.autocast({device_type!r}, dtype=torch.{low})")


# -- pure bf16 stalls small updates -----------------------------------------------------
@dataclass(frozen=True)
class StalledUpdates:
    """Weight trajectories of `stalled_updates`: ``weights[mode][k]`` after k SGD steps."""

    weight: float
    update: float
    weights: dict[str, np.ndarray]

    @property
    def bf16_spacing(self) -> float:
        """The gap between bf16 numbers just below the starting weight: an update under half
        of it is rounded away in pure bf16."""
        return float(2.0 ** (math.frexp(self.weight)[1] - 1 - 8)) if self.weight > 0 else math.nan


def stalled_updates(steps: int = 50, weight: float = 1.0, update: float = 1e-3) -> StalledUpdates:
    """SGD (lr 1) on one weight whose gradient is `update`, in three precisions.

    The weight sits in an ``nn.Linear(1, 1)`` fed x = 1 and the loss is
    ``update * output``, so each step subtracts `update` (as rounded by the run's dtypes):

    * ``"fp32"`` -- plain fp32;
    * ``"bf16 autocast"`` -- forward under ``torch.amp.autocast("cpu", torch.bfloat16)``,
      weight and optimizer in fp32: the fp32 master weight accumulates every update;
    * ``"bf16-pure"`` -- ``layer.to(torch.bfloat16)``: ``w - 0.001`` is rounded back to bf16
      each step, and below 1.0 bf16 numbers are 2**-8 = 0.0039 apart, so 0.999 rounds back
      to 1.0: the weight never moves.

    >>> r = stalled_updates(steps=3)
    >>> r.weights["bf16-pure"].tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    for name, value in (("weight", weight), ("update", update)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    modes = {"fp32": (torch.float32, False), "bf16 autocast": (torch.float32, True), "bf16-pure": (torch.bfloat16, False)}
    weights = {}
    for mode, (dtype, autocast) in modes.items():
        layer = nn.Linear(1, 1, bias=False, device="meta").to_empty(device="cpu")
        with torch.no_grad():
            layer.weight.fill_(weight)
        layer.to(dtype)
        opt = torch.optim.SGD(layer.parameters(), lr=1.0)
        x = torch.ones(1, 1, dtype=dtype)
        trace = [float(layer.weight.detach())]
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.amp.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = (layer(x) * update).sum()
            loss.backward()
            opt.step()
            trace.append(float(layer.weight.detach()))
        weights[mode] = np.array(trace)
    return StalledUpdates(float(weight), float(update), weights)


# -- pure bf16 rescued by the optimizer ------------------------------------------------
RESCUES = (("bf16", "adam"), ("bf16-pure", "adam"), ("bf16-pure", "adam-sr"), ("bf16-pure", "adam-kahan"))
"""`bf16_rescue`'s runs, as (precision, optimizer): fp32 master weights, then pure bf16 without and with a fix."""


def bf16_rescue(steps: int = 50, lr: float = 1e-4, width: int | None = None, seed: int = 0) -> Table:
    """Pure bf16 stalls; stochastic rounding and Kahan summation make it train (`RESCUES`).

    The same MLP on the digits, the same batches, Adam at `lr` for `steps` steps, four ways:
    ``bf16`` (autocast: fp32 master weights), and ``bf16-pure`` (``model.to(torch.bfloat16)``)
    with plain ``adam``, ``adam-sr`` and ``adam-kahan`` (`labkit.train.torch.optimizers`). Adam's
    update is about `lr` per entry, and at lr 1e-4 that is under half a bf16 spacing for every
    weight above 2**-5 = 0.031 in size (the spacing there is 2**-12): rounded to nearest, most
    updates are rounded away (`stalled_updates` shows one weight). Stochastic rounding keeps them
    on average, Kahan summation keeps what was lost in a buffer and adds it back.

    Per run: the share of each kernel's entries that moved at all (`labkit.train.moved_fraction`,
    the same measure in every framework; in the first layer some inputs are always 0 in the
    digits, so even fp32 master weights do not move all of it), then the mean loss of the last
    5 steps and the test accuracy of a `labkit.train.run` of the same config. Everything is
    measured here; nothing is stored. Each run takes a few seconds on a CPU (torchao,
    torch-optimi: ``labkit[lowp]``).

    >>> t = bf16_rescue(steps=3)                                        # doctest: +SKIP
    >>> t.columns[:3]                                                   # doctest: +SKIP
    ('precision', 'optimizer', 'weights updated in')
    """
    from labkit.memory.shapes import param_shapes
    from labkit.train import RunConfig, moved_fraction, run

    steps = integer("steps", steps, minimum=1, maximum=10_000)
    kernels = [name for name, _ in param_shapes("mlp", width) if name.endswith("/kernel")]
    rows = []
    for precision, optimizer in RESCUES:
        config = RunConfig("torch", precision, steps=steps, lr=lr, width=width, seed=seed, optimizer=optimizer,
                           device="cpu", progress=False)
        moved = moved_fraction(config, steps=steps, names=kernels)
        res = run(config)
        tail = res.losses[-5:]
        accuracy = res.metric["value"] if res.metric else math.nan
        rows.append((precision, optimizer, "bf16" if precision == "bf16-pure" else "fp32 (master)",
                     *(f"{moved[k]:.1%}" for k in kernels), f"{sum(tail) / len(tail):.3f}", f"{accuracy:.1%}"))
    return Table(("precision", "optimizer", "weights updated in", *(f"{k} moved" for k in kernels),
                  "loss (last 5 steps)", "test accuracy"), tuple(rows),
                 title=f"Adam at lr {lr:g}, {steps} steps: which weights moved, and how far training got")


def rescue_checks(table: Table):
    """The claims of `bf16_rescue` checked on its `table` (a `labkit.checks.Report`, one line each):
    plain pure bf16 moves under half of what fp32 master weights move, in every kernel; stochastic
    rounding and Kahan summation each move at least twice what it moves; with either, pure bf16
    ends within 2% of bf16 autocast's loss, and without, at least 5% above it (this last one needs
    enough steps for the stall to cost loss: the default 50 at lr 1e-4).

    >>> t = Table(("precision", "optimizer", "w moved", "loss (last 5 steps)"),
    ...           (("bf16", "adam", "90.0%", "1.90"), ("bf16-pure", "adam", "20.0%", "2.20"),
    ...            ("bf16-pure", "adam-sr", "80.0%", "1.91"), ("bf16-pure", "adam-kahan", "85.0%", "1.90")))
    >>> print(rescue_checks(t))  # doctest: +NORMALIZE_WHITESPACE
    ✓ plain pure bf16 moves at most 0.5x the entries fp32 master weights move, in every kernel  (here: 0.222x)
    ✓ stochastic rounding (adam-sr) moves at least 2x the entries plain pure bf16 moves, in every kernel  (here: 4x)
    ✓ Kahan summation (adam-kahan) moves at least 2x the entries plain pure bf16 moves, in every kernel  (here: 4.25x)
    ✓ with adam-sr, pure bf16 ends within 2% of bf16 autocast's loss  (here: 1.91 vs 1.9)
    ✓ with adam-kahan, pure bf16 ends within 2% of bf16 autocast's loss  (here: 1.9 vs 1.9)
    ✓ plain pure bf16 ends at least 1.05x bf16 autocast's loss  (here: 1.16x)
    """
    from labkit import checks

    if not isinstance(table, Table) or not {"precision", "optimizer", "loss (last 5 steps)"} <= set(table.columns):
        raise TypeError(f"table must be bf16_rescue's Table; got {type(table).__name__}")
    rows = {(r[0], r[1]): dict(zip(table.columns, r)) for r in table.rows}
    if set(rows) != set(RESCUES):
        raise ValueError(f"table must hold bf16_rescue's four runs {RESCUES}; it holds {sorted(rows)}")
    moved_cols = [c for c in table.columns if c.endswith(" moved")]
    moved = {k: [float(r[c].rstrip("%")) / 100 for c in moved_cols] for k, r in rows.items()}
    loss = {k: float(r["loss (last 5 steps)"]) for k, r in rows.items()}
    master, pure = moved[RESCUES[0]], moved[RESCUES[1]]
    ratio = lambda a, b: min(x / y if y else math.inf for x, y in zip(a, b))  # noqa: E731
    out = [checks.at_most("plain pure bf16 moves at most 0.5x the entries fp32 master weights move, in every kernel",
                          max(p / m if m else math.inf for p, m in zip(pure, master)), 0.5, unit="x")]
    for key, name in ((RESCUES[2], "stochastic rounding (adam-sr)"), (RESCUES[3], "Kahan summation (adam-kahan)")):
        out.append(checks.at_least(f"{name} moves at least 2x the entries plain pure bf16 moves, in every kernel",
                                   ratio(moved[key], pure), 2.0, unit="x"))
    for key in RESCUES[2:]:
        out.append(checks.close(f"with {key[1]}, pure bf16 ends within 2% of bf16 autocast's loss", loss[key],
                                loss[RESCUES[0]], rel=0.02))
    out.append(checks.at_least("plain pure bf16 ends at least 1.05x bf16 autocast's loss",
                               loss[RESCUES[1]] / loss[RESCUES[0]], 1.05, unit="x"))
    return checks.report(*out)


# -- LayerNorm in low precision ---------------------------------------------------------
class SafeLayerNorm(nn.Module):
    """A LayerNorm that computes in fp32 whatever its input, then returns the input's dtype.

    Same result as ``nn.LayerNorm`` (biased variance, weight and bias). Note that
    PyTorch's own ``layer_norm`` kernels already accumulate the statistics of fp16/bf16
    inputs in fp32, and on CUDA autocast runs ``layer_norm`` in fp32 anyway: this class
    matters for a *hand-written* norm, which is what the seed is guarding against.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        mean = x32.mean(dim=-1, keepdim=True)
        var = (x32 - mean).pow(2).mean(dim=-1, keepdim=True)  # biased, as nn.LayerNorm
        y = (x32 - mean) * torch.rsqrt(var + self.eps) * self.weight.float() + self.bias.float()
        return y.to(x.dtype)


def naive_layer_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm written by hand in the input's own dtype: E[x^2] - E[x]^2, no fp32 anywhere."""
    mean = x.mean(dim=-1, keepdim=True)
    var = (x * x).mean(dim=-1, keepdim=True) - mean * mean
    return (x - mean) / torch.sqrt(var + eps)


def compare_layer_norms(dtype: torch.dtype = torch.float16, scale: float = 300.0, width: int = 64,
                        rows: int = 8, seed: int = 0) -> dict[str, float]:
    """Largest |error| of four LayerNorms against a float64 reference, on activations of
    size ~`scale` stored in `dtype` (fp16 overflows once x*x > 65504, i.e. |x| > 256).

    Returns ``{name: max abs error}`` (inf/nan when the output is not finite) for
    ``"naive, in <dtype>"``, ``"nn.LayerNorm, in <dtype>"``, ``"SafeLayerNorm"`` and
    ``"seed's SafeLayerNorm"``. Errors are measured on the output in `dtype`, so about
    half an ulp of the normalised values (2**-11 in fp16, 2**-8 in bf16) is the floor.
    """
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype must be torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    gen = torch.Generator().manual_seed(seed)
    x = (scale * (1 + 0.5 * torch.randn(rows, width, generator=gen, dtype=torch.float64))).to(dtype)
    x64 = x.double()
    ref = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-5)
    name = str(dtype).removeprefix("torch.")
    with torch.no_grad():
        outs = {
            f"naive, in {name}": naive_layer_norm(x),
            f"nn.LayerNorm, in {name}": nn.LayerNorm(width).to(dtype)(x),
            "SafeLayerNorm": SafeLayerNorm(width)(x),
            "seed's SafeLayerNorm": SeedSafeLayerNorm(width)(x),
        }
    return {k: float((v.double() - ref).abs().max()) for k, v in outs.items()}


def unbiased_variance_error(widths=(16, 64, 256, 1024, 4096), *, rows: int = 64, seed: int = 0) -> dict[int, dict]:
    """How far the seed's ``x.var()`` (unbiased, divides by n - 1) puts its LayerNorm off, per width n.

    The seed normalises by sqrt(var_unbiased) = sqrt(var * n / (n - 1)), so every output is
    too small by the factor sqrt((n - 1) / n): a relative error of 1 - sqrt(1 - 1/n), about
    1/(2n) -- 0.78% at n = 64, 0.012% at n = 4096 (``eps`` aside). Its *absolute* error is that
    times |x_norm|, whose largest value in a row of n grows like sqrt(2 ln n) (about 3 at n = 64).

    Measured on ``rows`` rows of standard normal float32 activations (seeded) against a float64
    LayerNorm with the biased variance, as ``nn.LayerNorm``. Returns ``{n: {"measured",
    "predicted", "approx", "max_abs"}}``: the largest relative shortfall over the rows (each
    row's least-squares ratio of seed to reference), ``1 - sqrt((n - 1) / n)``, ``1 / (2 n)``
    and the largest absolute error.

    >>> e = unbiased_variance_error((64,), rows=4)[64]
    >>> round(e["predicted"], 5), round(e["approx"], 5), abs(e["measured"] / e["predicted"] - 1) < 0.01
    (0.00784, 0.00781, True)
    """
    if isinstance(widths, (int, np.integer)) and not isinstance(widths, bool):
        widths = (widths,)
    if not isinstance(widths, (list, tuple)) or not widths:
        raise TypeError(f"widths must be a list of widths (integers >= 2); got {type(widths).__name__} {widths!r:.60}")
    widths = [integer("widths", n, minimum=2, maximum=2**16) for n in widths]
    rows = integer("rows", rows, minimum=1, maximum=4096)
    seed = integer("seed", seed, minimum=0, maximum=2**63 - 1)
    out = {}
    gen = torch.Generator().manual_seed(seed)
    for n in widths:
        x = torch.randn(rows, n, generator=gen, dtype=torch.float32)
        x64 = x.double()
        ref = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-5)
        with torch.no_grad():
            got = SeedSafeLayerNorm(n)(x).double()
        ratio = (got * ref).sum(-1) / (ref * ref).sum(-1)
        out[n] = {"measured": float((1 - ratio).abs().max()), "predicted": 1 - math.sqrt((n - 1) / n),
                  "approx": 1 / (2 * n), "max_abs": float((got - ref).abs().max())}
    return out


def missing_bias_error(bias: float = 0.1, width: int = 64, *, rows: int = 64, seed: int = 0) -> dict[str, object]:
    """What the seed's missing bias costs: a LayerNorm whose learned bias is `bias` (every
    element), loaded into the seed's class, which has nowhere to put it.

    ``load_state_dict`` refuses (Unexpected key(s) in state_dict: "bias"); with
    ``strict=False`` it drops the bias, and every output is off by the bias itself, at every
    width (on top of the variance mistake, which shrinks like 1/(2n)). Returns
    ``{"strict_error": the RuntimeError's text, "max_abs": largest |error| with strict=False,
    "variance_max_abs": the part of it the unbiased variance causes (the error once the bias is
    added back)}``.

    >>> r = missing_bias_error(0.1, 64, rows=4)
    >>> 'Unexpected key(s) in state_dict: "bias"' in r["strict_error"], r["max_abs"] >= 0.1 > r["variance_max_abs"]
    (True, True)
    """
    bias = number("bias", bias, minimum=-1e6, maximum=1e6)
    width = integer("width", width, minimum=2, maximum=2**16)
    rows = integer("rows", rows, minimum=1, maximum=4096)
    seed = integer("seed", seed, minimum=0, maximum=2**63 - 1)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    trained = nn.LayerNorm(width)
    with torch.no_grad():
        trained.bias.fill_(bias)
    seed_norm = SeedSafeLayerNorm(width)
    try:
        seed_norm.load_state_dict(trained.state_dict())
        strict_error = ""
    except RuntimeError as err:
        strict_error = str(err).strip()
    seed_norm.load_state_dict(trained.state_dict(), strict=False)
    with torch.no_grad():
        ref = trained(x).double()
        got = seed_norm(x).double()
        no_bias = ref - bias
    return {"strict_error": strict_error, "max_abs": float((got - ref).abs().max()),
            "variance_max_abs": float((got - no_bias).abs().max())}
