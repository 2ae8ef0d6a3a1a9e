#!/usr/bin/python3
"""Generates corrupted and hostile inputs for forge and a manifest of the commands to run on them.

usage: make_hostile_cases.py BASE OUT
  BASE holds a valid tiny run (BASE/run, config BASE/run.yaml), a prepared token dataset
  (BASE/tokens.h5) and a text file (BASE/tiny.txt), as scripts/hostile makes them.
  OUT receives the cases and OUT/manifest.jsonl, one case per line: category, name, argv ("FORGE"
  stands for the binary), allowed exit codes, files that must stay byte-identical, a directory
  to copy from BASE first when the command writes (resume), and whether several config error
  lines may stand for one error (not for one bad path). scripts/hostile runs the manifest.
Only the standard library and h5py (Debian: python3-h5py).
"""
import json
import os
import stat
import shutil
import sys
import zlib

import h5py
import numpy as np

BASE, OUT = sys.argv[1], sys.argv[2]
RUN = os.path.join(BASE, "run")
CKPT_DIR = os.path.join(RUN, "checkpoints")
cases = []


def case(category, name, argv, allowed, unchanged=(), copy_run=None, timeout=10,
         same_listing=(), config_lines=True):
    cases.append(dict(category=category, name=name, argv=argv, allowed=sorted(allowed),
                      unchanged=[os.path.abspath(p) for p in unchanged], copy_run=copy_run,
                      timeout=timeout, same_listing=[os.path.abspath(d) for d in same_listing],
                      config_lines=config_lines))


def path(*parts):
    p = os.path.join(OUT, *parts)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    return p


def write(p, data):
    with open(p, "wb") as f:
        f.write(data)
    return p


steps = sorted(f for f in os.listdir(CKPT_DIR) if f.startswith("step-") and f.endswith(".h5"))
LATEST_NAME = steps[-1]
GOOD = os.path.join(CKPT_DIR, LATEST_NAME)
good = open(GOOD, "rb").read()
tiny_txt = os.path.join(BASE, "tiny.txt")
run_yaml = os.path.join(BASE, "run.yaml")


def checkpoint_reads(category, name, file, allowed=(4,)):
    """The read-only commands that take a checkpoint."""
    case(category, name + "/inspect", ["FORGE", "inspect", file], allowed, [file])
    case(category, name + "/generate", ["FORGE", "generate", "--checkpoint", file, "--prompt",
                                        "ab", "--max-new-tokens", "2"], allowed, [file])


