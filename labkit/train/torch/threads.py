"""PyTorch on one thread for a block: the small runs of the clinic, the AMP recipe and the underflow lesson.

Their tensors are tiny, so threads gain nothing, and on a busy machine each op's threads wait for
cores (a clinic case that takes 0.1 s alone took 5 s on two threads of a loaded 2-core machine); one
thread also makes a run repeat itself on one machine. `one_thread` sets the count and puts it back.

>>> import torch
>>> before = torch.get_num_threads()
>>> with one_thread():
...     torch.get_num_threads()
1
>>> torch.get_num_threads() == before
True
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """PyTorch on one thread inside (``torch.set_num_threads(1)``), its thread count restored after,
    also when the block raises."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


__all__ = ["one_thread"]
