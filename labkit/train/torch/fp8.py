"""FP8 and MXFP8 training through torchao: which layers run in 8 bits, and the scales they used.

`RunConfig(precision=...)` takes four torchao recipes (``labkit[lowp]``, torchao >= 0.18):

=====================  =====================================================  ==========================
precision              torchao                                                scales
=====================  =====================================================  ==========================
``fp8-tensorwise``     ``convert_to_float8_training``, recipe "tensorwise"    one fp32 per tensor: e4m3
                                                                              input/weight, e5m2 grads
``fp8-rowwise``        recipe "rowwise"                                       one per row, a power of 2;
                                                                              e4m3 everywhere
``fp8-rowwise-gw-hp``  recipe "rowwise_with_gw_hp"                            as rowwise; the weight
                                                                              gradient gemm in fp32
``mxfp8``              ``MXFP8Linear`` (recipe "mxfp8_rceil")                 one E8M0 per 32 values
=====================  =====================================================  ==========================

Every scale is *dynamic*: worked out again from the tensor at each cast (``amax`` -> ``scale =
finfo(e4m3).max / amax``, in float64 and then cast to float32: ``amax_to_scale`` in
``torchao/float8/float8_utils.py``; rowwise rounds it down to a power of 2). The fp8 value is
``clamp(x * scale)`` cast to e4m3/e5m2; ``x ~ fp8 / scale``. MX goes the other way: a block of 32
keeps a power of two ``2**e`` (E8M0, stored as ``e + 127``) and ``x ~ 2**e * fp8``; torchao's
training recipe picks ``e = ceil(log2(amax / 448))`` ("RCEIL", ``_to_mx_rceil`` in
``torchao/prototype/mx_formats/mx_tensor.py``), so a block's largest value always fits, where the
OCP spec's floor rule can push it past 448 and clamp it.

A power-of-two scale only moves the exponent: a value's e4m3 rounding (3 mantissa bits) is the same
for any such scale, until it saturates or falls into the subnormals. So ``fp8-rowwise`` and ``mxfp8``
(both e4m3 with power-of-two scales that never saturate) round almost every operand alike, and
their losses agree nearly to the last bit on the digits MLP; they part only where a block's own
scale keeps small values that a whole row's scale sends into the subnormals. ``fp8-tensorwise``'s
scale is ``448 / amax`` exactly, not a power of two, and its gradients are e5m2.

**Which layers.** Only ``nn.Linear`` layers whose in and out features are multiples of 16 (fp8;
what ``torch._scaled_mm`` asks of a GPU's fp8 tensor cores, and the test in torchao's own
``_auto_filter_for_tensorwise``) or 32 (MX: the block runs along every gemm's inner dimension).
The digits MLP (64 -> width -> width -> 10) converts ``dense1`` and ``dense2``; its head, 10
wide, stays in fp32. For MX it must: ``to_mx`` asserts that the blocked dimension is a multiple of
32, and the head's gradient (batch, 10) is blocked along its 10. For fp8 the CPU's emulation would
take it, but a GPU's ``torch._scaled_mm`` refuses a 10 (its operands need multiples of 16), and
torchao's ``_auto_filter_for_tensorwise`` skips such a layer for that reason. The transformer converts every
projection of its blocks; embeddings, LayerNorms, attention's own matmuls and the head stay fp32.
A width that is not a multiple refuses the run (`check_sizes`), and so, for MX, does a batch whose
rows (examples, or examples x 64 tokens) are not a multiple of 32: the weight gradient's gemm runs
its blocks along the batch.

**MX through MXFP8Linear, not quantize_.** torchao 0.18's ``quantize_(model,
MXFP8TrainingOpConfig(...))`` wraps the weights in ``MXFP8TrainingWeightWrapperTensor``, whose
``F.linear`` override drops the bias (``torchao/prototype/moe_training/tensor.py``: it returns
``_to_mxfp8_then_scaled_mm(A, B)`` and never adds ``args[2]``; the bias then gets no gradient).
``MXFP8Linear`` (``torchao/prototype/moe_training/mxfp8_linear.py``) adds it, so labkit swaps each
layer for one, with torchao's own ``swap_linear_layers``.

**Weights and autocast.** The weights stay fp32 (they are the master weights, and Adam updates
them in fp32); each fp8 layer casts its input, weight and output gradient as it runs, and returns
fp32. No autocast is added: torchao's recipe elsewhere is bf16 activations (FSDP2's ``param_dtype``
or autocast) around fp8 linears, but ``Float8Linear.forward`` reads only the *GPU* autocast dtype
(``torch.get_autocast_gpu_dtype()`` in ``torchao/float8/float8_linear.py``), and keeping the rest in
fp32 shows what the 8-bit matmuls do, alone, next to the ``fp32`` and ``bf16`` runs.

**On a CPU it is emulated.** ``Float8LinearConfig(emulate=True)``: the fp8 operands are decoded
and multiplied in fp32 (``float8_mm`` in ``torchao/float8/float8_ops.py``): the same values as an
fp8 gemm with fp32 accumulation, at none of its speed (torch's CPU ``_scaled_mm`` exists but is
about 25x slower still). MX: ``KernelPreference.EMULATED``, the same idea. On a CUDA GPU with fp8
tensor cores (compute capability >= 8.9; MX: >= 10.0) the real kernels run; there the rowwise
recipes' fp32 output also passes through bf16 (``addmm_float8_unwrapped``: ``torch._scaled_mm`` has
no fp32 output for rowwise scales), which the emulation does not do. (labkit has run these recipes
on CPUs only; the GPU path is torchao's, unchanged.)

**What the run records.** `ScaleRecorder` reads, at every step, the scale each cast really used:
it wraps torchao's ``hp_tensor_to_float8_dynamic`` (``torchao/float8/float8_scaling_utils.py``,
whose result carries ``_scale``) or MX's ``to_mx`` (which returns the E8M0 exponents) for the
forward and backward pass of the step only, and names the layer with module and autograd hooks.
``RunResult.extra["fp8"]`` keeps per layer and operand, per step, the tensor's amax (torchao's
``tensor_to_amax`` on the same tensor) and its scale (rowwise: min/median/max of the row scales;
MX: min/median/max block exponent; medians are torch's, the lower middle value); `plot_fp8_scales`
draws them, `fp8_scale_table` sums them up. A block or column that is all zero (a ReLU unit dead
for the whole batch) shows as exponent -127 / scale 448 / 1e-12: torchao's floor for an amax of 0.
Reading costs one abs-max per cast, so the step times include it. MX's exponents are read where
torchao's emulated ``to_mx`` runs (the CPU); its Blackwell kernels cast without it.

>>> from labkit.train import RunConfig, run
>>> r = run(RunConfig("torch", "fp8-tensorwise", width=32, batch_size=32, steps=2, progress=False))
>>> r.extra["fp8"]["converted"], r.extra["fp8"]["kept"]
(['dense1', 'dense2'], ['out'])
>>> list(r.extra["fp8"]["layers"]["dense2"]) == list(CASTS)
True
>>> s = r.extra["fp8"]["layers"]["dense2"]["input"]
>>> s["dtype"], s["granularity"], len(s["scale"]), bool(s["scale"][0] == np.float32(448 / s["amax"][0]))
('float8_e4m3fn', 'tensorwise', 2, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch

from labkit._validate import choice, integer, shown
from labkit.train.config import TORCH_PRECISIONS, RunConfig
from labkit.train.torch.quiet import quiet_import

RECIPES = {"fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
           "mxfp8": "mxfp8_rceil"}
"""labkit's precision -> torchao's recipe name (``Float8LinearRecipeName``, ``MXFP8TrainingRecipe``)."""
MIN_TORCHAO = (0, 18)
INSTALL_HINT = "pip install 'labkit[lowp]'"
CASTS = ("input", "weight", "grad_output", "weight_for_grad_input", "grad_output_for_grad_weight",
         "input_for_grad_weight")
"""The six casts of one linear layer, in the order torchao makes them (forward: input, weight; backward:
grad_output and the weight for grad_input, then grad_output and the input for grad_weight); the names are
torchao's ``Float8LinearConfig.cast_config_*``."""
_NODES = {"float8": "matmul_with_hp_or_float8_argsBackward", "mx": "mx_mmBackward"}  # the layers' autograd nodes


