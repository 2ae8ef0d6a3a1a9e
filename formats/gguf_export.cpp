// GGUF export as llama.cpp's gpt2, llama or qwen2 architecture. The whole file is built in memory:
// header, metadata, tensor infos, then the tensor data at aligned offsets, and written in one
// atomic replacement, so a crash leaves the old file or none. The layout, the keys, the Forge ->
// llama.cpp names and the q/k row permutation of the llama architecture are in docs/interop.md.
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
#include "core/glob.h"
#include "core/ops/layout.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "nn/attention.h"
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

// The llama.cpp architecture a GPT is written as.
enum class Arch { gpt2, llama, qwen2 };

const char* arch_name(Arch arch) {
  return arch == Arch::gpt2 ? "gpt2" : arch == Arch::llama ? "llama" : "qwen2";
}

[[noreturn]] void refuse(const fs::path& file, const std::string& why) {
  throw Error(ExitCode::usage, file.string() + ": GGUF export: " + why);
}

// The llama.cpp architecture whose graph computes what the GPT of `m` computes: gpt2 for GPT-2's
// layout (layernorm, learned positions, gelu MLP, biases), llama for Llama's (rmsnorm, rotary
// positions, swiglu MLP, no biases) and qwen2 for Llama's with q/k/v biases, which llama.cpp's
// llama graph would add but its Qwen2 converter writes as qwen2. Error(usage) naming what the
// architecture lacks for any other model.
Arch gguf_arch(const fs::path& file, const ModelConfig& m) {
  if (m.arch != "gpt")
    throw Error(ExitCode::usage, detail::concat(file.string(), ": holds a ", m.arch,
                                                " model; GGUF export writes GPT models only"));
  if (m.moe_every > 0)
    refuse(file, detail::concat("llama.cpp's gpt2, llama and qwen2 architectures have no "
                                "mixture-of-experts layers; this model has model.moe.every ",
                                m.moe_every));
  const nn::GPTConfig g = gpt_config(m);
  const int64_t kv = nn::kv_heads(g), D = nn::head_dim(g);
  if (m.norm == "layernorm" && m.position == "learned" && m.mlp == "gelu" && m.bias) {
    std::string lacks;
    auto need = [&](bool ok, const std::string& what) {
      if (!ok) lacks += (lacks.empty() ? "" : ", ") + what;
    };
    need(m.fused_qkv, "model.fused_qkv false");
    need(kv == m.n_heads, detail::concat("model.n_kv_heads ", kv));
    need(D * m.n_heads == m.d_model, detail::concat("model.head_dim ", D));
    if (!lacks.empty())
      refuse(file, "llama.cpp's gpt2 architecture needs q, k and v fused, n_kv_heads = n_heads "
                   "and head_dim = d_model / n_heads; this model has " + lacks);
    return Arch::gpt2;
  }
  if (m.norm == "rmsnorm" && m.position == "rotary" && m.mlp == "swiglu" && !m.bias) {
    if (!m.qkv_bias) return Arch::llama;
    if (D * m.n_heads != m.d_model)
      refuse(file, detail::concat("llama.cpp's qwen2 architecture (q/k/v biases) needs "
                                  "head_dim = d_model / n_heads; this model has model.head_dim ",
                                  D, " with d_model ", m.d_model, " and ", m.n_heads, " heads"));
    if (m.rope_scaling == "llama3")
      refuse(file, "llama.cpp's qwen2 architecture (q/k/v biases) has no llama3 rotary scaling "
                   "(model.rope_scaling.type: none or linear)");
    return Arch::qwen2;
  }
  refuse(file, "llama.cpp runs GPT-2's layout (layernorm, learned positions, gelu MLP, biases) "
               "or Llama's (rmsnorm, rotary positions, swiglu MLP, no biases but q/k/v ones); "
               "this model has " + m.norm + ", " + m.position + " positions, " + m.mlp + " MLP, " +
               (m.bias ? "biases" : "no biases"));
}

