"""Every preset's replay, pinned: digests of traces recorded before the scalers' rules were
written once (issue 14; they were then made by the eleven ``fast_*`` loops, which the tests
kept equal to ``adjust()``). The same inputs must still give bit-identical traces, and the
two ways of replaying one rule (``simulate``'s loop over ``rule()`` and ``adjust()`` one
value at a time) must agree.

Regenerate the digests only when a rule changes on purpose:
``python tests/scaling/test_scaling_replays.py --write``.
"""

import hashlib
import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from labkit import scaling

STORED = Path(__file__).with_name("data") / "replay_digests.json"
REQUIRED = {"optax": {"max_consecutive_errors": 2}}
CASES_PER_PRESET = 30
LONG_STEPS = 100_000  # the playground's cap, on the benchmark's mixed pattern


def random_options(name, rng):
    p = scaling.PRESETS[name]
    opts = dict(REQUIRED.get(name, {}))
    if p.interval_option:
        opts[p.interval_option] = int(rng.integers(1, 9))
    if p.init_option:
        big = 2.0**127 if "float32" in p.storage else 1e300  # the largest scale each storage holds
        opts[p.init_option] = float(rng.choice([2.0**16, 3.0, 2.0**-3, 2.0**120, big]))
    extra = {
        "torch": lambda: {"growth_factor": float(rng.choice([2.0, 1.5])),
                          "backoff_factor": float(rng.choice([0.5, 0.3]))},
        "deepspeed": lambda: {"hysteresis": int(rng.integers(1, 4)), "consecutive_hysteresis": bool(rng.random() < 0.5),
                              "min_loss_scale": float(rng.choice([1, 0, 2.0**-20]))},
        "deepspeed-fp16-optimizer": lambda: {"min_loss_scale": float(rng.choice([1, 0]))},
        "jmp": lambda: {"factor": int(rng.choice([2, 3])), "min_loss_scale": float(rng.choice([1, 0])),
                        "under_jit": bool(rng.random() < 0.5)},
        "apex": lambda: {"min_loss_scale": None if rng.random() < 0.5 else 0.5,
                         "max_loss_scale": float(rng.choice([2.0**24, 1e300]))},
        "optax": lambda: {"max_consecutive_errors": int(rng.integers(0, 4))},
        "static": lambda: {"skip_nonfinite": bool(rng.random() < 0.5)},
        "dynamic": lambda: {"min_scale": None if rng.random() < 0.5 else 1.0,
                            "max_scale": None if rng.random() < 0.5 else 2.0**130},
    }.get(name, dict)()
    opts.update(extra)
    return opts


def cases(name):
    """(options, pattern) pairs: random ones, then one long mixed pattern (see benchmarks/scaler_replay.py)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # hash(str) changes from run to run
    out = []
    for i in range(CASES_PER_PRESET):
        p = float(rng.choice([0.0, 0.01, 0.3, 0.7, 1.0]))
        out.append((random_options(name, rng), ("random", int(rng.integers(0, 400)), p, i)))
    out.append((dict(REQUIRED.get(name, {}), **({"raise_error_at_min_scale": False} if name == "deepspeed" else {})),
                ("mixed", LONG_STEPS, 0.0, 0)))
    return out


def flags_of(pattern):
    kind, steps, p, seed = pattern
    if steps == 0:
        return np.zeros(0, bool)
    if kind == "mixed":
        return mixed_pattern(steps)
    return scaling.overflow_pattern("random", steps, p=p, seed=seed)


def mixed_pattern(steps):
    """Sparse random overflows with bursts: long clean stretches (growth), runs of overflows (backoff)."""
    flags = scaling.overflow_pattern("random", steps, p=0.002, seed=0)
    bursts = scaling.overflow_pattern("random", steps, p=0.0005, seed=1)
    for start in np.flatnonzero(bursts):
        flags[start:start + 12] = True
    return flags


def digest(t) -> str:
    h = hashlib.sha256()
    extras = (np.asarray(t.extras[k], np.float64) for k in sorted(t.extras))
    for arr in (t.scales, t.applied.astype(np.float64), *extras):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update(repr((sorted(t.extras), t.final_scale, t.stopped_at, len(t))).encode())
    return h.hexdigest()[:24]


def replay_all():
    return {name: [digest(scaling.simulate(name, flags_of(pattern), **opts)) for opts, pattern in cases(name)]
            for name in scaling.PRESETS}


@pytest.mark.parametrize("name", list(scaling.PRESETS))
def test_each_replay_is_bit_identical_to_the_stored_traces(name):
    stored = json.loads(STORED.read_text())[name]
    got = [digest(scaling.simulate(name, flags_of(pattern), **opts)) for opts, pattern in cases(name)]
    assert got == stored


@pytest.mark.parametrize("name", list(scaling.PRESETS))
def test_simulate_and_adjust_replay_the_one_rule_step_for_step(name):
    for opts, pattern in cases(name)[:-1]:
        flags = flags_of(pattern)
        loop = scaling.simulate(name, flags, **opts)
        one_by_one = scaling.simulate(name, flags, engine="adjust", **opts)
        np.testing.assert_array_equal(loop.scales, one_by_one.scales)
        np.testing.assert_array_equal(loop.applied, one_by_one.applied)
        assert loop.extras.keys() == one_by_one.extras.keys()
        for key in loop.extras:
            np.testing.assert_array_equal(loop.extras[key], one_by_one.extras[key])
        assert loop.final_scale == one_by_one.final_scale or (math.isnan(loop.final_scale)
                                                              and math.isnan(one_by_one.final_scale))
        assert loop.stopped_at == one_by_one.stopped_at


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    STORED.write_text(json.dumps(replay_all(), indent=1) + "\n")
    print(f"wrote {STORED}")
