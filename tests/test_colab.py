"""labkit.colab: the setup cell is run for real, with and without a stand-in
``google.colab`` module, and with a recording stand-in for the pip call (no network)."""

import ast
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from labkit import colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
COURSE = ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11")  # the plan in DESIGN.md


class RecordingPip:
    """Stands in for ``subprocess.check_call``: records each command and the constraints
    file's text at the moment of the call (the cell deletes the file afterwards)."""

    def __init__(self, fail=False):
        self.calls, self.constraints, self.fail = [], [], fail

    def __call__(self, cmd, *args, **kwargs):
        self.calls.append(list(cmd))
        path = cmd[cmd.index("-c") + 1]
        self.constraints.append(Path(path).read_text())
        if self.fail:
            raise subprocess.CalledProcessError(1, cmd)
        return 0


@pytest.fixture
def pip(monkeypatch):
    recorder = RecordingPip()
    monkeypatch.setattr(subprocess, "check_call", recorder)
    return recorder


@pytest.fixture
def module_versions():
    """numpy's, torch's and jax's own ``__version__``, read before ``google.colab`` is faked
    (jax looks for that module when it is imported)."""
    versions = {}
    for name in ("numpy", "torch", "jax"):
        if importlib.util.find_spec(name):
            versions[name] = importlib.import_module(name).__version__
    return versions


@pytest.fixture
def on_colab(monkeypatch):
    """A stand-in ``google.colab`` module, which is what marks a Colab runtime."""
    if importlib.util.find_spec("google") is None:
        google = types.ModuleType("google")
        google.__path__ = []
        monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))


def run_cell():
    namespace = {}
    exec(compile(colab.SETUP_CELL, "<setup cell>", "exec"), namespace)
    return namespace


def installed(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------ the setup cell


def test_setup_cell_is_self_contained_python_that_never_imports_labkit():
    tree = ast.parse(colab.SETUP_CELL)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "labkit" not in imported
    assert f'repo="{colab.REPO_URL}"' in colab.SETUP_CELL
    assert colab.SETUP_CELL == colab.SETUP_CELL.strip()


def test_setup_cell_elsewhere_does_nothing_and_leaves_no_names(pip, capsys):
    assert not colab.on_colab()
    namespace = run_cell()
    assert pip.calls == []
    assert capsys.readouterr() == ("", "")
    assert set(namespace) == {"__builtins__"}


def test_setup_cell_on_colab_installs_labkit_keeping_the_frameworks(module_versions, on_colab, pip, capsys):
    assert colab.on_colab()
    namespace = run_cell()
    assert set(namespace) == {"__builtins__"}
    [cmd] = pip.calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and "-q" in cmd
    extras = ",".join(e for e, d in [("torch", "torch"), ("jax", "jax"), ("tf", "tensorflow")] if installed(d))
    extras += ",lowp" if installed("torch") else ""
    requirement = f"labkit[{extras}]" if extras else "labkit"
    assert cmd[-1] == f"{requirement} @ git+{colab.REPO_URL}"
    pins = dict(line.split("==") for line in pip.constraints[0].splitlines())
    assert pins == {d: installed(d) for d in colab.KEEP if installed(d)}
    assert {name: pins[name] for name in module_versions} == module_versions
    assert not Path(cmd[cmd.index("-c") + 1]).exists()  # the constraints file is cleaned up
    out = capsys.readouterr().out
    assert f"Installing {cmd[-1]}; keeping" in out and "labkit" in out.splitlines()[-1]


def test_setup_cell_on_colab_reports_a_failed_pip_and_still_cleans_up(on_colab, monkeypatch):
    failing = RecordingPip(fail=True)
    monkeypatch.setattr(subprocess, "check_call", failing)
    with pytest.raises(subprocess.CalledProcessError):
        run_cell()
    cmd = failing.calls[0]
    assert not os.path.exists(cmd[cmd.index("-c") + 1])


# ----------------------------------------------------------------------- the badge


def test_badge_links_colab_to_the_notebook_in_the_repository():
    url = "https://colab.research.google.com/github/labkit-course/labkit/blob/main/notebooks/00_start_here.ipynb"
    assert colab.REPO_URL == "https://github.com/labkit-course/labkit"
    assert colab.colab_url("00_start_here.ipynb") == url
    badge = colab.badge(Path("notebooks") / "00_start_here.ipynb")
    assert badge == f"[![Open In Colab]({colab.BADGE_IMAGE})]({url})"


@pytest.mark.parametrize("bad, error", [
    ("start_here.ipynb", ValueError), ("00_start_here.py", ValueError), ("00_Start Here.ipynb", ValueError),
    (0, TypeError), (None, TypeError),
])
def test_badge_refuses_what_is_not_a_course_notebook_name(bad, error):
    with pytest.raises(error, match="00_start_here.ipynb|file name or path"):
        colab.badge(bad)


def test_the_repository_url_is_written_in_one_place():
    hits = [p.relative_to(ROOT).as_posix() for p in (ROOT / "labkit").rglob("*.py")
            if "labkit-course/labkit" in p.read_text(encoding="utf-8")]
    assert hits == ["labkit/colab.py"]


# ------------------------------------------------------------ every notebook has both


def notebooks_numbered(number):
    return sorted(NOTEBOOKS.glob(f"{number}_*.ipynb"))


NUMBERS = sorted(set(COURSE) | {p.name[:2] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")})


def cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        source = cell["source"]
        yield cell["cell_type"], "".join(source) if isinstance(source, list) else source


@pytest.mark.parametrize("number", NUMBERS)
def test_notebook_starts_with_the_setup_cell_and_its_own_badge(number):
    paths = notebooks_numbered(number)
    if not paths:
        pytest.skip(f"notebook {number} is not written yet")
    for path in paths:
        all_cells = list(cells(path))
        code = next((src for kind, src in all_cells if kind == "code"), None)
        assert code == colab.SETUP_CELL, f"{path.name}: the first code cell must be labkit.colab.SETUP_CELL"
        markdown = next((src for kind, src in all_cells if kind == "markdown"), "")
        assert colab.badge(path.name) in markdown, f"{path.name}: its first markdown cell needs colab.badge()"