// llama.cpp's name for a parameter of nn::GPT (nn/gpt.h), q, k and v apart unless `arch` is gpt2.
std::string gguf_name(const std::string& name, Arch arch) {
  static const std::pair<std::string, std::string> kModel[] = {
      {"tok_emb.weight", "token_embd.weight"}, {"pos_emb.weight", "position_embd.weight"},
      {"ln_f.weight", "output_norm.weight"},   {"ln_f.bias", "output_norm.bias"},
      {"lm_head.weight", "output.weight"}};
  static const std::vector<std::pair<std::string, std::string>> kGpt2Block = {
      {"ln1.", "attn_norm."}, {"attn.qkv.", "attn_qkv."}, {"attn.proj.", "attn_output."},
      {"ln2.", "ffn_norm."},  {"mlp.fc.", "ffn_up."},     {"mlp.proj.", "ffn_down."}};
  static const std::vector<std::pair<std::string, std::string>> kLlamaBlock = {
      {"ln1.", "attn_norm."},      {"attn.q.", "attn_q."},     {"attn.k.", "attn_k."},
      {"attn.v.", "attn_v."},      {"attn.proj.", "attn_output."}, {"ln2.", "ffn_norm."},
      {"mlp.gate.", "ffn_gate."}, {"mlp.up.", "ffn_up."},     {"mlp.proj.", "ffn_down."}};
  for (const auto& [forge_name, gguf] : kModel)
    if (name == forge_name) return gguf;
  const std::string blocks = "blocks.";
  if (const size_t dot = name.find('.', blocks.size()); name.rfind(blocks, 0) == 0 &&
                                                        dot != std::string::npos) {
    const std::string rest = name.substr(dot + 1);
    for (const auto& [part, gguf] : arch == Arch::gpt2 ? kGpt2Block : kLlamaBlock)
      if (rest.rfind(part, 0) == 0)
        return "blk." + name.substr(blocks.size(), dot - blocks.size()) + "." + gguf +
               rest.substr(part.size());
  }
  throw Error(ExitCode::internal, "GGUF export: no llama.cpp name for parameter '" + name + "'");
}

// llama.cpp's llama graph rotates ADJACENT pairs (2i, 2i+1) of each head (its rope type NORM)
// where Forge, like Hugging Face, rotates (i, i + D/2) with the same frequency i. So row i of each
// head of q and k moves to row 2i and row i + D/2 to row 2i + 1: llama.cpp's converter permutes
// q_proj and k_proj this way (reshape(heads, 2, D/2, in), swap the middle axes). q and k move
// alike within each head, so every attention score, and so the output, is what Forge computes.
Tensor interleave_rotary_rows(const Tensor& w, int64_t heads) {
  const int64_t half = w.size(0) / heads / 2, cols = w.numel() / w.size(0);
  return reshape(transpose(reshape(w.contiguous(), {heads, 2, half, cols}), 1, 2), w.shape());
}

// llama.cpp divides each rotary frequency i by rope_freqs.weight[i] (the tensor its converter
// writes for Llama 3.1's scaling): the unscaled frequency over the scaled one Forge uses.
Tensor llama3_rope_factors(const nn::GPTConfig& g) {
  const int64_t D = nn::head_dim(g);
  const std::vector<double> plain = nn::rotary_frequencies(D, g.rope_theta);
  const std::vector<double> scaled = nn::rotary_frequencies(D, g.rope_theta, g.rope_scaling);
  std::vector<float> factors;
  for (size_t i = 0; i < plain.size(); ++i) factors.push_back(float(plain[i] / scaled[i]));
  return from_vector(factors, {int64_t(factors.size())});
}

