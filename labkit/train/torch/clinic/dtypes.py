"""The clinic's dtype entries: what autocast leaves alone, what it casts, and where bf16 loses digits.

Autocast keeps per-device lists of ops it runs in the low dtype, ops it runs in fp32, and the rest,
which follow their inputs (registered in ``aten/src/ATen/autocast_mode.cpp``; the CPU's lists are not
CUDA's). These cases read the dtypes from real calls on the CPU, where every learner can run them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from labkit._validate import choice, integer
from labkit.train.torch.clinic.case import Entry, dtype_name, linear, raised
from labkit.train.torch.collectives import DTYPES

BF16 = torch.bfloat16


# -- what autocast leaves alone -------------------------------------------------------------
def _autocast_dtypes() -> str:
    gen = torch.Generator().manual_seed(0)
    emb = nn.Embedding(10, 8, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        emb.weight.copy_(torch.randn(10, 8, generator=gen))
    proj = linear(8, 8, gen)
    ids, y = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2])
    scores = torch.randn(3, 8, generator=gen)
    with torch.autocast("cpu", dtype=BF16):
        e = emb(ids)
        h = proj(e)
        rows = [("nn.Embedding(ids)", e), ("nn.Linear(embedding)", h), ("torch.sum(bf16 h)", torch.sum(h)),
                ("F.softmax(fp32 scores)", F.softmax(scores, -1)), ("F.softmax(bf16 h)", F.softmax(h, -1)),
                ("F.cross_entropy(bf16 logits)", F.cross_entropy(h, y)), ("F.mse_loss(bf16 h, bf16 h)",
                                                                         F.mse_loss(h, h.detach())),
                ("torch.cat([bf16 h, fp32 e])", torch.cat([h, e])),
                ("fp32 e.index_copy(0, idx, bf16 h)", e.index_copy(0, torch.tensor([0]), h[:1]))]
    outside = raised(lambda: e.index_copy(0, torch.tensor([0]), h[:1]))  # no autocast, no promote list
    return "\n".join(f"{name} -> {dtype_name(t.dtype)}" for name, t in rows) + f" (outside autocast: {outside})"


def _autocast_dtypes_fix() -> str:
    gen = torch.Generator().manual_seed(0)
    emb = nn.Embedding(10, 8, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        emb.weight.copy_(torch.randn(10, 8, generator=gen))
    with torch.autocast("cpu", dtype=BF16):
        e = emb(torch.tensor([1, 2]))
        return (f"check, don't assume: labkit.train.torch.dtypes_of('cpu') lists each op's dtype; cast where a "
                f"dtype matters: emb(ids).to(torch.bfloat16) -> {dtype_name(e.to(BF16).dtype)}")


# -- q, k, v of different dtypes ----------------------------------------------------------------
def _attention(cache_dtype: torch.dtype, under_autocast: bool = False) -> torch.Tensor:
    """One decoding step: q from a projection of the model's dtype, k and v from a cache of `cache_dtype`."""
    gen = torch.Generator().manual_seed(0)
    q_proj = linear(8, 8, gen)
    x = torch.randn(1, 2, 1, 8, generator=gen)
    k_cache = torch.randn(1, 2, 4, 8, generator=gen).to(cache_dtype)  # e.g. torch.zeros(...): fp32 by default
    if not under_autocast:  # a pure-bf16 model: model.to(torch.bfloat16)
        q_proj, x = q_proj.to(BF16), x.to(BF16)
    with torch.autocast("cpu", dtype=BF16, enabled=under_autocast):
        q = q_proj(x)
        return F.scaled_dot_product_attention(q, k_cache, k_cache)


def _qkv_mismatch() -> str:
    def by_hand():
        q = linear(8, 8, torch.Generator().manual_seed(0)).to(BF16)(torch.ones(1, 8, dtype=BF16))
        return q @ torch.ones(8, 4)  # the same step, attention written out: q @ k.T with an fp32 k

    return (f"F.scaled_dot_product_attention: {raised(lambda: _attention(torch.float32))}\n"
            f"q @ k.transpose(-2, -1):        {raised(by_hand)}")


def _qkv_fix() -> str:
    ok = _attention(BF16)
    auto = _attention(torch.float32, under_autocast=True)
    return (f"cache in the model's dtype (torch.zeros(..., dtype=q.dtype), or k.to(q.dtype)): output "
            f"{dtype_name(ok.dtype)} {tuple(ok.shape)}\n"
            f"the same fp32 cache under torch.autocast: no error, output {dtype_name(auto.dtype)} "
            f"(autocast casts q, k and v itself: the mismatch only bites outside it)")


