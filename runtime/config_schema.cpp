// The schema: the common keys (the one place their defaults, ranges and docs are written) and the
// recipe sections from the registry, the KeySpec builders both use, the index of names under each
// section, and the typed access to section values (RunConfig::get).
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "runtime/config_internal.h"
#include "runtime/registry.h"

namespace forge {
namespace {

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
}  // namespace

// ---- key specs ---------------------------------------------------------------------------------

KeySpec KeySpec::aka(std::vector<std::string> names) && {
  aliases = std::move(names);
  return std::move(*this);
}
KeySpec KeySpec::shown_as(std::string text) && {
  shown = std::move(text);
  return std::move(*this);
}
KeySpec KeySpec::fixes_architecture() && {
  architecture = true;
  return std::move(*this);
}
KeySpec KeySpec::inherits_keys(std::vector<std::string> keys) && {
  inherits = std::move(keys);
  return std::move(*this);
}

KeySpec integer_key(int64_t def, std::string range) {
  return {.type = ConfigType::integer, .def = def, .range = std::move(range)};
}
KeySpec number_key(double def, std::string range) {
  return {.type = ConfigType::number, .def = def, .range = std::move(range)};
}
KeySpec boolean_key(bool def) { return {.type = ConfigType::boolean, .def = def}; }
KeySpec string_key(std::string def) { return {.type = ConfigType::string, .def = std::move(def)}; }
KeySpec optional_path_key() { return {.type = ConfigType::path, .def = std::string()}; }
KeySpec required_path_key() {
  return {.type = ConfigType::path, .def = std::string(), .required = true};
}
KeySpec checkpoint_key() { return {.type = ConfigType::checkpoint, .def = std::string()}; }
KeySpec choice_key(std::string def, std::vector<std::string> choices) {
  bool required = def.empty();
  return {.type = ConfigType::choice,
          .def = std::move(def),
          .required = required,
          .choices = std::move(choices)};
}
KeySpec number_list_key(std::vector<double> def, std::string range) {
  size_t n = def.size();
  return {.type = ConfigType::number_list,
          .def = std::move(def),
          .range = std::move(range),
          .list_size = n};
}
KeySpec string_list_key(std::vector<std::string> def) {
  return {.type = ConfigType::string_list, .def = std::move(def)};
}
KeySpec integer_list_key(std::vector<int64_t> def, std::string range) {
  return {.type = ConfigType::integer_list, .def = std::move(def), .range = std::move(range)};
}

ConfigKey make_config_key(std::string path, KeySpec spec, std::string doc,
                          std::function<void(RunConfig&, const ConfigValue&)> set,
                          std::function<ConfigValue(const RunConfig&)> get) {
  return ConfigKey{std::move(path),       spec.type,        std::move(spec.def),
                   spec.required,         ConfigRange::parse(spec.range),
                   std::move(spec.choices), spec.list_size, std::move(spec.shown),
                   std::move(spec.aliases), std::move(doc), spec.architecture,
                   std::move(spec.inherits), std::move(set), std::move(get)};
}

ConfigKey section_key(std::string path, KeySpec spec, std::string doc) {
  auto set = [path](RunConfig& c, const ConfigValue& v) { c.sections[path] = v; };
  auto get = [path](const RunConfig& c) {
    auto it = c.sections.find(path);
    FORGE_CHECK(it != c.sections.end(), "config: no value for section key ", path);
    return it->second;
  };
  return make_config_key(std::move(path), std::move(spec), std::move(doc), set, get);
}

namespace {

// The common keys. Order here is the order of to_yaml() and of docs/config.md.
// Size bounds keep products such as batch_size * context * vocab_size and d_model^2 * n_layers
// within int64 (the parameter count and the estimate never overflow) while leaving GPT-2 XL and
// BERT-large sizes far inside them; docs/config.md lists them.
std::vector<ConfigKey> common_keys() {
  std::vector<ConfigKey> keys;
  auto add = [&](const char* path, KeySpec spec, Access access, const char* doc) {
    keys.push_back(make_config_key(path, std::move(spec), doc, std::move(access.set),
                                   std::move(access.get)));
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

  std::vector<std::string> recipes;
  for (const RecipeSpec& recipe : recipe_registry()) recipes.push_back(recipe.name);
  add("recipe", choice_key("", recipes), top(&R::recipe),
      "the recipe that trains this config");
  add("seed", integer_key(1337, ">= 0"), top(&R::seed),
      "seeds initialisation, dropout, data order and sampling");
  add("output_dir", string_key("").shown_as("runs/<config file stem>").aka({"out_dir", "run_dir"}),
      top(&R::output_dir), "run directory: resolved config, metrics, checkpoints, report");

  add("model.arch", choice_key("gpt", {"gpt", "bert"}).aka({"name", "type", "model_type"}).fixes_architecture(), in(model, &M::arch),
      "model family");
  add("model.vocab_size", integer_key(256, "[1, 16777216]").aka({"n_vocab", "vocab"}).fixes_architecture(), in(model, &M::vocab_size),
      "rows of the token embedding; at least the tokenizer's vocabulary");
  add("model.context", integer_key(128, "[1, 1048576]").aka({"block_size", "seq_len", "n_ctx", "max_seq_len"}).fixes_architecture(),
      in(model, &M::context),
      "tokens per training sequence and the longest sequence the model sees");
  add("model.d_model", integer_key(128, "[1, 65536]").aka({"n_embd", "hidden_size", "dim"}).fixes_architecture(),
      in(model, &M::d_model), "width of the residual stream");
  add("model.n_layers", integer_key(4, "[1, 1024]").aka({"n_layer", "num_layers", "depth"}).fixes_architecture(),
      in(model, &M::n_layers), "number of transformer blocks");
  add("model.n_heads", integer_key(4, "[1, 1024]").aka({"n_head", "num_heads"}).fixes_architecture(), in(model, &M::n_heads),
      "attention heads per block; must divide d_model unless model.head_dim is given");
  add("model.n_kv_heads", integer_key(0, "[0, 1024]").aka({"num_key_value_heads", "n_kv_head", "kv_heads"}).fixes_architecture(),
      in(model, &M::n_kv_heads),
      "key/value heads (grouped-query attention; 1 = multi-query); must divide n_heads; 0 = "
      "n_heads");
  add("model.head_dim", integer_key(0, "[0, 65536]").fixes_architecture(), in(model, &M::head_dim),
      "width of each attention head; 0 = d_model / n_heads");
  add("model.dropout", number_key(0.0, "[0, 1)"), in(model, &M::dropout),
      "dropout probability on the embeddings and on each residual branch");
  add("model.bias", boolean_key(true).fixes_architecture(), in(model, &M::bias), "linear and norm layers have a bias");
  add("model.qkv_bias", boolean_key(false).aka({"attention_bias"}).fixes_architecture(), in(model, &M::qkv_bias),
      "the q, k and v projections have a bias even with bias: false (Qwen2)");
  add("model.fused_qkv", boolean_key(true).fixes_architecture(), in(model, &M::fused_qkv),
      "project q, k and v with one matrix (attn.qkv, faster) or three (attn.q, attn.k, attn.v: "
      "the Llama family's layout, which LoRA can target one by one)");
  add("model.norm", choice_key("layernorm", {"layernorm", "rmsnorm"}).fixes_architecture(), in(model, &M::norm),
      "normalisation layer");
  add("model.position", choice_key("learned", {"learned", "rotary"}).aka({"pos_emb", "positional"}).fixes_architecture(),
      in(model, &M::position), "learned absolute position embedding or rotary (RoPE) in attention");
  add("model.mlp", choice_key("gelu", {"gelu", "swiglu"}).fixes_architecture(), in(model, &M::mlp),
      "feed-forward block: GELU MLP or gated SwiGLU");
  add("model.ffn_mult", number_key(4.0, "(0, 64]").aka({"mlp_ratio"}).fixes_architecture(), in(model, &M::ffn_mult),
      "feed-forward hidden width = ffn_mult * d_model (SwiGLU: 2/3 of that, rounded)");
  add("model.ffn_hidden", integer_key(0, "[0, 4194304]").aka({"intermediate_size", "ffn_dim", "d_ff"}).fixes_architecture(),
      in(model, &M::ffn_hidden), "feed-forward hidden width itself, overriding ffn_mult; 0 = unset");
  add("model.tie_embeddings", boolean_key(true).aka({"tie_weights"}).fixes_architecture(), in(model, &M::tie_embeddings),
      "the output head reuses the token embedding matrix");
  add("model.rope_theta", number_key(10000.0, "> 0").aka({"rope_base"}).fixes_architecture(), in(model, &M::rope_theta),
      "base of the rotary frequencies (position: rotary)");
  add("model.rope_scaling.type", choice_key("none", {"none", "linear", "llama3"}).aka({"rope_type"}).fixes_architecture(),
      in(model, &M::rope_scaling),
      "stretch rotary frequencies for long contexts: linear divides each by factor; llama3 (Llama "
      "3.1) divides the low ones, keeps the high ones and blends between");
  add("model.rope_scaling.factor", number_key(1.0, ">= 1").fixes_architecture(), in(model, &M::rope_factor),
      "how far rope_scaling stretches the context");
  add("model.rope_scaling.low_freq_factor", number_key(1.0, "> 0").fixes_architecture(),
      in(model, &M::rope_low_freq_factor),
      "llama3: wavelengths above original_context / low_freq_factor are divided by factor");
  add("model.rope_scaling.high_freq_factor", number_key(4.0, "> 0").fixes_architecture(),
      in(model, &M::rope_high_freq_factor),
      "llama3: wavelengths below original_context / high_freq_factor are kept");
  add("model.rope_scaling.original_context", integer_key(8192, "[1, 1048576]").aka({"original_max_position_embeddings"}).fixes_architecture(),
      in(model, &M::rope_original_context), "llama3: the context the model was pretrained on");
  add("model.norm_eps", number_key(1e-5, "> 0").aka({"layer_norm_eps", "eps"}).fixes_architecture(), in(model, &M::norm_eps),
      "epsilon added to the variance in normalisation layers");
  add("model.norm_placement", choice_key("auto", {"auto", "pre", "post"}).aka({"prenorm", "pre_norm"}).fixes_architecture(),
      in(model, &M::norm_placement),
      "pre: x + f(norm(x)); post: norm(x + f(x)) as in the original BERT; auto: gpt pre, bert post");
  add("model.init_from", checkpoint_key().aka({"init_checkpoint", "pretrained"}),
      in(model, &M::init_from),
      "start from this model's weights: a run directory, a checkpoint file or a Hugging Face "
      "model directory (used at step 0 only)");
  add("model.frozen_dtype", choice_key("fp32", {"fp32", "bf16"}).aka({"frozen_precision"}),
      in(model, &M::frozen_dtype),
      "bf16: keep the matrices and embedding tables of frozen models (a LoRA base, a reference, a "
      "teacher, a reward model) in bf16, half their memory; they multiply in bf16");

  add("model.moe.every", integer_key(0, "[0, 1024]").fixes_architecture(), in(model, &M::moe_every),
      "mixture of experts: every N-th block (blocks N-1, 2N-1, ...) holds an MoE feed-forward "
      "instead of the MLP; 0 = none (gpt only)");
  add("model.moe.n_experts", integer_key(8, "[1, 1024]").aka({"num_experts", "experts"}).fixes_architecture(),
      in(model, &M::moe_experts), "expert MLPs per MoE layer");
  add("model.moe.top_k", integer_key(2, "[1, 1024]").aka({"k", "num_experts_per_tok"}).fixes_architecture(),
      in(model, &M::moe_top_k), "experts each token is sent to");
  add("model.moe.ffn_mult", number_key(0.0, "[0, 64]").shown_as("model.ffn_mult").fixes_architecture(),
      in(model, &M::moe_ffn_mult),
      "each expert's hidden width = ffn_mult * d_model, as model.ffn_mult for the MLP; 0 = "
      "model.ffn_mult");
  add("model.moe.noisy", boolean_key(true).fixes_architecture(), in(model, &M::moe_noisy),
      "noisy top-k gating: Gaussian noise of learned scale softplus(x W_noise) on the router "
      "logits in training");
  add("model.moe.noise_eps", number_key(1e-2, ">= 0"), in(model, &M::moe_noise_eps),
      "added to the noise scale so it never vanishes (the paper's code uses 1e-2)");
  add("model.moe.capacity_factor", number_key(1.25, ">= 0"), in(model, &M::moe_capacity_factor),
      "training: an expert takes at most capacity_factor * tokens * top_k / n_experts "
      "assignments, the rest pass through the residual; 0 = no limit (evaluation and "
      "generation have none)");
  add("model.moe.balance", choice_key("cv2", {"cv2", "switch", "none"}).aka({"aux_loss", "balancing"}),
      in(model, &M::moe_balance),
      "load balancing: cv2 (Shazeer et al. 2017: w_importance CV(importance)^2 + w_load "
      "CV(load)^2), switch (Switch Transformer: w_switch n sum f_i P_i) or none");
  add("model.moe.w_importance", number_key(0.1, ">= 0"), in(model, &M::moe_w_importance),
      "cv2: weight of CV(importance)^2");
  add("model.moe.w_load", number_key(0.1, ">= 0"), in(model, &M::moe_w_load),
      "cv2: weight of CV(load)^2, load being the smooth estimator from the gating noise");
  add("model.moe.w_switch", number_key(0.01, ">= 0").aka({"aux_loss_coef", "router_aux_loss_coef"}),
      in(model, &M::moe_w_switch), "switch: weight of n sum_i f_i P_i");
  add("model.moe.w_z", number_key(0.0, ">= 0").aka({"z_loss", "router_z_loss_coef"}),
      in(model, &M::moe_w_z), "router z-loss weight (ST-MoE): mean(logsumexp(x W_g)^2); 0 = off");

  add("data.tokenizer", string_key("bytes").fixes_architecture(), in(data, &D::tokenizer),
      "how text becomes token ids: bytes (one token per byte, vocabulary 256), gpt2 (GPT-2's "
      "byte-level BPE, vocabulary 50257), a directory from `forge tokenizer train`, a hub "
      "model's directory, a tokenizer.json or a SentencePiece .model file");
  add("data.special_tokens", string_list_key().aka({"specials"}).fixes_architecture(), in(data, &D::special_tokens),
      "special tokens added after the tokenizer's vocabulary, e.g. [\"[PAD]\", \"[CLS]\", "
      "\"[SEP]\", \"[MASK]\"] for bert");
  add("data.chat_template", optional_path_key(), in(data, &D::chat_template),
      "a Jinja chat template (.jinja file) that renders {\"messages\"} conversations and `forge "
      "generate --chat`; empty = the chat_template of the tokenizer's (or model.init_from hub "
      "directory's) tokenizer_config.json");
  add("data.train", required_path_key().aka({"train_path", "train_file"}), in(data, &D::train),
      "training data: a text file, or a token dataset from `forge prepare` (a .h5 file or a shard "
      "directory), read from disk as training needs it");
  add("data.val", optional_path_key().aka({"val_path", "valid", "validation"}), in(data, &D::val),
      "validation text file or token dataset; empty = hold out val_fraction of data.train (the "
      "last documents of a dataset)");
  add("data.val_fraction", number_key(0.1, "[0, 1)"), in(data, &D::val_fraction),
      "share of data.train held out for validation when data.val is empty");
  add("data.split_seed", integer_key(0, ">= 0").shown_as("seed"), in(data, &D::split_seed),
      "which records val_fraction holds out of record files and JSONL (stratified by label); "
      "fix it to keep the held-out records when the seed changes");

  add("optimizer.name", choice_key("adamw", {"adamw", "sgd"}), in(opt, &O::name), "optimizer");
  add("optimizer.lr", number_key(1e-3, "> 0").aka({"learning_rate"}), in(opt, &O::lr),
      "peak learning rate (the schedule scales it)");
  add("optimizer.betas", number_list_key({0.9, 0.999}, "[0, 1)").aka({"beta"}), in(opt, &O::betas),
      "AdamW moment decay rates [beta1, beta2]");
  add("optimizer.eps", number_key(1e-8, "> 0"), in(opt, &O::eps), "AdamW denominator epsilon");
  add("optimizer.weight_decay", number_key(0.0, ">= 0").aka({"wd"}), in(opt, &O::weight_decay),
      "decoupled weight decay (AdamW) or L2 penalty (SGD)");
  add("optimizer.momentum", number_key(0.0, "[0, 1)"), in(opt, &O::momentum), "SGD momentum");
  add("optimizer.nesterov", boolean_key(false), in(opt, &O::nesterov),
      "SGD with Nesterov momentum (needs momentum > 0)");
  add("optimizer.layer_lr_decay", number_key(1.0, ">= 1").aka({"layer_decay", "llrd"}),
      in(opt, &O::layer_lr_decay),
      "discriminative fine-tuning: each block trains at 1/layer_lr_decay the lr of the block above "
      "it (ULMFiT: 2.6); 1 = off");
  add("optimizer.freeze", string_list_key().aka({"frozen"}), in(opt, &O::freeze),
      "glob patterns of parameter names that are not trained, e.g. [\"blocks.0.*\"]");
  add("optimizer.unfreeze_every", integer_key(0, ">= 0"), in(opt, &O::unfreeze_every),
      "gradual unfreezing: every N steps unfreeze the top-most frozen block; 0 = off");
  add("optimizer.decay_1d", boolean_key(false), in(opt, &O::decay_1d),
      "also apply weight decay to 1-D parameters (biases, norm weights)");

  add("schedule.name",
      choice_key("constant", {"constant", "warmup_cosine", "warmup_linear", "noam", "stlr"})
          .aka({"type", "scheduler"}),
      in(sched, &S::name), "learning-rate schedule");
  add("schedule.warmup_steps", integer_key(0, ">= 0").aka({"warmup", "warmup_iters"}),
      in(sched, &S::warmup_steps), "steps of linear warm-up from 0 to lr");
  add("schedule.min_lr", number_key(0.0, ">= 0").aka({"final_lr", "lr_min"}), in(sched, &S::min_lr),
      "learning rate at the end of warmup_cosine / warmup_linear decay");
  add("schedule.cut_frac", number_key(0.1, "(0, 1)"), in(sched, &S::cut_frac),
      "stlr: fraction of max_steps spent increasing the learning rate");
  add("schedule.ratio", number_key(32.0, ">= 1"), in(sched, &S::ratio),
      "stlr: how much smaller the lowest learning rate is than the peak");
  add("schedule.noam_d_model", integer_key(0, "[0, 65536]").shown_as("model.d_model"),
      in(sched, &S::noam_d_model),
      "noam: the d_model in lr * d_model^-0.5 * min(...); 0 = model.d_model");

  add("train.batch_size", integer_key(8, "[1, 65536]").aka({"bs", "micro_batch_size"}),
      in(train, &T::batch_size), "sequences per micro-batch");
  add("train.grad_accum", integer_key(1, "[1, 65536]").aka({"gradient_accumulation_steps", "accumulate"}),
      in(train, &T::grad_accum), "micro-batches accumulated into one optimizer step");
  add("train.max_steps", integer_key(1000, "[1, 1000000000000]").aka({"max_iters", "steps", "total_steps"}),
      in(train, &T::max_steps), "optimizer steps to train for");
  add("train.clip_grad_norm", number_key(1.0, ">= 0").aka({"grad_clip", "max_grad_norm"}),
      in(train, &T::clip_grad_norm), "clip the global gradient norm to this value; 0 = off");
  add("train.eval_every", integer_key(0, ">= 0").aka({"eval_interval"}), in(train, &T::eval_every),
      "evaluate on the validation split every N steps; 0 = off");
  add("train.eval_batches", integer_key(0, "[0, 1000000000]").aka({"eval_iters"}), in(train, &T::eval_batches),
      "batches per evaluation; 0 = the whole validation split");
  add("train.save_every", integer_key(0, ">= 0").aka({"save_interval", "checkpoint_every"}),
      in(train, &T::save_every), "write a checkpoint every N steps; 0 = only at the end");
  add("train.keep_last", integer_key(3, ">= 0"), in(train, &T::keep_last),
      "checkpoints kept in the run directory; older ones are deleted; 0 = keep all");
  add("train.log_every", integer_key(10, ">= 1").aka({"log_interval"}), in(train, &T::log_every),
      "write a train line to metrics.jsonl every N steps");
  add("train.activation_checkpointing", boolean_key(false).aka({"gradient_checkpointing"}),
      in(train, &T::activation_checkpointing),
      "recompute each block's activations in backward instead of storing them");
  add("train.precision",
      choice_key("fp32", {"fp32", "bf16", "auto"}).aka({"mixed_precision", "dtype"}),
      in(train, &T::precision),
      "matrix products in fp32, or in bf16 with f32 sums (weights, gradients and optimizer state "
      "stay fp32); auto: bf16 where the CPU multiplies bf16 natively (AVX512-BF16, AMX), else "
      "fp32");
  add("train.resume", choice_key("auto", {"auto", "never"}), in(train, &T::resume),
      "auto: continue from the run directory's latest checkpoint; never: start fresh");
  add("train.nan_policy", choice_key("abort", {"abort", "skip"}), in(train, &T::nan_policy),
      "on a non-finite loss or gradient: abort (exit 5) or skip the step");
  add("train.sample_every", integer_key(0, ">= 0"), in(train, &T::sample_every),
      "print a generated sample every N steps; 0 = off");
  add("train.sample_tokens", integer_key(200, "[1, 1048576]"), in(train, &T::sample_tokens),
      "tokens generated per sample");
  add("train.allreduce_bucket_mb", number_key(4.0, "(0, 1024]"), in(train, &T::allreduce_bucket_mb),
      "under mpirun: megabytes of gradients summed across ranks per all-reduce");
  add("train.allreduce_overlap", boolean_key(true), in(train, &T::allreduce_overlap),
      "under mpirun: start a bucket's all-reduce during backward, once its gradients are complete");
  add("train.shard_optimizer", boolean_key(false), in(train, &T::shard_optimizer),
      "under mpirun: each rank keeps AdamW's state of its slice of the parameters (ZeRO-1)");
  return keys;
}

}  // namespace

namespace config_detail {

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

std::string recipe_section_of(const std::string& path) {
  std::string top = path.substr(0, path.find('.'));
  for (const ConfigSection& section : config_sections())
    if (section.name == top) return top;
  return "";
}

bool recipe_reads(const RunConfig& config, const std::string& section) {
  for (const RecipeSpec& recipe : recipe_registry())
    if (recipe.name == config.recipe)
      return std::find(recipe.sections.begin(), recipe.sections.end(), section) !=
             recipe.sections.end();
  return false;
}

}  // namespace config_detail

// ---- public API --------------------------------------------------------------------------------

ConfigRange ConfigRange::parse(const std::string& text) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  ConfigRange r{-inf, inf, false, false, text};
  if (text.empty()) return r;
  auto number = [&](const std::string& s) {
    auto x = config_detail::parse_number(s);
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
  static const std::vector<ConfigKey> schema = [] {
    std::vector<ConfigKey> keys = common_keys();
    for (const ConfigSection& section : config_sections())
      for (const ConfigKey& key : section.keys) {
        FORGE_CHECK(key.path.rfind(section.name + ".", 0) == 0, "config schema: section key ",
                    key.path, " is not under '", section.name, "'");
        keys.push_back(key);
      }
    return keys;
  }();
  return schema;
}

const ConfigKey* find_config_key(const std::string& path) {
  const auto& by_path = config_detail::schema_index().by_path;
  auto it = by_path.find(path);
  return it == by_path.end() ? nullptr : it->second;
}

std::vector<std::string> config_input_paths(const RunConfig& config) {
  std::vector<std::string> paths;
  for (const ConfigKey& key : config_schema()) {
    if (key.type != ConfigType::path && key.type != ConfigType::checkpoint) continue;
    const ConfigValue value = key.get(config);
    if (const auto* text = std::get_if<std::string>(&value); text && !text->empty())
      paths.push_back(*text);
  }
  return paths;
}

RunConfig default_config() {
  RunConfig c;
  for (const ConfigKey& key : config_schema()) key.set(c, key.default_value);
  return c;
}

template <class T>
const T& RunConfig::get(const std::string& path) const {
  auto it = sections.find(path);
  if (it == sections.end())
    throw Error(ExitCode::internal, "config: no section key '" + path + "'");
  const T* value = std::get_if<T>(&it->second);
  if (!value)
    throw Error(ExitCode::internal, "config: section key '" + path + "' holds another type");
  return *value;
}

template const int64_t& RunConfig::get<int64_t>(const std::string&) const;
template const double& RunConfig::get<double>(const std::string&) const;
template const bool& RunConfig::get<bool>(const std::string&) const;
template const std::string& RunConfig::get<std::string>(const std::string&) const;
template const std::vector<double>& RunConfig::get<std::vector<double>>(const std::string&) const;
template const std::vector<std::string>& RunConfig::get<std::vector<std::string>>(
    const std::string&) const;
template const std::vector<int64_t>& RunConfig::get<std::vector<int64_t>>(const std::string&) const;

}  // namespace forge
