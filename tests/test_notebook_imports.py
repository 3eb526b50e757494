"""Notebooks use labkit's public surface only.

Every code cell of notebooks/*.ipynb is parsed with ``ast`` (nothing is executed, nothing is
imported: each labkit module's ``__all__`` is read from its source) and checked:

* ``from labkit.a.b import name`` needs ``labkit.a.b`` to be a public module and `name` in its
  ``__all__``; a module without ``__all__`` exports nothing.
* ``import labkit.a.b [as z]`` needs ``labkit.a.b`` to be a public module.
* An attribute chain on a labkit module, ``labkit.train.report.run_table`` or ``lf.plots.x``
  after ``import labkit.formats as lf``, is checked link by link by the same two rules, as long
  as the cell has not rebound the name.
* No module path or name may start with ``_``.

The rule for a public module: ``labkit`` is public; below it, a package (a directory with an
``__init__.py``) is public when its parent is public and it declares ``__all__`` (a room such
as ``labkit.train.tf`` is a public surface of its own); a plain module is public only when its
parent package is public and lists it in ``__all__``. So ``from labkit.formats.plots import
plot_bit_layout`` fails unless ``labkit.formats`` lists ``plots``: the notebook writes
``lf.plot_bit_layout``, the name the package exports.
"""

import ast
import json
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABKIT = ROOT / "labkit"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def source_of(module: str) -> Path | None:
    """The file of `module` ("labkit.a.b"): a/b.py or a/b/__init__.py, None if there is none."""
    parts = module.split(".")[1:]
    base = LABKIT.joinpath(*parts)
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@cache
def exported(module: str) -> tuple[str, ...] | None:
    """`module`'s ``__all__``, read from its source (None when it declares none).

    A literal list, tuple or set, where ``*NAME`` may unpack another literal of the module
    (``__all__ = ["formats", *_LAZY]``)."""
    tree = ast.parse(source_of(module).read_text(encoding="utf-8"))
    literals = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}

    def names(value) -> list[str]:
        if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
            return [n for item in value.elts for n in names(item)]
        if isinstance(value, ast.Starred) and isinstance(value.value, ast.Name):
            return names(literals[value.value.id])
        return [ast.literal_eval(value)]

    return tuple(names(literals["__all__"])) if "__all__" in literals else None


@cache
def why_not_public(module: str) -> str | None:
    """None if `module` is public (the rule in this file's docstring), else the reason."""
    if module == "labkit":
        return None
    parent, name = module.rsplit(".", 1)
    path = source_of(module)
    if name.startswith("_"):
        return f"{module} is private (a leading _)"
    if path is None:
        return f"there is no module {module}"
    if (reason := why_not_public(parent)) is not None:
        return reason
    if path.name == "__init__.py" and exported(module) is not None:
        return None
    if name in (exported(parent) or ()):
        return None
    kind = "a package that declares no __all__" if path.name == "__init__.py" else "a module"
    return f"{module} is not public: {parent}.__all__ does not list {name!r} (and it is {kind})"


def why_not_exported(module: str, name: str) -> str | None:
    """None if `module` exports `name` (or `name` is a public submodule), else the reason."""
    if name.startswith("_"):
        return f"{module}.{name} is private (a leading _)"
    if (reason := why_not_public(module)) is not None:
        return reason
    if source_of(f"{module}.{name}") is not None:
        return why_not_public(f"{module}.{name}")
    names = exported(module)
    if names is None:
        return f"{module} declares no __all__, so it exports nothing (wanted {name!r})"
    if name not in names:
        return f"{name!r} is not in {module}.__all__"
    return None


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); None when the chain does not start at a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def _stored_names(node) -> set[str]:
    """The names a statement binds other than through an import (assignments, loops, defs, with ... as)."""
    out = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    out |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    return out


def check_statement(stmt, modules: dict[str, str]) -> list[str]:
    """The problems in one top-level statement; updates `modules` (name -> labkit module bound to it)."""
    problems = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and not isinstance(
                getattr(node, "_parent_attr", None), ast.Attribute):
            chain = _chain(node)
            if chain is None or chain[0] not in modules:
                continue
            module = modules[chain[0]]
            for attr in chain[1]:
                if (reason := why_not_exported(module, attr)) is not None:
                    problems.append(reason)
                    break
                if source_of(f"{module}.{attr}") is None:
                    break  # a name, not a module: what follows is its own attribute
                module = f"{module}.{attr}"
    rebound = _stored_names(stmt)
    for name in rebound:
        modules.pop(name, None)
    for node in ast.walk(stmt):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "labkit":
                    continue
                if (reason := why_not_public(alias.name)) is not None:
                    problems.append(reason)
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    modules["labkit"] = "labkit"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "labkit":
            for alias in node.names:
                if (reason := why_not_exported(node.module, alias.name)) is not None:
                    problems.append(reason)
                bound = alias.asname or alias.name
                if source_of(f"{node.module}.{alias.name}") is not None:
                    modules[bound] = f"{node.module}.{alias.name}"
                else:
                    modules.pop(bound, None)
    return problems


def _mark_parents(tree):
    # so that only the outermost Attribute of a chain is checked
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Attribute):
                child._parent_attr = node


def notebook_problems(path: Path) -> list[str]:
    """Each distinct use of a labkit name past the public surface, with the cells (0-based) it is in."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    modules: dict[str, str] = {}
    where: dict[str, list[int]] = {}
    for number, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        tree = ast.parse(lines)
        _mark_parents(tree)
        for stmt in tree.body:
            for reason in check_statement(stmt, modules):
                cells_with = where.setdefault(reason, [])
                if number not in cells_with:
                    cells_with.append(number)
    return [f"{reason} (cells {', '.join(map(str, numbers))})" for reason, numbers in where.items()]


# -- the rule itself, on made-up cells -----------------------------------------------------------
def problems_of(code: str) -> list[str]:
    tree = ast.parse(code)
    _mark_parents(tree)
    modules: dict[str, str] = {}
    return [reason for stmt in tree.body for reason in check_statement(stmt, modules)]


def test_the_rule_tells_the_public_surface_from_what_lies_past_it():
    assert problems_of("import labkit.formats as lf\nlf.get('bf16')") == []
    assert problems_of("from labkit import scaling\nscaling.simulate") == []
    assert problems_of("from labkit.train import RunConfig, run") == []
    (private,) = problems_of("from labkit import _validate")
    assert "private" in private
    (unlisted,) = problems_of("from labkit.train import not_a_name")
    assert "'not_a_name' is not in labkit.train.__all__" in unlisted
    # a chain through the imported module, and a rebound name that is no longer the module
    (missing,) = problems_of("import labkit.formats as lf\nlf.not_a_name")
    assert missing == "'not_a_name' is not in labkit.formats.__all__"
    assert problems_of("import labkit.formats as lf\nlf = 3\nlf.real") == []
    assert problems_of("import labkit\nlabkit.formats.get('fp16').max") == []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_imports_only_public_labkit_names(notebook):
    problems = notebook_problems(notebook)
    assert not problems, f"{notebook.name} reaches past labkit's public surface:\n" + "\n".join(problems)
