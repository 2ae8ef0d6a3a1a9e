#include "formats/hf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/bounded_json.h"
#include "core/durable_file.h"
#include "core/file_io.h"
#include "core/glob.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "nn/gpt.h"
#include "nn/lora.h"
#include "optim/clip.h"
#include "runtime/bert_config.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "runtime/lora_config.h"

namespace forge {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kIndexFile = "model.safetensors.index.json";

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw Error(ExitCode::checkpoint, quoted_path(file.string()) + ": " + what);
}

// One Forge tensor and the Hugging Face tensors it is made of: stacked along dim 0 (BERT keeps
// query, key and value apart; Forge's qkv is their rows in that order), each transposed when HF
// stores it as a GPT-2 Conv1D weight, [in, out] instead of Linear's [out, in].
struct Part {
  std::string name;
  bool transposed = false;
};
struct Mapped {
  std::string forge;
  std::vector<Part> parts;
};

// Everything a model's directory maps to: Forge's tensors, and the HF tensors that hold nothing
// Forge keeps (attention-mask buffers, a tied decoder's copy of the embedding).
struct Layout {
  std::vector<Mapped> tensors;
  std::vector<std::string> ignored;  // glob patterns
};

void add(Layout& l, std::string forge, std::string hf, bool transposed = false) {
  l.tensors.push_back({std::move(forge), {{std::move(hf), transposed}}});
}

// Pairs of weight and bias, or LayerNorm's weight and bias.
void add_linear(Layout& l, const std::string& forge, const std::string& hf, bool conv1d = false) {
  add(l, forge + ".weight", hf + ".weight", conv1d);
  add(l, forge + ".bias", hf + ".bias");
}

// transformers' GPT2LMHeadModel saves its body under "transformer."; GPT2Model (what the hub's
// "gpt2" repository holds) saves it without. The LM head is tied unless the config says otherwise.
Layout gpt2_layout(int64_t n_layers, bool tied, const std::string& p) {
  Layout l;
  add(l, "tok_emb.weight", p + "wte.weight");
  add(l, "pos_emb.weight", p + "wpe.weight");
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const std::string h = p + "h." + std::to_string(i) + ".";
    add_linear(l, b + "ln1", h + "ln_1");
    add_linear(l, b + "attn.qkv", h + "attn.c_attn", true);
    add_linear(l, b + "attn.proj", h + "attn.c_proj", true);
    add_linear(l, b + "ln2", h + "ln_2");
    add_linear(l, b + "mlp.fc", h + "mlp.c_fc", true);
    add_linear(l, b + "mlp.proj", h + "mlp.c_proj", true);
  }
  add_linear(l, "ln_f", p + "ln_f");
  if (!tied) add(l, "lm_head.weight", "lm_head.weight");
  l.ignored = {p + "h.*.attn.bias", p + "h.*.attn.masked_bias"};
  if (tied) l.ignored.push_back("lm_head.weight");
  return l;
}

// transformers' LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: the body under
// "model.", q, k and v projected apart (Forge's fused_qkv: false), biases on q, k and v only
// (Qwen2) or nowhere, RMSNorm weights only. Old exports carry each layer's rotary inv_freq buffer,
// which Forge derives from the config instead.
Layout llama_layout(int64_t n_layers, bool tied, bool qkv_bias) {
  Layout l;
  add(l, "tok_emb.weight", "model.embed_tokens.weight");
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const std::string h = "model.layers." + std::to_string(i) + ".";
    add(l, b + "ln1.weight", h + "input_layernorm.weight");
    for (const char* x : {"q", "k", "v"}) {
      add(l, b + "attn." + x + ".weight", h + "self_attn." + x + "_proj.weight");
      if (qkv_bias) add(l, b + "attn." + x + ".bias", h + "self_attn." + x + "_proj.bias");
    }
    add(l, b + "attn.proj.weight", h + "self_attn.o_proj.weight");
    add(l, b + "ln2.weight", h + "post_attention_layernorm.weight");
    add(l, b + "mlp.gate.weight", h + "mlp.gate_proj.weight");
    add(l, b + "mlp.up.weight", h + "mlp.up_proj.weight");
    add(l, b + "mlp.proj.weight", h + "mlp.down_proj.weight");
  }
  add(l, "ln_f.weight", "model.norm.weight");
  if (!tied) add(l, "lm_head.weight", "lm_head.weight");
  l.ignored = {"model.layers.*.self_attn.rotary_emb.inv_freq"};
  if (tied) l.ignored.push_back("lm_head.weight");
  return l;
}

// BertForPreTraining's names ("bert." body, "cls." heads); BertModel saves the body without the
// prefix and has no heads. Forge's BERT has both heads, so a directory without them can start a
// model only where the loader allows them missing (a classifier that drops them).
Layout bert_layout(int64_t n_layers, const std::string& p, bool pooler, bool heads) {
  Layout l;
  add(l, "tok_emb.weight", p + "embeddings.word_embeddings.weight");
  add(l, "pos_emb.weight", p + "embeddings.position_embeddings.weight");
  add(l, "seg_emb.weight", p + "embeddings.token_type_embeddings.weight");
  add_linear(l, "emb_ln", p + "embeddings.LayerNorm");
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const std::string h = p + "encoder.layer." + std::to_string(i) + ".";
    for (const char* s : {"weight", "bias"}) {
      std::vector<Part> qkv;
      for (const char* m : {"query", "key", "value"})
        qkv.push_back({h + "attention.self." + m + "." + s});
      l.tensors.push_back({b + "attn.qkv." + s, qkv});
    }
    add_linear(l, b + "attn.proj", h + "attention.output.dense");
    add_linear(l, b + "ln1", h + "attention.output.LayerNorm");
    add_linear(l, b + "ff.fc", h + "intermediate.dense");
    add_linear(l, b + "ff.proj", h + "output.dense");
    add_linear(l, b + "ln2", h + "output.LayerNorm");
  }
  if (pooler) add_linear(l, "pooler", p + "pooler.dense");
  if (heads) {
    add_linear(l, "mlm.dense", "cls.predictions.transform.dense");
    add_linear(l, "mlm.ln", "cls.predictions.transform.LayerNorm");
    add(l, "mlm.bias", "cls.predictions.bias");
    add_linear(l, "nsp", "cls.seq_relationship");
  }
  l.ignored = {p + "embeddings.position_ids", "cls.predictions.decoder.weight",
               "cls.predictions.decoder.bias"};
  return l;
}