def multiple(precision: str) -> int:
    """What a converted layer's dimensions must be a multiple of: 16 for fp8, 32 for MX.

    >>> multiple("fp8-rowwise"), multiple("mxfp8")
    (16, 32)
    """
    return 32 if choice("precision", precision, TORCH_PRECISIONS) == "mxfp8" else 16


def import_torchao(module: str = "torchao"):
    """Import `module` (torchao or one of its modules) quietly: torchao logs the kernels for other
    GPUs that did not load, and torch an Enum deprecation, at import; an ImportError naming
    ``pip install 'labkit[lowp]'`` if torchao is missing or older than 0.18.

    >>> import_torchao("torchao.float8").__name__
    'torchao.float8'
    """
    if not isinstance(module, str) or not (module == "torchao" or module.startswith("torchao.")):
        raise ValueError(f"module must be torchao or one of its modules; got {shown(module)}")
    try:
        with quiet_import():
            top = importlib.import_module("torchao")
            found = tuple(int(p) for p in top.__version__.split("+")[0].split(".")[:2])
            if found < MIN_TORCHAO:
                raise ImportError(f"labkit's fp8 recipes need torchao >= 0.18; this is {top.__version__}: {INSTALL_HINT}")
            return importlib.import_module(module)
    except ImportError as exc:
        if INSTALL_HINT in str(exc):
            raise
        raise ImportError(f"the fp8 and MX precisions train through torchao ({exc}): {INSTALL_HINT}") from exc