# --- checkpoint truncations ---------------------------------------------------------------------
n = len(good)
offsets = sorted(set([0, 1, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096] +
                     [n * k // 16 for k in range(1, 16)] + [n - 1, n - 8, n - 512]))
for off in offsets:
    if 0 <= off < n:
        f = write(path("ckpt_truncate", f"cut-{off}.h5"), good[:off])
        checkpoint_reads("ckpt_truncate", f"cut-{off}", f)


# --- byte flips in each HDF5 structure ----------------------------------------------------------
# Structures are found by their signatures (HDF5 file format spec, "Disk Format: Level 0-2"):
# flipping bytes just after a signature hits the version, sizes and addresses the parser trusts.
signatures = {b"\x89HDF\r\n\x1a\n": "superblock", b"OHDR": "object_header",
              b"OCHK": "object_header_continuation", b"TREE": "btree_v1", b"BTHD": "btree_v2",
              b"BTIN": "btree_v2", b"BTLF": "btree_v2", b"HEAP": "local_heap",
              b"SNOD": "symbol_table_node", b"GCOL": "global_heap", b"FRHP": "fractal_heap",
              b"FHDB": "fractal_heap", b"FHIB": "fractal_heap", b"FSHD": "free_space",
              b"FSSE": "free_space"}
found = {}
for sig, kind in signatures.items():
    start = 0
    while (i := good.find(sig, start)) >= 0:
        found.setdefault(kind, []).append(i)
        start = i + 1
with h5py.File(GOOD, "r") as h:
    data_ranges = []
    h.visititems(lambda name, obj: data_ranges.append((obj.id.get_offset(), obj.id.get_storage_size()))
                 if isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None else None)
for kind, starts in sorted(found.items()):
    picks = []
    for s in starts[:4]:
        for k in (4, 5, 6, 8, 9, 12, 16, 20, 24, 32, 40):
            if s + k < n:
                picks.append(s + k)
    for off in picks[:24]:
        for xor in (0xFF,):
            data = bytearray(good)
            data[off] ^= xor
            f = write(path("ckpt_flip_" + kind, f"flip-{off}.h5"), bytes(data))
            # A flip in bytes the reader never needs (reserved, unused) may still load: 0 allowed.
            case("ckpt_flip_" + kind, f"flip-{off}/inspect", ["FORGE", "inspect", f], {0, 4}, [f])
for i, (start, size) in enumerate(data_ranges[:8]):
    if size:
        data = bytearray(good)
        data[start + size // 2] ^= 0x01
        f = write(path("ckpt_flip_dataset_data", f"flip-{i}.h5"), bytes(data))
        checkpoint_reads("ckpt_flip_dataset_data", f"dataset-{i}", f)
# A sweep of offsets over the whole file, whatever lives there.
for off in range(0, n, max(1, n // 48)):
    data = bytearray(good)
    data[off] ^= 0x55
    f = write(path("ckpt_flip_sweep", f"flip-{off}.h5"), bytes(data))
    case("ckpt_flip_sweep", f"flip-{off}/inspect", ["FORGE", "inspect", f], {0, 4}, [f])


# Files of Forge's own carry a digest in `<file>.digest`: with it beside the damaged copy, every
# flip must be refused (exit 4), none may load.
good_digest = open(GOOD + ".digest", "rb").read()
for off in range(0, n, max(1, n // 24)):
    data = bytearray(good)
    data[off] ^= 0x55
    f = write(path("ckpt_flip_own", f"flip-{off}.h5"), bytes(data))
    write(f + ".digest", good_digest)
    case("ckpt_flip_own", f"flip-{off}/inspect", ["FORGE", "inspect", f], {4}, [f])


def heap_objects(data):
    """(offset of the size field, size) of every object in the file's global heap collections: a
    collection is "GCOL", version, 3 reserved bytes, its size (8 bytes), then objects of index (2),
    reference count (2), 4 reserved bytes, size (8) and data padded to 8 bytes; index 0 is free
    space."""
    out = []
    start = 0
    while (g := data.find(b"GCOL", start)) >= 0:
        end = g + int.from_bytes(data[g + 8:g + 16], "little")
        at = g + 16
        while at + 16 <= min(end, len(data)):
            index = int.from_bytes(data[at:at + 2], "little")
            size = int.from_bytes(data[at + 8:at + 16], "little")
            if index == 0:
                break
            out.append((at + 8, size))
            at += 16 + (size + 7) // 8 * 8
        start = g + 4
    return out


def huge_heap_sizes(data):
    """Copies of `data`, each with one global heap object claiming 2^40 bytes: libhdf5 copies that
    many when it reads the string, and dies (tests/golden/make_hdf5_heap_crash.py)."""
    for i, (at, _) in enumerate(heap_objects(data)):
        out = bytearray(data)
        out[at:at + 8] = (1 << 40).to_bytes(8, "little")
        yield i, bytes(out)


for i, data in huge_heap_sizes(good):
    f = write(path("ckpt_heap_size", f"object-{i}.h5"), data)
    checkpoint_reads("ckpt_heap_size", f"object-{i}", f)


# --- rewritten checkpoints: huge shapes, bad types, bad strings ---------------------------------
def rewritten(category, name, edit, allowed=(4,)):
    f = path(category, name + ".h5")
    shutil.copyfile(GOOD, f)
    with h5py.File(f, "r+") as h:
        edit(h)
    checkpoint_reads(category, name, f, allowed)


with h5py.File(GOOD, "r") as h:
    first_param = sorted(h["model"].keys())[0]
    first_attrs = dict(h["model"][first_param].attrs)


def replace_param(shape, dtype="f4", chunks=True):
    def edit(h):
        del h["model"][first_param]
        d = h["model"].create_dataset(first_param, shape=shape, dtype=dtype,
                                      chunks=(1,) * len(shape) if chunks else None)
        for k, v in first_attrs.items():
            d.attrs[k] = v
    return edit


rewritten("ckpt_shape", "huge-2^40", replace_param((2 ** 40, 16)))
rewritten("ckpt_shape", "overflow-2^62x2^62", replace_param((2 ** 62, 2 ** 62)))
rewritten("ckpt_shape", "overflow-3d", replace_param((2 ** 31, 2 ** 31, 2 ** 31)))
rewritten("ckpt_shape", "rank-32", replace_param((1,) * 32))
rewritten("ckpt_shape", "empty", replace_param((0, 16), chunks=False))
rewritten("ckpt_shape", "int8-data", replace_param((4, 4), dtype="i1", chunks=False))
rewritten("ckpt_shape", "f64-labelled-f32", replace_param((4, 4), dtype="f8", chunks=False))


def set_attr(obj_path, key, value):
    def edit(h):
        h[obj_path].attrs[key] = value
    return edit


def fixed_nullpad_config(h):
    cfg = h.attrs["config"]
    raw = cfg.encode() if isinstance(cfg, str) else bytes(cfg)
    del h.attrs["config"]
    h.attrs.create("config", np.array(raw, dtype=f"S{len(raw) + 8}"))


def rename_param(new):
    def edit(h):
        h["model"].move(first_param, new)
    return edit


rewritten("ckpt_strings", "config-fixed-nullpad", fixed_nullpad_config, {0, 4})
rewritten("ckpt_strings", "config-not-utf8", set_attr("/", "config", np.void(b"recipe: \xff\xfe")))
rewritten("ckpt_strings", "config-bytes-not-utf8",
          set_attr("/", "config", np.array(b"recipe: gpt\xc3(", dtype="S20")))
rewritten("ckpt_strings", "dtype-not-utf8",
          lambda h: h["model"][first_param].attrs.__setitem__("dtype", np.void(b"\xff\xfe")))
rewritten("ckpt_strings", "dtype-unknown", lambda h: h["model"][first_param].attrs.__setitem__(
    "dtype", "f16"))
rewritten("ckpt_strings", "name-with-newline", rename_param(first_param + "\nforge: fake line"))
rewritten("ckpt_strings", "name-with-escape", rename_param(first_param + "\x1b[2J"))
rewritten("ckpt_strings", "config-huge", set_attr("/", "config", "a: " + "x" * (8 << 20)))
rewritten("ckpt_strings", "format-version-99", set_attr("/", "format_version", 99))
rewritten("ckpt_strings", "step-negative", set_attr("/", "step", -5))
rewritten("ckpt_strings", "step-as-string", set_attr("/", "step", "12"))
rewritten("ckpt_strings", "config-crc-wrong", set_attr("/", "config_crc32", np.uint32(1)))


# --- resume from a run whose newest checkpoint is damaged ----------------------------------------
# The command works on a fresh copy of BASE/run; the older checkpoints must come out identical.
older = [os.path.join("run", "checkpoints", s) for s in steps[:-1]]
for label, data in [("latest-truncated", good[: len(good) // 2]),
                    ("latest-flipped", good[:4000] + bytes([good[4000] ^ 0xFF]) + good[4001:]),
                    ("latest-empty", b"")]:
    f = write(path("ckpt_resume", label + ".h5"), data)
    case("ckpt_resume", label, ["FORGE", "train", "RUN.yaml", "train.max_steps=8"],
         {0, 4}, copy_run=dict(replace={os.path.join("run", "checkpoints", LATEST_NAME): f},
                               keep=older), timeout=120)
for label, text in [("LATEST-traversal", b"../../../../etc/passwd\n"),
                    ("LATEST-garbage", b"\xff\xfe\x00step-\n"), ("LATEST-huge", b"s" * (1 << 22))]:
    f = write(path("ckpt_resume", label), text)
    case("ckpt_resume", label, ["FORGE", "train", "RUN.yaml", "train.max_steps=8"], {0, 4},
         copy_run=dict(replace={os.path.join("run", "checkpoints", "LATEST"): f},
                       keep=older + [os.path.join("run", "checkpoints", LATEST_NAME)]), timeout=120)


# --- hostile configs ----------------------------------------------------------------------------
base_cfg = open(run_yaml).read()


def config_case(name, text=None, file=None, allowed=(2, 3), overrides=()):
    if file is None:
        file = write(path("config", name + ".yaml"), text.encode() if isinstance(text, str) else text)
    case("config", name, ["FORGE", "validate", file, *overrides], allowed,
         [file] if os.path.isfile(file) else [])


config_case("max-steps-1e30", base_cfg, overrides=["train.max_steps=1e30"])
config_case("max-steps-2^63", base_cfg, overrides=["train.max_steps=9223372036854775808"])
config_case("d-model-10^12", base_cfg, overrides=["model.d_model=1000000000000"])
config_case("vocab-2^40", base_cfg, overrides=["model.vocab_size=1099511627776"])
config_case("context-2^31", base_cfg, overrides=["model.context=2147483648"])
config_case("batch-negative", base_cfg, overrides=["train.batch_size=-1"])
config_case("lr-nan", base_cfg, overrides=["optimizer.lr=nan"])
config_case("lr-inf", base_cfg, overrides=["optimizer.lr=.inf"])
config_case("heads-zero", base_cfg, overrides=["model.n_heads=0"])
config_case("dropout-2", base_cfg, overrides=["model.dropout=2"])
config_case("dev-zero", file="/dev/zero")
config_case("dev-null", file="/dev/null")
fifo = path("config", "fifo.yaml")
os.mkfifo(fifo)
config_case("fifo", file=fifo)
config_case("directory", file=os.path.dirname(fifo))
config_case("missing", file=path("config", "does-not-exist.yaml"))
config_case("deep-nesting-list", "[" * 100000 + "]" * 100000)
config_case("deep-nesting-map", "a: {" * 50000 + "}" * 50000)
config_case("huge-file", base_cfg + "#" + "x" * (64 << 20) + "\n")
config_case("binary-garbage", bytes(range(256)) * 64)
config_case("not-utf8", base_cfg.encode() + b"\nseed: \xff\xfe\n")
config_case("nul-byte", base_cfg.encode() + b"\x00seed: 3\n")
config_case("alias-bomb", "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
    f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n"
    for i in range(9)))
config_case("newline-in-key", base_cfg + '"evil\\nforge: fake": 1\n')
config_case("escape-in-value", base_cfg.replace("recipe: gpt_pretrain", 'recipe: "\\e[2Jx"'))
config_case("data-dev-zero", base_cfg, overrides=["data.train=/dev/zero"])
config_case("data-fifo", base_cfg, overrides=["data.train=" + fifo])
config_case("data-directory", base_cfg, overrides=["data.train=" + OUT])
config_case("output-dev-null", base_cfg, overrides=["output_dir=/dev/null"])
config_case("output-is-file", base_cfg, overrides=["output_dir=" + tiny_txt])
config_case("init-from-dev-zero", base_cfg, overrides=["model.init_from=/dev/zero"], allowed=(2, 3, 4))
config_case("override-no-value", base_cfg, overrides=["train.max_steps="])
config_case("override-huge", base_cfg, overrides=["seed=" + "9" * 100000])
config_case("moe-experts-2^40", base_cfg, overrides=["model.moe.every=1",
                                                    "model.moe.n_experts=1099511627776"])
config_case("moe-top-k-zero", base_cfg, overrides=["model.moe.every=1", "model.moe.top_k=0"])
config_case("moe-capacity-nan", base_cfg, overrides=["model.moe.every=1",
                                                     "model.moe.capacity_factor=nan"])
config_case("moe-weight-inf", base_cfg, overrides=["model.moe.every=1", "model.moe.w_load=.inf"])
config_case("moe-every-past-layers", base_cfg, overrides=["model.moe.every=1024"])


# --- hostile token datasets ---------------------------------------------------------------------
tokens_good = open(os.path.join(BASE, "tokens.h5"), "rb").read()


def dataset_case(name, file, allowed=(3,)):
    out = path("tokdata", name + "-run")
    case("tokdata", name, ["FORGE", "train", run_yaml, "data.train=" + file, "output_dir=" + out,
                           "train.max_steps=1", "train.save_every=1", "train.eval_every=1"],
         allowed, [file], timeout=60)


for off in [0, 8, 512, len(tokens_good) // 2, len(tokens_good) - 1]:
    dataset_case(f"cut-{off}", write(path("tokdata", f"cut-{off}.h5"), tokens_good[:off]))
for off in range(0, len(tokens_good), max(1, len(tokens_good) // 12)):
    data = bytearray(tokens_good)
    data[off] ^= 0xFF
    dataset_case(f"flip-{off}", write(path("tokdata", f"flip-{off}.h5"), bytes(data)), (0, 3))
tokens_digest = open(os.path.join(BASE, "tokens.h5.digest"), "rb").read()
for off in range(0, len(tokens_good), max(1, len(tokens_good) // 12)):
    data = bytearray(tokens_good)
    data[off] ^= 0xFF
    f = write(path("tokdata", f"own-flip-{off}.h5"), bytes(data))
    write(f + ".digest", tokens_digest)
    dataset_case(f"own-flip-{off}", f)
for i, data in huge_heap_sizes(tokens_good):
    dataset_case(f"heap-size-{i}", write(path("tokdata", f"heap-size-{i}.h5"), data))
with h5py.File(os.path.join(BASE, "tokens.h5"), "r") as h:
    token_names = []
    h.visititems(lambda n, o: token_names.append(n) if isinstance(o, h5py.Dataset) else None)


def tokens_rewritten(name, edit):
    f = path("tokdata", name + ".h5")
    shutil.copyfile(os.path.join(BASE, "tokens.h5"), f)
    with h5py.File(f, "r+") as h:
        edit(h)
    dataset_case(name, f)


def replace_dataset(dname, make):
    def edit(h):
        attrs = dict(h[dname].attrs)
        old = h[dname][()]
        del h[dname]
        d = make(h, dname, old)
        for k, v in attrs.items():
            d.attrs[k] = v
    return edit


for dname in token_names:
    safe = dname.replace("/", "_")
    tokens_rewritten(f"{safe}-huge-shape", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, shape=(2 ** 40,), dtype=old.dtype, chunks=(1,))))
    tokens_rewritten(f"{safe}-overflow-shape", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, shape=(2 ** 62, 2 ** 62), dtype=old.dtype,
                                                  chunks=(1, 1))))
    tokens_rewritten(f"{safe}-negative", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, data=-np.abs(old.astype(np.int64)) - 1)))
    tokens_rewritten(f"{safe}-huge-values", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, data=np.full_like(old, np.iinfo(old.dtype).max)
                                                  if old.dtype.kind in "iu" else old * 1e30)))
    tokens_rewritten(f"{safe}-reversed", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, data=old[::-1].copy())))
    tokens_rewritten(f"{safe}-float", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, data=old.astype(np.float32) + 0.5)))
    tokens_rewritten(f"{safe}-missing", lambda h, n=dname: h.__delitem__(n))
    tokens_rewritten(f"{safe}-2d", replace_dataset(
        dname, lambda h, n, old: h.create_dataset(n, data=np.stack([old, old]))))
with h5py.File(os.path.join(BASE, "tokens.h5"), "r") as h:
    root_attrs = list(h.attrs.keys())
for a in root_attrs:
    tokens_rewritten(f"attr-{a}-missing", lambda h, a=a: h.attrs.__delitem__(a))
    tokens_rewritten(f"attr-{a}-not-utf8", lambda h, a=a: h.attrs.__setitem__(a, np.void(b"\xff\xfe")))
    tokens_rewritten(f"attr-{a}-newline", lambda h, a=a: h.attrs.__setitem__(a, "x\nforge: fake"))
    tokens_rewritten(f"attr-{a}-huge-int", lambda h, a=a: h.attrs.__setitem__(a, np.int64(2 ** 62)))
    # H5Aread writes every element of an attribute: a string array must not reach a one-string
    # buffer, nor a fixed-length string's declared size size the buffer unchecked.
    tokens_rewritten(f"attr-{a}-string-array",
                     lambda h, a=a: h.attrs.__setitem__(a, np.array([b"forge-tokens"] * 4096)))
    tokens_rewritten(f"attr-{a}-huge-fixed-string",
                     lambda h, a=a: h.attrs.__setitem__(a, np.bytes_(b"x" * 200000)))
# The config loader may refuse a path that is no regular file before the reader sees it (2).
dataset_case("dev-zero", "/dev/zero", (2, 3))
dataset_case("fifo", fifo, (2, 3))
dataset_case("directory", OUT, (2, 3))


# --- hostile shard directories (docs/data-format.md, "Sharded datasets") ------------------------
# A directory of two copies of BASE/tokens.h5 and its manifest.json, each case with one thing
# wrong; the directory must come out unchanged (nothing written into it).
def file_digest(f):
    data = open(f, "rb").read()
    return "crc32:%08x:%d" % (zlib.crc32(data), len(data))


with h5py.File(os.path.join(BASE, "tokens.h5"), "r") as h:
    tokens_meta = {k: h.attrs[k] for k in ("tokenizer", "vocab_size", "vocab_hash", "num_tokens",
                                          "num_documents")}
tokens_meta = {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v)
               for k, v in tokens_meta.items()}


def shard_dir(name, edit=None, manifest_edit=None, allowed=(3,)):
    d = os.path.dirname(path("tokshards", name, "manifest.json"))
    shards = []
    for i in range(2):
        f = os.path.join(d, f"shard-{i}.h5")
        shutil.copyfile(os.path.join(BASE, "tokens.h5"), f)
        shards.append(f)
    if edit:
        edit(shards)
    m = {"format": "forge-token-shards", "format_version": 1,
         "tokenizer": tokens_meta["tokenizer"], "vocab_size": tokens_meta["vocab_size"],
         "vocab_hash": tokens_meta["vocab_hash"],
         "num_tokens": 2 * tokens_meta["num_tokens"], "num_documents": 2 * tokens_meta["num_documents"],
         "shards": [{"file": os.path.basename(f), "num_tokens": tokens_meta["num_tokens"],
                     "num_documents": tokens_meta["num_documents"],
                     "digest": file_digest(f) if os.path.isfile(f) else "crc32:00000000:1"}
                    for f in shards]}
    if manifest_edit:
        manifest_edit(m, shards)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(m, f)
    files = [os.path.join(d, n) for n in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, n))]
    out = path("tokshards", name + "-run")
    case("tokshards", name, ["FORGE", "train", run_yaml, "data.train=" + d, "output_dir=" + out,
                             "train.max_steps=1", "train.save_every=1", "train.eval_every=1"],
         allowed, files, timeout=60, same_listing=[d])


