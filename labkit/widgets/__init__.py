"""Interactive views (ipywidgets) over pure labkit functions.

Each widget is a thin layer: what it shows is computed by a function that does not
import ipywidgets and is tested on its own (e.g. `explorer_view` for `FormatExplorer`).
The widgets load on first use, so that the pure modules (``labkit.widgets.parse``, the
one parser of what a learner types, used by ``labkit.scaling.playground`` too) import
without ipywidgets.
"""

import importlib

# what FormatExplorer shows, as text (no ipywidgets); imported here, so that the name is the function
# and not its module of the same name
from labkit.widgets.explorer_view import explorer_view

_WIDGETS = {
    "BlockExplorer": "labkit.widgets.blocks",
    "FormatExplorer": "labkit.widgets.explorer",
    "LossScaleExplorer": "labkit.widgets.scaling",
    "ScalerPlayground": "labkit.widgets.scaling",
}


def __getattr__(name):
    if name in _WIDGETS:
        return getattr(importlib.import_module(_WIDGETS[name]), name)
    raise AttributeError(f"module 'labkit.widgets' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_WIDGETS])


__all__ = [
    "BlockExplorer",
    "FormatExplorer",
    "LossScaleExplorer",
    "ScalerPlayground",
    "explorer_view",
]
