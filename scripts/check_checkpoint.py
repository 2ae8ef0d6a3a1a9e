#!/usr/bin/env python3
# Opens a forge checkpoint with h5py (Debian: apt-get install python3-h5py), prints its layout and
# verifies every checksum the way forge does — an independent reader for docs/checkpoint-format.md.
# Usage: scripts/check_checkpoint.py runs/NAME/checkpoints/step-000200.h5   (exit 1 if corrupt)
import sys
import zlib

import h5py
import numpy as np


def main(path):
    ok = True
    with h5py.File(path, "r") as f:
        a = f.attrs
        print(f"format_version {a['format_version']}  step {a['step']}  forge {a['forge_version']}")
        config = a["config"]
        if zlib.crc32(config.encode()) != int(a["config_crc32"]):
            print("config: CHECKSUM MISMATCH")
            ok = False
        print(f"config: {len(config.splitlines())} lines")
        for key, value in sorted(f["counters"].attrs.items()):
            print(f"counter {key} = {int(value)}")
        for group in ("model", "optim"):
            if group not in f:
                continue
            total = 0
            for name, ds in f[group].items():
                data = np.ascontiguousarray(ds[()])
                good = zlib.crc32(data.tobytes()) == int(ds.attrs["crc32"])
                ok &= good
                total += data.size
                print(f"/{group}/{name:<40} {ds.attrs['dtype']:<5} {list(ds.shape)}"
                      f"{'' if good else '  CHECKSUM MISMATCH'}")
            print(f"/{group}: {len(f[group])} tensors, {total} elements")
    print("ok" if ok else "CORRUPT")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_checkpoint.py CHECKPOINT.h5")
    sys.exit(main(sys.argv[1]))
