#!/usr/bin/env bash
# Regenerates tests/golden/sentencepiece/: two small SentencePiece models trained by Debian's
# spm_train on the sample corpora (a Llama-style BPE: identity normalisation, whitespace kept,
# digits split, byte fallback, two user-defined symbols; and a unigram with the default NFKC
# normalisation, byte fallback, a control and a user-defined symbol), and, for each, expected.jsonl
# made by python3-sentencepiece (read by tests/data/test_sentencepiece.cpp). Run from the repo root:
#   tests/golden/make_sentencepiece_goldens.sh
set -euo pipefail
out=tests/golden/sentencepiece
tmp=$(mktemp -d)
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
# BOS + ids (LlamaTokenizer's default add_bos_token).
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
                    spt = sp.encode(run, out_type="immutable_proto")
                    # The Python binding reports character spans; Forge's are bytes.
                    byte_at = [len(run[:k].encode()) for k in range(len(run) + 1)]
                    spans = [[base + byte_at[p.begin], base + byte_at[p.end]] for p in spt.pieces]
                    for k in range(len(spans) - 1, 0, -1):
                        if spans[k - 1][0] == spans[k - 1][1] == spans[k][0]:
                            spans[k - 1] = spans[k]
                    ids += [p.id for p in spt.pieces]
                    run_ids += [p.id for p in spt.pieces]
                    pieces += [p.piece for p in spt.pieces]
                    offsets += spans
                base += len(run.encode())
            decoded += sp.decode(run_ids)
            if not any(s is not None for _, s in runs(text)):
                assert ids == sp.encode(text) and decoded == sp.decode(sp.encode(text))
            f.write(json.dumps({"text": text, "ids": ids, "pieces": pieces, "offsets": offsets,
                                "decoded": decoded, "ids_with_specials": [sp.bos_id()] + ids},
                               ensure_ascii=False) + "\n")
PY
