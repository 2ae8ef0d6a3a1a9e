// The node side of the `tokenizer` suite of scripts/bench: loads one reference GPT-2 encoder, npm
// `tiktoken` (OpenAI's Rust encoder compiled to WASM) or `js-tiktoken` (pure JavaScript), encodes
// a text file and prints one line `load_ms=X mb_s=Y tokens=N`. Installs nothing:
// scripts/bench_tokenizer.sh installs both packages into a cache directory and points NODE_PATH
// at it, which require() (unlike import) honours.
//   usage: node scripts/bench_tokenizer.mjs tiktoken|js-tiktoken TEXT_FILE [REPEATS]
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { performance } from "node:perf_hooks";

const require = createRequire(import.meta.url);
const [encoderName, textFile, repeatsArg = "3"] = process.argv.slice(2);
const repeats = Number(repeatsArg);
if (!textFile || !Number.isInteger(repeats) || repeats < 1) {
  console.error("usage: node bench_tokenizer.mjs tiktoken|js-tiktoken TEXT_FILE [REPEATS]");
  process.exit(2);
}

// Loading counts the module too: tiktoken compiles its WASM there, js-tiktoken parses the ranks.
// Each side gets its own process, so neither warms the other.
function load() {
  if (encoderName === "tiktoken") {
    const { get_encoding } = require("tiktoken");
    const enc = get_encoding("gpt2");
    return { encode: (text) => enc.encode(text, "all").length, free: () => enc.free() };
  }
  if (encoderName === "js-tiktoken") {
    // The lite entry plus the gpt2 ranks alone: the main entry parses every encoding's ranks.
    const { Tiktoken } = require("js-tiktoken/lite");
    const enc = new Tiktoken(require("js-tiktoken/ranks/gpt2"));
    return { encode: (text) => enc.encode(text, "all").length, free: () => {} };
  }
  console.error(`bench_tokenizer.mjs: unknown encoder '${encoderName}'`);
  process.exit(2);
}

const bytes = readFileSync(textFile);
const text = bytes.toString("utf8");

let start = performance.now();
const enc = load();
const loadMs = performance.now() - start;

// Warm-up on a small prefix, so the JIT (and WASM tier-up) has seen the hot paths before timing.
enc.encode(text.slice(0, 65536));
const seconds = [];
let tokens = 0;
for (let r = 0; r < repeats; ++r) {
  start = performance.now();
  tokens = enc.encode(text);
  seconds.push((performance.now() - start) / 1e3);
}
enc.free();
seconds.sort((a, b) => a - b);
const median = seconds[Math.floor(seconds.length / 2)];
console.log(
  `load_ms=${loadMs.toFixed(1)} mb_s=${(bytes.length / 1e6 / median).toFixed(3)} tokens=${tokens}`,
);
