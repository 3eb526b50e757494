"""labkit.train.logs.logger_level: a logger set for a block and put back, the arguments checked up front."""

import logging

import pytest

from labkit.train.logs import LEVELS, logger_level


def test_a_logger_is_set_for_the_block_and_put_back_also_when_it_raises():
    names = ("labkit.test.a", "labkit.test.b")
    logging.getLogger(names[1]).setLevel(logging.DEBUG)
    with logger_level(names, "ERROR"):
        assert [logging.getLogger(n).level for n in names] == [logging.ERROR] * 2
    assert [logging.getLogger(n).level for n in names] == [logging.NOTSET, logging.DEBUG]
    lg = logging.getLogger("labkit.test.c")
    with pytest.raises(KeyError), logger_level(lg, logging.WARNING):
        assert lg.level == logging.WARNING
        raise KeyError("restored anyway")
    assert lg.level == logging.NOTSET


def test_a_quiet_logger_drops_info_and_keeps_errors(caplog):
    lg = logging.getLogger("labkit.test.d")
    caplog.set_level(logging.INFO, logger="labkit.test.d")
    with logger_level("labkit.test.d", "WARNING"):
        lg.info("callback enabled")
        lg.error("kept")
    lg.info("after")
    assert [r.getMessage() for r in caplog.records] == ["kept", "after"]


@pytest.mark.parametrize("loggers, level, error", [
    ("x", "LOUD", ValueError), ("x", 7, ValueError), ("x", True, TypeError), ("x", 2.5, TypeError),
    (None, "ERROR", TypeError), ([], "ERROR", TypeError), (["x", 3], "ERROR", TypeError)])
def test_bad_arguments_are_refused_before_any_block_runs(loggers, level, error):
    with pytest.raises(error, match="level" if loggers == "x" else "loggers"):
        logger_level(loggers, level)


def test_a_level_is_named_in_any_case():
    assert "ERROR" in LEVELS
    logger = logging.getLogger("labkit.test.any_case")
    with logger_level("labkit.test.any_case", "error"):
        assert logger.level == logging.ERROR
