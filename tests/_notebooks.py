"""Reading stored notebooks in tests without executing them: their code cells and the calls in them."""

import ast
import json
from pathlib import Path


def cells(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def code_cells(path: Path):
    """(source, stored outputs) of each code cell, in order."""
    for cell in cells(path):
        if cell["cell_type"] == "code":
            yield source(cell), cell.get("outputs", [])


def calls(code: str, name: str) -> list[ast.Call]:
    """The calls of the bare function `name` in a cell (IPython magics would not parse: the course has none)."""
    return [node for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name]


def exercise_id(call: ast.Call) -> str:
    """The exercise a ``check(...)``/``show(...)`` call names; it must be a string literal, so that the
    tests can see which exercise a cell is about without running it."""
    first = call.args[0] if call.args else None
    assert isinstance(first, ast.Constant) and isinstance(first.value, str), \
        f"{ast.unparse(call)}: name the exercise with a string literal"
    return first.value
