"""Real tensors for the FP8 lessons: what each ``nn.Linear`` of the digits MLP sees while it trains.

An FP8 recipe quantizes three tensors per linear layer: its input (activation), its weight,
and, in the backward pass, the gradient of its output. `capture` trains the MLP with labkit's
own PyTorch step (`labkit.train.torch.stepper.TorchStepper`, fp32, AdamW, clipping at 1.0:
``RunConfig``'s defaults) and records them with hooks, per layer and per step:

* a forward pre-hook on each ``nn.Linear``: its input ``x`` (batch, in) and its weight
  (out, in), as used in that forward pass (before the step's update);
* a forward hook that puts a tensor hook on the layer's output: in the backward pass it
  receives ``grad_output`` (batch, out), the gradient reaching that output (a module's full
  backward hook would warn on the first layer, whose input needs no gradient).

The arrays are copied to float32 numpy as they are seen; nothing of the training changes
(the hooks only read). `labkit.scaling.recipes.compare` then casts them with each recipe.

>>> tr = capture(steps=2, width=16, batch_size=8)
>>> tr.layers, tr.activations["dense2"].shape, tr.weights["dense2"].shape, tr.gradients["out"].shape
(('dense1', 'dense2', 'out'), (2, 8, 16), (2, 16, 16), (2, 8, 10))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from labkit._validate import integer
from labkit.train.config import RunConfig
from labkit.train.data import batches, load

MAX_STEPS = 1000


@dataclass(frozen=True, eq=False)
class TensorTrace:
    """Per layer name: an array (steps, rows, cols) of what that layer saw at each step."""

    layers: tuple[str, ...]
    activations: dict
    weights: dict
    gradients: dict
    losses: tuple[float, ...]


def capture(steps: int = 8, width: int = 256, seed: int = 0, batch_size: int = 128) -> TensorTrace:
    """Train the digits MLP for `steps` steps (fp32, on the CPU) and record each linear layer's tensors.

    ``width`` 256 (labkit's MLP default) splits the hidden layer's 256x256 weight into four
    128x128 blocks and each of its activation rows into two 1x128 tiles (DeepSeek-V3's
    tiles); the first layer's 64 pixels are one partial tile. ``batch_size`` 128 gives
    activation and gradient tensors of 128 rows (the output layer's gradient: 128 rows of 10).
    """
    from labkit.train.torch.stepper import make_stepper

    steps = integer("steps", steps, minimum=1, maximum=MAX_STEPS)
    width = integer("width", width, minimum=1, maximum=4096)
    batch_size = integer("batch_size", batch_size, minimum=1, maximum=4096)
    config = RunConfig("torch", "fp32", model="mlp", width=width, seed=integer("seed", seed, minimum=0),
                       batch_size=batch_size, steps=steps, device="cpu", progress=False)
    data = load(config.dataset, seed=config.seed)
    stepper = make_stepper(config, data)
    linears = [(name, m) for name, m in stepper.model.named_modules() if isinstance(m, torch.nn.Linear)]
    seen = {kind: {name: [] for name, _ in linears} for kind in ("activations", "weights", "gradients")}

    def grab(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().cpu().numpy().copy()

    def forward(name):
        def hook(module, args):
            seen["activations"][name].append(grab(args[0]))
            seen["weights"][name].append(grab(module.weight))
        return hook

    def backward(name):
        def hook(module, args, output):
            if output.requires_grad:  # the gradient reaching this output, when backward runs
                output.register_hook(lambda grad: seen["gradients"][name].append(grab(grad)))
        return hook

    handles = [h for name, m in linears for h in (m.register_forward_pre_hook(forward(name)),
                                                  m.register_forward_hook(backward(name)))]
    losses = []
    try:
        feed = batches(data, config.batch_size, config.seed)
        for _ in range(steps):
            losses.append(stepper.step(*next(feed)).loss)
    finally:
        for h in handles:
            h.remove()
    stacked = {kind: {name: np.stack(v) for name, v in per.items()} for kind, per in seen.items()}
    return TensorTrace(tuple(name for name, _ in linears), stacked["activations"], stacked["weights"],
                       stacked["gradients"], tuple(float(x) for x in losses))


__all__ = ["TensorTrace", "capture"]
