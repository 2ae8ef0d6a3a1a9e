// `forge export --format gguf`, read back by a GGUF reader written here (header, every key-value
// pair, every tensor info, the data at its aligned offset) and checked field by field against the
// model: metadata keys, types and values, tensor names, dimensions and bytes, alignment, the GPT-2
// vocabulary, a trained one padded with extra specials and the bytes tokenizer's as a BPE without
// merges, a merged LoRA run; Llama-shaped models as llama.cpp's llama (q and k rows permuted,
// rope_freqs for llama3 scaling) and qwen2 architectures, whose logits tests/golden/read_gguf.py
// recomputes from the file as llama.cpp would; the models no llama.cpp architecture runs, and the
// command line. Models are built here and saved without training, except the LoRA run, which the
// forge binary trains for a few steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <numbers>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops/layout.h"
#include "data/bpe_train.h"
#include "nn/bert.h"
#include "nn/gpt.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "formats/gguf_export.h"
#include "formats/hf_model.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// ---- a GGUF reader: every value type, arrays of scalars and strings ----

struct GgufValue {
  uint32_t type = 0;
  uint32_t element_type = 0;         // arrays only
  std::vector<double> numbers;       // a numeric scalar, or a numeric array
  std::vector<std::string> strings;  // a string, or a string array
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // innermost first
  uint32_t type = 0;
  uint64_t offset = 0;  // from the start of the data section
};

struct GgufFile {
  std::string bytes;
  uint32_t version = 0;
  uint64_t kv_count = 0;
  std::vector<std::string> keys;  // in file order
  std::map<std::string, GgufValue> kv;
  std::vector<GgufTensorInfo> tensors;
  uint64_t data_start = 0;
};

class GgufReader {
 public:
  explicit GgufReader(const std::string& bytes) : bytes_(bytes) {}

  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string string() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // Appends one value of `type` (not an array) to `v`.
  void value(uint32_t type, GgufValue& v) {
    switch (type) {
      case 0: v.numbers.push_back(get<uint8_t>()); break;
      case 1: v.numbers.push_back(get<int8_t>()); break;
      case 2: v.numbers.push_back(get<uint16_t>()); break;
      case 3: v.numbers.push_back(get<int16_t>()); break;
      case 4: v.numbers.push_back(get<uint32_t>()); break;
      case 5: v.numbers.push_back(get<int32_t>()); break;
      case 6: v.numbers.push_back(get<float>()); break;
      case 7: v.numbers.push_back(get<uint8_t>()); break;
      case 8: v.strings.push_back(string()); break;
      case 10: v.numbers.push_back(double(get<uint64_t>())); break;
      case 11: v.numbers.push_back(double(get<int64_t>())); break;
      case 12: v.numbers.push_back(get<double>()); break;
      default: throw std::runtime_error("GGUF: value type " + std::to_string(type));
    }
  }
  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_)
      throw std::runtime_error("GGUF: truncated at byte " + std::to_string(pos_));
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

uint64_t aligned32(uint64_t n) { return (n + 31) / 32 * 32; }

GgufFile read_gguf(const fs::path& path) {
  GgufFile f;
  f.bytes = testing::read_file(path);
  GgufReader r(f.bytes);
  if (f.bytes.compare(0, 4, "GGUF") != 0) throw std::runtime_error("GGUF: no magic");
  r.get<uint32_t>();
  f.version = r.get<uint32_t>();
  const uint64_t tensor_count = r.get<uint64_t>();
  f.kv_count = r.get<uint64_t>();
  for (uint64_t i = 0; i < f.kv_count; ++i) {
    const std::string key = r.string();
    GgufValue v;
    v.type = r.get<uint32_t>();
    if (v.type == 9) {
      v.element_type = r.get<uint32_t>();
      const uint64_t n = r.get<uint64_t>();
      for (uint64_t k = 0; k < n; ++k) r.value(v.element_type, v);
    } else {
      r.value(v.type, v);
    }
    f.keys.push_back(key);
    f.kv[key] = v;
  }
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = r.string();
    const uint32_t n_dims = r.get<uint32_t>();
    for (uint32_t d = 0; d < n_dims; ++d) t.dims.push_back(r.get<uint64_t>());
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    f.tensors.push_back(t);
  }
  const GgufValue& alignment = f.kv.at("general.alignment");
  f.data_start = (r.pos() + uint64_t(alignment.numbers.at(0)) - 1) /
                 uint64_t(alignment.numbers.at(0)) * uint64_t(alignment.numbers.at(0));
  return f;
}

uint64_t nbytes(const GgufTensorInfo& t) {
  uint64_t n = 4;
  for (uint64_t d : t.dims) n *= d;
  return n;
}

// The raw f32 bytes of a tensor, from its offset in the data section.
std::string tensor_bytes(const GgufFile& f, const GgufTensorInfo& t) {
  if (f.data_start + t.offset + nbytes(t) > f.bytes.size())
    throw std::runtime_error("GGUF: tensor " + t.name + " runs past the end of the file");
  return f.bytes.substr(f.data_start + t.offset, nbytes(t));
}

std::string raw_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), size_t(t.numel()) * sizeof(float));
}

// ---- models ----

// A GPT checkpoint saved without training: `model` and `data` are the flow-mapping bodies of
// model.* and data.*, and every tensor is drawn from N(0, std^2), so biases and norm weights are
// not all zeros and ones and a misplaced tensor shows.
fs::path save_gpt(const fs::path& dir, const std::string& model, const std::string& data,
                  double std = 1.0) {
  const std::string yaml = "recipe: gpt_pretrain\nseed: 3\noutput_dir: " +
                           (dir / "tiny_run").string() + "\nmodel: {arch: gpt, " + model +
                           "}\ndata: {" + data + ", train: corpus.txt}\n";
  RunConfig config = load_config_string(yaml, "tiny.yaml", {}, ConfigFiles::skip);
  Generator gen(11);
  nn::GPT gpt(gpt_config(config.model), gen);
  NoGradGuard no_grad;
  for (NamedTensor t : gpt.named_state())
    t.tensor.copy_(normal(t.tensor.shape(), 0.0, std, gen));
  CheckpointData checkpoint;
  checkpoint.step = 5;
  checkpoint.config_yaml = to_yaml(config);
  checkpoint.model = gpt.named_state();
  const fs::path file = dir / "tiny.h5";
  save_checkpoint_file(file, checkpoint);
  return file;
}