def _rows(config: RunConfig) -> int:
    return config.batch_size * (64 if config.model == "transformer" else 1)


def check_sizes(config: RunConfig, device: torch.device | str = "cpu") -> None:
    """Refuse (ValueError) a `config` whose layers torchao cannot run in fp8/MX; nothing else is checked.

    The hidden layers' width must be a multiple of `multiple` (16 or 32), or no hidden layer would
    convert. MX also needs the rows of each batch (examples; the transformer's examples x 64 tokens)
    in multiples of 32 (``to_mx`` blocks the weight gradient's gemm along them), and fp8 on a GPU in
    multiples of 16 (``torch._scaled_mm``'s inner dimension there).

    >>> check_sizes(RunConfig("torch", "mxfp8", width=48))
    Traceback (most recent call last):
    ...
    ValueError: mxfp8 runs the layers whose dimensions are multiples of 32 (torchao's MX blocks); width 48 is not: choose a width that is (the default, 256, is)
    """
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a RunConfig; got {type(config).__name__} {shown(config)}")
    if config.precision not in TORCH_PRECISIONS:
        return
    from labkit.memory.shapes import DEFAULT_WIDTH

    m = multiple(config.precision)
    width = DEFAULT_WIDTH[config.model] if config.width is None else config.width
    what = "torchao's MX blocks" if m == 32 else "fp8 tensor cores' tiles, as torchao's filter asks"
    if width % m:
        raise ValueError(f"{config.precision} runs the layers whose dimensions are multiples of {m} ({what}); "
                         f"width {width} is not: choose a width that is (the default, {DEFAULT_WIDTH[config.model]}, is)")
    need = 32 if m == 32 else 16 if torch.device(device).type == "cuda" else 1
    rows = _rows(config)
    if rows % need:
        unit = "examples x 64 tokens" if config.model == "transformer" else "examples"
        raise ValueError(f"{config.precision} here needs each batch's rows ({unit}: {rows}) in multiples of {need} "
                         f"(the weight gradient's gemm runs along them); choose batch_size={-(-rows // need) * need}")


