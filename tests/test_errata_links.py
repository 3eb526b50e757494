"""Every errata entry links to an executed notebook cell that demonstrates it.

`notebooks/errata.md` lists where the seeds are wrong. Its last column holds links such as
``[04](04_pytorch_amp.ipynb#errata-safe-layernorm)``: the notebook, and the id of the code
cell whose stored output shows the correction. That cell also names itself in its first
line (``# errata-safe-layernorm``), so a reader finds it with the notebook's search.
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ERRATA = NOTEBOOKS / "errata.md"
LINK = re.compile(r"\[(\d\d)\]\(((\d\d)_[a-z0-9_]+\.ipynb)#(errata-[a-z0-9-]+)\)")


def entries() -> list[tuple[str, str]]:
    """(claim, last column) for every body row of every table in errata.md."""
    rows = []
    for line in ERRATA.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[-1] == "shown in":
            continue
        rows.append((cells[-3], cells[-1]))
    return rows


def cells_by_id(name: str) -> dict[str, dict]:
    nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    return {cell.get("id"): cell for cell in nb["cells"]}


def test_the_errata_page_has_its_tables():
    assert len(entries()) >= 30


@pytest.mark.parametrize("claim, shown", entries(), ids=lambda v: v[:40])
def test_every_entry_links_only_to_executed_cells_that_name_themselves(claim, shown):
    links = LINK.findall(shown)
    assert links, f"no notebook link in the 'shown in' column of {claim!r}"
    assert LINK.sub("", shown).replace(",", "").strip() == "", f"text besides links: {shown!r}"
    for label, name, prefix, cell_id in links:
        assert label == prefix, f"link text {label} names another notebook than {name}"
        assert (NOTEBOOKS / name).exists(), name
        cell = cells_by_id(name).get(cell_id)
        assert cell is not None, f"{name} has no cell with id {cell_id}"
        assert cell["cell_type"] == "code", f"{name}#{cell_id} is not a code cell"
        assert cell["execution_count"] is not None and cell["outputs"], (
            f"{name}#{cell_id} was not executed, or shows nothing")
        assert not any(o["output_type"] == "error" for o in cell["outputs"]), f"{name}#{cell_id} errored"
        first = "".join(cell["source"]).splitlines()[0]
        assert first.strip() == f"# {cell_id}", f"{name}#{cell_id} starts with {first!r}"


def test_every_errata_cell_in_the_notebooks_is_linked_from_the_page():
    linked = {(name, cell_id) for _, shown in entries() for _, name, _, cell_id in LINK.findall(shown)}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell_id in cells_by_id(path.name):
            if cell_id and cell_id.startswith("errata-"):
                assert (path.name, cell_id) in linked, f"{path.name}#{cell_id} is linked from no entry"
