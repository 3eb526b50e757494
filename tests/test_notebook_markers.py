"""nbval reads a marker only when the comment line is the marker and nothing else
(``# NBVAL_IGNORE_OUTPUT``); a note after it on the same line silently turns it off."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MARKERS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_nbval_marker_is_alone_on_its_line(path):
    cells = json.loads(path.read_text())["cells"]
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        for line in "".join(cell["source"]).splitlines():
            stripped = line.strip()
            if stripped.startswith("#") and "NBVAL" in stripped:
                assert stripped.lstrip("#").strip() in MARKERS, f"code cell {i}: {line!r}"


def test_the_rule_is_nbvals_own():
    from nbval.plugin import find_comment_markers

    assert dict(find_comment_markers("# NBVAL_IGNORE_OUTPUT\nx = 1")) == {"check": False}
    assert dict(find_comment_markers("# NBVAL_IGNORE_OUTPUT  (timings)\nx = 1")) == {}