def h5_edit(fn):
    def edit(shards):
        with h5py.File(shards[1], "r+") as h:
            fn(h)
    return edit


def int32_tokens(h):
    t = h["tokens"][()].astype("<i4")
    del h["tokens"]
    h.create_dataset("tokens", data=t, chunks=True, maxshape=(None,))
    h.attrs["tokens_crc32"] = np.uint32(zlib.crc32(t.tobytes()))


# The digest the manifest lists for the second shard: the one it had before an edit damaged it.
listed = {}


def truncate_last(shards):
    data = open(shards[1], "rb").read()
    listed[shards[1]] = file_digest(shards[1])
    write(shards[1], data[: len(data) // 2])


def flip_last(shards):
    data = bytearray(open(shards[1], "rb").read())
    data[len(data) // 2] ^= 0x40
    listed[shards[1]] = file_digest(shards[1])
    write(shards[1], bytes(data))


def listed_digest(m, shards):
    m["shards"][1]["digest"] = listed[shards[1]]


shard_dir("good", allowed=(0,))
shard_dir("shard-missing", edit=lambda s: os.remove(s[1]))
shard_dir("shard-truncated", edit=truncate_last, manifest_edit=listed_digest)
shard_dir("shard-flipped", edit=flip_last, manifest_edit=listed_digest)
shard_dir("shard-other-tokenizer-hash", edit=h5_edit(
    lambda h: h.attrs.__setitem__("vocab_hash", "0123456789abcdef")))
shard_dir("shard-other-tokenizer-name", edit=h5_edit(
    lambda h: h.attrs.__setitem__("tokenizer", "gpt2")))
shard_dir("shard-int32-ids", edit=h5_edit(int32_tokens))
shard_dir("shard-count-wrong", manifest_edit=lambda m, s: (
    m["shards"][1].__setitem__("num_documents", m["shards"][1]["num_documents"] + 1),
    m.__setitem__("num_documents", m["num_documents"] + 1)))
shard_dir("manifest-other-tokenizer", manifest_edit=lambda m, s: m.__setitem__("tokenizer", "gpt2"))
shard_dir("manifest-leaves-directory", manifest_edit=lambda m, s: m["shards"][1].__setitem__(
    "file", "../../tokdata/cut-0.h5"))
shard_dir("manifest-shard-twice", manifest_edit=lambda m, s: m["shards"][1].__setitem__(
    "file", "shard-0.h5"))
shard_dir("manifest-no-shards", manifest_edit=lambda m, s: m.__setitem__("shards", []))
shard_dir("shard-is-directory", edit=lambda s: (os.remove(s[1]), os.mkdir(s[1])))
shard_dir("shard-is-fifo", edit=lambda s: (os.remove(s[1]), os.mkfifo(s[1])))
shard_dir("shard-is-symlink-to-dev-zero", edit=lambda s: (os.remove(s[1]),
                                                          os.symlink("/dev/zero", s[1])))


# --- a resume whose token dataset changed since its checkpoint ----------------------------------
# The latest checkpoint of a copy of BASE/run, recording (dataset.* counters) another dataset than
# BASE/tokens.h5 as data.train: training on tokens.h5 from it is refused (3), the run unchanged.
def with_dataset_counters(label, tokens, documents, crc):
    f = path("tokdata_resume", LATEST_NAME)
    shutil.copyfile(GOOD, f)
    with h5py.File(f, "r+") as h:
        c = h["counters"]
        c.attrs["dataset.data.train.tokens"] = np.int64(tokens)
        c.attrs["dataset.data.train.documents"] = np.int64(documents)
        c.attrs["dataset.data.train.crc32"] = np.int64(crc)
    d = write(path("tokdata_resume", label, LATEST_NAME + ".digest"), (file_digest(f) + "\n").encode())
    ck = write(path("tokdata_resume", label, LATEST_NAME), open(f, "rb").read())
    latest = write(path("tokdata_resume", label, "LATEST"),
                   (LATEST_NAME + " " + file_digest(ck) + "\n").encode())
    rel = os.path.join("run", "checkpoints")
    # tokens.h5 is one document: validation comes from tiny.txt.
    case("tokdata_resume", label, ["FORGE", "train", "RUN.yaml",
                                   "data.train=" + os.path.join(BASE, "tokens.h5"),
                                   "data.val=" + tiny_txt, "train.max_steps=8"], {3},
         copy_run=dict(replace={os.path.join(rel, LATEST_NAME): ck,
                                os.path.join(rel, LATEST_NAME + ".digest"): d,
                                os.path.join(rel, "LATEST"): latest},
                       keep=older + [os.path.join(rel, LATEST_NAME), os.path.join(rel, "LATEST")]),
         timeout=120)


with_dataset_counters("other-crc", tokens_meta["num_tokens"], tokens_meta["num_documents"], 12345)
with_dataset_counters("other-size", tokens_meta["num_tokens"] + 1, tokens_meta["num_documents"], 0)


# --- hostile JSONL / SFT records ----------------------------------------------------------------
def jsonl_train_case(category, recipe, name, content, allowed, extra=()):
    """A one-step run of `recipe` from the base run on the JSONL file `content`."""
    f = write(path(category, name + ".jsonl"), content)
    out = path(category, name + "-run")
    case(category, name, ["FORGE", "train", run_yaml, "recipe=" + recipe, "model.init_from=" + RUN,
                          "data.train=" + f, "output_dir=" + out, "train.max_steps=1", *extra],
         allowed, [f], timeout=60)


def sft_case(name, content, allowed=(2, 3)):
    jsonl_train_case("records", "finetune", name, content, allowed)


good_line = b'{"prompt": "a: ", "completion": "bcd"}\n'
sft_case("invalid-json", good_line * 4 + b'{"prompt": "a\n')
sft_case("not-object", good_line * 4 + b"[1, 2, 3]\n")
sft_case("missing-key", good_line * 4 + b'{"prompt": "a"}\n')
sft_case("number-prompt", good_line * 4 + b'{"prompt": 5, "completion": "x"}\n')
sft_case("null-completion", good_line * 4 + b'{"prompt": "a", "completion": null}\n')
sft_case("not-utf8", good_line * 4 + b'{"prompt": "\xff\xfe", "completion": "x"}\n')
sft_case("nul-byte", good_line * 4 + b'{"prompt": "a\x00", "completion": "x"}\n')
sft_case("huge-line", good_line * 4 + b'{"prompt": "' + b"a" * (32 << 20) + b'", "completion": "x"}\n')
sft_case("deep-nesting", good_line * 4 + b"[" * 200000 + b"]" * 200000 + b"\n")
sft_case("empty", b"")
sft_case("only-blank", b"\n\n\n")
sft_case("huge-number", good_line * 4 + b'{"prompt": "a", "completion": "b", "x": 1e999999}\n')
sft_case("escape-in-prompt", good_line * 4 + b'{"prompt": "\\u001b[2J\\n", "completion": "x"}\n',
         (0, 2, 3))
sft_case("lone-surrogate", good_line * 4 + b'{"prompt": "\\ud800", "completion": "x"}\n')


# --- hostile multi-turn SFT conversations -------------------------------------------------------
def chat_case(name, content, template=b"{% for m in messages %}{{ m['role'] }}: "
                                      b"{{ m['content'] }}\n{% endfor %}", allowed=(3,)):
    """A chat-SFT run on `content`, its conversations rendered by the Jinja `template`."""
    t = write(path("chat_sft", name + ".jinja"), template)
    jsonl_train_case("chat_sft", "finetune", name, content, allowed, ["data.chat_template=" + t])


good_chat = (b'{"messages": [{"role": "user", "content": "a"}, '
             b'{"role": "assistant", "content": "bcd"}]}\n')
chat_case("unknown-role", good_chat * 4 + b'{"messages": [{"role": "bot", "content": "x"}]}\n')
chat_case("non-string-content", good_chat * 4 + b'{"messages": [{"role": "user", "content": '
          b'["x"]}, {"role": "assistant", "content": "y"}]}\n')
chat_case("null-role", good_chat * 4 + b'{"messages": [{"role": null, "content": "x"}]}\n')
chat_case("missing-messages", good_chat * 4 + b'{"conversation": []}\n')
chat_case("messages-not-list", good_chat * 4 + b'{"messages": "user: hi"}\n')
chat_case("empty-messages", good_chat * 4 + b'{"messages": []}\n')
chat_case("no-assistant", good_chat * 4 + b'{"messages": [{"role": "user", "content": "a"}]}\n')
chat_case("extra-message-key", good_chat * 4 + b'{"messages": [{"role": "user", "content": "a", '
          b'"name": "x"}, {"role": "assistant", "content": "b"}]}\n')
chat_case("deep-content", good_chat * 4 + b'{"messages": [{"role": "user", "content": '
          + b"[" * 200000 + b"]" * 200000 + b"}]}\n")
chat_case("template-raise-exception", good_chat * 4,
          b"{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message "
          b"comes first') }}{% endif %}")
chat_case("template-undefined-name", good_chat * 4, b"{{ no_such_variable.content }}")
chat_case("template-syntax-error", good_chat * 4, b"{% for m in %}{{ m }}{% endfor %}")
chat_case("template-not-prefix", good_chat * 4,
          b"{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
chat_case("template-unterminated", good_chat * 4, b"{% for m in messages %}{{ m['content'] }}")
chat_case("template-not-utf8", good_chat * 4, b"\xff\xfe{{ messages }}")
chat_case("template-empty", good_chat * 4, b"")


# --- hostile labelled records (classify) and forge predict inputs ----------------------------------
def classify_case(name, content, allowed=(2, 3)):
    jsonl_train_case("labelled", "classify", name, content, allowed, ["train.eval_every=0"])


CLASSIFIER = os.path.join(BASE, "classifier")


def predict_case(name, content, allowed=(2, 3), suffix=".jsonl"):
    f = content if isinstance(content, str) else write(path("predict", name + suffix), content)
    case("predict", name, ["FORGE", "predict", "--checkpoint", CLASSIFIER, "--input", f], allowed,
         [] if isinstance(content, str) else [f], timeout=60)


good_labelled = b'{"text": "to be", "label": "a"}\n{"text": "or not", "label": "b"}\n'
classify_case("invalid-json", good_labelled * 3 + b'{"text": "a\n')
classify_case("float-label", good_labelled * 3 + b'{"text": "a", "label": 1.5}\n')
classify_case("null-label", good_labelled * 3 + b'{"text": "a", "label": null}\n')
classify_case("empty-label", good_labelled * 3 + b'{"text": "a", "label": ""}\n')
classify_case("missing-text", good_labelled * 3 + b'{"label": "a"}\n')
classify_case("unknown-field", good_labelled * 3 + b'{"text": "a", "label": "a", "lable": 1}\n')
classify_case("one-label", b'{"text": "to be", "label": "a"}\n' * 6)
classify_case("not-utf8", good_labelled * 3 + b'{"text": "\xff\xfe", "label": "a"}\n')
classify_case("deep-nesting", good_labelled * 3 + b"[" * 200000 + b"]" * 200000 + b"\n")
classify_case("empty", b"")
classify_case("only-blank", b"\n\n\n")
classify_case("huge-number", good_labelled * 3 + b'{"text": "a", "label": 1e999999}\n')
classify_case("empty-text", good_labelled * 3 + b'{"text": "", "label": "a"}\n', (3,))
predict_case("invalid-json", b'{"text": "to be"}\n{"text": \n')
predict_case("missing-text", b'{"label": "a"}\n')
predict_case("not-utf8", b'{"text": "\xff\xfe"}\n')
predict_case("deep-nesting", b"[" * 200000 + b"]" * 200000 + b"\n")
predict_case("empty-jsonl", b"")
predict_case("blank-lines", b"\n \n\t\n", suffix=".txt")
predict_case("empty-text", b'{"text": ""}\n', (3,))
predict_case("binary-lines", bytes(range(256)) * 64, (0, 2, 3), suffix=".txt")
predict_case("missing-file", os.path.join(OUT, "no-such-input.txt"))
predict_case("directory", OUT)
predict_case("dev-zero", "/dev/zero")


# --- hostile preference pairs (reward_model, dpo) ------------------------------------------------
def preference_case(name, content, allowed=(2, 3)):
    for recipe in ("reward_model", "dpo"):
        jsonl_train_case("preference", recipe, recipe + "-" + name, content, allowed,
                         ["train.eval_every=0", "data.val_fraction=0.2"])


good_pair = b'{"prompt": "a: ", "chosen": "bcd", "rejected": "efg"}\n'
preference_case("invalid-json", good_pair * 5 + b'{"prompt": "a\n')
preference_case("missing-rejected", good_pair * 5 + b'{"prompt": "a", "chosen": "b"}\n')
preference_case("empty-chosen", good_pair * 5 + b'{"prompt": "a", "chosen": "", "rejected": "b"}\n')
preference_case("string-margin", good_pair * 5 +
                b'{"prompt": "a", "chosen": "b", "rejected": "c", "margin": "1"}\n')
preference_case("huge-margin", good_pair * 5 +
                b'{"prompt": "a", "chosen": "b", "rejected": "c", "margin": 1e999999}\n')
preference_case("ranked-short-scores", good_pair * 5 +
                b'{"prompt": "a", "completions": ["b", "c", "d"], "scores": [1, 2]}\n')
preference_case("ranked-nan-score", good_pair * 5 +
                b'{"prompt": "a", "completions": ["b", "c"], "scores": [1, NaN]}\n')
preference_case("ranked-huge-list", good_pair * 5 + b'{"prompt": "a", "completions": [' +
                b'"b",' * 200000 + b'"c"], "scores": [1]}\n')
preference_case("ranked-all-ties", b'{"prompt": "a", "completions": ["b", "c"], "scores": [1, 1]}\n')
preference_case("not-utf8", good_pair * 5 + b'{"prompt": "\xff", "chosen": "b", "rejected": "c"}\n')
preference_case("deep-nesting", good_pair * 5 + b"[" * 200000 + b"]" * 200000 + b"\n")
preference_case("empty", b"")
preference_case("long-responses", good_pair * 5 + b'{"prompt": "' + b"p" * 5000 + b'", "chosen": "' +
                b"c" * 5000 + b'", "rejected": "r"}\n', (0,))


# --- hostile prompt files (ppo) ------------------------------------------------------------------
REWARD_MODEL = os.path.join(BASE, "reward_model")


PPO_SETTINGS = ["model.dropout=0.0", "ppo.rollout_batch=2", "ppo.max_new_tokens=4",
                "train.eval_every=0", "data.val_fraction=0.2"]


def ppo_case(name, content, allowed=(2, 3)):
    jsonl_train_case("prompts", "ppo", "ppo-" + name, content, allowed,
                     ["ppo.reward_model=" + REWARD_MODEL, *PPO_SETTINGS])


good_prompt = b'{"prompt": "a: "}\n'
ppo_case("invalid-json", good_prompt * 5 + b'{"prompt": "a\n')
ppo_case("not-object", good_prompt * 5 + b"[1, 2, 3]\n")
ppo_case("number-prompt", good_prompt * 5 + b'{"prompt": 5}\n')
ppo_case("extra-field", good_prompt * 5 + b'{"prompt": "a", "chosen": "b"}\n')
ppo_case("not-utf8", good_prompt * 5 + b'{"prompt": "\xff"}\n')
ppo_case("deep-nesting", good_prompt * 5 + b"[" * 200000 + b"]" * 200000 + b"\n")
ppo_case("empty", b"")
ppo_case("too-long", good_prompt * 5 + b'{"prompt": "' + b"p" * 5000 + b'"}\n', (3,))
ppo_case("one-prompt", good_prompt, (0, 3))
good_prompts = write(path("prompts", "good.jsonl"), good_prompt * 5)
case("prompts", "ppo-reward-model-is-a-base",
     ["FORGE", "train", run_yaml, "recipe=ppo", "model.init_from=" + RUN, "ppo.reward_model=" + RUN,
      "data.train=" + good_prompts, "output_dir=" + path("prompts", "not-rm-run"),
      "train.max_steps=1", *PPO_SETTINGS], (4,), [good_prompts], timeout=60)

# --- hostile prompt records, regexes and verifier commands (grpo) --------------------------------
GRPO_SETTINGS = ["model.dropout=0.0", "grpo.num_generations=2", "grpo.prompts_per_step=1",
                 "grpo.max_new_tokens=4", "train.batch_size=2", "train.eval_every=0",
                 "data.val_fraction=0.2"]


def grpo_case(name, content, allowed=(2, 3), extra=()):
    jsonl_train_case("grpo", "grpo", "grpo-" + name, content, allowed, [*GRPO_SETTINGS, *extra])


good_task = b'{"prompt": "a: ", "answer": "1"}\n'
grpo_case("invalid-json", good_task * 5 + b'{"prompt": "a\n')
grpo_case("number-prompt", good_task * 5 + b'{"prompt": 5, "answer": "1"}\n')
grpo_case("missing-answer", good_task * 5 + b'{"prompt": "a: ", "solution": "1"}\n', (3,))
grpo_case("null-answer", good_task * 5 + b'{"prompt": "a: ", "answer": null}\n', (3,))
grpo_case("list-answer", good_task * 5 + b'{"prompt": "a: ", "answer": [1, 2]}\n', (3,))
grpo_case("not-utf8", good_task * 5 + b'{"prompt": "a: ", "answer": "\xff"}\n')
grpo_case("deep-nesting", good_task * 5 + b'{"prompt": "a", "answer": ' + b"[" * 200000 +
          b"]" * 200000 + b"}\n")
grpo_case("empty", b"")
grpo_case("too-long", good_task * 5 + b'{"prompt": "' + b"p" * 5000 + b'", "answer": "1"}\n', (3,))
grpo_case("one-prompt", good_task, (0, 3))
# Config errors at set-up, naming the key: nothing is sampled.
grpo_case("regex-does-not-compile", good_task * 5, (2,),
          ["grpo.rewards=[answer, regex]", "grpo.format_pattern=(a"])
grpo_case("regex-control-bytes", good_task * 5, (2,),
          ["grpo.rewards=[regex]", "grpo.format_pattern=\x01(\x1b[31m"])
grpo_case("answer-pattern-without-group", good_task * 5, (2,), ["grpo.answer_pattern=[0-9]+"])
grpo_case("catastrophic-regex", good_task * 5, (0,),
          ["grpo.rewards=[regex]", "grpo.format_pattern=(a*)*b"])
grpo_case("one-generation", good_task * 5, (2,), ["grpo.num_generations=1"])
grpo_case("unknown-reward", good_task * 5, (2,), ["grpo.rewards=[answers]"])
grpo_case("command-missing", good_task * 5, (2,), ["grpo.rewards=[command]"])
# External verifiers that hang, crash or print the wrong thing: one line, exit 3, never a hang.
for name, command in [("hangs", "sleep 600"), ("hangs-after-printing", "echo 1; echo 1; sleep 600"),
                      ("leaves-a-child", "(sleep 600 &); echo 1; echo 1"),
                      ("crashes", "kill -SEGV $$"), ("fails", "exit 1"),
                      ("too-few-lines", "true"), ("too-many-lines", "yes 1 | head -n 100"),
                      ("not-numbers", "echo one; echo two"), ("nan", "echo nan; echo 1"),
                      ("binary-output", "head -c 4096 /dev/urandom"),
                      ("endless-output", "yes 1"), ("not-found", "/no/such/verifier")]:
    grpo_case("command-" + name, good_task * 5, (3,),
              ["grpo.rewards=[command]", "grpo.command_timeout=2", "grpo.command=" + command])

# --- hostile tokenizer files --------------------------------------------------------------------
byte_encoder = {}
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:]
extra = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + extra)
        extra += 1
units = [chr(c) for c in cs]
good_encoder = {u: i for i, u in enumerate(units)}
good_encoder[units[bs.index(ord("a"))] + units[bs.index(ord("b"))]] = 256
good_merges = "#version: 0.2\n" + units[bs.index(ord("a"))] + " " + units[bs.index(ord("b"))] + "\n"


def tokenizer_case(name, encoder, merges, allowed=(3,)):
    d = path("tokenizer", name, "x")[:-2]
    write(os.path.join(d, "encoder.json"), encoder if isinstance(encoder, bytes) else
          json.dumps(encoder).encode())
    write(os.path.join(d, "vocab.bpe"), merges.encode() if isinstance(merges, str) else merges)
    files = [os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")]
    case("tokenizer", name + "/tokenize", ["FORGE", "tokenize", "--tokenizer", d, "--text",
                                           "abc hello"], allowed, files)
    case("tokenizer", name + "/prepare", ["FORGE", "prepare", "--tokenizer", d, "--input",
                                          tiny_txt, "--output", os.path.join(d, "out.h5")],
         allowed, files + [tiny_txt])


tokenizer_case("valid", good_encoder, good_merges, (0,))
tokenizer_case("invalid-json", b'{"a": 1', good_merges)
tokenizer_case("not-object", b"[1, 2]", good_merges)
tokenizer_case("string-id", {**good_encoder, "zz": "1"}, good_merges)
tokenizer_case("negative-id", {**good_encoder, "zz": -1}, good_merges)
tokenizer_case("huge-id", {**good_encoder, "zz": 2 ** 31}, good_merges)
tokenizer_case("huge-id-64", {**good_encoder, "zz": 2 ** 63}, good_merges)
tokenizer_case("float-id", {**good_encoder, "zz": 1.5}, good_merges)
tokenizer_case("duplicate-id", {**good_encoder, "zz": 5}, good_merges)
tokenizer_case("gap-in-ids", {**good_encoder, "zz": 100000}, good_merges)
tokenizer_case("missing-byte", {k: v for k, v in good_encoder.items() if v != 10}, good_merges)
tokenizer_case("empty-encoder", b"", good_merges)
tokenizer_case("empty-merges", good_encoder, b"")
tokenizer_case("merge-unknown-token", good_encoder, good_merges + "zz qq\n")
tokenizer_case("merge-one-field", good_encoder, good_merges + "abc\n")
tokenizer_case("merge-three-fields", good_encoder, good_merges + "a b c\n")
tokenizer_case("merges-not-utf8", good_encoder, good_merges.encode() + b"\xff \xfe\n")
tokenizer_case("encoder-not-utf8", json.dumps(good_encoder).encode()[:-1] + b', "\xff": 300}',
               good_merges)
tokenizer_case("merges-more-than-vocab", good_encoder, good_merges + (units[1] + " " + units[2]
                                                                      + "\n") * 5000)
tokenizer_case("encoder-deep-nesting", b"[" * 200000 + b"]" * 200000, good_merges)
tokenizer_case("encoder-empty-key", {**good_encoder, "": 257}, good_merges)
missing_dir = path("tokenizer", "missing-files", "x")[:-2]
case("tokenizer", "missing-files/tokenize", ["FORGE", "tokenize", "--tokenizer", missing_dir,
                                             "--text", "abc"], (3,))

# tokenizer.json (data/tokenizer_json.h): every refusal names the JSON path.
good_tokenizer_json = {
    "version": "1.0", "added_tokens": [
        {"id": 6, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}],
    "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
              "byte_fallback": False, "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, " ": 5},
              "merges": ["a b", "ab c"]}}


def tokenizer_json_case(name, config, allowed=(3,), text_bytes=b"abc <s>ab"):
    d = path("tokenizer_json", name, "x")[:-2]
    file = write(os.path.join(d, "tokenizer.json"),
                 config if isinstance(config, bytes) else json.dumps(config).encode())
    text = write(os.path.join(d, "text.txt"), text_bytes)
    case("tokenizer_json", name + "/tokenize", ["FORGE", "tokenize", "--tokenizer", d, "--input",
                                                text], allowed, [file, text])


def with_model_change(**change):
    return {**good_tokenizer_json, "model": {**good_tokenizer_json["model"], **change}}


tokenizer_json_case("valid", good_tokenizer_json, (0,))
tokenizer_json_case("malformed-json", json.dumps(good_tokenizer_json).encode()[:-5])
tokenizer_json_case("unknown-model", with_model_change(type="Unigram"))
tokenizer_json_case("unknown-normalizer", {**good_tokenizer_json,
                                           "normalizer": {"type": "NoSuchNormalizer"}})
tokenizer_json_case("merge-absent-token", with_model_change(merges=["a b", "ab zz"]))
tokenizer_json_case("id-out-of-range", with_model_change(
    vocab={**good_tokenizer_json["model"]["vocab"], "zz": 100}))
tokenizer_json_case("added-id-clash", {**good_tokenizer_json, "added_tokens": [
    {**good_tokenizer_json["added_tokens"][0], "id": 2}]})
tokenizer_json_case("text-not-utf8", good_tokenizer_json, text_bytes=b"abc \xff\xfe ab")


# --- hostile SentencePiece models and text ------------------------------------------------------
# tokenizer.model files cut, emptied or replaced, in a directory and named as a file; text that is
# not UTF-8 (libsentencepiece would encode it as U+FFFD).
SPM_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                         "golden", "sentencepiece", "bpe.model")
spm_good = open(SPM_MODEL, "rb").read()
not_utf8 = write(path("sentencepiece", "not-utf8.txt"), b"to be or \xff\xfe not\n")


def sentencepiece_case(name, model, allowed=(3,), text_file=tiny_txt, config=None):
    d = os.path.dirname(path("sentencepiece", name, "tokenizer.model"))
    write(os.path.join(d, "tokenizer.model"), model)
    if config is not None:
        write(os.path.join(d, "tokenizer_config.json"), config)
    files = [os.path.join(d, f) for f in os.listdir(d)] + [text_file]
    for how, named in (("dir", d), ("file", os.path.join(d, "tokenizer.model"))):
        case("sentencepiece", f"{name}/{how}/tokenize", ["FORGE", "tokenize", "--tokenizer", named,
                                                         "--input", text_file], allowed, files)
    case("sentencepiece", name + "/prepare", ["FORGE", "prepare", "--tokenizer", d, "--input",
                                              text_file, "--output", os.path.join(d, "out.h5")],
         allowed, files)


sentencepiece_case("valid", spm_good, (0,))
sentencepiece_case("empty", b"")
for cut in (1, 2, 16, len(spm_good) // 3, len(spm_good) // 2, len(spm_good) - 1):
    sentencepiece_case(f"truncated-{cut}", spm_good[:cut])
sentencepiece_case("garbage", bytes(range(256)) * 16)
sentencepiece_case("gpt2-vocab", json.dumps(good_encoder).encode())
sentencepiece_case("no-pieces", b"\x12\x00")  # well-formed protobuf, an empty trainer_spec
sentencepiece_case("bad-config", spm_good, config=b'{"add_bos_token": "yes"}')
sentencepiece_case("config-not-json", spm_good, config=b'{"add_bos_token": tru')
sentencepiece_case("not-utf8-text", spm_good, text_file=not_utf8)

# --- Hugging Face model directories (config.json + model.safetensors) ---------------------------
# BASE/hf is BASE/run exported with `forge export --format hf`. Nothing in a safetensors file is
# checksummed, so only what the header claims can be checked: every claim against the file.
HF = os.path.join(BASE, "hf")
hf_weights = open(os.path.join(HF, "model.safetensors"), "rb").read()
hf_config = json.load(open(os.path.join(HF, "config.json")))
hf_header_len = int.from_bytes(hf_weights[:8], "little")


def hf_dir(category, name, weights=None, config=None):
    """A copy of BASE/hf with its weights and/or config.json replaced (config: a dict or bytes)."""
    d = os.path.dirname(path(category, name, "config.json"))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(HF, f), os.path.join(d, f))
    write(os.path.join(d, "model.safetensors"), hf_weights if weights is None else weights)
    cfg = hf_config if config is None else config
    write(os.path.join(d, "config.json"), cfg if isinstance(cfg, bytes) else json.dumps(cfg).encode())
    return d


def hf_reads(category, name, d, allowed=(4,)):
    files = [os.path.join(d, f) for f in sorted(os.listdir(d))]
    case(category, name + "/inspect", ["FORGE", "inspect", d], allowed, files)
    case(category, name + "/generate", ["FORGE", "generate", "--checkpoint", d, "--prompt", "ab",
                                        "--max-new-tokens", "2"], allowed, files)
    case(category, name + "/eval", ["FORGE", "eval", d, "--data", tiny_txt], allowed, files)


def safetensors_bytes(header, data):
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


hf_reads("hf_valid", "export", hf_dir("hf_valid", "export"), (0,))
n = len(hf_weights)
for off in sorted(set([0, 1, 7, 8, 9, 16, 8 + hf_header_len - 1, 8 + hf_header_len,
                       8 + hf_header_len + 1, n // 2, n - 1])):
    hf_reads("hf_truncate", f"cut-{off}", hf_dir("hf_truncate", f"cut-{off}", hf_weights[:off]))
# A flip in the header may land in padding or keep it valid: 0 allowed; never a crash or a read
# outside the file.
for off in range(8, 8 + hf_header_len, max(1, hf_header_len // 40)):
    data = bytearray(hf_weights)
    data[off] ^= 0x55
    d = hf_dir("hf_flip_header", f"flip-{off}", bytes(data))
    case("hf_flip_header", f"flip-{off}/inspect", ["FORGE", "inspect", d], (0, 4))
for label, length in [("huge", 2**63 + 5), ("beyond-file", n), ("one-short", hf_header_len - 1),
                      ("one-long", hf_header_len + 1), ("zero", 0)]:
    d = hf_dir("hf_header_length", label, length.to_bytes(8, "little") + hf_weights[8:])
    hf_reads("hf_header_length", label, d)
header = json.loads(hf_weights[8:8 + hf_header_len])
body = hf_weights[8 + hf_header_len:]
first = next(k for k in header if k != "__metadata__")


def with_entry(name, **changes):
    h = json.loads(json.dumps(header))
    h[name].update(changes)
    return h


for label, h, data in [
        ("shape-huge", with_entry(first, shape=[2**40, 2**40]), body),
        ("shape-overflow", with_entry(first, shape=[2**62, 2**62, 2**62]), body),
        ("offsets-beyond", with_entry(first, data_offsets=[0, 2**62]), body),
        ("offsets-reversed", with_entry(first, data_offsets=[8, 0]), body),
        ("dtype-unknown", with_entry(first, dtype="F128"), body),
        ("dtype-int", with_entry(first, dtype="I32"), body),
        ("extra-tensor", {**header, "h.0.attn.rotary": {"dtype": "F32", "shape": [1],
                                                        "data_offsets": [len(body), len(body) + 4]}},
         body + bytes(4)),
        ("missing-tensor", {k: v for k, v in header.items() if k != first}, body),
        ("trailing-bytes", header, body + bytes(4)),
        ("not-object", [1, 2], body)]:
    hf_reads("hf_header", label, hf_dir("hf_header", label, safetensors_bytes(h, data)))
data = bytearray(hf_weights)
data[8 + hf_header_len + (n - 8 - hf_header_len) // 2] ^= 0x01
hf_reads("hf_flip_data", "middle", hf_dir("hf_flip_data", "middle", bytes(data)), (0,))


def config_with(**changes):
    c = dict(hf_config)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


for label, cfg in [("not-json", b"{"), ("array", b"[]"), ("empty", b""),
                   ("missing-n_embd", config_with(n_embd=None)),
                   ("n_layer-string", config_with(n_layer="two")),
                   ("n_layer-zero", config_with(n_layer=0)),
                   ("n_layer-huge", config_with(n_layer=10**30)),
                   ("n_embd-huge", config_with(n_embd=2**40)),
                   ("n_embd-wider", config_with(n_embd=hf_config["n_embd"] * 2)),
                   ("vocab-huge", config_with(vocab_size=2**40)),
                   ("eps-negative", config_with(layer_norm_epsilon=-1)),
                   ("eps-nan", b'{"model_type": "gpt2", "layer_norm_epsilon": NaN}'),
                   ("model-type-llama", config_with(model_type="llama")),
                   ("activation-relu", config_with(activation_function="relu")),
                   ("deeper", config_with(n_layer=hf_config["n_layer"] + 1))]:
    hf_reads("hf_config", label, hf_dir("hf_config", label, config=cfg), (2, 4))


# --- Llama-family hub directories (tests/golden/hf, tests/golden/make_llama_goldens.py) ----------
# Small mutations of the fixtures: config.json keys Forge cannot compute or whose sizes disagree,
# shard indexes that disagree with the shards, dtypes other than F32/BF16/F16. Each is exit 4.
LLAMA_FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "tests", "golden", "hf")
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
Q = "model.layers.0.self_attn.q_proj.weight"


def llama_dir(name, fixture, config=None, index=None, header=None):
    """A copy of fixture with config.json (config(dict)), the shard index (index(dict)) or the
    safetensors headers (header: {file: edit(dict)}) edited."""
    d = os.path.dirname(path("hf_llama", name, "x"))
    shutil.rmtree(d)
    shutil.copytree(os.path.join(LLAMA_FIXTURES, fixture), d)
    for file, edit in [("config.json", config), (INDEX, index)]:
        if edit:
            j = json.load(open(os.path.join(d, file)))
            edit(j)
            write(os.path.join(d, file), json.dumps(j).encode())
    for file, edit in (header or {}).items():
        raw = open(os.path.join(d, file), "rb").read()
        n = int.from_bytes(raw[:8], "little")
        h = json.loads(raw[8:8 + n])
        edit(h)
        write(os.path.join(d, file), safetensors_bytes(h, raw[8 + n:]))
    return d


def setting(**changes):
    return lambda j: j.update(changes)


def llama_case(name, fixture, allowed=(4,), **edits):
    hf_reads("hf_llama", name, llama_dir(name, fixture, **edits), allowed)


# Valid: each fixture loads, generates and scores.
for fixture in ("llama", "qwen2", "mistral", "llama3_scaled"):
    llama_case("valid-" + fixture, fixture, (0,))
for name, fixture, edit in [
        ("model-type-unknown", "llama", setting(model_type="falcon")),
        ("rope-yarn", "llama", setting(rope_scaling={"rope_type": "yarn", "factor": 4.0})),
        ("rope-dynamic", "llama", setting(rope_scaling={"type": "dynamic", "factor": 2.0})),
        ("rope-no-type", "llama", setting(rope_scaling={"factor": 2.0})),
        ("rope-not-object", "llama", setting(rope_scaling="linear")),
        ("rope-factor-below-one", "llama", setting(rope_scaling={"type": "linear", "factor": 0.5})),
        ("rope-factor-nan", "llama", setting(rope_scaling={"type": "linear", "factor": "NaN"})),
        ("rope-llama3-bands-reversed", "llama3_scaled",
         setting(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                               "high_freq_factor": 1.0, "original_max_position_embeddings": 64})),
        ("rope-llama3-original-huge", "llama3_scaled",
         setting(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 2**62})),
        ("kv-heads-not-dividing", "llama", setting(num_key_value_heads=3)),
        ("kv-heads-zero", "llama", setting(num_key_value_heads=0)),
        ("heads-not-dividing-hidden", "llama3_scaled", setting(num_attention_heads=3)),
        ("head-dim-odd", "mistral", setting(head_dim=7)),
        ("head-dim-huge", "mistral", setting(head_dim=2**40)),
        ("layers-huge", "llama", setting(num_hidden_layers=2**31)),
        ("hidden-huge", "llama", setting(hidden_size=2**31)),
        ("vocab-huge", "llama", setting(vocab_size=2**31)),
        ("intermediate-huge", "llama", setting(intermediate_size=2**40)),
        ("positions-huge", "llama", setting(max_position_embeddings=2**40)),
        ("kv-heads-huge", "llama", setting(num_key_value_heads=2**31)),
        ("hidden-act-gelu", "llama", setting(hidden_act="gelu")),
        ("attention-bias", "llama", setting(attention_bias=True)),
        ("mlp-bias", "llama", setting(mlp_bias=True)),
        ("attention-dropout", "llama", setting(attention_dropout=0.1)),
        ("rms-norm-eps-zero", "llama", setting(rms_norm_eps=0)),
        ("rope-theta-negative", "llama", setting(rope_theta=-1)),
        ("mistral-sliding-window", "mistral", setting(sliding_window=16)),
        ("mistral-sliding-window-default", "mistral", lambda j: j.pop("sliding_window")),
        ("qwen2-sliding-window", "qwen2", setting(use_sliding_window=True, sliding_window=32)),
        ("quantized", "llama", setting(quantization_config={"quant_method": "gptq"})),
        ("vocab-below-bytes", "llama", setting(vocab_size=200)),
        ("intermediate-disagrees", "llama", setting(intermediate_size=48)),
        ("head-dim-disagrees", "mistral", setting(head_dim=8)),
        ("untied-without-head", "qwen2", setting(tie_word_embeddings=False))]:
    # mistral without sliding_window takes MistralConfig's 4096, which the context (64) is below.
    llama_case(name, fixture, (0,) if name == "mistral-sliding-window-default" else (4,),
               config=edit)
for name, edit in [
        ("index-phantom-tensor", lambda j: j["weight_map"].update({"model.layers.9.x": SHARD2})),
        ("index-unnamed-tensor", lambda j: j["weight_map"].pop(Q)),
        ("index-moved-tensor", lambda j: j["weight_map"].update({Q: SHARD2})),
        ("index-path-escape", lambda j: j["weight_map"].update({Q: "../qwen2/" + SHARD1})),
        ("index-absolute-path", lambda j: j["weight_map"].update({Q: "/etc/passwd"})),
        ("index-dot-dot", lambda j: j["weight_map"].update({Q: ".."})),
        ("index-not-string", lambda j: j["weight_map"].update({Q: 1})),
        ("index-empty-map", lambda j: j.update(weight_map={})),
        ("index-no-map", lambda j: j.pop("weight_map")),
        ("index-map-array", lambda j: j.update(weight_map=[SHARD1]))]:
    llama_case(name, "qwen2", index=edit)
d = llama_dir("shard-missing", "qwen2")
os.remove(os.path.join(d, SHARD2))
hf_reads("hf_llama", "shard-missing", d)
d = llama_dir("shard-truncated", "qwen2")
write(os.path.join(d, SHARD2), open(os.path.join(d, SHARD2), "rb").read()[:-3])
hf_reads("hf_llama", "shard-truncated", d)
d = llama_dir("index-not-json", "qwen2")
write(os.path.join(d, INDEX), b"{")
hf_reads("hf_llama", "index-not-json", d)
d = llama_dir("index-deep-nesting", "qwen2")
write(os.path.join(d, INDEX), b'{"weight_map": {}, "x": ' + b"[" * 100000 + b"]" * 100000 + b"}")
hf_reads("hf_llama", "index-deep-nesting", d)
d = llama_dir("index-symlink-loop", "qwen2")
os.remove(os.path.join(d, INDEX))
os.symlink(INDEX, os.path.join(d, INDEX))
hf_reads("hf_llama", "index-symlink-loop", d)
d = llama_dir("index-only", "qwen2")
for f in (SHARD1, SHARD2):
    os.remove(os.path.join(d, f))
hf_reads("hf_llama", "index-only", d)
EMB = "model.embed_tokens.weight"
for name, fixture, file, edit in [
        ("dtype-i32", "llama", "model.safetensors", lambda h: h[EMB].update(dtype="I32")),
        ("dtype-f64", "llama", "model.safetensors",
         lambda h: h[EMB].update(dtype="F64", shape=[300, 16])),
        ("dtype-f8", "mistral", "model.safetensors",
         lambda h: h[EMB].update(dtype="F8_E4M3", shape=[256, 64])),
        ("dtype-i16-in-shard", "qwen2", SHARD2,
         lambda h: h["model.norm.weight"].update(dtype="I16")),
        ("shard-shape-disagrees", "qwen2", SHARD1,
         lambda h: h[Q].update(shape=[16, 64]))]:
    llama_case(name, fixture, header={file: edit})


# --- special files as inputs and outputs --------------------------------------------------------
def special(name, argv, allowed, unchanged=()):
    case("special_files", name, argv, allowed, unchanged)


special("prepare-input-dev-zero", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                   "/dev/zero", "--output", path("special", "a.h5")], (2, 3))
special("prepare-input-fifo", ["FORGE", "prepare", "--tokenizer", "bytes", "--input", fifo,
                               "--output", path("special", "b.h5")], (2, 3))
special("prepare-input-directory", ["FORGE", "prepare", "--tokenizer", "bytes", "--input", OUT,
                                    "--output", path("special", "c.h5")], (2, 3))
special("prepare-output-dev-full", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                    tiny_txt, "--output", "/dev/full"], (2, 3), [tiny_txt])
special("prepare-output-directory", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                     tiny_txt, "--output", OUT], (2, 3), [tiny_txt])
special("prepare-output-is-input", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                    tiny_txt, "--output", tiny_txt, "--force"], (2, 3), [tiny_txt])
ro = path("special", "readonly", "x")[:-2]
os.chmod(ro, 0o555)
if os.geteuid() != 0:  # root writes into a read-only directory anyway
    special("prepare-output-readonly-dir", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                            tiny_txt, "--output", os.path.join(ro, "o.h5")], (2, 3))
