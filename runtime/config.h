// The run config: YAML recipes and `key.path=value` overrides loaded into typed structs. One schema
// (config_schema.cpp for the common sections, each recipe file for its own section) knows every key
// with its type, default, range and doc; loading, overrides, printing the resolved config and
// docs/config.md all follow it, so a key exists in one place. Errors come back all at once as
// forge::Error(usage) with one `forge: config error:` line each.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace forge {

// The structs hold values only: a default-constructed struct is zeroed. The defaults live in the
// schema; default_config() and load_config() apply them. Choice-valued keys stay strings, checked
// against the schema's choices at load time.

struct ModelConfig {
  std::string arch;
  int64_t vocab_size{};
  int64_t context{};
  int64_t d_model{};
  int64_t n_layers{};
  int64_t n_heads{};
  int64_t n_kv_heads{};  // 0 = n_heads
  int64_t head_dim{};    // 0 = d_model / n_heads
  double dropout{};
  bool bias{};
  bool qkv_bias{};
  bool fused_qkv{};
  std::string norm;      // layernorm | rmsnorm
  std::string position;  // learned | rotary
  std::string mlp;       // gelu | swiglu
  double ffn_mult{};
  int64_t ffn_hidden{};  // 0 = from ffn_mult
  bool tie_embeddings{};
  double rope_theta{};
  // model.rope_scaling.* (nn::RopeScaling)
  std::string rope_scaling;  // none | linear | llama3
  double rope_factor{};
  double rope_low_freq_factor{};
  double rope_high_freq_factor{};
  int64_t rope_original_context{};
  double norm_eps{};
  std::string norm_placement;  // pre | post (resolved from "auto": gpt pre, bert post)
  std::string init_from;       // run directory or checkpoint file; empty = from scratch
  std::string frozen_dtype;    // fp32 | bf16: storage of weights a run does not train
  // model.moe.* (nn::MoEConfig): a mixture-of-experts feed-forward in every moe_every-th block
  int64_t moe_every{};
  int64_t moe_experts{};
  int64_t moe_top_k{};
  double moe_ffn_mult{};  // 0 = ffn_mult
  bool moe_noisy{};
  double moe_noise_eps{};
  double moe_capacity_factor{};
  std::string moe_balance;  // cv2 | switch | none
  double moe_w_importance{};
  double moe_w_load{};
  double moe_w_switch{};
  double moe_w_z{};
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string tokenizer;  // bytes | gpt2 | a tokenizer directory (make_tokenizer, data/tokenizer.h)
  std::vector<std::string> special_tokens;
  std::string chat_template;  // path of a .jinja file, empty = the tokenizer directory's
  std::string train;  // path, required
  std::string val;    // path, empty = split val_fraction off train
  double val_fraction{};
  int64_t split_seed{};  // resolved: seed when not given
  bool operator==(const DataConfig&) const = default;
};

struct OptimizerConfig {
  std::string name;  // adamw | sgd
  double lr{};
  std::array<double, 2> betas{};
  double eps{};
  double weight_decay{};
  double momentum{};
  bool nesterov{};
  double layer_lr_decay{};
  std::vector<std::string> freeze;  // glob patterns over parameter names
  int64_t unfreeze_every{};
  bool decay_1d{};
  bool operator==(const OptimizerConfig&) const = default;
};

struct ScheduleConfig {
  std::string name;  // constant | warmup_cosine | warmup_linear | noam | stlr
  int64_t warmup_steps{};
  double min_lr{};
  double cut_frac{};
  double ratio{};
  int64_t noam_d_model{};  // resolved: model.d_model when the file leaves it 0
  bool operator==(const ScheduleConfig&) const = default;
};

struct TrainConfig {
  int64_t batch_size{};
  int64_t grad_accum{};
  int64_t max_steps{};
  double clip_grad_norm{};
  int64_t eval_every{};
  int64_t eval_batches{};
  int64_t save_every{};
  int64_t keep_last{};
  int64_t log_every{};
  bool activation_checkpointing{};
  std::string resume;      // auto | never
  std::string nan_policy;  // abort | skip
  int64_t sample_every{};
  int64_t sample_tokens{};
  double allreduce_bucket_mb{};
  bool allreduce_overlap{};
  bool shard_optimizer{};
  std::string precision;  // fp32 | bf16 | auto
  bool operator==(const TrainConfig&) const = default;
};

/// A value of any config key (std::array<double, 2> fields travel as a 2-element vector).
using ConfigValue = std::variant<int64_t, double, bool, std::string, std::vector<double>,
                                 std::vector<std::string>, std::vector<int64_t>>;