// The tensors of a plain checkpoint, by name.
std::map<std::string, Tensor> checkpoint_tensors(const fs::path& file) {
  std::map<std::string, Tensor> out;
  for (const NamedTensor& t : load_checkpoint(file, read_checkpoint_info(file).model).model)
    out[t.name] = t.tensor;
  return out;
}

// (GGUF name, Forge name) of every tensor of a GPT-2-style model, in the order written.
std::vector<std::pair<std::string, std::string>> expected_names(int64_t n_layers, bool tied) {
  std::vector<std::pair<std::string, std::string>> names = {
      {"token_embd.weight", "tok_emb.weight"}, {"position_embd.weight", "pos_emb.weight"}};
  const std::pair<const char*, const char*> block[] = {
      {"attn_norm", "ln1"}, {"attn_qkv", "attn.qkv"}, {"attn_output", "attn.proj"},
      {"ffn_norm", "ln2"},  {"ffn_up", "mlp.fc"},     {"ffn_down", "mlp.proj"}};
  for (int64_t l = 0; l < n_layers; ++l)
    for (const auto& [gguf, forge] : block)
      for (const char* kind : {"weight", "bias"})
        names.emplace_back("blk." + std::to_string(l) + "." + gguf + "." + kind,
                           "blocks." + std::to_string(l) + "." + forge + "." + kind);
  names.emplace_back("output_norm.weight", "ln_f.weight");
  names.emplace_back("output_norm.bias", "ln_f.bias");
  if (!tied) names.emplace_back("output.weight", "lm_head.weight");
  return names;
}

// The tensor infos and data of `f` against the named tensors of `model`: names in order, dimensions
// reversed, f32, bytes equal, each offset aligned and packed after the previous tensor.
void expect_tensors(const GgufFile& f, const std::map<std::string, Tensor>& model,
                    int64_t n_layers, bool tied) {
  const auto names = expected_names(n_layers, tied);
  ASSERT_EQ(f.tensors.size(), names.size());
  EXPECT_EQ(model.size(), names.size());
  EXPECT_EQ(f.data_start % 32, 0u);
  uint64_t next = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const GgufTensorInfo& t = f.tensors[i];
    const auto& [gguf, forge] = names[i];
    EXPECT_EQ(t.name, gguf);
    ASSERT_TRUE(model.count(forge)) << forge;
    const Tensor& p = model.at(forge);
    std::vector<uint64_t> reversed(p.shape().rbegin(), p.shape().rend());
    EXPECT_EQ(t.dims, reversed) << gguf;
    EXPECT_EQ(t.type, 0u) << gguf;
    EXPECT_EQ(t.offset % 32, 0u) << gguf;
    EXPECT_EQ(t.offset, next) << gguf;
    next = t.offset + aligned32(nbytes(t));
    EXPECT_EQ(tensor_bytes(f, t), raw_bytes(p)) << gguf;
  }
  EXPECT_EQ(f.bytes.size(), f.data_start + next);
}

void expect_uint32(const GgufFile& f, const std::string& key, double value) {
  ASSERT_TRUE(f.kv.count(key)) << key;
  EXPECT_EQ(f.kv.at(key).type, 4u) << key;
  EXPECT_EQ(f.kv.at(key).numbers, std::vector<double>{value}) << key;
}

void expect_string(const GgufFile& f, const std::string& key, const std::string& value) {
  ASSERT_TRUE(f.kv.count(key)) << key;
  EXPECT_EQ(f.kv.at(key).type, 8u) << key;
  EXPECT_EQ(f.kv.at(key).strings, std::vector<std::string>{value}) << key;
}

void expect_float32(const GgufFile& f, const std::string& key, double value) {
  ASSERT_TRUE(f.kv.count(key)) << key;
  EXPECT_EQ(f.kv.at(key).type, 6u) << key;
  EXPECT_EQ(f.kv.at(key).numbers, std::vector<double>{double(float(value))}) << key;
}

// The architecture and the sizes every one of them writes under its own prefix.
void expect_sizes(const GgufFile& f, const std::string& arch, double context, double width,
                  double ffn, double blocks, double heads) {
  expect_string(f, "general.architecture", arch);
  expect_uint32(f, arch + ".context_length", context);
  expect_uint32(f, arch + ".embedding_length", width);
  expect_uint32(f, arch + ".feed_forward_length", ffn);
  expect_uint32(f, arch + ".block_count", blocks);
  expect_uint32(f, arch + ".attention.head_count", heads);
}

// The merge lines of a vocab.bpe.
std::vector<std::string> merge_lines(const fs::path& vocab_bpe) {
  std::ifstream in(vocab_bpe);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) lines.push_back(line);
  return lines;
}

// Every byte as GPT-2's bytes_to_unicode spells it, written out here: the printable Latin-1 bytes
// stand for themselves, the other 68 take code points 256, 257, ... in byte order.
std::vector<std::string> gpt2_byte_spellings() {
  std::vector<std::string> out;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? uint32_t(b) : next++;
    out.push_back(cp < 0x80 ? std::string(1, char(cp))
                            : std::string{char(0xC0 | cp >> 6), char(0x80 | (cp & 0x3F))});
  }
  return out;
}

