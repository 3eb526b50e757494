#!/usr/bin/env bash
# Every framework x precision on this machine's GPU, one table per model, in a few minutes.
#
#   bash scripts/gpu_check.sh            # from the repository, with labkit installed
#
# On Colab (GPU runtime): !git clone <this repository> && cd labkit && pip install -e ".[all]"
# then !bash scripts/gpu_check.sh. Each cell is a real labkit.train.run; a combination the
# GPU cannot run (bf16 before Ampere) is listed as skipped with the reason. JSON records
# and bar charts land in ${OUT:-gpu_check}/. Each JSON file is a labkit-evidence document
# (the records, the GPU, driver, CUDA and library versions, the date; see
# labkit/evidence/stored/README.md): copy mlp.json and transformer.json, renamed after the
# device and date, into labkit/evidence/stored/ and the notebooks show them as stored evidence.
set -euo pipefail
out=${OUT:-gpu_check}
mkdir -p "$out"
precisions=fp32,tf32,bf16,fp16,bf16-pure

labkit doctor | tee "$out/doctor.txt"

# MLP: 512 x 2048, as in the CPU target of labkit bench.
labkit bench --framework torch,jax,tf --precision "$precisions" --model mlp \
  --batch-size 512 --width 2048 --warmup 10 --steps 50 \
  --json "$out/mlp.json" --plot "$out/mlp.png"

# Transformer: wide enough for tensor cores to matter (d_model 1024, 64 tokens).
labkit bench --framework torch,jax,tf --precision "$precisions" --model transformer \
  --batch-size 256 --width 1024 --warmup 10 --steps 30 \
  --json "$out/transformer.json" --plot "$out/transformer.png"

# Several GPUs (issue: mixed precision beyond one device): each framework's own engine,
# fp32 vs bf16 gradient reduction, bytes moved per step counted from the real collectives.
ngpu=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$ngpu" -gt 1 ]; then
  python - "$ngpu" <<'PY' | tee "$out/multi_gpu.txt"
import sys
from labkit.train import RunConfig, RunFailed, run
from labkit.train.report import run_table
n = int(sys.argv[1])
runs, labels = [], []
# DeepSpeed's ZeRO 1/2 run only where the optional extra is installed (pip install ".[deepspeed]")
cases = [(fw, p, "bf16", r) for fw, p in (("torch", "fsdp"), ("torch", "dp"), ("torch", "zero2"), ("jax", "fsdp"),
                                          ("tf", "dp")) for r in ("fp32", "bf16")]
cases += [("torch", "zero2", "fp16", None), ("torch", "zero1", "fp16", None)]  # the seed's fp16 block, real scaler
for fw, parallel, precision, reduce in cases:
    cfg = RunConfig(fw, precision, model="transformer", width=512, batch_size=64 * n, steps=30,
                    devices=n, parallel=parallel, reduce_dtype=reduce, progress=False)
    try:
        r = run(cfg)
    except (ValueError, RunFailed) as e:  # not offered here, or failed: the rest still runs
        print(f"{fw} {parallel} {precision} {reduce}: skipped: {e}")
        continue
    runs.append(r)
    labels.append(f"{fw} {parallel} {precision} reduce {r.extra.get('reduce_dtype')} "
                  f"({r.extra.get('comm_bytes_per_step', 0) / 1e6:.1f} MB/step)")
print(run_table(runs, labels))
PY
else
  echo "one GPU: the multi-GPU section needs two or more" | tee "$out/multi_gpu.txt"
fi
