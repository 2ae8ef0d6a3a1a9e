// Config -> components. Kept apart from the recipes so every recipe builds its optimizer the same
// way and every command restores models the same way.
#include "runtime/components.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <sys/resource.h>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/durable_file.h"
#include "core/file_io.h"
#include "core/glob.h"
#include "core/kernels/isa.h"
#include "core/kernels/matmul.h"
#include "optim/groups.h"
#include "nn/lora.h"
#include "runtime/bert_config.h"
#include "runtime/checkpoint.h"
#include "runtime/lora_config.h"

namespace forge {

nn::GPTConfig gpt_config(const ModelConfig& m) {
  nn::GPTConfig g;
  g.vocab_size = m.vocab_size;
  g.context = m.context;
  g.d_model = m.d_model;
  g.n_layers = m.n_layers;
  g.n_heads = m.n_heads;
  g.n_kv_heads = m.n_kv_heads;
  g.head_dim = m.head_dim;
  g.dropout = m.dropout;
  g.bias = m.bias;
  g.qkv_bias = m.qkv_bias;
  g.fused_qkv = m.fused_qkv;
  g.norm = m.norm == "rmsnorm" ? nn::NormType::rmsnorm : nn::NormType::layernorm;
  g.position = m.position == "rotary" ? nn::PositionType::rotary : nn::PositionType::learned;
  g.mlp = m.mlp == "swiglu" ? nn::MLPType::swiglu : nn::MLPType::gelu;
  g.ffn_mult = m.ffn_mult;
  g.ffn_hidden = m.ffn_hidden;
  g.tie_embeddings = m.tie_embeddings;
  g.rope_theta = m.rope_theta;
  nn::RopeScaling& r = g.rope_scaling;
  r.type = m.rope_scaling == "linear"   ? nn::RopeScalingType::linear
           : m.rope_scaling == "llama3" ? nn::RopeScalingType::llama3
                                        : nn::RopeScalingType::none;
  r.factor = m.rope_factor;
  r.low_freq_factor = m.rope_low_freq_factor;
  r.high_freq_factor = m.rope_high_freq_factor;
  r.original_context = m.rope_original_context;
  g.norm_eps = m.norm_eps;
  nn::MoEConfig& e = g.moe;
  e.every = m.moe_every;
  e.n_experts = m.moe_experts;
  e.top_k = m.moe_top_k;
  e.ffn_mult = m.moe_ffn_mult > 0 ? m.moe_ffn_mult : m.ffn_mult;
  e.noisy = m.moe_noisy;
  e.noise_eps = m.moe_noise_eps;
  e.capacity_factor = m.moe_capacity_factor;
  e.balance = m.moe_balance == "switch" ? nn::MoEBalance::switch_loss
              : m.moe_balance == "none" ? nn::MoEBalance::none
                                        : nn::MoEBalance::cv2;
  e.w_importance = m.moe_w_importance;
  e.w_load = m.moe_w_load;
  e.w_switch = m.moe_w_switch;
  e.w_z = m.moe_w_z;
  return g;
}

nn::BertConfig bert_config(const RunConfig& config) {
  const ModelConfig& m = config.model;
  nn::BertConfig b;
  b.vocab_size = m.vocab_size;
  b.max_positions = m.context;
  b.type_vocab_size = bert_settings(config).type_vocab_size;
  b.d_model = m.d_model;
  b.n_layers = m.n_layers;
  b.n_heads = m.n_heads;
  b.d_ff = int64_t(std::llround(m.ffn_mult * double(m.d_model)));
  b.dropout = m.dropout;
  b.pre_norm = m.norm_placement == "pre";
  b.norm_eps = m.norm_eps;
  return b;
}

void check_model_family(ConfigChecker& checker) {
  const ModelConfig& m = checker.config().model;
  if (m.arch == "gpt")
    checker.cross({"model.norm_placement", "model.arch"}, m.norm_placement == "pre",
                  "model.norm_placement: gpt blocks are pre-norm, got '" + m.norm_placement + "'");
  if (m.arch == "bert") {
    auto bert_fixed = [&](const std::string& key, bool ok, const std::string& want) {
      checker.cross({key, "model.arch"}, ok, key + ": model.arch 'bert' needs " + want);
    };
    bert_fixed("model.position", m.position == "learned", "learned positions");
    bert_fixed("model.norm", m.norm == "layernorm", "layernorm");
    bert_fixed("model.mlp", m.mlp == "gelu", "the gelu feed-forward");
    bert_fixed("model.tie_embeddings", m.tie_embeddings,
               "tie_embeddings: true (the MLM decoder is the token embedding)");
    bert_fixed("model.bias", m.bias, "bias: true");
    bert_fixed("model.qkv_bias", !m.qkv_bias, "qkv_bias: false (bias covers it)");
    bert_fixed("model.fused_qkv", m.fused_qkv, "fused_qkv: true");
    bert_fixed("model.n_kv_heads", m.n_kv_heads == 0 || m.n_kv_heads == m.n_heads,
               "as many key/value heads as heads");
    bert_fixed("model.head_dim", m.head_dim == 0 || m.head_dim * m.n_heads == m.d_model,
               "head_dim = d_model / n_heads");
    bert_fixed("model.ffn_hidden", m.ffn_hidden == 0, "its width from model.ffn_mult");
    bert_fixed("model.rope_scaling.type", m.rope_scaling == "none", "no rotary scaling");
  }
}

MemoryEstimate estimate_memory(const RunConfig& c, int64_t parameters,
                               int64_t trainable_parameters, double logit_rows) {
  MemoryEstimate e;
  e.parameters = parameters;
  e.trainable_parameters = trainable_parameters;
  const nn::GPTConfig g = gpt_config(c.model);
  const double C = double(c.model.d_model), q = double(c.model.n_heads * nn::head_dim(g)),
               kv = double(nn::kv_heads(g) * nn::head_dim(g)), F = double(nn::mlp_hidden_size(g));
  // Values a block keeps for backward per token: its input, the two norms' outputs and the
  // residual sum (4 C); q, the attention output and the copy of it proj reads (3 q); k and v,
  // which grouped-query attention narrows (2 kv); the feed-forward's hidden values, two for GELU
  // (before and after) and four for SwiGLU (gate, up, silu(gate) and the product down reads).
  // A step of 6-block GPT-2- and Llama-shaped models allocates within 5% of it (GPT-2's 17 C once
  // was a flat 16 C, which left a Llama's GQA and wide SwiGLU a third short).
  const double per_token = 4 * C + 3 * q + 2 * kv + (g.mlp == nn::MLPType::swiglu ? 4 : 2) * F;
  double tokens = double(c.train.batch_size * c.model.context);
  double per_block = per_token * tokens * 4;
  e.activation_bytes = c.train.activation_checkpointing
                           ? double(c.model.n_layers) * tokens * double(c.model.d_model) * 4 +
                                 per_block
                           : double(c.model.n_layers) * per_block;
  e.logits_bytes = 2.0 * logit_rows * double(c.model.vocab_size) * 4;
  // Frozen weights take 2 bytes each under model.frozen_dtype bf16 (their norms and biases, a
  // sliver, stay f32).
  const double frozen_bytes = c.model.frozen_dtype == "bf16" ? 2.0 : 4.0;
  e.state_bytes = frozen_bytes * double(parameters - trainable_parameters) +
                  16.0 * double(trainable_parameters);
  return e;
}

void store_frozen(const RunConfig& config, nn::Module& frozen, nn::FrozenValues values) {
  if (config.model.frozen_dtype != "bf16") return;
  for (Tensor& p : frozen.parameters()) p.set_requires_grad(false);
  nn::keep_frozen_in_bf16(frozen, values);
}

RunPrecision resolve_precision(const TrainConfig& train) {
  const std::string onednn = kernels::onednn_description();
  if (train.precision == "fp32") return {MatmulPrecision::fp32, ""};
  if (kernels::bf16_native())
    return {MatmulPrecision::bf16,
            detail::concat("precision: bf16 matrix products with f32 sums, fp32 weights, gradients "
                           "and optimizer state (train.precision ", train.precision, "; ", onednn,
                           " multiplies bf16 natively)")};
  if (train.precision == "auto")
    return {MatmulPrecision::fp32,
            detail::concat("precision: fp32 (train.precision auto: ", onednn,
                           " has no bf16 matrix instructions)")};
  const char* emulate = std::getenv("FORGE_BF16_EMULATION");
  if (emulate && std::string(emulate) == "1")
    return {MatmulPrecision::bf16,
            detail::concat("precision: bf16, emulated (FORGE_BF16_EMULATION=1: ", onednn,
                           " has no bf16 matrix instructions, so f32 GEMMs of bf16-rounded "
                           "operands give bf16's numbers, slower than fp32)")};
  throw Error(ExitCode::usage,
              detail::concat("train.precision bf16: this CPU has no bf16 matrix instructions (",
                             onednn, "; bf16 needs AVX512-BF16 or AMX-BF16); use train.precision "
                             "fp32, or auto to take bf16 where it is native"));
}

double total_bytes(const MemoryEstimate& e) {
  return e.state_bytes + e.activation_bytes + e.logits_bytes;
}

MemoryEstimate sharded_optimizer_estimate(MemoryEstimate e, int64_t ranks) {
  if (ranks > 1)
    e.state_bytes -= 8.0 * double(e.trainable_parameters) * (1.0 - 1.0 / double(ranks));
  return e;
}

namespace {

constexpr InputKind kSystemFile{"system file", 1 << 20, ExitCode::internal};

// The value of `key` in /proc/meminfo ("MemAvailable:  123456 kB"), in bytes.
std::optional<double> meminfo(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string name; lines >> name;) {
    double kib = 0;
    lines >> kib;
    if (name == key + ":") return kib * 1024.0;
    lines.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::nullopt;
}

std::optional<std::string> read_if_present(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  return read_input_file(path, kSystemFile);
}

}  // namespace

std::optional<MemoryLimit> machine_memory() {
  std::optional<MemoryLimit> limit;
  if (auto text = read_if_present("/proc/meminfo")) {
    if (auto available = meminfo(*text, "MemAvailable"))
      limit = MemoryLimit{*available, "MemAvailable in /proc/meminfo"};
    else if (auto total = meminfo(*text, "MemTotal"))
      limit = MemoryLimit{*total, "MemTotal in /proc/meminfo"};
  }
  auto lower = [&limit](double bytes, std::string source) {
    if (!limit || bytes < limit->bytes) limit = MemoryLimit{bytes, std::move(source)};
  };
  // A container's limit: cgroup v2's, or v1's. "max" (no limit) does not parse as a number, and
  // v1's "no limit" is a number far beyond any machine's memory.
  for (const char* file :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"})
    if (auto text = read_if_present(file)) {
      char* end = nullptr;
      const double bytes = std::strtod(text->c_str(), &end);
      if (end != text->c_str()) lower(bytes, std::string("the cgroup limit ") + file);
    }
  // ulimit -v: past it every allocation fails, whatever the machine has.
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    lower(double(as.rlim_cur), "the address-space limit (ulimit -v)");
  return limit;
}

void check_memory(const MemoryEstimate& estimate, const std::optional<MemoryLimit>& limit,
                  bool ignore) {
  if (ignore || !limit || total_bytes(estimate) <= limit->bytes) return;
  char line[512];
  std::snprintf(line, sizeof line,
                "estimated peak training memory %.1f MiB exceeds %.1f MiB (%s); shrink the "
                "model or batch, or pass --ignore-memory-check to run anyway",
                total_bytes(estimate) / 1048576.0, limit->bytes / 1048576.0,
                limit->source.c_str());
  throw Error(ExitCode::usage, std::string("forge: config error: ") + line);
}

void check_generation_memory(const ModelConfig& model,
                             const std::vector<std::vector<int64_t>>& prompts,
                             const nn::SamplingOptions& sampling, const nn::BatchOptions& batch,
                             const std::optional<MemoryLimit>& limit, const std::string& who) {
  if (!limit) return;
  // The keys of a forge generate record with empty values; other callers keep at least as much.
  constexpr double kRecordBytes = 100;
  const double K = double(batch.num_samples), rows = double(prompts.size()) * K;
  double completions = 0;
  for (const std::vector<int64_t>& prompt : prompts)
    completions += K * (double(sizeof(nn::Completion) + sizeof(int64_t)) + kRecordBytes +
                        double(prompt.size()));
  auto gib = [](double bytes) { return bytes / double(1 << 30); };
  auto refuse = [&](const std::string& what, double bytes, const std::string& remedy) {
    char amounts[160];
    std::snprintf(amounts, sizeof amounts, " need at least %.1f GiB, more than the %.1f GiB ",
                  gib(bytes), gib(limit->bytes));
    throw Error(ExitCode::usage,
                who + ": " + what + amounts + "available (" + limit->source + "); " + remedy);
  };
  if (completions > limit->bytes)
    refuse(detail::concat(prompts.size(), " prompts x --num-samples ", batch.num_samples,
                          " completions"),
           completions, "lower --num-samples or split the prompts");
  const double batch_rows = std::min(double(batch.batch_size), rows);
  // The cache holds the key/value heads only: with grouped-query attention, fewer than the queries.
  const nn::GPTConfig g = gpt_config(model);
  const double kv_width = double(nn::kv_heads(g) * nn::head_dim(g));
  const double per_row =
      4.0 * (2.0 * double(model.n_layers) * kv_width * double(sampling.max_new_tokens) +
             double(model.vocab_size));
  if (sampling.max_new_tokens > 0 && completions + batch_rows * per_row > limit->bytes)
    refuse(detail::concat("--batch-size ", batch.batch_size, ": the completions and a batch of ",
                          int64_t(batch_rows), " rows (key-value cache and logits)"),
           completions + batch_rows * per_row, "lower --batch-size");
}

void print_eval(const std::string& checkpoint_file, int64_t step, const Metrics& metrics) {
  std::printf("checkpoint %s (step %lld)\n", checkpoint_file.c_str(), (long long)step);
  for (const Metric& metric : metrics)
    std::printf("val_%s %.6g\n", metric.key.c_str(), metric.value.as_double());
}

std::unique_ptr<optim::Optimizer> build_optimizer(
    const RunConfig& config, const NamedTensors& params,
    std::vector<std::pair<std::string, double>> lr_scale) {
  const OptimizerConfig& o = config.optimizer;
  optim::GroupSpec groups;
  groups.weight_decay = o.weight_decay;
  groups.decay_1d = o.decay_1d;
  groups.layer_lr_decay = o.layer_lr_decay;
  groups.freeze = o.freeze;
  groups.unfreeze_every = o.unfreeze_every;
  groups.lr_scale = std::move(lr_scale);
  optim::OptimizerSpec spec;
  spec.name = o.name;
  spec.beta1 = o.betas[0];
  spec.beta2 = o.betas[1];
  spec.eps = o.eps;
  spec.momentum = o.momentum;
  spec.nesterov = o.nesterov;
  return optim::make_optimizer(spec, optim::build_param_groups(params, groups));
}

std::vector<std::filesystem::path> checkpoint_inputs(const std::filesystem::path& given,
                                                     const std::filesystem::path& file) {
  std::vector<std::filesystem::path> inputs = {given, file};
  for (const auto& [name, reference] : read_checkpoint_info(file).references)
    inputs.push_back(reference.path);
  return inputs;
}

std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  // A path that exists but cannot be followed (a symlink loop, no permission) is named with why;
  // one that does not exist is said so below.
  if (ec && status.type() != std::filesystem::file_type::not_found)
    throw Error(ExitCode::checkpoint,
                quoted_path(path.string()) + ": cannot be read: " + ec.message());
  if (std::filesystem::is_regular_file(status) || foreign_layout(path)) return path;
  if (std::filesystem::is_directory(status)) {
    std::string warning;
    std::optional<std::filesystem::path> latest = latest_checkpoint(path, &warning);
    if (!warning.empty()) std::fprintf(stderr, "forge: warning: %s\n", printable(warning).c_str());
    if (latest) return *latest;
    throw Error(ExitCode::checkpoint, path.string() + ": no checkpoint in this run directory");
  }
  throw Error(ExitCode::checkpoint, path.string() + ": no such checkpoint file or run directory");
}

namespace {
// load_checkpoint's model tensors `wanted` copied into `targets` (index for index) as they are
// read: one tensor of the file at a time, never a second copy of the model.
CheckpointData read_into(const std::filesystem::path& file, const std::vector<TensorSpec>& wanted,
                         const NamedTensors& targets, LoadOptions options) {
  NoGradGuard no_grad;
  options.take_model_tensor = [&](size_t i, Tensor read) {
    Tensor target = targets[i].tensor;
    target.copy_(read);
    // Cached, the file's tensor would wait in its size, which the next tensor or training seldom
    // asks for: by the end a second copy of the model.
    read = Tensor();
    allocator::empty_cache();
  };
  return load_checkpoint(file, wanted, options);
}
}  // namespace

InitReport init_from_checkpoint(nn::Module& model, const std::filesystem::path& file,
                                const InitOptions& options) {
  auto renamed = [&](const std::string& name) {
    for (const auto& [from, to] : options.rename)
      if (name.rfind(from, 0) == 0) return to + name.substr(from.size());
    return name;
  };
  CheckpointInfo info = read_checkpoint_info(file);
  // The tensors of the source's auxiliary models (a distillation's cos_projection) are not part of
  // the model it holds.
  const std::vector<TensorSpec> source_model = info.main_model();
  std::map<std::string, const TensorSpec*> source;  // by target name
  InitReport report;
  for (const TensorSpec& spec : source_model) {
    std::string target = renamed(spec.name);
    if (!source.emplace(target, &spec).second)
      throw Error(ExitCode::checkpoint, detail::concat(file.string(), ": tensors '", spec.name,
                                                       "' and another both map to '", target, "'"));
  }
  NamedTensors state = model.named_state();
  std::vector<TensorSpec> wanted;  // source names, in the model's order
  NamedTensors targets;
  std::set<std::string> used;
  for (const NamedTensor& t : state) {
    auto it = source.find(t.name);
    if (it == source.end()) {
      if (!glob_match_any(options.allow_missing, t.name))
        throw Error(ExitCode::checkpoint,
                    detail::concat(file.string(), ": has no tensor for '", t.name,
                                   "' of the model being initialised"));
      report.missing.push_back(t.name);
      continue;
    }
    const TensorSpec& s = *it->second;
    // A frozen weight kept in bf16 (store_frozen) takes the file's f32 values rounded.
    const bool narrowed = s.dtype == DType::f32 && t.tensor.dtype() == DType::bf16;
    if (s.shape != t.tensor.shape() || (s.dtype != t.tensor.dtype() && !narrowed))
      throw Error(ExitCode::checkpoint,
                  detail::concat(file.string(), ": tensor '", s.name, "' is ", dtype_name(s.dtype),
                                 " ", shape_str(s.shape), " but '", t.name, "' of the model is ",
                                 dtype_name(t.tensor.dtype()), " ", shape_str(t.tensor.shape())));
    wanted.push_back(s);
    targets.push_back(t);
    used.insert(t.name);
  }
  for (const TensorSpec& spec : source_model) {  // in the file's order
    const std::string target = renamed(spec.name);
    if (used.count(target)) continue;
    if (!glob_match_any(options.allow_unexpected, target))
      throw Error(ExitCode::checkpoint,
                  detail::concat(file.string(), ": tensor '", spec.name,
                                 "' has no place in the model being initialised"));
    report.unexpected.push_back(spec.name);
  }
  LoadOptions load;
  load.load_optim = false;
  load.model_subset = true;
  read_into(file, wanted, targets, load);
  report.copied = int64_t(targets.size());
  return report;
}

void init_weights(nn::Module& model, const RunConfig& config) {
  if (config.model.init_from.empty()) return;
  init_from_checkpoint(model, resolve_checkpoint(config.model.init_from));
}

void init_weights(nn::GPT& model, const RunConfig& config) {
  if (config.model.init_from.empty()) return;
  load_initial_weights(model, resolve_checkpoint(config.model.init_from));
}

namespace {
RunConfig stored_config(const CheckpointInfo& info, const std::filesystem::path& file) {
  try {
    return load_config_string(info.config_yaml, file.string(), {}, ConfigFiles::skip);
  } catch (const Error& e) {
    // The user's command line is fine; it is the file that cannot be used.
    std::string first = e.what();
    throw Error(ExitCode::checkpoint, file.string() + ": the stored config does not load: " +
                                          first.substr(0, first.find('\n')));
  }
}

RunConfig stored_config_of(const CheckpointInfo& info, const std::filesystem::path& file,
                           const std::string& arch) {
  RunConfig config = stored_config(info, file);
  if (config.model.arch != arch)
    throw Error(ExitCode::checkpoint,
                detail::concat(file.string(), ": holds a ", config.model.arch,
                               " model; this command needs a ", arch, " checkpoint"));
  return config;
}

// Forge's task heads (nn/classifier.h: classifiers, reward models) all live under "head.".
void require_no_task_head(const CheckpointInfo& info, const std::filesystem::path& file,
                          const std::string& use) {
  for (const TensorSpec& t : info.main_model())
    if (glob_match("head.*", t.name)) {
      const RunConfig config = stored_config(info, file);
      throw Error(ExitCode::usage,
                  detail::concat(file.string(), ": the model of a ", config.recipe, " run, a ",
                                 config.model.arch, " with a task head ('", t.name, "'); ", use));
    }
}

constexpr const char* kNeedsLanguageModel = "this command takes a language model";

template <class Model, class Config>
LoadedModel<Model> load_model(const std::filesystem::path& file, const std::string& arch,
                              Config (*model_config)(const RunConfig&),
                              int64_t (*num_parameters)(const Config&)) {
  CheckpointInfo info = read_checkpoint_info(file);
  require_no_task_head(info, file, kNeedsLanguageModel);
  RunConfig config = stored_config_of(info, file, arch);
  // The stored config decides what gets allocated, so it must agree with the tensors the file
  // holds before the model is built: a config claiming a huge model costs nothing to write.
  if (int64_t expected = num_parameters(model_config(config)); expected != info.main_model_numel())
    throw Error(ExitCode::checkpoint,
                detail::concat(file.string(), ": its stored config describes ", expected,
                               " parameters but the file holds ", info.main_model_numel(),
                               " values of its model under /model"));
  std::unique_ptr<Model> model;
  {
    const SkipInitScope from_file;  // the file gives every value
    Generator gen(uint64_t(config.seed));
    model = std::make_unique<Model>(model_config(config), gen);
  }
  const NamedTensors state = model->named_state();
  LoadOptions options;
  options.load_optim = false;
  const CheckpointData data = read_into(file, specs_of(state), state, options);
  model->eval();
  return {config, std::move(model), data.step};
}

// An adapters-only checkpoint (a LoRA run): the base it references (whose digest must still
// match), adapters injected as in training, then the checkpoint's tensors on top.
LoadedGPT load_gpt_adapters(const std::filesystem::path& file, const CheckpointInfo& info) {
  RunConfig config = stored_config_of(info, file, "gpt");
  const ModelReference& base = info.references.at("model");
  if (const std::string digest = checkpoint_digest(base.path);
      digest != base.digest)
    throw Error(ExitCode::checkpoint,
                detail::concat(file.string(), ": its base model ", base.path,
                               " changed since the adapters were trained (digest ", base.digest,
                               ", now ", digest, ")"));
  Generator gen(uint64_t(config.seed));
  auto model = std::make_unique<nn::GPT>(gpt_config(config.model), gen);
  load_initial_weights(*model, base.path);
  Generator adapters(uint64_t(config.seed), rng_stream("lora"));
  nn::inject_lora(*model, lora_settings(config), adapters);
  InitOptions only_saved;
  only_saved.allow_missing = {"*"};
  init_from_checkpoint(*model, file, only_saved);
  model->eval();
  return {config, std::move(model), info.step};
}

}  // namespace

void require_language_model(const std::filesystem::path& file, const std::string& use) {
  require_no_task_head(read_checkpoint_info(file), file, use);
}

LoadedGPT load_gpt(const std::filesystem::path& file) {
  CheckpointInfo info = read_checkpoint_info(file);
  require_no_task_head(info, file, kNeedsLanguageModel);
  if (info.references.count("model")) return load_gpt_adapters(file, info);
  return load_model<nn::GPT>(
      file, "gpt", +[](const RunConfig& c) { return gpt_config(c.model); }, nn::gpt_num_parameters);
}

void require_gpt2_layout(const std::filesystem::path& file, const ModelConfig& m,
                         const std::string& format) {
  if (m.arch != "gpt")
    throw Error(ExitCode::usage, detail::concat(file.string(), ": holds a ", m.arch, " model; ",
                                                format, " writes GPT models only"));
  std::string unsupported;
  auto lacks = [&](bool ok, const std::string& what) {
    if (!ok) unsupported += (unsupported.empty() ? "" : ", ") + what;
  };
  lacks(m.norm == "layernorm", m.norm);
  lacks(m.position == "learned", m.position + " positions");
  lacks(m.mlp == "gelu", m.mlp + " MLP");
  lacks(m.bias, "no biases");
  lacks(m.moe_every == 0, "mixture-of-experts layers");
  if (!unsupported.empty())
    throw Error(ExitCode::usage, file.string() + ": " + format +
                                     " writes GPT-2's architecture (layernorm, learned positions, "
                                     "gelu MLP, biases); this model has " + unsupported);
}

RunConfig stored_config(const std::filesystem::path& file) {
  return stored_config(read_checkpoint_info(file), file);
}

MergedGPT load_merged_gpt(const std::filesystem::path& file) {
  LoadedGPT loaded = load_gpt(file);
  if (!read_checkpoint_info(file).references.count("model"))
    return {loaded.config, loaded.step, loaded.model->named_state()};
  nn::merge_lora(*loaded.model);
  MergedGPT merged{loaded.config, loaded.step, {}};
  for (const NamedTensor& t : loaded.model->named_state())
    if (!glob_match("*.lora_A", t.name) && !glob_match("*.lora_B", t.name))
      merged.weights.push_back(t);
  return merged;
}

void export_merged(const std::filesystem::path& file, const std::filesystem::path& output) {
  require_language_model(file, "--merge writes language models only");
  if (!read_checkpoint_info(file).references.count("model"))
    throw Error(ExitCode::usage, file.string() + ": holds no adapters; it is a plain checkpoint already");
  MergedGPT merged = load_merged_gpt(file);
  CheckpointData data;
  data.step = merged.step;
  merged.config.sections["lora.rank"] = int64_t{0};
  data.config_yaml = to_yaml(merged.config);
  data.model = merged.weights;
  save_checkpoint_file(output, data);
}

void load_initial_weights(nn::GPT& model, const std::filesystem::path& file,
                          const std::vector<std::string>& absent) {
  if (!read_checkpoint_info(file).references.count("model")) {
    InitOptions options;
    options.allow_missing = absent;
    init_from_checkpoint(model, file, options);
    return;
  }
  std::map<std::string, Tensor> merged;
  for (const NamedTensor& t : load_merged_gpt(file).weights) merged[t.name] = t.tensor;
  NoGradGuard no_grad;
  for (NamedTensor t : model.named_state()) {
    if (glob_match_any(absent, t.name)) continue;
    auto it = merged.find(t.name);
    if (it == merged.end() || it->second.shape() != t.tensor.shape())
      throw Error(ExitCode::checkpoint,
                  detail::concat(file.string(), ": the merged model has no tensor '", t.name,
                                 "' of shape ", shape_str(t.tensor.shape())));
    t.tensor.copy_(it->second);
  }
}

LoadedBert load_bert(const std::filesystem::path& file) {
  return load_model<nn::Bert>(file, "bert", bert_config, nn::bert_num_parameters);
}

}  // namespace forge
