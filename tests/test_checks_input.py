"""labkit.checks refuses bad values naming them, and never prints a value whole (issue 12)."""

import numpy as np
import pytest

from labkit import checks


@pytest.mark.parametrize("call, error, words", [
    (lambda: checks.close("c", 10**400, 1.0, rel=0.1), ValueError, "value must be within float64's range"),
    (lambda: checks.at_most("c", 1.0, -10**400), ValueError, "limit must be within float64's range"),
    (lambda: checks.close("c", 1.0, 1.0, rel=-0.1), ValueError, "rel must be a tolerance >= 0"),
    (lambda: checks.close("c", 1.0, 1.0, abs=float("nan")), ValueError, "abs must be a tolerance >= 0"),
    (lambda: checks.close("c", 1.0, 1.0, rel=0.1, digits=0), ValueError, "digits must be an integer from 1 to 17"),
    (lambda: checks.at_least("c", 1.0, 1.0, digits=2.5), TypeError, "digits must be an integer"),
    (lambda: checks.at_least("c", 1.0, 1.0, unit=3), TypeError, "unit must be a string"),
    (lambda: checks.at_most("c", 1.0, 1.0, seen=3), TypeError, "seen must be one line of text or None"),
    (lambda: checks.that(3, True), TypeError, "claim must be one line of text"),
    (lambda: checks.that("c", True, "two\nlines"), ValueError, "seen must be one line of text"),
])
def test_bad_values_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_long_value_is_described_not_printed_whole():
    with pytest.raises(TypeError) as info:
        checks.that("c", [0.5] * 10_000)
    assert len(str(info.value)) < 200


def test_equal_compares_numpy_values_as_plain_ones_and_keeps_seen_to_one_short_line():
    assert checks.equal("c", np.float64(2.0), 2.0).holds and checks.equal("c", np.arange(3), [0, 1, 2]).holds
    assert len(checks.equal("c", list(range(10_000)), []).seen) <= 200
    assert checks.equal("c", "a\nb", "a\nb").seen == "a b"
