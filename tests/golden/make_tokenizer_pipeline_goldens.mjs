// Regenerates tests/golden/tokenizer_pipeline.jsonl: what Hugging Face's `tokenizers` (the npm
// package of its Rust library) makes of tokenizer.json components, for
// tests/data/test_tokenizer_pipeline.cpp. One JSON object a line:
//   {"kind": "encode", "normalizer", "pre_tokenizer", "specials", "text", "normalized", "pieces",
//    "tokens", "offsets"}: a tokenizer whose BPE model has every character as a token and no
//    merges, so each token is one character of the normalized, pre-tokenized text and its offsets
//    are that character's alignment; "pieces" is preTokenizeString's split of the normalized text.
//   {"kind": "decode", "decoder", "tokens", "decoded"}
//   {"kind": "post", "pre_tokenizer", "post_processor", "vocab", "text", "add_special_tokens",
//    "ids", "offsets"}: a WordLevel model with one token per pre-tokenized piece.
// Offsets are UTF-8 byte offsets into "text" (the library reports characters). Run from the repo
// root:
//   npm install --prefix /tmp/tokpipe-npm tokenizers
//   NODE_PATH=/tmp/tokpipe-npm/node_modules node tests/golden/make_tokenizer_pipeline_goldens.mjs
import { createRequire } from "node:module";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "node_modules", "x.js"));
const tk = require("tokenizers");

const texts = [
  "Hello World! How's it going?",
  "  leading and trailing  ",
  "a   b\t\tc\n\nd \r\n e",
  "中文字符 and 日本語のテキスト",
  "한국어 텍스트",
  "👋🏽 hello 👨‍👩‍👧 world 🌍!",
  "café naïve Ångström",
  "cafe\u0301 a\u0328\u0301 a\u0301\u0328 \u1E0B\u0323 q\u0307\u0323 \u0301x",
  "ﬁ ① ² ½ ǅ ㎒ Ⅻ",
  "İstanbul ΣΑΣ ẞ Straße",
  "x1 y22 z333 1234567 3.14 ١٢٣",
  "ctrl\u0000a\u0007b\u001Bc\u200Bd\uFEFFe\u00ADf\uE000g",
  "don't I'll WE'RE you've",
  "tab\tsep\u3000ideo\u00A0nbsp\u2028line",
  "(a) [b] {c} ~tilde~ a--b ...!?",
  "▁already▁spaced ▁",
  " ",
  "",
];

const llama3 =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const split = (pattern, behavior, invert = false) => ({ type: "Split", pattern, behavior, invert });
const byteLevel = (add_prefix_space, use_regex = true) =>
  ({ type: "ByteLevel", add_prefix_space, trim_offsets: true, use_regex });
const metaspace = (prepend_scheme, split = true) =>
  ({ type: "Metaspace", replacement: "▁", prepend_scheme, split });
const replace = (pattern, content) => ({ type: "Replace", pattern, content });
const bert = (clean_text, handle_chinese_chars, strip_accents, lowercase) =>
  ({ type: "BertNormalizer", clean_text, handle_chinese_chars, strip_accents, lowercase });

const normalizers = [
  { type: "NFC" }, { type: "NFD" }, { type: "NFKC" }, { type: "NFKD" }, { type: "Lowercase" },
  replace({ String: " " }, "▁"),
  replace({ Regex: "\\s+" }, " "),
  replace({ String: "~" }, "--"),
  replace({ Regex: "a*" }, "<>"),
  replace({ Regex: "^" }, "^"),
  { type: "Prepend", prepend: "▁" },
  { type: "Strip", strip_left: true, strip_right: true },
  { type: "Strip", strip_left: true, strip_right: false },
  { type: "Strip", strip_left: false, strip_right: true },
  { type: "StripAccents" },
  bert(true, true, null, true),
  bert(true, false, true, false),
  bert(false, true, false, true),
  { type: "BertNormalizer", clean_text: true, handle_chinese_chars: false, lowercase: true },
  { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, replace({ String: " " }, "▁")] },
  { type: "Sequence", normalizers: [{ type: "NFD" }, { type: "StripAccents" }, { type: "Lowercase" }] },
];