// `file` exported to `out` and read back.
GgufFile exported(const fs::path& file, const fs::path& out) {
  export_gguf(file, out);
  return read_gguf(out);
}

class GgufExport : public testing::RecipeTest {};

TEST_F(GgufExport, WritesTheGpt2LayoutFieldByField) {
  const fs::path file = save_gpt(dir_,
                                 "vocab_size: 260, context: 24, d_model: 12, n_layers: 2, "
                                 "n_heads: 3, ffn_mult: 3, tie_embeddings: false, norm_eps: 1.0e-6",
                                 "tokenizer: bytes");
  const fs::path out = dir_ / "tiny.gguf";
  export_gguf(file, out);
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  const GgufFile f = read_gguf(out);

  EXPECT_EQ(f.bytes.substr(0, 4), "GGUF");
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.keys.size(), f.kv.size()) << "a key appears twice";
  const std::vector<std::string> keys = {
      "general.architecture",       "general.name",
      "general.alignment",          "general.file_type",
      "gpt2.context_length",        "gpt2.embedding_length",
      "gpt2.feed_forward_length",   "gpt2.block_count",
      "gpt2.attention.head_count",  "gpt2.attention.layer_norm_epsilon",
      "tokenizer.ggml.model",       "tokenizer.ggml.pre",
      "tokenizer.ggml.tokens",      "tokenizer.ggml.token_type",
      "tokenizer.ggml.merges"};
  EXPECT_EQ(f.keys, keys) << "no bos/eos: the run has no <|endoftext|>";
  EXPECT_EQ(f.kv_count, keys.size());
  expect_string(f, "general.name", "tiny_run");
  expect_uint32(f, "general.alignment", 32);
  expect_uint32(f, "general.file_type", 0);
  expect_sizes(f, "gpt2", 24, 12, 36, 2, 3);
  expect_float32(f, "gpt2.attention.layer_norm_epsilon", 1.0e-6);

  expect_tensors(f, checkpoint_tensors(file), 2, false);
  // The dimensions llama.cpp's gpt2 loader asks for: attn_qkv {n_embd, 3 n_embd}, ffn_up
  // {n_embd, n_ff}, ffn_down {n_ff, n_embd}, output {n_embd, n_vocab}.
  EXPECT_EQ(f.tensors[4].name, "blk.0.attn_qkv.weight");
  EXPECT_EQ(f.tensors[4].dims, (std::vector<uint64_t>{12, 36}));
  EXPECT_EQ(f.tensors[10].name, "blk.0.ffn_up.weight");
  EXPECT_EQ(f.tensors[10].dims, (std::vector<uint64_t>{12, 36}));
  EXPECT_EQ(f.tensors[12].name, "blk.0.ffn_down.weight");
  EXPECT_EQ(f.tensors[12].dims, (std::vector<uint64_t>{36, 12}));
  EXPECT_EQ(f.tensors.back().name, "output.weight");
  EXPECT_EQ(f.tensors.back().dims, (std::vector<uint64_t>{12, 260}));
}

