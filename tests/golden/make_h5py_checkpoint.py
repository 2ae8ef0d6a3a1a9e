# Writes h5py_nullpad_checkpoint.h5: a minimal Forge checkpoint as another tool would write it with
# h5py, every string attribute fixed-length NULLPAD (np.bytes_), which fills all its bytes with no
# terminator. tests/runtime/test_checkpoint.cpp reads it. Run: /usr/bin/python3 make_h5py_checkpoint.py
import zlib

import h5py
import numpy as np

CONFIG = "recipe: gpt_pretrain\nseed: 7\n"
WEIGHT = np.arange(6, dtype="<f4").reshape(2, 3)

with h5py.File("h5py_nullpad_checkpoint.h5", "w", libver=("v108", "v108"), track_order=True) as f:
    f.attrs["format_version"] = np.int64(1)
    f.attrs["step"] = np.int64(42)
    f.attrs["config"] = np.bytes_(CONFIG)
    f.attrs["config_crc32"] = np.uint32(zlib.crc32(CONFIG.encode()))
    f.attrs["forge_version"] = np.bytes_("0.1.0")
    f.create_group("counters").attrs["data.cursor"] = np.int64(3)
    ds = f.create_group("model", track_order=True).create_dataset("w", data=WEIGHT)
    ds.attrs["dtype"] = np.bytes_("f32")
    ds.attrs["crc32"] = np.uint32(zlib.crc32(WEIGHT.tobytes()))
