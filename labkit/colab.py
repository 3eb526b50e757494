"""Google Colab: the "Open in Colab" badge and the setup cell every notebook starts with.

Colab runs a notebook straight from GitHub, without labkit. So the first code cell of
every notebook is `SETUP_CELL`: self-contained code (it cannot ``import labkit``, which is
not there yet) that, **on Colab only**, installs labkit from `REPO_URL` with pip. Colab
already has torch, jax and tensorflow, built for its GPU or TPU; a constraints file pins
them, with numpy, at the installed versions so pip keeps them rather than downloading
others. Anywhere else the cell does nothing: locally, ``make lab`` has installed labkit.

`REPO_URL` is the one constant that holds the repository's address; the badges and the
setup cell are built from it. The project has no public address yet, so
``https://github.com/labkit-course/labkit`` stands in for it. When it changes, rebuild the
notebooks' first cells: ``tests/test_colab.py`` fails until every notebook matches.

>>> print(badge("00_start_here.ipynb"))  # doctest: +NORMALIZE_WHITESPACE
[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/labkit-course/labkit/blob/main/notebooks/00_start_here.ipynb)
"""

from __future__ import annotations

import os
import re
from pathlib import PurePath

REPO_URL = "https://github.com/labkit-course/labkit"
"""The project's repository. A stand-in until the project has a public address."""

BRANCH = "main"
NOTEBOOK_DIR = "notebooks"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"

KEEP = ("numpy", "torch", "jax", "jaxlib", "tensorflow", "keras")
"""Distributions the setup cell pins at Colab's installed versions, so pip leaves them be."""

_NOTEBOOK_NAME = re.compile(r"\d\d_[a-z0-9_]+\.ipynb")

_SETUP_TEMPLATE = '''\
# Setup: on Google Colab, install labkit and keep Colab's own numpy, torch, jax and
# tensorflow (a pip constraints file pins their versions). Elsewhere this does nothing.
def _labkit_colab_setup(repo="{repo}"):
    try:
        import google.colab  # noqa: F401  (importable on Colab only)
    except ImportError:
        return
    import importlib, importlib.metadata, os, subprocess, sys, tempfile
    pins = {{}}
    for dist in {keep!r}:
        try:
            pins[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    extras = ",".join(e for e in ("torch", "jax", "tf") if {{"tf": "tensorflow"}}.get(e, e) in pins)
    extras += ",lowp" if "torch" in pins else ""  # torchao, torch-optimi, bitsandbytes (notebooks 09-10)
    spec = f"labkit[{{extras}}] @ git+{{repo}}" if extras else f"labkit @ git+{{repo}}"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("".join(f"{{d}}=={{v}}\\n" for d, v in pins.items()))
    print(f"Installing {{spec}}; keeping", ", ".join(f"{{d}} {{v}}" for d, v in pins.items()))
    try:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "-c", constraints.name, spec])
    finally:
        os.remove(constraints.name)
    importlib.invalidate_caches()
    print("labkit", importlib.metadata.version("labkit"), "is installed.")


_labkit_colab_setup()
del _labkit_colab_setup'''

SETUP_CELL = _SETUP_TEMPLATE.format(repo=REPO_URL, keep=KEEP)
"""The source of the first code cell of every notebook, exactly (no trailing newline).

On Colab it runs ``pip install -q -c CONSTRAINTS "labkit[torch,jax,tf,lowp] @ git+REPO_URL"``,
naming only the extras whose framework Colab has (``lowp``, the libraries below 8 bits, where
it has torch), with CONSTRAINTS pinning `KEEP`;
elsewhere it returns at once, prints nothing and leaves no names behind.
"""


def on_colab() -> bool:
    """True inside a Google Colab runtime (where ``google.colab`` can be imported)."""
    try:
        import google.colab  # noqa: F401
    except ImportError:
        return False
    return True


def _notebook_name(notebook) -> str:
    if not isinstance(notebook, (str, os.PathLike)):
        raise TypeError(f"notebook must be a file name or path, not {type(notebook).__name__}")
    name = PurePath(notebook).name
    if not _NOTEBOOK_NAME.fullmatch(name):
        raise ValueError(f"notebook must be named like '00_start_here.ipynb' (two digits, an "
                         f"underscore, lower-case words, .ipynb), not {name!r}")
    return name


def colab_url(notebook) -> str:
    """Where Colab opens ``notebook`` (a name such as ``"00_start_here.ipynb"`` or a path)."""
    repo = REPO_URL.removeprefix("https://github.com/")
    name = _notebook_name(notebook)
    return f"https://colab.research.google.com/github/{repo}/blob/{BRANCH}/{NOTEBOOK_DIR}/{name}"


def badge(notebook) -> str:
    """The "Open in Colab" markdown badge for ``notebook``; each notebook's first markdown
    cell carries its own."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(notebook)})"


__all__ = ["badge", "colab_url", "on_colab"]
