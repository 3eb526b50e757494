"""How the notebooks tell nbval which outputs to compare: cell tags, never comments in the code.

A learner reads every line of a code cell; ``# NBVAL_IGNORE_OUTPUT`` there is a test marker in
the lesson. The notebooks carry nbval's *cell tags* instead (``nbval-ignore-output`` on a cell
whose output depends on the machine), which JupyterLab shows only in the cell's metadata.
"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_code_cell_carries_an_nbval_comment(path):
    for i, cell in enumerate(_code_cells(path)):
        for line in "".join(cell["source"]).splitlines():
            assert not (line.strip().startswith("#") and "NBVAL" in line), f"code cell {i}: {line!r}: use a cell tag"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_nbval_tag_is_one_nbval_reads(path):
    from nbval.plugin import metadata_tags

    for i, cell in enumerate(_code_cells(path)):
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag.startswith("nbval") or tag in ("raises-exception",):
                assert tag in metadata_tags, f"code cell {i}: nbval knows no tag {tag!r}"


def test_the_tag_means_what_nbval_says():
    from nbval.plugin import find_metadata_tags

    assert dict(find_metadata_tags({"tags": ["nbval-ignore-output"]})) == {"check": False}
    assert dict(find_metadata_tags({"tags": ["nbval-ignore"]})) == {}  # a misspelt tag is silently nothing


def test_some_cells_are_compared_and_some_are_not():
    tagged = [c for p in NOTEBOOKS for c in _code_cells(p) if "nbval-ignore-output" in c.get("metadata", {}).get("tags", [])]
    total = sum(len(_code_cells(p)) for p in NOTEBOOKS)
    assert 0 < len(tagged) < total / 2  # most of the course is invariant, and compared