std::string number_text(double x) {
  std::ostringstream out;
  out.precision(17);
  out << x;
  std::string s = out.str();
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// A JSON file from elsewhere (config.json, the shard index), parsed with its nesting bounded.
json read_json_file(const fs::path& file, const InputKind& kind) {
  json j;
  try {
    j = parse_bounded_json(read_input_file(file.string(), kind), /*allow_exceptions=*/false);
  } catch (const JsonTooDeep& e) {
    fail(file, std::string("not valid JSON: ") + e.what());
  }
  if (j.is_discarded()) fail(file, "not valid JSON");
  if (!j.is_object()) fail(file, "not a JSON object");
  return j;
}

// config.json, read as untrusted: every field checked for type and range, errors name the key
// (a nested object's keys by their path, "rope_scaling.factor").
class JsonConfig {
 public:
  explicit JsonConfig(fs::path file)
      : file_(std::move(file)),
        j_(read_json_file(file_, {"config.json", 16 * kMiB, ExitCode::checkpoint})) {}
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool present(const char* key) const { return j_.contains(key); }  // null included
  // The object at `key`, nullopt when it is absent or null.
  std::optional<JsonConfig> object(const char* key) const {
    if (!has(key)) return std::nullopt;
    if (!j_[key].is_object()) fail(file_, name(key) + ": expected an object or null");
    return JsonConfig(file_, j_[key], name(key) + ".");
  }
  // A size of the model, bounded as the schema key it becomes (`forge_key`) is: the layout loops
  // over the layers and every implied shape is sized from these before the derived config is
  // checked, so a hostile value must stop here (n_layer 2^31 once ran out of memory).
  int64_t size(const char* key, const char* forge_key, std::optional<int64_t> fallback = {}) const {
    const ConfigKey* k = find_config_key(forge_key);
    FORGE_CHECK(k, "no schema key ", forge_key);
    return bounded(key, int64_t(k->range.hi), forge_key, fallback);
  }
  // The feed-forward width, whose bound is Forge's largest ffn_mult times the model's width.
  int64_t ffn_size(const char* key, int64_t d_model, std::optional<int64_t> fallback) const {
    const ConfigKey* k = find_config_key("model.ffn_mult");
    FORGE_CHECK(k, "no schema key model.ffn_mult");
    return bounded(key, int64_t(k->range.hi) * d_model, "model.ffn_mult * d_model", fallback);
  }
  double number(const char* key, std::optional<double> fallback = {}) const {
    if (!has(key)) return required(key, fallback);
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(file_, name(key) + ": expected a non-negative number, got " + v.dump());
    return v.get<double>();
  }
  // A number Forge divides by or takes a power of, which must be at least `min` (and above 0).
  double at_least(const char* key, double min, std::optional<double> fallback = {}) const {
    const double v = number(key, fallback);
    if (v < min || v == 0)
      fail(file_, name(key) + ": expected a number " +
                      (min > 0 ? ">= " + json(min).dump() : "> 0") + ", got " + json(v).dump());
    return v;
  }
  std::string text(const char* key, std::optional<std::string> fallback = {}) const {
    if (!has(key)) return required(key, fallback);
    if (!j_[key].is_string()) fail(file_, name(key) + ": expected a string");
    return j_[key].get<std::string>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) fail(file_, name(key) + ": expected true or false");
    return j_[key].get<bool>();
  }
  // A setting Forge's model has no counterpart for must keep the value Forge computes with.
  template <class T>
  void require_value(const char* key, const T& supported, const std::string& why) const {
    if (has(key) && j_[key] != json(supported))
      fail(file_, name(key) + " " + j_[key].dump() + " is not supported: " + why);
  }
  const fs::path& file() const { return file_; }
  std::string name(const char* key) const { return prefix_ + key; }

 private:
  JsonConfig(fs::path file, json j, std::string prefix)
      : file_(std::move(file)), j_(std::move(j)), prefix_(std::move(prefix)) {}
  template <class T>
  T required(const char* key, const std::optional<T>& fallback) const {
    if (!fallback) fail(file_, "missing key '" + name(key) + "'");
    return *fallback;
  }
  int64_t bounded(const char* key, int64_t hi, const char* as,
                  std::optional<int64_t> fallback) const {
    if (!has(key)) return required(key, fallback);
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<double>() < 1 || v.get<double>() > double(hi))
      fail(file_, detail::concat(name(key), ": expected a positive integer up to ", hi,
                                 " (Forge's ", as, "), got ", v.dump()));
    return v.get<int64_t>();
  }
  fs::path file_;
  json j_;
  std::string prefix_;
};

// The hub families config.json can name, by how their tokenizer and layout are found.
enum class Family { gpt2, bert, llama };

// The tokenizer a directory carries, by Forge's name for it: the directory itself when it holds
// Hugging Face's tokenizer.json, else SentencePiece's tokenizer.model (Llama 2's, Mistral's), else
// BERT's vocab.txt or GPT-2's vocab.json + merges.txt (Forge writes the latter for its byte
// tokenizer, for either family), make_tokenizer's order; the shipped gpt2 vocabulary for a GPT-2
// without its files but with its vocabulary size. A Llama with none of them gets ids 0-255 taken
// as bytes, so that the model loads, scores token files and fine-tunes on byte-level text
// (docs/interop.md). `note` says which, for inspect and validate.
std::string directory_tokenizer(const fs::path& dir, const JsonConfig& config, Family family,
                                int64_t vocab_size, std::string& note) {
  auto has = [&](const char* name) { return fs::is_regular_file(dir / name); };
  for (const char* file : {"tokenizer.json", "tokenizer.model", "vocab.txt"})
    if (has(file)) {
      note = std::string("the directory's ") + file;
      if (std::string_view(file) == "tokenizer.model") note += " (SentencePiece)";
      return dir.string();
    }
  if (has("vocab.json") && has("merges.txt")) {
    note = "the directory's vocab.json and merges.txt";
    return dir.string();
  }
  if (family == Family::gpt2 && vocab_size == 50257) {
    note = "the shipped gpt2 vocabulary";
    return "gpt2";
  }
  if (family == Family::llama && vocab_size >= 256) {
    note = "bytes: ids 0-255 stand for bytes, as the directory has no tokenizer files";
    return "bytes";
  }
  fail(config.file(), std::string("no tokenizer beside it (expected tokenizer.json, ") +
                          (family == Family::bert ? "vocab.txt, " : "") +
                          (family == Family::llama ? "tokenizer.model, " : "") +
                          "or vocab.json and merges.txt in " + quoted_path(dir.string()) +
                          (family == Family::llama ? "; vocab_size is too small for bytes)" : ")"));
}

std::string yaml_string(const std::string& s) { return json(s).dump(); }  // JSON strings are YAML

// What a directory holds, in Forge's terms.
struct HFModel {
  std::string model_type;
  std::string config_yaml;
  Layout layout;
  /// The shape config.json implies for each Forge tensor (glob over Forge's names -> shape).
  std::vector<std::pair<std::string, Shape>> shapes;
  std::string tokenizer_note;  // directory_tokenizer's
};

// Shapes of every tensor of a GPT-2 or BERT of vocabulary V, P positions, width C, feed-forward F
// and S segment types, by Forge's names.
std::vector<std::pair<std::string, Shape>> implied_shapes(int64_t V, int64_t P, int64_t C,
                                                          int64_t F, int64_t S) {
  // First match wins: the attention projection before the feed-forward's; "*" is every norm
  // and every bias of width C.
  return {{"tok_emb.weight", {V, C}}, {"pos_emb.weight", {P, C}}, {"seg_emb.weight", {S, C}},
          {"*.qkv.weight", {3 * C, C}}, {"*.qkv.bias", {3 * C}}, {"*.attn.proj.weight", {C, C}},
          {"*.fc.weight", {F, C}}, {"*.fc.bias", {F}}, {"*.proj.weight", {C, F}},
          {"lm_head.weight", {V, C}}, {"pooler.weight", {C, C}}, {"mlm.dense.weight", {C, C}},
          {"mlm.bias", {V}}, {"nsp.weight", {2, C}}, {"nsp.bias", {2}}, {"*", {C}}};
}

