// Regenerates tests/golden/tokenizers/: tokenizer.json files of five families, trained with Hugging
// Face's own `tokenizers` library (its Rust code, through the npm package) and laid out like the
// published files, plus the ids, offsets and decoded text that library gives for texts.jsonl.
// Forge's tokenizer.json reader must reproduce expected.jsonl exactly. Run from the repo root:
//   npm install --prefix /tmp/tokref-npm tokenizers        (0.23.2 made the committed files)
//   NODE_PATH=/tmp/tokref-npm/node_modules node tests/golden/make_tokenizer_goldens.mjs
//
// Families (each trained on 30 KB of Tiny Shakespeare plus a multilingual paragraph, then cut to
// a small vocabulary so the files stay small; the JSON around the model is written by hand from
// the published files, since the trainer only writes its own defaults):
//   llama3     byte-level BPE, Llama 3's Split regex then ByteLevel without its regex,
//              ignore_merges, TemplateProcessing adding <|begin_of_text|>; merges as "a b" strings.
//   sp_bpe     SentencePiece-style BPE as in TinyLlama / Llama 2: Prepend("▁") and Replace(" ",
//              "▁") normalizers, no pre-tokenizer, byte_fallback with <0x00>..<0xFF>, fuse_unk,
//              decoder Replace, ByteFallback, Fuse, Strip; TemplateProcessing adding <s>.
//   wordpiece  BERT uncased: BertNormalizer, BertPreTokenizer, WordPiece (each trained BPE piece
//              as a word start and as a "##" continuation), [CLS] A [SEP], WordPiece decoder.
//   chatml     Qwen2: NFC, Qwen2's Split regex, ByteLevel; <|endoftext|> <|im_start|> <|im_end|>
//              special, <tool_call> (lstrip and rstrip) and Ångström (normalized) not special;
//              merges as ["a", "b"] pairs (the form tokenizers >= 0.20 writes).
//   metaspace  Metaspace (prepend_scheme "first") then Digits(individual_digits), BPE with
//              byte_fallback, decoder ByteFallback then Metaspace; <s> A </s>.
// Offsets in expected.jsonl are UTF-8 byte offsets (the npm package reports code points).
import { createRequire } from "node:module";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "node_modules", "x.js"));
const tk = require("tokenizers");

const OUT = "tests/golden/tokenizers";
const shakespeare = readFileSync("data/samples/tinyshakespeare.txt", "utf8");

// Llama 3's and Qwen2's pre-tokenizer regexes, which differ only in how many digits a number
// piece takes.
const splitRegex = (digits) =>
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" +
  digits +
  "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_REGEX = splitRegex("{1,3}");
const QWEN2_REGEX = splitRegex("");

// ---------------------------------------------------------------------------------------------
// The texts: every case a tokenizer.json reader tends to get wrong.
const texts = [
  "Hello, world!",
  "",
  "中文字符和日本語のテキスト、한국어",
  "mixed 中文 and English 混合文本",
  "hello 👋 world 🌍!",
  "family 👨‍👩‍👧‍👦 and rainbow 🏳️‍🌈 and 🧑🏽‍💻",
  "flags 🇫🇷🇯🇵 🇺🇸!",
  "👋🏽👍🏿",
  "e\u0301 vs \u00e9, n\u0303, a\u0308\u0304 and Z\u0351\u0334a\u0315\u0360l\u0327g\u0316o",
  "A\u030angstr\u00f6m and \u00c5ngstr\u00f6m",
  "\ufb01sh \ufb02our \u2460 \u2461 \u00bd " +
    "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48 \u2122 \u33a1",
  "a  b   c    d          e",
  "\tindent\t\ttabs\t",
  "line1\r\nline2\r\n\r\nline4",
  "trailing spaces   ",
  "   leading spaces",
  "nbsp\u00a0here\u00a0\u00a0and ideographic\u3000space\u3000\u3000end",
  "\n\n\n",
  "    ",
  "7 42 123 2024 31415 271828 1234567",
  "3.14159, 1,000,000 and x1y22z333",
  "\u0663\u0664\u0665 \u216b \u00bd \u00b2",
  "nul\u0000bell\u0007esc\u001b[0m end",
  "\u0000",
  "it's the cat's; WE'LL go, you'd, I'M, she'S, they've, don't",
  "rock'n'roll ''s ' 's",
  "<|begin_of_text|>Hello<|eot_id|><|end_of_text|>",
  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
  "[CLS] bert [SEP] [MASK] [UNK] [PAD]",
  "<s> sentencepiece </s> <unk> \u2581already\u2581metaspace",
  "call  <tool_call>  {\"x\": 1}  <tool_call>done",
  "<|endoftext <|im_start <s [CLS",
  "def f(x):\n    return x ** 2  # square\n",
  "https://example.com/path?q=1&r=2#frag",
  "Привет, мир! Ελληνικά العربية עברית",
  "नमस्ते ภาษาไทย",
  "!!!???...---> (a) [b] {c} ===",
  "\u00c0\u00c9\u00ce\u00d5\u00dc \u00e0\u00e9\u00ee\u00f5\u00fc \u00df \u1e9e \u0130\u0131",
  "a \t\n \r\n b\u000b\u000cc",
  "\u200b zero width \u200d joiner \ufeff bom \ue000",
  "supercalifragilisticexpialidocious".repeat(4),
  shakespeare.slice(1000, 1600),
  shakespeare.slice(20000, 22000).replace(/\n/g, " "),
];

