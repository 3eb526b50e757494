"""TensorFlow / Keras across devices: ``tf.distribute.MirroredStrategy`` with a mixed policy.

``labkit.train.run(RunConfig("tf", "bf16", devices=2))`` lands here. Every replica holds the
whole model (data parallelism: ``parallel="dp"``; tf.distribute has no FSDP for Keras models).
The one TensorFlow stepper runs it (`labkit.train.tf.stepper.TFStepper` with ``strategy=``);
this module launches it in a subprocess and reports what the collectives moved. Each step, in
one compiled ``tf.function``::

    strategy.run(replica_fn)              # on every replica, its slice of the global batch:
        loss   = sum(cross_entropy(y_i, model(x_i))) / global_batch
        grads  = tape.gradient(optimizer.scale_loss(loss))    # fp16: times the loss scale
        grads  = ctx.all_reduce(SUM, cast(grads, reduce_dtype))   # THE gradient collective
        norm   = global_norm(grads / scale);  grads = clip(grads, clip_norm)   # unscaled
        optimizer.apply(grads)            # LossScaleOptimizer (fp16): finite? apply : skip

What dtype does the all-reduce move? Whatever the gradient tensors hold. Under
``mixed_bfloat16`` / ``mixed_float16`` the variables are float32, so their gradients are
float32 (the bf16 activations' gradients are cast back at each layer), and the collective
moves float32 -- mixed precision does **not** halve the communication by itself.
``reduce_dtype="bf16"`` casts the gradients before the all-reduce (half the bytes, a bf16
rounding of every summand and of the sum); ``bf16-pure`` has bf16 variables, so bf16 gradients.

Why labkit all-reduces before Keras sees the gradients: Keras 3's optimizer sums the replicas'
gradients *inside* ``apply``, after two decisions that need the global gradient:

* ``global_clipnorm`` clips each replica's *local* gradient before the sum, so a 2-replica
  run would not clip like a 1-device run;
* ``LossScaleOptimizer`` (under ``MirroredStrategy``, which uses ``merge_call``) checks
  ``isfinite`` on the **first replica's** local gradients only ("each replica computed the
  same finite value, since grads is all-reduced" says its comment, which is not so here). An
  overflow on replica 1 alone is then applied: the sum is inf and the weights become NaN, and
  the scale is not lowered. `keras_local_check_demo` shows it.

With the sum taken first, every replica holds the same gradients, so the finite check -- and
the decision to skip -- is the same on all of them (as torch's GradScaler all-reduces
``found_inf``). The inner optimizer is told not to sum again (`labkit.train.tf.stepper.pre_reduced`).

The run happens in a subprocess: logical CPU devices
(``tf.config.set_logical_device_configuration``) must be made before TensorFlow initialises,
which in a notebook has usually happened already. It writes labkit's JSON lines, read back
with ``RunResult.load``. Devices: a TPU (``TPUStrategy``, looked for only where the environment
names one, so it never hangs), else ``config.devices`` GPUs when there are that many (NCCL
all-reduce), else ``config.devices`` logical CPU devices (collective all-reduce on the host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit.train.launch import check_engine, stop, wait
from labkit.train.config import RunConfig
from labkit.train.loop import RunFailed
from labkit.train.result import LogWriteFailed, RunResult, append_end_line

_ERROR_TAG = "labkit-tf-dist-error:"


# -- the parent side: no TensorFlow import here ----------------------------------------------
def check_config(config: RunConfig, overflow_replica: int | None = None) -> int:
    """Raise ValueError/TypeError for what cannot run on MirroredStrategy; return the overflow replica."""
    check_engine(config, "tf", "TensorFlow")
    if config.parallel != "dp":
        raise ValueError(f"parallel={config.parallel!r}: tf.distribute replicates Keras models (parallel='dp' only); "
                         "for sharded parameters use framework 'torch' (FSDP2) or 'jax'")
    if overflow_replica is None:
        overflow_replica = config.devices - 1
    if isinstance(overflow_replica, bool) or not isinstance(overflow_replica, int):
        raise TypeError(f"overflow_replica must be an int, got {type(overflow_replica).__name__}")
    if not 0 <= overflow_replica < config.devices:
        raise ValueError(f"overflow_replica must be in 0 .. {config.devices - 1}, got {overflow_replica}")
    return overflow_replica


def run(config: RunConfig, *, overflow_replica: int | None = None, timeout: float = 600.0) -> RunResult:
    """Train `config` (framework "tf", devices >= 2) on MirroredStrategy in a subprocess.

    ``inject_overflow`` steps put an inf into the gradient of replica `overflow_replica` only
    (default: the last one). The result has labkit's schema, plus in ``extra``:
    ``comm_bytes_per_step`` (bytes each replica hands to the gradient all-reduce per step,
    read from the compiled program's collective ops), ``reduce_dtype`` (their dtype),
    ``collectives`` (every all-reduce in the step: dtype, shape, bytes, what it reduces),
    ``strategy``, ``replicas``, ``overflow_replica``, ``local_overflow`` (per step, which
    replicas saw a non-finite local gradient), ``replica_weight_max_diff`` (largest difference
    between the replicas' copies of any weight after the run: 0.0 when they stayed in sync).
    A run that fails raises ``RunFailed`` with the steps it finished.
    """
    overflow_replica = check_config(config, overflow_replica)
    with tempfile.TemporaryDirectory(prefix="labkit-tf-dist-") as tmp:
        out = config.out or str(Path(tmp) / "run.jsonl")
        child = config.replace(out=out, progress=False)
        cmd = [sys.executable, "-m", "labkit.train.tf.distributed", json.dumps(child.to_dict()), str(overflow_replica)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            _, stderr = wait(proc, config, out, timeout)  # a progress bar if config.progress
        except BaseException:
            stop(proc)
            raise
        for line in stderr.splitlines():
            if line.startswith(_ERROR_TAG):  # a config this machine cannot run: nothing started
                kind, _, message = line[len(_ERROR_TAG):].strip().partition(": ")
                raise (TypeError if kind == "TypeError" else ValueError)(message)
        if not Path(out).exists():
            raise RuntimeError(f"the TensorFlow subprocess wrote no result (exit {proc.returncode}):\n"
                               + stderr[-3000:])
        result = RunResult.load(out)
    result.config = config
    if proc.returncode != 0 or result.status == "failed":
        raise RunFailed(f"the distributed TensorFlow run failed after {result.steps_done} steps: "
                        f"{result.error or stderr[-2000:]}", result)
    return result


def keras_local_check_demo(devices: int = 2, timeout: float = 300.0) -> dict:
    """What Keras 3's own LossScaleOptimizer does when only the last replica overflows.

    One float32 variable, ``MirroredStrategy`` over `devices` logical CPUs, three steps with
    gradient ``replica_id + 1`` (scaled by 4); at step 1 the last replica's gradient is inf.
    Two ways, each with a fresh variable and optimizer:

    * ``"keras"``: each replica hands its *local* gradient to ``optimizer.apply`` (Keras sums
      them inside), as a plain custom training loop does;
    * ``"labkit"``: ``ctx.all_reduce`` first, then ``apply`` (what `run` does).

    Returns ``{way: {"scales": [...], "applied": [...], "weights": [...]}}``: the loss scale
    after each step, whether the update was applied, the variable's first entry after each step.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        raise ValueError(f"devices must be an int >= 2, got {devices!r}")
    cmd = [sys.executable, "-m", "labkit.train.tf.distributed", "--keras-demo", str(devices)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the demo subprocess failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the subprocess side: TensorFlow lives below this line --------------------------------------
def collectives(graph, device: str | None = None) -> list[dict]:
    """Every all-reduce in a traced step: its dtype, shape, bytes per replica, and what it reduces.

    Read from the program TensorFlow runs (`TFStepper.step_graph`): its collective ops
    (``CollectiveReduceV2`` on CPUs, ``NcclAllReduce`` on GPUs; TensorFlow may pack several
    tensors into one). Each replica runs its own copy of each; only those placed on `device`
    (None: the first one seen) are listed.
    """
    from tensorflow.python.framework import device as tf_device

    found, want = [], None if device is None else tf_device.canonical_name(device)
    for op in graph.get_operations():
        if op.type not in _COLLECTIVE_OPS:
            continue
        where = tf_device.canonical_name(op.device)
        want = want or where
        if where != want:
            continue
        t = op.inputs[0]
        shape = [int(d) for d in t.shape]
        n = 1
        for d in shape:
            n *= d
        what = "gradients" if "labkit_grad_allreduce" in op.name else "loss" if "labkit_loss_allreduce" in op.name else "other"
        found.append({"op": op.type, "dtype": t.dtype.name, "shape": shape, "bytes": n * t.dtype.size, "reduces": what,
                      "name": op.name})
    return found


_COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveReduceV3", "CollectiveReduce", "NcclAllReduce", "CrossReplicaSum")


def replica_weight_max_diff(stepper) -> float:
    """Largest |difference| between two replicas' copies of any weight of a `TFStepper` (0.0: in sync)."""
    import tensorflow as tf

    worst = 0.0
    for var in stepper.model.weights:
        copies = [tf.cast(c, tf.float32) for c in stepper.strategy.experimental_local_results(var.value)]
        worst = max([worst] + [float(tf.reduce_max(tf.abs(c - copies[0]))) for c in copies[1:]])
    return worst


def extra(stepper) -> dict:
    """What a distributed run adds to its result's ``extra`` (see `run`); {} before any step."""
    graph = stepper.step_graph()
    if graph is None:  # no step was traced: nothing to report
        return {}
    found = collectives(graph, stepper.strategy.extended.worker_devices[0])
    grad = [c for c in found if c["reduces"] == "gradients"]
    return {"comm_bytes_per_step": sum(c["bytes"] for c in grad),
            "reduce_dtype": sorted({c["dtype"] for c in grad}),
            "collectives": found, "strategy": type(stepper.strategy).__name__, "replicas": stepper.replicas,
            "overflow_replica": stepper.overflow_replica, "local_overflow": stepper.local_overflow,
            "replica_weight_max_diff": replica_weight_max_diff(stepper)}


def _train_to_file(config: RunConfig, overflow_replica: int) -> int:
    from labkit.train.loop import train
    from labkit.train.tf.devices import make_strategy
    from labkit.train.tf.stepper import make_stepper

    holder = {}

    def make(cfg, data):
        holder["stepper"] = make_stepper(cfg, data, strategy=strategy, overflow_replica=overflow_replica)
        return holder["stepper"]

    status, code = "failed", 1
    try:
        strategy = make_strategy(config)
        status, code = train(config, make).status, 0
    except (ValueError, TypeError) as exc:  # a config this machine cannot run: nothing started
        print(f"{_ERROR_TAG} {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"labkit: {exc}", file=sys.stderr)
    if "stepper" in holder:
        info = extra(holder["stepper"])
        try:  # RunResult.load takes `extra` from this second end line
            if info:
                append_end_line(config.out, status, info)
        except LogWriteFailed as exc:
            print(f"labkit: {exc}", file=sys.stderr)
            code = 1
    return code


def _keras_local_check(devices: int) -> dict:
    from labkit.train.tf.models import keras, tf
    from labkit.train.tf.stepper import pre_reduced

    strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:devices])
    out = {}
    for way in ("keras", "labkit"):
        with strategy.scope():
            var = keras.Variable(tf.ones((3,)), name="w")
            inner = keras.optimizers.SGD(learning_rate=0.1)
            opt = keras.optimizers.LossScaleOptimizer(pre_reduced(type(inner))(learning_rate=0.1) if way == "labkit"
                                                      else inner, initial_scale=4.0)
            opt.build([var])

        def replica(inject):
            ctx = tf.distribute.get_replica_context()
            i = ctx.replica_id_in_sync_group
            g = tf.fill([3], opt.scale_loss(tf.cast(i + 1, tf.float32)))
            g = tf.where(tf.logical_and(inject, tf.equal(i, devices - 1)), tf.fill([3], float("inf")), g)
            if way == "labkit":
                g = ctx.all_reduce(tf.distribute.ReduceOp.SUM, g)
            opt.apply([g], [var])

        @tf.function
        def step(inject):
            before = tf.identity(opt.iterations)
            strategy.run(replica, args=(inject,))
            return tf.not_equal(opt.iterations, before)

        rec = {"scales": [], "applied": [], "weights": []}
        for inject in (False, True, False):
            rec["applied"].append(bool(step(tf.constant(inject)).numpy()))
            rec["scales"].append(float(opt.dynamic_scale.numpy()))
            rec["weights"].append(float(var.numpy()[0]))
        out[way] = rec
    return out


def _main(argv: list[str]) -> int:
    if argv[0] == "--keras-demo":
        from labkit.train.tf.devices import logical_cpus

        logical_cpus(int(argv[1]))
        print(json.dumps(_keras_local_check(int(argv[1]))))
        return 0
    return _train_to_file(RunConfig.from_dict(json.loads(argv[0])), int(argv[1]))


__all__ = ["check_config", "collectives", "extra", "keras_local_check_demo", "replica_weight_max_diff", "run"]


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
