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


def test_the_check_sees_a_marker_with_a_note_after_it():
    line = "# NBVAL_IGNORE_OUTPUT  (timings)"
    assert line.lstrip("#").strip() not in MARKERS
