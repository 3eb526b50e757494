"""Two diagrams of mixed precision training: the master-weight loop, and what each rank holds when sharded.

`master_weight_loop` follows Micikevicius et al. 2018 ("Mixed Precision Training", ICLR), Fig. 1:
fp32 master weights are cast to 16 bits, forward and backward run in 16 bits on a scaled loss,
the gradients are unscaled in fp32 and update the fp32 master weights. bf16 keeps fp32's exponent
range, so its two scaling boxes -- loss x S and / S -- are drawn grey, "not needed". With
``framework`` each box names that framework's call, and the backward box says what the frameworks
have in common: the weights are fp32 parameters cast to 16 bits, so the cast's backward (JAX: its
transpose) returns their gradients in fp32, and the unscale only divides.

`sharding_plan` / `sharding_diagram`: per rank, which model states are whole and which are a
1/world shard, in which dtype, and what each collective moves -- the facts of
`labkit.train.torch.parallel` (DDP, FSDP2) and `labkit.train.torch.deepspeed_engine` (ZeRO 1/2), with
bytes from `labkit.memory.model_state_bytes` (its layouts ``autocast`` and ``mixed``).

matplotlib is imported inside the drawing functions.

>>> plan = sharding_plan(2, "zero2")
>>> [(s["state"], s["dtype"], s["share"]) for s in plan["states"]]
[('weights', 'bf16', 'full'), ('gradients', 'bf16', '1/2'), ('master weights', 'fp32', '1/2'), ('optimizer states', 'fp32', '1/2')]
>>> plan["bytes_per_param"]      # 2 + (2 + 4 + 8) / 2: labkit.train.torch.deepspeed_config.zero_memory's stage 2
9.0
"""

from __future__ import annotations

import re
import textwrap

from labkit._validate import choice, integer, shown

DTYPES = ("fp16", "bf16")
FRAMEWORKS = ("torch", "jax", "tf")
STRATEGIES = ("dp", "fsdp", "zero1", "zero2")
_COLORS = {"fp32": "#4C72B0", "bf16": "#DD8452", "fp16": "#55A868"}
_GREY = "#b0b0b0"

# Box i of the loop: (label, what it does); {dt} is the 16-bit dtype.
_STEPS = (
    ("FP32 master weights", "fp32: small updates are not rounded away"),
    ("cast to {dt}", "16-bit copy of the weights"),
    ("forward ({dt})", "16-bit activations, fp32 accumulation"),
    ("loss x S", "scale the loss: gradients scale with it"),
    ("backward ({dt})", "16-bit activation and weight gradients"),
    ("gradients to fp32, / S", "unscale; skip the step on inf/NaN"),
    ("fp32 update", "optimizer updates the master weights"),
)
_CALLS = {  # framework -> dtype -> one call per box (None: nothing to call)
    "torch": {
        "fp16": ("model params (fp32)", 'torch.autocast("cuda", dtype=torch.float16)', "model(x) under autocast",
                 "scaler.scale(loss)", ".backward()", "scaler.unscale_(opt)", "scaler.step(opt); scaler.update()"),
        "bf16": ("model params (fp32)", 'torch.autocast("cuda", dtype=torch.bfloat16)', "model(x) under autocast",
                 None, "loss.backward()", None, "opt.step()"),
    },
    "jax": {
        "fp16": ("params (param_dtype=float32)", "jmp Policy.cast_to_compute(params)",
                 "model.apply (Flax dtype=float16)", "loss_scale.scale(loss)", "jax.grad",
                 "loss_scale.unscale(grads); jmp.all_finite", "optax update + apply_updates"),
        "bf16": ("params (param_dtype=float32)", "jmp Policy.cast_to_compute(params)",
                 "model.apply (Flax dtype=bfloat16)", None, "jax.grad", None, "optax update + apply_updates"),
    },
    "tf": {
        "fp16": ("variables (float32)", 'set_global_policy("mixed_float16")', "layers compute in float16",
                 "LossScaleOptimizer.scale_loss(loss)", "tape.gradient(scaled_loss, vars)",
                 "LossScaleOptimizer.apply (unscales)", "LossScaleOptimizer.apply"),
        "bf16": ("variables (float32)", 'set_global_policy("mixed_bfloat16")', "layers compute in bfloat16",
                 None, "tape.gradient(loss, vars)", None, "optimizer.apply"),
    },
}
# The backward box with a framework: its weight gradients come out fp32 (the weights are fp32 parameters
# cast to 16 bits, and the cast's backward casts the gradient back) -- notebook 06 shows jax.grad's dtypes.
_BACKWARD = {
    "torch": "16-bit activation gradients; the weight gradients land in .grad in fp32 (the cast's backward)",
    "jax": "16-bit activation gradients; the weight gradients leave jax.grad in fp32 (the cast's transpose)",
    "tf": "16-bit activation gradients; tape.gradient returns the weight gradients in fp32 (the cast's gradient)",
}
_SCALE_BOXES = (3, 5)  # loss x S and / S: grey where nothing is scaled
_NOTE_WIDTH = 46  # characters per line of a box's note