// Text the trainers see besides Shakespeare, so vocabularies hold some non-ASCII merges while
// other characters in texts stay unknown (byte fallback, [UNK]).
const multilingual = [
  "中文字符 中文 日本語 テキスト 한국어 Привет мир Ελληνικά",
  "café naïve Ångström ﬁsh 👋 🌍 👍 1234567 2024 3.14",
  "<|im_start|> <|im_end|> it's WE'LL don't",
].join("\n");

// ---------------------------------------------------------------------------------------------
// JSON written in the published files' order: vocabularies by id (a JS object would put
// digit-only keys such as "7" first), two-space indentation.
class Ordered {
  constructor(entries) {
    this.entries = entries;
  }
}

function toJson(value, indent = "") {
  const inner = indent + "  ";
  if (value instanceof Ordered) {
    if (value.entries.length === 0) return "{}";
    const items = value.entries.map(
      ([k, v]) => `${inner}${JSON.stringify(k)}: ${toJson(v, inner)}`,
    );
    return `{\n${items.join(",\n")}\n${indent}}`;
  }
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    if (value.every((v) => typeof v !== "object" || v === null)) {
      if (value.length <= 2) return `[${value.map((v) => JSON.stringify(v)).join(", ")}]`;
      return `[\n${value.map((v) => inner + JSON.stringify(v)).join(",\n")}\n${indent}]`;
    }
    return `[\n${value.map((v) => inner + toJson(v, inner)).join(",\n")}\n${indent}]`;
  }
  if (value !== null && typeof value === "object") {
    return toJson(new Ordered(Object.entries(value)), indent);
  }
  return JSON.stringify(value);
}

// GPT-2's bytes_to_unicode, in its order (printable bytes first): the first 256 ids of byte-level
// vocabularies.
function byteLevelChars() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; ++b) bs.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
  for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  return cs.map((c) => String.fromCodePoint(c));
}

function addedToken(id, content, flags = {}) {
  return {
    id,
    content,
    single_word: false,
    lstrip: flags.lstrip ?? false,
    rstrip: flags.rstrip ?? false,
    normalized: flags.normalized ?? false,
    special: flags.special ?? true,
  };
}

function template(single, pair, specials) {
  const special_tokens = {};
  for (const [token, id] of specials) {
    special_tokens[token] = { id: token, ids: [id], tokens: [token] };
  }
  return { type: "TemplateProcessing", single, pair, special_tokens };
}
const special = (id, type_id = 0) => ({ SpecialToken: { id, type_id } });
const isolated = (regex) => ({
  type: "Split",
  pattern: { Regex: regex },
  behavior: "Isolated",
  invert: false,
});
const byteLevel = (add_prefix_space, trim_offsets, use_regex) => ({
  type: "ByteLevel",
  add_prefix_space,
  trim_offsets,
  use_regex,
});
const seq = (id, type_id = 0) => ({ Sequence: { id, type_id } });

// Trains the library's default trainer for `model` under `pipeline` (normalizer and
// pre-tokenizer) and returns the trained model's JSON.
function train(pipeline, model) {
  const json = {
    ...HEADER,
    added_tokens: [],
    normalizer: pipeline.normalizer ?? null,
    pre_tokenizer: pipeline.pre_tokenizer ?? null,
    post_processor: null,
    decoder: null,
    model,
  };
  const corpus = `/tmp/make_tokenizer_goldens_corpus.txt`;
  writeFileSync(corpus, shakespeare.slice(0, 30000) + "\n" + `${multilingual}\n`.repeat(10));
  const tokenizer = tk.Tokenizer.fromString(JSON.stringify(json));
  tokenizer.train([corpus]);
  const saved = "/tmp/make_tokenizer_goldens_trained.json";
  tokenizer.save(saved, false);
  return JSON.parse(readFileSync(saved, "utf8")).model;
}

