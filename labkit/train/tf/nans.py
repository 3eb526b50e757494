"""NaN hunting in TensorFlow: ``tf.debugging.enable_check_numerics()`` finds a planted NaN and names the op.

`find_nan` plants a NaN (``tf.math.log(-1.0)`` or ``0.0 / 0.0``) inside a fresh ``tf.function``,
turns check-numerics on, calls it, and returns the real ``InvalidArgumentError`` as a `NanHunt`
(the same record as ``labkit.train.jax.find_nan``'s). Check-numerics instruments every op traced
while it is on with a ``CheckNumericsV2`` op (tensorflow/python/debug/lib/check_numerics_callback.py),
so the error names the op that first made the NaN, not the loss that later showed it. The
instrumentation is part of the traced graph: after ``disable_check_numerics()`` the same
``tf.function`` still checks (it keeps raising) until it is traced again; `NanHunt.after_restore`
shows it.

>>> PLANTS["log"]
'tf.math.log(x) with x = -1.0, inside a tf.function'
"""

from __future__ import annotations

import re

from labkit._validate import choice
from labkit.hardware.detect import quiet_native_logs
from labkit.train.lessons import NanHunt
from labkit.train.logs import logger_level
from labkit.train.tf.models import tf

PLANTS = {"log": "tf.math.log(x) with x = -1.0, inside a tf.function",
          "divide": "(x - x) / (x - x) with x = -1.0, inside a tf.function"}
"""The NaNs `find_nan` can plant: log of a negative number, and 0/0."""


def _call(fn, x):
    # Everything native code writes meanwhile is dropped: the runtime logs the same check-numerics
    # error again (with a timestamp, "Local rendezvous is aborting with status: INVALID_ARGUMENT"),
    # once absl's logging has been initialised -- by JAX's import, say -- and the error is returned.
    try:
        with quiet_native_logs(None, log_level=None):
            value = fn(x)
        return f"returns {float(value):g}", None
    except tf.errors.InvalidArgumentError as err:
        return f"raises {type(err).__name__}", err


def find_nan(planted: str = "log") -> NanHunt:
    """Plant the NaN `planted` (a key of `PLANTS`) in a ``tf.function``, find it with
    ``tf.debugging.enable_check_numerics()`` and return what TensorFlow said; check-numerics is
    turned off again afterwards (``tf.debugging.disable_check_numerics()``), also on failure.

    The message reads ``!!! Detected Infinity or NaN in output 0 of graph op "Log" ...``, then the
    op's dtype, shape, inputs and the stack where it was created, and ends with the NaN's kind.
    """
    planted = choice("planted", planted, tuple(PLANTS))

    @tf.function
    def f(x):
        y = tf.math.log(x) if planted == "log" else (x - x) / (x - x)
        return y * 2.0 + 1.0

    x = tf.constant(-1.0)
    # TensorFlow logs "Enabled/Disabled check-numerics callback in thread MainThread" at INFO (seen where the
    # process logs INFO, as a notebook kernel may): its logger stays at WARNING for the switch
    with logger_level(tf.get_logger(), "WARNING"):
        tf.debugging.enable_check_numerics()
        try:
            _, err = _call(f, x)
        finally:
            tf.debugging.disable_check_numerics()
    if err is None:
        raise AssertionError("check-numerics did not raise on a planted NaN")  # pragma: no cover - TF changed
    after, _ = _call(f, x)
    message = err.message
    headline = next((line for line in message.splitlines() if "Detected Infinity or NaN" in line), "")
    found = re.search(r'graph op "([^"]+)"', headline) or re.search(r'op "([^"]+)"', message)
    return NanHunt(framework="tensorflow", version=tf.__version__, flag="tf.debugging.enable_check_numerics()",
                   planted=PLANTS[planted], exception=type(err).__name__, message=message, headline=headline.strip(),
                   op=found.group(1) if found else "", notice="", after_restore=after)


__all__ = ["PLANTS", "NanHunt", "find_nan"]
