// Byte-level BPE training. Words (GPT-2 pre-tokenisation pieces) are counted once; pair counts and
// the words each pair occurs in are then updated incrementally per merge, with a lazily corrected
// max-heap choosing the next pair, so a merge costs time proportional to the words it touches
// rather than to the corpus.
#include "data/bpe_train.h"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

namespace forge {
namespace {

// GPT-2's bytes_to_unicode, and the id GPT-2's encoder.json gives each byte: the printable bytes
// (which map to themselves) in byte order, then the others (mapped to U+0100...) in byte order.
struct ByteAlphabet {
  uint32_t cp[256] = {};
  int32_t id[256] = {};
  ByteAlphabet() {
    auto printable = [](uint32_t b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    };
    uint32_t next_cp = 256;
    int32_t next_id = 0;
    for (uint32_t b = 0; b < 256; ++b)
      if (printable(b)) cp[b] = b, id[b] = next_id++;
    for (uint32_t b = 0; b < 256; ++b)
      if (!printable(b)) cp[b] = next_cp++, id[b] = next_id++;
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet table;
  return table;
}

// `bytes` spelled in GPT-2's byte alphabet, as UTF-8 (vocab.bpe) or as a JSON string body with
// non-ASCII escaped as \uXXXX (encoder.json, like Python's json.dump).
std::string to_symbols(std::string_view bytes, bool json) {
  if (!json) return gpt2_spelling(bytes);
  std::string out;
  for (unsigned char b : bytes) {
    const uint32_t c = alphabet().cp[b];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\u0";
      out += kHex[(c >> 8) & 0xF];
      out += kHex[(c >> 4) & 0xF];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

void check_args(int32_t vocab_size, const std::vector<std::string>& specials) {
  std::unordered_set<std::string> seen;
  for (const auto& s : specials) {
    if (s.size() < 2)
      throw Error(
          ExitCode::usage,
          detail::concat("special token \"", s,
                         "\" must be at least two bytes (single bytes are already tokens)"));
    if (!seen.insert(s).second)
      throw Error(ExitCode::usage, detail::concat("special token \"", s, "\" is given twice"));
  }
  const int64_t min_size = 256 + static_cast<int64_t>(specials.size());
  if (vocab_size < min_size)
    throw Error(ExitCode::usage,
                detail::concat("vocabulary size ", vocab_size, " is too small: need at least ",
                               min_size, " (256 bytes + ", specials.size(), " special tokens)"));
}

// Counts GPT-2 pre-tokenisation pieces of text with the special tokens cut out.
class WordCounter {
 public:
  explicit WordCounter(const std::vector<std::string>& specials) {
    for (const auto& s : specials) specials_.emplace_back(s, 0);
  }
  void add(std::string_view text) {
    detail::split_specials(
        text, specials_,
        [&](std::string_view piece) {
          for (std::string_view w : gpt2_pretokenize(piece)) ++counts_[std::string(w)];
        },
        [](int32_t) {});
  }
  // Sorted by bytes, so nothing downstream depends on hash order.
  std::vector<std::pair<std::string, int64_t>> words() const {
    std::vector<std::pair<std::string, int64_t>> out(counts_.begin(), counts_.end());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::unordered_map<std::string, int64_t> counts_;
};

// Learned vocabulary: tokens[i] are the bytes of internal id i (0..255 are the byte values), and
// merges[k] = (left, right) made tokens[256 + k].
struct Learned {
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> merges;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

Learned learn(const std::vector<std::pair<std::string, int64_t>>& word_counts, int64_t max_tokens) {
  Learned v;
  std::unordered_map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) {
    v.tokens.emplace_back(1, static_cast<char>(b));
    ids.emplace(v.tokens.back(), b);
  }
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  for (const auto& [w, n] : word_counts) {
    if (w.size() < 2) continue;  // no pairs
    words.emplace_back(w.begin(), w.end());
    for (auto& s : words.back()) s = static_cast<unsigned char>(s);
    freq.push_back(n);
  }

  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // may hold stale or repeated words
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      count[k] += freq[w];
      where[k].push_back(static_cast<int32_t>(w));
    }

  struct Entry {
    int64_t count;
    int32_t a, b;
  };
  // Max-heap on count, then smallest (bytes of a, bytes of b) first.
  auto lower = [&v](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    const std::string &xa = v.tokens[static_cast<size_t>(x.a)],
                      &ya = v.tokens[static_cast<size_t>(y.a)];
    if (xa != ya) return xa > ya;
    return v.tokens[static_cast<size_t>(x.b)] > v.tokens[static_cast<size_t>(y.b)];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> heap(lower);
  for (const auto& [k, n] : count)
    heap.push({n, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xFFFFFFFFu)});

  std::vector<int32_t> merged;
  std::vector<uint64_t> touched;
  while (static_cast<int64_t>(v.tokens.size()) < max_tokens && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const uint64_t key = pair_key(top.a, top.b);
    const auto it = count.find(key);
    const int64_t current = it == count.end() ? 0 : it->second;
    // Counts of existing pairs only fall (new neighbours always involve the new token), and every
    // rise is pushed, so a stale entry is either re-pushed at its lower count or a duplicate.
    if (current != top.count) {
      if (current > 0 && current < top.count) heap.push({current, top.a, top.b});
      continue;
    }
    // A pair whose bytes are already a token (made by another split) merges into that token, as
    // the tiktoken-style loader would, without a new merge line.
    std::string joined =
        v.tokens[static_cast<size_t>(top.a)] + v.tokens[static_cast<size_t>(top.b)];
    int32_t c;
    if (auto found = ids.find(joined); found != ids.end()) {
      c = found->second;
    } else {
      c = static_cast<int32_t>(v.tokens.size());
      ids.emplace(joined, c);
      v.tokens.push_back(std::move(joined));
      v.merges.emplace_back(top.a, top.b);
    }

    std::vector<int32_t> list = std::move(where[key]);
    where.erase(key);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    touched.clear();
    for (int32_t w : list) {
      std::vector<int32_t>& syms = words[static_cast<size_t>(w)];
      const int64_t f = freq[static_cast<size_t>(w)];
      bool has = false;
      for (size_t i = 0; i + 1 < syms.size() && !has; ++i)
        has = syms[i] == top.a && syms[i + 1] == top.b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        const auto p = count.find(pair_key(syms[i], syms[i + 1]));
        if ((p->second -= f) == 0) count.erase(p);
      }
      merged.clear();
      for (size_t i = 0; i < syms.size(); ++i) {
        if (i + 1 < syms.size() && syms[i] == top.a && syms[i + 1] == top.b) {
          merged.push_back(c);
          ++i;
        } else {
          merged.push_back(syms[i]);
        }
      }
      syms.swap(merged);
      for (size_t i = 0; i + 1 < syms.size(); ++i) {
        const uint64_t k = pair_key(syms[i], syms[i + 1]);
        count[k] += f;
        if (syms[i] == c || syms[i + 1] == c) {
          where[k].push_back(w);
          touched.push_back(k);
        }
      }
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched)
      heap.push({count[k], static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xFFFFFFFFu)});
  }
  return v;
}

std::string read_input(const std::filesystem::path& path) {
  return read_input_file(path.string(), kCorpusInput);
}

void write_atomically(const std::filesystem::path& path, const std::string& content) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw Error(ExitCode::data, tmp.string() + ": cannot write");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(ExitCode::data, path.string() + ": cannot replace (" + ec.message() + ")");
  }
}

// `s` as a JSON string literal, raw UTF-8 kept (as Hugging Face writes tokenizer.json).
std::string json_quoted(const std::string& s) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(ExitCode::data,
                detail::concat("tokenizer.json: token \"", printable(s), "\" is not UTF-8"));
  }
}

}  // namespace

