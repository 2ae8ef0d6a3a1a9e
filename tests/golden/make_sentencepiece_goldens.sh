#!/usr/bin/env bash
# Regenerates tests/golden/sentencepiece/: two small SentencePiece models trained by Debian's
# spm_train on the sample corpora (a Llama-style BPE: identity normalisation, whitespace kept,
# digits split, byte fallback, two user-defined symbols; and a unigram with the default NFKC
# normalisation, byte fallback, a control and a user-defined symbol), and, for each, expected.jsonl
# made by python3-sentencepiece over its own texts and tests/golden/tokenizers/texts.jsonl (read by
# tests/data/test_sentencepiece.cpp). Run from the repo root:
#   tests/golden/make_sentencepiece_goldens.sh
set -euo pipefail
out=tests/golden/sentencepiece
# A fixed work directory: spm_train records its input's path in the model, so the same path gives
# the same bytes on every run.
tmp=/tmp/forge_sentencepiece_goldens
rm -rf "$tmp" && mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cat data/samples/fortunes/*.txt data/samples/tinyshakespeare.txt > "$tmp/corpus.txt"
mkdir -p "$out"
# One thread and a fixed seed: the pieces then come out the same on every run.
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/bpe" --model_type=bpe --vocab_size=1000 \
  --byte_fallback=true --character_coverage=1.0 --normalization_rule_name=identity \
  --remove_extra_whitespaces=false --split_digits=true --allow_whitespace_only_pieces=true \
  --user_defined_symbols='<sep>,<|user|>' --num_threads=1 --random_seed=1 >/dev/null 2>&1
spm_train --input="$tmp/corpus.txt" --model_prefix="$tmp/unigram" --model_type=unigram \
  --vocab_size=1000 --byte_fallback=true --control_symbols='<mask>' --user_defined_symbols='<sep>' \
  --num_threads=1 --random_seed=1 >/dev/null 2>&1
cp "$tmp/bpe.model" "$out/bpe.model"
cp "$tmp/unigram.model" "$out/unigram.model"
/usr/bin/python3 - "$out" <<'PY'
# Per text: "ids" as Forge's SentencePieceTokenizer should give them: the text cut at control
# symbols and <unk> (leftmost first; Hugging Face's slow LlamaTokenizer cuts at its special tokens
# the same way), each run sp.encode'd on its own; "offsets" the pieces' byte spans (an empty span
# widened to the span of the piece after it that starts at the same byte, as the C++ does);
# "decoded" sp.decode of the runs with control symbols and <unk> written as their text; "ids_with_specials"
# BOS + ids (LlamaTokenizer's default add_bos_token); "ids_nonlegacy" what LlamaTokenizer gives with
# "legacy": false (its tokenize and _tokenize written out below over a copy of the model without
# add_dummy_prefix, made as it makes it, by merging a NormalizerSpec), with "offsets_nonlegacy".
import json
import sys

import sentencepiece as spm

out = sys.argv[1]
texts = [
    "Hello world", "", " ", "  leading", "trailing  ", "a  b   c    d", "\ttab\t\tx", "a\nb\n\nc",
    "a\r\nb", "\u00a0nbsp\u3000ideographic\u2003em", "12345 3.14 1,000,000 x1y22", "٣٤٥ Ⅻ ½ ①",
    "日本語のテキスト", "中文分词测试，标点。", "한국어 텍스트", "混合 mixed 文字 text",
    "😀 👍🏽 👨‍👩‍👧 🇫🇷", "e\u0301 a\u0300\u0301 n\u0303o Z\u0351\u0345", "ﬁ ﬀ Ⅸ ｈａｌｆ",
    "\x00\x01\x1b[31mred\x7f", "a\u0085b\u200bc\u2028d", "▁ already ▁▁ marked",
    "<s>Hello</s>", "Hello <s> world</s><sep>x<|user|>y<mask>", "<unk> and <s><s>", "<sep><sep>",
    "To be, or not to be: that is the question.",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "O Romeo, Romeo! wherefore art thou Romeo?", "A" * 300,
]
# And the texts of the tokenizer.json parity fixtures (tests/golden/tokenizers/README.md).
with open("tests/golden/tokenizers/texts.jsonl") as f:
    texts += [json.loads(line)["text"] for line in f]

for name in ("bpe", "unigram"):
    sp = spm.SentencePieceProcessor(model_file=f"{out}/{name}.model")
    cut = [(sp.id_to_piece(i), i) for i in range(sp.get_piece_size())
           if sp.is_control(i) or sp.is_unknown(i)]

    def runs(text):
        at = 0
        while at < len(text):
            hits = [(text.find(t, at), k) for k, (t, _) in enumerate(cut) if text.find(t, at) >= 0]
            if not hits:
                yield text[at:], None
                return
            pos, k = min(hits)
            if pos > at:
                yield text[at:pos], None
            yield cut[k][0], cut[k][1]
            at = pos + len(cut[k][0])

    proto = open(f"{out}/{name}.model", "rb").read()
    plain = spm.SentencePieceProcessor()
    plain.LoadFromSerializedProto(proto + b"\x1a\x02\x18\x00")
    unk = sp.id_to_piece(sp.unk_id())
    unk_length = len(plain.encode(unk))

    def encode_run(proc, run, base, skip=0, shift=0):
        spt = proc.encode(run, out_type="immutable_proto")
        # The Python binding reports character spans; Forge's are bytes.
        byte_at = [len(run[:k].encode()) for k in range(len(run) + 1)]
        pieces = list(spt.pieces)[skip:]
        spans = [[base + max(byte_at[p.begin], shift) - shift,
                  base + max(byte_at[p.end], shift) - shift] for p in pieces]
        for k in range(len(spans) - 1, 0, -1):
            if spans[k - 1][0] == spans[k - 1][1] == spans[k][0]:
                spans[k - 1] = spans[k]
        return [p.id for p in pieces], [p.piece for p in pieces], spans

    def nonlegacy(text):
        if not text:
            return [], []
        shifted, origin = "▁", [0, 0, 0]
        for k, c in enumerate(text):
            at = len(text[:k].encode())
            shifted += " " if c == "▁" else c
            origin += [at] if c == "▁" else [at + j for j in range(len(c.encode()))]
        origin.append(len(text.encode()))
        ids, pieces, offsets, base = [], [], [], 0
        for run, special in runs(shifted):
            if special is not None:
                ids.append(special)
                pieces.append(run)
                offsets.append([base, base + len(run.encode())])
            elif not run.startswith(("▁", " ")):
                i, p, o = encode_run(plain, run, base)
                ids, pieces, offsets = ids + i, pieces + p, offsets + o
            else:
                n = len(plain.encode(unk + run))
                i, p, o = encode_run(plain, unk + run, base, unk_length if n >= unk_length else 0,
                                     len(unk.encode()))
                ids, pieces, offsets = ids + i, pieces + p, offsets + o
            base += len(run.encode())
        if len(pieces) > 1 and pieces[0] == "▁" and ids[1] in [i for _, i in cut]:
            ids, offsets = ids[1:], offsets[1:]
        return ids, [[origin[b], origin[e]] for b, e in offsets]

    with open(f"{out}/{name}_expected.jsonl", "w") as f:
        for text in texts:
            ids, pieces, offsets, decoded, run_ids = [], [], [], "", []
            base = 0
            for run, special in runs(text):
                if special is not None:
                    decoded += sp.decode(run_ids) + run
                    run_ids = []
                    ids.append(special)
                    pieces.append(run)
                    offsets.append([base, base + len(run.encode())])
                else:
                    i, p, o = encode_run(sp, run, base)
                    ids, run_ids, pieces, offsets = ids + i, run_ids + i, pieces + p, offsets + o
                base += len(run.encode())
            decoded += sp.decode(run_ids)
            if not any(s is not None for _, s in runs(text)):
                assert ids == sp.encode(text) and decoded == sp.decode(sp.encode(text))
            ids_nonlegacy, offsets_nonlegacy = nonlegacy(text)
            f.write(json.dumps({"text": text, "ids": ids, "pieces": pieces, "offsets": offsets,
                                "decoded": decoded, "ids_with_specials": [sp.bos_id()] + ids,
                                "ids_nonlegacy": ids_nonlegacy,
                                "offsets_nonlegacy": offsets_nonlegacy},
                               ensure_ascii=False) + "\n")
PY
