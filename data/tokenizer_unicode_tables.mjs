// Generates data/tokenizer_unicode_tables.h by asking Hugging Face's `tokenizers` itself (the npm
// package of its Rust library) about every code point. Its components answer from three different
// Unicode versions: Rust's std (char::is_numeric, char::to_lowercase), the unicode_categories
// crate (punctuation, Cc/Cf/Co, Mn) and the unicode-normalization-alignments crate (marks,
// decompositions, combining classes). utf8proc has the mappings themselves (which never change once
// assigned); these tables say which characters each of those versions knows. Run from the repo
// root:
//   npm install --prefix /tmp/tokpipe-npm tokenizers
//   NODE_PATH=/tmp/tokpipe-npm/node_modules node data/tokenizer_unicode_tables.mjs
import { createRequire } from "node:module";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "node_modules", "x.js"));
const tk = require("tokenizers");
const version = require("tokenizers/package.json").version;

// Every scalar value but the surrogates (which a Rust String cannot hold) and the two separators,
// NUL (which no mapping produces) and "a" (for clean_text, which drops NUL). Neither separator has
// any of the properties asked, except that clean_text drops NUL.
const all = [];
for (let cp = 1; cp < 0x110000; ++cp)
  if (!(cp >= 0xd800 && cp <= 0xdfff) && cp !== 0x61) all.push(cp);

// Runs `probe` over batches: each code point's text between separators, and returns, per code point,
// the output segment at its position.
function segments(normalizer, make, sep) {
  const out = new Map();
  for (let i = 0; i < all.length; i += 4096) {
    const batch = all.slice(i, i + 4096);
    const text = batch.map((cp) => sep + make(cp)).join("") + sep;
    const parts = normalizer.normalizeString(text).split(sep);
    if (parts.length !== batch.length + 2) throw new Error(`separator lost in batch at ${i}`);
    batch.forEach((cp, k) => out.set(cp, parts[k + 1]));
  }
  return out;
}

// Code points a pre-tokenizer isolates when they stand between two "a".
function isolated(preTokenizer) {
  const set = new Set();
  for (let i = 0; i < all.length; i += 4096) {
    const batch = all.slice(i, i + 4096);
    const text = "a" + batch.map((cp) => String.fromCodePoint(cp) + "a").join("");
    for (const [, [begin, end]] of preTokenizer.preTokenizeString(text))
      if (end === begin + 1 && begin % 2 === 1) set.add(batch[(begin - 1) / 2]);
  }
  return set;
}

const ch = (cp) => String.fromCodePoint(cp);
const bert = (o) =>
  tk.bertNormalizer({ cleanText: false, handleChineseChars: false, stripAccents: false,
                      lowercase: false, ...o });

const punctuation = isolated(tk.punctuationPreTokenizer());
const numeric = isolated(tk.digitsPreTokenizer(true));
const cleaned = segments(bert({ cleanText: true }), ch, "a");
const dropped = new Set([0, ...all.filter((cp) => cleaned.get(cp) === "")]);
const nfd = segments(tk.nfdNormalizer(), ch, "\u0000");
const nfkd = segments(tk.nfkdNormalizer(), ch, "\u0000");
const decomposable = new Set(all.filter((cp) => nfkd.get(cp) !== ch(cp)));
// Mn as BertNormalizer's accent stripping sees it: after NFD, so only for characters NFD keeps.
const stripped = segments(bert({ stripAccents: true }), ch, "\u0000");
const nonspacing = new Set(all.filter((cp) => nfd.get(cp) === ch(cp) && stripped.get(cp) === ""));
const unmarked = segments(tk.stripAccentsNormalizer(), ch, "\u0000");
const marks = new Set(all.filter((cp) => unmarked.get(cp) === ""));
// A non-starter moves past U+0301 (class 230) if its class is lower, and U+0334 (class 1) moves
// past it if its class is higher: either way NFD reorders it exactly when it has a class.
const after230 = segments(tk.nfdNormalizer(), (cp) => "\u0301" + ch(cp), "\u0000");
const before1 = segments(tk.nfdNormalizer(), (cp) => ch(cp) + "\u0334", "\u0000");
const combining = new Set(
  all.filter((cp) => nfd.get(cp) === ch(cp) && (after230.get(cp) !== "\u0301" + ch(cp) ||
                                                  before1.get(cp) !== ch(cp) + "\u0334")));