struct RunConfig {
  std::string recipe;
  int64_t seed{};
  std::string output_dir;  // resolved: runs/<config file stem> when not given
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  /// Keys of the recipe sections (registry.h), by full dotted path ("bert.mask_prob"); every
  /// registered section's keys are present, with their defaults unless the config set them.
  std::map<std::string, ConfigValue> sections;
  bool operator==(const RunConfig&) const = default;

  /// The value of a section key. T is int64_t, double, bool, std::string, std::vector<double>,
  /// std::vector<std::string> or std::vector<int64_t> (section keys cannot be
  /// std::array<double, 2>: use a number list).
  /// Throws Error(internal) naming the path when it is absent or holds another type.
  template <class T>
  const T& get(const std::string& path) const;
};

/// What a key accepts. `path` is a string naming a file that must exist when non-empty;
/// `checkpoint` names a checkpoint file or a run directory whose latest checkpoint is meant.
enum class ConfigType {
  integer, number, boolean, string, path, checkpoint, choice, number_list, string_list, integer_list
};

/// A numeric interval written as in the docs: ">= 0", "> 0", "[0, 1)", "(0, 1]"; "" = any.
struct ConfigRange {
  double lo, hi;
  bool lo_open, hi_open;
  std::string text;
  static ConfigRange parse(const std::string& text);
  bool contains(double x) const;
};

/// One key of the schema. The tables (config_schema.cpp, the recipe files' sections) are the only
/// place defaults are written.
struct ConfigKey {
  std::string path;  ///< dotted, e.g. "optimizer.lr"
  ConfigType type;
  ConfigValue default_value;
  bool required;
  ConfigRange range;                 ///< numbers and the elements of number and integer lists
  std::vector<std::string> choices;  ///< choice keys
  size_t list_size;                  ///< number lists: exact length
  std::string shown_default;         ///< docs text when the default is derived ("" = the value)
  std::vector<std::string> aliases;  ///< names other tools use; only feed "did you mean"
  std::string doc;                   ///< one line
  bool architecture;                 ///< the weights fix it: model.init_from's checkpoint decides
  /// Checkpoint keys: keys of this run that the named model's stored config fixes (a teacher's
  /// vocabulary), taken from it when the config leaves them out; another value is a config error.
  std::vector<std::string> inherits;
  std::function<void(RunConfig&, const ConfigValue&)> set;
  std::function<ConfigValue(const RunConfig&)> get;
};

/// Every key, in the order to_yaml() prints them: the common keys (top-level keys, then one section
/// after another), then every recipe section's keys (config_sections() in registry.h).
const std::vector<ConfigKey>& config_schema();

/// The schema key with this dotted path, or nullptr.
const ConfigKey* find_config_key(const std::string& path);

/// Every file and model the config names: the values of its path and checkpoint keys that are
/// set (data, tokenizer, model.init_from, a teacher, a reward model, ...).
std::vector<std::string> config_input_paths(const RunConfig& config);

/// The schema defaults (required keys empty, derived keys unresolved).
RunConfig default_config();

/// Whether load checks that path and checkpoint keys exist and follows model.init_from (skip for a
/// config read from a checkpoint).
enum class ConfigFiles { check, skip };

/// Loads a YAML recipe, applies `key.path=value` overrides in order, fills defaults and derived
/// keys, and validates everything. Throws forge::Error(usage) listing every problem, one line each;
/// when there is none but a checkpoint key names no checkpoint (or its stored config is unusable),
/// throws Error(checkpoint). With model.init_from, the keys the weights fix come from the source
/// checkpoint's stored config; setting one to another value is a config error.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// As load_config on YAML text; `name` stands in for the file in error lines and output_dir.
RunConfig load_config_string(const std::string& text, const std::string& name,
                             const std::vector<std::string>& overrides = {},
                             ConfigFiles files = ConfigFiles::check);

/// The fully resolved config as YAML: every common key and the keys of the active recipe's own
/// sections, schema order, grouped by section. Round-trips through load_config_string.
std::string to_yaml(const RunConfig& config);

/// A value as YAML text ("0.001", "[0.9, 0.99]", "true", "\"*.bias\"").
std::string format_config_value(const ConfigValue& value);

/// The type as the docs name it ("integer", "list of 2 numbers").
std::string config_type_name(const ConfigKey& key);

/// The allowed values as the docs name them ("[0, 1)", "layernorm, rmsnorm"; "" = any).
std::string config_allowed_text(const ConfigKey& key);

/// The default as the docs show it ("required", "runs/<config file stem>", "0.001").
std::string config_default_text(const ConfigKey& key);

}  // namespace forge
