"""NaN hunting in JAX: ``jax.config.update("jax_debug_nans", True)`` finds a planted NaN and names the primitive.

`find_nan` plants a NaN (``jnp.log(-1.0)`` or 0 / 0 by ``lax.div``) inside a ``jax.jit`` function, turns
``jax_debug_nans`` on, calls it, and returns the real ``FloatingPointError`` as a `NanHunt` (the same
record as ``labkit.train.tf.find_nan``'s). How JAX finds it: the compiled function's *outputs* are
checked (jax/_src/dispatch.py); on a NaN, JAX prints a notice and calls the function again
de-optimised (jax/_src/api_util.py, ``maybe_recursive_nan_check``), each operation dispatched and
checked on its own, so the error names the first one that made a NaN (jax/_src/pjit.py:
``invalid value (nan) encountered in log``; ``div`` for a division).
The flag costs a check of every output and is off by default; it is put back afterwards.

>>> PLANTS["log"]
'jnp.log(x) with x = -1.0, inside jax.jit'
"""

from __future__ import annotations

import contextlib
import io
import re

import jax
import jax.numpy as jnp

from labkit._validate import choice
from labkit.train.lessons import NanHunt

PLANTS = {"log": "jnp.log(x) with x = -1.0, inside jax.jit",
          "divide": "lax.div(x - x, x - x) with x = -1.0 (0 / 0), inside jax.jit"}
"""The NaNs `find_nan` can plant: log of a negative number, and 0/0."""


def find_nan(planted: str = "log") -> NanHunt:
    """Plant the NaN `planted` (a key of `PLANTS`) in a ``jax.jit`` function, find it with
    ``jax_debug_nans`` and return what JAX said; the flag gets its old value back, also on failure.

    The message reads ``invalid value (nan) encountered in log``; what JAX prints to stdout on
    the way (``Invalid nan value encountered in the output of a jax.jit function. Calling the
    de-optimized version.``) is captured as `NanHunt.notice`.
    """
    planted = choice("planted", planted, tuple(PLANTS))

    @jax.jit
    def f(x):
        # lax.div, not `/`: jnp's divide is a jitted function of its own, and how the de-optimised
        # re-run reports a NaN inside it depended on what had run before in the process
        y = jnp.log(x) if planted == "log" else jax.lax.div(x - x, x - x)
        return y * 2.0 + 1.0

    x = jnp.float32(-1.0)
    before = jax.config.jax_debug_nans
    printed = io.StringIO()
    err = None
    jax.config.update("jax_debug_nans", True)
    try:
        with contextlib.redirect_stdout(printed):
            f(x).block_until_ready()
    except FloatingPointError as e:
        err = e
    finally:
        jax.config.update("jax_debug_nans", before)
    if err is None:
        raise AssertionError("jax_debug_nans did not raise on a planted NaN")  # pragma: no cover - JAX changed
    after = f"returns {float(f(x)):g}"
    message = str(err)
    headline = next((line for line in message.splitlines() if "encountered in" in line), message)
    found = re.search(r"encountered in (\w+)", headline)
    return NanHunt(framework="jax", version=jax.__version__, flag='jax.config.update("jax_debug_nans", True)',
                   planted=PLANTS[planted], exception=type(err).__name__, message=message, headline=headline.strip(),
                   op=found.group(1) if found else "", notice=printed.getvalue().strip(), after_restore=after)


__all__ = ["PLANTS", "NanHunt", "find_nan"]