# -- RoPE angles in bf16 ----------------------------------------------------------------------
def _rope_angles(positions: int = 4096, dim: int = 64, base: float = 10000.0, autocast: bool = True) -> torch.Tensor:
    """RoPE's angles ``inv_freq[:, None] @ positions[None, :]`` (dim/2 x positions), computed as
    Llama's rotary embedding writes it; under bf16 autocast when `autocast` (the matmul, positions and
    all, then runs in bf16) -- which is why ``transformers/models/llama/modeling_llama.py``
    (``LlamaRotaryEmbedding.forward``) wraps it in ``torch.autocast(..., enabled=False)`` and ``.float()``."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    pos = torch.arange(positions, dtype=torch.float32)
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        return inv_freq[:, None] @ pos[None, :]


def _rope_text(autocast: bool, positions: int = 4096) -> str:
    angles = _rope_angles(positions, autocast=autocast)
    exact = _rope_angles(positions, autocast=False).double()
    ref = (1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))[:, None] * torch.arange(
        positions, dtype=torch.float64)[None, :]
    err = (angles.double() - ref).abs()
    distinct = torch.unique(angles.T, dim=0).shape[0]
    where = "torch.autocast('cpu', bfloat16)" if autocast else "fp32, autocast disabled"
    text = (f"{where}: angles {dtype_name(angles.dtype)}; {distinct} of {positions} positions have distinct "
            f"angles; largest angle error {float(err.max()):.3g} rad")
    if autocast:
        p257 = float(torch.tensor(257.0).to(BF16))
        return f"position 257 becomes {p257:g} in bf16 (bf16 numbers in [256, 512) are 2 apart)\n" + text
    cos_err = float((torch.cos(angles).to(BF16).double() - torch.cos(exact)).abs().max())
    return text + f"\ncos/sin cast to bf16 afterwards: off by at most {cos_err:.2g}, as a bf16 rounding of [-1, 1] is"


# -- gradient accumulation in a bf16 .grad ------------------------------------------------------
MICRO_BATCHES = (1, 4, 16, 64, 256)


def _accumulation_error(pure_bf16: bool, micro_batches=MICRO_BATCHES, width: int = 32,
                        seed: int = 0) -> dict[int, float]:
    """Relative error of a gradient accumulated over N micro-batches by autograd itself (``backward()``
    adds into ``.grad``), against the float64 sum of the same micro-batch gradients: `pure_bf16`
    (``layer.to(torch.bfloat16)``: ``.grad`` is bf16, so is every addition) or fp32 parameters under bf16
    autocast (``.grad`` is fp32). Only the accumulation is measured: each micro-batch gradient is the
    one autograd gave, summed again in float64. ``{N: relative error}``."""
    gen = torch.Generator().manual_seed(seed)
    layer = linear(width, 1, gen, bias=False)
    teacher = torch.randn(1, width, generator=gen)
    if pure_bf16:
        layer = layer.to(BF16)
    wanted, n_max = set(micro_batches), max(micro_batches)
    ref, out = torch.zeros_like(layer.weight, dtype=torch.float64), {}
    for i in range(1, n_max + 1):
        x = torch.randn(8, width, generator=gen)
        with torch.autocast("cpu", dtype=BF16, enabled=not pure_bf16):
            loss = F.mse_loss(layer(x.to(layer.weight.dtype)).float(), x @ teacher.T)
        (g,) = torch.autograd.grad(loss, layer.weight, retain_graph=True)
        ref += g.double()
        loss.backward()
        if i in wanted:
            out[i] = float(torch.linalg.vector_norm(layer.weight.grad.double() - ref) / torch.linalg.vector_norm(ref))
    return out


@functools.cache
def _accumulation_errors(pure_bf16: bool) -> tuple[tuple[int, float], ...]:
    """`_accumulation_error` with the defaults, measured once per process: the case prints these
    figures and its verdict checks the same ones."""
    return tuple(_accumulation_error(pure_bf16).items())


LOSS_MICRO_BATCHES, LOSS_STEPS = 1024, 4
"""The loss run: SGD steps, each on the gradient of this many micro-batches summed in one buffer."""


BUFFERS = {name: DTYPES[name] for name in ("bf16", "fp16", "fp32")}
"""The dtypes `accumulation_run` sums in, by the course's names."""