TEST_F(GgufExport, WritesTheGpt2VocabularyAndLeavesATiedHeadToTokenEmbd) {
  const fs::path file = save_gpt(
      dir_, "vocab_size: 50257, context: 8, d_model: 4, n_layers: 1, n_heads: 1",
      "tokenizer: gpt2");
  const GgufFile f = exported(file, dir_ / "gpt2.gguf");
  expect_tensors(f, checkpoint_tensors(file), 1, true);

  expect_string(f, "tokenizer.ggml.model", "gpt2");
  expect_string(f, "tokenizer.ggml.pre", "gpt-2");
  expect_uint32(f, "tokenizer.ggml.bos_token_id", 50256);
  expect_uint32(f, "tokenizer.ggml.eos_token_id", 50256);
  const GgufValue& tokens = f.kv.at("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.type, 9u);
  EXPECT_EQ(tokens.element_type, 8u);
  ASSERT_EQ(tokens.strings.size(), 50257u);
  EXPECT_EQ(tokens.strings[0], "!");
  EXPECT_EQ(tokens.strings[220], "\xC4\xA0");         // " " spelled U+0120
  EXPECT_EQ(tokens.strings[198], "\xC4\x8A");         // "\n" spelled U+010A
  EXPECT_EQ(tokens.strings[50256], "<|endoftext|>");
  // Every token as encoder.json spells it.
  const nlohmann::json encoder =
      nlohmann::json::parse(testing::read_file("data/tokenizers/gpt2/encoder.json"));
  ASSERT_EQ(encoder.size(), 50257u);
  size_t same = 0;
  for (const auto& [spelling, id] : encoder.items())
    same += tokens.strings.at(id.get<size_t>()) == spelling;
  EXPECT_EQ(same, 50257u);

  const GgufValue& types = f.kv.at("tokenizer.ggml.token_type");
  EXPECT_EQ(types.type, 9u);
  EXPECT_EQ(types.element_type, 5u);
  ASSERT_EQ(types.numbers.size(), 50257u);
  EXPECT_EQ(types.numbers[0], 1);
  EXPECT_EQ(types.numbers[50256], 3);
  EXPECT_EQ(std::count(types.numbers.begin(), types.numbers.end(), 1.0), 50256);

  const GgufValue& merges = f.kv.at("tokenizer.ggml.merges");
  EXPECT_EQ(merges.element_type, 8u);
  const std::vector<std::string> lines = merge_lines("data/tokenizers/gpt2/vocab.bpe");
  ASSERT_EQ(lines.size(), 50000u);
  ASSERT_EQ(merges.strings.size(), 50000u);
  EXPECT_EQ(merges.strings[0], lines[0]);
  EXPECT_EQ(merges.strings, lines);
}

TEST_F(GgufExport, PadsATrainedVocabularyToTheModelAndMarksItsSpecials) {
  const fs::path tokenizer = dir_ / "bpe";
  train_bpe({dir_ / "corpus.txt"}, 300, tokenizer);
  const fs::path file =
      save_gpt(dir_, "vocab_size: 320, context: 8, d_model: 4, n_layers: 1, n_heads: 1",
               "tokenizer: " + tokenizer.string() + ", special_tokens: [\"<|pad|>\"]");
  const GgufFile f = exported(file, dir_ / "trained.gguf");
  expect_tensors(f, checkpoint_tensors(file), 1, true);

  const std::vector<std::string>& tokens = f.kv.at("tokenizer.ggml.tokens").strings;
  const std::vector<double>& types = f.kv.at("tokenizer.ggml.token_type").numbers;
  ASSERT_EQ(tokens.size(), 320u);
  ASSERT_EQ(types.size(), 320u);
  EXPECT_EQ(tokens[299], "<|endoftext|>");  // train_bpe's special, last of encoder.json
  EXPECT_EQ(tokens[300], "<|pad|>");        // data.special_tokens, after the vocabulary
  EXPECT_EQ(tokens[301], "[PAD301]");
  EXPECT_EQ(tokens[319], "[PAD319]");
  for (int id = 0; id < 320; ++id)
    EXPECT_EQ(types[size_t(id)], id < 299 ? 1 : id < 301 ? 3 : 5) << id;
  EXPECT_EQ(f.kv.at("tokenizer.ggml.merges").strings, merge_lines(tokenizer / "vocab.bpe"));
  expect_uint32(f, "tokenizer.ggml.eos_token_id", 299);
}

TEST_F(GgufExport, WritesTheBytesTokenizerAsABpeWithoutMerges) {
  const fs::path file =
      save_gpt(dir_, "vocab_size: 262, context: 8, d_model: 4, n_layers: 1, n_heads: 1",
               "tokenizer: bytes, special_tokens: [\"<|pad|>\", \"<|endoftext|>\"]");
  const GgufFile f = exported(file, dir_ / "bytes.gguf");
  expect_tensors(f, checkpoint_tensors(file), 1, true);

  expect_string(f, "tokenizer.ggml.model", "gpt2");
  expect_string(f, "tokenizer.ggml.pre", "gpt-2");
  const GgufValue& tokens = f.kv.at("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.type, 9u);
  EXPECT_EQ(tokens.element_type, 8u);
  ASSERT_EQ(tokens.strings.size(), 262u);
  // Id == byte, in GPT-2's spelling.
  const std::vector<std::string> spellings = gpt2_byte_spellings();
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens.strings[size_t(b)], spellings[size_t(b)]) << b;
  EXPECT_EQ(tokens.strings[0], "\xC4\x80");     // byte 0 spelled U+0100
  EXPECT_EQ(tokens.strings[10], "\xC4\x8A");    // "\n" spelled U+010A
  EXPECT_EQ(tokens.strings[32], "\xC4\xA0");    // " " spelled U+0120
  EXPECT_EQ(tokens.strings[65], "A");
  EXPECT_EQ(tokens.strings[0xE9], "\xC3\xA9");  // byte 0xE9 spelled U+00E9
  EXPECT_EQ(tokens.strings[256], "<|pad|>");    // data.special_tokens, in order
  EXPECT_EQ(tokens.strings[257], "<|endoftext|>");
  EXPECT_EQ(tokens.strings[258], "[PAD258]");
  EXPECT_EQ(tokens.strings[261], "[PAD261]");

  const GgufValue& types = f.kv.at("tokenizer.ggml.token_type");
  EXPECT_EQ(types.type, 9u);
  EXPECT_EQ(types.element_type, 5u);
  ASSERT_EQ(types.numbers.size(), 262u);
  for (int id = 0; id < 262; ++id)
    EXPECT_EQ(types.numbers[size_t(id)], id < 256 ? 1 : id < 258 ? 3 : 5) << id;

  // No merges, so the BPE leaves every byte its own token; llama.cpp's gpt2 vocabulary needs the
  // key ("cannot find tokenizer merges in model file" without it), empty or not.
  ASSERT_TRUE(f.kv.count("tokenizer.ggml.merges"));
  const GgufValue& merges = f.kv.at("tokenizer.ggml.merges");
  EXPECT_EQ(merges.type, 9u);
  EXPECT_EQ(merges.element_type, 8u);
  EXPECT_TRUE(merges.strings.empty());
  expect_uint32(f, "tokenizer.ggml.bos_token_id", 257);
  expect_uint32(f, "tokenizer.ggml.eos_token_id", 257);

  // The vocabulary `--format hf` writes for the same run, token for token.
  export_hf(file, dir_ / "hf");
  const nlohmann::json vocab =
      nlohmann::json::parse(testing::read_file(dir_ / "hf" / "vocab.json"));
  ASSERT_EQ(vocab.size(), 258u);
  for (const auto& [spelling, id] : vocab.items())
    EXPECT_EQ(tokens.strings.at(id.get<size_t>()), spelling) << id;
}

TEST_F(GgufExport, WritesALoRARunWithItsAdaptersMerged) {
  std::ofstream(dir_ / "base.yaml")
      << "recipe: gpt_pretrain\nseed: 1\noutput_dir: " << (dir_ / "base").string() << "\n"
      << "model: {arch: gpt, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
         "n_heads: 2}\n"
      << "data: {tokenizer: bytes, train: " << (dir_ / "corpus.txt").string()
      << ", val_fraction: 0.1}\n"
      << "train: {batch_size: 2, max_steps: 2, log_every: 1, sample_tokens: 1}\n";
  ASSERT_EQ(forge("train " + (dir_ / "base.yaml").string()), 0);
  std::ofstream(dir_ / "lora.yaml")
      << "recipe: finetune\nseed: 2\noutput_dir: " << (dir_ / "lora").string() << "\n"
      << "model: {init_from: " << (dir_ / "base").string() << "}\n"
      << "data: {train: " << (dir_ / "corpus.txt").string() << ", val_fraction: 0.1}\n"
      << "optimizer: {name: adamw, lr: 1.0e-2}\n"
      << "train: {batch_size: 2, max_steps: 3, log_every: 1, sample_tokens: 1}\n"
      << "lora: {rank: 4, alpha: 8}\n";
  ASSERT_EQ(forge("train " + (dir_ / "lora.yaml").string()), 0);

  const fs::path lora = dir_ / "lora", out = dir_ / "lora.gguf", merged = dir_ / "merged.h5";
  auto [code, text] = forge_output("export --checkpoint " + lora.string() +
                                   " --format gguf --output " + out.string());
  ASSERT_EQ(code, 0) << text;
  ASSERT_EQ(forge("export --checkpoint " + lora.string() + " --merge --output " +
                  merged.string()),
            0);
  const GgufFile f = read_gguf(out);
  // The GGUF tensors are the merged checkpoint's, bit for bit, and the adapters moved them.
  expect_tensors(f, checkpoint_tensors(merged), 1, true);
  const auto base = saved_tensors(dir_ / "base");
  const auto after = checkpoint_tensors(merged);
  EXPECT_NE(base.at("blocks.0.attn.qkv.weight"),
            after.at("blocks.0.attn.qkv.weight").to_vector<float>());
  EXPECT_EQ(base.at("ln_f.weight"), after.at("ln_f.weight").to_vector<float>());
  expect_string(f, "general.name", "lora");
}

// A SentencePiece tokenizer is not spelled as GPT-2's byte-level BPE: refused, not written as the
// 256 bytes.
TEST_F(GgufExport, RefusesATokenizerItCannotSpell) {
  const std::string model = std::string(FORGE_SOURCE_DIR) + "/tests/golden/sentencepiece/bpe.model";
  const fs::path file = save_gpt(dir_,
                                 "vocab_size: 1000, context: 8, d_model: 8, n_layers: 1, n_heads: "
                                 "2, norm: rmsnorm, position: rotary, mlp: swiglu, bias: false",
                                 "tokenizer: " + model);
  testing::expect_error(ExitCode::usage, "tokenizer '" + model + "' is not one",
                        [&] { export_gguf(file, dir_ / "refused.gguf"); });
  EXPECT_FALSE(fs::exists(dir_ / "refused.gguf"));
}

TEST_F(GgufExport, RefusesModelsNoLlamaCppArchitectureRuns) {
  const std::string llama = "norm: rmsnorm, position: rotary, mlp: swiglu, bias: false";
  const std::pair<std::string, std::string> cases[] = {
      {"norm: rmsnorm", "this model has rmsnorm, learned positions, gelu MLP, biases"},
      {"position: rotary", "this model has layernorm, rotary positions, gelu MLP, biases"},
      {"mlp: swiglu", "this model has layernorm, learned positions, swiglu MLP, biases"},
      {"bias: false", "this model has layernorm, learned positions, gelu MLP, no biases"},
      {"norm: rmsnorm, position: rotary, mlp: swiglu",
       "this model has rmsnorm, rotary positions, swiglu MLP, biases"},
      {"n_kv_heads: 1, fused_qkv: false, head_dim: 2",
       "llama.cpp's gpt2 architecture needs q, k and v fused, n_kv_heads = n_heads and head_dim "
       "= d_model / n_heads; this model has model.fused_qkv false, model.n_kv_heads 1, "
       "model.head_dim 2"},
      {"moe: {every: 1, n_experts: 2, top_k: 1}", "have no mixture-of-experts layers; this model has "
                                               "model.moe.every 1"},
      {llama + ", qkv_bias: true, head_dim: 6",
       "llama.cpp's qwen2 architecture (q/k/v biases) needs head_dim = d_model / n_heads; this "
       "model has model.head_dim 6 with d_model 8 and 2 heads"},
      {llama + ", qkv_bias: true, rope_scaling: {type: llama3, factor: 8}",
       "llama.cpp's qwen2 architecture (q/k/v biases) has no llama3 rotary scaling"}};
  for (const auto& [model, message] : cases) {
    const fs::path file = save_gpt(
        dir_, "vocab_size: 256, context: 8, d_model: 8, n_layers: 1, n_heads: 2, " + model,
        "tokenizer: bytes");
    const fs::path out = dir_ / "refused.gguf";
    try {
      export_gguf(file, out);
      ADD_FAILURE() << model << ": exported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::usage) << model;
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(file.string() + ": GGUF export: ", 0), 0u) << what;
      EXPECT_NE(what.find(message), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(out)) << model;
  }

  RunConfig config = load_config_string(
      "recipe: bert_pretrain\nseed: 1\nmodel: {arch: bert, vocab_size: 260, context: 16, "
      "d_model: 8, n_layers: 1, n_heads: 2}\ndata: {tokenizer: bytes, special_tokens: "
      "[\"[PAD]\", \"[CLS]\", \"[SEP]\", \"[MASK]\"], train: corpus.txt}\n",
      "bert.yaml", {}, ConfigFiles::skip);
  Generator gen(1);
  nn::Bert bert(bert_config(config), gen);
  CheckpointData checkpoint;
  checkpoint.config_yaml = to_yaml(config);
  checkpoint.model = bert.named_state();
  const fs::path file = dir_ / "bert.h5";
  save_checkpoint_file(file, checkpoint);
  auto [code, text] = forge_output("export --checkpoint " + file.string() +
                                   " --format gguf --output " + (dir_ / "bert.gguf").string());
  EXPECT_EQ(code, 2) << text;
  EXPECT_NE(text.find("holds a bert model; GGUF export writes GPT models only"),
            std::string::npos)
      << text;
}

// ---- llama.cpp's llama and qwen2 architectures ----

const std::string kLlama = "norm: rmsnorm, position: rotary, mlp: swiglu, bias: false";

// w [heads * D, cols] as llama.cpp's llama architecture stores q and k: its row 2i + s of each
// head is Forge's row s * D/2 + i (the converter's permutation, written out element by element).
Tensor interleaved_rows(const Tensor& w, int64_t D) {
  const std::vector<float> src = w.to_vector<float>();
  const int64_t cols = w.numel() / w.size(0);
  std::vector<float> dst(src.size());
  for (int64_t r = 0; r < w.size(0); ++r) {
    const int64_t head = r / D, i = r % D, from = head * D + (i % 2) * (D / 2) + i / 2;
    std::copy_n(src.begin() + from * cols, cols, dst.begin() + r * cols);
  }
  return from_vector(dst, w.shape());
}

// The tensors `f` should hold, in order: (GGUF name, expected tensor).
using Expected = std::vector<std::pair<std::string, Tensor>>;

// The llama/qwen2 tensors of a checkpoint with q, k and v apart: q and k permuted when `permuted`;
// q, k, v weights and then their biases when they were `fused` (split in place), else each
// weight followed by its bias as Forge names them.
Expected expected_llama(const std::map<std::string, Tensor>& model, int64_t n_layers, int64_t D,
                        bool permuted, bool fused) {
  Expected out = {{"token_embd.weight", model.at("tok_emb.weight")}};
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    const std::string b = "blocks." + std::to_string(l) + ".";
    out.emplace_back(blk + "attn_norm.weight", model.at(b + "ln1.weight"));
    for (int i = 0; i < 6; ++i) {
      const std::string x(1, "qkv"[fused ? i % 3 : i / 2]);
      const std::string kind = (fused ? i / 3 : i % 2) ? "bias" : "weight";
      const std::string name = b + "attn." + x + "." + kind;
      if (!model.count(name)) continue;
      const Tensor& t = model.at(name);
      out.emplace_back(blk + "attn_" + x + "." + kind,
                       permuted && x != "v" ? interleaved_rows(t, D) : t);
    }
    out.emplace_back(blk + "attn_output.weight", model.at(b + "attn.proj.weight"));
    out.emplace_back(blk + "ffn_norm.weight", model.at(b + "ln2.weight"));
    out.emplace_back(blk + "ffn_gate.weight", model.at(b + "mlp.gate.weight"));
    out.emplace_back(blk + "ffn_up.weight", model.at(b + "mlp.up.weight"));
    out.emplace_back(blk + "ffn_down.weight", model.at(b + "mlp.proj.weight"));
  }
  out.emplace_back("output_norm.weight", model.at("ln_f.weight"));
  if (model.count("lm_head.weight")) out.emplace_back("output.weight", model.at("lm_head.weight"));
  return out;
}

