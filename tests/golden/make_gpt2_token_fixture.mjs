// Regenerates tests/golden/gpt2_tokens.txt: GPT-2 token ids from OpenAI's reference encoder
// (npm js-tiktoken, encoding "gpt2", all special tokens allowed) for tricky texts and slices of
// Tiny Shakespeare. Each line is a JSON string (the text) then a tab then the ids, space-separated.
// Run from the repo root:
//   mkdir -p /tmp/jst && (cd /tmp/jst && npm install js-tiktoken)
//   NODE_PATH=/tmp/jst/node_modules node tests/golden/make_gpt2_token_fixture.mjs
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "node_modules", "x.js"));
const { getEncoding } = require("js-tiktoken");
const enc = getEncoding("gpt2");

const cases = [
  "don't", "I'll", "it's", "IT'S", "'S", "we're they've I'm you'd he'll", "''s", "rock'n'roll",
  "12345", "3.14", "1,000,000", "x1 y22 z333", "٣٤٥ Ⅻ ½",
  "a  b", "a   b", "a          b", "  leading", "trailing  ", "trailing ", " ", "  ", "          ",
  "\n", "\n\n", "line1\nline2", "a\r\nb", "\r\n\r\n", "end\n", "\n\n\nx", " \n ", "a \n\n b",
  "\tindent", "a\tb\t\tc", "\t\t", "\u00a0nbsp\u3000ideographic", "x\u2003\u2003y",
  "café", "naïve", "Ångström", "Crème brûlée", "ßtraße",
  "中文字符", "日本語のテキスト", "한국어", "mixed 中文 and English",
  "👋🏽", "👨‍👩‍👧", "hello 👋 world 🌍!", "Привет, мир", "Ελληνικά", "עברית", "العربية",
  "hello<|endoftext|>world", "<|endoftext|>", "a <|endoftext|> b<|endoftext|><|endoftext|>",
  "<|endoftext", "!!!???", "...", "?!.,;:", "--->", "(a) [b] {c}",
  "def f(x):\n    return x ** 2  # square\n",
  "for (int i = 0; i < n; ++i) { sum += a[i]; }",
  "if x == 1:\n\tprint('one')\nelse:\n\tpass",
  "<html><body class=\"x\">Hi</body></html>",
  "https://example.com/path?q=1&r=2#frag",
  "",
];

const shakespeare = readFileSync("data/samples/tinyshakespeare.txt", "utf8");
// A fixed linear congruential sequence, so the slices are the same on every run.
let state = 12345;
const next = () => (state = (state * 1103515245 + 12345) % 2147483648);
for (let k = 0; k < 20; ++k) {
  const start = next() % (shakespeare.length - 600);
  const length = 20 + (next() % 500);
  cases.push(shakespeare.slice(start, start + length));
}

// Long pieces (runs of punctuation and whitespace), which Forge merges with a different algorithm.
const punct = "!?.,;:-=*#~";
let run = "";
for (let k = 0; k < 300; ++k) run += punct[next() % punct.length];
cases.push(run, "=-".repeat(150), "!".repeat(257), " ".repeat(200) + "x", "\n".repeat(100) + " end");

const lines = cases.map((text) => `${JSON.stringify(text)}\t${enc.encode(text, "all").join(" ")}`);
writeFileSync("tests/golden/gpt2_tokens.txt", lines.join("\n") + "\n");
console.log(`wrote ${cases.length} cases to tests/golden/gpt2_tokens.txt`);
