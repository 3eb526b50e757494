"""TensorFlow / Keras across devices: ``tf.distribute.MirroredStrategy`` with a mixed policy.

``labkit.train.run(RunConfig("tf", "bf16", devices=2))`` lands here. Every replica holds the
whole model (data parallelism: ``parallel="dp"``; tf.distribute has no FSDP for Keras models).
Each step, in one compiled ``tf.function``::

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
``found_inf``). The inner optimizer is told not to sum again (`_pre_reduced`).

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

from labkit.train.launch import check_engine
from labkit.train import launch as _wait
from labkit.train.config import RunConfig
from labkit.train.loop import RunFailed
from labkit.train.result import LogWriteFailed, RunResult, append_end_line

REDUCE_TF_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
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
            _, stderr = _wait.wait(proc, config, out, timeout)  # a progress bar if config.progress
        except BaseException:
            _wait.stop(proc)
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
tf = keras = None


def _import_tf():
    global tf, keras
    if tf is None:
        from labkit.train.tf.models import keras as _keras, tf as _tf

        tf, keras = _tf, _keras


def _make_logical_cpus(n: int) -> list[str]:
    """Split the host CPU into `n` logical devices (before TensorFlow initialises) and name them."""
    _import_tf()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def make_strategy(config: RunConfig):
    """The strategy `config` asks for here: TPUStrategy, MirroredStrategy over GPUs, or over logical CPUs.

    Raises ValueError (before any work) for a device that is not there, fp16 on a TPU, or a
    batch that does not split over the TPU's cores.
    """
    _import_tf()
    from labkit.train.tf.stepper import find_tpu

    want = {"cuda": "gpu"}.get(config.device, config.device)
    if want in ("auto", "tpu"):
        resolver, why = find_tpu()  # asks TensorFlow only where the environment names a TPU
        if resolver is not None:
            strategy = tf.distribute.TPUStrategy(resolver)
            if config.precision == "fp16":
                raise ValueError("precision='fp16' on a TPU: TPUs have no float16 units; use 'bf16'")
            if config.batch_size % strategy.num_replicas_in_sync:
                raise ValueError(f"batch_size={config.batch_size} must be a multiple of the TPU's "
                                 f"{strategy.num_replicas_in_sync} cores")
            return strategy
        if want == "tpu":
            raise ValueError(f"device='tpu' asked for, but {why}")
    gpus = tf.config.list_physical_devices("GPU")
    if want in ("auto", "gpu") and len(gpus) >= config.devices:
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(config.devices)])
    if want == "gpu":
        raise ValueError(f"device={config.device!r} with devices={config.devices}, but TensorFlow sees "
                         f"{len(gpus)} GPU(s); use device='cpu' for logical CPU devices")
    return tf.distribute.MirroredStrategy(_make_logical_cpus(config.devices))


def _pre_reduced(cls):
    """`cls` (a Keras optimizer class) told that its gradients arrive already summed over replicas.

    Keras' TensorFlow optimizer sums the replicas' gradients in ``_all_reduce_sum_gradients``
    before updating each variable; labkit has summed them already, so this returns them as
    they are and every replica updates its copy with the same gradient.
    """
    if not hasattr(cls, "_all_reduce_sum_gradients"):
        raise RuntimeError(f"this Keras ({keras.__version__}) has no {cls.__name__}._all_reduce_sum_gradients; "
                           "labkit's MirroredStrategy runner needs updating")

    class PreReduced(cls):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            return list(grads_and_vars)

    PreReduced.__name__ = PreReduced.__qualname__ = f"PreReduced{cls.__name__}"
    return PreReduced


def _optimizer(config: RunConfig):
    inner_cls = keras.optimizers.Adam if config.optimizer == "adam" else keras.optimizers.SGD
    extra = dict(epsilon=1e-8) if config.optimizer == "adam" else {}  # as tf_runner: torch/optax's epsilon
    inner = _pre_reduced(inner_cls)(learning_rate=config.lr, **extra)
    if config.precision != "fp16":
        return inner
    scale = 2.0**15 if config.init_scale is None else float(config.init_scale)
    return keras.optimizers.LossScaleOptimizer(inner, initial_scale=scale)


class MirroredStepper:
    """The `labkit.train.loop` Stepper for a `tf.distribute` strategy (see the module docstring)."""

    def __init__(self, config: RunConfig, strategy, overflow_replica: int):
        from labkit.train import models as M
        from labkit.train.tf import models as TM
        from labkit.train.tf import stepper as TR

        self.config, self.strategy, self.overflow_replica = config, strategy, overflow_replica
        self.n = strategy.num_replicas_in_sync
        self._TM, self._TR = TM, TR
        devices = list(strategy.extended.worker_devices)
        self.device = (f"{type(strategy).__name__} over {self.n} replicas ({', '.join(devices)}; "
                       f"{TR._versions()})")
        self._deterministic = all("CPU" in d.upper() for d in devices)
        with self._state(), strategy.scope():
            self.model = TM.build(config.model, config.precision, config.width)
            TM.load_params(self.model, M.init_params(config.model, config.seed, config.width))
            self.optimizer = _optimizer(config)
            self.optimizer.build(self.model.trainable_variables)
        self._loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self._inner = self.optimizer.inner_optimizer if self._loss_scaled else self.optimizer
        var_dtype = self.model.trainable_variables[0].dtype
        self.reduce_dtype = REDUCE_TF_DTYPES[config.reduce_dtype] if config.reduce_dtype else tf.as_dtype(var_dtype).name
        self._step_fn = tf.function(self._step)
        self._gradient_bytes, self._last, self.local_overflow, self.collectives = None, None, [], None

    def _state(self):
        return self._TR.framework_state(tf32=self.config.precision != "fp32", deterministic=self._deterministic)

    def _replica(self, x, y, inject):
        ctx = tf.distribute.get_replica_context()
        i, per = ctx.replica_id_in_sync_group, self.config.batch_size // self.n
        xs, ys = x[i * per:(i + 1) * per], y[i * per:(i + 1) * per]
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(self._TR._cross_entropy(ys, self.model(xs, training=True))) / self.config.batch_size
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        self._gradient_bytes = self._TR._nbytes(grads)
        # An injected overflow on ONE replica: an inf in the first kernel's local gradient.
        hit = tf.logical_and(inject, tf.equal(i, self.overflow_replica))
        bump = tf.where(hit, tf.constant(float("inf"), grads[0].dtype), tf.zeros((), grads[0].dtype))
        grads[0] = tf.tensor_scatter_nd_add(grads[0], [[0] * len(grads[0].shape)], [bump])
        local_finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        with tf.name_scope("labkit_grad_allreduce"):
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [tf.cast(g, self.reduce_dtype) for g in grads])
        grads = [tf.cast(s, g.dtype) for s, g in zip(summed, grads)]
        scale = tf.identity(self.optimizer.dynamic_scale) if self._loss_scaled else tf.ones((), tf.float32)
        unscaled = [tf.cast(g, tf.float32) / scale for g in grads]
        norm = tf.linalg.global_norm(unscaled)
        if self.config.clip_norm:  # on the unscaled global gradient, then scaled back for the LSO
            clipped, _ = tf.clip_by_global_norm(unscaled, self.config.clip_norm, use_norm=norm)
            grads = [tf.cast(c * scale, g.dtype) for c, g in zip(clipped, grads)]
        self.optimizer.apply(grads, variables)
        with tf.name_scope("labkit_loss_allreduce"):
            loss = ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss)
        return loss, norm, scale, tf.logical_not(local_finite)

    def _step(self, x, y, inject):
        before = tf.identity(self._inner.iterations)
        out = self.strategy.run(self._replica, args=(x, y, inject))
        loss, norm, scale = (self.strategy.experimental_local_results(t)[0] for t in out[:3])
        local_overflow = tf.stack(self.strategy.experimental_local_results(out[3]))
        return loss, norm, scale, tf.equal(self._inner.iterations, before), local_overflow

    def step(self, x, y, inject_overflow: bool = False):
        from labkit.train.loop import StepOut

        xin = self._TM.model_inputs(self.config.model, x)
        self._last = xin
        args = (tf.constant(xin), tf.constant(y, tf.int32), tf.constant(bool(inject_overflow)))
        with self._state(), self.strategy.scope():
            if self.collectives is None:
                graph = self._step_fn.get_concrete_function(*args).graph
                self.collectives = collectives(graph, self.strategy.extended.worker_devices[0])
            loss, norm, scale, skipped, local = (t.numpy() for t in self._step_fn(*args))
        self.local_overflow.append([int(r) for r in range(self.n) if local[r]])
        return StepOut(loss=float(loss), grad_norm=float(norm), scale=float(scale) if self._loss_scaled else None,
                       skipped=bool(skipped))

    def evaluate(self, x, y) -> float:
        with self._state(), self.strategy.scope():
            logits = self.model(tf.constant(self._TM.model_inputs(self.config.model, x)), training=False)
            return float((tf.argmax(tf.cast(logits, tf.float32), -1).numpy() == y).mean())

    def nonfinite_layer(self):
        for name, var in self._TM.variable_map(self.model).items():
            if not tf.reduce_all(tf.math.is_finite(tf.cast(var.value, tf.float32))):
                return f"{name} (weights)"
        return None

    def replica_weight_max_diff(self) -> float:
        """Largest |difference| between two replicas' copies of any weight (0.0: in sync)."""
        worst = 0.0
        for var in self.model.weights:
            copies = [tf.cast(c, tf.float32) for c in self.strategy.experimental_local_results(var.value)]
            worst = max([worst] + [float(tf.reduce_max(tf.abs(c - copies[0]))) for c in copies[1:]])
        return worst

    def memory(self) -> dict:
        """Per replica (each holds a full copy): variables, optimizer state, one step's gradients."""
        TR = self._TR
        mem = {"parameter_bytes_per_replica": TR._nbytes(self.model.weights),
               "optimizer_state_bytes_per_replica": TR._nbytes(self.optimizer.variables), "replicas": self.n}
        if self._gradient_bytes is not None:
            mem["gradient_bytes_per_replica"] = self._gradient_bytes
        return mem

    def extra(self) -> dict:
        if self.collectives is None:  # no step was traced: nothing to report
            return {}
        grad = [c for c in self.collectives if c["reduces"] == "gradients"]
        return {"comm_bytes_per_step": sum(c["bytes"] for c in grad),
                "reduce_dtype": sorted({c["dtype"] for c in grad}),
                "collectives": self.collectives, "strategy": type(self.strategy).__name__, "replicas": self.n,
                "overflow_replica": self.overflow_replica, "local_overflow": self.local_overflow,
                "replica_weight_max_diff": self.replica_weight_max_diff()}