// The tensor infos and data of `f` against `expected`: names in order, dimensions reversed, f32,
// bytes equal, offsets aligned and packed.
void expect_tensors(const GgufFile& f, const Expected& expected) {
  ASSERT_EQ(f.tensors.size(), expected.size());
  uint64_t next = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const GgufTensorInfo& t = f.tensors[i];
    const auto& [name, p] = expected[i];
    EXPECT_EQ(t.name, name);
    std::vector<uint64_t> reversed(p.shape().rbegin(), p.shape().rend());
    EXPECT_EQ(t.dims, reversed) << name;
    EXPECT_EQ(t.type, 0u) << name;
    EXPECT_EQ(t.offset, next) << name;
    next = t.offset + aligned32(nbytes(t));
    EXPECT_EQ(tensor_bytes(f, t), raw_bytes(p.contiguous())) << name;
  }
  EXPECT_EQ(f.bytes.size(), f.data_start + next);
}

TEST_F(GgufExport, WritesTheLlamaLayoutWithPermutedQueryAndKeyRows) {
  const fs::path file = save_gpt(
      dir_, kLlama + ", vocab_size: 260, context: 24, d_model: 16, n_layers: 2, n_heads: 4, "
                     "n_kv_heads: 2, head_dim: 6, ffn_hidden: 40, fused_qkv: false, "
                     "tie_embeddings: false, norm_eps: 1.0e-6, rope_theta: 500000, "
                     "rope_scaling: {type: linear, factor: 2.5}",
      "tokenizer: bytes");
  const GgufFile f = exported(file, dir_ / "llama.gguf");
  EXPECT_EQ(f.version, 3u);
  const std::vector<std::string> keys = {
      "general.architecture",          "general.name",
      "general.alignment",             "general.file_type",
      "llama.context_length",          "llama.embedding_length",
      "llama.feed_forward_length",     "llama.block_count",
      "llama.attention.head_count",    "llama.attention.head_count_kv",
      "llama.attention.layer_norm_rms_epsilon", "llama.attention.key_length",
      "llama.attention.value_length",  "llama.rope.freq_base",
      "llama.rope.dimension_count",    "llama.rope.scaling.type",
      "llama.rope.scaling.factor",     "llama.vocab_size",
      "tokenizer.ggml.model",          "tokenizer.ggml.pre",
      "tokenizer.ggml.tokens",         "tokenizer.ggml.token_type",
      "tokenizer.ggml.merges"};
  EXPECT_EQ(f.keys, keys);
  expect_sizes(f, "llama", 24, 16, 40, 2, 4);
  expect_uint32(f, "llama.attention.head_count_kv", 2);
  expect_float32(f, "llama.attention.layer_norm_rms_epsilon", 1.0e-6);
  expect_uint32(f, "llama.attention.key_length", 6);  // not d_model / n_heads = 4
  expect_uint32(f, "llama.attention.value_length", 6);
  expect_float32(f, "llama.rope.freq_base", 500000);
  expect_uint32(f, "llama.rope.dimension_count", 6);
  expect_string(f, "llama.rope.scaling.type", "linear");
  expect_float32(f, "llama.rope.scaling.factor", 2.5);
  expect_uint32(f, "llama.vocab_size", 260);
  expect_string(f, "tokenizer.ggml.model", "gpt2");
  EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens").strings.size(), 260u);

  expect_tensors(f, expected_llama(checkpoint_tensors(file), 2, 6, true, false));
  // The dimensions llama.cpp's llama loader asks for: attn_q {n_embd, head_dim * n_head}, attn_k
  // and attn_v {n_embd, head_dim * n_head_kv}, attn_output {head_dim * n_head, n_embd}.
  EXPECT_EQ(f.tensors[2].name, "blk.0.attn_q.weight");
  EXPECT_EQ(f.tensors[2].dims, (std::vector<uint64_t>{16, 24}));
  EXPECT_EQ(f.tensors[3].dims, (std::vector<uint64_t>{16, 12}));
  EXPECT_EQ(f.tensors[5].name, "blk.0.attn_output.weight");
  EXPECT_EQ(f.tensors[5].dims, (std::vector<uint64_t>{24, 16}));
  EXPECT_EQ(f.tensors.back().name, "output.weight");
}

