// Building shared pieces from a config: the model config structs nn understands and the rules of
// each model family, optimizer groups from parameter names, the memory estimate of `forge
// validate`, and models restored from checkpoints (for generate, eval, inspect).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/linalg.h"
#include "nn/bert.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "nn/lora.h"
#include "optim/optimizer.h"
#include "runtime/config.h"
#include "runtime/metrics.h"
#include "runtime/registry.h"

namespace forge {

nn::GPTConfig gpt_config(const ModelConfig& model);
/// Reads bert.type_vocab_size besides `model`.
nn::BertConfig bert_config(const RunConfig& config);

/// What a model family supports, for the check of every recipe that trains it: gpt blocks are
/// pre-norm; bert needs learned positions, layernorm, the gelu feed-forward, biases and tied
/// embeddings.
void check_model_family(ConfigChecker& checker);

/// Rough peak of a training step in f32: the weights (4 bytes a parameter, 2 for a frozen one
/// under model.frozen_dtype bf16), the gradient and AdamW moments of the trainable ones (12
/// bytes), the activations each block keeps for backward (from its width, query and key/value
/// heads and feed-forward; one block's worth with checkpointing) and the logits of `logit_rows`
/// rows with their gradient.
MemoryEstimate estimate_memory(const RunConfig& config, int64_t parameters,
                               int64_t trainable_parameters, double logit_rows);

/// What train.precision means on this machine: the matmul precision of the run and the line the
/// run starts with saying so and why (none for fp32, the default: a failing run's stderr stays its
/// one error line). `bf16` on a CPU without bf16 matrix instructions is refused
/// (Error(usage) naming the instructions it needs), unless FORGE_BF16_EMULATION=1 asks for its
/// numbers from f32 GEMMs of bf16-rounded operands (for testing the bf16 path anywhere: slower
/// than fp32).
struct RunPrecision {
  MatmulPrecision matmul = MatmulPrecision::fp32;
  std::string line;
};
RunPrecision resolve_precision(const TrainConfig& train);

/// A model a run does not train, stored as model.frozen_dtype says: with bf16 every parameter
/// stops requiring grad and its matrices and embedding tables go to bf16 (nn::keep_frozen_in_bf16);
/// with fp32 nothing changes.
/// nn::FrozenValues::loaded_next: `frozen` was built under SkipInitScope and its file is read next.
void store_frozen(const RunConfig& config, nn::Module& frozen,
                  nn::FrozenValues values = nn::FrozenValues::convert);

/// Total bytes of an estimate.
double total_bytes(const MemoryEstimate& e);
/// One rank's share of `e` in a job of `ranks` under train.shard_optimizer: each rank keeps AdamW's
/// moments (8 of the 12 bytes a trained parameter costs) for 1/ranks of the parameters.
MemoryEstimate sharded_optimizer_estimate(MemoryEstimate e, int64_t ranks);

/// The memory a run may use: the least of MemAvailable (MemTotal if the kernel has no
/// MemAvailable) in /proc/meminfo and the cgroup's memory.max when set; `source` names which.
struct MemoryLimit {
  double bytes = 0;
  std::string source;
};
std::optional<MemoryLimit> machine_memory();

/// Throws Error(usage) with the estimate, the limit and the override when `estimate` exceeds
/// `limit`; `ignore` (forge train --ignore-memory-check) skips the check.
void check_memory(const MemoryEstimate& estimate, const std::optional<MemoryLimit>& limit,
                  bool ignore);

/// Refuses (Error(usage) naming the flag to lower) a generation that cannot fit `limit`, before
/// a model is loaded or a completion allocated, so that --num-samples 10^9 fails at once rather
/// than in an allocation: every prompt's batch.num_samples completions are held together (each an
/// nn::Completion, its place in the decoding order and at least its record's keys and prompt),
/// and a batch of min(batch_size, completions) rows adds each row's key-value cache for
/// max_new_tokens and a row of logits. Lower bounds, so a generation that fits is never refused.
/// `who` starts the message ("generate").
void check_generation_memory(const ModelConfig& model,
                             const std::vector<std::vector<int64_t>>& prompts,
                             const nn::SamplingOptions& sampling, const nn::BatchOptions& batch,
                             const std::optional<MemoryLimit>& limit, const std::string& who);

/// `forge eval` output: the checkpoint and its step, then one "val_<key> <value>" line per metric.
void print_eval(const std::string& checkpoint_file, int64_t step, const Metrics& metrics);

/// Groups from names (decay, layer-wise lr, freezing, unfreezing, the recipe's `lr_scale`, e.g.
/// lora_lr_scale) and the configured optimizer.
std::unique_ptr<optim::Optimizer> build_optimizer(
    const RunConfig& config, const NamedTensors& params,
    std::vector<std::pair<std::string, double>> lr_scale = {});

/// What a command that reads the checkpoint `given` (a run, a file or a Hugging Face directory)
/// reads: `given`, the checkpoint `file` it resolved to (resolve_checkpoint), and every model that
/// checkpoint references (a LoRA run's base, a reference policy), for check_output_path
/// (core/output_path.h).
std::vector<std::filesystem::path> checkpoint_inputs(const std::filesystem::path& given,
                                                     const std::filesystem::path& file);

/// A run directory (its latest checkpoint), a checkpoint file or a model in an installed foreign
/// layout (a Hugging Face directory, runtime/checkpoint.h); throws Error(checkpoint) if none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& run_dir_or_file);

/// How a model takes weights from another model's checkpoint (model.init_from; a student built from
/// teacher layers; a classifier that drops the LM head).
struct InitOptions {
  /// Source-name prefix -> target-name prefix, applied in order, first match wins
  /// ({"blocks.2.", "blocks.1."} puts teacher block 2 into student block 1).
  std::vector<std::pair<std::string, std::string>> rename = {};
  /// Glob patterns of target tensors the checkpoint need not provide (they keep their init).
  std::vector<std::string> allow_missing = {};
  /// Glob patterns of (renamed) source tensors the target does not have (they are not read).
  std::vector<std::string> allow_unexpected = {};
};

/// Which tensors an initialisation copied and which it left alone.
struct InitReport {
  int64_t copied = 0;
  std::vector<std::string> missing;     ///< target tensors left at their init
  std::vector<std::string> unexpected;  ///< source tensors not used
};

/// Copies the state of `file` (a checkpoint) into `model` by name, as `options` maps names. Every
/// shape and dtype is checked before anything is read or copied. Throws Error(checkpoint) naming
/// the file and the tensor for a missing, unexpected (unless allowed) or mismatched tensor.
InitReport init_from_checkpoint(nn::Module& model, const std::filesystem::path& file,
                                const InitOptions& options = {});

/// Error(usage) when the model of checkpoint `file` carries a task head (a classifier's or a
/// reward model's "head.*" tensors, nn/classifier.h) beside its backbone: the file is intact, but
/// what asked for a language model cannot use it; `use` says why ("GGUF cannot hold it").
void require_language_model(const std::filesystem::path& file, const std::string& use);

/// Error(usage) unless `m` is a GPT-2-style GPT (layernorm, learned positions, gelu MLP, biases),
/// the one layout GPT-2's formats hold: "<file>: <format> writes ...; this model has rmsnorm, ...".
void require_gpt2_layout(const std::filesystem::path& file, const ModelConfig& m,
                         const std::string& format);

/// The stored config of checkpoint `file` without building its model (any family): what export
/// checks before it loads weights. Error(checkpoint) when the config does not load.
RunConfig stored_config(const std::filesystem::path& file);

/// A GPT checkpoint's weights as a plain GPT holds them: a LoRA run's adapters merged into the
/// base weights (W + alpha/r B A) and left out, so every name is one of nn::GPT's.
struct MergedGPT {
  RunConfig config;
  int64_t step;
  NamedTensors weights;
};
MergedGPT load_merged_gpt(const std::filesystem::path& file);

/// Writes the model of a LoRA run's checkpoint `file` with its adapters merged into the base
/// weights as a plain checkpoint at `output` (config with lora.rank 0, no optimizer state).
/// Error(usage) when `file` holds no adapters.
void export_merged(const std::filesystem::path& file, const std::filesystem::path& output);

/// `model`'s weights from `file`: a checkpoint of the same architecture, or an adapters-only one
/// (a LoRA run), whose base and adapters are merged first. A bf16 weight of `model` (a frozen
/// base, store_frozen) takes the f32 values rounded. `absent`: glob patterns of `model`'s tensors
/// the file does not hold (adapters injected before the base is loaded). Error(checkpoint) naming
/// the tensor.
void load_initial_weights(nn::GPT& model, const std::filesystem::path& file,
                          const std::vector<std::string>& absent = {});

/// Loads model.init_from's weights into `model` (the same names and shapes); a no-op when it is
/// empty. A resumed run then overwrites them with its own checkpoint. A GPT may also start from a
/// LoRA run (load_initial_weights merges it).
void init_weights(nn::Module& model, const RunConfig& config);
void init_weights(nn::GPT& model, const RunConfig& config);

/// A model and the resolved config stored in a checkpoint, weights loaded, in eval mode.
template <class Model>
struct LoadedModel {
  RunConfig config;
  std::unique_ptr<Model> model;
  int64_t step;
};
using LoadedGPT = LoadedModel<nn::GPT>;
using LoadedBert = LoadedModel<nn::Bert>;
/// Throw Error(checkpoint) when the checkpoint holds another model family, Error(usage) when its
/// model has a task head (require_language_model). A LoRA run's checkpoint (adapters only) loads
/// as its base with the adapters injected (unmerged).
LoadedGPT load_gpt(const std::filesystem::path& checkpoint_file);
LoadedBert load_bert(const std::filesystem::path& checkpoint_file);

}  // namespace forge
