"""NaN hunting with the frameworks' own switches: a planted NaN is found and its op named, the switch put back."""

import pytest


@pytest.mark.parametrize("planted, op", [("log", "log"), ("divide", "div")])
def test_jax_debug_nans_names_the_primitive_that_made_the_nan_and_is_restored(planted, op):
    jax = pytest.importorskip("jax")
    from labkit.train.jax import nans

    before = jax.config.jax_debug_nans
    hunt = nans.find_nan(planted)
    assert jax.config.jax_debug_nans == before
    assert (hunt.framework, hunt.version) == ("jax", jax.__version__)
    assert hunt.exception == "FloatingPointError"
    assert "invalid value (nan) encountered in" in hunt.message
    assert hunt.op == op
    assert "de-optimized" in hunt.notice  # JAX's printed notice, captured
    assert hunt.after_restore == "returns nan"  # the flag off: the same jitted function is silent


@pytest.mark.parametrize("planted, op", [("log", "Log"), ("divide", "RealDiv")])
def test_tf_check_numerics_names_the_op_and_its_traced_function_keeps_checking(planted, op):
    pytest.importorskip("tensorflow")
    from labkit.train.tf import nans
    from labkit.train.tf.models import tf

    hunt = nans.find_nan(planted)
    assert (hunt.framework, hunt.version) == ("tensorflow", tf.__version__)
    assert hunt.exception == "InvalidArgumentError"
    assert "Detected Infinity or NaN in output 0 of graph op" in hunt.headline
    assert hunt.op == op
    assert "Tensor had NaN values" in hunt.message
    # disable_check_numerics() does not strip the checks out of a function already traced with them
    assert hunt.after_restore == "raises InvalidArgumentError"

    @tf.function
    def fresh(x):
        return tf.math.log(x)

    assert str(float(fresh(tf.constant(-1.0)))) == "nan"  # a function traced afterwards is unchecked


def test_find_nan_refuses_an_unknown_plant():
    pytest.importorskip("jax")
    from labkit.train.jax import nans

    with pytest.raises(ValueError, match="choose one of 'log', 'divide'"):
        nans.find_nan("sqrt")
    with pytest.raises(TypeError, match="planted must be one of"):
        nans.find_nan(1)


def test_a_nan_hunt_prints_the_parts_every_machine_shares():
    from labkit.train.lessons import NanHunt

    hunt = NanHunt("tensorflow", "tf.debugging.enable_check_numerics()", "tf.math.log(x)",
                   "InvalidArgumentError", 'Graph execution error:\n!!! op "Log" !!!\n  + /home/me/x.py (L3) f',
                   '!!! op "Log" !!!', "Log", "notice\nnotice", "raises InvalidArgumentError", version="2.21.0")
    text = str(hunt)
    assert text.splitlines()[0] == "NaN hunt in tensorflow: tf.debugging.enable_check_numerics()"
    assert "raised    InvalidArgumentError: !!! op \"Log\" !!!" in text and "op        Log" in text
    assert "/home/me" not in text and "2.21.0" not in text  # no paths, no version: the same text everywhere
    assert text.count("printed   notice") == 1  # a notice printed twice is shown once
    assert "flag off  the same compiled function raises InvalidArgumentError" in text and repr(hunt) == text
    with pytest.raises(TypeError, match="op must be a string"):
        NanHunt("jax", "f", "p", "E", "m", "h", None, "", "returns nan")
    with pytest.raises(ValueError, match="its version in version"):  # one field each: the name, the version
        NanHunt("jax 0.10.2", "f", "p", "E", "m", "h", "log", "", "returns nan")
    assert str(NanHunt("", "f", "p", "E", "m", "m", "", "", "x")).startswith("NaN hunt in ?")


def test_tf_find_nan_writes_nothing_besides_its_result(capfd, caplog):
    pytest.importorskip("tensorflow")
    import logging

    from labkit.train.tf import nans

    caplog.set_level(logging.INFO, logger="tensorflow")  # as a notebook kernel may log
    capfd.readouterr()
    hunt = nans.find_nan("log")
    out, err = capfd.readouterr()
    assert hunt.op == "Log"
    assert "check-numerics" not in out + err and "Detected Infinity" not in out + err  # no log lines, no stack
    assert not [r for r in caplog.records if "check-numerics callback" in r.getMessage()]
