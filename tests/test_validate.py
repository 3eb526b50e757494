"""labkit._validate: the shared argument checks every public function uses."""

import os

import pytest

from labkit import _validate as V


@pytest.mark.parametrize("value, error", [(True, TypeError), (1.0, TypeError), ("3", TypeError), (None, TypeError),
                                          (0, ValueError), (-1, ValueError), (11, ValueError)])
def test_integer_refuses_what_is_not_a_count_in_range(value, error):
    with pytest.raises(error, match="^steps must be an integer"):
        V.integer("steps", value, minimum=1, maximum=10)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400, -1e-9, True, "1"])
def test_number_refuses_non_finite_huge_negative_and_non_numbers(value):
    with pytest.raises((TypeError, ValueError), match="^lr must be a"):
        V.number("lr", value, minimum=0)


def test_number_bounds_can_be_strict():
    assert V.number("f", 0.5, minimum=0, maximum=1, inclusive=False) == 0.5
    with pytest.raises(ValueError, match=r"f must be a finite number > 0 and < 1; got 1"):
        V.number("f", 1, minimum=0, maximum=1, inclusive=False)


def test_names_keeps_one_name_whole_and_checks_each():
    assert V.names("formats", "fp16") == ["fp16"]
    assert V.names("formats", ("fp16", "bf16"), ("fp16", "bf16")) == ["fp16", "bf16"]
    with pytest.raises(ValueError, match="unknown formats 'fp9'; choose one of 'fp16', 'bf16'"):
        V.names("formats", ["fp16", "fp9"], ("fp16", "bf16"))
    with pytest.raises(TypeError, match="formats must be a name or a list of names"):
        V.names("formats", 3)


def test_out_path_names_the_path_and_creates_nothing(tmp_path):
    good = tmp_path / "run.jsonl"
    assert V.out_path("out", good) == os.fspath(good) and not good.exists()
    for bad, error in [("", ValueError), (5, TypeError), ("/dev/null/x.jsonl", ValueError),
                       (os.fspath(tmp_path), ValueError), (os.fspath(tmp_path / "no" / "x.json"), ValueError)]:
        with pytest.raises(error, match="out"):
            V.out_path("out", bad)
    with pytest.raises(ValueError, match=r"plot '.*\.xyz' must end in one of \.png, \.svg"):
        V.out_path("plot", tmp_path / "a.xyz", suffixes=(".png", ".svg"))


def test_shown_describes_huge_values_briefly():
    assert V.shown(10**400) == "an integer of 401 digits"
    assert len(V.shown(list(range(1000)))) == 80
