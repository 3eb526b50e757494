"""Inference in 16 bits: ``torch.inference_mode()`` + autocast, no scaler, against fp32."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkit._validate import integer, names, number
from labkit.table import Table
from labkit.train.torch.recipe._common import DTYPE, LOW, batches, digits, dtype_name, mlp


@dataclass(frozen=True)
class Inference:
    """`inference_agreement`'s figures, per precision (fp32 first: the reference): the share of the test
    digits whose predicted class is fp32's (`agreement`), the test `accuracy`, the largest
    |logit - fp32 logit| (`max_logit_diff`), the logits' dtype, and whether the logits require grad and
    are inference tensors."""

    test_digits: int
    agreement: dict
    accuracy: dict
    max_logit_diff: dict
    logits_dtype: dict
    requires_grad: dict
    inference_tensor: dict

    def table(self) -> Table:
        rows = tuple((p, f"{self.agreement[p]:.2%}", f"{self.accuracy[p]:.2%}", f"{self.max_logit_diff[p]:.3g}",
                      self.logits_dtype[p], str(self.requires_grad[p]), str(self.inference_tensor[p]))
                     for p in self.agreement)
        return Table(("precision", "agreement with fp32", "test accuracy", "max |logit diff|", "logits dtype",
                      "requires_grad", "inference tensor"), rows,
                     title=f"{self.test_digits} test digits, inference_mode + autocast('cpu'), no GradScaler")

    def checks(self):
        """What `inference_agreement` shows, on any machine (a `labkit.checks.Report`, one line per claim):

        * each 16-bit precision predicts fp32's class for at least 95% of the test digits;
        * the logits come out in the autocast dtype (fp32's in float32);
        * ``inference_mode`` records nothing: no logits require grad, all are inference tensors.

        >>> r = Inference(3, {"fp32": 1.0, "bf16": 0.9}, {"fp32": 0.9, "bf16": 0.9}, {"fp32": 0.0, "bf16": 0.1},
        ...               {"fp32": "float32", "bf16": "bfloat16"}, {"fp32": False, "bf16": False},
        ...               {"fp32": True, "bf16": True})
        >>> print(r.checks())
        ✗ expected: bf16 inference predicts fp32's class for at least 95% of the test digits; saw: 90%
        ✓ the logits come out in the autocast dtype  (here: ['float32', 'bfloat16'])
        ✓ inference_mode records nothing: no logits require grad, all are inference tensors
        """
        from labkit import checks

        return checks.report(
            *(checks.at_least(f"{p} inference predicts fp32's class for at least 95% of the test digits",
                              100 * self.agreement[p], 95, unit="%") for p in self.agreement if p != "fp32"),
            checks.equal("the logits come out in the autocast dtype", list(self.logits_dtype.values()),
                         [dtype_name(DTYPE.get(p, torch.float32)) for p in self.logits_dtype]),
            checks.that("inference_mode records nothing: no logits require grad, all are inference tensors",
                        not any(self.requires_grad.values()) and all(self.inference_tensor.values())),
        )


def inference_agreement(precisions=("bf16", "fp16"), *, train_steps: int = 60, width: int = 32, lr: float = 1e-2,
                        seed: int = 0) -> Inference:
    """Inference in 16 bits: ``torch.inference_mode()`` + autocast, no scaler (no backward, so
    nothing to scale), against fp32, on the digits MLP after `train_steps` steps of fp32 Adam::

        model.eval()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            predictions = model(x).argmax(-1)

    Per precision (an `Inference`; ``.table()`` shows it): the share of test images whose predicted
    class is fp32's, the test accuracy, the largest |logit - fp32 logit|, the logits' dtype, and what
    ``inference_mode`` does: outputs that need no grad and are *inference tensors*
    (``torch.is_inference``), nothing recorded for autograd.

    >>> r = inference_agreement(("bf16",), train_steps=5)
    >>> r.logits_dtype, r.requires_grad, r.inference_tensor["bf16"]
    ({'fp32': 'float32', 'bf16': 'bfloat16'}, {'fp32': False, 'bf16': False}, True)
    """
    precisions = names("precisions", precisions, LOW)
    train_steps = integer("train_steps", train_steps, minimum=0, maximum=10_000)
    width = integer("width", width, minimum=1, maximum=1024)
    lr = number("lr", lr, minimum=0, maximum=10)
    seed = integer("seed", seed, minimum=0)
    net = mlp(width, seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for x, y in itertools.islice(batches(32, seed), train_steps):
        F.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    net.eval()
    x, y = torch.from_numpy(digits().x_test), torch.from_numpy(digits().y_test).long()
    out, ref = {k: {} for k in ("agreement", "accuracy", "max_logit_diff", "logits_dtype", "requires_grad",
                                "inference_tensor")}, None
    for p in ("fp32", *precisions):
        with torch.inference_mode(), torch.autocast("cpu", dtype=DTYPE.get(p, torch.bfloat16), enabled=p != "fp32"):
            logits = net(x)
        if ref is None:
            ref = logits
        pred = logits.argmax(-1)
        out["agreement"][p] = (pred == ref.argmax(-1)).double().mean().item()
        out["accuracy"][p] = (pred == y).double().mean().item()
        out["max_logit_diff"][p] = (logits.float() - ref).abs().max().item()
        out["logits_dtype"][p] = dtype_name(logits.dtype)
        out["requires_grad"][p] = logits.requires_grad
        out["inference_tensor"][p] = torch.is_inference(logits)
    return Inference(len(x), **out)


__all__ = ["Inference", "inference_agreement"]