TEST_F(GgufExport, SplitsAFusedQkvAndWritesLlama3ScalingAsRopeFreqs) {
  const fs::path file = save_gpt(
      dir_, kLlama + ", vocab_size: 256, context: 16, d_model: 16, n_layers: 1, n_heads: 2, "
                     "ffn_hidden: 24, rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, "
                     "high_freq_factor: 4, original_context: 64}",
      "tokenizer: bytes");
  const GgufFile f = exported(file, dir_ / "llama3.gguf");
  for (const char* absent : {"llama.attention.key_length", "llama.rope.scaling.type",
                                    "llama.rope.scaling.factor"})
    EXPECT_FALSE(f.kv.count(absent)) << absent;
  // Forge's fused rows are q | k | v; llama.cpp loads the three apart.
  std::map<std::string, Tensor> model = checkpoint_tensors(file);
  const Tensor qkv = model.at("blocks.0.attn.qkv.weight");
  model.erase("blocks.0.attn.qkv.weight");
  model["blocks.0.attn.q.weight"] = slice(qkv, 0, 0, 16);
  model["blocks.0.attn.k.weight"] = slice(qkv, 0, 16, 32);
  model["blocks.0.attn.v.weight"] = slice(qkv, 0, 32, 48);
  Expected expected = expected_llama(model, 1, 8, true, true);
  // Transformers' llama3 rule, frequency by frequency for head_dim 8 and theta 10^4: wavelengths
  // 2 pi, 20 pi, 200 pi, 2000 pi against 64 / 4 = 16 (kept below) and 64 / 1 = 64 (divided by 8
  // above); 20 pi lies between, blended with smooth = (64 / (20 pi) - 1) / (4 - 1). llama.cpp
  // divides each frequency by the factor stored.
  const double smooth = (64 / (20 * std::numbers::pi) - 1) / 3;
  const double blended = 0.1 / ((1 - smooth) * 0.1 / 8 + smooth * 0.1);
  expected.insert(expected.begin(), {"rope_freqs.weight",
                                     from_vector(std::vector<double>{1, blended, 8, 8}, {4})});
  expect_tensors(f, expected);
}

