// Config loading: the schema table (the one place every key, default, range and doc is written),
// the YAML walk that checks a file against it, `key.path=value` overrides, derived defaults,
// cross-field checks, and the resolved-config printer. Problems are collected, not thrown one by
// one, so a user fixes a whole file in one round trip (DESIGN.md §1).
#include "recipes/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "data/tokenizer.h"

namespace forge {
namespace {

// ---- values <-> struct fields ------------------------------------------------------------------

template <class T>
ConfigValue to_value(const T& v) {
  return ConfigValue(v);
}
ConfigValue to_value(const std::array<double, 2>& v) {
  return std::vector<double>(v.begin(), v.end());
}

template <class T>
void from_value(const ConfigValue& v, T& out) {
  out = std::get<T>(v);
}
void from_value(const ConfigValue& v, std::array<double, 2>& out) {
  const auto& xs = std::get<std::vector<double>>(v);
  FORGE_CHECK(xs.size() == 2, "config: expected 2 numbers, got ", xs.size());
  out = {xs[0], xs[1]};
}

struct Access {
  std::function<void(RunConfig&, const ConfigValue&)> set;
  std::function<ConfigValue(const RunConfig&)> get;
};

template <class T>
Access top(T RunConfig::*field) {
  return {[field](RunConfig& c, const ConfigValue& v) { from_value(v, c.*field); },
          [field](const RunConfig& c) { return to_value(c.*field); }};
}

template <class S, class T>
Access in(S RunConfig::*section, T S::*field) {
  return {[=](RunConfig& c, const ConfigValue& v) { from_value(v, (c.*section).*field); },
          [=](const RunConfig& c) { return to_value((c.*section).*field); }};
}

// ---- schema builders ---------------------------------------------------------------------------

struct Spec {
  ConfigType type{};
  ConfigValue def{};
  bool required = false;
  std::string range{};
  std::vector<std::string> choices{};
  size_t list_size = 0;
  std::string shown{};
  std::vector<std::string> aliases{};
  Spec aka(std::vector<std::string> names) && {
    aliases = std::move(names);
    return std::move(*this);
  }
  Spec shown_as(std::string text) && {
    shown = std::move(text);
    return std::move(*this);
  }
};

Spec integer(int64_t def, std::string range) {
  return {.type = ConfigType::integer, .def = def, .range = std::move(range)};
}
Spec number(double def, std::string range) {
  return {.type = ConfigType::number, .def = def, .range = std::move(range)};
}
Spec boolean(bool def) { return {.type = ConfigType::boolean, .def = def}; }
Spec text(std::string def) { return {.type = ConfigType::string, .def = std::move(def)}; }
Spec optional_path() { return {.type = ConfigType::path, .def = std::string()}; }
Spec required_path() { return {.type = ConfigType::path, .def = std::string(), .required = true}; }
Spec choice(std::string def, std::vector<std::string> choices) {
  bool required = def.empty();
  return {.type = ConfigType::choice,
          .def = std::move(def),
          .required = required,
          .choices = std::move(choices)};
}
Spec numbers(std::vector<double> def, std::string range) {
  size_t n = def.size();
  return {.type = ConfigType::number_list,
          .def = std::move(def),
          .range = std::move(range),
          .list_size = n};
}
Spec strings() { return {.type = ConfigType::string_list, .def = std::vector<std::string>()}; }

// The schema. Order here is the order of to_yaml() and of docs/config.md.
std::vector<ConfigKey> build_schema() {
  std::vector<ConfigKey> keys;
  auto add = [&](const char* path, Spec spec, Access access, const char* doc) {
    keys.push_back(ConfigKey{path, spec.type, std::move(spec.def), spec.required,
                             ConfigRange::parse(spec.range), std::move(spec.choices),
                             spec.list_size, std::move(spec.shown), std::move(spec.aliases), doc,
                             std::move(access.set), std::move(access.get)});
  };
  using R = RunConfig;
  using M = ModelConfig;
  using D = DataConfig;
  using O = OptimizerConfig;
  using S = ScheduleConfig;
  using T = TrainConfig;
  auto model = &R::model;
  auto data = &R::data;
  auto opt = &R::optimizer;
  auto sched = &R::schedule;
  auto train = &R::train;

  add("recipe", choice("", {"gpt_pretrain", "bert_pretrain"}), top(&R::recipe),
      "the recipe that trains this config");
  add("seed", integer(1337, ">= 0"), top(&R::seed),
      "seeds initialisation, dropout, data order and sampling");
  add("output_dir", text("").shown_as("runs/<config file stem>").aka({"out_dir", "run_dir"}),
      top(&R::output_dir), "run directory: resolved config, metrics, checkpoints, report");

  add("model.arch", choice("gpt", {"gpt", "bert"}).aka({"name", "type", "model_type"}), in(model, &M::arch),
      "model family");
  add("model.vocab_size", integer(256, ">= 1").aka({"n_vocab", "vocab"}), in(model, &M::vocab_size),
      "rows of the token embedding; at least the tokenizer's vocabulary");
  add("model.context", integer(128, ">= 1").aka({"block_size", "seq_len", "n_ctx", "max_seq_len"}),
      in(model, &M::context),
      "tokens per training sequence and the longest sequence the model sees");
  add("model.d_model", integer(128, ">= 1").aka({"n_embd", "hidden_size", "dim"}),
      in(model, &M::d_model), "width of the residual stream");
  add("model.n_layers", integer(4, ">= 1").aka({"n_layer", "num_layers", "depth"}),
      in(model, &M::n_layers), "number of transformer blocks");
  add("model.n_heads", integer(4, ">= 1").aka({"n_head", "num_heads"}), in(model, &M::n_heads),
      "attention heads per block; must divide d_model");
  add("model.dropout", number(0.0, "[0, 1)"), in(model, &M::dropout),
      "dropout probability on the embeddings and on each residual branch");
  add("model.bias", boolean(true), in(model, &M::bias), "linear and norm layers have a bias");
  add("model.norm", choice("layernorm", {"layernorm", "rmsnorm"}), in(model, &M::norm),
      "normalisation layer");
  add("model.position", choice("learned", {"learned", "rotary"}).aka({"pos_emb", "positional"}),
      in(model, &M::position), "learned absolute position embedding or rotary (RoPE) in attention");
  add("model.mlp", choice("gelu", {"gelu", "swiglu"}), in(model, &M::mlp),
      "feed-forward block: GELU MLP or gated SwiGLU");
  add("model.ffn_mult", number(4.0, "> 0").aka({"mlp_ratio"}), in(model, &M::ffn_mult),
      "feed-forward hidden width = ffn_mult * d_model (SwiGLU: 2/3 of that, rounded)");
  add("model.tie_embeddings", boolean(true).aka({"tie_weights"}), in(model, &M::tie_embeddings),
      "the output head reuses the token embedding matrix");
  add("model.rope_theta", number(10000.0, "> 0").aka({"rope_base"}), in(model, &M::rope_theta),
      "base of the rotary frequencies (position: rotary)");
  add("model.norm_eps", number(1e-5, "> 0").aka({"layer_norm_eps", "eps"}), in(model, &M::norm_eps),
      "epsilon added to the variance in normalisation layers");
  add("model.norm_placement", choice("auto", {"auto", "pre", "post"}).aka({"prenorm", "pre_norm"}),
      in(model, &M::norm_placement),
      "pre: x + f(norm(x)); post: norm(x + f(x)) as in the original BERT; auto: gpt pre, bert post");
  add("model.type_vocab_size", integer(2, ">= 1").aka({"n_segments", "num_token_types"}),
      in(model, &M::type_vocab_size), "bert: number of segment (token-type) embeddings");

  add("data.tokenizer", text("bytes"), in(data, &D::tokenizer),
      "how text becomes token ids: bytes (one token per byte, vocabulary 256), gpt2 (GPT-2's "
      "byte-level BPE, vocabulary 50257) or a directory from `forge tokenizer train`");
  add("data.special_tokens", strings().aka({"specials"}), in(data, &D::special_tokens),
      "special tokens added after the tokenizer's vocabulary, e.g. [\"[PAD]\", \"[CLS]\", "
      "\"[SEP]\", \"[MASK]\"] for bert");
  add("data.train", required_path().aka({"train_path", "train_file"}), in(data, &D::train),
      "training data: a text file, or a token dataset (.h5) from `forge prepare`");
  add("data.val", optional_path().aka({"val_path", "valid", "validation"}), in(data, &D::val),
      "validation text file or token dataset; empty = hold out val_fraction of data.train (the "
      "last documents of a dataset)");
  add("data.val_fraction", number(0.1, "[0, 1)"), in(data, &D::val_fraction),
      "share of data.train held out for validation when data.val is empty");
  add("data.paragraphs_per_document", integer(1, ">= 1"), in(data, &D::paragraphs_per_document),
      "bert: consecutive blank-line paragraphs that form one document (lines are sentences)");
  add("data.sentence_breaks", boolean(false), in(data, &D::sentence_breaks),
      "bert: a sentence also ends after . ! or ? and a space (prose with a paragraph per line)");
  add("data.mask_prob", number(0.15, "(0, 1)").aka({"mlm_probability", "masking_prob"}),
      in(data, &D::mask_prob), "bert: share of non-special tokens chosen for masked-LM");
  add("data.eval_pairs", integer(2048, ">= 1"), in(data, &D::eval_pairs),
      "bert: sentence pairs of the validation documents scored by the final evaluation");

  add("optimizer.name", choice("adamw", {"adamw", "sgd"}), in(opt, &O::name), "optimizer");
  add("optimizer.lr", number(1e-3, "> 0").aka({"learning_rate"}), in(opt, &O::lr),
      "peak learning rate (the schedule scales it)");
  add("optimizer.betas", numbers({0.9, 0.999}, "[0, 1)").aka({"beta"}), in(opt, &O::betas),
      "AdamW moment decay rates [beta1, beta2]");
  add("optimizer.eps", number(1e-8, "> 0"), in(opt, &O::eps), "AdamW denominator epsilon");
  add("optimizer.weight_decay", number(0.0, ">= 0").aka({"wd"}), in(opt, &O::weight_decay),
      "decoupled weight decay (AdamW) or L2 penalty (SGD)");
  add("optimizer.momentum", number(0.0, "[0, 1)"), in(opt, &O::momentum), "SGD momentum");
  add("optimizer.nesterov", boolean(false), in(opt, &O::nesterov),
      "SGD with Nesterov momentum (needs momentum > 0)");
  add("optimizer.layer_lr_decay", number(1.0, "(0, 1]").aka({"layer_decay", "llrd"}),
      in(opt, &O::layer_lr_decay),
      "each block trains at layer_lr_decay times the lr of the block above it; 1 = off");
  add("optimizer.freeze", strings().aka({"frozen"}), in(opt, &O::freeze),
      "glob patterns of parameter names that are not trained, e.g. [\"blocks.0.*\"]");
  add("optimizer.unfreeze_every", integer(0, ">= 0"), in(opt, &O::unfreeze_every),
      "gradual unfreezing: every N steps unfreeze the top-most frozen block; 0 = off");
  add("optimizer.decay_1d", boolean(false), in(opt, &O::decay_1d),
      "also apply weight decay to 1-D parameters (biases, norm weights)");

  add("schedule.name",
      choice("constant", {"constant", "warmup_cosine", "warmup_linear", "noam", "stlr"})
          .aka({"type", "scheduler"}),
      in(sched, &S::name), "learning-rate schedule");
  add("schedule.warmup_steps", integer(0, ">= 0").aka({"warmup", "warmup_iters"}),
      in(sched, &S::warmup_steps), "steps of linear warm-up from 0 to lr");
  add("schedule.min_lr", number(0.0, ">= 0").aka({"final_lr", "lr_min"}), in(sched, &S::min_lr),
      "learning rate at the end of warmup_cosine / warmup_linear decay");
  add("schedule.cut_frac", number(0.1, "(0, 1)"), in(sched, &S::cut_frac),
      "stlr: fraction of max_steps spent increasing the learning rate");
  add("schedule.ratio", number(32.0, ">= 1"), in(sched, &S::ratio),
      "stlr: how much smaller the lowest learning rate is than the peak");
  add("schedule.noam_d_model", integer(0, ">= 0").shown_as("model.d_model"),
      in(sched, &S::noam_d_model),
      "noam: the d_model in lr * d_model^-0.5 * min(...); 0 = model.d_model");

  add("train.batch_size", integer(8, ">= 1").aka({"bs", "micro_batch_size"}),
      in(train, &T::batch_size), "sequences per micro-batch");
  add("train.grad_accum", integer(1, ">= 1").aka({"gradient_accumulation_steps", "accumulate"}),
      in(train, &T::grad_accum), "micro-batches accumulated into one optimizer step");
  add("train.max_steps", integer(1000, ">= 1").aka({"max_iters", "steps", "total_steps"}),
      in(train, &T::max_steps), "optimizer steps to train for");
  add("train.clip_grad_norm", number(1.0, ">= 0").aka({"grad_clip", "max_grad_norm"}),
      in(train, &T::clip_grad_norm), "clip the global gradient norm to this value; 0 = off");
  add("train.eval_every", integer(0, ">= 0").aka({"eval_interval"}), in(train, &T::eval_every),
      "evaluate on the validation split every N steps; 0 = off");
  add("train.eval_batches", integer(0, ">= 0").aka({"eval_iters"}), in(train, &T::eval_batches),
      "batches per evaluation; 0 = the whole validation split");
  add("train.save_every", integer(0, ">= 0").aka({"save_interval", "checkpoint_every"}),
      in(train, &T::save_every), "write a checkpoint every N steps; 0 = only at the end");
  add("train.keep_last", integer(3, ">= 0"), in(train, &T::keep_last),
      "checkpoints kept in the run directory; older ones are deleted; 0 = keep all");
  add("train.log_every", integer(10, ">= 1").aka({"log_interval"}), in(train, &T::log_every),
      "write a train line to metrics.jsonl every N steps");
  add("train.activation_checkpointing", boolean(false).aka({"gradient_checkpointing"}),
      in(train, &T::activation_checkpointing),
      "recompute each block's activations in backward instead of storing them");
  add("train.resume", choice("auto", {"auto", "never"}), in(train, &T::resume),
      "auto: continue from the run directory's latest checkpoint; never: start fresh");
  add("train.nan_policy", choice("abort", {"abort", "skip"}), in(train, &T::nan_policy),
      "on a non-finite loss or gradient: abort (exit 5) or skip the step");
  add("train.sample_every", integer(0, ">= 0"), in(train, &T::sample_every),
      "print a generated sample every N steps; 0 = off");
  add("train.sample_tokens", integer(200, ">= 1"), in(train, &T::sample_tokens),
      "tokens generated per sample");
  return keys;
}

// Which names live under each section prefix ("" = top level), in schema order.
struct SchemaIndex {
  std::map<std::string, std::vector<std::string>> children;
  std::map<std::string, const ConfigKey*> by_path;
};

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string parent_of(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string leaf_of(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

const SchemaIndex& schema_index() {
  static const SchemaIndex index = [] {
    SchemaIndex ix;
    for (const ConfigKey& key : config_schema()) {
      FORGE_CHECK(!ix.by_path.count(key.path), "config schema: duplicate key ", key.path);
      ix.by_path[key.path] = &key;
      std::string path = key.path;
      while (true) {
        std::string parent = parent_of(path);
        auto& names = ix.children[parent];
        if (std::find(names.begin(), names.end(), leaf_of(path)) == names.end())
          names.push_back(leaf_of(path));
        if (parent.empty()) break;
        path = parent;
      }
    }
    return ix;
  }();
  return index;
}

bool is_section(const std::string& path) {
  return !schema_index().by_path.count(path) && schema_index().children.count(path);
}

// ---- scalars ---------------------------------------------------------------------------------

bool is_integer_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

// YAML 1.2 core-schema floats without .inf/.nan: [-+]? (d+ [. d*] | . d+) [e [-+]? d+]
bool is_number_text(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == s.size();
}

std::optional<int64_t> parse_integer(const std::string& s) {
  if (!is_integer_text(s)) return std::nullopt;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(const std::string& s) {
  if (!is_number_text(s)) return std::nullopt;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  double v = 0;
  auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

// Shortest text that reads back as the same double, always with a '.' so that it reads as a
// float in YAML 1.1 readers too (PyYAML wants "1.0e-08", not "1e-08").
std::string format_number(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  FORGE_CHECK(ec == std::errc(), "config: cannot format ", x);
  std::string s(buf, end);
  if (s.find_first_of(".ni") != std::string::npos) return s;
  size_t e = s.find('e');
  if (e == std::string::npos) return s + ".0";
  return s.substr(0, e) + ".0" + s.substr(e);
}

// Plain YAML only for strings that cannot read back as anything else; everything else quoted.
std::string format_string(const std::string& s) {
  static const std::set<std::string> reserved = {
      "null",  "Null", "NULL", "~",   "true", "True", "TRUE", "false", "False",
      "FALSE", "yes",  "Yes",  "YES", "no",   "No",   "NO",   "on",    "On",
      "ON",    "off",  "Off",  "OFF", "y",    "n",    "Y",    "N"};
  bool plain = !s.empty() && s[0] != '-' && s[0] != '.' && !reserved.count(s) &&
               !is_number_text(s) && std::all_of(s.begin(), s.end(), [](char c) {
                 return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
                        c == '/' || c == '-';
               });
  if (plain) return s;
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
          out += hex;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

struct ValueFormatter {
  std::string operator()(int64_t v) const { return std::to_string(v); }
  std::string operator()(double v) const { return format_number(v); }
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(const std::string& v) const { return format_string(v); }
  std::string operator()(const std::vector<double>& v) const { return list(v, format_number); }
  std::string operator()(const std::vector<std::string>& v) const { return list(v, format_string); }
  template <class X, class F>
  static std::string list(const std::vector<X>& xs, F format) {
    std::string out = "[";
    for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + format(xs[i]);
    return out + "]";
  }
};

// ---- did you mean ----------------------------------------------------------------------------

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions ("rl" -> "lr").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// Close enough to be a typo: one edit for short names, up to three for long ones.
bool close_enough(const std::string& a, const std::string& b, size_t* distance) {
  size_t len = std::max(a.size(), b.size());
  size_t allowed = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  *distance = edit_distance(lower(a), lower(b));
  return *distance <= allowed;
}

// The closest of `candidates` to `name`, or "".
std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = 0;
    if (close_enough(name, c, &d) && d < best_d) best = c, best_d = d;
  }
  return best;
}

// Full path of the key the user probably meant by `name` under section `prefix`, or "". Looks at
// siblings (and their aliases) first, then the same name in another section.
std::string suggest_key(const std::string& prefix, const std::string& name) {
  const SchemaIndex& ix = schema_index();
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  auto consider = [&](const std::string& candidate, const std::string& path) {
    size_t d = 0;
    if (close_enough(name, candidate, &d) && d < best_d) best = path, best_d = d;
  };
  if (auto it = ix.children.find(prefix); it != ix.children.end()) {
    for (const auto& child : it->second) {
      std::string path = join(prefix, child);
      consider(child, path);
      if (auto k = ix.by_path.find(path); k != ix.by_path.end())
        for (const auto& alias : k->second->aliases) consider(alias, path);
    }
  }
  if (!best.empty()) return best;
  for (const ConfigKey& key : config_schema())
    if (lower(leaf_of(key.path)) == lower(name)) return key.path;
  for (const ConfigKey& key : config_schema())
    for (const auto& alias : key.aliases)
      if (alias == lower(name)) return key.path;
  std::string path = join(prefix, name);
  for (const ConfigKey& key : config_schema()) {
    size_t d = 0;
    if (close_enough(path, key.path, &d) && d < best_d) best = key.path, best_d = d;
  }
  return best;
}

// ---- the loader --------------------------------------------------------------------------------

// Where a value came from: a place in the file, an override, or just the file.
struct Where {
  enum Kind { mark, override_arg, file } kind = file;
  int line = 0, col = 0;  // 0-based, as yaml-cpp marks
  size_t index = 0;       // override position
  std::string override_text{};
};

Where at(const YAML::Mark& m) {
  return m.is_null() ? Where{} : Where{Where::mark, m.line, m.column};
}

std::string describe(const YAML::Node& node) {
  if (node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  if (node.Tag() == "!") return "the quoted string '" + node.Scalar() + "'";
  return "'" + node.Scalar() + "'";
}

class Loader {
 public:
  Loader(std::string name, ConfigFiles files)
      : name_(std::move(name)), files_(files), config_(default_config()) {}

  void load_text(const std::string& text) {
    YAML::Node doc;
    try {
      doc = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      error(at(e.mark), "YAML syntax error: " + e.msg);
      unreadable_ = true;
      return;
    }
    if (doc.IsNull()) return;
    if (!doc.IsMap()) {
      error(at(doc.Mark()),
            "expected a mapping of config keys at the top level, got " + describe(doc));
      unreadable_ = true;
      return;
    }
    walk(doc, "");
  }

  void apply_override(size_t index, const std::string& text) {
    Where where{Where::override_arg, 0, 0, index, text};
    size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      error(where, "expected key.path=value");
      return;
    }
    std::string path = text.substr(0, eq);
    const ConfigKey* key = find_config_key(path);
    if (!key) {
      if (is_section(path)) {
        error(where, "'" + path + "' is a section, not a key; set one of its keys, e.g. " +
                         join(path, schema_index().children.at(path).front()) + "=...");
      } else {
        std::string guess = suggest_key(parent_of(path), leaf_of(path));
        error(where, "unknown key '" + path + "'" +
                         (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
      }
      return;
    }
    YAML::Node node;
    try {
      node = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      error(where, path + ": value is not valid YAML: " + e.msg);
      return;
    }
    assign(*key, node, where);
  }

  RunConfig finish() {
    // A file that did not parse says nothing about its keys: no "missing key" noise after it.
    if (unreadable_) throw_problems();
    check_required();
    resolve_derived();
    if (files_ == ConfigFiles::check) check_files();
    check_cross_fields();
    if (!problems_.empty()) throw_problems();
    return config_;
  }

 private:
  struct Problem {
    Where where;
    size_t seq;
    std::string message;
  };

  void error(const Where& where, std::string message) {
    problems_.push_back({where, problems_.size(), std::move(message)});
  }

  // File positions first, in file order; then overrides in command-line order; then the rest.
  [[noreturn]] void throw_problems() {
    auto rank = [](const Problem& p) {
      return std::tuple(static_cast<int>(p.where.kind), p.where.line, p.where.col, p.where.index,
                        p.seq);
    };
    std::sort(problems_.begin(), problems_.end(),
              [&](const Problem& a, const Problem& b) { return rank(a) < rank(b); });
    std::string out;
    for (const Problem& p : problems_) {
      if (!out.empty()) out += '\n';
      out += "forge: config error: ";
      switch (p.where.kind) {
        case Where::mark:
          out += name_ + ":" + std::to_string(p.where.line + 1) + ":" +
                 std::to_string(p.where.col + 1);
          break;
        case Where::override_arg: out += "override '" + p.where.override_text + "'"; break;
        case Where::file: out += name_; break;
      }
      out += ": " + p.message;
    }
    throw Error(ExitCode::usage, out);
  }

  void walk(const YAML::Node& map, const std::string& prefix) {
    std::map<std::string, Where> seen;
    for (const auto& entry : map) {
      YAML::Node k = entry.first;  // copies are cheap handles
      YAML::Node v = entry.second;
      Where key_at = at(k.Mark());
      if (!k.IsScalar()) {
        error(key_at, "expected a key name, got " + describe(k));
        continue;
      }
      std::string name = k.Scalar();
      std::string path = join(prefix, name);
      if (auto dup = seen.find(name); dup != seen.end()) {
        error(key_at, "duplicate key '" + path + "' (first given at line " +
                          std::to_string(dup->second.line + 1) + ")");
        continue;
      }
      seen[name] = key_at;
      if (const ConfigKey* key = find_config_key(path)) {
        assign(*key, v, v.IsNull() ? key_at : at(v.Mark()));
      } else if (is_section(path)) {
        where_[path] = key_at;
        if (v.IsMap()) {
          walk(v, path);
        } else if (!v.IsNull()) {
          error(at(v.Mark()),
                "'" + path + "' is a section: expected a mapping of its keys, got " + describe(v));
        }
      } else {
        std::string guess = suggest_key(prefix, name);
        if (!guess.empty() && parent_of(guess) == prefix) guess = leaf_of(guess);
        error(key_at, "unknown key '" + path + "'" +
                          (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
      }
    }
  }

  // Converts, range-checks and stores one value; on failure reports it and marks the key bad so
  // that cross-field checks do not pile consequences on top.
  void assign(const ConfigKey& key, const YAML::Node& node, const Where& where) {
    where_[key.path] = where;
    std::optional<ConfigValue> value = convert(key, node, where);
    if (!value) {
      bad_.insert(key.path);
      return;
    }
    bad_.erase(key.path);
    key.set(config_, *value);
  }

  // Where an element of a list sits: its own mark in a file, the whole override otherwise.
  static Where element_at(const YAML::Node& elem, const Where& list) {
    return list.kind == Where::mark && !elem.Mark().is_null() ? at(elem.Mark()) : list;
  }

  std::optional<double> number_in_range(const ConfigKey& key, const std::string& label,
                                        const YAML::Node& node, const Where& where) {
    std::optional<double> x;
    if (node.IsScalar() && node.Tag() != "!") x = parse_number(node.Scalar());
    if (!x) {
      error(where, label + ": expected a number, got " + describe(node));
      return std::nullopt;
    }
    if (!key.range.contains(*x)) {
      range_error(key, label, node.Scalar(), where);
      return std::nullopt;
    }
    return x;
  }

  void range_error(const ConfigKey& key, const std::string& label, const std::string& got,
                   const Where& where) {
    const std::string& r = key.range.text;
    bool interval = r[0] == '[' || r[0] == '(';
    error(where, label + ": must be " + (interval ? "in " : "") + r + ", got " + got);
  }

  std::optional<ConfigValue> convert(const ConfigKey& key, const YAML::Node& node,
                                     const Where& where) {
    const std::string& label = key.path;
    bool plain_scalar = node.IsScalar() && node.Tag() != "!";
    switch (key.type) {
      case ConfigType::integer: {
        std::optional<int64_t> v;
        if (plain_scalar) v = parse_integer(node.Scalar());
        if (!v) {
          error(where, label + ": expected an integer, got " + describe(node));
          return std::nullopt;
        }
        if (!key.range.contains(static_cast<double>(*v))) {
          range_error(key, label, node.Scalar(), where);
          return std::nullopt;
        }
        return *v;
      }
      case ConfigType::number: {
        auto v = number_in_range(key, label, node, where);
        if (!v) return std::nullopt;
        return *v;
      }
      case ConfigType::boolean: {
        std::optional<bool> v;
        if (plain_scalar) v = parse_bool(node.Scalar());
        if (!v) {
          error(where, label + ": expected true or false, got " + describe(node));
          return std::nullopt;
        }
        return *v;
      }
      case ConfigType::string:
      case ConfigType::path:
      case ConfigType::choice: {
        if (!node.IsScalar()) {
          error(where, label + ": expected a string, got " + describe(node));
          return std::nullopt;
        }
        const std::string& s = node.Scalar();
        if (key.type == ConfigType::choice &&
            std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end()) {
          std::string guess = closest(s, key.choices);
          error(where, label + ": must be one of " + config_allowed_text(key) + "; got '" + s +
                           "'" + (guess.empty() ? "" : " (did you mean '" + guess + "'?)"));
          return std::nullopt;
        }
        if (key.required && s.empty()) {
          error(where, label + ": must not be empty");
          return std::nullopt;
        }
        return s;
      }
      case ConfigType::number_list: {
        std::string want = "a list of " + std::to_string(key.list_size) + " numbers";
        if (!node.IsSequence()) {
          error(where, label + ": expected " + want + ", got " + describe(node));
          return std::nullopt;
        }
        if (node.size() != key.list_size) {
          error(where, label + ": expected " + want + ", got " + std::to_string(node.size()));
          return std::nullopt;
        }
        std::vector<double> xs;
        for (size_t i = 0; i < node.size(); ++i) {
          auto x = number_in_range(key, label + "[" + std::to_string(i) + "]", node[i],
                                   element_at(node[i], where));
          if (x) xs.push_back(*x);
        }
        if (xs.size() != key.list_size) return std::nullopt;
        return xs;
      }
      case ConfigType::string_list: {
        if (!node.IsSequence()) {
          error(where, label + ": expected a list of strings, got " + describe(node));
          return std::nullopt;
        }
        std::vector<std::string> xs;
        bool ok = true;
        for (size_t i = 0; i < node.size(); ++i) {
          if (node[i].IsScalar()) {
            xs.push_back(node[i].Scalar());
          } else {
            error(element_at(node[i], where), label + "[" + std::to_string(i) +
                                                  "]: expected a string, got " + describe(node[i]));
            ok = false;
          }
        }
        if (!ok) return std::nullopt;
        return xs;
      }
    }
    return std::nullopt;
  }

  // The place to blame for a key the file never gives: its section's line, else the file.
  Where where_missing(const std::string& path) const {
    for (std::string p = parent_of(path); !p.empty(); p = parent_of(p))
      if (auto it = where_.find(p); it != where_.end()) return it->second;
    return Where{};
  }

  void check_required() {
    for (const ConfigKey& key : config_schema())
      if (key.required && !where_.count(key.path))
        error(where_missing(key.path), "missing required key '" + key.path + "'");
  }

  void resolve_derived() {
    if (config_.output_dir.empty())
      config_.output_dir = "runs/" + std::filesystem::path(name_).stem().string();
    if (config_.schedule.noam_d_model == 0) config_.schedule.noam_d_model = config_.model.d_model;
    if (config_.model.norm_placement == "auto")
      config_.model.norm_placement = config_.model.arch == "bert" ? "post" : "pre";
  }

  // Paths resolve against the working directory, as in every common training CLI (DESIGN.md §2).
  void check_files() {
    for (const ConfigKey& key : config_schema()) {
      if (key.type != ConfigType::path || bad_.count(key.path)) continue;
      std::string file = std::get<std::string>(key.get(config_));
      if (file.empty()) continue;
      std::error_code ec;
      auto status = std::filesystem::status(file, ec);
      if (!std::filesystem::exists(status))
        error(blame({key.path}), key.path + ": file not found: '" + file + "'");
      else if (std::filesystem::is_directory(status))
        error(blame({key.path}), key.path + ": '" + file + "' is a directory, expected a file");
    }
  }

  // The first of `keys` the file or an override set; else the file as a whole.
  Where blame(std::initializer_list<std::string> keys) const {
    for (const std::string& k : keys)
      if (auto it = where_.find(k); it != where_.end()) return it->second;
    return Where{};
  }

  // A rule across keys; skipped when one of them was already rejected on its own.
  void cross(std::initializer_list<std::string> keys, bool ok, const std::string& message) {
    if (ok) return;
    for (const std::string& k : keys)
      if (bad_.count(k)) return;
    error(blame(keys), message);
  }

  void check_cross_fields() {
    const RunConfig& c = config_;
    auto num = [](double x) { return format_number(x); };
    auto str = [](int64_t x) { return std::to_string(x); };
    cross({"model.n_heads", "model.d_model"}, c.model.d_model % c.model.n_heads == 0,
          "model.d_model (" + str(c.model.d_model) + ") must be divisible by model.n_heads (" +
              str(c.model.n_heads) + ")");
    if (c.model.d_model % c.model.n_heads == 0) {
      int64_t head_dim = c.model.d_model / c.model.n_heads;
      cross({"model.position", "model.d_model", "model.n_heads"},
            c.model.position != "rotary" || head_dim % 2 == 0,
            "model.position 'rotary' needs an even head dimension, got model.d_model / "
            "model.n_heads = " +
                str(head_dim));
    }
    if (std::optional<int64_t> tokenizer_vocab = tokenizer_vocab_size())
      cross({"model.vocab_size", "data.tokenizer", "data.special_tokens"},
            c.model.vocab_size >= *tokenizer_vocab,
            "model.vocab_size (" + str(c.model.vocab_size) + ") must be >= " +
                str(*tokenizer_vocab) + ", the vocabulary of tokenizer '" + c.data.tokenizer +
                "' with " + str(int64_t(c.data.special_tokens.size())) + " special tokens");
    check_architecture();
    cross({"schedule.warmup_steps", "train.max_steps"},
          c.schedule.warmup_steps <= c.train.max_steps,
          "schedule.warmup_steps (" + str(c.schedule.warmup_steps) +
              ") must be <= train.max_steps (" + str(c.train.max_steps) + ")");
    cross({"schedule.warmup_steps", "schedule.name"},
          c.schedule.name != "noam" || c.schedule.warmup_steps >= 1,
          "schedule.warmup_steps must be >= 1 for schedule 'noam'");
    cross({"schedule.min_lr", "optimizer.lr"}, c.schedule.min_lr <= c.optimizer.lr,
          "schedule.min_lr (" + num(c.schedule.min_lr) + ") must be <= optimizer.lr (" +
              num(c.optimizer.lr) + ")");
    cross({"optimizer.nesterov", "optimizer.name", "optimizer.momentum"},
          !c.optimizer.nesterov || (c.optimizer.name == "sgd" && c.optimizer.momentum > 0),
          "optimizer.nesterov needs optimizer.name 'sgd' and optimizer.momentum > 0");
    cross({"train.eval_every", "data.val", "data.val_fraction"},
          c.train.eval_every == 0 || !c.data.val.empty() || c.data.val_fraction > 0,
          "train.eval_every (" + str(c.train.eval_every) +
              ") needs a validation split: set data.val or data.val_fraction > 0");
  }

  // The tokenizer's vocabulary with data.special_tokens, or nullopt when it cannot be known here
  // (a directory while files are not checked) or data.tokenizer is wrong (reported as such).
  std::optional<int64_t> tokenizer_vocab_size() {
    const DataConfig& d = config_.data;
    if (bad_.count("data.tokenizer") || bad_.count("data.special_tokens")) return std::nullopt;
    if (d.tokenizer != "bytes" && d.tokenizer != "gpt2" && files_ == ConfigFiles::skip)
      return std::nullopt;
    if (d.tokenizer != "bytes" && d.tokenizer != "gpt2" &&
        !std::filesystem::is_directory(d.tokenizer)) {
      error(blame({"data.tokenizer"}),
            "data.tokenizer: '" + d.tokenizer +
                "' is not bytes, gpt2 or a directory with encoder.json and vocab.bpe");
      return std::nullopt;
    }
    try {
      return make_tokenizer(d.tokenizer, d.special_tokens)->vocab_size();
    } catch (const Error& e) {
      error(blame({"data.tokenizer"}), std::string("data.tokenizer: ") + e.what());
      return std::nullopt;
    }
  }

  // What each recipe's model family supports.
  void check_architecture() {
    const RunConfig& c = config_;
    const std::string& arch = c.model.arch;
    if (c.recipe == "gpt_pretrain" || c.recipe == "bert_pretrain") {
      std::string want = c.recipe == "gpt_pretrain" ? "gpt" : "bert";
      cross({"model.arch", "recipe"}, arch == want,
            "recipe " + c.recipe + " trains model.arch '" + want + "', the config says '" + arch +
                "'");
    }
    if (arch == "gpt")
      cross({"model.norm_placement", "model.arch"}, c.model.norm_placement == "pre",
            "model.norm_placement: gpt blocks are pre-norm, got '" + c.model.norm_placement + "'");
    if (arch == "bert") {
      auto bert_fixed = [&](const std::string& key, bool ok, const std::string& want) {
        cross({key, "model.arch"}, ok, key + ": model.arch 'bert' needs " + want);
      };
      bert_fixed("model.position", c.model.position == "learned", "learned positions");
      bert_fixed("model.norm", c.model.norm == "layernorm", "layernorm");
      bert_fixed("model.mlp", c.model.mlp == "gelu", "the gelu feed-forward");
      bert_fixed("model.tie_embeddings", c.model.tie_embeddings,
                 "tie_embeddings: true (the MLM decoder is the token embedding)");
      bert_fixed("model.bias", c.model.bias, "bias: true");
    }
    if (c.recipe == "bert_pretrain") {
      std::string missing;
      for (const char* token : {"[PAD]", "[CLS]", "[SEP]", "[MASK]"})
        if (std::find(c.data.special_tokens.begin(), c.data.special_tokens.end(), token) ==
            c.data.special_tokens.end())
          missing += std::string(missing.empty() ? "" : ", ") + token;
      cross({"data.special_tokens", "recipe"}, missing.empty(),
            "data.special_tokens: recipe bert_pretrain needs [PAD], [CLS], [SEP] and [MASK]; "
            "missing " + missing);
    }
  }

  std::string name_;
  ConfigFiles files_;
  RunConfig config_;
  std::map<std::string, Where> where_;  // keys and sections given by the file or an override
  std::set<std::string> bad_;           // keys whose given value was rejected
  std::vector<Problem> problems_;
  bool unreadable_ = false;
};

}  // namespace

// ---- public API --------------------------------------------------------------------------------

ConfigRange ConfigRange::parse(const std::string& text) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  ConfigRange r{-inf, inf, false, false, text};
  if (text.empty()) return r;
  auto number = [&](const std::string& s) {
    auto x = parse_number(s);
    FORGE_CHECK(x, "config schema: bad range '", text, "'");
    return *x;
  };
  if (text.rfind(">= ", 0) == 0) {
    r.lo = number(text.substr(3));
  } else if (text.rfind("> ", 0) == 0) {
    r.lo = number(text.substr(2));
    r.lo_open = true;
  } else {
    size_t comma = text.find(", ");
    FORGE_CHECK((text.front() == '[' || text.front() == '(') &&
                    (text.back() == ']' || text.back() == ')') && comma != std::string::npos,
                "config schema: bad range '", text, "'");
    r.lo = number(text.substr(1, comma - 1));
    r.hi = number(text.substr(comma + 2, text.size() - comma - 3));
    r.lo_open = text.front() == '(';
    r.hi_open = text.back() == ')';
  }
  return r;
}

bool ConfigRange::contains(double x) const {
  return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> schema = build_schema();
  return schema;
}

const ConfigKey* find_config_key(const std::string& path) {
  const auto& by_path = schema_index().by_path;
  auto it = by_path.find(path);
  return it == by_path.end() ? nullptr : it->second;
}

RunConfig default_config() {
  RunConfig c;
  for (const ConfigKey& key : config_schema()) key.set(c, key.default_value);
  return c;
}

RunConfig load_config_string(const std::string& text, const std::string& name,
                             const std::vector<std::string>& overrides, ConfigFiles files) {
  Loader loader(name, files);
  loader.load_text(text);
  for (size_t i = 0; i < overrides.size(); ++i) loader.apply_override(i, overrides[i]);
  return loader.finish();
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  auto fail = [&](const std::string& what) {
    return Error(ExitCode::usage, "forge: config error: " + path + ": " + what);
  };
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw fail("file not found");
  if (std::filesystem::is_directory(status)) throw fail("is a directory, expected a YAML file");
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw fail("cannot read the file");
  std::ostringstream text;
  text << in.rdbuf();
  return load_config_string(text.str(), path, overrides, ConfigFiles::check);
}

std::string format_config_value(const ConfigValue& value) {
  return std::visit(ValueFormatter{}, value);
}

std::string to_yaml(const RunConfig& config) {
  const SchemaIndex& ix = schema_index();
  std::string out;
  auto emit = [&](auto& self, const std::string& prefix, int depth) -> void {
    for (const auto& name : ix.children.at(prefix)) {
      std::string path = join(prefix, name);
      std::string indent(static_cast<size_t>(2 * depth), ' ');
      if (const ConfigKey* key = find_config_key(path)) {
        out += indent + name + ": " + format_config_value(key->get(config)) + "\n";
      } else {
        out += indent + name + ":\n";
        self(self, path, depth + 1);
      }
    }
  };
  emit(emit, "", 0);
  return out;
}

std::string config_type_name(const ConfigKey& key) {
  switch (key.type) {
    case ConfigType::integer: return "integer";
    case ConfigType::number: return "number";
    case ConfigType::boolean: return "bool";
    case ConfigType::string: return "string";
    case ConfigType::path: return "path";
    case ConfigType::choice: return "choice";
    case ConfigType::number_list: return "list of " + std::to_string(key.list_size) + " numbers";
    case ConfigType::string_list: return "list of strings";
  }
  return "";
}

std::string config_allowed_text(const ConfigKey& key) {
  if (key.type != ConfigType::choice) return key.range.text;
  std::string out;
  for (const auto& c : key.choices) out += (out.empty() ? "" : ", ") + c;
  return out;
}

std::string config_default_text(const ConfigKey& key) {
  if (key.required) return "required";
  if (!key.shown_default.empty()) return key.shown_default;
  return format_config_value(key.default_value);
}

}  // namespace forge