// The Llama family's shapes for vocabulary V, width C, H query heads and Hkv key/value heads of
// width D, and feed-forward F, by Forge's names ("*" is every RMSNorm weight).
std::vector<std::pair<std::string, Shape>> llama_shapes(int64_t V, int64_t C, int64_t H,
                                                        int64_t Hkv, int64_t D, int64_t F) {
  return {{"tok_emb.weight", {V, C}},
          {"lm_head.weight", {V, C}},
          {"*.attn.q.weight", {H * D, C}},
          {"*.attn.q.bias", {H * D}},
          {"*.attn.k.weight", {Hkv * D, C}},
          {"*.attn.k.bias", {Hkv * D}},
          {"*.attn.v.weight", {Hkv * D, C}},
          {"*.attn.v.bias", {Hkv * D}},
          {"*.attn.proj.weight", {C, H * D}},
          {"*.mlp.gate.weight", {F, C}},
          {"*.mlp.up.weight", {F, C}},
          {"*.mlp.proj.weight", {C, F}},
          {"*", {C}}};
}

// A directory's weights: model.safetensors, or the shards model.safetensors.index.json names
// (transformers' save_pretrained above its shard size). The index and the shards must agree
// exactly, since a reader trusts the index to find each tensor: every tensor it names is in the
// shard it names, and every tensor of a shard is named there, in that shard. All of it is checked
// from the headers before any tensor is read.
class Weights {
 public:
  explicit Weights(const fs::path& dir) {
    std::error_code ec;
    // model.safetensors wins when both are there, as in transformers; an entry that cannot be
    // followed is still that file, which the reader names.
    if (fs::exists(fs::symlink_status(dir / kWeightsFile, ec)) ||
        !fs::exists(fs::symlink_status(dir / kIndexFile, ec))) {
      files_.push_back(std::make_unique<SafetensorsFile>(dir / kWeightsFile));
      for (const SafetensorsEntry& e : files_[0]->entries()) where_[e.name] = files_[0].get();
      return;
    }
    open_shards(dir, dir / kIndexFile);
  }
  const SafetensorsEntry* find(const std::string& name) const {
    auto it = where_.find(name);
    return it == where_.end() ? nullptr : it->second->find(name);
  }
  // The file holding `name`, which find() found.
  const SafetensorsFile& file_of(const std::string& name) const { return *where_.at(name); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // Where errors about the weights as a whole point: model.safetensors or the index.
  const fs::path& path() const { return index_.empty() ? files_[0]->path() : index_; }

 private:
  void open_shards(const fs::path& dir, const fs::path& index) {
    index_ = index;
    const json j = read_json_file(index, {kIndexFile, 64 * kMiB, ExitCode::checkpoint});
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty())
      fail(index, "weight_map: expected an object naming each tensor's shard file");
    std::map<std::string, std::string> shard_of;
    std::map<std::string, const SafetensorsFile*> by_file;
    for (const auto& [name, file] : map->items()) {
      // A shard is a file of this directory: a path elsewhere is no part of the model.
      if (!file.is_string() || file.get<std::string>().empty() ||
          file.get<std::string>().find('/') != std::string::npos || file == "." || file == "..")
        fail(index, "weight_map." + name + ": expected the name of a file in the directory, got " +
                        file.dump());
      const std::string shard = file.get<std::string>();
      shard_of[name] = shard;
      if (by_file.count(shard)) continue;
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(dir / shard, ec)))
        fail(dir / shard,
             std::string("missing: ") + kIndexFile + " places tensor '" + name + "' in it");
      files_.push_back(std::make_unique<SafetensorsFile>(dir / shard));
      by_file[shard] = files_.back().get();
    }
    for (const auto& [name, shard] : shard_of) {
      const SafetensorsFile* f = by_file.at(shard);
      if (!f->find(name))
        fail(f->path(), "no tensor '" + name + "', which " + kIndexFile + " places in it");
      where_[name] = f;
    }
    for (const auto& f : files_)
      for (const SafetensorsEntry& e : f->entries()) {
        auto it = shard_of.find(e.name);
        if (it == shard_of.end())
          fail(f->path(), "tensor '" + e.name + "' is not named by " + kIndexFile);
        if (by_file.at(it->second) != f.get())
          fail(f->path(),
               "tensor '" + e.name + "' is placed in " + it->second + " by " + kIndexFile);
      }
  }
  fs::path index_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;  // tensor -> the file holding it
};

bool file_has(const Weights& w, const std::string& name) { return w.find(name) != nullptr; }

