"""JAX sharding over 4 virtual CPU devices: real jax.sharding, shard_map, optax and jmp.

Each multi-device run starts a child process with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (labkit.train.jax.distributed.run does it).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("jmp")

from labkit.train.jax import distributed as jax_dist
from labkit.train.jax.devices import shard_dim
from labkit.train.jax.hlo import Collective, collectives, total_bytes
from labkit.train import RunConfig, run

SMALL = {"framework": "jax", "width": 32, "batch_size": 32, "steps": 3, "progress": False}
GRADIENT_OPS = ("all-reduce", "reduce-scatter")


def config(**changes):
    return RunConfig(**{**SMALL, **changes})


@pytest.fixture(scope="module")
def runs():
    """One 1-device run and three 4-device runs of the same seeded bf16 training."""
    out = {"one": run(config(precision="bf16"))}
    for name, parallel, reduce in (("dp", "dp", None), ("fsdp", "fsdp", None), ("fsdp-bf16", "fsdp", "bf16")):
        out[name] = run(config(precision="bf16", devices=4, parallel=parallel, reduce_dtype=reduce))
    return out


def gradient_collectives(rows, dtype=None):
    """The collectives that move gradient arrays (not the scalar loss / flags)."""
    return [r for r in rows if r["op"] in GRADIENT_OPS and r["shape"] and (dtype is None or r["dtype"] == dtype)]


# -- sharded runs match one device -------------------------------------------------------
@pytest.mark.parametrize("name", ["dp", "fsdp", "fsdp-bf16"])
def test_sharded_losses_match_one_device_within_bf16_tolerance(runs, name):
    one, sharded = runs["one"], runs[name]
    assert sharded.status == "ok" and len(sharded.losses) == 3
    np.testing.assert_allclose(sharded.losses, one.losses, rtol=2**-7)
    np.testing.assert_allclose(sharded.grad_norms, one.grad_norms, rtol=2**-7)
    assert sharded.losses[-1] < sharded.losses[0]  # it trains


def test_sharded_run_reports_mesh_sharding_and_per_device_bytes(runs):
    dp, fsdp = runs["dp"], runs["fsdp"]
    assert dp.extra["mesh"] == {"data": 4} and dp.device.startswith("4 x cpu")
    assert set(dp.extra["param_sharding"].values()) == {"P()"}
    assert fsdp.extra["param_sharding"]["dense1/kernel"] == "P('data',)"
    assert fsdp.extra["param_sharding"]["out/bias"] == "P()"  # 10 does not split over 4
    # dp: every device holds all parameters; fsdp: each holds about a quarter.
    assert dp.memory["parameter_bytes_per_device"] == [dp.memory["parameter_bytes"]] * 4
    per = fsdp.memory["parameter_bytes_per_device"]
    assert sum(per) < 0.3 * 4 * fsdp.memory["parameter_bytes"] and max(per) < 0.3 * fsdp.memory["parameter_bytes"]


# -- what the collectives move ------------------------------------------------------------
def test_default_gradient_reduction_is_float32_in_lowered_and_compiled_hlo(runs):
    for name, op in (("dp", "all-reduce"), ("fsdp", "reduce-scatter")):
        extra = runs[name].extra
        assert extra["reduce_dtype"] == "fp32"
        for key in ("collectives", "collectives_requested"):
            grads = gradient_collectives(extra[key])
            assert grads and {r["dtype"] for r in grads} == {"f32"}
            assert op in {r["op"] for r in grads}
        assert extra["comm_bytes_per_step"] == sum(r["bytes"] for r in extra["collectives"]) > 0
    fsdp_ops = {r["op"] for r in runs["fsdp"].extra["collectives"]}
    assert {"all-gather", "reduce-scatter"} <= fsdp_ops


def test_bf16_reduction_is_asked_in_bf16_and_halves_the_gradient_bytes(runs):
    f32, bf16 = runs["fsdp"].extra, runs["fsdp-bf16"].extra
    asked = gradient_collectives(bf16["collectives_requested"])
    assert {r["dtype"] for r in asked} == {"bf16"}
    f32_bytes = sum(r["bytes"] for r in gradient_collectives(f32["collectives_requested"]))
    assert sum(r["bytes"] for r in asked) * 2 == f32_bytes
    # XLA:CPU has no bf16 reduce-scatter: its compiler promotes the collective back to f32.
    assert {r["dtype"] for r in gradient_collectives(bf16["collectives"])} == {"f32"}


# -- loss-scale skips agree on every device -----------------------------------------------
OVERFLOW_SCRIPT = textwrap.dedent("""
    import json, numpy as np, jax
    from labkit.train.jax import distributed as jax_dist
    from labkit.train import RunConfig
    from labkit.train.data import batches, load
    cfg = RunConfig("jax", "fp16", width=32, batch_size=32, steps=4, devices=4, parallel="fsdp",
                    inject_overflow=(1,), progress=False)
    data = load("digits", seed=0)
    stepper = jax_dist.make_stepper(cfg, data)
    feed = batches(data, 32, seed=0)
    def shards():
        return [[np.asarray(s.data).copy() for s in leaf.addressable_shards]
                for leaf in jax.tree_util.tree_leaves((stepper.flax_params, stepper.opt_state))]
    report = []
    for inject in (False, True, False):
        before = shards()
        out = stepper.step(*next(feed), inject)
        changed = [any(not np.array_equal(a[d], b[d]) for a, b in zip(before, shards())) for d in range(4)]
        report.append(dict(skipped=out.skipped, scale=out.scale, changed=changed,
                           overflow_devices=stepper.overflow_devices[-1]))
    res = jax_dist.run(cfg)
    print(json.dumps(dict(steps=report, skipped=res.skipped, scales=res.scales,
                          overflow_devices=res.extra["overflow_devices"])))