const lowered = segments(tk.lowercase(), ch, "\u0000");
const lowercase = [];
for (const cp of all) {
  const to = Array.from(lowered.get(cp)).map((c) => c.codePointAt(0));
  if (to.length === 1 && to[0] === cp) continue;
  if (to.length !== 1 && cp !== 0x130) throw new Error(`U+${cp.toString(16)} lowercases to ${to}`);
  if (to.length === 1) lowercase.push([cp, to[0]]);
}
const hex = (cp) => "0x" + cp.toString(16).toUpperCase().padStart(4, "0");

function ranges(set) {
  const sorted = [...set].sort((x, y) => x - y);
  const out = [];
  for (const cp of sorted) {
    if (out.length && out[out.length - 1][1] === cp - 1) out[out.length - 1][1] = cp;
    else out.push([cp, cp]);
  }
  return out;
}

function table(name, set, doc) {
  const r = ranges(set);
  const rows = r.map(([lo, hi]) => `{${hex(lo)}, ${hex(hi)}}`);
  const lines = [];
  for (let i = 0; i < rows.length; i += 4) lines.push("    " + rows.slice(i, i + 4).join(", ") + ",");
  return `/// ${doc}\ninline constexpr CodeRange ${name}[] = {\n${lines.join("\n")}\n};\n`;
}

const pairs = lowercase.map(([f, t]) => `{${hex(f)}, ${hex(t)}}`);
const pairLines = [];
for (let i = 0; i < pairs.length; i += 4) pairLines.push("    " + pairs.slice(i, i + 4).join(", ") + ",");

const header = `// Generated by data/tokenizer_unicode_tables.mjs from Hugging Face's tokenizers ${version} (npm);
// do not edit. Which characters the Unicode tables inside that library know, per property, for
// data/tokenizer_pipeline.cpp: its components answer from Rust's std, the unicode_categories crate
// and the unicode-normalization-alignments crate, three different Unicode versions.
#pragma once

#include <cstdint>

#include "data/unicode_tables.h"

namespace forge::tokenizer_json::hf_unicode {

using unicode::CodeRange;

struct LowerPair {
  uint32_t from, to;
};

${table("kPunctuation", punctuation, "What Punctuation and BertPreTokenizer split off (ASCII punctuation or P*).")}
${table("kNumeric", numeric, "Rust's char::is_numeric (Nd, Nl, No), what Digits splits.")}
${table("kCleanDropped", dropped, "What BertNormalizer's clean_text drops: NUL, U+FFFD, Cc/Cf/Co but tab, CR and LF.")}
${table("kNonspacingMark", nonspacing, "Mn, as BertNormalizer's accent stripping drops it after NFD (characters NFD keeps).")}
${table("kMark", marks, "M*, what StripAccents drops.")}
${table("kDecomposable", decomposable, "Characters with a (canonical or compatibility) decomposition in the normalisation tables.")}
${table("kCombining", combining, "Characters NFD keeps that have a nonzero combining class in the normalisation tables.")}
/// char::to_lowercase where it is one other character (U+0130 becomes two: i and U+0307).
inline constexpr LowerPair kLowercase[] = {
${pairLines.join("\n")}
};

}  // namespace forge::tokenizer_json::hf_unicode
`;
writeFileSync("data/tokenizer_unicode_tables.h", header);
console.log(`punctuation ${punctuation.size}, numeric ${numeric.size}, dropped ${dropped.size}, ` +
            `nonspacing ${nonspacing.size}, marks ${marks.size}, decomposable ${decomposable.size}, ` +
            `combining ${combining.size}, lowercase ${lowercase.length}`);