// transformers' LlamaConfig, MistralConfig and Qwen2Config as Forge's GPT options, with their
// defaults where a key is absent. What Forge's GPT cannot compute is refused naming the key:
// biases beyond q/k/v (Llama's attention_bias also biases o_proj), another activation, attention
// dropout, a sliding window shorter than the context, a rotary scaling other than linear or llama3.
void describe_llama(const fs::path& dir, const JsonConfig& c, const std::string& origin, HFModel& m,
                    std::ostream& y) {
  auto str = [](int64_t x) { return std::to_string(x); };
  const bool qwen2 = m.model_type == "qwen2";
  const int64_t d = c.size("hidden_size", "model.d_model");
  const int64_t layers = c.size("num_hidden_layers", "model.n_layers");
  const int64_t vocab = c.size("vocab_size", "model.vocab_size");
  const int64_t positions = c.size("max_position_embeddings", "model.context");
  const int64_t heads = c.size("num_attention_heads", "model.n_heads");
  const int64_t kv_heads = c.size("num_key_value_heads", "model.n_kv_heads", heads);
  if (heads % kv_heads != 0)
    fail(c.file(), "num_key_value_heads " + str(kv_heads) +
                       " does not divide num_attention_heads " + str(heads));
  if (!c.has("head_dim") && d % heads != 0)
    fail(c.file(), "num_attention_heads " + str(heads) + " does not divide hidden_size " + str(d) +
                       " (and no head_dim is given)");
  const int64_t head_dim = c.size("head_dim", "model.head_dim", d / heads);
  if (head_dim % 2 != 0)
    fail(c.file(), (c.has("head_dim") ? "head_dim " : "hidden_size / num_attention_heads ") +
                       str(head_dim) + " is odd: rotary positions turn pairs of dimensions");
  const int64_t ffn = c.size("intermediate_size", "model.ffn_hidden");
  const std::string act = c.text("hidden_act", "silu");
  if (act != "silu")
    fail(c.file(), "hidden_act '" + act + "' is not supported: Forge's SwiGLU gates with silu");
  if (const double p = c.number("attention_dropout", 0.0); p != 0)
    fail(c.file(), "attention_dropout " + json(p).dump() +
                       " is not supported: Forge's attention has no dropout");
  if (c.has("quantization_config"))
    fail(c.file(), "quantization_config: quantized weights are not supported (F32, BF16 or F16)");
  if (m.model_type == "llama") {
    c.require_value("attention_bias", false,
                    "it biases o_proj as well as q, k and v, and Forge's attention output has no "
                    "bias");
    c.require_value("mlp_bias", false, "Forge's SwiGLU has no biases");
  }
  // Mistral's default window (4096) applies when the key is absent; null means none. Qwen2 keeps
  // a sliding_window value even with use_sliding_window false, which then means nothing.
  if (m.model_type == "mistral") {
    const int64_t window =
        c.present("sliding_window")
            ? (c.has("sliding_window") ? c.size("sliding_window", "model.context") : positions)
            : 4096;
    if (window < positions)
      fail(c.file(), "sliding_window " + str(window) + " is smaller than max_position_embeddings " +
                         str(positions) + ": Forge's attention sees the whole context");
  }
  if (qwen2 && c.flag("use_sliding_window", false) && c.has("sliding_window") &&
      c.size("sliding_window", "model.context") < positions)
    fail(c.file(),
         "use_sliding_window true with a sliding_window smaller than "
         "max_position_embeddings is not supported: Forge's attention sees the whole "
         "context");
  std::ostringstream rope;
  if (std::optional<JsonConfig> r = c.object("rope_scaling")) {
    // transformers reads rope_type, or the older type.
    const char* key = r->has("rope_type") || !r->has("type") ? "rope_type" : "type";
    const std::string type = r->text(key);
    if (type == "linear" || type == "llama3") {
      rope << "\n  rope_scaling:\n    type: " << type
           << "\n    factor: " << number_text(r->at_least("factor", 1.0));
    } else if (type != "default") {
      fail(c.file(), r->name(key) + " '" + type + "' is not supported (linear, llama3 or none)");
    }
    if (type == "llama3") {
      const double low = r->at_least("low_freq_factor", 0),
                   high = r->at_least("high_freq_factor", 0);
      if (high <= low)
        fail(c.file(), r->name("high_freq_factor") + " " + json(high).dump() +
                           " must exceed low_freq_factor " + json(low).dump());
      rope << "\n    low_freq_factor: " << number_text(low)
           << "\n    high_freq_factor: " << number_text(high) << "\n    original_context: "
           << r->size("original_max_position_embeddings", "model.rope_scaling.original_context");
    }
  }
  const bool tied = c.flag("tie_word_embeddings", false);
  y << "recipe: gpt_pretrain\nmodel:\n  arch: gpt\n  vocab_size: " << vocab
    << "\n  context: " << positions << "\n  d_model: " << d << "\n  n_layers: " << layers
    << "\n  n_heads: " << heads << "\n  n_kv_heads: " << kv_heads << "\n  head_dim: " << head_dim
    << "\n  dropout: 0.0\n  bias: false\n  qkv_bias: " << (qwen2 ? "true" : "false")
    << "\n  fused_qkv: false\n  norm: rmsnorm\n  position: rotary\n  mlp: swiglu"
    << "\n  ffn_hidden: " << ffn << "\n  tie_embeddings: " << (tied ? "true" : "false")
    << "\n  rope_theta: " << number_text(c.at_least("rope_theta", 0, 10000.0)) << rope.str()
    << "\n  norm_eps: " << number_text(c.at_least("rms_norm_eps", 0, 1e-6))
    << "\ndata:\n  tokenizer: "
    << yaml_string(directory_tokenizer(dir, c, Family::llama, vocab, m.tokenizer_note))
    << "\n  train: " << origin << "\n";
  m.layout = llama_layout(layers, tied, qwen2);
  m.shapes = llama_shapes(vocab, d, heads, kv_heads, head_dim, ffn);
}

HFModel describe(const fs::path& dir, const Weights& weights) {
  JsonConfig c(dir / kConfigFile);
  HFModel m;
  m.model_type = c.text("model_type");
  // What the model was trained on is unknown here; data.train names where it came from (forge
  // eval of a directory takes the data to score with --data).
  const std::string origin = yaml_string(dir.string());
  std::ostringstream y;
  if (m.model_type == "gpt2") {
    const int64_t d = c.size("n_embd", "model.d_model");
    const int64_t layers = c.size("n_layer", "model.n_layers");
    const int64_t vocab = c.size("vocab_size", "model.vocab_size");
    const int64_t positions = c.size("n_positions", "model.context");
    const int64_t inner = c.ffn_size("n_inner", d, 4 * d);
    const std::string act = c.text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      fail(c.file(), "activation_function '" + act +
                         "' is not supported: Forge's GPT MLP uses the tanh GELU (gelu_new)");
    c.require_value("scale_attn_weights", true, "Forge scales attention by 1/sqrt(head size)");
    c.require_value("scale_attn_by_inverse_layer_idx", false,
                    "Forge's attention has no such scale");
    c.require_value("add_cross_attention", false, "Forge's GPT is decoder-only");
    const bool tied = c.flag("tie_word_embeddings", true);
    y << "recipe: gpt_pretrain\nmodel:\n  arch: gpt\n  vocab_size: " << vocab
      << "\n  context: " << positions << "\n  d_model: " << d << "\n  n_layers: " << layers
      << "\n  n_heads: " << c.size("n_head", "model.n_heads")
      << "\n  dropout: " << number_text(c.number("resid_pdrop", 0.0))
      << "\n  ffn_mult: " << number_text(double(inner) / double(d))
      << "\n  norm_eps: " << number_text(c.number("layer_norm_epsilon", 1e-5))
      << "\n  tie_embeddings: " << (tied ? "true" : "false") << "\ndata:\n  tokenizer: "
      << yaml_string(directory_tokenizer(dir, c, Family::gpt2, vocab, m.tokenizer_note))
      << "\n  train: " << origin << "\n";
    const std::string prefix = file_has(weights, "transformer.wte.weight") ? "transformer." : "";
    m.layout = gpt2_layout(layers, tied, prefix);
    m.shapes = implied_shapes(vocab, positions, d, inner, 0);
  } else if (m.model_type == "bert") {
    const int64_t d = c.size("hidden_size", "model.d_model");
    const int64_t layers = c.size("num_hidden_layers", "model.n_layers");
    const int64_t vocab = c.size("vocab_size", "model.vocab_size");
    const int64_t positions = c.size("max_position_embeddings", "model.context");
    const int64_t inner = c.ffn_size("intermediate_size", d, std::nullopt);
    const int64_t segments = c.size("type_vocab_size", "bert.type_vocab_size", 2);
    const std::string act = c.text("hidden_act", "gelu");
    if (act != "gelu")
      fail(c.file(), "hidden_act '" + act + "' is not supported: Forge's BERT uses the exact GELU");
    c.require_value("position_embedding_type", "absolute", "Forge's BERT has learned positions");
    y << "recipe: bert_pretrain\nmodel:\n  arch: bert\n  vocab_size: " << vocab
      << "\n  context: " << positions << "\n  d_model: " << d << "\n  n_layers: " << layers
      << "\n  n_heads: " << c.size("num_attention_heads", "model.n_heads")
      << "\n  dropout: " << number_text(c.number("hidden_dropout_prob", 0.1))
      << "\n  ffn_mult: " << number_text(double(inner) / double(d))
      << "\n  norm_eps: " << number_text(c.number("layer_norm_eps", 1e-12))
      << "\n  norm_placement: post\nbert:\n  type_vocab_size: " << segments
      << "\ndata:\n  tokenizer: "
      << yaml_string(directory_tokenizer(dir, c, Family::bert, 0, m.tokenizer_note))
      << "\n  special_tokens: [\"[PAD]\", \"[CLS]\", \"[SEP]\", \"[MASK]\"]\n  train: " << origin
      << "\n";
    const std::string prefix =
        file_has(weights, "bert.embeddings.word_embeddings.weight") ? "bert." : "";
    m.layout = bert_layout(layers, prefix, file_has(weights, prefix + "pooler.dense.weight"),
                           file_has(weights, "cls.predictions.bias"));
    m.shapes = implied_shapes(vocab, positions, d, inner, segments);
  } else if (m.model_type == "llama" || m.model_type == "mistral" || m.model_type == "qwen2") {
    describe_llama(dir, c, origin, m, y);
  } else {
    fail(c.file(), "model_type '" + m.model_type +
                       "' is not supported (gpt2, bert, llama, mistral or qwen2)");
  }
  m.config_yaml = y.str();
  return m;
}

