"""labkit's Table: printing with no rows, what it accepts, and the tables built on it (issue 12)."""

import pytest

import labkit.formats as lf
from labkit.table import Table


def test_a_table_with_no_rows_prints_its_header_and_says_so():
    t = Table(("op", "bytes"), ())
    assert str(t) == "op  bytes\n--  -----\n(no rows)"
    assert "(no rows)" in t._repr_html_() and "<th>bytes</th>" in t._repr_html_()
    assert str(Table((), (), "title")).splitlines()[0] == "title"


@pytest.mark.parametrize("make", [
    lambda: lf.comparison_table([]),
    lambda: __import__("labkit.memory", fromlist=["x"]).memory_table([]),
    lambda: __import__("labkit.bench", fromlist=["x"]).table([]),
    lambda: __import__("labkit.claims", fromlist=["x"]).claims_table([]),
    lambda: __import__("labkit.claims", fromlist=["x"]).speed_table([]),
], ids=["comparison_table", "memory_table", "bench.table", "claims_table", "speed_table"])
def test_tables_of_nothing_print_a_header_and_no_rows(make):
    t = make()
    assert str(t).endswith("\n(no rows)") and "(no rows)" in t._repr_html_()


@pytest.mark.parametrize("make", [
    lambda s: s.traces_table([]),
    lambda s: s.fp8_table({}),
    lambda s: s.preset_table([]),
], ids=["traces_table", "fp8_table", "preset_table"])
def test_scaling_tables_of_nothing_print(make):
    from labkit import scaling

    str(make(scaling))  # once max() of an empty row list


def test_advice_table_of_no_examples_prints():
    from labkit import hardware

    str(hardware.advice_table([]))


@pytest.mark.parametrize("columns, rows, error, words", [
    ("ab", (), TypeError, "columns must be a list of column names"),  # not split into 'a', 'b'
    (("a",), (("1", "2"),), ValueError, "the header has 1 columns"),
    (("a",), ((1,),), TypeError, "a cell of int 1"),
    (("a",), "x", TypeError, "rows must be a list of rows"),
    ((1,), (), TypeError, "columns must be a list of column names"),
])
def test_a_table_refuses_what_it_cannot_print(columns, rows, error, words):
    with pytest.raises(error, match=words):
        Table(columns, rows)


def test_rows_given_as_lists_are_kept_as_tuples():
    t = Table(["a", "b"], [["1", "2"]])
    assert t.columns == ("a", "b") and t.rows == (("1", "2"),) and t.column("b") == ["2"]


def test_from_dicts_takes_one_column_name_whole_and_refuses_what_is_not_a_dict():
    t = Table.from_dicts([{"op": "x", "n": 1}], "op")
    assert t.columns == ("op",)
    with pytest.raises(TypeError, match="list of dicts"):
        Table.from_dicts("op")
    with pytest.raises(TypeError, match="a row of int 1"):
        Table.from_dicts([1])
    with pytest.raises(TypeError, match="name must be a column name"):
        t.column(0)
    with pytest.raises(ValueError, match="name 'nope' is not a column; columns are op"):
        t.column("nope")


@pytest.mark.parametrize("call", [
    lambda: lf.comparison_table("fp16"),
    lambda: lf.feature_table("fp16"),
    lambda: [r.format for r in lf.represent_all(1.0, "fp16")],
    lambda: list(lf.precision_comparison("fp16")),
], ids=["comparison_table", "feature_table", "represent_all", "precision_comparison"])
def test_one_format_name_is_a_list_of_one_not_of_letters(call):
    out = call()
    assert "fp16" in str(out) or "FP16" in str(out)  # was: "unknown float format 'f'"


def test_format_names_name_the_parameter_and_refuse_lists_too_long():
    from labkit.formats.spec import MAX_NAMES, format_names

    assert format_names("half") == ["fp16"] and format_names(None) == list(lf.FORMATS)
    with pytest.raises(ValueError, match="names: unknown float format 'fp12'"):
        format_names(["fp16", "fp12"])
    with pytest.raises(ValueError, match=f"at most {MAX_NAMES}"):
        format_names(["fp16"] * (MAX_NAMES + 1))
    with pytest.raises(ValueError, match="at least one"):
        format_names([])
