// Encodes every text of a texts.jsonl ({"text": ...} a line) with Hugging Face's `tokenizers` (npm)
// under a tokenizer.json and prints one line per text, {"ids": [...], "decoded": "..."}
// (add_special_tokens false; decode keeps special tokens): what tests compare Forge's tokenizers
// and the tokenizer.json Forge writes against.
//   usage: NODE_PATH=DIR/node_modules node tests/golden/hf_encode.mjs TOKENIZER_JSON TEXTS_JSONL
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH?.split(":")[0] ?? "node_modules", "x.js"));
const { Tokenizer } = require("tokenizers");

const [tokenizerFile, textsFile] = process.argv.slice(2);
if (!tokenizerFile || !textsFile) {
  console.error("usage: node hf_encode.mjs TOKENIZER_JSON TEXTS_JSONL");
  process.exit(2);
}
const tokenizer = Tokenizer.fromFile(tokenizerFile);
const lines = [];
for (const line of readFileSync(textsFile, "utf8").split("\n")) {
  if (line === "") continue;
  const { text } = JSON.parse(line);
  const ids = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
  lines.push(JSON.stringify({ ids, decoded: await tokenizer.decode(ids, false) }));
}
process.stdout.write(lines.join("\n") + "\n");
