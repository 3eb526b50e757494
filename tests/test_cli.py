"""The ``labkit`` command line: ``--version`` and ``doctor``, run in-process and installed."""

import argparse
import importlib.metadata
import json
import re
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


# -- labkit bench: a bad flag fails at once, in one line, before any framework loads (issue 12) -------
@pytest.mark.parametrize("flags, words", [
    (["--batch-size", "0"], "argument --batch-size: must be a whole number >= 1; got 0"),  # was: the default
    (["--width", "0"], "argument --width: must be a whole number >= 1; got 0"),  # was: the default
    (["--width", "2.5"], "argument --width: must be a whole number >= 1; got '2.5'"),
    (["--steps", "0"], "argument --steps: must be a whole number >= 1"),
    (["--warmup", "-1"], "argument --warmup: must be a whole number >= 0"),
    (["--max-seconds", "0"], "argument --max-seconds: must be a finite number of seconds > 0"),
    (["--max-seconds", "nan"], "argument --max-seconds: must be a finite number of seconds > 0"),
    (["--device", "gpu0"], "argument --device: invalid choice: 'gpu0'"),
])
def test_bench_refuses_a_bad_number_or_choice_as_argparse_does(flags, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", *flags])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"labkit bench: error: {words}")


def _bad_paths(tmp_path):
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "file").write_text("")
    return [
        (["--json", str(tmp_path / "no" / "b.json")], "--json .*: its folder .* does not exist"),
        (["--json", str(tmp_path / "folder.json")], "--json .* is a directory"),
        (["--json", str(tmp_path / "file" / "b.json")], "--json .*: its folder .* does not exist or is not a folder"),
        (["--json", ""], "--json must be a non-empty file path"),
        (["--plot", str(tmp_path / "b.xyz")], "--plot .* must end in one of .*\\.png"),
        (["--plot", str(tmp_path / "no" / "b.png")], "--plot .*: its folder .* does not exist"),
        (["--odd-sizes", "--batch-size", "1"], "odd sizes also run batch size - 1 .* need a batch size of 2"),
        (["--model", "mlp,transformer", "--width", "6"], "transformer width must be a multiple of 4"),
        (["--framework", "torch,mxnet"], "unknown framework 'mxnet'"),
    ]


def test_bench_refuses_bad_paths_and_sizes_before_it_runs_a_cell(tmp_path, capsys):
    for flags, words in _bad_paths(tmp_path):
        assert cli.main(["bench", *flags]) == 2, flags
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, (flags, err)  # no traceback, no cell
        assert re.match(f"labkit bench: error: {words}", err), (flags, err)


def test_a_bad_bench_command_loads_no_framework_and_shows_no_traceback(tmp_path):
    code = ("import sys; from labkit import cli; rc = cli.main(sys.argv[1:]); "
            "print(rc, [m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules])")
    for flags in (["--plot", str(tmp_path / "b.xyz")], ["--odd-sizes", "--batch-size", "1"]):
        out = subprocess.run([sys.executable, "-c", code, "bench", *flags], capture_output=True, text=True)
        assert out.stdout.strip() == "2 []" and "Traceback" not in out.stderr, (flags, out)


def test_the_run_functions_refuse_what_is_not_a_parsed_command_line():
    with pytest.raises(TypeError, match="argv must be a list of strings"):
        cli.main("doctor")  # not ["d", "o", ...]
    with pytest.raises(TypeError, match="args must be the parsed command line"):
        cli.run_bench(None)
    with pytest.raises(ValueError, match="args lacks --frameworks, --json"):
        cli.run_doctor(argparse.Namespace())
    with pytest.raises(TypeError, match="subparsers must be what ArgumentParser.add_subparsers"):
        cli.add_bench(None)
