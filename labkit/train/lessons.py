"""Lessons every framework teaches the same way, written once: the framework supplies the numbers.

* `NanHunt` -- what a framework's NaN check (``torch.autograd.detect_anomaly``,
  ``jax_debug_nans``, ``tf.debugging.enable_check_numerics``) said about a planted NaN.
* `moved_fraction` -- after a few real steps, which share of each weight's entries changed at
  all (pure bf16 rounds small updates away; a master copy in fp32 keeps them).
* `gradient_error` -- a low-precision gradient against a float32 reference, entry by entry: how
  much underflowed to exactly 0, how much overflowed, how far the rest is off.

Both take plain numbers (numpy arrays keyed by labkit's parameter names), so a PyTorch, JAX or
TensorFlow run reads in one table:

>>> import numpy as np
>>> ref = {"w": np.array([1e-3, 2e-8, 0.0, 4.0])}
>>> low = {"w": np.array([1e-3, 0.0, 0.0, 4.0])}     # fp16 flushed 2e-8 to 0
>>> e = gradient_error(low, ref, how="fp16", dtype="float16")
>>> e.underflow, e.nonfinite, e.max_rel_error
({'w': 0.3333333333333333}, 0.0, 1.0)
>>> print(gradient_error_table({"fp16": e}))
gradients  dtype    w zeros  error vs float32
---------  -------  -------  ----------------
fp16       float16  33.3%    5.0e-09
>>> print(gradient_error_table({"fp16": e}, detail=True).columns[-3:])
('nonfinite', 'max relative error', 'error vs float32')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit._validate import integer, names as _names, shown
from labkit.table import Table
from labkit.train.config import RunConfig
from labkit.train.data import batches, load


def moved_fraction(config: RunConfig, steps: int = 3, names=None) -> dict[str, float]:
    """Run `steps` real training steps of `config` (any framework, one device) and return, per
    weight, the fraction of its entries that changed (1.0: all moved; 0.0: every update was
    rounded away). `names`: the weights to report (labkit's parameter names), None for all.

    >>> from labkit.train import RunConfig
    >>> moved = moved_fraction(RunConfig("torch", "bf16-pure", width=16, progress=False), steps=1)  # doctest: +SKIP
    """
    from labkit.train import _make_stepper  # labkit.train imports this module

    if not isinstance(config, RunConfig):
        raise TypeError(f"moved_fraction takes a RunConfig as config, got {type(config).__name__}; "
                        "e.g. moved_fraction(RunConfig('tf', 'bf16-pure'))")
    if config.devices != 1:
        raise ValueError(f"moved_fraction runs on one device; got devices={config.devices}")
    steps = integer("steps", steps, minimum=1, maximum=10_000)
    if names is not None and not _names("names", names):
        raise ValueError("names must list at least one weight (or be None for all)")
    data = load(config.dataset, seed=config.seed)
    stepper = _make_stepper(config, data)
    before = stepper.params()
    keep = list(before) if names is None else _names("names", names, list(before))
    feed = batches(data, config.batch_size, seed=config.seed)
    for _ in range(steps):
        stepper.step(*next(feed), inject_overflow=False)
    after = stepper.params()
    return {k: float(np.mean(after[k] != before[k])) for k in keep}


@dataclass(frozen=True)
class GradientError:
    """How a low-precision gradient compares with a float32 reference.

    how: the way it was computed; dtype: the gradients' dtype(s) as the optimizer receives them;
    underflow: per weight, the fraction of its entries nonzero in the reference that came out
    exactly 0; nonfinite: the fraction of all entries that are inf or NaN; max_rel_error: the
    largest ``|g - ref| / |ref|`` over entries nonzero in the reference (inf where g is not
    finite); rel_error: ``||g - ref|| / ||ref||`` over all entries (1.0 when everything is lost).
    """

    how: str
    dtype: str
    underflow: dict
    nonfinite: float
    max_rel_error: float
    rel_error: float


def _flat(what: str, tree: dict) -> dict[str, np.ndarray]:
    if not isinstance(tree, dict) or not tree:
        raise TypeError(f"{what} must be a non-empty dict of weight name -> array, got {type(tree).__name__}")
    return {str(k): np.asarray(v, np.float64).ravel() for k, v in tree.items()}


def gradient_error(grads: dict, reference: dict, how: str = "", dtype: str | None = None) -> GradientError:
    """Compare `grads` with `reference` (dicts of weight name -> array, the same names and sizes).

    `dtype` names the gradients' dtype (default: the dtypes of `grads`' arrays).
    """
    g, r = _flat("grads", grads), _flat("reference", reference)
    if set(g) != set(r) or any(g[k].size != r[k].size for k in r):
        raise ValueError(f"grads and reference must hold the same weights with the same sizes; got {sorted(g)} "
                         f"vs {sorted(r)}")
    if dtype is None:
        dtype = "/".join(sorted({str(np.asarray(v).dtype) for v in grads.values()}))
    underflow = {k: float(np.mean(g[k][r[k] != 0] == 0)) if np.any(r[k] != 0) else 0.0 for k in r}
    ga, ra = np.concatenate([g[k] for k in r]), np.concatenate([r[k] for k in r])
    nonzero = ra != 0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rel = np.abs(ga[nonzero] - ra[nonzero]) / np.abs(ra[nonzero])
        norm = float(np.linalg.norm(ra))
        rel_error = float(np.linalg.norm(ga - ra) / norm) if norm else 0.0
    rel = np.where(np.isnan(rel), np.inf, rel)
    return GradientError(how=str(how), dtype=str(dtype), underflow=underflow,
                         nonfinite=float(np.mean(~np.isfinite(ga))),
                         max_rel_error=float(rel.max()) if rel.size else 0.0,
                         rel_error=rel_error if np.isfinite(rel_error) else float("inf"))


def gradient_error_table(results: dict, names=None, detail: bool = False) -> Table:
    """`gradient_error` results (a dict of label -> GradientError) as a table: dtype, the share of
    each weight's gradient that flushed to zero (`names`: which weights; None: all) and the
    error against float32; with `detail`, also the share not finite and the largest relative
    error of one entry."""
    if not isinstance(results, dict) or not results or not all(isinstance(v, GradientError) for v in results.values()):
        raise TypeError("results must be a non-empty dict of label -> GradientError (gradient_error's result); "
                        f"got {type(results).__name__} {shown(results)}")
    first = next(iter(results.values()))
    keep = list(first.underflow) if names is None else _names("names", names, list(first.underflow))
    if not isinstance(detail, bool):
        raise TypeError(f"detail must be True or False, got {type(detail).__name__}")
    more = ("nonfinite", "max relative error") if detail else ()
    columns = ("gradients", "dtype", *(f"{k} zeros" for k in keep), *more, "error vs float32")
    rows = [(label, e.dtype, *(f"{e.underflow[k]:.1%}" for k in keep),
             *((f"{e.nonfinite:.1%}", f"{e.max_rel_error:.1e}") if detail else ()), f"{e.rel_error:.1e}")
            for label, e in results.items()]
    return Table(columns, tuple(rows))


@dataclass(frozen=True)
class NanHunt:
    """One planted NaN and what the framework's NaN check said about it (`labkit.train.jax.find_nan`,
    `labkit.train.tf.find_nan`). `framework` is the library's name ("jax", "tensorflow"), `version` the
    version that said it (kept out of ``str()``, like the full message)."""

    framework: str  # the library's name alone
    flag: str  # the switch that was turned on
    planted: str  # the expression that makes the NaN
    exception: str  # the type of the error raised
    message: str  # its full text, as the library wrote it
    headline: str  # the line of it that names the op
    op: str  # the op (TensorFlow) or primitive (JAX) named there
    notice: str  # what the library printed besides the error ("" if nothing)
    after_restore: str  # what the same compiled function does once the flag is off again
    version: str = ""  # the library's version ("" if not known)

    def __post_init__(self):
        for name in ("framework", "flag", "planted", "exception", "message", "headline", "op", "notice",
                     "after_restore", "version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string (text); got {type(value).__name__} {shown(value)}")
        if len(self.framework.split()) > 1:
            raise ValueError(f"framework must be the library's name alone, its version in version; got "
                             f"{shown(self.framework)}")

    def __str__(self) -> str:
        """The parts that read the same on every machine with this library version: the headline, not the
        full message (TensorFlow's goes on with the stack that created the op, in this machine's paths),
        the framework's name (not its version), and each line of the notice once."""
        notice = list(dict.fromkeys(line.strip() for line in self.notice.splitlines() if line.strip()))
        rows = [("planted", self.planted), *(("printed", line) for line in notice),
                ("raised", f"{self.exception}: {self.headline}")]
        if self.message.strip() != self.headline.strip():
            rows.append(("", "(the full text, with its stack trace, is .message)"))
        rows += [("op", self.op or "(not named)"), ("flag off", f"the same compiled function {self.after_restore}")]
        head = f"NaN hunt in {self.framework.strip() or '?'}: {self.flag}"
        return "\n".join([head] + [f"{label:<10}{text}" for label, text in rows])

    __repr__ = __str__


__all__ = ["GradientError", "NanHunt", "gradient_error", "gradient_error_table", "moved_fraction"]
