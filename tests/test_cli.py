"""The ``labkit`` command line: ``--version`` and ``doctor``, run in-process and installed."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

import labkit
from labkit import cli, hardware


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"labkit {labkit.__version__}"


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_doctor_without_frameworks_prints_devices_and_the_advice(capsys):
    assert cli.main(["doctor", "--frameworks", "none"]) == 0
    out = capsys.readouterr().out
    report = hardware.detect(frameworks=())
    assert hardware.format_report(report) == out.rstrip("\n")
    assert "Advice      " + hardware.advise(report).headline in out
    for f in report.frameworks:
        assert f"  {f.name:<11} " + ("not installed" if f.version is None else f"{f.version} (not probed)") in out


def test_doctor_json_probes_the_frameworks_asked_for(capsys):
    torch = pytest.importorskip("torch")
    assert cli.main(["doctor", "--frameworks", "torch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    frameworks = {f["name"]: f for f in data["report"]["frameworks"]}
    assert frameworks["torch"]["probed"]
    assert frameworks["torch"]["version"].split("+")[0] == torch.__version__.split("+")[0]
    assert not frameworks["jax"]["probed"] and not frameworks["tensorflow"]["probed"]
    advice = hardware.advise(hardware.detect(frameworks=["torch"]))
    assert (data["advice"]["precision"], data["advice"]["headline"]) == (advice.precision, advice.headline)


def test_doctor_refuses_an_unknown_framework_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["doctor", "--frameworks", "torch,pytorch"])
    assert exit_.value.code == 2
    assert "choose from torch, jax, tensorflow" in capsys.readouterr().err


def test_frameworks_option_accepts_tf_and_spaces():
    args = cli.build_parser().parse_args(["doctor", "--frameworks", " torch , tf"])
    assert args.frameworks == ("torch", "tensorflow") and args.func is cli.run_doctor


def test_every_command_registers_a_subcommand_with_a_runner():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert list(subparsers.choices) == ["doctor", "bench"] == [add.__name__.removeprefix("add_") for add in cli.COMMANDS]
    assert [p.get_default("func") for p in subparsers.choices.values()] == [cli.run_doctor, cli.run_bench]


def test_the_console_script_is_installed_and_runs_as_a_module():
    [script] = importlib.metadata.entry_points(group="console_scripts", name="labkit")
    assert script.value == "labkit.cli:main" and script.load() is cli.main
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "--version"], capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, f"labkit {labkit.__version__}")