TEST_F(GgufExport, WritesQkvBiasesAsQwen2WithoutPermutation) {
  const fs::path file = save_gpt(
      dir_, kLlama + ", qkv_bias: true, vocab_size: 256, context: 16, d_model: 16, n_layers: 1, "
                     "n_heads: 4, n_kv_heads: 2, ffn_hidden: 24, rope_theta: 1000000",
      "tokenizer: bytes");
  const GgufFile f = exported(file, dir_ / "qwen2.gguf");
  expect_sizes(f, "qwen2", 16, 16, 24, 1, 4);
  for (const std::string& key : f.keys)
    EXPECT_TRUE(key.rfind("general.", 0) == 0 || key.rfind("qwen2.", 0) == 0 ||
                key.rfind("tokenizer.ggml.", 0) == 0)
        << key;
  expect_uint32(f, "qwen2.attention.head_count_kv", 2);
  expect_float32(f, "qwen2.rope.freq_base", 1000000);
  expect_uint32(f, "qwen2.rope.dimension_count", 4);
  // qwen2 rotates (i, i + D/2) as Forge does: q and k as they are, with their biases.
  const std::map<std::string, Tensor> model = checkpoint_tensors(file);
  const Tensor qkv = model.at("blocks.0.attn.qkv.weight");
  const Tensor bias = model.at("blocks.0.attn.qkv.bias");
  std::map<std::string, Tensor> unfused = model;
  unfused.erase("blocks.0.attn.qkv.weight");
  unfused.erase("blocks.0.attn.qkv.bias");
  const int64_t bounds[] = {0, 16, 24, 32};
  for (int i = 0; i < 3; ++i) {
    const std::string x = std::string(1, "qkv"[i]);
    unfused["blocks.0.attn." + x + ".weight"] = slice(qkv, 0, bounds[i], bounds[i + 1]);
    unfused["blocks.0.attn." + x + ".bias"] = slice(bias, 0, bounds[i], bounds[i + 1]);
  }
  Expected expected = expected_llama(unfused, 1, 4, false, true);
  ASSERT_EQ(expected[5].first, "blk.0.attn_q.bias");
  expect_tensors(f, expected);
}

// The logits of `ids` as tests/golden/read_gguf.py computes them from `gguf`, [T][V].
std::vector<std::vector<double>> reader_logits(const fs::path& gguf, const std::vector<int>& ids,
                                               const fs::path& out) {
  std::string cmd = "/usr/bin/python3 " + std::string(FORGE_SOURCE_DIR) +
                    "/tests/golden/read_gguf.py " + gguf.string();
  for (int id : ids) {
    cmd += ' ';
    cmd += std::to_string(id);
  }
  cmd += " >" + out.string() + " 2>" + out.string() + ".err";
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("read_gguf.py failed: " + testing::read_file(out.string() + ".err"));
  std::vector<std::vector<double>> rows;
  std::istringstream lines(testing::read_file(out));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream values(line);
    rows.emplace_back(std::istream_iterator<double>(values), std::istream_iterator<double>());
  }
  return rows;
}

