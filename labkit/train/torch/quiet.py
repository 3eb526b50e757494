"""Importing the low-precision libraries (``labkit[lowp]``) without their import-time noise.

torchao 0.18 logs, at import, each compiled kernel for another GPU that did not load
(``Failed to load .../_C_mxfp8...so``), and torch a deprecation notice for the Enums torchao
registers with ``torch.utils._pytree``; bitsandbytes logs the CPU kernels it did not find. None of
it concerns a learner, and pytest (warnings as errors) would fail on the notice.

>>> with quiet_import():
...     import torchao.float8
>>> torchao.float8.__name__
'torchao.float8'
"""

from __future__ import annotations

import contextlib
import warnings

from labkit.train.logs import logger_level

NOISY_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes")
"""The loggers raised to ERROR while the libraries import."""


@contextlib.contextmanager
def quiet_import():
    """A block in which torchao, torch-optimi and bitsandbytes import quietly: their loggers are
    raised to ERROR (`labkit.train.logs.logger_level`), DeprecationWarnings are ignored, and what
    native code writes to descriptor 2 is dropped (`labkit.hardware.detect.quiet_native_logs`); all
    three are restored on the way out."""
    from labkit.hardware.detect import quiet_native_logs

    with logger_level(NOISY_LOGGERS, "ERROR"), warnings.catch_warnings(), quiet_native_logs(log_level=None):
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


__all__ = ["NOISY_LOGGERS", "quiet_import"]