@dataclass(frozen=True)
class Conversion:
    """What `convert` did to a model: the torchao recipe, the layers converted and those kept in fp32."""

    precision: str
    recipe: str
    emulated: bool
    converted: tuple[str, ...]
    kept: tuple[str, ...]


def convert(model: torch.nn.Module, precision: str, device: torch.device | str = "cpu") -> Conversion:
    """Swap `model`'s eligible ``nn.Linear`` layers (in place) for torchao's fp8 / MX training layers.

    fp8: ``convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
    module_filter_fn=...)`` (``torchao/float8/float8_linear_utils.py``), with ``emulate=True`` on a
    CPU. MX: ``MXFP8Linear`` (RCEIL scales, ``KernelPreference.EMULATED`` on a CPU). The filter keeps
    layers whose features are multiples of `multiple`; the weights (and their Parameters) are the
    model's own, so an optimizer built afterwards updates them as before.

    >>> from labkit.train import models
    >>> from labkit.train.torch.models import build
    >>> net = build("mlp", models.init_params("mlp", seed=0, width=32))
    >>> c = convert(net, "mxfp8")
    >>> c.converted, c.kept, type(net.dense1).__name__, c.emulated
    (('dense1', 'dense2'), ('out',), 'MXFP8Linear', True)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__} {shown(model)}")
    precision = choice("precision", precision, TORCH_PRECISIONS)
    device = torch.device(device)
    m = multiple(precision)
    linears = [name for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]

    def eligible(mod, fqn):
        return mod.in_features % m == 0 and mod.out_features % m == 0

    emulated = device.type != "cuda"
    if precision == "mxfp8":
        utils = import_torchao("torchao.float8.float8_linear_utils")
        MXFP8Linear = import_torchao("torchao.prototype.moe_training.mxfp8_linear").MXFP8Linear
        kernels = import_torchao("torchao.quantization.quantize_.common.kernel_preference").KernelPreference
        mode = import_torchao("torchao.prototype.mx_formats.config").ScaleCalculationMode.RCEIL

        def swap(lin):
            with torch.device("meta"):
                new = MXFP8Linear(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                  kernel_preference=kernels.EMULATED if emulated else kernels.AUTO,
                                  scale_calculation_mode=mode)
            new.weight, new.bias = lin.weight, lin.bias
            return new

        utils.swap_linear_layers(model, swap, module_filter_fn=eligible)
    else:
        f8 = import_torchao("torchao.float8")
        config = dataclasses.replace(f8.Float8LinearConfig.from_recipe_name(RECIPES[precision]), emulate=emulated)
        f8.convert_to_float8_training(model, config=config, module_filter_fn=eligible)
    kinds = _layer_classes()
    converted = tuple(n for n, mod in model.named_modules() if isinstance(mod, kinds))
    return Conversion(precision, RECIPES[precision], emulated, converted,
                      tuple(n for n in linears if n not in converted))


def _layer_classes() -> tuple[type, ...]:
    return (import_torchao("torchao.float8.float8_linear").Float8Linear,
            import_torchao("torchao.prototype.moe_training.mxfp8_linear").MXFP8Linear)


class ScaleRecorder:
    """Reads the scales torchao's layers use in each training step (see the module docstring).

    `recording` is a context for one step's forward and backward pass: inside it, torchao's cast
    function is wrapped (and put back on the way out, even on an error), each converted layer has a
    forward pre-hook and hook, and each layer's backward node a pre-hook and hook that say which
    layer is casting. Outside it nothing is changed: evaluation and replays cast unobserved.
    `last[layer][cast]` holds the last step's scale tensors as torchao made them.
    """

    def __init__(self, model: torch.nn.Module, conversion: Conversion):
        if not isinstance(conversion, Conversion):
            raise TypeError(f"conversion must be convert()'s Conversion; got {type(conversion).__name__}")
        self.conversion = conversion
        self.kind = "mx" if conversion.precision == "mxfp8" else "float8"
        self.modules = {n: mod for n, mod in model.named_modules() if n in conversion.converted}
        self.steps = 0
        self.layers: dict[str, dict[str, dict]] = {}
        self.last: dict[str, dict[str, torch.Tensor]] = {}
        self._current: str | None = None
        self._seen: dict[str, int] = {}
        self._step: dict[tuple[str, str], tuple[dict, dict]] = {}
        # the function each cast goes through, looked up in the module that calls it
        if self.kind == "mx":
            self._owner, self._attr = import_torchao("torchao.prototype.mx_formats.mx_tensor"), "to_mx"
        else:
            self._owner, self._attr = import_torchao("torchao.float8.float8_linear"), "hp_tensor_to_float8_dynamic"
            self._amax = import_torchao("torchao.float8.float8_utils").tensor_to_amax

    # -- what one cast leaves behind ---------------------------------------------------
    def _note(self, cast: str, info: dict, values: dict, scale: torch.Tensor) -> None:
        layer = self._current
        if layer is None:
            return
        self._step[(layer, cast)] = (info, values)
        self.last.setdefault(layer, {})[cast] = scale

    def _float8_cast(self, original):
        sig = inspect.signature(original)

        def cast(*args, **kwargs):
            out = original(*args, **kwargs)
            if self._current is None:
                return out
            a = sig.bind(*args, **kwargs)
            a.apply_defaults()
            role = out._gemm_input_role.value  # "input" | "weight" | "grad_output"
            seen = self._seen.setdefault(f"{self._current}/{role}", 0)
            self._seen[f"{self._current}/{role}"] += 1
            name = {"input": ("input", "input_for_grad_weight"), "weight": ("weight", "weight_for_grad_input"),
                    "grad_output": ("grad_output", "grad_output_for_grad_weight")}[role][min(seen, 1)]
            amax = self._amax(a.arguments["hp_tensor"], scaling_granularity=a.arguments["scaling_granularity"],
                                        axiswise_dim=a.arguments["axiswise_dim"])  # torchao's own, on the same tensor
            scale = out._scale
            dim = out._axiswise_dim
            info = {"dtype": str(out._data.dtype).replace("torch.", ""),
                    "granularity": "tensorwise" if dim is None else f"axiswise (dim {dim})"}
            if dim is None:
                values = {"amax": amax.reshape(()), "scale": scale.reshape(())}
            else:
                values = {"amax": amax.max(), "scale_min": scale.min(), "scale_median": scale.median(),
                          "scale_max": scale.max()}
            self._note(name, info, values, scale)
            return out

        return cast

    def _mx_cast(self, original):
        def cast(data_hp, elem_dtype, block_size, *args, **kwargs):
            scale_biased, data_lp = original(data_hp, elem_dtype, block_size, *args, **kwargs)
            if self._current is not None:
                seen = self._seen.get(self._current, 0)
                self._seen[self._current] = seen + 1
                if seen < len(CASTS):
                    # torch.float8_e8m0fnu, the stored byte is e + 127 (255: NaN)
                    e = scale_biased.view(torch.uint8).to(torch.int16) - 127
                    info = {"dtype": str(elem_dtype).replace("torch.", ""), "granularity": f"block {block_size}"}
                    values = {"amax": data_hp.abs().max(), "exponent_min": e.min(), "exponent_median": e.median(),
                              "exponent_max": e.max()}
                    self._note(CASTS[seen], info, values, scale_biased)
            return scale_biased, data_lp

        return cast

    # -- one step ------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self):
        """Record the casts of the forward and backward pass run inside the block (one step)."""
        owner, attr, wrap = self._owner, self._attr, self._mx_cast if self.kind == "mx" else self._float8_cast
        original = getattr(owner, attr)
        node_name = _NODES[self.kind]
        handles = []

        def enter(name):
            def hook(*_):
                self._current = name
            return hook

        def leave(*_):
            self._current = None

        def watch_backward(name):
            def hook(module, args, output):
                self._current = None
                node = _find_node(output.grad_fn, node_name) if torch.is_tensor(output) else None
                if node is not None:  # fires right before / after this layer's own backward
                    node.register_prehook(enter(name))
                    node.register_hook(leave)
            return hook

        for name, mod in self.modules.items():
            handles.append(mod.register_forward_pre_hook(enter(name)))
            handles.append(mod.register_forward_hook(watch_backward(name)))
        self._seen, self._step, self._current = {}, {}, None
        setattr(owner, attr, wrap(original))
        try:
            yield self
        finally:
            setattr(owner, attr, original)
            for h in handles:
                h.remove()
            self._current = None
            self._end_step()

    def _end_step(self) -> None:
        for (layer, cast), (info, values) in sorted(self._step.items()):
            entry = self.layers.setdefault(layer, {}).setdefault(
                cast, {**info, **{k: [math.nan] * self.steps for k in values}})
            for k, v in values.items():
                entry[k].append(float(v))
        self.steps += 1
        for casts in self.layers.values():  # a cast this step did not make: NaN, so steps line up
            for entry in casts.values():
                for v in entry.values():
                    if isinstance(v, list) and len(v) < self.steps:
                        v.append(math.nan)
        self._step = {}

    def to_dict(self) -> dict:
        """What the run keeps in ``RunResult.extra["fp8"]`` (JSON: lists of floats per step)."""
        c = self.conversion
        return {"precision": c.precision, "recipe": c.recipe, "emulated": c.emulated, "converted": list(c.converted),
                "kept": list(c.kept), "steps": self.steps,
                "layers": {layer: {cast: dict(entry) for cast, entry in sorted(casts.items(), key=_cast_order)}
                           for layer, casts in self.layers.items()}}


def _cast_order(item) -> int:
    return CASTS.index(item[0])


def _find_node(fn, name: str, depth: int = 3):
    """The autograd node called `name` at most `depth` steps up from `fn` (past the bias's add)."""
    if fn is None or depth < 0:
        return None
    if fn.name() == name:
        return fn
    for parent, _ in fn.next_functions:
        found = _find_node(parent, name, depth - 1)
        if found is not None:
            return found
    return None


# -- reading a run's record ------------------------------------------------------------------
def _record(result) -> dict:
    from labkit.train.result import RunResult

    if not isinstance(result, RunResult):
        raise TypeError(f"result must be a RunResult; got {type(result).__name__} {shown(result)}")
    rec = result.extra.get("fp8") if isinstance(result.extra, dict) else None
    if not isinstance(rec, dict) or not rec.get("layers"):
        raise ValueError(f"result has no fp8 scales: it is a {result.config.precision!r} run; the scales are "
                         f"recorded for precision one of {', '.join(map(repr, TORCH_PRECISIONS))}")
    return rec


def _series(entry: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(middle, low, high, what) of one cast's record: log2 of the fp8 scale, or the MX exponent."""
    if "exponent_median" in entry:
        keys, what = ("exponent_median", "exponent_min", "exponent_max"), "shared exponent e (x ~ 2**e * fp8)"
        return (*(np.asarray(entry[k], float) for k in keys), what)
    keys = ("scale", "scale", "scale") if "scale" in entry else ("scale_median", "scale_min", "scale_max")
    return (*(np.log2(np.asarray(entry[k], float)) for k in keys), "log2(scale) (fp8 = x * scale)")


def fp8_scale_table(result):
    """One row per converted layer and cast of an fp8/MX run: format, scaling, and the amax and
    scale of its first and last step (rowwise: the median row scale [min..max]; MX: the median
    block exponent [min..max]).

    >>> from labkit.train import RunConfig, run
    >>> r = run(RunConfig("torch", "mxfp8", width=32, batch_size=32, steps=2, progress=False))
    >>> t = fp8_scale_table(r)
    >>> t.columns[:4], t.rows[0][:4]
    (('layer', 'cast', 'format', 'scaling'), ('dense1', 'input', 'float8_e4m3fn', 'block 32'))
    """
    from labkit.table import Table

    rec = _record(result)
    rows = []
    for layer, casts in rec["layers"].items():
        for cast, e in casts.items():
            def at(i):
                if "scale" in e:
                    return f"{e['scale'][i]:.4g}"
                lo, mid, hi = (("exponent_min", "exponent_median", "exponent_max") if "exponent_median" in e
                               else ("scale_min", "scale_median", "scale_max"))
                return f"{e[mid][i]:.4g} [{e[lo][i]:.4g}..{e[hi][i]:.4g}]"
            rows.append((layer, cast, e["dtype"], e["granularity"], f"{e['amax'][0]:.4g}", f"{e['amax'][-1]:.4g}",
                         at(0), at(-1)))
    what = "exponent" if rec["precision"] == "mxfp8" else "scale"
    cols = ("layer", "cast", "format", "scaling", "amax first", "amax last", f"{what} first", f"{what} last")
    emulated = ", emulated on CPU" if rec.get("emulated") else ""
    return Table(cols, tuple(rows), f"{rec['precision']} (torchao {rec['recipe']}{emulated}): {rec['steps']} steps")


def plot_fp8_scales(result, casts=("input", "weight", "grad_output"), dpi: int = 80):
    """The scales one fp8/MX run used, per layer over its steps: a panel per cast in `casts` (any of
    `CASTS`), a line per layer (rowwise and MX: the median, with the min..max band). fp8 draws
    log2(scale): a scale that halves means an amax that doubled. Returns the Figure."""
    import matplotlib.pyplot as plt

    rec = _record(result)
    if isinstance(casts, str) or not hasattr(casts, "__iter__"):
        raise TypeError(f"casts must be a list of cast names; got {type(casts).__name__} {shown(casts)}")
    casts = [choice("cast", c, CASTS) for c in casts]
    if not casts:
        raise ValueError(f"casts must name at least one of {', '.join(CASTS)}")
    dpi = integer("dpi", dpi, minimum=10, maximum=1000)
    fig, axes = plt.subplots(1, len(casts), figsize=(3.3 * len(casts), 3.0), dpi=dpi, squeeze=False)
    for ax, cast in zip(axes[0], casts):
        what = ""
        for i, (layer, entries) in enumerate(rec["layers"].items()):
            if cast not in entries:
                continue
            mid, lo, hi, what = _series(entries[cast])
            steps = np.arange(len(mid))
            ax.plot(steps, mid, color=f"C{i}", lw=1.8, label=f"{layer} ({entries[cast]['dtype'].replace('float8_', '')})")
            if not np.array_equal(lo, hi, equal_nan=True):
                ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
        ax.set(title=cast, xlabel="step", ylabel=what)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(frameon=False, fontsize=7)
        else:
            ax.text(0.5, 0.5, "not cast in 8 bits\nby this recipe", ha="center", va="center", transform=ax.transAxes)
    emulated = ", emulated on CPU" if rec.get("emulated") else ""
    fig.suptitle(f"{rec['precision']} (torchao {rec['recipe']}{emulated}): the scales each cast used", fontsize=10)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


__all__ = ["CASTS", "Conversion", "RECIPES", "ScaleRecorder", "check_sizes", "convert", "fp8_scale_table",
           "import_torchao", "multiple", "plot_fp8_scales"]
