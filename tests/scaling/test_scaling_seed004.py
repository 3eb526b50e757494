"""Seed 004's hand-written DynamicLossScaler, run as written, next to torch's GradScaler."""

import math

import numpy as np
import pytest

from labkit import scaling

torch = pytest.importorskip("torch")


def run_seed_class(flags, **kwargs):
    """The seed's class in the loop it implies: unscale, step, update(overflow)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = scaling.seeds.DynamicLossScaler(**kwargs)
    scales, counters, poisoned = [], [], []
    for overflow in flags:
        scales.append(scaler.scale)
        with torch.no_grad():
            p.zero_()
        p.grad = torch.full((1,), math.inf) if overflow else scaler.scale_loss(torch.ones(1))
        scaler.unscale_gradients(opt)
        opt.step()  # nothing in the class says "skip"
        scaler.update(overflow)
        counters.append(scaler.steps_since_last_overflow)
        poisoned.append(not bool(torch.isfinite(p).all()))
    return scales, counters, poisoned, scaler.scale


def run_gradscaler(flags, **kwargs):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scaler.scale(torch.ones(()))
    scales, poisoned = [], []
    for overflow in flags:
        scales.append(scaler.get_scale())
        p.grad = torch.full((1,), math.inf if overflow else 1.0)
        scaler.step(opt)
        scaler.update()
        poisoned.append(not bool(torch.isfinite(p).all()))
    return scales, poisoned


def test_seed_preset_replays_the_seed_class_exactly():
    rng = np.random.default_rng(5)
    for _ in range(50):
        interval = int(rng.integers(1, 6))
        flags = (rng.random(int(rng.integers(1, 150))) < rng.choice([0.05, 0.3, 0.7])).tolist()
        scales, counters, poisoned, final = run_seed_class(flags, growth_interval=interval)
        ours = scaling.simulate("seed004", flags, growth_interval=interval)
        assert ours.scales.tolist() == scales
        assert ours.steps_since_last_overflow.tolist() == counters
        assert ours.poisoned.tolist() == poisoned == flags  # every overflow reaches the weights
        assert ours.final_scale == final


def test_same_scales_as_gradscaler_but_gradscaler_skips_the_overflow_steps():
    rng = np.random.default_rng(6)
    for _ in range(20):
        interval = int(rng.integers(1, 6))
        flags = (rng.random(100) < 0.2).tolist()
        seed_scales, _, seed_poisoned, _ = run_seed_class(flags, growth_interval=interval)
        torch_scales, torch_poisoned = run_gradscaler(flags, growth_interval=interval)
        assert seed_scales == torch_scales
        assert seed_poisoned == flags and not any(torch_poisoned)


def test_long_overflow_runs_part_ways_float64_versus_float32():
    flags = [True] * 200
    seed_scales, _, _, seed_final = run_seed_class(flags)
    torch_scales, _ = run_gradscaler(flags)
    assert seed_scales[:166] == torch_scales[:166]
    assert torch_scales[166] == 0.0 and seed_scales[166] == 2.0**-150
    assert seed_final == 2.0**-184


def test_the_differences_table_is_complete():
    for row in scaling.SEED004_DIFFERENCES:
        assert len(row) == 3 and all(isinstance(c, str) and c for c in row)
    # the halving counts the table states, replayed
    seed_says, torch_says = {row[0]: row[1:] for row in scaling.SEED004_DIFFERENCES}["many overflows in a row"]
    assert "1091 halvings" in seed_says and "166 halvings" in torch_says
    for name, n in (("seed004", 1091), ("torch", 166)):
        assert scaling.simulate(name, [True] * n).final_scale == 0.0
        assert scaling.simulate(name, [True] * (n - 1)).final_scale > 0
    assert scaling.PRESETS["seed004"].defaults == {"initial_scale": 2**16, "growth_interval": 2000}


def test_side_by_side_table_runs_both_real_scalers():
    table = scaling.seed004_vs_gradscaler(scaling.overflow_pattern("..x.."), growth_interval=2)
    expected = ["65536", "65536", "131072", "65536", "65536"]
    assert table.column("seed scale") == table.column("GradScaler scale") == expected
    assert table.column("seed weights finite")[2:] == ["NO (nan/inf)"] * 3
    assert set(table.column("GradScaler weights finite")) == {"yes"}
    assert scaling.seed004_differences().columns[1] == "seed 004 DynamicLossScaler"
