"""Run every framework x precision on this machine's accelerator and print one table.

    python scripts/gpu_check.py                       # all frameworks, both models
    python scripts/gpu_check.py --framework torch --model transformer --steps 100

Meant for a CUDA GPU (a workstation, a cloud VM, or Colab: upload the repo or
`!git clone` it, `!pip install -e .[all]`, then `!python scripts/gpu_check.py`). It also
runs on a CPU, sized down, which is how it is smoke-tested. Sized to finish in well under
5 minutes on one recent GPU. Each cell is a real `labkit.train.run`; a combination the
hardware cannot run is reported as skipped with the reason, never as a crash.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from labkit.train import FRAMEWORKS, PRECISIONS, RunConfig, RunFailed, run


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--framework", default=",".join(FRAMEWORKS))
    ap.add_argument("--precision", default=",".join(PRECISIONS))
    ap.add_argument("--model", default="mlp,transformer")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", help="also write the rows to this file")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = []
    for framework in args.framework.split(","):
        for model in args.model.split(","):
            base = None
            for precision in args.precision.split(","):
                cfg = RunConfig(framework, precision, model=model, steps=args.steps,
                                batch_size=args.batch_size, device=args.device, progress=False)
                start = time.perf_counter()
                try:
                    res = run(cfg)
                except (ValueError, ImportError) as exc:  # cannot run here: say why
                    rows.append(dict(framework=framework, model=model, precision=precision,
                                     status=f"skipped: {exc}"))
                    print(f"{framework:5} {model:11} {precision:9} skipped: {exc}", flush=True)
                    continue
                except RunFailed as exc:
                    res = exc.result
                step = res.median_step_time(skip_first=5)
                if precision == "fp32":
                    base = step
                row = dict(framework=framework, model=model, precision=precision, status=res.status,
                           device=res.device, step_time_s=step,
                           samples_per_s=args.batch_size / step if step > 0 else math.nan,
                           speedup_vs_fp32=(base / step) if base and step > 0 else math.nan,
                           final_loss=res.final_loss, skipped=sum(res.skipped),
                           accuracy=(res.metric or {}).get("value", math.nan), memory=res.memory,
                           wall_s=time.perf_counter() - start)
                rows.append(row)
                print(f"{framework:5} {model:11} {precision:9} {res.status:8} step {step * 1e3:8.2f} ms  "
                      f"x{row['speedup_vs_fp32']:5.2f}  loss {res.final_loss:.3f}  acc {row['accuracy']:.3f}",
                      flush=True)
    if rows and "device" in next((r for r in rows if "device" in r), {}):
        print("\ndevice:", next(r["device"] for r in rows if "device" in r))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