special("prepare-input-missing", ["FORGE", "prepare", "--tokenizer", "bytes", "--input",
                                  path("special", "nope.txt"), "--output", path("special", "d.h5")],
        (2, 3))
special("tokenize-input-dev-zero", ["FORGE", "tokenize", "--tokenizer", "bytes", "--input",
                                    "/dev/zero"], (2, 3))
for label, target in [("dev-zero", "/dev/zero"), ("dev-null", "/dev/null"), ("fifo", fifo),
                      ("directory", OUT), ("missing", path("special", "nope.h5"))]:
    special("inspect-" + label, ["FORGE", "inspect", target], (2, 4))
    special("generate-" + label, ["FORGE", "generate", "--checkpoint", target, "--prompt", "a",
                                  "--max-new-tokens", "1"], (2, 4))
special("eval-dev-zero", ["FORGE", "eval", "/dev/zero"], (2, 4))
special("generate-prompt-not-utf8", ["FORGE", "generate", "--checkpoint", GOOD, "--prompt",
                                     "\udcff\udcfe", "--max-new-tokens", "1"], (0, 2, 3), [GOOD])
special("generate-max-tokens-huge", ["FORGE", "generate", "--checkpoint", GOOD, "--prompt", "a",
                                     "--max-new-tokens", "99999999999999999999"], (2,), [GOOD])
