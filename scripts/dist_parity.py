#!/usr/bin/python3
"""One process against `mpirun -np N`: the same config trained both ways, then the largest loss
difference over the metrics' train and val lines and the largest relative difference of the final
weights (per tensor, max|a - b| / max|a|), as docs/distributed.md reports them.

usage: scripts/dist_parity.py CONFIG [--ranks N] [--out DIR] [--compare-only] [key=value ...]

Both runs get the overrides; train.grad_accum must be a multiple of N (the global batch is the
same in both). Runs go to DIR/single and DIR/mpi (default /tmp/forge-dist-parity/<config stem>);
each starts fresh (train.resume=never). Needs h5py (Debian: python3-h5py) and mpirun.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The build scripts/forge makes: build-avx2 under FORGE_ISA=avx2 (scripts/setup.sh).
FORGE = os.path.join(os.environ.get("FORGE_BUILD") or os.path.join(
    ROOT, "build-avx2" if os.environ.get("FORGE_ISA") == "avx2" else "build"), "forge")


def train(command, out, overrides):
    start = time.monotonic()
    subprocess.run(command + ["train", args.config, f"output_dir={out}", "train.resume=never"]
                   + overrides, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


def lines(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights(run):
    with open(os.path.join(run, "checkpoints", "LATEST")) as f:
        name = f.read().split()[0]  # "step-000200.h5 crc32:..."
    tensors = {}
    with h5py.File(os.path.join(run, "checkpoints", name), "r") as f:
        f["model"].visititems(
            lambda key, item: tensors.__setitem__(key, item[()]) if isinstance(item, h5py.Dataset)
            else None)
    return tensors


parser = argparse.ArgumentParser(usage=__doc__)
parser.add_argument("config")
parser.add_argument("--ranks", type=int, default=2)
parser.add_argument("--out")
parser.add_argument("--compare-only", action="store_true", help="compare the runs already in --out")
args, overrides = parser.parse_known_args()
stem = os.path.splitext(os.path.basename(args.config))[0]
out = args.out or os.path.join("/tmp/forge-dist-parity", stem)
if not args.compare_only:
    subprocess.run([os.path.join(ROOT, "scripts", "forge"), "--help"], check=True,
                   stdout=subprocess.DEVNULL)  # builds when out of date

single = os.path.join(out, "single")
mpi = os.path.join(out, "mpi")
t_single = t_mpi = 0.0
if not args.compare_only:
    t_single = train([FORGE], single, overrides)
    t_mpi = train(["mpirun", "--allow-run-as-root", "-np", str(args.ranks), FORGE], mpi,
                  overrides)

a, b = lines(single), lines(mpi)
if [(x["step"], x["split"]) for x in a] != [(x["step"], x["split"]) for x in b]:
    sys.exit("the two runs logged different steps")
loss_diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
wa, wb = weights(single), weights(mpi)
if wa.keys() != wb.keys():
    sys.exit("the two checkpoints hold different tensors")
rel = max(float(np.max(np.abs(wa[k] - wb[k]))) / max(float(np.max(np.abs(wa[k]))), 1e-30)
          for k in wa)
final = [x["loss"] for x in a if x["split"] == "val"][-1]
print(f"config={stem} ranks={args.ranks} lines={len(a)} final_val_loss={final:.6f} "
      f"max_loss_diff={loss_diff:.3g} max_weight_rel_diff={rel:.3g} "
      f"single_s={t_single:.1f} mpi_s={t_mpi:.1f}")