// BERT checkpoints converted from TensorFlow name LayerNorm parameters gamma and beta.
std::string stored_name(const Weights& w, const std::string& name) {
  if (w.find(name)) return name;
  using Rename = std::pair<const char*, const char*>;
  for (auto [from, to] : {Rename{"LayerNorm.weight", "LayerNorm.gamma"},
                          Rename{"LayerNorm.bias", "LayerNorm.beta"}})
    if (name.size() > std::strlen(from) && name.ends_with(from)) {
      std::string old = name.substr(0, name.size() - std::strlen(from)) + to;
      if (w.find(old)) return old;
    }
  return name;
}

// The dtypes a hub model's weights may be stored in; each is converted to f32 as it is read.
bool readable_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "BF16" || dtype == "F16";
}

// An opened directory: its weights, what they map to, and each Forge tensor's spec (checked
// against the stored shapes and dtypes, so nothing later is sized from an inconsistent header).
struct OpenedDirectory {
  std::unique_ptr<Weights> weights;
  HFModel model;
  std::vector<TensorSpec> specs;  // in layout order
  std::map<std::string, const Mapped*> by_name;
  double stored_bytes = 0;       // of the tensors Forge reads, as stored
  std::set<std::string> dtypes;  // theirs
};

OpenedDirectory open_directory(const fs::path& dir) {
  OpenedDirectory o;
  o.weights = std::make_unique<Weights>(dir);
  o.model = describe(dir, *o.weights);
  const Weights& w = *o.weights;
  std::set<std::string> used;
  for (const Mapped& m : o.model.layout.tensors) {
    Shape shape;
    for (const Part& part : m.parts) {
      const std::string name = stored_name(w, part.name);
      const SafetensorsEntry* e = w.find(name);
      if (!e) fail(w.path(), "no tensor '" + part.name + "' (Forge's " + m.forge + ")");
      const fs::path& file = w.file_of(name).path();
      if (!readable_dtype(e->dtype))
        fail(file,
             "tensor '" + name + "' is " + e->dtype + ": Forge reads F32, BF16 or F16 weights");
      used.insert(name);
      o.stored_bytes += double(e->end - e->begin);
      o.dtypes.insert(e->dtype);
      Shape s = e->shape;
      if (part.transposed) {
        if (s.size() != 2) fail(file, "tensor '" + name + "' is not a matrix");
        std::swap(s[0], s[1]);
      }
      if (shape.empty()) {
        shape = s;
      } else if (s.size() != shape.size() || s.empty() ||
                 !std::equal(s.begin() + 1, s.end(), shape.begin() + 1)) {
        fail(file, "tensor '" + name + "' " + shape_str(e->shape) +
                       " does not stack with the others of Forge's " + m.forge);
      } else {
        shape[0] += s[0];
      }
    }
    // The config decides what Forge allocates; it must describe the tensors the file holds.
    auto implied = std::find_if(o.model.shapes.begin(), o.model.shapes.end(),
                                [&](const auto& s) { return glob_match(s.first, m.forge); });
    if (implied != o.model.shapes.end() && implied->second != shape)
      fail(w.file_of(stored_name(w, m.parts[0].name)).path(),
           "tensor '" + m.parts[0].name + "' makes Forge's " + m.forge + " " + shape_str(shape) +
               ", but config.json implies " + shape_str(implied->second));
    o.specs.push_back({m.forge, shape, DType::f32});
    o.by_name[m.forge] = &m;
  }
  for (const auto& f : w.files())
    for (const SafetensorsEntry& e : f->entries()) {
      if (used.count(e.name)) continue;
      if (!glob_match_any(o.model.layout.ignored, e.name))
        fail(f->path(), "tensor '" + e.name + "' is not part of a " + o.model.model_type +
                            " model Forge can build");
    }
  return o;
}

// A tensor of Forge's from its parts, converted to f32. A NaN or an infinity is refused here, as
// training refuses one after an update: nothing would show it before the model's outputs turn to
// NaN.
Tensor read_mapped(const Weights& w, const Mapped& m, const Shape& shape) {
  auto read = [&](const Part& part) {
    const std::string name = stored_name(w, part.name);
    const SafetensorsFile& f = w.file_of(name);
    Tensor t = f.read_f32(name);
    if (optim::first_nonfinite_param({{name, t}}))
      fail(f.path(), "tensor '" + name + "' holds a NaN or an infinity (non-finite weights are "
                                         "not loaded)");
    return t;
  };
  // One part as stored is the tensor itself: no second copy of a hub model's largest matrices.
  if (m.parts.size() == 1 && !m.parts[0].transposed) return read(m.parts[0]);
  Tensor out = empty(shape);
  float* dst = out.data<float>();
  for (const Part& part : m.parts) {
    Tensor t = read(part);
    const float* src = t.data<float>();
    const int64_t n = t.numel();
    if (part.transposed) {  // [in, out] -> [out, in]
      const int64_t rows = t.size(0), cols = t.size(1);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
    } else {
      std::copy(src, src + n, dst);
    }
    dst += n;
  }
  return out;
}

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= 1048576.0)
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
  else
    std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  return text;
}

}  // namespace

bool is_hf_directory(const fs::path& path) {
  std::error_code ec;
  // The directory's own entries, not what they lead to: a config.json that is a dangling link or a
  // symlink loop still makes this a model directory, whose reader then names the file and why.
  auto has = [&](const char* name) { return fs::exists(fs::symlink_status(path / name, ec)); };
  return fs::is_directory(path, ec) && has(kConfigFile) && (has(kWeightsFile) || has(kIndexFile));
}

ForeignLayout hf_model_layout() {
  ForeignLayout layout;
  layout.name = "Hugging Face directory";
  layout.detects = is_hf_directory;
  layout.read_info = read_hf_info;
  layout.load = load_hf_model;
  layout.verify = verify_hf_model;
  // A sharded model is its index and every shard: a shard rewritten in place changes the model
  // as much as a new index does.
  layout.weights_files = [](const fs::path& dir) {
    Weights weights(dir);
    std::vector<fs::path> files;
    if (weights.path() != weights.files()[0]->path()) files.push_back(weights.path());
    for (const auto& f : weights.files()) files.push_back(f->path());
    return files;
  };
  return layout;
}

