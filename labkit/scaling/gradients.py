"""Real gradients from a small real model: what loss scaling has to fit into fp16 / fp8.

`record_gradients` trains a small PyTorch MLP on scikit-learn's bundled 8x8 digits (no
download) in float32 and keeps, per layer, the gradients a mixed-precision run would
store in 16 or 8 bits: weight gradients and activation gradients (the values of Figure 3
of Micikevicius et al. 2018, "Mixed Precision Training"). It also keeps, per step, the
largest gradient magnitude (what decides an fp16 overflow) and one layer's input and
output gradient (the tensors FP8 training casts to e4m3 and e5m2).

torch and scikit-learn are imported inside the function, so ``labkit.scaling`` stays
light.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numbers

import numpy as np

from labkit._validate import integer, number
from labkit.scaling import _numbers as num

N_DIGITS = 1797  # images in sklearn.datasets.load_digits (a test checks it): the largest batch
MAX_STEPS = 10_000  # about a minute on a CPU; each step keeps its fc2 input and output gradient
MAX_HIDDEN = 4096  # fc2 alone is hidden**2 weights: 16.8 million at 4096


@dataclass(frozen=True, eq=False)
class GradientRecord:
    """Gradients recorded from a real training run (all arrays float32 unless noted).

    Attributes:
      layers: name -> gradient values of that tensor, pooled over ``sample_steps``
        ("fc1.weight", ..., and "grad(h1)", ... for activation gradients).
      amax: per step, the largest |gradient| over all recorded tensors (float64).
      losses: per step, the training loss (float64).
      activations: per step, the input of layer fc2 (cast to e4m3 in FP8 training).
      output_grads: per step, the gradient w.r.t. fc2's output (cast to e5m2).
      sample_steps: the steps whose gradients are pooled in ``layers``.
    """

    layers: dict[str, np.ndarray]
    amax: np.ndarray
    losses: np.ndarray
    activations: list[np.ndarray] = field(repr=False)
    output_grads: list[np.ndarray] = field(repr=False)
    sample_steps: tuple[int, ...] = ()
    description: str = ""

    def __post_init__(self):
        """Check and normalise the fields (one built by hand must hold together: one entry per step)."""
        if not isinstance(self.layers, dict) or not all(isinstance(k, str) for k in self.layers):
            raise TypeError(f"layers must be a dict {{tensor name: gradient values}}; got {type(self.layers).__name__}")
        with np.errstate(over="ignore"):  # float32, as recorded; a diverged run's inf stays inf
            layers = {k: num.real_array(f"layers[{k!r}]", v).astype(np.float32).ravel() for k, v in self.layers.items()}
            per_step = {name: [num.real_array(f"{name}[{i}]", a).astype(np.float32)
                               for i, a in enumerate(_list(name, v))]
                        for name, v in (("activations", self.activations), ("output_grads", self.output_grads))}
        amax, losses = (num.real_array(name, v) for name, v in (("amax", self.amax), ("losses", self.losses)))
        lengths = {"amax": amax.shape, "losses": losses.shape, **{k: (len(v),) for k, v in per_step.items()}}
        if len(set(lengths.values())) != 1 or amax.ndim != 1:
            raise ValueError(f"amax, losses, activations and output_grads hold one entry per step; "
                             f"got shapes {lengths}")
        steps = len(amax)
        sample = tuple(integer("sample_steps", i, minimum=0, maximum=max(steps - 1, 0)) for i in
                       _list("sample_steps", self.sample_steps))
        if not isinstance(self.description, str):
            raise TypeError(f"description must be a string; got {type(self.description).__name__}")
        num.set_fields(self, layers=layers, amax=amax, losses=losses, sample_steps=sample, **per_step)

    @property
    def values(self) -> np.ndarray:
        """Every recorded gradient value, all layers pooled."""
        return np.concatenate([v.ravel() for v in self.layers.values()] or [np.zeros(0, np.float32)])

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}: {v.size}" for k, v in self.layers.items())
        return f"GradientRecord({len(self.amax)} steps; {self.description}; values per tensor: {sizes})"


def _list(name: str, values) -> list:
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a list (one entry per step); got {type(values).__name__}")
    return list(values)


def record_gradients(steps: int = 80, *, batch_size: int = 32, hidden: int = 64, lr: float = 0.5,
                     seed: int = 0, sample_steps=None) -> GradientRecord:
    """Train a 3-layer MLP on ``sklearn.datasets.load_digits`` and record its gradients.

    Algorithm::

        x = digits / 16 (1797 images, 64 pixels), y = labels; model 64 -> hidden -> hidden -> 10
        for step in range(steps):               # SGD on float32, mean cross-entropy
            h1 = relu(fc1(x_b)); h2 = relu(fc2(h1)); loss = CE(fc3(h2), y_b)
            loss.backward()                      # keep grad(h1), grad(z2), grad(h2) too
            record weight and activation gradients, amax = max |g|, fc2's input h1, grad(z2)
            opt.step()

    Runs on the CPU with one thread (restored afterwards), so that a run repeats itself on
    one machine. Another CPU's kernels round differently (its instruction set, its BLAS), and
    80 steps of SGD carry those last bits into the figures: notebook 03 checks what it teaches
    from them (``labkit.checks``), not the figures themselves.
    Small enough for a notebook: 80 steps take well under a second. Limits: ``steps`` from
    1 to 10,000, ``batch_size`` from 1 to 1797 (the whole data set, drawn without
    replacement), ``hidden`` from 1 to 4096, ``lr`` > 0, ``seed`` from 0 to 2**63 - 1.

    >>> rec = record_gradients(steps=3)               # doctest: +SKIP
    >>> sorted(rec.layers)[:2], rec.amax.shape       # doctest: +SKIP
    (['fc1.bias', 'fc1.weight'], (3,))
    """
    steps = integer("steps", steps, minimum=1, maximum=MAX_STEPS)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=N_DIGITS)
    hidden = integer("hidden", hidden, minimum=1, maximum=MAX_HIDDEN)
    lr = number("lr", lr, minimum=0, inclusive=False)
    seed = integer("seed", seed, minimum=0, maximum=2**63 - 1)
    if sample_steps is None:
        sample_steps = sorted({0, steps // 2, steps - 1})
    elif isinstance(sample_steps, numbers.Integral) and not isinstance(sample_steps, (bool, np.bool_)):
        sample_steps = [sample_steps]
    elif isinstance(sample_steps, (str, bytes)) or not hasattr(sample_steps, "__iter__"):
        raise TypeError(f"sample_steps must be a step or a list of steps (integers in [0, {steps - 1}]); "
                        f"got {type(sample_steps).__name__}")
    sample_steps = tuple(sorted({integer("sample_steps", s, minimum=0) for s in sample_steps}))
    if not sample_steps or sample_steps[-1] >= steps:
        raise ValueError(f"sample_steps must be steps in [0, {steps - 1}]; got {sample_steps!r}")

    import torch

    from labkit.memory.shapes import N_CLASSES, N_PIXELS
    from labkit.train.data import arrays  # numpy-only: the data every runner trains on
    from labkit.train.torch.threads import one_thread  # torch's room: imported with torch, here only

    x, y = arrays("digits")  # all 1797 images in sklearn's order (train.data.load permutes and splits them)
    x_all, y_all = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    rng = np.random.default_rng(seed)

    with one_thread():
        torch.manual_seed(seed)
        fc1, fc2 = torch.nn.Linear(N_PIXELS, hidden), torch.nn.Linear(hidden, hidden)
        fc3 = torch.nn.Linear(hidden, N_CLASSES)
        named = {"fc1": fc1, "fc2": fc2, "fc3": fc3}
        params = [p for m in named.values() for p in m.parameters()]
        opt = torch.optim.SGD(params, lr=float(lr))
        pooled: dict[str, list[np.ndarray]] = {}
        amax, losses, acts, out_grads = [], [], [], []
        for step in range(steps):
            idx = torch.from_numpy(rng.choice(len(x_all), size=batch_size, replace=False))
            x, y = x_all[idx], y_all[idx]
            h1 = torch.relu(fc1(x))
            z2 = fc2(h1)
            h2 = torch.relu(z2)
            loss = torch.nn.functional.cross_entropy(fc3(h2), y)
            for t in (h1, z2, h2):
                t.retain_grad()
            opt.zero_grad()
            loss.backward()
            grads = {f"{name}.{kind}": getattr(m, kind).grad
                     for name, m in named.items() for kind in ("weight", "bias")}
            grads.update({"grad(h1)": h1.grad, "grad(z2)": z2.grad, "grad(h2)": h2.grad})
            arrays = {k: g.detach().numpy().astype(np.float32).ravel() for k, g in grads.items()}
            amax.append(max(float(np.abs(a).max()) for a in arrays.values()))
            losses.append(float(loss.detach()))
            acts.append(h1.detach().numpy().astype(np.float32).copy())
            out_grads.append(z2.grad.detach().numpy().astype(np.float32).copy())
            if step in sample_steps:
                for k, a in arrays.items():
                    pooled.setdefault(k, []).append(a.copy())
            opt.step()

    return GradientRecord(
        layers={k: np.concatenate(v) for k, v in pooled.items()},
        amax=np.asarray(amax, dtype=np.float64),
        losses=np.asarray(losses, dtype=np.float64),
        activations=acts,
        output_grads=out_grads,
        sample_steps=sample_steps,
        description=f"MLP 64-{hidden}-{hidden}-10 on sklearn digits, SGD lr={lr}, batch {batch_size}, seed {seed}",
    )