const preTokenizers = [
  split({ Regex: llama3 }, "Isolated"),
  split({ Regex: "\\p{N}{1,3}" }, "Isolated"),
  split({ Regex: "x*" }, "Isolated"),
  split({ String: " " }, "Removed"),
  split({ String: " " }, "Isolated"),
  split({ String: " " }, "MergedWithPrevious"),
  split({ String: " " }, "MergedWithNext"),
  split({ String: " " }, "Contiguous"),
  split({ String: " " }, "Removed", true),
  split({ Regex: "\\s+" }, "MergedWithNext", true),
  byteLevel(false), byteLevel(true), byteLevel(false, false),
  { type: "Sequence", pretokenizers: [split({ Regex: llama3 }, "Isolated"), byteLevel(false, false)] },
  metaspace("always"), metaspace("first"), metaspace("never"), metaspace("always", false),
  { type: "Metaspace", replacement: "▁", add_prefix_space: true },
  { type: "Digits", individual_digits: true }, { type: "Digits", individual_digits: false },
  { type: "BertPreTokenizer" }, { type: "Whitespace" }, { type: "WhitespaceSplit" },
  { type: "Punctuation" }, { type: "Punctuation", behavior: "Removed" },
  { type: "Punctuation", behavior: "Contiguous" },
  { type: "Sequence", pretokenizers: [{ type: "WhitespaceSplit" }, { type: "Digits", individual_digits: true }] },
];

// Whole pipelines as published tokenizers use them, some with special tokens in the text.
const pipelines = [
  [bert(true, true, null, true), { type: "BertPreTokenizer" }, []],
  [{ type: "NFKC" }, metaspace("first"), ["<s>", "</s>"]],
  [null, metaspace("first"), ["<s>", "</s>"]],
  [null, byteLevel(true), ["<s>", "</s>"]],
  [{ type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, replace({ String: " " }, "▁")] },
   null, ["<s>", "</s>"]],
  [{ type: "NFC" }, { type: "Sequence", pretokenizers: [split({ Regex: llama3 }, "Isolated"), byteLevel(false, false)] },
   ["<|begin_of_text|>"]],
];
const specialTexts = ["<s>special</s> tokens <s>", "<s> a  b </s>x", "x<|begin_of_text|> y", "<s>"];

// Byte offsets of each character boundary of `text`.
function byteOffsets(text) {
  const out = [0];
  for (const c of text) out.push(out[out.length - 1] + Buffer.byteLength(c));
  return out;
}

function tokenizerJson({ normalizer = null, pre_tokenizer = null, post_processor = null,
                         decoder = null, specials = [], model }) {
  return JSON.stringify({
    version: "1.0", truncation: null, padding: null,
    added_tokens: specials.map((content, k) => ({
      id: 100000 + k, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special: true,
    })),
    normalizer, pre_tokenizer, post_processor, decoder, model,
  });
}

const lines = [];