CheckpointInfo read_hf_info(const fs::path& dir) {
  OpenedDirectory o = open_directory(dir);
  CheckpointInfo info;
  info.format_version = kCheckpointFormatVersion;
  info.forge_version = "none (a Hugging Face " + o.model.model_type + " directory)";
  info.config_yaml = o.model.config_yaml;
  info.model = o.specs;
  return info;
}

std::string hf_load_summary(const fs::path& dir) {
  OpenedDirectory o = open_directory(dir);
  double f32_bytes = 0;
  for (const TensorSpec& s : o.specs) f32_bytes += 4.0 * double(shape_numel(s.shape));
  std::string dtypes;
  for (const std::string& d : o.dtypes) dtypes += (dtypes.empty() ? "" : "+") + d;
  const size_t files = o.weights->files().size();
  return "weights " + dtypes + " in " + std::to_string(files) +
         (files == 1 ? " file, " : " files, ") + bytes_text(o.stored_bytes) + " stored, " +
         bytes_text(f32_bytes) + " as f32 once loaded; tokenizer " + o.model.tokenizer_note;
}

CheckpointData load_hf_model(const fs::path& dir, const std::vector<TensorSpec>& expected,
                             const LoadOptions& options) {
  OpenedDirectory o = open_directory(dir);
  const fs::path& file = o.weights->path();
  if (options.load_optim)
    fail(dir, "a Hugging Face model directory holds no optimizer state to resume from");
  std::map<std::string, const TensorSpec*> specs;
  for (const TensorSpec& s : o.specs) specs[s.name] = &s;
  std::set<std::string> wanted;
  for (const TensorSpec& e : expected) {
    auto it = specs.find(e.name);
    if (it == specs.end()) fail(file, "has no tensor for '" + e.name + "'");
    if (it->second->shape != e.shape || e.dtype != DType::f32)
      fail(file, "tensor '" + e.name + "' (Forge's name) is " + shape_str(it->second->shape) +
                     ", expected " + dtype_name(e.dtype) + " " + shape_str(e.shape));
    wanted.insert(e.name);
  }
  if (!options.model_subset)
    for (const TensorSpec& s : o.specs)
      if (!wanted.count(s.name)) fail(file, "unexpected tensor for '" + s.name + "'");
  CheckpointData data;
  data.config_yaml = o.model.config_yaml;
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorSpec& e = expected[i];
    Tensor t = read_mapped(*o.weights, *o.by_name.at(e.name), e.shape);
    if (options.take_model_tensor)
      options.take_model_tensor(i, std::move(t));
    else
      data.model.push_back({e.name, t});
  }
  return data;
}

void verify_hf_model(const fs::path& dir) {
  OpenedDirectory o = open_directory(dir);
  for (const TensorSpec& s : o.specs) read_mapped(*o.weights, *o.by_name.at(s.name), s.shape);
}

namespace {

// The layout a Forge model is written in, and the config.json transformers builds it from.
struct Export {
  Layout layout;
  json config;
  NamedTensors state;  // Forge's names
  RunConfig run;
};

void require_export(bool ok, const fs::path& file, const std::string& what) {
  if (!ok) throw Error(ExitCode::usage, file.string() + ": " + what);
}

// The hub class a GPT is written as: a rotary one as a Llama (a Qwen2 with q/k/v biases), any other
// as a GPT-2. Whatever the class has no setting for is refused, all of it in one line.
enum class HubClass { gpt2, llama };

HubClass hub_class(const fs::path& file, const ModelConfig& m, const std::string& format) {
  std::string lacks;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) lacks += (lacks.empty() ? "" : ", ") + what;
  };
  const nn::GPTConfig g = gpt_config(m);
  if (m.position != "rotary") {
    require_gpt2_layout(file, m, format);
    need(m.fused_qkv, "q, k and v projected apart (model.fused_qkv: false)");
    need(nn::kv_heads(g) == m.n_heads, "grouped-query attention");
    need(nn::head_dim(g) * m.n_heads == m.d_model, "a head_dim other than d_model / n_heads");
    require_export(lacks.empty(), file,
                   format + " writes GPT-2's attention (one c_attn, n_heads heads of d_model / "
                            "n_heads); this model has " + lacks);
    return HubClass::gpt2;
  }
  need(m.norm == "rmsnorm", m.norm);
  need(m.mlp == "swiglu", m.mlp + " MLP");
  need(!m.bias, "biases");
  need(m.moe_every == 0, "mixture-of-experts layers");
  require_export(lacks.empty(), file,
                 format + " writes a rotary GPT as Llama's architecture (rmsnorm, swiglu MLP, no "
                          "biases or q/k/v biases only); this model has " + lacks);
  return HubClass::llama;
}

// The token ids transformers' generate starts and stops at, for the first of each list the
// tokenizer has: Llama 3's, Llama 2's and Mistral's, then GPT-2's and Qwen2's end of text.
void set_special_ids(json& j, const RunConfig& c) {
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(c.data.tokenizer, c.data.special_tokens);
  auto first = [&](const char* key, std::initializer_list<const char*> tokens) {
    for (const char* token : tokens)
      if (auto id = tokenizer->special_id(token)) {
        j[key] = *id;
        return;
      }
  };
  first("bos_token_id", {"<|begin_of_text|>", "<s>", "<|endoftext|>"});
  first("eos_token_id", {"<|end_of_text|>", "</s>", "<|endoftext|>"});
}

// Forge's model.rope_scaling in transformers' form: linear as {type, factor}, which every version
// reads; llama3 as Llama 3.1's config.json spells it.
json rope_scaling_json(const ModelConfig& m) {
  if (m.rope_scaling == "linear") return {{"type", "linear"}, {"factor", m.rope_factor}};
  if (m.rope_scaling == "llama3")
    return {{"rope_type", "llama3"},
            {"factor", m.rope_factor},
            {"low_freq_factor", m.rope_low_freq_factor},
            {"high_freq_factor", m.rope_high_freq_factor},
            {"original_max_position_embeddings", m.rope_original_context}};
  return nullptr;
}

// LlamaConfig, or Qwen2Config for a model with q/k/v biases (Llama's attention_bias would put
// one on o_proj too).
json llama_config(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const nn::GPTConfig g = gpt_config(m);
  const bool qwen2 = m.qkv_bias;
  json j = {{"architectures", {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", qwen2 ? "qwen2" : "llama"},
            {"vocab_size", m.vocab_size},
            {"hidden_size", m.d_model},
            {"intermediate_size", nn::mlp_hidden_size(g)},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", nn::kv_heads(g)},
            {"head_dim", nn::head_dim(g)},
            {"hidden_act", "silu"},
            {"max_position_embeddings", m.context},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", m.rope_theta},
            {"rope_scaling", rope_scaling_json(m)},
            {"tie_word_embeddings", m.tie_embeddings},
            {"attention_dropout", 0.0},
            {"initializer_range", 0.02},
            {"use_cache", true}};
  if (qwen2) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = m.context;
    j["max_window_layers"] = m.n_layers;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  set_special_ids(j, c);
  return j;
}

json gpt2_config(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const int64_t inner = nn::mlp_hidden_size(gpt_config(m));
  json j = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", m.vocab_size},
            {"n_positions", m.context},
            {"n_ctx", m.context},
            {"n_embd", m.d_model},
            {"n_layer", m.n_layers},
            {"n_head", m.n_heads},
            {"n_inner", inner},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", m.norm_eps},
            {"resid_pdrop", m.dropout},
            {"embd_pdrop", m.dropout},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"tie_word_embeddings", m.tie_embeddings}};
  set_special_ids(j, c);
  return j;
}