def accumulation_run(buffer: str = "bf16", micro_batches: int = LOSS_MICRO_BATCHES,
                     steps: int = LOSS_STEPS) -> tuple[tuple[float, ...], float]:
    """What accumulating in a `buffer` of that dtype (a key of `BUFFERS`) does to the loss. SGD (lr 0.25) on
    a linear regression of width 16 (a random teacher plus noise 0.1, seed 0): each step computes the
    gradient of each of `micro_batches` micro-batches of 32 samples (the loss divided by their number, as
    accumulation does; autograd on per-micro-batch copies of the weights, one backward), adds them into a
    zeroed buffer of `buffer`'s dtype one at a time, in order -- the addition autograd makes into a ``.grad``
    of that dtype -- and steps the fp32 weights with the sum. Everything but the buffer is fp32, so two runs
    differ only in how the sum was rounded.

    Returns the loss on 4096 held-out samples after 0, 1, ..., `steps` steps, and the size of the sum the
    buffer held over the exact (float64) sum of the same gradients, averaged over the steps.

    >>> losses, kept = accumulation_run("fp32", micro_batches=4, steps=1)
    >>> len(losses), round(kept, 4)
    (2, 1.0)
    """
    buffer = BUFFERS[choice("buffer", buffer, tuple(BUFFERS))]
    micro_batches = integer("micro_batches", micro_batches, minimum=1, maximum=1 << 14)
    steps = integer("steps", steps, minimum=1, maximum=100)
    width, batch, lr, noise, seed = 16, 32, 0.25, 0.1, 0
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(width, 1, generator=gen)
    x_test = torch.randn(4096, width, generator=gen)
    y_test = x_test @ teacher + noise * torch.randn(4096, 1, generator=gen)
    w = torch.zeros(width, 1)
    losses, kept = [float(F.mse_loss(x_test @ w, y_test))], []
    for _ in range(steps):
        x = torch.randn(micro_batches, batch, width, generator=gen)
        y = x @ teacher + noise * torch.randn(micro_batches, batch, 1, generator=gen)
        ws = w.expand(micro_batches, width, 1).clone().requires_grad_()  # one copy per micro-batch
        loss = ((x @ ws - y) ** 2).mean(dim=(1, 2)).div(micro_batches).sum()
        (grads,) = torch.autograd.grad(loss, ws)  # grads[i]: micro-batch i's gradient, in fp32
        acc = torch.zeros(width, 1, dtype=buffer)
        for g in grads:
            acc += g.to(buffer)
        kept.append(float(torch.linalg.vector_norm(acc.double()) / torch.linalg.vector_norm(grads.double().sum(0))))
        w = w - lr * acc.float()
        losses.append(float(F.mse_loss(x_test @ w, y_test)))
    return tuple(losses), sum(kept) / len(kept)


@functools.cache
def _accumulation_runs(pure_bf16: bool) -> tuple[tuple[float, ...], float]:
    """`accumulation_run` in a bf16 (`pure_bf16`) or an fp32 buffer, once per process (case and verdict)."""
    return accumulation_run("bf16" if pure_bf16 else "fp32")


def _accumulation_text(pure_bf16: bool) -> str:
    errors = dict(_accumulation_errors(pure_bf16))
    losses, kept = _accumulation_runs(pure_bf16)
    what = ("pure bf16 (model.to(torch.bfloat16)): .grad bf16" if pure_bf16
            else "fp32 params + bf16 autocast: .grad fp32")
    buffer = "bf16" if pure_bf16 else "fp32"
    return (f"{what}; relative error of the accumulated gradient after N micro-batches:\n"
            + "  ".join(f"N={n}: {e:.2g}" for n, e in errors.items())
            + f"\nthe loss: {LOSS_STEPS} SGD steps, each on {LOSS_MICRO_BATCHES} micro-batch gradients summed in "
              f"{'a' if pure_bf16 else 'an'} {buffer} buffer (the rest fp32): the sums hold {kept:.1%} of the exact "
              f"sums' size; loss after 0..{LOSS_STEPS} steps: " + " ".join(f"{v:.3g}" for v in losses))


def _accumulation_verdict():
    """The lesson, checked on the figures printed: bf16's error is large and grows with N, fp32's is tiny; over
    many micro-batches a bf16 sum comes out short, and the run that steps with it ends at a higher loss."""
    from labkit import checks

    bf16, fp32 = dict(_accumulation_errors(True)), dict(_accumulation_errors(False))
    (loss_bf16, kept_bf16), (loss_fp32, _) = _accumulation_runs(True), _accumulation_runs(False)
    n, few = max(MICRO_BATCHES), MICRO_BATCHES[1]
    return checks.report(
        checks.at_least(f"pure bf16: the gradient accumulated over {n} micro-batches is off by at least 0.1% of "
                        "its size", bf16[n], 1e-3),
        checks.at_least(f"pure bf16: the error grows with the number of micro-batches, at least 2x from {few} to {n}",
                        bf16[n] / max(bf16[few], 1e-30), 2.0, unit="x"),
        checks.at_most(f"fp32 .grad (fp32 parameters under autocast): off by at most 1e-5 after {n} micro-batches",
                       fp32[n], 1e-5),
        checks.at_most(f"summed in bf16, {LOSS_MICRO_BATCHES} micro-batch gradients come out short: at most 90% of "
                       "the exact sum's size (the later ones are rounded away)", kept_bf16, 0.9),
        checks.at_least(f"so each step is too small: after {LOSS_STEPS} steps the loss of the run that summed in bf16 "
                        "is at least 3x the loss of the run that summed in fp32", loss_bf16[-1] / loss_fp32[-1], 3.0,
                        unit="x"))