const emptyBpe = { type: "BPE", vocab: {}, merges: [] };
const HEADER = { version: "1.0", truncation: null, padding: null };

// A BPE model's fields in the order tokenizers writes them, with a family's values in `fields`.
const bpeModel = (fields) => ({
  type: "BPE",
  dropout: null,
  unk_token: null,
  continuing_subword_prefix: null,
  end_of_word_suffix: null,
  fuse_unk: false,
  byte_fallback: false,
  ignore_merges: false,
  ...fields,
});
const mergePair = (m) => (Array.isArray(m) ? m : m.split(" "));

// Keeps the first `count` merges of a trained BPE model; the vocabulary becomes `base` followed by
// the merged tokens in merge order.
function cutBpe(trained, base, count) {
  const merges = trained.merges.slice(0, count).map(mergePair);
  const tokens = base.slice();
  const seen = new Set(tokens);
  for (const [a, b] of merges) {
    if (!seen.has(a) || !seen.has(b)) throw new Error(`merge ${a} ${b} names a token not kept`);
    seen.add(a + b);
    tokens.push(a + b);
  }
  return { merges, vocab: new Ordered(tokens.map((t, i) => [t, i])), size: tokens.length };
}

// ---------------------------------------------------------------------------------------------
function llama3() {
  const preTokenizer = {
    type: "Sequence",
    pretokenizers: [isolated(LLAMA3_REGEX), byteLevel(false, true, false)],
  };
  const trained = train({ pre_tokenizer: preTokenizer }, emptyBpe);
  const { merges, vocab, size } = cutBpe(trained, byteLevelChars(), 1500);
  const names = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
  ];
  const bos = size;
  return {
    ...HEADER,
    added_tokens: names.map((n, i) => addedToken(size + i, n)),
    normalizer: null,
    pre_tokenizer: preTokenizer,
    post_processor: {
      type: "Sequence",
      processors: [
        byteLevel(true, false, true),
        template(
          [special("<|begin_of_text|>"), seq("A")],
          [special("<|begin_of_text|>"), seq("A"), special("<|begin_of_text|>", 1), seq("B", 1)],
          [["<|begin_of_text|>", bos]],
        ),
      ],
    },
    decoder: byteLevel(true, true, true),
    model: bpeModel({ ignore_merges: true, vocab, merges: merges.map(([a, b]) => `${a} ${b}`) }),
  };
}

const byteTokens = () =>
  Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);

// The characters a trained model starts from (its vocabulary before the first merge).
function alphabet(trained) {
  const merged = new Set(trained.merges.map((m) => mergePair(m).join("")));
  return Object.entries(trained.vocab)
    .sort((x, y) => x[1] - y[1])
    .map(([t]) => t)
    .filter((t) => !merged.has(t));
}

// SentencePiece's layout: <unk> <s> </s> (the added tokens), the 256 byte-fallback tokens, the
// trained alphabet, then the first `count` merges.
function sentencePieceVocabulary(trained, count) {
  const base = ["<unk>", "<s>", "</s>", ...byteTokens(), ...alphabet(trained)];
  const added = [addedToken(0, "<unk>"), addedToken(1, "<s>"), addedToken(2, "</s>")];
  return { ...cutBpe(trained, base, count), added };
}

function spBpe() {
  // Trained with Metaspace splitting so pieces never cross a word boundary, as SentencePiece's
  // own trainer does; the published file then has no pre-tokenizer at all.
  const metaspace = { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true };
  const trained = train({ pre_tokenizer: metaspace }, emptyBpe);
  const { merges, vocab, added } = sentencePieceVocabulary(trained, 1200);
  return {
    ...HEADER,
    added_tokens: added,
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    pre_tokenizer: null,
    post_processor: template(
      [special("<s>"), seq("A")],
      [special("<s>"), seq("A"), special("<s>", 1), seq("B", 1)],
      [["<s>", 1]],
    ),
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: bpeModel({
      unk_token: "<unk>",
      fuse_unk: true,
      byte_fallback: true,
      vocab,
      merges: merges.map(([a, b]) => `${a} ${b}`),
    }),
  };
}

