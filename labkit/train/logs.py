"""Quiet a library's Python loggers for a block, then put their levels back.

The rooms use it where a library logs what does not concern a learner: torchao's and bitsandbytes'
import noise (`labkit.train.torch.quiet`), DeepSpeed's overflow lines (the clinic), TensorFlow's
"Enabled check-numerics callback" at INFO (`labkit.train.tf.nans`). Only the standard library is
imported here, so every room can use it.

>>> import logging
>>> lg = logging.getLogger("labkit.demo")
>>> with logger_level("labkit.demo", "ERROR"):
...     logging.getLevelName(lg.level)
'ERROR'
>>> lg.level == logging.NOTSET
True
"""

from __future__ import annotations

import contextlib
import logging

from labkit._validate import shown

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels `logger_level` sets, by name (``logging.ERROR`` and the other constants work too)."""


def _level(level) -> int:
    names = {getattr(logging, name): name for name in LEVELS}
    if isinstance(level, str) and level.upper() in LEVELS:
        return getattr(logging, level.upper())
    if isinstance(level, int) and not isinstance(level, bool) and level in names:
        return level
    raise (ValueError if isinstance(level, (str, int)) and not isinstance(level, bool) else TypeError)(
        f"level must be one of {', '.join(LEVELS)} (a name or logging's constant); got {type(level).__name__} "
        f"{shown(level)}")


def logger_level(loggers, level="ERROR"):
    """A block in which each of `loggers` (a logger's name or a ``logging.Logger``, or a list of them) is set
    to `level` (a name of `LEVELS` or its ``logging`` constant); each is put back at its own level on the way
    out, also when the block raises. The arguments are checked when it is called, before any block runs."""
    items = [loggers] if isinstance(loggers, (str, logging.Logger)) else loggers
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(f"loggers must be a logger's name, a logging.Logger, or a non-empty list of them; got "
                        f"{type(loggers).__name__} {shown(loggers)}")
    for item in items:
        if not isinstance(item, (str, logging.Logger)):
            raise TypeError(f"loggers must hold loggers' names or logging.Logger objects; got {type(item).__name__} "
                            f"{shown(item)}")
    chosen = [item if isinstance(item, logging.Logger) else logging.getLogger(item) for item in items]
    value = _level(level)

    @contextlib.contextmanager
    def block():
        levels = [lg.level for lg in chosen]
        for lg in chosen:
            lg.setLevel(value)
        try:
            yield
        finally:
            for lg, saved in zip(chosen, levels):
                lg.setLevel(saved)

    return block()


__all__ = ["LEVELS", "logger_level"]