def loop_steps(dtype: str = "fp16", scaled: bool | None = None, framework: str | None = None) -> list[dict]:
    """The boxes of `master_weight_loop`, as data: label, note, call (or None), active (False: grey).

    >>> [s["label"] for s in loop_steps("bf16") if not s["active"]]
    ['loss x S', '/ S']
    >>> loop_steps("fp16", framework="jax")[5]["label"]
    '/ S (already fp32)'
    """
    dtype = choice("dtype", dtype, DTYPES)
    if scaled is None:
        scaled = dtype == "fp16"
    elif not isinstance(scaled, bool):
        raise TypeError(f"scaled must be True, False or None (None: scale for fp16 only); got {shown(scaled)}")
    if framework is not None:
        framework = choice("framework", framework, FRAMEWORKS)
    calls = _CALLS[framework]["fp16" if scaled else "bf16"] if framework else (None,) * len(_STEPS)
    out = []
    for i, ((label, note), call) in enumerate(zip(_STEPS, calls)):
        active = scaled or i not in _SCALE_BOXES
        if framework and i == 4:
            note = _BACKWARD[framework]
        if framework and i == 5:
            label = "/ S (already fp32)"
        if not active:
            if i == 3:
                why = "bf16 has fp32's exponent range" if dtype == "bf16" else "small fp16 gradients flush to 0"
            else:  # the gradients still reach the fp32 update; only the division is left out
                label = "/ S"
                why = "the gradients go to fp32 unscaled" if dtype == "bf16" else "nothing was scaled"
            note = f"not needed: {why}" if dtype == "bf16" else f"off: {why}"
        if call:  # the calls name the dtype drawn
            call = re.sub("b?float16", {"fp16": "float16", "bf16": "bfloat16"}[dtype], call)
        out.append({"label": label.format(dt=dtype), "note": note.format(dt=dtype), "call": call, "active": active})
    return out


