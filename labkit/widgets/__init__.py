"""Interactive views (ipywidgets) over pure labkit functions.

Each widget is a thin layer: what it shows is computed by a function that does not
import ipywidgets and is tested on its own (e.g. `explorer_view` for `FormatExplorer`).
"""

from labkit.widgets.explorer import FormatExplorer
from labkit.widgets.scaling import LossScaleExplorer, ScalerPlayground

__all__ = [
    "FormatExplorer",
    "LossScaleExplorer",
    "ScalerPlayground",
]
