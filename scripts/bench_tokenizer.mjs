// The node side of the `tokenizer` suite of scripts/bench. Loads one reference encoder, encodes a
// text file and prints one line `load_ms=X mb_s=Y tokens_s=Z tokens=N`:
//   tiktoken | js-tiktoken  OpenAI's GPT-2 encoder as npm `tiktoken` (Rust compiled to WASM) or
//                           `js-tiktoken` (pure JavaScript), the whole text in one call;
//   tokenizers JSON         Hugging Face's `tokenizers` (its Rust library as a native module) under
//                           a tokenizer.json, in chunks ending at the first line end after every
//                           CHUNK_BYTES (one encode of 10 MB holds gigabytes of per-token strings
//                           and offsets), each chunk awaited before the next: one thread.
// `gpt2-json ENCODER_JSON VOCAB_BPE OUT` writes GPT-2's vocabulary as the tokenizer.json Hugging
// Face publishes for it. Installs nothing: scripts/bench_tokenizer.sh installs the packages into a
// cache directory and points NODE_PATH at it, which require() (unlike import) honours.
//   usage: node scripts/bench_tokenizer.mjs tiktoken|js-tiktoken TEXT_FILE [REPEATS]
//          node scripts/bench_tokenizer.mjs tokenizers JSON TEXT_FILE REPEATS CHUNK_BYTES
//          node scripts/bench_tokenizer.mjs gpt2-json ENCODER_JSON VOCAB_BPE OUT
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const require = createRequire(import.meta.url);
const args = process.argv.slice(2);
const encoderName = args[0];
const usage = () => {
  console.error(
    "usage: node bench_tokenizer.mjs tiktoken|js-tiktoken TEXT_FILE [REPEATS]\n" +
      "       node bench_tokenizer.mjs tokenizers JSON TEXT_FILE REPEATS CHUNK_BYTES\n" +
      "       node bench_tokenizer.mjs gpt2-json ENCODER_JSON VOCAB_BPE OUT",
  );
  process.exit(2);
};

if (encoderName === "gpt2-json") {
  const [encoderFile, mergesFile, out] = args.slice(1);
  if (!out) usage();
  // The layout of the gpt2 repository's tokenizer.json on the Hugging Face hub.
  const vocab = JSON.parse(readFileSync(encoderFile, "utf8"));
  const merges = readFileSync(mergesFile, "utf8")
    .split("\n")
    .filter((line, i) => line !== "" && !(i === 0 && line.startsWith("#version")));
  const byteLevel = (addPrefixSpace, trimOffsets) => ({
    type: "ByteLevel",
    add_prefix_space: addPrefixSpace,
    trim_offsets: trimOffsets,
    use_regex: true,
  });
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [
      {
        id: vocab["<|endoftext|>"],
        content: "<|endoftext|>",
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: true,
        special: true,
      },
    ],
    normalizer: null,
    pre_tokenizer: byteLevel(false, true),
    post_processor: byteLevel(true, false),
    decoder: byteLevel(true, true),
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      vocab,
      merges,
    },
  };
  writeFileSync(out, JSON.stringify(json));
  process.exit(0);
}

const hf = encoderName === "tokenizers";
const [textFile, repeatsArg = "3", chunkArg = "0"] = hf ? args.slice(2) : args.slice(1);
const repeats = Number(repeatsArg);
const chunkBytes = Number(chunkArg);
if (!textFile || !Number.isInteger(repeats) || repeats < 1 || (hf && !(chunkBytes > 0))) usage();

// Loading counts the module too: tiktoken compiles its WASM there, js-tiktoken parses the ranks,
// tokenizers reads the JSON. Each side gets its own process, so neither warms the other.
function load() {
  if (encoderName === "tiktoken") {
    const { get_encoding } = require("tiktoken");
    const enc = get_encoding("gpt2");
    return { encode: async (text) => enc.encode(text, "all").length, free: () => enc.free() };
  }
  if (encoderName === "js-tiktoken") {
    // The lite entry plus the gpt2 ranks alone: the main entry parses every encoding's ranks.
    const { Tiktoken } = require("js-tiktoken/lite");
    const enc = new Tiktoken(require("js-tiktoken/ranks/gpt2"));
    return { encode: async (text) => enc.encode(text, "all").length, free: () => {} };
  }
  if (hf) {
    const { Tokenizer } = require("tokenizers");
    const tok = Tokenizer.fromFile(args[1]);
    const options = { addSpecialTokens: false };
    return {
      encode: async (text) => (await tok.encode(text, null, options)).getLength(),
      free: () => {},
    };
  }
  console.error(`bench_tokenizer.mjs: unknown encoder '${encoderName}'`);
  process.exit(2);
}

const bytes = readFileSync(textFile);
const text = bytes.toString("utf8");

// The same cut as bench_tokenizer_forge.cpp's, in UTF-16 units: the text is ASCII.
function chunksOf(s, size) {
  if (!(size > 0)) return [s];
  const out = [];
  for (let begin = 0; begin < s.length; ) {
    let end = s.indexOf("\n", Math.min(s.length, begin + size));
    end = end < 0 ? s.length : end + 1;
    out.push(s.slice(begin, end));
    begin = end;
  }
  return out;
}
const chunks = chunksOf(text, chunkBytes);

let start = performance.now();
const enc = load();
const loadMs = performance.now() - start;

// Warm-up on a small prefix, so the JIT (and WASM tier-up) has seen the hot paths before timing.
await enc.encode(text.slice(0, 65536));
const seconds = [];
let tokens = 0;
for (let r = 0; r < repeats; ++r) {
  start = performance.now();
  tokens = 0;
  for (const chunk of chunks) tokens += await enc.encode(chunk);
  seconds.push((performance.now() - start) / 1e3);
}
enc.free();
seconds.sort((a, b) => a - b);
const median = seconds[Math.floor(seconds.length / 2)];
console.log(
  `load_ms=${loadMs.toFixed(1)} mb_s=${(bytes.length / 1e6 / median).toFixed(3)} ` +
    `tokens_s=${(tokens / median).toFixed(0)} tokens=${tokens}`,
);
