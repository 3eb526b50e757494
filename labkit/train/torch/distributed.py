"""PyTorch across processes: DDP, FSDP2 and DeepSpeed ZeRO 1/2 under ``torchrun``, with mixed precision.

``run(config)`` (reached through ``labkit.train.run`` when ``config.devices > 1``) starts

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=N \\
        --master-addr=127.0.0.1 --master-port=<free port> -m labkit.train.torch.worker spec.json

one process per device (gloo on CPUs, nccl on GPUs), waits for them and reads back the
JSON-lines log rank 0 wrote, as a `RunResult` with the usual schema plus, in ``extra``:

* ``comm_bytes_per_step`` and ``collectives`` -- every collective one step launched, with the
  dtype and element count the profiler saw (see `labkit.train.torch.collectives`);
* ``reduce_dtype`` -- the dtype the gradients were really reduced in (the largest reduction);
* ``sharding`` -- each parameter's full shape, per-rank local shape and stored dtype;
* ``compute_dtypes`` -- the dtype each Linear's output had in the first forward pass;
* ``skipped_by_rank`` / ``local_grads_finite_by_rank`` -- fp16: each rank's skip decision and
  whether its own gradients were finite, step by step.

The default reduction dtype is PyTorch's: DDP reduces the gradients in their own dtype (fp32
under autocast, whose weights are fp32); FSDP2 reduces in ``param_dtype`` (bf16 for "bf16")
unless ``MixedPrecisionPolicy.reduce_dtype`` says otherwise.

>>> from labkit.train import RunConfig, run
>>> res = run(RunConfig("torch", "bf16", steps=3, width=32, devices=2, parallel="fsdp",
...                     reduce_dtype="fp32", progress=False))      # doctest: +SKIP
>>> res.extra["reduce_dtype"], res.extra["sharding"][0]["local_shape"]   # doctest: +SKIP
('fp32', [[16, 64], [16, 64]])
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit._validate import names, number, shown
from labkit.train.launch import check_engine
from labkit.train.launch import wait
from labkit.train.config import RunConfig
from labkit.train.loop import RunFailed
from labkit.table import Table
from labkit.train.result import RunResult

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def check(config: RunConfig) -> str:
    """Raise ValueError for a config DDP/FSDP2 cannot run here; return the backend ("gloo" | "nccl")."""
    check_engine(config, "torch", "PyTorch")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = config.device
    if device == "auto":
        device = "cuda" if gpus >= config.devices else "cpu"
    if device == "tpu":
        raise ValueError("the torch engine runs DDP/FSDP2 on CPUs (gloo) or CUDA GPUs (nccl), not on a TPU; "
                         "use device='cpu', 'cuda' or 'auto'")
    if device in ("cuda", "gpu"):
        if gpus < config.devices:
            raise ValueError(f"devices={config.devices} on CUDA needs {config.devices} GPUs, this machine has "
                             f"{gpus}; use device='cpu' (gloo) or fewer devices")
        from labkit.train.torch.stepper import check_precision

        check_precision(config.precision, torch.device("cuda", 0))
    if config.parallel.startswith("zero"):
        _check_deepspeed(config, device)
    if config.precision == "bf16-pure" and config.reduce_dtype not in (None, "bf16"):
        raise ValueError("bf16-pure keeps the gradients in bf16, so they are reduced in bf16; "
                         f"reduce_dtype={config.reduce_dtype!r} is not offered here (use None or 'bf16')")
    return "nccl" if device in ("cuda", "gpu") else "gloo"


def _check_deepspeed(config: RunConfig, device: str) -> None:
    """ValueError, before any process starts, for a ZeRO run DeepSpeed would refuse here."""
    from labkit.train.torch.deepspeed_config import deepspeed_installed

    if not deepspeed_installed():
        raise ValueError(f"parallel={config.parallel!r} runs DeepSpeed, which is not installed: "
                         "pip install 'labkit[deepspeed]' (or use parallel='dp' / 'fsdp')")
    if device == "cpu" and config.precision == "fp16" and not _cpu_has_fp16():
        raise ValueError("DeepSpeed refuses fp16 on this CPU ('Type fp16 is not supported on your device': its CPU "
                         "accelerator needs oneDNN fp16 support, on x86 AVX512-FP16 or AVX-NE-CONVERT). Run bf16 or "
                         "fp32 here, fp16 on a GPU; deepspeed_config.simulate_loss_scale replays the fp16 scaler")


def _cpu_has_fp16() -> bool:
    """DeepSpeed's own test (``accelerator/cpu_accelerator.py``, ``is_fp16_supported``)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # an op this torch build lacks: DeepSpeed says "not supported" then too
        return False