async function encodeCase(normalizer, pre_tokenizer, specials, text) {
  const plain = tk.Tokenizer.fromString(tokenizerJson({ normalizer, pre_tokenizer,
    model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" } }));
  const normalized = plain.getNormalizer() ? plain.getNormalizer().normalizeString(text) : text;
  const split = plain.getPreTokenizer() ? plain.getPreTokenizer().preTokenizeString(normalized)
                                        : [[normalized, [0, Array.from(normalized).length]]];
  const chars = new Set([...text, ...normalized, ...tk.byteLevelAlphabet(), "▁"]);
  for (const [piece] of split) for (const c of piece) chars.add(c);
  const vocab = {};
  [...chars].forEach((c, k) => (vocab[c] = k));
  const tok = tk.Tokenizer.fromString(tokenizerJson({ normalizer, pre_tokenizer, specials,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
             ignore_merges: false, vocab, merges: [] } }));
  const enc = await tok.encode(text, null, { addSpecialTokens: false });
  const at = byteOffsets(text);
  const line = { kind: "encode", normalizer, pre_tokenizer, specials, text,
                 tokens: enc.getTokens(), offsets: enc.getOffsets().map(([b, e]) => [at[b], at[e]]) };
  if (specials.length === 0) {
    line.normalized = normalized;
    if (normalizer === null) line.pieces = split.map(([s, [b, e]]) => [s, [at[b], at[e]]]);
  }
  lines.push(line);
}

for (const text of texts) {
  for (const n of normalizers) await encodeCase(n, null, [], text);
  for (const p of preTokenizers) await encodeCase(null, p, [], text);
}
for (const [n, p, specials] of pipelines)
  for (const text of [...texts.slice(0, 8), ...specialTexts]) await encodeCase(n, p, specials, text);

const decoders = [
  [{ type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
   [["Hello", "Ġworld", "Ġ", "ðŁ", "ĳ", "ĭ", "!"], ["ðŁ"], ["hello", "中", "Ġx"], ["Ã", "©", "ÿ"]]],
  [{ type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
   [["▁Hello", "▁world", "▁", "▁▁x"], ["a▁b▁", "▁c"]]],
  [{ type: "Metaspace", replacement: "▁", prepend_scheme: "never", split: true },
   [["▁Hello", "▁world"]]],
  [{ type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
   [["▁Hello", "▁world"]]],
  [{ type: "ByteFallback" },
   [["<0x41>", "<0xE4>", "<0xB8>", "<0xAD>", "x", "<0xFF>", "<0xE4>", "<0x+9>", "<0x4G>", "<0x41"],
    ["<0xE4>", "<0xB8>"], ["<0xe4>", "<0xb8>", "<0xad>"]]],
  [{ type: "Fuse" }, [["a", "b", "", "c"], []]],
  [{ type: "Strip", content: " ", start: 1, stop: 0 }, [[" hello", "  x", " ", ""]]],
  [{ type: "Strip", content: "▁", start: 2, stop: 1 }, [["▁▁▁a▁▁", "b▁", "x▁▁"]]],
  [{ type: "Replace", pattern: { String: "▁" }, content: " " }, [["▁Hello", "▁▁world▁"]]],
  [{ type: "Replace", pattern: { Regex: "[0-9]+" }, content: "#" }, [["a12b3", "x"]]],
  [{ type: "WordPiece", prefix: "##", cleanup: true },
   [["hello", "##world", ",", "do", "not", "i", "'", "m", "n't", ".", "it", "'s"]]],
  [{ type: "WordPiece", prefix: "##", cleanup: false }, [["hello", "##world", ",", "."]]],
  [{ type: "BPEDecoder", suffix: "</w>" }, [["hel", "lo</w>", "wor", "ld</w>"], ["a</w>b"]]],
  [{ type: "Sequence", decoders: [
      { type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" },
      { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
   [["▁Hello", "<0xE4>", "<0xB8>", "<0xAD>", "▁world"], ["<0xE4>", "▁x"]]],
];
for (const [decoder, cases] of decoders) {
  const tok = tk.Tokenizer.fromString(tokenizerJson({ decoder,
    model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" } }));
  for (const tokens of cases)
    lines.push({ kind: "decode", decoder, tokens, decoded: tok.getDecoder().decode(tokens) });
}

const template = (single) => ({
  type: "TemplateProcessing", single,
  pair: [...single, { Sequence: { id: "B", type_id: 1 } }],
  special_tokens: {
    "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [7], tokens: ["<|begin_of_text|>"] },
    "<pair>": { id: "<pair>", ids: [5, 6], tokens: ["<", "pair>"] },
  },
});
const bos = { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } };
const seqA = { Sequence: { id: "A", type_id: 0 } };
const pair = { SpecialToken: { id: "<pair>", type_id: 0 } };
const processors = [
  { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  { type: "RobertaProcessing", sep: ["</s>", 2], cls: ["<s>", 0], trim_offsets: true, add_prefix_space: true },
  { type: "RobertaProcessing", sep: ["</s>", 2], cls: ["<s>", 0], trim_offsets: false, add_prefix_space: false },
  { type: "BertProcessing", sep: ["[SEP]", 102], cls: ["[CLS]", 101] },
  template([bos, seqA]),
  template([pair, seqA, bos, seqA]),
  { type: "Sequence", processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      template([bos, seqA])] },
  { type: "Sequence", processors: [
      template([bos, seqA]),
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] },
];
const postTexts = [" Hello  world ", "Hello world", "  spaced   out  ", "a\n\nb", "x"];
for (const add_prefix_space of [true, false])
  for (const post_processor of processors)
    for (const text of postTexts) {
      const pre_tokenizer = byteLevel(add_prefix_space);
      const pre = tk.Tokenizer.fromString(tokenizerJson({ pre_tokenizer,
        model: { type: "WordLevel", vocab: { "[UNK]": 0 }, unk_token: "[UNK]" } }));
      const vocab = { "[UNK]": 99 };
      for (const [piece] of pre.getPreTokenizer().preTokenizeString(text))
        if (!(piece in vocab)) vocab[piece] = 200 + Object.keys(vocab).length;
      const tok = tk.Tokenizer.fromString(tokenizerJson({ pre_tokenizer, post_processor,
        model: { type: "WordLevel", vocab, unk_token: "[UNK]" } }));
      const at = byteOffsets(text);
      for (const add_special_tokens of [false, true]) {
        const enc = await tok.encode(text, null, { addSpecialTokens: add_special_tokens });
        lines.push({ kind: "post", pre_tokenizer, post_processor, vocab, text, add_special_tokens,
                     ids: enc.getIds(), offsets: enc.getOffsets().map(([b, e]) => [at[b], at[e]]) });
      }
    }

writeFileSync("tests/golden/tokenizer_pipeline.jsonl", lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
console.log(`wrote ${lines.length} cases to tests/golden/tokenizer_pipeline.jsonl`);