special("generate-top-p-nan", ["FORGE", "generate", "--checkpoint", GOOD, "--prompt", "a",
                               "--top-p", "nan", "--max-new-tokens", "1"], (2,), [GOOD])

# Outputs (docs/reliability.md, "Outputs"): a command never writes onto what it reads, nor onto a
# path that is not a regular file, and a refused output leaves no temp file behind.
def refused_output(name, argv, unchanged, listing=()):
    case("outputs", name, argv, (2,), unchanged, same_listing=listing)


HF = os.path.join(BASE, "hf")
HF_FILES = [os.path.join(HF, f) for f in sorted(os.listdir(HF))]
prompts = write(path("outputs", "prompts.txt"), b"To be\n")
scored = shutil.copyfile(os.path.join(BASE, "pairs.jsonl"), path("outputs", "pairs.jsonl"))
link = path("outputs", "link.h5")
os.symlink(GOOD, link)
hard = path("outputs", "hard.h5")
os.link(GOOD, hard)
out_fifo = path("outputs", "out.fifo")
os.mkfifo(out_fifo)
for fmt in ["gguf", "hf"]:
    refused_output(f"export-{fmt}-onto-its-checkpoint",
                   ["FORGE", "export", "--checkpoint", GOOD, "--format", fmt, "--output", GOOD],
                   [GOOD], [CKPT_DIR])
