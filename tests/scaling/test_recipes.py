"""FP8 scaling recipes side by side: each recipe's numbers against a direct computation with
ml_dtypes, the rowwise scales against torchao's own code, and what one outlier does."""

from collections import deque

import ml_dtypes
import numpy as np
import pytest

from labkit.scaling import fp8, recipes

E4M3 = ml_dtypes.float8_e4m3fn
MAX = float(ml_dtypes.finfo(E4M3).max)


def _steps(seed=0, n=6, shape=(8, 300)):
    """Tensors whose magnitude drifts from step to step (so delayed scaling lags), with some zeros."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n):
        x = rng.standard_normal(shape) * 2.0 ** rng.uniform(-8, 8) * np.exp2(rng.uniform(-3, 3, (shape[0], 1)))
        x[rng.random(shape) < 0.1] = 0
        out.append(x.astype(np.float32))
    return out


def _direct(x, s):
    """The cast written with ml_dtypes alone: float32 product, saturate, e4m3, back, divided by s."""
    p = x * s.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        saturated = np.isnan(p.astype(E4M3).astype(np.float64)).mean()  # e4m3fn has no inf: overflow is NaN
    q = np.clip(p, -MAX, MAX).astype(E4M3).astype(np.float64)
    err = np.linalg.norm(q / s.astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64))
    return err, saturated, ((q == 0) & (x != 0)).sum() / (x != 0).sum()


def _check(result, steps, scale_grids):
    for t, (x, s) in enumerate(zip(steps, scale_grids)):
        err, sat, und = _direct(x, s)
        assert result.error[t] == pytest.approx(err, rel=1e-12)
        assert result.saturated[t] == sat and result.underflow[t] == und


def test_current_scaling_is_fp8_max_over_the_tensor_amax_in_float32():
    steps = _steps(1)
    grids = [np.full(x.shape, np.float32(MAX) / np.abs(x).max(), np.float32) for x in steps]
    _check(recipes.evaluate(steps, "current"), steps, grids)


@pytest.mark.parametrize("history, margin", [(1, 0), (3, 0), (3, 2)])
def test_delayed_scaling_follows_te_formula_with_a_max_over_the_history(history, margin):
    steps = _steps(2, n=8)
    window, scale, grids = deque(maxlen=history), np.float32(1), []
    for x in steps:  # TE: the scale used now comes from earlier steps; new = (fp8_max / amax) / 2**margin
        grids.append(np.full(x.shape, scale, np.float32))
        window.append(np.float32(np.abs(x).max()))
        scale = (np.float32(MAX) / np.float32(max(window))) / np.float32(2.0**margin)
    r = recipes.evaluate(steps, "delayed", amax_history_len=history, margin=margin)
    _check(r, steps, grids)
    assert r.saturated.max() > 0  # the drift makes some step saturate: the test sees saturation
    # and the same numbers as labkit.scaling.fp8's own replay of TE
    t = fp8.delayed_scaling([x.ravel() for x in steps], amax_history_len=history, margin=margin)
    np.testing.assert_allclose(r.error, t.error, rtol=1e-12)
    np.testing.assert_array_equal(r.saturated, t.saturated)


def test_rowwise_scales_are_powers_of_two_below_fp8_max_over_each_row_amax():
    steps = _steps(3)
    grids = []
    for x in steps:
        amax = np.maximum(np.abs(x).max(axis=1, keepdims=True).astype(np.float64), 1e-12)
        s = np.exp2(np.floor(np.log2((MAX / amax).astype(np.float32))))
        grids.append(np.broadcast_to(s, x.shape).astype(np.float32))
    _check(recipes.evaluate(steps, "rowwise"), steps, grids)
    fp32 = recipes.evaluate(steps, "rowwise", power_2_scale=False)
    assert (fp32.saturated == 0).all() and fp32.scales[0].shape == (8, 1)


def _tile_grid(x, rows, cols):
    s = np.ones(x.shape, np.float32)
    for i in range(0, x.shape[0], rows):
        for j in range(0, x.shape[1], cols):
            amax = np.abs(x[i:i + rows, j:j + cols]).max()
            s[i:i + rows, j:j + cols] = np.float32(MAX) / np.float32(amax) if amax > 0 else 1
    return s


@pytest.mark.parametrize("kind, rows", [("activation", 1), ("gradient", 1), ("weight", 128)])
def test_tiles_are_deepseek_1x128_for_activations_and_128x128_for_weights(kind, rows):
    steps = _steps(4, n=3, shape=(130, 300))  # partial tiles at both edges
    r = recipes.evaluate(steps, "tiles", kind=kind)
    _check(r, steps, [_tile_grid(x, rows, 128) for x in steps])
    assert r.scales[0].shape == (-(-130 // rows), 3)
    assert (r.saturated == 0).all()


def test_a_zero_tile_keeps_scale_one_and_counts_nothing():
    x = np.zeros((2, 256), np.float32)
    x[0, :128] = 1.0
    r = recipes.evaluate([x], "tiles")
    assert r.scales[0].tolist() == [[448.0, 1.0], [1.0, 1.0]] and r.error[0] == 0


def test_rowwise_matches_torchao_rowwise_recipe_on_the_cpu():
    torch = pytest.importorskip("torch")
    from labkit.train.torch.quiet import quiet_import

    with quiet_import():
        pytest.importorskip("torchao")
        from torchao.float8.config import Float8LinearConfig, ScalingGranularity
        from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
    cfg = Float8LinearConfig.from_recipe_name("rowwise")
    assert cfg.round_scales_to_power_of_2 and cfg.cast_config_input.scaling_granularity is ScalingGranularity.AXISWISE
    steps = _steps(5, n=2)
    r = recipes.evaluate(steps, "rowwise")
    for t, x in enumerate(steps):
        xt = torch.from_numpy(x)
        s = tensor_to_scale(xt, torch.float8_e4m3fn, scaling_granularity=ScalingGranularity.AXISWISE,
                            axiswise_dim=-1, round_scales_to_power_of_2=cfg.round_scales_to_power_of_2)
        np.testing.assert_array_equal(r.scales[t], s.numpy().astype(np.float64))
        # torchao's cast (float8_training_tensor.py): float32(x) * scale, then a saturated fp8 cast
        q = to_fp8_saturated(xt * s, torch.float8_e4m3fn).float().numpy().astype(np.float64)
        err = np.linalg.norm(q / s.numpy().astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64))
        assert r.error[t] == pytest.approx(err, rel=1e-12)


def _pct(cell):
    return float(cell.rstrip("%"))


def test_an_outlier_hurts_a_per_tensor_scale_and_stays_inside_its_row_or_tile():
    rng = np.random.default_rng(6)
    steps = [rng.standard_normal((64, 256)).astype(np.float32) for _ in range(4)]
    t = recipes.outlier_effect(steps, factor=1e6, seed=0, step=2)
    rows = {r[0]: r for r in t.rows}
    growth = {k: _pct(rows[k][2]) / _pct(rows[k][1]) for k in rows}
    # current scaling shrinks every element's scale: the others underflow; one row / tile absorbs it
    assert growth["current"] > 3 * max(growth["rowwise"], growth["tiles"])
    assert _pct(rows["current"][4]) > 10 * max(_pct(rows["rowwise"][4]), _pct(rows["tiles"][4]))
    # delayed scaling cast the outlier with the old scale: it saturates (clipped to 448 / scale)
    assert _pct(rows["delayed"][5]) > 90 > 5 > _pct(rows["current"][5])
    # and remembers its amax: the later steps are cast with a scale 1e6 too small
    before, after = (_pct(v) for v in rows["delayed"][6].split(" -> "))
    assert after > 3 * before
    assert rows["current"][6].split(" -> ")[0] == rows["current"][6].split(" -> ")[1]


def test_plant_outlier_changes_one_element_by_the_factor():
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    for seed in range(5):
        y = recipes.plant_outlier(x, factor=1000, seed=seed)
        changed = np.flatnonzero(y != x)
        assert len(changed) == 1 and y.flat[changed[0]] == 1000 * x.flat[changed[0]]
    assert len({int(np.flatnonzero(recipes.plant_outlier(x, seed=s) != x)[0]) for s in range(10)}) > 1


def test_compare_gives_a_row_per_label_and_recipe():
    steps = _steps(7, n=3)
    t = recipes.compare({"a": steps, "b": steps[:2]}, recipes=("current", "tiles"))
    assert [r[:2] for r in t.rows] == [("a", "current"), ("a", "tiles"), ("b", "current"), ("b", "tiles")]
    one = recipes.compare(steps, recipes="rowwise")
    assert one.columns[0] == "recipe" and one.rows[0][1] == "8"


@pytest.mark.parametrize("call, error", [
    (lambda: recipes.evaluate(_steps(), "blockwise"), ValueError),
    (lambda: recipes.evaluate(_steps(), "tiles", kind="bias"), ValueError),
    (lambda: recipes.evaluate(_steps(), "tiles", fmt="fp16"), ValueError),
    (lambda: recipes.evaluate(_steps(), "tiles", tile=0), ValueError),
    (lambda: recipes.evaluate(_steps(), "rowwise", power_2_scale="yes"), TypeError),
    (lambda: recipes.evaluate([], "current"), ValueError),
    (lambda: recipes.evaluate([np.zeros((0, 3))], "current"), ValueError),
    (lambda: recipes.evaluate([np.array([1.0, np.nan])], "current"), ValueError),
    (lambda: recipes.evaluate("tensor", "current"), TypeError),
    (lambda: recipes.compare({}, recipes=("current",)), ValueError),
    (lambda: recipes.compare(_steps(), recipes=()), ValueError),
    (lambda: recipes.plant_outlier(np.zeros(4)), ValueError),
    (lambda: recipes.plant_outlier(np.ones(4), factor=0), ValueError),
    (lambda: recipes.plant_outlier(np.full(4, 1e36, np.float32), factor=1e6), ValueError),
    (lambda: recipes.outlier_effect(_steps(), step=99), ValueError),
])
def test_bad_input_is_refused_with_a_message(call, error):
    with pytest.raises(error):
        call()