function wordpiece() {
  const normalizer = {
    type: "BertNormalizer",
    clean_text: true,
    handle_chinese_chars: true,
    strip_accents: null,
    lowercase: true,
  };
  // WordPiece's own trainer numbers its vocabulary in hash order and keeps a different tail on
  // every run; the BPE trainer is deterministic, and each of its pieces serves a WordPiece
  // vocabulary both as a word start and as a "##" continuation.
  const trained = train({ normalizer, pre_tokenizer: { type: "BertPreTokenizer" } }, emptyBpe);
  const specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
  const learned = Object.entries(trained.vocab)
    .sort((x, y) => x[1] - y[1])
    .slice(0, 1000)
    .flatMap(([t]) => [t, `##${t}`]);
  const tokens = [...specials, ...learned];
  const id = (t) => tokens.indexOf(t);
  return {
    ...HEADER,
    added_tokens: specials.map((t) => addedToken(id(t), t)),
    normalizer,
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: template(
      [special("[CLS]"), seq("A"), special("[SEP]")],
      [special("[CLS]"), seq("A"), special("[SEP]"), seq("B", 1), special("[SEP]", 1)],
      [["[CLS]", id("[CLS]")], ["[SEP]", id("[SEP]")]],
    ),
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: {
      type: "WordPiece",
      unk_token: "[UNK]",
      continuing_subword_prefix: "##",
      max_input_chars_per_word: 100,
      vocab: new Ordered(tokens.map((t, i) => [t, i])),
    },
  };
}

function chatml() {
  const preTokenizer = {
    type: "Sequence",
    pretokenizers: [isolated(QWEN2_REGEX), byteLevel(false, false, false)],
  };
  const normalizer = { type: "NFC" };
  const trained = train({ normalizer, pre_tokenizer: preTokenizer }, emptyBpe);
  const { merges, vocab, size } = cutBpe(trained, byteLevelChars(), 1500);
  return {
    ...HEADER,
    added_tokens: [
      addedToken(size, "<|endoftext|>"),
      addedToken(size + 1, "<|im_start|>"),
      addedToken(size + 2, "<|im_end|>"),
      addedToken(size + 3, "<tool_call>", { special: false, lstrip: true, rstrip: true }),
      addedToken(size + 4, "Ångström", { special: false, normalized: true }),
    ],
    normalizer,
    pre_tokenizer: preTokenizer,
    post_processor: byteLevel(false, false, false),
    decoder: byteLevel(false, false, false),
    model: bpeModel({ continuing_subword_prefix: "", end_of_word_suffix: "", vocab, merges }),
  };
}

function metaspace() {
  const preTokenizer = {
    type: "Sequence",
    pretokenizers: [
      { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: true },
      { type: "Digits", individual_digits: true },
    ],
  };
  const trained = train({ pre_tokenizer: preTokenizer }, emptyBpe);
  const { merges, vocab, added } = sentencePieceVocabulary(trained, 1000);
  return {
    ...HEADER,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: preTokenizer,
    post_processor: template(
      [special("<s>"), seq("A"), special("</s>")],
      [
        ...[special("<s>"), seq("A"), special("</s>")],
        ...[special("<s>", 1), seq("B", 1), special("</s>", 1)],
      ],
      [["<s>", 1], ["</s>", 2]],
    ),
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "ByteFallback" },
        { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: true },
      ],
    },
    model: bpeModel({ unk_token: "<unk>", fuse_unk: true, byte_fallback: true, vocab, merges }),
  };
}

// ---------------------------------------------------------------------------------------------
// Code-point offsets (what the npm package reports) to UTF-8 byte offsets.
function byteOffsetsOf(text) {
  const at = [0];
  for (const ch of text) at.push(at[at.length - 1] + Buffer.byteLength(ch, "utf8"));
  return at;
}

mkdirSync(OUT, { recursive: true });
const textLines = texts.map((text) => JSON.stringify({ text }));
writeFileSync(join(OUT, "texts.jsonl"), textLines.join("\n") + "\n");

const families = { llama3, sp_bpe: spBpe, wordpiece, chatml, metaspace };
for (const [name, build] of Object.entries(families)) {
  const dir = join(OUT, name);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "tokenizer.json");
  writeFileSync(path, toJson(build()) + "\n");
  // The expectations come from the file as written, reloaded: what a reader of it must give.
  const tokenizer = tk.Tokenizer.fromFile(path);
  const lines = [];
  let lossless = 0;
  for (const text of texts) {
    const plain = await tokenizer.encode(text, null, { addSpecialTokens: false });
    const full = await tokenizer.encode(text, null, { addSpecialTokens: true });
    const at = byteOffsetsOf(text);
    const ids = plain.getIds();
    const decoded = await tokenizer.decode(ids, false);
    if (decoded === text) ++lossless;
    lines.push(
      JSON.stringify({
        text,
        ids,
        ids_with_specials: full.getIds(),
        offsets: plain.getOffsets().map(([b, e]) => [at[b], at[e]]),
        decoded,
      }),
    );
  }
  writeFileSync(join(dir, "expected.jsonl"), lines.join("\n") + "\n");
  const vocabSize = tokenizer.getVocabSize(true);
  console.log(`${name}: vocabulary ${vocabSize}, ${lossless}/${texts.length} decode unchanged`);
}