// The largest |difference| between Forge's logits for `ids` and the reader's from the export.
double logits_difference(const fs::path& file, const fs::path& gguf,
                         const std::vector<int>& ids) {
  const auto reader = reader_logits(gguf, ids, gguf.string() + ".logits");
  LoadedGPT loaded = load_gpt(file);
  Tensor x = empty({1, int64_t(ids.size())}, DType::i64);
  std::copy(ids.begin(), ids.end(), x.data<int64_t>());
  NoGradGuard no_grad;
  const Tensor logits = loaded.model->forward(x);  // [1, T, V]
  const int64_t V = logits.size(2);
  const std::vector<float> forge = logits.contiguous().to_vector<float>();
  if (reader.size() != ids.size()) throw std::runtime_error("read_gguf.py: wrong row count");
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (int64_t(reader[t].size()) != V) throw std::runtime_error("read_gguf.py: wrong row width");
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::abs(reader[t][size_t(v)] - double(forge[t * V + v])));
  }
  return worst;
}

// A reader of the file that computes as llama.cpp's llama graph does (adjacent rotary pairs on the
// permuted rows, rope_freqs, grouped-query attention) or its qwen2 graph (rotate-half pairs, q/k/v
// biases) gets Forge's logits. Needs Debian's python3-torch, which the build does not.
TEST_F(GgufExport, ReaderComputingAsLlamaCppGetsForgesLogits) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3-torch: the logits of the GGUF file are not checked here";
  const std::string shape = ", vocab_size: 260, context: 32, d_model: 16, n_layers: 2, ";
  const std::pair<std::string, std::string> models[] = {
      {"llama, q/k/v apart, 4 heads on 2 kv heads, head_dim 6, linear scaling, untied",
       kLlama + shape + "n_heads: 4, n_kv_heads: 2, head_dim: 6, ffn_hidden: 40, "
                        "fused_qkv: false, tie_embeddings: false, "
                        "rope_scaling: {type: linear, factor: 3}"},
      {"llama, fused, multi-query, llama3 scaling, tied",
       kLlama + shape + "n_heads: 2, n_kv_heads: 1, ffn_hidden: 24, rope_scaling: "
                        "{type: llama3, factor: 8, high_freq_factor: 4, original_context: 64}"},
      {"qwen2, q/k/v apart, 4 heads on 2 kv heads, untied",
       kLlama + shape + "qkv_bias: true, n_heads: 4, n_kv_heads: 2, ffn_hidden: 24, "
                        "fused_qkv: false, tie_embeddings: false, rope_theta: 1000000"},
      {"qwen2, fused, linear scaling, tied",
       kLlama + shape + "qkv_bias: true, n_heads: 2, ffn_hidden: 24, "
                        "rope_scaling: {type: linear, factor: 2}"}};
  const std::vector<int> ids = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 259,
                                0,  10,  82,  79,  77,  69, 79, 58, 32,  73};
  for (const auto& [what, model] : models) {
    // Smaller weights keep the residual stream, and so Forge's float32 rounding, small.
    const fs::path file = save_gpt(dir_, model, "tokenizer: bytes", 0.5);
    const fs::path gguf = dir_ / "model.gguf";
    export_gguf(file, gguf);
    const double diff = logits_difference(file, gguf, ids);
    EXPECT_LE(diff, 1e-4) << what;
    std::printf("%s: max |logit difference| %.3g\n", what.c_str(), diff);
  }
}

TEST_F(GgufExport, CommandLine) {
  const fs::path file = save_gpt(
      dir_, "vocab_size: 256, context: 8, d_model: 8, n_layers: 1, n_heads: 2", "tokenizer: bytes");
  const std::string export_file = "export --checkpoint " + file.string();
  const fs::path out = dir_ / "cli.gguf";
  auto [code, text] = forge_output(export_file + " --format gguf --output " + out.string());
  EXPECT_EQ(code, 0) << text;
  EXPECT_EQ(text, out.string() + ": " + file.string() + " as GGUF (llama.cpp gpt2, f32)\n");
  EXPECT_EQ(read_gguf(out).version, 3u);

  for (const std::string& wrong :
       {export_file + " --format onnx --output " + out.string(),
        export_file + " --format gguf --merge --output " + out.string(),
        export_file + " --output " + out.string(), export_file + " --format gguf"}) {
    auto [wrong_code, wrong_text] = forge_output(wrong);
    EXPECT_EQ(wrong_code, 2) << wrong << "\n" << wrong_text;
  }
  // --merge still wants a LoRA run.
  auto [merge_code, merge_text] = forge_output(export_file + " --merge --output " +
                                               (dir_ / "m.h5").string());
  EXPECT_EQ(merge_code, 2) << merge_text;
  EXPECT_NE(merge_text.find("holds no adapters"), std::string::npos) << merge_text;

  // The architecture written is named.
  const fs::path llama = save_gpt(
      dir_, kLlama + ", vocab_size: 256, context: 8, d_model: 8, n_layers: 1, n_heads: 2",
      "tokenizer: bytes");
  auto [llama_code, llama_text] = forge_output("export --checkpoint " + llama.string() +
                                               " --format gguf --output " + out.string());
  EXPECT_EQ(llama_code, 0) << llama_text;
  EXPECT_EQ(llama_text,
            out.string() + ": " + llama.string() + " as GGUF (llama.cpp llama, f32)\n");
}

}  // namespace
}  // namespace forge
