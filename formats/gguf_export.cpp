// GGUF export. The whole file is built in memory: header, metadata, tensor infos, then the tensor
// data at aligned offsets, and written in one atomic replacement, so a crash leaves the old file or
// none. The layout, the keys and the Forge -> llama.cpp names are in docs/interop.md.
#include "formats/gguf_export.h"

#include <bit>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "nn/gpt.h"
#include "runtime/components.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "GGUF files are written little-endian from memory as it is");

constexpr uint32_t kVersion = 3;
// general.alignment: the data section and every tensor's offset in it are multiples of it.
constexpr uint64_t kAlignment = 32;
constexpr uint32_t kTypeF32 = 0;   // ggml_type of every tensor
constexpr uint32_t kAllF32 = 0;    // general.file_type
// tokenizer.ggml.token_type values.
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUnused = 5;

enum class ValueType : uint32_t { uint32 = 4, int32 = 5, float32 = 6, string = 8, array = 9 };

uint64_t aligned(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

// The metadata section: key-value pairs as they are added, and how many.
class Metadata {
 public:
  void add_uint32(const std::string& key, int64_t value) {
    start(key, ValueType::uint32);
    put<uint32_t>(bytes_, uint32_t(value));
  }
  void add_float32(const std::string& key, double value) {
    start(key, ValueType::float32);
    put<float>(bytes_, float(value));
  }
  void add_string(const std::string& key, const std::string& value) {
    start(key, ValueType::string);
    put_string(bytes_, value);
  }
  void add_strings(const std::string& key, const std::vector<std::string>& values) {
    start_array(key, ValueType::string, values.size());
    for (const std::string& v : values) put_string(bytes_, v);
  }
  void add_int32s(const std::string& key, const std::vector<int32_t>& values) {
    start_array(key, ValueType::int32, values.size());
    for (int32_t v : values) put<int32_t>(bytes_, v);
  }

  const std::string& bytes() const { return bytes_; }
  uint64_t count() const { return count_; }

 private:
  void start(const std::string& key, ValueType type) {
    put_string(bytes_, key);
    put<uint32_t>(bytes_, uint32_t(type));
    ++count_;
  }
  void start_array(const std::string& key, ValueType element, size_t n) {
    start(key, ValueType::array);
    put<uint32_t>(bytes_, uint32_t(element));
    put<uint64_t>(bytes_, n);
  }

  std::string bytes_;
  uint64_t count_ = 0;
};

// llama.cpp's name for a parameter of nn::GPT (nn/gpt.h).
std::string gguf_name(const std::string& name) {
  static const std::pair<std::string, std::string> kModel[] = {
      {"tok_emb.weight", "token_embd.weight"}, {"pos_emb.weight", "position_embd.weight"},
      {"ln_f.weight", "output_norm.weight"},   {"ln_f.bias", "output_norm.bias"},
      {"lm_head.weight", "output.weight"}};
  static const std::pair<std::string, std::string> kBlock[] = {
      {"ln1.", "attn_norm."}, {"attn.qkv.", "attn_qkv."}, {"attn.proj.", "attn_output."},
      {"ln2.", "ffn_norm."},  {"mlp.fc.", "ffn_up."},     {"mlp.proj.", "ffn_down."}};
  for (const auto& [forge_name, gguf] : kModel)
    if (name == forge_name) return gguf;
  const std::string blocks = "blocks.";
  if (const size_t dot = name.find('.', blocks.size()); name.rfind(blocks, 0) == 0 &&
                                                        dot != std::string::npos) {
    const std::string rest = name.substr(dot + 1);
    for (const auto& [part, gguf] : kBlock)
      if (rest.rfind(part, 0) == 0)
        return "blk." + name.substr(blocks.size(), dot - blocks.size()) + "." + gguf +
               rest.substr(part.size());
  }
  throw Error(ExitCode::internal, "GGUF export: no llama.cpp name for parameter '" + name + "'");
}

// The run's name: the last component of its output directory.
std::string run_name(const RunConfig& config) {
  const fs::path dir = fs::path(config.output_dir).lexically_normal();
  const std::string name = dir.filename().string();
  return name.empty() ? dir.parent_path().filename().string() : name;
}

// A GPT-2 byte-level BPE as encoder.json and vocab.bpe spell it.
struct SpelledVocabulary {
  std::vector<std::string> tokens;  // in id order
  std::vector<std::string> merges;  // in rank order
};

// The bytes tokenizer is the byte-level BPE without merges whose tokens are the 256 bytes (id ==
// byte) and then the special tokens: with no merge to apply, that BPE maps every byte to its own
// id. `--format hf` writes it the same way.
SpelledVocabulary spelled_vocabulary(const Tokenizer& tokenizer) {
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer))
    return {bpe->spelled_tokens(), bpe->spelled_merges()};
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(gpt2_spelling(std::string(1, char(b))));
  for (const auto& [text, id] : tokenizer.specials()) tokens.push_back(text);
  return {tokens, {}};
}