ENTRIES = (
    Entry("autocast-dtypes",
          "under bf16 autocast an embedding comes out fp32, a loss is fp32 from bf16 inputs; on CUDA, sum and "
          "softmax run in fp32 too",
          "nn.Embedding(ids) -> float32",
          "with torch.autocast('cpu', dtype=torch.bfloat16): emb(ids), torch.sum(h), F.softmax(...), "
          "F.cross_entropy(...), torch.cat([bf16, fp32])",
          "expect it: autocast casts only the ops on its lists; cast explicitly where a dtype matters",
          "Autocast is not a global dtype: it changes the ops on its lists. Matmul-like ops (linear, matmul, "
          "conv) run in bf16; ops where precision matters (cross_entropy, mse_loss, nll_loss) run in fp32 "
          "whatever their inputs; a few that combine tensors (the promote list: cat, stack, index_copy on the "
          "CPU; CUDA adds dot, addcmul and others) run in the widest of their inputs' dtypes; everything else "
          "-- embedding, add, and on the CPU sum and softmax -- follows its inputs. So an embedding of an fp32 "
          "table stays fp32, and becomes bf16 only at the next Linear. The lists are per device "
          "(aten/src/ATen/autocast_mode.cpp): on CUDA, sum and softmax run in fp32 (its fp32_set_opt_dtype list) "
          "and give fp32 from bf16 inputs.",
          _autocast_dtypes, _autocast_dtypes_fix),
    Entry("qkv-dtype-mismatch",
          "RuntimeError in attention at inference: q is bf16, the KV cache fp32",
          "Expected query, key, and value to have the same dtype",
          "model.to(torch.bfloat16); k_cache = torch.zeros(...) (fp32); "
          "F.scaled_dot_product_attention(q, k_cache, v_cache)",
          "allocate the cache in the model's dtype, or k.to(q.dtype)",
          "Outside autocast nothing casts for you: a matmul needs both operands in one dtype, and SDPA checks "
          "q, k and v up front. Code that trained under autocast (which casts all three) fails once the model "
          "is converted with .to(torch.bfloat16) for inference and a cache is allocated with torch.zeros' "
          "default dtype, fp32.",
          _qkv_mismatch, _qkv_fix),
    Entry("bf16-rope-positions",
          "a long-context model under bf16 autocast confuses nearby positions",
          "position 257 becomes 256",
          "with torch.autocast('cpu', dtype=torch.bfloat16): angles = inv_freq[:, None] @ positions[None, :]",
          "compute the angles in fp32 (torch.autocast(..., enabled=False) and .float(), as Llama's rotary "
          "embedding does), then cast cos and sin",
          "bf16 keeps 8 significant bits: integers are exact only up to 256, above it positions round to "
          "multiples of 2, 4, 8, 16 (257 -> 256). Autocast runs the angle matmul in bf16, so positions and "
          "their products with the frequencies are rounded: nearby tokens get the same rotation, and at "
          "position 4000 an angle is off by radians. cos and sin are in [-1, 1], where bf16's "
          "rounding error is at most 2**-9: cast those, not the angles.",
          lambda: _rope_text(True), lambda: _rope_text(False)),
    Entry("bf16-grad-accumulation",
          "in pure bf16, a gradient accumulated over many micro-batches drifts from the true sum, and the loss lags",
          "relative error of the accumulated gradient",
          "model.to(torch.bfloat16); for N micro-batches: loss.backward()  (autograd adds into a bf16 .grad)",
          "accumulate in fp32: fp32 parameters + autocast (or DeepSpeed's data_types.grad_accum_dtype 'fp32')",
          "Each backward() adds the micro-batch gradient into .grad in .grad's dtype. In bf16 each addition "
          "rounds to 8 significant bits (an error up to 2**-9 of the sum), the errors pile up as N grows, and "
          "once a term is under half a bf16 spacing of the sum (1/256 to 1/512 of it) it is rounded away whole. "
          "Over a thousand micro-batches (each loss divided by their number, so each term is about 1/1000 of the "
          "sum) the later terms are rounded away: the sum comes out short, every step is too small, and the loss "
          "falls more slowly than with the same gradients summed in fp32. An fp32 buffer rounds at 2**-24 and "
          "stays exact to about 1e-7.",
          lambda: _accumulation_text(True), lambda: _accumulation_text(False), portable=False,
          verdict=_accumulation_verdict),
)

__all__ = ["BUFFERS", "ENTRIES", "accumulation_run"]
