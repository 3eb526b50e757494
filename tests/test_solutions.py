"""The solutions notebook: every registered exercise worked once, in course order, and checked right.

Read from the stored notebook (nothing is executed here; nbval re-runs it): each code cell is parsed
with ``ast`` for ``check("id", answer)`` calls, and the stored output of each such cell must be
``✓ right``. An exercise registered without a worked solution fails here.
"""

import ast
from collections import Counter
from pathlib import Path

from _notebooks import calls, code_cells, exercise_id

from labkit.exercises import EXERCISES

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "99_solutions.ipynb"


def checked() -> list[tuple[str, str]]:
    """(id, stored plain-text output) of every check(...) call, in notebook order."""
    out = []
    for source, outputs in code_cells(NOTEBOOK):
        text = "".join("".join(o.get("data", {}).get("text/plain", "")) + "".join(o.get("text", ""))
                       for o in outputs)
        out += [(exercise_id(call), text) for call in calls(source, "check")]
    return out


def test_every_registered_exercise_is_solved_exactly_once():
    counts = Counter(ex_id for ex_id, _ in checked())
    assert not set(counts) - set(EXERCISES), f"unknown exercises checked: {sorted(set(counts) - set(EXERCISES))}"
    missing = [ex_id for ex_id in EXERCISES if ex_id not in counts]
    assert not missing, f"exercises without a worked solution in {NOTEBOOK.name}: {missing}"
    assert [ex_id for ex_id, n in counts.items() if n > 1] == []


def test_every_stored_check_says_right():
    for ex_id, text in checked():
        assert text.startswith(f"✓ right ({ex_id})"), f"{ex_id}: stored output {text!r}"


def test_every_solution_shows_its_question_first():
    shown = [exercise_id(call) for source, _ in code_cells(NOTEBOOK) for call in calls(source, "show")]
    assert shown == [ex_id for ex_id, _ in checked()]


def test_the_solutions_follow_the_course_order():
    first = [EXERCISES[ex_id].notebooks[0] for ex_id, _ in checked()]
    assert first == sorted(first), "one section per notebook, in course order (an exercise under its first notebook)"


def test_no_solution_reads_the_key():
    """Answers are computed as a learner would: never with an exercise's own solve() or its registry entry."""
    for source, _ in code_cells(NOTEBOOK):
        tree = ast.parse(source)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & {"EXERCISES", "AMP_ORDER", "get"}, source
        assert not attributes & {"solve", "judge", "EXERCISES", "AMP_ORDER"}, source