refused_output("export-merge-onto-its-checkpoint",
               ["FORGE", "export", "--checkpoint", GOOD, "--merge", "--output", GOOD], [GOOD],
               [CKPT_DIR])
refused_output("export-into-its-run", ["FORGE", "export", "--checkpoint", RUN, "--format", "gguf",
                                       "--output", os.path.join(CKPT_DIR, "LATEST")],
               [os.path.join(CKPT_DIR, "LATEST")], [CKPT_DIR])
refused_output("export-hf-onto-its-directory",
               ["FORGE", "export", "--checkpoint", HF, "--format", "hf", "--output", HF], HF_FILES,
               [HF])
refused_output("export-gguf-into-its-hf-directory",
               ["FORGE", "export", "--checkpoint", HF, "--format", "gguf", "--output",
                os.path.join(HF, "model.safetensors")], HF_FILES, [HF])
refused_output("export-through-a-symlink", ["FORGE", "export", "--checkpoint", GOOD, "--format",
                                            "gguf", "--output", link], [GOOD], [CKPT_DIR])
refused_output("export-onto-a-hard-link", ["FORGE", "export", "--checkpoint", GOOD, "--format",
                                           "gguf", "--output", hard], [GOOD, hard])
refused_output("export-onto-a-fifo", ["FORGE", "export", "--checkpoint", GOOD, "--format", "gguf",
                                      "--output", out_fifo], [out_fifo],
               [os.path.dirname(out_fifo)])
