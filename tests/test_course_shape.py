"""Every lesson opens with what the learner will be able to do and ends with exercises they check
themselves (issue 15): 3-5 numbered objectives in the first markdown cell, 2-4 exercises whose
stored ``check`` holds the ``None`` placeholder (so the stored notebook gives no answer away), and
the registry and the notebooks agree on which exercise belongs where."""

import ast
import re
from pathlib import Path

import pytest
from _notebooks import calls, cells, code_cells, exercise_id, source

from labkit.exercises import EXERCISES

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("99_"))


def _calls(path: Path, name: str) -> list[tuple]:
    """(exercise id, answer node) of each ``name("id", ...)`` call in the notebook's code cells, in order."""
    return [(exercise_id(c), c.args[1] if len(c.args) > 1 else None)
            for code, _ in code_cells(path) for c in calls(code, name)]


def test_every_lesson_is_found():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(len(LESSONS))] and len(LESSONS) >= 12


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_the_lesson_opens_with_three_to_five_objectives(path):
    first = next(source(c) for c in cells(path) if c["cell_type"] == "markdown")
    assert first.startswith("# ") and "**In this notebook you will**" in first, path.name
    after = first.split("**In this notebook you will**", 1)[1]
    items = re.findall(r"(?m)^(\d+)\. ", after)
    assert 3 <= len(items) <= 5 and items == [str(i) for i in range(1, len(items) + 1)], items


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_the_lesson_ends_with_two_to_four_exercises_that_store_the_placeholder(path):
    checks, shows = _calls(path, "check"), _calls(path, "show")
    assert 2 <= len(checks) <= 4, f"{path.name}: {len(checks)} exercises"
    assert [i for i, _ in shows] == [i for i, _ in checks], "each check follows its show, in the same order"
    for ex_id, answer in checks:
        assert isinstance(answer, ast.Constant) and answer.value is None, f"{ex_id}: store check({ex_id!r}, None)"
    assert any(re.search(r"(?m)^## Exercises", source(c)) for c in cells(path) if c["cell_type"] == "markdown")


def test_the_registry_and_the_lessons_agree_on_where_each_exercise_is():
    placed = {p.name[:2]: {i for i, _ in _calls(p, "check")} for p in LESSONS}
    for ex_id, ex in EXERCISES.items():
        for number in ex.notebooks:
            assert ex_id in placed.get(number, set()), f"{ex_id} is registered for {number} but not placed there"
    for number, ids in placed.items():
        for ex_id in ids:
            assert number in EXERCISES[ex_id].notebooks, f"{ex_id} is placed in {number} but registered for " \
                                                         f"{EXERCISES[ex_id].notebooks}"