def master_weight_loop(dtype: str = "fp16", scaled: bool | None = None, framework: str | None = None):
    """The master-weight loop of mixed precision training (Micikevicius et al. 2018, Fig. 1), as a Figure.

    `dtype`: the 16-bit compute dtype, "fp16" or "bf16". `scaled`: draw loss scaling (None: for fp16
    only; False with fp16 draws the boxes grey, "off"). `framework`: None, "torch", "jax" or "tf" --
    each box then names that framework's call (torch: autocast, GradScaler.scale / unscale_ / step;
    jax: jmp's Policy.cast_to_compute and loss scale, optax; tf: the mixed policy, LossScaleOptimizer).
    """
    steps = loop_steps(dtype, scaled, framework)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(12, 5.2))
    ax.set_xlim(0, 4)
    ax.set_ylim(0, 2)
    ax.axis("off")
    spots = [(0.5, 1.5), (1.5, 1.5), (2.5, 1.5), (3.5, 1.5), (3.5, 0.5), (2.0, 0.5), (0.5, 0.5)]
    for (x, y), step in zip(spots, steps):
        color = (_COLORS["fp32"] if "fp32" in step["label"].lower() or step["label"].startswith("loss")
                 else _COLORS[dtype]) if step["active"] else _GREY
        ax.add_patch(FancyBboxPatch((x - 0.42, y - 0.2), 0.84, 0.4, boxstyle="round,pad=0.02",
                                    facecolor=color, alpha=0.25 if step["active"] else 0.15, edgecolor=color))
        note = textwrap.fill(step["note"], _NOTE_WIDTH)
        lift = 0.03 * note.count("\n")  # a note of several lines pushes the label up
        ax.text(x, y + 0.09 + lift, step["label"], ha="center", va="center", fontsize=10, fontweight="bold",
                color="black" if step["active"] else "#808080")
        ax.text(x, y - 0.05 + lift / 2, note, ha="center", va="center", fontsize=7.5, linespacing=1.1,
                color="#333333" if step["active"] else "#808080")
        if step["call"]:
            ax.text(x, y - 0.3, step["call"], ha="center", va="center", fontsize=7.5, family="monospace",
                    color="#6a1b9a")
    for (x0, y0), (x1, y1) in zip(spots, spots[1:] + spots[:1]):
        dx, dy = x1 - x0, y1 - y0
        side = (0.3 if x0 > 2 else -0.3) if dx == 0 else 0.0  # vertical arrows pass beside the call texts
        start = (x0 + side + 0.44 * (dx > 0) - 0.44 * (dx < 0), y0 - 0.22 * (dy < 0) + 0.22 * (dy > 0))
        end = (x1 + side - 0.44 * (dx > 0) + 0.44 * (dx < 0), y1 + 0.22 * (dy < 0) - 0.22 * (dy > 0))
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color="#444444"))
    _legend(ax, ["fp32", dtype], grey="not needed" if dtype == "bf16" else "off",
            show_grey=not all(s["active"] for s in steps))
    who = {"torch": "PyTorch", "jax": "JAX (jmp + optax)", "tf": "Keras"}.get(framework, "")
    scaled_text = "with loss scaling" if any(s["active"] for i, s in enumerate(steps) if i == 3) else "no loss scaling"
    ax.set_title(f"Mixed precision training in {dtype}, {scaled_text}{' -- ' + who if who else ''}\n"
                 "after Micikevicius et al. 2018, Mixed Precision Training, Fig. 1", fontsize=11)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def _legend(ax, dtypes, grey: str = "", show_grey: bool = False):
    """A colour key under the axes: one patch per dtype drawn (and grey, labelled `grey`, if `show_grey`)."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_COLORS[d], alpha=0.6, edgecolor=_COLORS[d], label=d)
               for d in _COLORS if d in set(dtypes)]
    if show_grey:
        handles.append(Patch(facecolor=_GREY, alpha=0.4, edgecolor=_GREY, label=grey))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles), frameon=False,
              fontsize=9, title="colour = dtype", title_fontsize=8.5, handlelength=1.6)


def sharding_plan(world: int = 2, strategy: str = "dp", dtype: str = "bf16", reduce_dtype: str | None = None) -> dict:
    """What each rank holds and what the collectives move, as data (see the module docstring).

    `dtype` is the 16-bit compute dtype; `reduce_dtype` the gradients' reduction dtype (None: the
    engine's default -- DDP reduces the gradients in their own dtype, fp32 under autocast; FSDP2 in
    ``param_dtype``; DeepSpeed in the training dtype, ``communication_data_type``'s default).
    Returns ``{"states": [{state, dtype, share, bytes_per_param}], "collectives": [{op, what,
    dtype}], "bytes_per_param": per-rank total}``.
    """
    from labkit.memory import model_state_bytes

    world = integer("world", world, minimum=1, maximum=1024)
    strategy = choice("strategy", strategy, STRATEGIES)
    dtype = choice("dtype", dtype, DTYPES)
    if reduce_dtype is not None:
        reduce_dtype = choice("reduce_dtype", reduce_dtype, ("fp32", *DTYPES))
    zero = strategy.startswith("zero")
    per = model_state_bytes(1, "mixed" if zero else "autocast", "adam")  # bytes per parameter, unsharded
    shard = {"dp": set(), "fsdp": {"weights", "master_weights", "gradients", "optimizer_states"},
             "zero1": {"master_weights", "optimizer_states"},
             "zero2": {"master_weights", "optimizer_states", "gradients"}}[strategy]
    names = {"weights": "weights", "gradients": "gradients", "master_weights": "master weights",
             "optimizer_states": "optimizer states"}
    states = []
    for key, name in names.items():
        if per[key] == 0:
            continue  # autocast's weights are the master weights
        state_dtype = dtype if zero and key in ("weights", "gradients") else "fp32"
        states.append({"state": name, "dtype": state_dtype, "share": f"1/{world}" if key in shard else "full",
                       "bytes_per_param": per[key] / world if key in shard else float(per[key])})
    if strategy == "dp":
        reduce = reduce_dtype or "fp32"
        collectives = [{"op": "all-reduce", "what": "gradients (bucketed, after backward)", "dtype": reduce}]
    elif strategy == "fsdp":
        reduce = reduce_dtype or dtype
        collectives = [{"op": "all-gather", "what": "parameters, per layer (forward, and again in backward)",
                        "dtype": dtype},
                       {"op": "reduce-scatter", "what": "gradients, each rank keeps its shard", "dtype": reduce}]
    else:
        reduce = reduce_dtype or dtype
        collectives = [{"op": "all-reduce", "what": "gradient buckets, each rank keeps its partition", "dtype": reduce},
                       {"op": "all-gather", "what": "updated 16-bit weights, after the step", "dtype": dtype}]
    return {"world": world, "strategy": strategy, "states": states, "collectives": collectives,
            "bytes_per_param": sum(s["bytes_per_param"] for s in states)}


_ENGINES = {"dp": "DDP (torch) / data parallel", "fsdp": "FSDP2 (torch: parameters gathered in param_dtype)",
            "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2"}


def sharding_diagram(world: int = 2, strategy: str = "dp", dtype: str = "bf16", reduce_dtype: str | None = None):
    """`sharding_plan` drawn: one panel per rank (at most 8 drawn), a bar per model state -- whole, or
    the rank's 1/world shard -- coloured by dtype, and the collectives with the dtype they move."""
    plan = sharding_plan(world, strategy, dtype, reduce_dtype)
    import matplotlib.pyplot as plt

    shown = min(plan["world"], 8)
    states = plan["states"]
    fig, ax = plt.subplots(figsize=(max(9.0, 2.6 * shown + 2.5), 1.4 + 0.55 * (len(states) + len(plan["collectives"]))))
    ax.set_xlim(-2.2, shown)
    ax.set_ylim(-0.6 * len(plan["collectives"]) - 0.6, len(states) + 0.6)
    ax.axis("off")
    for i, s in enumerate(states):
        y = len(states) - 1 - i
        ax.text(-2.1, y + 0.35, f"{s['state']}", ha="left", va="center", fontsize=9)
        ax.text(-2.1, y + 0.05, f"{s['dtype']}, {s['share']}, {s['bytes_per_param']:g} B/param", ha="left",
                va="center", fontsize=7.5, color="#555555")
        for r in range(shown):
            ax.add_patch(plt.Rectangle((r + 0.05, y), 0.9, 0.4, facecolor="none", edgecolor="#cccccc"))
            if s["share"] == "full":
                x0, width = r + 0.05, 0.9
            else:
                width = 0.9 / plan["world"]
                x0 = r + 0.05 + width * r
            ax.add_patch(plt.Rectangle((x0, y), width, 0.4, facecolor=_COLORS[s["dtype"]], alpha=0.8))
    for r in range(shown):
        ax.text(r + 0.5, len(states) + 0.15, f"rank {r}", ha="center", va="bottom", fontsize=10, fontweight="bold")
    for j, c in enumerate(plan["collectives"]):
        y = -0.6 * j - 0.55
        ax.annotate("", xy=(shown - 0.05, y), xytext=(0.05, y),
                    arrowprops=dict(arrowstyle="<->", color=_COLORS[c["dtype"]], lw=2))
        ax.text(shown / 2, y + 0.12, f"{c['op']} in {c['dtype']}: {c['what']}", ha="center", va="bottom", fontsize=9)
    _legend(ax, [s["dtype"] for s in states] + [c["dtype"] for c in plan["collectives"]])
    more = f" (ranks 0-{shown - 1} drawn)" if plan["world"] > shown else ""
    ax.set_title(f"{_ENGINES[plan['strategy']]}, {plan['world']} ranks{more}, {dtype} compute\n"
                 f"{plan['bytes_per_param']:g} bytes of model state per parameter per rank (Adam)", fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


__all__ = ["DTYPES", "FRAMEWORKS", "STRATEGIES", "loop_steps", "master_weight_loop", "sharding_diagram",
           "sharding_plan"]