// tokenizer.ggml.*: the vocabulary in GPT-2's spelling padded to the model's vocabulary with
// unused "[PAD<id>]" tokens, special tokens as control tokens, the merges (even none: llama.cpp
// refuses a gpt2 vocabulary without the key), and <|endoftext|> as the begin and end of text.
void add_tokenizer(Metadata& meta, const RunConfig& config, const fs::path& file) {
  const std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  auto [tokens, merges] = spelled_vocabulary(*tokenizer);
  const int64_t vocab = config.model.vocab_size;
  if (int64_t(tokens.size()) > vocab)
    throw Error(ExitCode::data,
                detail::concat(file.string(), ": tokenizer '", config.data.tokenizer, "' has ",
                               tokens.size(), " tokens, more than the model's vocabulary of ",
                               vocab));
  std::vector<int32_t> types(tokens.size(), kTokenNormal);
  for (const auto& [text, id] : tokenizer->specials()) types[size_t(id)] = kTokenControl;
  for (int64_t id = int64_t(tokens.size()); id < vocab; ++id) {
    tokens.push_back("[PAD" + std::to_string(id) + "]");
    types.push_back(kTokenUnused);
  }
  meta.add_string("tokenizer.ggml.model", "gpt2");
  meta.add_string("tokenizer.ggml.pre", "gpt-2");
  meta.add_strings("tokenizer.ggml.tokens", tokens);
  meta.add_int32s("tokenizer.ggml.token_type", types);
  meta.add_strings("tokenizer.ggml.merges", merges);
  if (std::optional<int32_t> eot = tokenizer->special_id("<|endoftext|>")) {
    meta.add_uint32("tokenizer.ggml.bos_token_id", *eot);
    meta.add_uint32("tokenizer.ggml.eos_token_id", *eot);
  }
}

// The file: header, metadata, tensor infos (dimensions innermost first, offsets relative to the
// data section), then each tensor's f32 data padded to the alignment.
std::string gguf_file(const Metadata& meta, const NamedTensors& tensors) {
  std::string out = "GGUF";
  put<uint32_t>(out, kVersion);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, meta.count());
  out += meta.bytes();
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.tensor.dim()));
    for (int64_t d = t.tensor.dim() - 1; d >= 0; --d) put<uint64_t>(out, t.tensor.size(d));
    put<uint32_t>(out, kTypeF32);
    put<uint64_t>(out, offset);
    offset += aligned(uint64_t(t.tensor.numel()) * sizeof(float));
  }
  out.resize(aligned(out.size()), '\0');
  for (const NamedTensor& t : tensors) {
    out.append(static_cast<const char*>(t.tensor.raw_data()), t.tensor.numel() * sizeof(float));
    out.resize(aligned(out.size()), '\0');
  }
  return out;
}

}  // namespace

void export_gguf(const fs::path& checkpoint_file, const fs::path& output) {
  require_language_model(checkpoint_file, "GGUF (llama.cpp's gpt2 language model) cannot hold it");
  require_gpt2_layout(checkpoint_file, stored_config(checkpoint_file).model, "GGUF export");
  const MergedGPT gpt = load_merged_gpt(checkpoint_file);
  const ModelConfig& m = gpt.config.model;
  Metadata meta;
  meta.add_string("general.architecture", "gpt2");
  meta.add_string("general.name", run_name(gpt.config));
  meta.add_uint32("general.alignment", kAlignment);
  meta.add_uint32("general.file_type", kAllF32);
  meta.add_uint32("gpt2.context_length", m.context);
  meta.add_uint32("gpt2.embedding_length", m.d_model);
  meta.add_uint32("gpt2.feed_forward_length", nn::mlp_hidden_size(gpt_config(m)));
  meta.add_uint32("gpt2.block_count", m.n_layers);
  meta.add_uint32("gpt2.attention.head_count", m.n_heads);
  meta.add_float32("gpt2.attention.layer_norm_epsilon", m.norm_eps);
  add_tokenizer(meta, gpt.config, checkpoint_file);
  // Forge's Linear weights are [out, in] row-major: with the dimensions reversed they are the
  // [in, out] ggml tensors llama.cpp's gpt2 graph multiplies by, q | k | v rows included.
  NamedTensors tensors;
  for (const NamedTensor& t : gpt.weights)
    tensors.push_back({gguf_name(t.name), t.tensor.to(DType::f32).contiguous()});
  write_file_atomic(output, gguf_file(meta, tensors), ExitCode::checkpoint);
}

}  // namespace forge