// The tensors of a GPT as llama.cpp's `arch` loads them, f32 and contiguous. Forge's Linear weights
// are [out, in] row-major: with the dimensions reversed they are the [in, out] ggml tensors
// llama.cpp multiplies by, so none is transposed.
NamedTensors gguf_tensors(const NamedTensors& weights, const nn::GPTConfig& g, Arch arch) {
  NamedTensors out;
  if (arch == Arch::gpt2) {
    for (const NamedTensor& t : weights)
      out.push_back({gguf_name(t.name, arch), t.tensor.to(DType::f32).contiguous()});
    return out;
  }
  if (g.rope_scaling.type == nn::RopeScalingType::llama3)
    out.push_back({"rope_freqs.weight", llama3_rope_factors(g)});
  for (const NamedTensor& t : nn::unfuse_qkv(weights, g)) {
    Tensor w = t.tensor.to(DType::f32);
    if (arch == Arch::llama && glob_match("*.attn.q.*", t.name))
      w = interleave_rotary_rows(w, g.n_heads);
    if (arch == Arch::llama && glob_match("*.attn.k.*", t.name))
      w = interleave_rotary_rows(w, nn::kv_heads(g));
    out.push_back({gguf_name(t.name, arch), w.contiguous()});
  }
  return out;
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
  // Any other tokenizer spelled as bytes would be a vocabulary the model was not trained with.
  if (!dynamic_cast<const BpeTokenizer*>(tokenizer.get()) &&
      !dynamic_cast<const ByteTokenizer*>(tokenizer.get()))
    throw Error(ExitCode::usage,
                detail::concat(file.string(), ": GGUF export writes the vocabulary as GPT-2's "
                               "byte-level BPE (tokenizer.ggml.model gpt2); tokenizer '",
                               config.data.tokenizer, "' is not one (a SentencePiece or WordPiece "
                               "vocabulary is not written)"));
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

std::string export_gguf(const fs::path& checkpoint_file, const fs::path& output) {
  require_language_model(checkpoint_file, "GGUF (llama.cpp's language models) cannot hold it");
  const Arch arch = gguf_arch(checkpoint_file, stored_config(checkpoint_file).model);
  const MergedGPT gpt = load_merged_gpt(checkpoint_file);
  const ModelConfig& m = gpt.config.model;
  const nn::GPTConfig g = gpt_config(m);
  const std::string a = arch_name(arch);
  Metadata meta;
  meta.add_string("general.architecture", a);
  meta.add_string("general.name", run_name(gpt.config));
  meta.add_uint32("general.alignment", kAlignment);
  meta.add_uint32("general.file_type", kAllF32);
  meta.add_uint32(a + ".context_length", m.context);
  meta.add_uint32(a + ".embedding_length", m.d_model);
  meta.add_uint32(a + ".feed_forward_length", nn::mlp_hidden_size(g));
  meta.add_uint32(a + ".block_count", m.n_layers);
  meta.add_uint32(a + ".attention.head_count", m.n_heads);
  if (arch == Arch::gpt2) {
    meta.add_float32(a + ".attention.layer_norm_epsilon", m.norm_eps);
  } else {
    const int64_t D = nn::head_dim(g);
    meta.add_uint32(a + ".attention.head_count_kv", nn::kv_heads(g));
    meta.add_float32(a + ".attention.layer_norm_rms_epsilon", m.norm_eps);
    // llama.cpp takes d_model / n_heads unless told.
    if (D != m.d_model / m.n_heads) {
      meta.add_uint32(a + ".attention.key_length", D);
      meta.add_uint32(a + ".attention.value_length", D);
    }
    meta.add_float32(a + ".rope.freq_base", m.rope_theta);
    meta.add_uint32(a + ".rope.dimension_count", D);
    if (m.rope_scaling == "linear") {
      meta.add_string(a + ".rope.scaling.type", "linear");
      meta.add_float32(a + ".rope.scaling.factor", m.rope_factor);
    }
    meta.add_uint32(a + ".vocab_size", m.vocab_size);
  }
  add_tokenizer(meta, gpt.config, checkpoint_file);
  write_file_atomic(output, gguf_file(meta, gguf_tensors(gpt.weights, g, arch)),
                    ExitCode::checkpoint);
  return a;
}

}  // namespace forge