refused_output("export-onto-a-directory", ["FORGE", "export", "--checkpoint", GOOD, "--format",
                                           "gguf", "--output", path("outputs", "dir", "x")[:-2]],
               [], [os.path.dirname(out_fifo)])
if os.geteuid() == 0:  # a character device of our own, like /dev/null (mknod needs root)
    device = path("outputs", "null")
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    refused_output("export-onto-a-device", ["FORGE", "export", "--checkpoint", GOOD, "--format",
                                            "gguf", "--output", device], [device],
                   [os.path.dirname(device)])
refused_output("generate-output-onto-its-prompts",
               ["FORGE", "generate", "--checkpoint", RUN, "--prompts", prompts,
                "--max-new-tokens", "2", "--output", prompts], [prompts])
refused_output("generate-output-onto-its-checkpoint",
               ["FORGE", "generate", "--checkpoint", RUN, "--prompts", prompts,
                "--max-new-tokens", "2", "--output", GOOD], [GOOD], [CKPT_DIR])
refused_output("train-into-the-run-it-starts-from",
               ["FORGE", "train", run_yaml, "recipe=finetune", "model.init_from=" + RUN,
                "output_dir=" + RUN], [GOOD, os.path.join(CKPT_DIR, "LATEST")], [CKPT_DIR])
refused_output("train-into-a-directory-holding-its-data",
               ["FORGE", "train", run_yaml, "output_dir=" + BASE], [tiny_txt], [BASE])
refused_output("score-output-onto-its-input",
               ["FORGE", "score", "--checkpoint", os.path.join(BASE, "reward_model"), "--input",
                scored, "--output", scored], [scored])

# Bounds on untrusted sizes (docs/reliability.md): a size read from a file is bounded before
# anything is looped over or allocated, JSON nesting is bounded in every reader, and a model path
# that is a symlink loop is named, each an exit within a second.
def deep(levels=100000):
    return b"[" * levels + b"]" * levels


for key, value in [("n_layer", 2**31), ("n_embd", 2**31), ("n_head", 2**31),
                   ("vocab_size", 2**31), ("n_positions", 2**31), ("n_inner", 2**40)]:
    hf_reads("bounds", "config-" + key, hf_dir("bounds", "config-" + key,
                                               config=config_with(**{key: value})), (4,))
bert_config = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
               "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 256,
               "max_position_embeddings": 16}
for key in ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size", "max_position_embeddings", "type_vocab_size"]:
    hf_reads("bounds", "bert-config-" + key,
             hf_dir("bounds", "bert-config-" + key, config={**bert_config, key: 2**31}), (4,))
hf_reads("bounds", "config-deep-nesting",
         hf_dir("bounds", "config-deep-nesting",
                config=json.dumps(hf_config).encode()[:-1] + b', "x": ' + deep() + b"}"), (4,))
deep_header = b'{"__metadata__": ' + deep() + b"}"
hf_reads("bounds", "safetensors-header-deep-nesting",
         hf_dir("bounds", "safetensors-header-deep-nesting",
                len(deep_header).to_bytes(8, "little") + deep_header), (4,))
# A ranked record of 12,000 completions is 72 million pairs from a file of 150 KB; 8,400 records of
# 64 completions pass the pairs a file may expand to.
many = b'{"prompt": "a", "completions": [' + b", ".join(b'"c%d"' % i for i in range(12000)) + \
    b'], "scores": [' + b", ".join(b"%d" % i for i in range(12000)) + b"]}\n"
widest = b'{"prompt": "a", "completions": [' + b", ".join(b'"c%d"' % i for i in range(64)) + \
    b'], "scores": [' + b", ".join(b"%d" % i for i in range(64)) + b"]}\n"
for recipe in ("reward_model", "dpo"):
    for name, content in [("ranked-quadratic", good_pair * 5 + many),
                          ("ranked-too-many-pairs", widest * 8400)]:
        jsonl_train_case("bounds", recipe, recipe + "-" + name, content, (3,),
                         ["train.eval_every=0", "data.val_fraction=0.2"])
jsonl_train_case("bounds", "finetune", "sft-deep-field",
                 good_line * 4 + b'{"prompt": "a", "completion": "b", "x": ' + deep() + b"}\n", (3,))
deep_pairs = write(path("bounds", "score-deep-field.jsonl"),
                   good_pair * 2 + b'{"prompt": "a", "chosen": "b", "rejected": "c", "x": ' +
                   deep() + b"}\n")
case("bounds", "score-deep-field", ["FORGE", "score", "--checkpoint", REWARD_MODEL, "--input",
                                    deep_pairs], (3,), [deep_pairs])
# Model paths that are symlink loops: the directory itself, its config.json, its weights.
loop = path("bounds", "loop-a")
os.symlink(path("bounds", "loop-b"), loop)
os.symlink(loop, path("bounds", "loop-b"))
for name, argv in [("inspect", ["inspect", loop]),
                   ("generate", ["generate", "--checkpoint", loop, "--prompt", "ab"]),
                   ("eval-data", ["eval", loop, "--data", tiny_txt]), ("eval", ["eval", loop]),
                   ("export", ["export", "--checkpoint", loop, "--format", "gguf", "--output",
                               path("bounds", "loop.gguf")])]:
    case("bounds", "symlink-loop/" + name, ["FORGE", *argv], (2, 4))
for f in ("config.json", "model.safetensors"):
    d = hf_dir("bounds", f + "-symlink-loop")
    os.remove(os.path.join(d, f))
    os.symlink(f, os.path.join(d, f))
    hf_reads("bounds", f + "-symlink-loop", d, (2, 4))


