"""Where a TensorFlow run happens: one device, or a ``tf.distribute`` strategy over several.

* `find_tpu`: a connected TPU, asked for only where the environment names one (so a machine
  without one never waits on the network);
* `resolve_device`: what `labkit.train.tf.stepper.TFStepper` runs on for a config: a TPU
  (``TPUStrategy``), else a GPU, else the CPU, or the strategy it was given;
* `make_strategy`: the strategy a multi-device config asks for (``TPUStrategy``,
  ``MirroredStrategy`` over GPUs, or over logical CPU devices, made by `logical_cpus`).
"""

from __future__ import annotations

import os

from labkit.hardware import detect_cpu, tpu_from_environment
from labkit.train.config import RunConfig
from labkit.train.tf.models import keras, tf


def versions() -> str:
    """The TensorFlow and Keras versions, as every device description ends."""
    return f"tensorflow {tf.__version__}, keras {keras.__version__}"


def find_tpu():
    """(a connected ``TPUClusterResolver``, "") or (None, why not); never raises.

    Asks TensorFlow only where the environment names a TPU, as `labkit.hardware` does: a
    Cloud TPU VM sets ``TPU_ACCELERATOR_TYPE`` (the TPU is local), the older Colab TPU
    runtime ``COLAB_TPU_ADDR``, TPU nodes and GKE ``TPU_NAME`` /
    ``KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS``. Elsewhere the resolver would look for Google's
    metadata server over the network, so it is not asked at all.
    """
    hint = tpu_from_environment(os.environ)
    if hint is None:
        return None, ("no TPU: the environment names none (TPU_ACCELERATOR_TYPE, COLAB_TPU_ADDR, "
                      "TPU_NAME, KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS are unset)")
    addr = os.environ.get("COLAB_TPU_ADDR")
    tpu = f"grpc://{addr}" if addr else "local" if os.environ.get("TPU_ACCELERATOR_TYPE") else None
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as exc:  # named but not reachable: report why, do not crash
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, f"no usable TPU ({hint.source}): {type(exc).__name__}: {first_line}"
    return resolver, ""


def _gpu_details(gpu) -> tuple[str, tuple[int, int] | None]:
    details = tf.config.experimental.get_device_details(gpu)
    return details.get("device_name", gpu.name), details.get("compute_capability")


def _tpu_strategy(config: RunConfig, want: str):
    """A TPUStrategy where the environment names a reachable TPU, else None (ValueError if one was asked for)."""
    resolver, why = find_tpu()
    if resolver is not None:
        return tf.distribute.TPUStrategy(resolver)
    if want == "tpu":
        raise ValueError(f"device='tpu' asked for, but {why}. Use device='auto' or 'cpu'.")
    return None


def resolve_device(config: RunConfig, strategy=None):
    """(kind, tf device string, strategy, description) for one stepper; ValueError if `config` cannot run here.

    kind is "tpu", "strategy" (a strategy given), "gpu" or "cpu"; the device string is None
    where a strategy places the work.
    """
    want = {"cuda": "gpu"}.get(config.device, config.device)
    if strategy is not None:
        kind = "tpu" if isinstance(strategy, tf.distribute.TPUStrategy) else "strategy"
        devices = ", ".join(strategy.extended.worker_devices)
        desc = f"{type(strategy).__name__} over {strategy.num_replicas_in_sync} replicas ({devices}; {versions()})"
        return kind, None, strategy, desc
    if want in ("auto", "tpu"):
        strategy = _tpu_strategy(config, want)
        if strategy is not None:
            return "tpu", None, strategy, f"tpu ({strategy.num_replicas_in_sync} cores via TPUStrategy, {versions()})"
    gpus = tf.config.list_physical_devices("GPU")
    if want in ("auto", "gpu") and gpus:
        name, cc = _gpu_details(gpus[0])
        cc_text = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
        if config.precision in ("bf16", "bf16-pure") and cc is not None and tuple(cc) < (8, 0):
            raise ValueError(f"precision={config.precision!r} needs bfloat16 Tensor Cores (NVIDIA Ampere, compute "
                             f"capability 8.0, or newer); {name} has {cc_text}. Use 'fp16' (with loss scaling) "
                             "or 'fp32' here.")
        return "gpu", "/GPU:0", None, f"gpu ({name}, {cc_text}, {versions()})"
    if want == "gpu":
        raise ValueError(f"device={config.device!r} asked for, but TensorFlow sees no GPU (tensorflow "
                         f"{tf.__version__}, built with CUDA: {tf.test.is_built_with_cuda()}). "
                         "Use device='auto' or 'cpu'.")
    return "cpu", "/CPU:0", None, f"cpu ({detect_cpu().model}, {versions()})"


def logical_cpus(n: int) -> list[str]:
    """Split the host CPU into `n` logical devices and name them. Only before TensorFlow
    initialises its runtime (a fresh process): afterwards TensorFlow refuses."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def make_strategy(config: RunConfig):
    """The strategy a ``devices >= 2`` `config` asks for here: TPUStrategy, MirroredStrategy over
    ``config.devices`` GPUs, or over as many logical CPUs (made with `logical_cpus`).

    Raises ValueError (before any work) for a device that is not there; the stepper refuses
    fp16 on a TPU and a batch that does not split over the replicas.
    """
    want = {"cuda": "gpu"}.get(config.device, config.device)
    if want in ("auto", "tpu"):
        strategy = _tpu_strategy(config, want)
        if strategy is not None:
            return strategy
    gpus = tf.config.list_physical_devices("GPU")
    if want in ("auto", "gpu") and len(gpus) >= config.devices:
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(config.devices)])
    if want == "gpu":
        raise ValueError(f"device={config.device!r} with devices={config.devices}, but TensorFlow sees "
                         f"{len(gpus)} GPU(s); use device='cpu' for logical CPU devices")
    return tf.distribute.MirroredStrategy(logical_cpus(config.devices))
