#!/usr/bin/env bash
# Regenerates the seed corpora in fuzz/corpus/ with forge itself, so the HDF5 seeds are exactly
# the files Forge writes. usage: fuzz/make_seeds.sh FORGE-BINARY
set -euo pipefail
forge="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
corpus="$root/fuzz/corpus"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$corpus"/{config,tokenizer,checkpoint,token_dataset,safetensors,jinja}

cp "$root/configs/gpt_shakespeare.yaml" "$root/configs/bert_shakespeare.yaml" \
   "$root/configs/gpt_fortunes_lora.yaml" "$root/configs/gpt_fortunes_sft.yaml" \
   "$root/tests/recipes/configs/gpt_tiny.yaml" "$root/tests/recipes/configs/three_errors.yaml" \
   "$corpus/config/"

# A checkpoint as small as a GPT gets (the seed's size bounds the fuzzer's speed).
head -c 400 "$root/data/samples/tinyshakespeare.txt" > "$tmp/tiny.txt"
cat > "$tmp/run.yaml" <<YAML
recipe: gpt_pretrain
output_dir: $tmp/run
model: {arch: gpt, vocab_size: 256, context: 4, d_model: 4, n_layers: 1, n_heads: 1}
data: {tokenizer: bytes, train: $tmp/tiny.txt, val_fraction: 0.2}
train: {batch_size: 1, max_steps: 1, save_every: 1, eval_every: 1, eval_batches: 1}
YAML
"$forge" train "$tmp/run.yaml" >/dev/null
cp "$tmp/run/checkpoints/step-000001.h5" "$corpus/checkpoint/gpt-tiny.h5"
# The same model as Forge exports it for transformers, and one tensor of each float dtype.
"$forge" export --checkpoint "$tmp/run" --format hf --output "$tmp/hf" >/dev/null
cp "$tmp/hf/model.safetensors" "$corpus/safetensors/gpt-tiny.safetensors"
/usr/bin/python3 - "$corpus/safetensors/dtypes.safetensors" <<'PY'
import json, struct, sys
tensors = [("h", "F16", [2], struct.pack("<2H", 0x3c00, 0x0001)),
           ("b", "BF16", [1, 1], struct.pack("<H", 0x3f80)),
           ("d", "F64", [1], struct.pack("<d", 0.5)),
           ("i", "I64", [1], struct.pack("<q", 7)),
           ("e", "F32", [0, 2], b"")]
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name, dtype, shape, data in tensors:
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
text = json.dumps(header).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))
PY

printf 'First document.\n' > "$tmp/a.txt"
printf 'Second one, a little longer.\n' > "$tmp/b.txt"
"$forge" prepare --tokenizer bytes --input "$tmp/a.txt" "$tmp/b.txt" \
  --output "$corpus/token_dataset/bytes-2docs.h5" >/dev/null
"$forge" prepare --tokenizer bytes --records lines --input "$tmp/tiny.txt" \
  --output "$corpus/token_dataset/bytes-lines.h5" >/dev/null

# The writer's chunked layout preallocates ~170 KB; the same datasets and attributes stored
# contiguously (any layout is valid, docs/data.md) keep the seeds a few KB, which the fuzzer mutates
# far faster.
/usr/bin/python3 - "$corpus"/token_dataset/*.h5 <<'PY'
import os, sys
import h5py
for f in sys.argv[1:]:
    with h5py.File(f) as src, h5py.File(f + ".new", "w", libver="earliest") as dst:
        def copy(name, obj):
            new = (dst.create_dataset(name, data=obj[()]) if isinstance(obj, h5py.Dataset)
                   else dst.require_group(name))
            for k, v in obj.attrs.items():
                new.attrs[k] = v
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        src.visititems(copy)
    os.replace(f + ".new", f)
PY

# Tokenizer inputs are two files split at a NUL byte, read as encoder.json + vocab.bpe and as
# vocab.txt + tokenizer_config.json (fuzz/fuzz_tokenizer.cpp).
/usr/bin/python3 - "$corpus/tokenizer" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
u = {b: chr(c) for b, c in zip(bs, cs)}
enc = {u[b]: i for i, b in enumerate(sorted(bs, key=lambda b: bs.index(b)))}
merges = [(u[ord("t")], u[ord("h")]), (u[ord("t")] + u[ord("h")], u[ord("e")]), (u[32], u[ord("a")])]
for a, b in merges:
    enc[a + b] = len(enc)
enc["<|endoftext|>"] = len(enc)
text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
open(sys.argv[1] + "/small.bin", "wb").write(json.dumps(enc).encode() + b"\0" + text.encode())
open(sys.argv[1] + "/bytes-only.bin", "wb").write(
    json.dumps({u[b]: i for i, b in enumerate(bs)}).encode() + b"\0#version: 0.2\n")
PY

# A WordPiece vocabulary with BERT's specials and tokenizer_config.json.
printf '[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##lo\nhe\n,\n\xe4\xb8\xad\n##\xc3\xa9\0%s' \
  '{"do_lower_case": true, "strip_accents": null, "tokenize_chinese_chars": true}' \
  > "$corpus/tokenizer/wordpiece.bin"

# Chat templates (fuzz/fuzz_jinja.cpp): the published ones of the parity test and the interpreter
# test's snippets, one feature each.
cp "$root"/tests/golden/chat_templates/*.jinja "$corpus/jinja/"
/usr/bin/python3 - "$root/tests/golden/chat_templates/snippets.expected.jsonl" "$corpus/jinja" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1], encoding="utf-8")):
    with open(f"{sys.argv[2]}/snippet-{i:02d}.jinja", "w", encoding="utf-8", newline="") as f:
        f.write(json.loads(line)["template"])
PY
