# Writes hdf5_heap_crash.h5: a minimal Forge checkpoint as h5py writes one (variable-length string
# attributes, which HDF5 keeps in its global heap), then damages the stored length of the heap
# object holding the dataset's `dtype` string. The global heap carries no checksum, and libhdf5
# 1.10 copies that many bytes when the attribute is read: it dies with SIGSEGV in H5HG_read.
# tests/runtime/test_checkpoint_cli.cpp checks that forge reports it as one error line.
# Run: /usr/bin/python3 make_hdf5_heap_crash.py
import struct
import zlib

import h5py
import numpy as np

CONFIG = "recipe: gpt_pretrain\nseed: 7\n"
WEIGHT = np.arange(6, dtype="<f4").reshape(2, 3)
NAME = "hdf5_heap_crash.h5"

with h5py.File(NAME, "w", libver=("v108", "v108"), track_order=True) as f:
    f.attrs["format_version"] = np.int64(1)
    f.attrs["step"] = np.int64(42)
    f.attrs["config"] = CONFIG
    f.attrs["config_crc32"] = np.uint32(zlib.crc32(CONFIG.encode()))
    f.attrs["forge_version"] = "0.1.0"
    f.create_group("counters").attrs["data.cursor"] = np.int64(3)
    ds = f.create_group("model", track_order=True).create_dataset("w", data=WEIGHT)
    ds.attrs["dtype"] = "f32"
    ds.attrs["crc32"] = np.uint32(zlib.crc32(WEIGHT.tobytes()))

# A global heap collection: "GCOL", version, 3 reserved bytes, the collection's size (8 bytes),
# then objects: index (2), reference count (2), 4 reserved bytes, size (8), data padded to 8.
data = bytearray(open(NAME, "rb").read())
at = data.index(b"GCOL") + 16
while True:
    index, _, _, size = struct.unpack_from("<HHIQ", data, at)
    assert index != 0, "no heap object holds 'f32'"
    if data[at + 16:at + 16 + size] == b"f32":
        struct.pack_into("<Q", data, at + 8, 1 << 40)
        break
    at += 16 + (size + 7) // 8 * 8
open(NAME, "wb").write(bytes(data))
