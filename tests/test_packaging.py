"""The install story: pyproject, environment.yml, the README's two commands and CI agree."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}  # conda-forge calls a few packages differently


def requirement_map(reqs):
    out = {}
    for req in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", req.strip())
        name = m.group(1).lower().replace("_", "-")
        if name != "labkit":
            out[name] = m.group(3).replace(" ", "")
    return out


# installed on request only (GPU-oriented, heavy); CI adds them through EXTRAS
OPTIONAL_EXTRAS = ("deepspeed",)


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_lists_every_pyproject_requirement_with_the_same_bounds():
    project = pyproject()["project"]
    wanted = requirement_map(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if name not in OPTIONAL_EXTRAS:
            wanted.update(requirement_map(extra))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    have = requirement_map([d for d in conda if not d.startswith(("python", "pip"))])
    have.update(requirement_map([d for d in pip if not d.startswith("-e")]))
    have = {({v: k for k, v in CONDA_NAMES.items()}).get(k, k): v for k, v in have.items()}
    assert have == wanted
    assert "-e ." in pip  # and labkit itself


def test_optional_extras_stay_out_of_all_and_the_environment_and_the_readme_says_how_to_add_them():
    extras = pyproject()["project"]["optional-dependencies"]
    assert set(OPTIONAL_EXTRAS) <= set(extras)
    env = (ROOT / "environment.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in OPTIONAL_EXTRAS:
        assert name not in " ".join(extras["all"])
        for req in requirement_map(extras[name]):
            assert req not in env
        assert f"labkit[{name}]" in readme or f".[{name}]" in readme


def test_all_extra_covers_every_framework_and_the_lab():
    extras = pyproject()["project"]["optional-dependencies"]
    assert set(extras) >= {"torch", "jax", "tf", "lab", "lowp", "test", "all"}
    assert re.search(r"labkit\[torch,jax,tf,lab,lowp\]", " ".join(extras["all"]))


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make lab", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_lab_command_listens_on_localhost_and_keeps_the_token():
    makefile = (ROOT / "Makefile").read_text()
    lab = re.search(r"^lab:.*\n\t(.*)$", makefile, re.M).group(1)
    assert "--ServerApp.ip=127.0.0.1" in lab
    assert "token" not in lab.lower() and "password" not in lab.lower()
    assert "allow_origin" not in lab and "0.0.0.0" not in makefile


# the import-light core (DESIGN.md, principle 3): numpy, ml_dtypes, matplotlib, ipywidgets, never a framework
CORE = ("labkit.formats", "labkit.scaling", "labkit.memory", "labkit.hardware", "labkit.widgets", "labkit.table",
        "labkit.exercises", "labkit.diagrams")
FRAMEWORK_PACKAGES = ("torch", "jax", "jaxlib", "flax", "optax", "jmp", "tensorflow", "keras", "tf_keras", "deepspeed",
                      "torchao", "optimi", "bitsandbytes", "gfloat")
_IMPORT_CORE = """
import importlib, json, pkgutil, sys
heavy = lambda: sorted(m for m in sys.modules if m.split(".")[0] in {frameworks})
blamed = {{}}
def load(module):
    seen = set(heavy())
    loaded = importlib.import_module(module)
    if set(heavy()) - seen:
        blamed[module] = sorted(set(heavy()) - seen)[:5]
    return loaded
load("labkit")  # the package itself only: its frameworks' rooms are not core
for name in {core}:
    package = load(name)
    for sub in pkgutil.walk_packages(getattr(package, "__path__", []), name + "."):
        load(sub.name)
print(json.dumps(blamed))
"""


def test_the_core_imports_no_framework():
    """``import labkit`` and every module of the core packages, imported in one fresh process, import
    no framework; a framework that appears is blamed on the module whose import brought it in."""
    import json
    import subprocess
    import sys

    code = _IMPORT_CORE.format(frameworks=set(FRAMEWORK_PACKAGES), core=CORE)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    blamed = json.loads(out.stdout.strip().splitlines()[-1])
    assert blamed == {}, f"these core modules import a framework (module: first framework modules): {blamed}"


def test_the_wheel_ships_the_stored_evidence(tmp_path):
    """Colab installs labkit from git, not editable: the evidence files must be in the wheel."""
    import subprocess
    import sys
    import zipfile

    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("labkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    stored = {f"labkit/evidence/stored/{p.name}" for p in (ROOT / "labkit/evidence/stored").iterdir()}
    assert "labkit/evidence/stored/README.md" in stored and stored <= names


def test_make_test_runs_every_notebook_once_and_the_portable_check():
    """`make test` splits nbval over its two lanes: together they must cover every notebook, once."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    nbval_lines = [line for line in plan.splitlines() if "--nbval" in line]
    run = [nb for line in nbval_lines for nb in re.findall(r"notebooks/\S+\.ipynb", line)]
    assert sorted(run) == sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(run) == len(set(run)) and len(nbval_lines) == 2
    assert "scripts/portable_check.py" in plan and "pytest tests" in plan


def test_doctest_collection_leaves_out_only_modules_whose_framework_is_missing(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("repo_conftest", ROOT / "conftest.py")
    repo_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repo_conftest)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    ignore = lambda rel: repo_conftest.pytest_ignore_collect(ROOT / rel, None)  # noqa: E731
    assert ignore("labkit/train/torch/stepper.py") is True
    assert ignore("labkit/train/torch/__init__.py") is True  # a room needs its framework, its __init__ too
    assert ignore("labkit/train/config.py") is None
    assert ignore("labkit/formats/spec.py") is None and ignore("labkit/train/jax/stepper.py") is None
    assert ignore("tests/train/test_torch_runner.py") is None  # tests skip themselves


def test_jax_is_strict_in_the_tests_and_default_in_the_notebooks(monkeypatch):
    """The root conftest makes JAX's dtype promotion strict for tests, not for nbval's kernels
    (a notebook runs as a learner runs it: optax's Adam and Flax's LayerNorm promote by design)."""
    import importlib.util
    import os
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("repo_conftest_strict", ROOT / "conftest.py")
    repo_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repo_conftest)
    monkeypatch.delenv("JAX_NUMPY_DTYPE_PROMOTION", raising=False)
    repo_conftest.pytest_configure(SimpleNamespace(option=SimpleNamespace(nbval=True, nbval_lax=False)))
    assert "JAX_NUMPY_DTYPE_PROMOTION" not in os.environ
    repo_conftest.pytest_configure(SimpleNamespace(option=SimpleNamespace()))
    assert os.environ["JAX_NUMPY_DTYPE_PROMOTION"] == "strict"