_COLLECTIVE_OPS = ("CollectiveReduceV2", "CollectiveReduceV3", "CollectiveReduce", "NcclAllReduce", "CrossReplicaSum")


def collectives(graph, device: str | None = None) -> list[dict]:
    """Every all-reduce in a traced step: its dtype, shape, bytes per replica, and what it reduces.

    Read from the program TensorFlow runs: its collective ops (``CollectiveReduceV2`` on CPUs,
    ``NcclAllReduce`` on GPUs; TensorFlow may pack several tensors into one). Each replica runs
    its own copy of each; only those placed on `device` (None: the first one seen) are listed.
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


def _train_to_file(config: RunConfig, strategy, overflow_replica: int) -> int:
    from labkit.train.loop import train

    holder = {}

    def make(cfg, data):
        holder["stepper"] = MirroredStepper(cfg, strategy, overflow_replica)
        return holder["stepper"]

    status, code = "failed", 1
    try:
        status, code = train(config, make).status, 0
    except RunFailed as exc:
        print(f"labkit: {exc}", file=sys.stderr)
    if "stepper" in holder and holder["stepper"].collectives is not None:
        try:  # RunResult.load takes `extra` from this second end line
            append_end_line(config.out, status, holder["stepper"].extra())
        except LogWriteFailed as exc:
            print(f"labkit: {exc}", file=sys.stderr)
            code = 1
    return code


def _keras_local_check(devices: int) -> dict:
    _import_tf()
    strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:devices])
    out = {}
    for way in ("keras", "labkit"):
        with strategy.scope():
            var = keras.Variable(tf.ones((3,)), name="w")
            inner = keras.optimizers.SGD(learning_rate=0.1)
            opt = keras.optimizers.LossScaleOptimizer(_pre_reduced(type(inner))(learning_rate=0.1) if way == "labkit"
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
        _make_logical_cpus(int(argv[1]))
        print(json.dumps(_keras_local_check(int(argv[1]))))
        return 0
    config, overflow_replica = RunConfig.from_dict(json.loads(argv[0])), int(argv[1])
    try:
        strategy = make_strategy(config)
    except (ValueError, TypeError) as exc:
        print(f"{_ERROR_TAG} {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return _train_to_file(config, strategy, overflow_replica)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