json bert_hf_config(const RunConfig& c, const fs::path& file) {
  const ModelConfig& m = c.model;
  require_export(m.norm_placement == "post", file,
                 "only post-norm BERT models have a Hugging Face BERT layout");
  json j = {{"architectures", {"BertForPreTraining"}},
            {"model_type", "bert"},
            {"vocab_size", m.vocab_size},
            {"hidden_size", m.d_model},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"intermediate_size", std::llround(m.ffn_mult * double(m.d_model))},
            {"hidden_act", "gelu"},
            {"hidden_dropout_prob", m.dropout},
            {"attention_probs_dropout_prob", 0.0},
            {"max_position_embeddings", m.context},
            {"type_vocab_size", bert_settings(c).type_vocab_size},
            {"layer_norm_eps", m.norm_eps},
            {"initializer_range", 0.02},
            {"position_embedding_type", "absolute"}};
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(c.data.tokenizer, c.data.special_tokens);
  j["pad_token_id"] = tokenizer->special_id("[PAD]").value_or(0);
  return j;
}

// The model of a checkpoint with a LoRA run's adapters merged, in the layout transformers reads.
Export prepare_export(const fs::path& file) {
  require_language_model(file, "the Hugging Face export (a causal LM or BertForPreTraining) "
                               "cannot hold it");
  Export e;
  const ModelConfig stored = stored_config(file).model;
  if (stored.arch == "gpt") {
    const HubClass hub = hub_class(file, stored, "Hugging Face export");
    MergedGPT merged = load_merged_gpt(file);
    e.run = merged.config;
    const ModelConfig& m = e.run.model;
    if (hub == HubClass::llama) {
      e.config = llama_config(e.run);
      e.layout = llama_layout(m.n_layers, m.tie_embeddings, m.qkv_bias);
      e.state = m.fused_qkv ? nn::unfuse_qkv(merged.weights, gpt_config(m)) : merged.weights;
    } else {
      e.config = gpt2_config(e.run);
      e.layout = gpt2_layout(m.n_layers, m.tie_embeddings, "transformer.");
      e.state = merged.weights;
    }
  } else {
    LoadedBert loaded = load_bert(file);
    e.run = loaded.config;
    e.config = bert_hf_config(e.run, file);
    e.layout = bert_layout(e.run.model.n_layers, "bert.", true, true);
    e.state = loaded.model->named_state();
  }
  return e;
}

// A Forge tensor cut back into the HF tensors it was made of.
NamedTensors split_mapped(const Mapped& m, const Tensor& t) {
  NamedTensors out;
  const int64_t rows = t.size(0) / int64_t(m.parts.size());
  for (size_t k = 0; k < m.parts.size(); ++k) {
    Tensor piece = t.contiguous();
    Shape shape = t.shape();
    shape[0] = rows;
    Tensor part = empty(shape);
    const int64_t n = part.numel();
    std::copy(piece.data<float>() + int64_t(k) * n, piece.data<float>() + int64_t(k + 1) * n,
              part.data<float>());
    if (m.parts[k].transposed) {
      const int64_t r = shape[0], c = shape[1];
      Tensor tr = empty({c, r});
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) tr.data<float>()[j * r + i] = part.data<float>()[i * c + j];
      part = tr;
    }
    out.push_back({m.parts[k].name, part});
  }
  return out;
}

void write_json(const fs::path& file, const json& j) {
  write_file_atomic(file, j.dump(2) + "\n", ExitCode::checkpoint);
}

// The tokenizer's files under the names transformers reads. The byte tokenizer is written as a
// byte-level BPE without merges whose ids are the bytes (then the special tokens), which
// transformers' GPT2Tokenizer and Forge both read as the same tokenizer.
void copy_tokenizer(const RunConfig& c, const fs::path& out) {
  const std::string& name = c.data.tokenizer;
  if (name == "bytes") {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[gpt2_spelling(std::string(1, char(b)))] = b;
    for (size_t i = 0; i < c.data.special_tokens.size(); ++i)
      vocab[c.data.special_tokens[i]] = 256 + i;
    write_file_atomic(out / "vocab.json", vocab.dump() + "\n", ExitCode::checkpoint);
    write_file_atomic(out / "merges.txt", "#version: 0.2\n", ExitCode::checkpoint);
    return;
  }
  const bool model_file = fs::path(name).extension() == ".model" && !fs::is_directory(name);
  const fs::path dir = name == "gpt2"  ? shipped_tokenizer_dir("gpt2")
                       : model_file    ? fs::path(name).parent_path()
                                       : fs::path(name);
  auto copy = [&](const fs::path& from, const char* to) {
    write_file_atomic(out / to, read_input_file((dir / from).string(), kTokenizerInput),
                      ExitCode::checkpoint);
  };
  if (model_file) {
    // A SentencePiece model named by its file, with the tokenizer_config.json it was read with.
    copy(fs::path(name).filename(), "tokenizer.model");
    if (fs::exists(dir / "tokenizer_config.json"))
      copy("tokenizer_config.json", "tokenizer_config.json");
    return;
  }
  if (fs::exists(dir / "encoder.json")) {
    copy("encoder.json", "vocab.json");
    copy("vocab.bpe", "merges.txt");
  } else if (fs::exists(dir / "vocab.json")) {
    copy("vocab.json", "vocab.json");
    copy("merges.txt", "merges.txt");
  } else if (fs::exists(dir / "vocab.txt")) {
    copy("vocab.txt", "vocab.txt");
  }
  // A hub model's tokenizer, its settings and its generation defaults go along unchanged.
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "tokenizer.json",
                           "special_tokens_map.json", "generation_config.json"})
    if (fs::exists(dir / file)) copy(file, file);
}

void create_output_directory(const fs::path& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    throw Error(ExitCode::checkpoint,
                quoted_path(out.string()) + ": cannot create the output directory");
}

// config.json's torch_dtype for the type the weights are stored in.
const char* torch_dtype(StoredFloat type) {
  return type == StoredFloat::bf16 ? "bfloat16" : type == StoredFloat::f16 ? "float16" : "float32";
}

// The float type most of a hub directory's weights are stored in, by element count over every
// safetensors file it holds (shards included).
StoredFloat hub_weights_type(const fs::path& dir) {
  std::map<std::string, int64_t> elements;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") {
      const SafetensorsFile weights(entry.path());
      for (const SafetensorsEntry& e : weights.entries()) elements[e.dtype] += shape_numel(e.shape);
    }
  StoredFloat most = StoredFloat::f32;
  for (StoredFloat t : {StoredFloat::bf16, StoredFloat::f16})
    if (elements[stored_float_name(t)] > elements[stored_float_name(most)]) most = t;
  return most;
}

