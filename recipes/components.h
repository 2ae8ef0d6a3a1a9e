// Building shared pieces from a config: the model config structs nn understands, optimizer groups
// from parameter names, and models restored from checkpoints (for generate, eval, inspect).
#pragma once

#include <filesystem>
#include <memory>

#include "nn/bert.h"
#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "recipes/config.h"
#include "recipes/metrics.h"

namespace forge {

nn::GPTConfig gpt_config(const ModelConfig& model);
nn::BertConfig bert_config(const ModelConfig& model);

/// `forge eval` output: the checkpoint and its step, then one "val_<key> <value>" line per metric.
void print_eval(const std::string& checkpoint_file, int64_t step, const Metrics& metrics);

/// Groups from names (decay, layer-wise lr, freezing, unfreezing) and the configured optimizer.
std::unique_ptr<optim::Optimizer> build_optimizer(const RunConfig& config, const NamedTensors& params);

/// A run directory (its latest checkpoint) or a checkpoint file; throws Error(checkpoint) if none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& run_dir_or_file);

/// A model and the resolved config stored in a checkpoint, weights loaded, in eval mode.
template <class Model>
struct LoadedModel {
  RunConfig config;
  std::unique_ptr<Model> model;
  int64_t step;
};
using LoadedGPT = LoadedModel<nn::GPT>;
using LoadedBert = LoadedModel<nn::Bert>;
/// Throw Error(checkpoint) when the checkpoint holds another model family.
LoadedGPT load_gpt(const std::filesystem::path& checkpoint_file);
LoadedBert load_bert(const std::filesystem::path& checkpoint_file);

}  // namespace forge
