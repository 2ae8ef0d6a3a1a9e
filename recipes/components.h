// Building shared pieces from a config: the model config structs nn understands, optimizer groups
// from parameter names, and models restored from checkpoints (for generate, eval, inspect).
#pragma once

#include <filesystem>
#include <memory>

#include "nn/gpt.h"
#include "optim/optimizer.h"
#include "recipes/config.h"

namespace forge {

nn::GPTConfig gpt_config(const ModelConfig& model);

/// Groups from names (decay, layer-wise lr, freezing, unfreezing) and the configured optimizer.
std::unique_ptr<optim::Optimizer> build_optimizer(const RunConfig& config, const NamedTensors& params);

/// A run directory (its latest checkpoint) or a checkpoint file; throws Error(checkpoint) if none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& run_dir_or_file);

/// The GPT and resolved config stored in a checkpoint, weights loaded, in eval mode.
struct LoadedGPT {
  RunConfig config;
  std::unique_ptr<nn::GPT> model;
  int64_t step;
};
LoadedGPT load_gpt(const std::filesystem::path& checkpoint_file);

}  // namespace forge
