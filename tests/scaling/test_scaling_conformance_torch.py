"""labkit's "torch" preset against the real torch.amp.GradScaler on the CPU, step for step.

Overflows are injected the way they happen: the parameter's gradient is inf on an
overflow step and finite otherwise; GradScaler.step() finds the inf while unscaling and
skips optimizer.step(); update() moves the scale. We read get_scale() before each step,
whether the parameter moved, and the growth tracker after update().
"""

import math

import numpy as np
import pytest

from labkit import scaling

torch = pytest.importorskip("torch")


def run_gradscaler(flags, **kwargs):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily, on first use
    scales, applied, trackers = [], [], []
    for overflow in flags:
        with torch.no_grad():
            p.zero_()
        p.grad = torch.full((1,), math.inf if overflow else 1.0)
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        applied.append(bool(p.detach()[0] != 0))
        trackers.append(scaler.state_dict()["_growth_tracker"])
    return np.array(scales), np.array(applied), np.array(trackers), scaler.get_scale()


def random_cases(n, seed):
    rng = np.random.default_rng(seed)
    factors = [(2.0, 0.5), (2.0, 0.5), (3.0, 0.25), (1.7, 0.3), (1.0001, 0.9999)]
    for _ in range(n):
        growth, backoff = factors[rng.integers(len(factors))]
        kwargs = dict(
            init_scale=float(rng.choice([2.0**16, 1.0, 3.7, 2.0**-20, 123456.789])),
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=int(rng.integers(1, 9)),
        )
        flags = rng.random(int(rng.integers(1, 120))) < rng.choice([0.02, 0.2, 0.5])
        yield flags, kwargs


def test_torch_preset_matches_gradscaler_on_random_sequences_and_factors():
    checked = 0
    for flags, kwargs in random_cases(120, seed=0):
        ours = scaling.simulate("torch", flags, **kwargs)
        if ours.scales.min() < 2.0**-100:  # 1/scale would overflow float32 in unscale_: not a valid case
            continue
        scales, applied, trackers, final = run_gradscaler(flags, **kwargs)
        np.testing.assert_array_equal(ours.scales, scales)
        np.testing.assert_array_equal(ours.applied, applied)
        np.testing.assert_array_equal(ours.growth_tracker, trackers)
        assert ours.final_scale == final
        checked += 1
    assert checked > 100


def test_torch_scale_is_float32_and_reaches_exactly_zero_after_166_halvings():
    flags = [True] * 170
    ours = scaling.simulate("torch", flags)
    scales, _, _, final = run_gradscaler(flags)
    np.testing.assert_array_equal(ours.scales, scales)
    assert ours.scales[165] == 2.0**-149  # float32's smallest subnormal
    assert ours.scales[166] == 0.0 and final == 0.0


def test_torch_refuses_to_grow_the_scale_into_inf():
    flags = [False] * 4
    ours = scaling.simulate("torch", flags, init_scale=2.0**126, growth_interval=1)
    scales, applied, _, final = run_gradscaler(flags, init_scale=2.0**126, growth_interval=1)
    np.testing.assert_array_equal(ours.scales, scales)
    assert ours.final_scale == final == 2.0**127


def test_torch_preset_defaults_are_gradscalers_defaults():
    import inspect

    real = inspect.signature(torch.amp.GradScaler.__init__).parameters
    for name, value in scaling.PRESETS["torch"].defaults.items():
        assert real[name].default == value
