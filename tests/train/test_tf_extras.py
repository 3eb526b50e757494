"""Notebook 05's teaching helpers, against real Keras: the claims the notebook prints are checked here."""


import matplotlib
import numpy as np
import pytest

from labkit.train import RunConfig, gradient_error_table, moved_fraction, run
from labkit.train.tf import lessons as E
from labkit.train.tf.models import keras

matplotlib.use("Agg")

TINY = dict(framework="tf", width=32, batch_size=16, progress=False)


def seed_model(policy):
    """Seed 003's model, with the BatchNormalization and Softmax it talks about."""
    with E.global_policy(policy):
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(10), keras.layers.Softmax()])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def test_global_policy_is_restored_even_when_the_block_fails():
    with pytest.raises(RuntimeError, match="boom"):
        with E.global_policy("mixed_float16") as policy:
            assert policy.name == "mixed_float16"
            raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(TypeError, match="policy name must be a str"):
        with E.global_policy(16):
            pass


def test_compile_adds_a_loss_scale_optimizer_for_mixed_float16_only():
    assert type(seed_model("mixed_float16").optimizer).__name__ == "LossScaleOptimizer"
    assert type(seed_model("mixed_bfloat16").optimizer).__name__ == "Adam"
    assert type(seed_model("float32").optimizer).__name__ == "Adam"


def test_mixed_bfloat16_computes_batchnorm_and_softmax_in_bfloat16():
    table = E.dtypes_of(seed_model("mixed_bfloat16"))
    rows = {r[1]: dict(zip(table.columns, r)) for r in table.rows}
    for cls in ("Dense", "BatchNormalization", "Softmax"):
        assert rows[cls]["compute"] == rows[cls]["output"] == "bfloat16", cls
    assert rows["Dense"]["variables"] == rows["BatchNormalization"]["variables"] == "float32"
    assert rows["Softmax"]["variables"] == "-"
    text = str(E.dtypes_of(seed_model("float32")))
    assert "bfloat16" not in text and text.splitlines()[0].split() == [
        "name", "class", "policy", "variables", "compute", "output"]
    with pytest.raises(TypeError, match="built keras.Model"):
        E.dtypes_of("model")


def test_normalization_layers_take_their_statistics_in_float32():
    got = E.normalization_check()
    exact = got["float64 (exact)"]
    stepwise = got["step by step in bfloat16"]
    assert np.abs(stepwise - exact).max() > 0.3  # bfloat16 statistics would be badly off
    for name in ("BatchNormalization (mixed_bfloat16)", "LayerNormalization (mixed_bfloat16)"):
        np.testing.assert_allclose(got[name], exact, rtol=2**-8)  # float32 inside, bf16 rounding out
    with pytest.raises(ValueError, match="one row"):
        E.normalization_check([1.0])


def test_a_float16_softmax_flushes_small_probabilities_to_zero():
    probs = E.softmax_probabilities([12.0, 0.0, -8.0, 3.0])
    assert probs["mixed_float16"][2] == 0.0 and probs["mixed_float16"][0] == 1.0
    assert probs["float32"][2] == pytest.approx(2.06e-9, rel=1e-2)
    np.testing.assert_allclose(probs["float32"], probs["float64 (exact)"], rtol=1e-5)
    table = str(E.softmax_table([12.0, 0.0, -8.0, 3.0]))
    assert table.count("-inf") == 1 and table.splitlines()[0].split()[:3] == ["logit", "float64", "(exact)"]
    with pytest.raises(ValueError, match="one row"):
        E.softmax_probabilities([[1.0, 2.0]])


def test_moved_fraction_shows_pure_bf16_adam_standing_still():
    cfg = RunConfig(**TINY, precision="bf16-pure")
    assert set(moved_fraction(cfg, steps=2).values()) == {0.0}
    moved = moved_fraction(cfg.replace(precision="bf16"), steps=2, names=["dense1/kernel", "out/bias"])
    assert list(moved) == ["dense1/kernel", "out/bias"] and min(moved.values()) > 0.5


