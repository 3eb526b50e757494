"""What the installed frameworks do by default with float32 numbers: TF32 and subnormals.

Both are runtime settings, not formats, and both differ between frameworks on the same
machine, so they are read from the frameworks themselves (each imported only when asked).

* `tf32_defaults` -- the settings that decide whether float32 matmuls and convolutions run
  as TF32 (10-bit mantissa) on an Ampere or newer NVIDIA GPU, as this install has them.
* `subnormal_behaviour` -- whether each runtime keeps float32 subnormals (IEEE 754's gradual
  underflow) or flushes them to zero (the CPU's FTZ/DAZ modes, which XLA and TensorFlow set
  in their CPU threads; TPUs flush bf16 and fp32 subnormals in hardware).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io

import numpy as np

from labkit._validate import shown
from labkit.hardware.report import FRAMEWORKS, framework_name

TF32_FRAMEWORKS = FRAMEWORKS
SUBNORMAL = 1e-39  # as float32 (9.99995e-40): a float32 subnormal, below 2^-126 = 1.18e-38


def _frameworks(frameworks) -> tuple[str, ...]:
    if isinstance(frameworks, str) or not hasattr(frameworks, "__iter__"):
        raise TypeError(f"frameworks must be a list of names from {', '.join(FRAMEWORKS)}, not {shown(frameworks)}")
    names = tuple(framework_name(f) for f in frameworks)
    return tuple(f for f in names if importlib.util.find_spec(f) is not None)


def _quiet_import(name):
    if name != "tensorflow":
        return importlib.import_module(name)
    from labkit.hardware.detect import quiet_native_logs, tensorflow_environment

    tensorflow_environment()  # a capped oneDNN would crash TensorFlow's 16-bit kernels
    with quiet_native_logs(), contextlib.redirect_stderr(io.StringIO()):
        tf = importlib.import_module(name)
        tf.config.list_physical_devices()  # the CUDA probe logs here, not at import
    return tf


def tf32_defaults(frameworks=TF32_FRAMEWORKS):
    """The TF32 settings of each installed framework, read from it, and what they mean on an
    Ampere or newer NVIDIA GPU (on a CPU and on older GPUs float32 stays float32 either way).

    * PyTorch: ``torch.backends.cuda.matmul.allow_tf32`` is False and
      ``torch.get_float32_matmul_precision()`` is ``"highest"``: matmuls stay fp32 until
      ``torch.set_float32_matmul_precision("high")``; but ``torch.backends.cudnn.allow_tf32``
      is True: convolutions use TF32 by default.
    * JAX: ``jax_default_matmul_precision`` is None, i.e. ``lax.Precision.DEFAULT``, which "on
      GPU uses tensorfloat32 if available (e.g. on A100 and H100 GPUs)" (the ``Precision``
      docstring, ``jax/_src/lax/lax.py``): matmuls and convolutions use TF32 by default.
    * TensorFlow: ``tf.config.experimental.tensor_float_32_execution_enabled()`` is True.

    Returns a `labkit.table.Table`; a framework that is not installed is left out.
    """
    from labkit.table import Table

    rows = []
    for name in _frameworks(frameworks):
        if name == "torch":
            torch = _quiet_import("torch")
            mm = torch.backends.cuda.matmul.allow_tf32
            prec = torch.get_float32_matmul_precision()
            conv = torch.backends.cudnn.allow_tf32
            rows += [
                ("torch", "torch.backends.cuda.matmul.allow_tf32", str(mm),
                 "matmuls in TF32" if mm else "matmuls in full fp32"),
                ("torch", "torch.get_float32_matmul_precision()", repr(prec),
                 "matmuls in full fp32" if prec == "highest" else "matmuls may use TF32 (or bf16 passes)"),
                ("torch", "torch.backends.cudnn.allow_tf32", str(conv),
                 "convolutions in TF32" if conv else "convolutions in full fp32"),
            ]
        elif name == "jax":
            jax = _quiet_import("jax")
            value = jax.config.jax_default_matmul_precision
            means = ("matmuls and convolutions in TF32 (Precision.DEFAULT)" if value in (None, "default", "fastest",
                                                                                     "tensorfloat32", "high")
                     else "matmuls and convolutions in full fp32" if value in ("highest", "float32")
                     else f"as {value!r} says")
            rows.append(("jax", "jax_default_matmul_precision", repr(value), means))
        else:
            tf = _quiet_import("tensorflow")
            on = tf.config.experimental.tensor_float_32_execution_enabled()
            rows.append(("tensorflow", "tf.config.experimental.tensor_float_32_execution_enabled()", str(on),
                         "matmuls and convolutions in TF32" if on else "matmuls and convolutions in full fp32"))
    return Table(("framework", "setting", "here", "on an Ampere or newer GPU"), tuple(rows),
                 "TF32 defaults, read from the installed frameworks")


def _kept(value: float) -> str:
    return "kept: gradual underflow" if value == np.float32(SUBNORMAL) * np.float32(2) else (
        "flushed to zero" if value == 0 else f"unexpected {value!r}")


def subnormal_behaviour(frameworks=TF32_FRAMEWORKS):
    """``x * 2`` for the float32 subnormal x = 1e-39 in numpy and in each installed framework,
    on its default device, and whether the subnormal survived. Returns a `labkit.table.Table`.

    IEEE 754 keeps it (2e-39: gradual underflow). A runtime that sets the CPU's flush-to-zero
    (FTZ) and denormals-are-zero (DAZ) modes returns 0: XLA:CPU (JAX) and TensorFlow set them in
    their threads; PyTorch leaves them off unless ``torch.set_flush_denormal(True)`` (tried here,
    then switched off again). TPUs flush subnormals in hardware.
    """
    from labkit.table import Table

    names = _frameworks(frameworks)
    x = np.float32(SUBNORMAL)
    rows = [("numpy", "float32", float(x * np.float32(2)))]
    for name in names:
        if name == "torch":
            torch = _quiet_import("torch")
            t = torch.tensor([x], dtype=torch.float32)
            rows.append(("torch", "default", float((t * 2)[0])))
            if torch.set_flush_denormal(True):
                try:
                    rows.append(("torch", "after torch.set_flush_denormal(True)", float((t * 2)[0])))
                finally:
                    torch.set_flush_denormal(False)
        elif name == "jax":
            jax = _quiet_import("jax")
            a = jax.numpy.asarray([x], dtype=jax.numpy.float32)
            rows.append(("jax", f"default ({jax.default_backend()})", float(np.asarray(a * 2)[0])))
        else:
            tf = _quiet_import("tensorflow")
            from labkit.hardware.detect import quiet_native_logs

            with quiet_native_logs():
                dev = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
                doubled = float((tf.constant([x], tf.float32) * 2).numpy()[0])
            rows.append(("tensorflow", f"default ({dev})", doubled))
    return Table(("runtime", "setting", "1e-39 * 2", "the fp32 subnormal is"),
                 tuple((r, s, f"{v:.3g}", _kept(v)) for r, s, v in rows),
                 "A float32 subnormal, doubled")
