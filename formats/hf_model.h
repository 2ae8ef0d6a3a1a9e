// Hugging Face model directories (config.json + model.safetensors or its shards, as published on
// the hub) read as checkpoints, and Forge models written back in that layout or as PEFT adapters
// (docs/interop.md). GPT-2 and BERT, whose layouts Forge's GPT and BERT follow, and the Llama
// family (Llama, Mistral, Qwen2) as options of Forge's GPT.
// Installed as a foreign layout (hf_model_layout), read_checkpoint_info, load_checkpoint and
// verify_checkpoint (runtime/checkpoint.h) hand such a directory here, so every command and config
// key that takes a checkpoint takes one.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "runtime/checkpoint.h"

namespace forge {

/// The layout the runtime's checkpoint readers take these directories through
/// (install_foreign_layout).
ForeignLayout hf_model_layout();

/// A directory holding entries config.json and model.safetensors or model.safetensors.index.json
/// (sharded weights), whatever they are (a symlink that cannot be followed included: the readers
/// name it).
bool is_hf_directory(const std::filesystem::path& path);

/// One line for forge inspect and validate: the dtypes and files the weights Forge reads are
/// stored in, their size so and as f32 once loaded, and the tokenizer Forge uses for the model.
std::string hf_load_summary(const std::filesystem::path& dir);

/// The directory as a step-0 checkpoint: the config it stands for in Forge's keys (model.*, the
/// tokenizer of its directory) and its tensors under Forge's names. Error(checkpoint) naming the
/// file and the key or tensor for an unsupported or inconsistent model.
CheckpointInfo read_hf_info(const std::filesystem::path& dir);

/// load_checkpoint for a directory: names and shapes must match `expected` (all of them unless
/// options.model_subset) before any data is read; conversion (transposes, q/k/v stacking) happens
/// on load.
CheckpointData load_hf_model(const std::filesystem::path& dir,
                             const std::vector<TensorSpec>& expected, const LoadOptions& options);

/// Reads every tensor of the directory (verify_checkpoint for a directory).
void verify_hf_model(const std::filesystem::path& dir);

/// `forge export --format hf`: the model of a checkpoint (a LoRA run's merged) as config.json,
/// model.safetensors and the tokenizer's files (when its tokenizer has them) in `out_dir`, as
/// transformers' GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM (a rotary GPT, with q/k/v
/// biases for Qwen2) or BertForPreTraining loads them, its tensors stored as `stored` or, when
/// unset, as the weights of the hub directory the model came from (f32 if none). Returns the type
/// written. Error(usage) for a model these classes cannot express, or weights beyond F16's range.
StoredFloat export_hf(const std::filesystem::path& checkpoint_file,
                      const std::filesystem::path& out_dir,
                      std::optional<StoredFloat> stored = {});

/// `forge export --format peft`: a LoRA run's adapters as adapter_config.json and
/// adapter_model.safetensors under PEFT's names, for the base exported with --format hf; stored
/// as `stored` (unset: f32, as PEFT keeps adapters). Returns the type written.
StoredFloat export_peft(const std::filesystem::path& checkpoint_file,
                        const std::filesystem::path& out_dir,
                        std::optional<StoredFloat> stored = {});

}  // namespace forge