def test_run_with_xla_is_a_real_run():
    cfg = RunConfig(**TINY, steps=2)
    res = E.run_with_xla(cfg)
    assert res.status == "ok" and res.steps_done == 2
    np.testing.assert_allclose(res.losses, run(cfg).losses, rtol=1e-5)  # the same steps, compiled
    with pytest.raises(ValueError, match="framework='tf'"):
        E.run_with_xla(RunConfig("jax"))


def test_matmul_ms_times_each_dtype_with_tf32_off_and_restores_it():
    import tensorflow as tf

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    ms = E.matmul_ms(n=64, repeats=2)
    assert list(ms) == ["float32", "bfloat16", "float16"] and all(t > 0 for t in ms.values())
    assert tf.config.experimental.tensor_float_32_execution_enabled() == before
    with pytest.raises(ValueError, match="n must be an integer from 1 to"):
        E.matmul_ms(n=0)


def test_keras_cross_entropy_is_right_from_the_layer_and_clipped_from_probabilities_alone():
    got = E.cross_entropies([12.0, 0.0, -8.0, 3.0], 2)
    assert got["exact (float64)"] == pytest.approx(20.0, rel=1e-4)
    for policy in ("mixed_float16", "float32"):
        assert got[f"{policy}, the layer's output"] == pytest.approx(20.0, rel=1e-3)  # from _keras_logits
        alone = got[f"{policy}, the probabilities alone"]  # clipped to [1e-7, 1 - 1e-7]: finite, wrong
        assert np.isfinite(alone) and alone == pytest.approx(-np.log(keras.config.epsilon()), rel=0.02)
    with pytest.raises(ValueError, match="label must be an integer from 0 to 3"):
        E.cross_entropies([1.0, 2.0, 3.0, 4.0], 4)
    with pytest.raises(ValueError, match="one row"):
        E.cross_entropies([1.0], 0)


def test_casting_float16_gradients_to_float32_does_not_undo_underflow_and_loss_scaling_does():
    got = E.gradient_underflow(loss_weight=1e-6, micro_batches=2, batch_size=8, width=32)
    seed, scaled, bf16 = (got["mixed_float16, cast to float32"], got["mixed_float16, loss scaled by 32768"],
                          got["mixed_bfloat16"])
    assert got["float32"].rel_error == 0.0 and set(got["float32"].underflow.values()) == {0.0}
    assert seed.dtype == scaled.dtype == bf16.dtype == "float32"  # float32 gradients in every case
    assert min(seed.underflow["dense1/kernel"], seed.underflow["dense2/kernel"]) > 0.5 and seed.rel_error > 0.5
    assert seed.underflow["out/kernel"] == 0.0  # the float32 output layer's own gradient does not flush
    # an exact 0 left is a rounding cancellation (a sum of products rounding to 0), not an underflow
    assert max(scaled.underflow.values()) < 0.01 and scaled.rel_error < 1e-2
    assert max(bf16.underflow.values()) < 0.01 and bf16.rel_error < 0.1
    assert seed.nonfinite == scaled.nonfinite == 0.0
    table = gradient_error_table(got, names=["dense1/kernel", "dense2/kernel", "out/kernel"])
    assert table.columns[:3] == ("gradients", "dtype", "dense1/kernel zeros") and len(table.rows) == 4
    with pytest.raises(ValueError, match="loss_weight must be a finite number > 0"):
        E.gradient_underflow(loss_weight=0.0)


def test_jit_settings_match_keras_auto_rule_and_leave_set_jit_as_it_was():
    import tensorflow as tf

    before = tf.config.optimizer.get_jit()
    got = E.jit_settings()
    assert got["set_jit(True)"] == "autoclustering" and tf.config.optimizer.get_jit() == before == got["restored"]
    assert got["compile() default"] is got["expected"]
    assert got["expected"] == (got["accelerator"] and not got["strategy"] and not got["determinism"])
