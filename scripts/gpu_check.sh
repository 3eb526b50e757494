#!/usr/bin/env bash
# Every framework x precision on this machine's GPU, one table per model, in a few minutes.
#
#   bash scripts/gpu_check.sh            # from the repository, with labkit installed
#
# On Colab (GPU runtime): !git clone <this repository> && cd labkit && pip install -e ".[all]"
# then !bash scripts/gpu_check.sh. Each cell is a real labkit.train.run; a combination the
# GPU cannot run (bf16 before Ampere) is listed as skipped with the reason. JSON records
# and bar charts land in ${OUT:-gpu_check}/.
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
