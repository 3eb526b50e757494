"""labkit.evidence: the stored-measurements format, read from made-up fixtures and written for real."""

import json
import shutil
from pathlib import Path

import pytest

from labkit import evidence

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def folder(tmp_path):
    for name in ("evidence_gpu.json", "evidence_cpu.json"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    return tmp_path


def test_stored_reads_every_document_oldest_first_and_tells_accelerators_from_cpus(folder):
    cpu, gpu = evidence.stored(folder)
    assert (cpu.accelerator, gpu.accelerator) == (False, True)
    assert gpu.label == ("Example GPU (test fixture, not a measurement) (compute capability 9.0), driver 999.99, "
                         "CUDA 12.9; torch 2.13.0; 2026-01-02")
    assert cpu.label.startswith("CPU Example CPU without bf16 (test fixture) (2 cores, no bf16 instructions)")


def test_the_summary_names_the_machines_or_says_there_is_none(folder):
    assert evidence.summary([]).startswith("No accelerator evidence is stored with this copy of the course")
    text = evidence.summary(evidence.stored(folder))
    assert text.splitlines()[0].startswith("Stored accelerator evidence: Example GPU")
    assert text.splitlines()[1].startswith("Stored CPU references: 1 document(s) from CPU Example CPU")
    only_cpu = [e for e in evidence.stored(folder) if not e.accelerator]
    assert evidence.summary(only_cpu).startswith("No accelerator evidence")


def test_the_reference_table_labels_every_row_with_its_machine(folder):
    t = evidence.reference_table(evidence.stored(folder), models=["mlp"])
    assert t.title.startswith("Reference rows, measured on other machines (stored evidence): A = CPU Example CPU")
    assert "; B = Example GPU (test fixture, not a measurement)" in t.title
    assert t.column("machine") == ["A", "A", "B", "B", "B"]
    assert t.column("vs fp32") == ["1.00x", "40x slower (emulated, batch 64)", "1.00x", "4.00x", "skipped"]
    assert t.column("ms/step")[:4] == ["100.00", "-", "4.00", "1.00"]
    assert evidence.reference_table([]).title.endswith("none stored")
    assert evidence.reference_table(evidence.stored(folder), precisions=["bf16"]).column("precision") == ["bf16"] * 2


def test_the_shipped_folder_holds_only_valid_documents():
    for e in evidence.stored():  # an empty folder is valid too: the summary then says so
        assert e.doc["format"] == evidence.FORMAT and e.records
    assert (evidence.STORED / "README.md").read_text().count("labkit-evidence") >= 1


def test_write_then_load_round_trips_a_real_document(tmp_path):
    doc = evidence.document("bench", [], command="labkit bench", complete=False)
    machine = doc["machine"]
    assert {"system", "cpu", "cores", "cpu_16bit", "isa_caps", "gpus", "driver", "cuda", "tpus"} <= set(machine)
    assert doc["versions"]["labkit"] and doc["date"].endswith("+00:00")
    evidence.write(tmp_path / "e.json", doc)
    assert evidence.load(tmp_path / "e.json").doc == json.loads(json.dumps(doc))
    assert [p.name for p in tmp_path.iterdir()] == ["e.json"]  # no temporary file left behind


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("records"), "missing records"),
    (lambda d: d.update(version=2), "version 2; this labkit reads 'labkit-evidence' version 1"),
    (lambda d: d.update(kind="profile"), "unknown kind 'profile'"),
    (lambda d: d["records"][0].pop("status"), "record 0 lacks status"),
    (lambda d: d.update(machine=[]), "'machine' must be an object"),
])
def test_a_bad_document_is_refused_with_what_is_wrong(tmp_path, change, words):
    doc = json.loads((FIXTURES / "evidence_gpu.json").read_text())
    change(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=words):
        evidence.load(tmp_path / "bad.json")


def test_files_that_are_not_evidence_are_refused(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        evidence.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="no evidence file"):
        evidence.load(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="no evidence folder"):
        evidence.stored(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="unknown kind 'profile'"):
        evidence.document("profile", [], command="", complete=True, machine={})
    with pytest.raises(ValueError, match="a JSON object"):
        evidence.check([])
    with pytest.raises(ValueError, match="is a folder"):
        evidence.load(tmp_path)


@pytest.mark.parametrize("call, message", [
    (lambda: evidence.document("bench", 5, command="", complete=True, machine={}), "records must be a list"),
    (lambda: evidence.document("bench", [], command=None, complete=True, machine={}), "command must be"),
    (lambda: evidence.write("", {}), "path must be a non-empty file path"),
    (lambda: evidence.summary(["fp16"]), "evidence must be a list of Evidence"),
    (lambda: evidence.reference_table("zz"), "evidence must be a list of Evidence"),
    (lambda: evidence.reference_table(models=5), "models must be a name or a list of names"),
    (lambda: evidence.stored(5), "folder must be a folder path"),
])
def test_bad_arguments_are_named_in_the_message(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


def test_one_name_is_not_split_into_letters():
    table = evidence.reference_table(models="mlp", precisions="bf16")
    assert {row[2] for row in table.rows} <= {"mlp"} and {row[3] for row in table.rows} <= {"bf16"}