# Run directories (docs/reliability.md, "Run directories"): forge train writes only into a run
# directory (marked by .forge-run, or a run from before markers), writes no file of a run through
# a symlink, and opens none that is a FIFO; ranks started with different configs stop at set-up.
def run_dir_case(name, argv, allowed, unchanged=(), copy_run=None, listing=()):
    case("run_dir", name, argv, allowed, unchanged, copy_run=copy_run, timeout=20,
         same_listing=listing)


def planted(rel, kind, keep=()):
    return dict(replace={}, keep=list(keep), plant={os.path.join("run", rel): kind})


def train_into(d):
    return ["FORGE", "train", run_yaml, "train.max_steps=2", "output_dir=" + d]


RESUME = ["FORGE", "train", "RUN.yaml", "train.max_steps=8"]
for label, files in [("a-directory-of-the-users", {"notes.txt": b"mine\n", "config.yaml": b"a: 1\n",
                                                    "metrics.jsonl": b"not forge's\n"}),
                     ("a-repository-root", {"README.md": b"# a project\n", "Makefile": b"all:\n",
                                            os.path.join(".git", "HEAD"): b"ref: main\n"})]:
    d = os.path.dirname(path("run_dir", label, "x"))
    for rel, data in files.items():
        write(path("run_dir", label, rel), data)
    run_dir_case("train-into-" + label, train_into(d), (2,),
                 [os.path.join(d, rel) for rel in files], listing=[d])
run_dir_case("a-run-from-before-markers-resumes", RESUME, (0,),
             copy_run=planted(".forge-run", "absent", keep=older))
victim = write(path("run_dir", "victim.txt"), b"the user's own\n")
for rel in ["train.lock", "metrics.jsonl", "config.yaml", "report.html",
            os.path.join("checkpoints", "LATEST"), os.path.join("checkpoints", LATEST_NAME)]:
    run_dir_case(rel.replace(os.sep, "-") + "-is-a-symlink", RESUME, (2,), [victim],
                 copy_run=planted(rel, "symlink:" + victim, keep=older))
elsewhere = os.path.dirname(write(path("run_dir", "elsewhere", "draft.tmp"), b"a draft\n"))
run_dir_case("checkpoints-is-a-symlink", RESUME, (2,), [os.path.join(elsewhere, "draft.tmp")],
             copy_run=planted("checkpoints", "symlink:" + elsewhere), listing=[elsewhere])
# A fresh run (nothing to resume) whose metrics.jsonl links to a file of the user's: the writer
# would truncate the file.
fresh = os.path.dirname(write(path("run_dir", "fresh", ".forge-run"), b""))
os.symlink(victim, os.path.join(fresh, "metrics.jsonl"))
run_dir_case("fresh-run-metrics.jsonl-is-a-symlink", train_into(fresh), (2,), [victim])
for rel in ["metrics.jsonl", os.path.join("checkpoints", "LATEST"),
            os.path.join("checkpoints", LATEST_NAME)]:
    run_dir_case(rel.replace(os.sep, "-") + "-is-a-fifo", RESUME, (2, 4),
                 copy_run=planted(rel, "fifo", keep=older))
if shutil.which("mpirun"):
    d = os.path.dirname(path("run_dir", "ranks", "x"))
    rank = ["FORGE", "train", run_yaml, "train.max_steps=2", "train.batch_size=1",
            "train.grad_accum=2", "output_dir=" + d]
    # -q: mpirun's own notes on a failed job are not forge's error line.
    run_dir_case("ranks-started-with-different-configs",
                 ["mpirun", "-q", "--allow-run-as-root", "--oversubscribe", "-np", "1"] + rank +
                 [":", "-np", "1"] + rank + ["optimizer.lr=0.01"], (2,))

# --- the command line: sizes, vocabularies, task heads, repeated flags, bad paths ---------------
# One error line means one here: a bad path reported once per config key that holds it fails.
def cli(name, argv, allowed, unchanged=(), listing=(), timeout=10):
    case("cli", name, argv, allowed, unchanged, same_listing=listing, timeout=timeout,
         config_lines=False)


cli_prompts = write(path("cli", "prompts.txt"), b"To be\nor not\n")
missing = path("cli", "missing.txt")
# Sizes from flags are bounded before the model loads or anything is allocated (within a second).
for label, flags in [("num-samples-10^9", ["--max-new-tokens", "2", "--num-samples", "1000000000"]),
                     ("batch-size-10^9", ["--max-new-tokens", "2", "--num-samples", "30000000",
                                          "--batch-size", "1000000000"]),
                     ("max-new-tokens-past-context", ["--max-new-tokens", "100"])]:
    cli("generate-" + label, ["FORGE", "generate", "--checkpoint", RUN, "--prompts", cli_prompts,
                              *flags], (2,), [GOOD, cli_prompts], timeout=3)
# A model whose vocabulary (320) is padded past its tokenizer's (bytes): no id past 255 is drawn.
PADDED = os.path.join(BASE, "padded")
cli("generate-padded-vocabulary", ["FORGE", "generate", "--checkpoint", PADDED, "--prompt", "ab",
                                   "--max-new-tokens", "14", "--temperature", "3"], (0,))
cli("generate-padded-vocabulary-batched",
    ["FORGE", "generate", "--checkpoint", PADDED, "--prompts", cli_prompts, "--max-new-tokens",
     "10", "--num-samples", "16", "--temperature", "3", "--top-k", "0"], (0,))
# A NaN or an infinity in a Hugging Face directory's weights: exit 4, as training refuses them.
hf_first = next(k for k in header if k != "__metadata__" and header[k]["dtype"] == "F32")
for label, value in [("nan", b"\x00\x00\xc0\x7f"), ("inf", b"\x00\x00\x80\x7f")]:
    start = 8 + hf_header_len + header[hf_first]["data_offsets"][0]
    d = hf_dir("cli", "hf-weight-" + label, hf_weights[:start] + value + hf_weights[start + 4:])
    files = [os.path.join(d, f) for f in sorted(os.listdir(d))]
    cli(f"hf-weight-{label}/inspect", ["FORGE", "inspect", d], (4,), files)
    cli(f"hf-weight-{label}/generate", ["FORGE", "generate", "--checkpoint", d, "--prompt", "ab",
                                        "--max-new-tokens", "2"], (4,), files)
    cli(f"hf-weight-{label}/eval", ["FORGE", "eval", d, "--data", tiny_txt], (4,), files)
# A reward model or a classifier is intact: no export format holds its task head (exit 2).
for model in ["reward_model", "classifier"]:
    run = os.path.join(BASE, model)
    run_files = [os.path.join(dp, f) for dp, _, fs in os.walk(run) for f in fs]
    out_dir = os.path.dirname(path("cli", "export-" + model, "x"))
    for how in [["--format", "hf"], ["--format", "peft"], ["--format", "gguf"], ["--merge"]]:
        cli(f"export-{model}-{how[-1].lstrip('-')}",
            ["FORGE", "export", "--checkpoint", run, *how, "--output",
             os.path.join(out_dir, "out")], (2,), run_files, [out_dir])
# An option given twice is refused, not silently replaced by the second.
cli_out = os.path.dirname(path("cli", "twice", "x"))
cli("twice-prompt", ["FORGE", "generate", "--checkpoint", RUN, "--prompt", "a", "--prompt", "b"],
    (2,))
cli("twice-output", ["FORGE", "generate", "--checkpoint", RUN, "--prompts", cli_prompts,
                     "--max-new-tokens", "2", "--output", os.path.join(cli_out, "x.jsonl"),
                     "--output=" + os.path.join(cli_out, "y.jsonl")], (2,), [cli_prompts],
    [cli_out])
cli("twice-export-output", ["FORGE", "export", "--checkpoint", RUN, "--format", "gguf", "--output",
                            os.path.join(cli_out, "a.gguf"), "--output",
                            os.path.join(cli_out, "b.gguf")], (2,), [GOOD], [cli_out])
cli("twice-input", ["FORGE", "prepare", "--tokenizer", "bytes", "--input", tiny_txt, "--input",
                    tiny_txt, "--output", os.path.join(cli_out, "t.h5")], (2,), [tiny_txt],
    [cli_out])
cli("twice-merge", ["FORGE", "export", "--checkpoint", RUN, "--merge", "--merge", "--output",
                    os.path.join(cli_out, "m.h5")], (2,), [GOOD], [cli_out])
# The shipped gpt2 tokenizer from a working directory that is not the repository's.
cli("gpt2-from-elsewhere", ["FORGE", "tokenize", "--tokenizer", "gpt2", "--text", "hello"], (0,))
# A bad path in each command's file options is one error line.
for label, argv, allowed in [
        ("eval-data", ["FORGE", "eval", HF, "--data", missing], (2, 3)),
        ("eval-data-directory", ["FORGE", "eval", HF, "--data", OUT], (2, 3)),
        ("eval-data-fifo", ["FORGE", "eval", HF, "--data", fifo], (2, 3)),
        ("eval-target", ["FORGE", "eval", missing], (2, 4)),
        ("generate-checkpoint", ["FORGE", "generate", "--checkpoint", missing, "--prompt", "a"],
         (2, 4)),
        ("generate-prompts", ["FORGE", "generate", "--checkpoint", RUN, "--prompts", missing],
         (2, 3)),
        ("predict-input", ["FORGE", "predict", "--checkpoint", os.path.join(BASE, "classifier"),
                           "--input", missing], (2, 3)),
        ("score-input", ["FORGE", "score", "--checkpoint", os.path.join(BASE, "reward_model"),
                         "--input", missing], (2, 3)),
        ("export-checkpoint", ["FORGE", "export", "--checkpoint", missing, "--format", "gguf",
                               "--output", os.path.join(cli_out, "e.gguf")], (2, 4)),
        ("tokenize-input", ["FORGE", "tokenize", "--tokenizer", "bytes", "--input", missing],
         (2, 3)),
        ("tokenize-tokenizer", ["FORGE", "tokenize", "--tokenizer", missing, "--text", "a"],
         (2, 3)),
        ("prepare-input", ["FORGE", "prepare", "--tokenizer", "bytes", "--input", missing,
                           "--output", os.path.join(cli_out, "p.h5")], (2, 3)),
        ("tokenizer-train-input", ["FORGE", "tokenizer", "train", "--vocab-size", "300", "--input",
                                   missing, "--output", os.path.join(cli_out, "tok")], (2, 3)),
        ("validate", ["FORGE", "validate", missing], (2,)),
        ("train-data", ["FORGE", "train", run_yaml, "data.train=" + missing,
                        "output_dir=" + os.path.join(cli_out, "run")], (2, 3))]:
    cli("bad-path-" + label, argv, allowed)

with open(os.path.join(OUT, "manifest.jsonl"), "w") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
print(f"make_hostile_cases: {len(cases)} cases in {OUT}", file=sys.stderr)