std::string bpe_tokenizer_json(const BpeTokenizer& tokenizer) {
  // GPT-2's layout; tokenizers >= 0.20 reads ignore_merges, which makes a piece that is itself a
  // token one id, as encode() does.
  std::string out =
      "{\n"
      "  \"version\": \"1.0\",\n"
      "  \"truncation\": null,\n"
      "  \"padding\": null,\n"
      "  \"added_tokens\": [";
  const auto& specials = tokenizer.specials();
  for (size_t i = 0; i < specials.size(); ++i) {
    out += i ? ",\n" : "\n";
    out += detail::concat("    {\"id\": ", specials[i].second,
                          ", \"content\": ", json_quoted(specials[i].first),
                          ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                          "\"normalized\": false, \"special\": true}");
  }
  out += specials.empty() ? "],\n" : "\n  ],\n";
  out +=
      "  \"normalizer\": null,\n"
      "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
      "\"trim_offsets\": true, \"use_regex\": true},\n"
      "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
      "\"trim_offsets\": false, \"use_regex\": true},\n"
      "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
      "\"trim_offsets\": true, \"use_regex\": true},\n"
      "  \"model\": {\n"
      "    \"type\": \"BPE\",\n"
      "    \"dropout\": null,\n"
      "    \"unk_token\": null,\n"
      "    \"continuing_subword_prefix\": \"\",\n"
      "    \"end_of_word_suffix\": \"\",\n"
      "    \"fuse_unk\": false,\n"
      "    \"byte_fallback\": false,\n"
      "    \"ignore_merges\": true,\n"
      "    \"vocab\": {";
  const std::vector<std::string> tokens = tokenizer.spelled_tokens();
  for (size_t id = 0; id < tokens.size(); ++id)
    out += detail::concat(id ? ",\n      " : "\n      ", json_quoted(tokens[id]), ": ", id);
  out += "\n    },\n    \"merges\": [";
  const std::vector<std::string> merges = tokenizer.spelled_merge_pairs();
  for (size_t k = 0; k < merges.size(); ++k)
    out += (k ? ",\n      " : "\n      ") + json_quoted(merges[k]);
  out += merges.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n";
  return out;
}