def run(config: RunConfig, timeout_s: float | None = None) -> RunResult:
    """Train `config` on `config.devices` processes (DDP or FSDP2) and return rank 0's result.

    Raises `labkit.train.RunFailed` (with the workers' stderr tail, and ``.result`` holding the
    steps rank 0 recorded) if the workers fail.
    """
    if timeout_s is not None:
        number("timeout_s", timeout_s, minimum=0, maximum=1e7, inclusive=False)
    backend = check(config)
    with tempfile.TemporaryDirectory(prefix="labkit_torch_dist_") as tmp:
        out = config.out or os.path.join(tmp, "run.jsonl")
        spec = {"config": config.to_dict(), "out": out, "backend": backend}
        return _launch(spec, config, tmp, timeout_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(spec: dict, config: RunConfig, tmp: str, timeout_s: float | None) -> RunResult:
    path = Path(tmp) / "spec.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={config.devices}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", worker_module(config), str(path)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, set here so it does not warn
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    out = spec.get("out")
    try:
        stdout, stderr = wait(proc, config, out, timeout_s)  # with a progress bar if config.progress
    except BaseException as exc:  # KeyboardInterrupt, timeout: stop torchrun and its workers
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun passes it on to every worker
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if isinstance(exc, KeyboardInterrupt) and _recorded(out):
            return RunResult.load(out)  # status "interrupted", with every step rank 0 finished
        raise
    recorded = _recorded(out)
    if proc.returncode != 0:
        result = RunResult.load(out) if recorded else RunResult(config=config, status="failed")
        tail = "\n".join(_workers_stderr(stderr or stdout)[-40:])
        result.status, result.error = "failed", result.error or f"torchrun exited with {proc.returncode}"
        raise RunFailed(f"the torch workers failed (torchrun exit code {proc.returncode}) after "
                        f"{result.steps_done} steps; their stderr ends with:\n{tail}", result)
    return RunResult.load(out)


def worker_module(config: RunConfig) -> str:
    """The module torchrun starts on each rank (it picks DDP, FSDP2 or DeepSpeed's engine from the config)."""
    return "labkit.train.torch.worker"


def _recorded(out) -> bool:
    return out is not None and Path(out).exists() and Path(out).stat().st_size > 0


def _workers_stderr(text: str) -> list[str]:
    """stderr without torchrun's own traceback (which only says that a child failed)."""
    lines, out, skipping = text.strip().splitlines(), [], False
    for line in lines:
        if line.startswith("Traceback") and not skipping:
            nxt = lines[lines.index(line) + 1] if lines.index(line) + 1 < len(lines) else ""
            skipping = "<frozen runpy>" in nxt
        if not skipping:
            out.append(line)
        elif "ChildFailedError" in line:
            skipping = False
    return out


# -- helpers a notebook can print ---------------------------------------------------------
def reduction_bytes(model: str = "mlp", reduce_dtype: str = "fp32", width: int | None = None,
                    parallel: str = "dp") -> int:
    """Bytes one step's gradient reduction moves, from the real parameter sizes.

    Counted as nccl-tests counts a collective's size (the full buffer): every gradient once,
    in `reduce_dtype` -- DDP's all-reduce and FSDP2's reduce-scatter move the same buffer. A
    ring all-reduce puts 2(N-1)/N times that on each link; a reduce-scatter (N-1)/N. FSDP2
    also all-gathers the parameters in param_dtype (forward, and again in backward), which
    `run` counts in ``extra["collectives"]``; this is the gradient part only.

    >>> reduction_bytes("mlp", "fp32", width=32), reduction_bytes("mlp", "bf16", width=32)
    (13864, 6932)
    """
    from labkit.train.models import init_params

    _one_of("reduce_dtype", reduce_dtype, tuple(ITEMSIZE))
    _one_of("parallel", parallel, ("dp", "fsdp"))
    n = sum(int(p.size) for p in init_params(model, seed=0, width=width).values())
    return n * ITEMSIZE[reduce_dtype]


def _run_result(result) -> RunResult:
    if not isinstance(result, RunResult):
        raise TypeError(f"result must be a RunResult (run's result); got {type(result).__name__} {shown(result)}")
    return result


def _one_of(name: str, value, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise (ValueError if isinstance(value, str) else TypeError)(
            f"unknown {name} {shown(value)}; choose one of {', '.join(allowed)}")


def collectives_table(result: RunResult) -> Table:
    """One row per collective of the profiled step: op, dtype, elements, bytes; then the total."""
    _run_result(result)
    rows = [(c["op"], c["dtype"], str(c["elements"]), str(c["bytes"])) for c in result.extra.get("collectives", [])]
    rows.append(("total per step", "", "", str(result.extra.get("comm_bytes_per_step", 0))))
    return Table(("collective", "dtype", "elements", "bytes"), tuple(rows))


def sharding_table(result: RunResult) -> Table:
    """Each parameter: full shape, the shape each rank holds, the stored dtype, the compute dtype."""
    _run_result(result)
    compute = result.extra.get("compute_dtypes", {})
    rows = []
    for p in result.extra.get("sharding", []):
        module = p["name"].rsplit(".", 1)[0]
        module = next((m for m in compute if m.endswith(module)), None)
        shape = "x".join(map(str, p["shape"]))
        local = ", ".join("x".join(map(str, s)) for s in p["local_shape"])
        rows.append((p["name"], shape, local, p["dtype"], compute.get(module, "-")))
    return Table(("parameter", "full", "per rank", "stored", "compute"), tuple(rows))


def skip_table(result: RunResult) -> Table:
    """fp16: per step, each rank's own-gradient finiteness and skip decision, and the scale used."""
    _run_result(result)
    skipped = result.extra.get("skipped_by_rank", [])
    finite = result.extra.get("local_grads_finite_by_rank", [])
    rows = []
    for i in range(result.steps_done):
        scale = f"{result.scales[i]:.0f}" if i < len(result.scales) else "-"
        rows.append((str(i), scale, *(f"{'yes' if finite[r][i] else 'NO'}/{'SKIP' if skipped[r][i] else 'step'}"
                                      for r in range(len(skipped)))))
    return Table(("step", "scale", *(f"rank{r}: finite/skip" for r in range(len(skipped)))), tuple(rows))


def stock_bf16_hook_allowed() -> bool:
    """DDP's own rule (``torch/nn/parallel/distributed.py``, ``_check_comm_hook``) for a hook
    *named* ``bf16_compress_hook``: this torch build has CUDA (or ROCm) and NCCL >= 2.10, or an
    XPU with XCCL. It looks at the build, not at the process group the hook would run on."""
    import torch
    import torch.distributed as dist

    def _safe(test) -> bool:
        try:
            return bool(test())
        except Exception:  # a build without the piece asked about
            return False

    cuda = torch.version.cuda is not None or torch.version.hip is not None
    nccl = _safe(lambda: dist.is_available() and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10))
    xpu = _safe(lambda: dist.is_available() and dist.is_xccl_available() and torch.xpu.is_available())
    return (cuda and nccl) or xpu


def ddp_bf16_hooks() -> dict:
    """Register PyTorch's stock ``bf16_compress_hook`` on a real DDP model, then labkit's gloo copy.

    In this process, on a one-rank gloo group (a FileStore in a temporary folder, torn down
    afterwards; an existing one-rank default group is used as it is, a larger one refused:
    DDP would wait for the other ranks). Returns ``{"build": torch version,
    CUDA and NCCL of this build, "stock": "accepted" | "refused: TypeError: <DDP's message>",
    "labkit": the same for `labkit.train.torch.parallel.bf16_compress_hook_gloo`}``.
    On a CPU-only build DDP refuses the stock hook by its name, before any bucket is reduced;
    labkit's copy (the same function under another name) is accepted everywhere.
    """
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit.train.torch.parallel import bf16_compress_hook_gloo

    def register(hook) -> str:
        model = DDP(torch.nn.Linear(2, 2))
        try:
            model.register_comm_hook(None, hook)
        except (TypeError, RuntimeError, ValueError) as exc:
            return f"refused: {type(exc).__name__}: {exc}"
        return "accepted"

    def nccl() -> str:
        try:
            return ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "none"
        except Exception:
            return "none"

    out = {"build": f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, NCCL {nccl()}"}
    own = not dist.is_initialized()
    if not own and dist.get_world_size() != 1:
        raise ValueError("ddp_bf16_hooks registers the hooks on a one-rank group; this process already belongs to "
                         f"a default process group of {dist.get_world_size()} ranks (call it before "
                         "init_process_group, or in a process of its own)")
    with tempfile.TemporaryDirectory(prefix="labkit_ddp_hook_") as tmp:
        if own:
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                                    timeout=datetime.timedelta(seconds=60))
        try:
            out["stock"] = register(default_hooks.bf16_compress_hook)
            out["labkit"] = register(bf16_compress_hook_gloo)
        finally:
            if own:
                dist.destroy_process_group()
    return out


def compare(config: RunConfig, reduce_dtypes=("fp32", "bf16")) -> dict[str, RunResult]:
    """The same seeded run on one process, then on `config.devices` with each reduce dtype.

    Returns {"1 process": ..., "2 processes, fp32 reduce": ..., ...}; their losses agree
    within bf16 tolerance, and ``extra["comm_bytes_per_step"]`` shows what each reduction costs.
    """
    from labkit.train import run as run_one

    check_engine(config, "torch", "PyTorch")
    if not names("reduce_dtypes", reduce_dtypes, tuple(ITEMSIZE)):
        raise ValueError(f"reduce_dtypes must name at least one of {', '.join(ITEMSIZE)}")
    if config.devices < 2:
        raise ValueError("compare needs config.devices >= 2 for the distributed runs")
    out = {"1 process": run_one(config.replace(devices=1, reduce_dtype=None, out=None))}
    for dtype in reduce_dtypes:
        out[f"{config.devices} processes, {dtype} reduce"] = run(config.replace(reduce_dtype=dtype, out=None))
    return out


__all__ = ["check", "collectives_table", "compare", "ddp_bf16_hooks", "reduction_bytes", "run", "sharding_table", "skip_table",
           "stock_bf16_hook_allowed"]