// How many model.init_from links export follows back to where a model came from.
constexpr int kMaxOriginLinks = 64;

// The float type a model came in: the weights' of the hub directory its chain of runs started
// from (through model.init_from, which is also a LoRA run's base), f32 for a model Forge
// initialised or whose origin is no longer there.
StoredFloat origin_type(const fs::path& checkpoint_file) {
  fs::path at = checkpoint_file;
  for (int link = 0; link < kMaxOriginLinks; ++link) {
    if (is_hf_directory(at)) return hub_weights_type(at);
    const std::string from = stored_config(at).model.init_from;
    std::error_code ec;
    if (from.empty() || !fs::exists(from, ec)) break;
    at = resolve_checkpoint(from);
  }
  return StoredFloat::f32;
}

// F16 holds magnitudes below 65520 (65504 at most, once rounded); a larger weight would be
// written as an infinity, which no reader of the export takes.
void require_f16_range(const fs::path& file, const NamedTensors& tensors) {
  for (const NamedTensor& t : tensors) {
    const std::vector<float> v = t.tensor.to_vector<float>();
    auto big = std::find_if(v.begin(), v.end(), [](float x) { return std::fabs(x) >= 65520.0f; });
    if (big != v.end())
      throw Error(ExitCode::usage,
                  detail::concat(file.string(), ": tensor '", t.name, "' holds ", *big,
                                 ", beyond F16's range (65504); export with --dtype bf16 or f32"));
  }
}

// PEFT's target_modules for a Llama: the short names PEFT itself writes ("q_proj", ...), which
// adapt that module in every layer, when the run adapted each such module it has; else the full
// paths, so that PEFT adapts exactly the modules the run did.
std::vector<std::string> llama_targets(const std::vector<std::string>& adapted,
                                       const Layout& layout) {
  auto short_name = [](const std::string& path) { return path.substr(path.rfind('.') + 1); };
  std::map<std::string, int64_t> in_model;
  for (const Mapped& m : layout.tensors)
    if (m.parts[0].name.ends_with(".weight"))
      ++in_model[short_name(m.parts[0].name.substr(0, m.parts[0].name.size() - 7))];
  std::vector<std::string> names;
  std::map<std::string, int64_t> count;
  for (const std::string& path : adapted)
    if (count[short_name(path)]++ == 0) names.push_back(short_name(path));
  for (const std::string& name : names)
    if (count[name] != in_model[name]) return adapted;
  return names;
}

}  // namespace

StoredFloat export_hf(const fs::path& checkpoint_file, const fs::path& out_dir,
                      std::optional<StoredFloat> stored) {
  Export e = prepare_export(checkpoint_file);
  const StoredFloat type = stored ? *stored : origin_type(checkpoint_file);
  std::map<std::string, Tensor> state;
  for (const NamedTensor& t : e.state) state[t.name] = t.tensor;
  NamedTensors tensors;
  for (const Mapped& m : e.layout.tensors) {
    NamedTensors parts = split_mapped(m, state.at(m.forge));
    tensors.insert(tensors.end(), parts.begin(), parts.end());
  }
  if (type == StoredFloat::f16) require_f16_range(checkpoint_file, tensors);
  e.config["torch_dtype"] = torch_dtype(type);
  create_output_directory(out_dir);
  write_safetensors(out_dir / kWeightsFile, tensors, {{"format", "pt"}}, ExitCode::checkpoint,
                    type);
  write_json(out_dir / kConfigFile, e.config);
  copy_tokenizer(e.run, out_dir);
  return type;
}

StoredFloat export_peft(const fs::path& checkpoint_file, const fs::path& out_dir,
                        std::optional<StoredFloat> stored) {
  require_language_model(checkpoint_file,
                         "PEFT adapters of a causal language model cannot hold it");
  CheckpointInfo info = read_checkpoint_info(checkpoint_file);
  require_export(info.references.count("model") != 0, checkpoint_file,
                 "holds no LoRA adapters; export its model with --format hf");
  // PEFT's names are those of the hub class the base is exported as.
  const HubClass hub = hub_class(checkpoint_file, stored_config(checkpoint_file).model,
                                 "PEFT export");
  // PEFT adapters stand beside an unchanged base; tensors the run also trained (train_also)
  // would need PEFT's modules_to_save, which this export does not write.
  for (const TensorSpec& s : info.main_model())
    require_export(glob_match("*.lora_A", s.name) || glob_match("*.lora_B", s.name),
                   checkpoint_file,
                   "the run also trained '" + s.name +
                       "', which PEFT adapters cannot hold; export the merged model with "
                       "--format hf instead");
  LoadedGPT loaded = load_gpt(checkpoint_file);
  const RunConfig& c = loaded.config;
  const nn::LoRAConfig lora = lora_settings(c);
  const bool llama = hub == HubClass::llama;
  const Layout layout =
      llama ? llama_layout(c.model.n_layers, c.model.tie_embeddings, c.model.qkv_bias)
            : gpt2_layout(c.model.n_layers, c.model.tie_embeddings, "transformer.");
  NamedTensors named = loaded.model->named_state();
  if (llama && c.model.fused_qkv) named = nn::unfuse_qkv(named, gpt_config(c.model));
  std::map<std::string, Tensor> state;
  for (const NamedTensor& t : named) state[t.name] = t.tensor;
  NamedTensors tensors;
  std::vector<std::string> modules;
  for (const Mapped& m : layout.tensors) {
    if (!m.forge.ends_with(".weight")) continue;
    const std::string module = m.forge.substr(0, m.forge.size() - 7);
    auto a = state.find(module + ".lora_A");
    if (a == state.end()) continue;
    const std::string hf = m.parts[0].name.substr(0, m.parts[0].name.size() - 7);
    modules.push_back(hf);
    tensors.push_back({"base_model.model." + hf + ".lora_A.weight", a->second});
    tensors.push_back({"base_model.model." + hf + ".lora_B.weight", state.at(module + ".lora_B")});
  }
  // Forge trains adapters in f32, and PEFT keeps them in f32 on a base of any dtype.
  const StoredFloat type = stored.value_or(StoredFloat::f32);
  if (type == StoredFloat::f16) require_f16_range(checkpoint_file, tensors);
  json config = {{"peft_type", "LORA"},
                 {"task_type", "CAUSAL_LM"},
                 {"base_model_name_or_path", info.references.at("model").path},
                 {"r", lora.rank},
                 {"lora_alpha", lora.alpha},
                 {"lora_dropout", lora.dropout},
                 {"use_rslora", lora.rslora},
                 {"target_modules", llama ? llama_targets(modules, layout) : modules},
                 // GPT-2's Conv1D keeps weights as [in, out]: PEFT transposes the update to match.
                 {"fan_in_fan_out", !llama},
                 {"bias", "none"},
                 {"modules_to_save", nullptr},
                 {"init_lora_weights", true},
                 {"inference_mode", true}};
  create_output_directory(out_dir);
  write_safetensors(out_dir / "adapter_model.safetensors", tensors, {{"format", "pt"}},
                    ExitCode::checkpoint, type);
  write_json(out_dir / "adapter_config.json", config);
  return type;
}

}  // namespace forge