std::vector<std::pair<std::string, std::string>> learn_bpe_merges(
    std::string_view text, int32_t vocab_size, const std::vector<std::string>& specials) {
  check_args(vocab_size, specials);
  WordCounter counter(specials);
  counter.add(text);
  const Learned v = learn(counter.words(), vocab_size - static_cast<int64_t>(specials.size()));
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [a, b] : v.merges)
    out.emplace_back(v.tokens[static_cast<size_t>(a)], v.tokens[static_cast<size_t>(b)]);
  return out;
}

void train_bpe(const std::vector<std::filesystem::path>& inputs, int32_t vocab_size,
               const std::filesystem::path& out_dir, const std::vector<std::string>& specials) {
  check_args(vocab_size, specials);
  if (inputs.empty()) throw Error(ExitCode::usage, "tokenizer training needs at least one input");
  WordCounter counter(specials);
  for (const auto& path : inputs) counter.add(read_input(path));
  const Learned v = learn(counter.words(), vocab_size - static_cast<int64_t>(specials.size()));

  for (const auto& s : specials)
    if (std::find(v.tokens.begin(), v.tokens.end(), s) != v.tokens.end())
      throw Error(ExitCode::usage, detail::concat("special token \"", s,
                                                  "\" spells the same bytes as a learned token"));

  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) {
    merges += to_symbols(v.tokens[static_cast<size_t>(a)], false);
    merges += ' ';
    merges += to_symbols(v.tokens[static_cast<size_t>(b)], false);
    merges += '\n';
  }
  // Same shape as GPT-2's file: one line, {"symbols": id, ...} in id order.
  std::vector<std::string> by_id(256);
  for (int b = 0; b < 256; ++b)
    by_id[static_cast<size_t>(alphabet().id[b])] = std::string(1, static_cast<char>(b));
  by_id.insert(by_id.end(), v.tokens.begin() + 256, v.tokens.end());
  by_id.insert(by_id.end(), specials.begin(), specials.end());
  std::string encoder = "{";
  for (size_t id = 0; id < by_id.size(); ++id) {
    if (id > 0) encoder += ", ";
    encoder += '"';
    encoder += to_symbols(by_id[id], true);
    encoder += "\": ";
    encoder += std::to_string(id);
  }
  encoder += "}";

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec)
    throw Error(ExitCode::data,
                out_dir.string() + ": cannot create directory (" + ec.message() + ")");
  write_atomically(out_dir / "vocab.bpe", merges);
  write_atomically(out_dir / "encoder.json", encoder);
  // Built from the files just written, so tokenizer.json lists the merges encode() applies.
  const BpeTokenizer written(out_dir / "encoder.json", out_dir / "vocab.bpe",
                             out_dir.filename().string());
  write_atomically(out_dir / "tokenizer.json", bpe_tokenizer_json(written));
}

}  // namespace forge