""")


def test_an_overflow_on_one_device_skips_the_step_on_every_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    root = str(Path(jax_dist.__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", OVERFLOW_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    normal, overflow, after = got["steps"]
    assert normal == {"skipped": False, "scale": 2.0**15, "changed": [True] * 4, "overflow_devices": []}
    # Only device 3's own gradient overflowed, yet no device changed its shard.
    assert overflow == {"skipped": True, "scale": 2.0**15, "changed": [False] * 4, "overflow_devices": [3]}
    assert after == {"skipped": False, "scale": 2.0**14, "changed": [True] * 4, "overflow_devices": []}
    # The same through run(): the loop records the skip and the back-off.
    assert got["skipped"] == [False, True, False, False]
    assert got["scales"] == [2.0**15, 2.0**15, 2.0**14, 2.0**14]
    assert got["overflow_devices"] == [[], [3], [], []]


# -- pure functions and bad input (no child process) --------------------------------------
def test_collectives_reads_tuple_all_reduce_reduce_scatter_and_async_ops():
    hlo = textwrap.dedent("""
        %fusion.1 = bf16[64,32]{1,0} fusion(%p), kind=kLoop
        %ar = (f32[32,10]{1,0}, f32[10]{0}, /*index=2*/pred[]) all-reduce(%a, %b, %c), to_apply=%add
        %rs = bf16[16,32]{1,0} reduce-scatter(%fusion.1), dimensions={0}, to_apply=%add
        reduce_scatter.5 = bf16[4,8]{1,0} reduce-scatter(bf16[16,8]{1,0} convert.4), dimensions={0}
        %ags = (f32[8]{0}, f32[32]{0}) all-gather-start(%x), dimensions={0}
        %agd = f32[32]{0} all-gather-done(%ags)
        %add.2 = f32[10]{0} add(%ar, %ar)
    """)
    assert collectives(hlo) == [
        Collective("all-reduce", "f32", (32, 10), 1280), Collective("all-reduce", "f32", (10,), 40),
        Collective("all-reduce", "pred", (), 1), Collective("reduce-scatter", "bf16", (64, 32), 4096),
        Collective("reduce-scatter", "bf16", (16, 8), 256), Collective("all-gather", "f32", (32,), 128)]
    assert total_bytes(collectives(hlo)) == 1280 + 40 + 1 + 4096 + 256 + 128


def test_collectives_rejects_what_is_not_a_program():
    with pytest.raises(TypeError, match="Compiled or Lowered"):
        collectives(42)


@pytest.mark.parametrize("shape, n, dim", [((64, 32), 4, 0), ((32, 64), 4, 1), ((10,), 4, None),
                                          ((), 4, None), ((2, 8), 4, 1), ((3, 5), 2, None)])
def test_shard_dim_takes_the_largest_divisible_dimension(shape, n, dim):
    assert shard_dim(shape, n) == dim


def test_bad_configs_fail_before_any_work():
    with pytest.raises(ValueError, match="framework='jax'"):
        jax_dist.run(RunConfig("torch", devices=2, progress=False))
    with pytest.raises(ValueError, match="devices >= 2"):
        jax_dist.run(RunConfig("jax", progress=False))
    with pytest.raises(TypeError, match="RunConfig"):
        jax_dist.run({"framework": "jax"})
