// LoRA (Hu et al. 2021) as a module swap: inject_lora replaces the targeted Linear layers of a
// model with LoRALinear, which keeps the base weight and bias under their old names (frozen, so
// base checkpoints still load) and adds a trainable low-rank update s * B A. select_trainable then
// picks what trains by parameter name. Conventions follow PEFT (docs/recipes/finetune.md, "LoRA").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/named_tensor.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {

/// lora.* of a finetune recipe.
struct LoRAConfig {
  int64_t rank = 8;
  double alpha = 16;
  double dropout = 0;    ///< on the input of the low-rank branch only
  bool rslora = false;   ///< scale alpha / sqrt(rank) instead of alpha / rank
  /// Globs over module paths ("*.attn.qkv", "blocks.?.mlp.*"), Hugging Face's module names
  /// (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: that module in every block)
  /// or "all-linear" (every Linear of the blocks), as PEFT's target_modules.
  std::vector<std::string> targets;
};

/// The scale of the low-rank update: alpha / rank, or alpha / sqrt(rank) with rslora.
double lora_scale(const LoRAConfig& config);

/// y = x W^T + b + s * dropout(x) A^T B^T: x [..., in] -> [..., out]. Parameters "weight" [out, in]
/// and "bias" [out] (the base's, frozen), "lora_A" [r, in] and "lora_B" [out, r] (trainable).
class LoRALinear : public UnaryModule {
 public:
  /// Wraps base's weight and bias (the same tensors, now requires_grad false). A ~ U(-1/sqrt(in),
  /// 1/sqrt(in)) from `gen` (torch.nn.Linear's Kaiming-uniform, a = sqrt(5)), B = 0: the layer
  /// starts equal to the base.
  LoRALinear(const Linear& base, const LoRAConfig& config, Generator& gen);
  /// Adopts the given tensors (bias may be undefined) with update scale `scale`: loading adapters,
  /// tests. rank = lora_A.size(0).
  LoRALinear(Tensor weight, Tensor bias, Tensor lora_A, Tensor lora_B, double scale,
             double dropout = 0);

  Tensor forward(const Tensor& x) const override;

  /// W += s * B A in place (no graph); forward then skips the branch. Error(usage) when merged.
  void merge();
  /// W -= s * B A, undoing merge() up to rounding. Error(usage) when not merged.
  void unmerge();
  bool merged() const { return merged_; }
  /// With adapters off the layer is its base, x W^T + b (a DPO reference without a second copy of
  /// the weights). Error(usage) when turning them off on a merged layer, whose W holds them.
  void set_adapters_enabled(bool on);
  bool adapters_enabled() const { return enabled_; }

  int64_t rank() const { return lora_A.size(0); }
  double scale() const { return scale_; }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }

  Tensor weight;
  Tensor bias;  ///< undefined when the base has none
  Tensor lora_A;
  Tensor lora_B;

 private:
  void adopt(Tensor weight, Tensor bias, Tensor lora_A, Tensor lora_B);

  double scale_;
  double dropout_;
  bool merged_ = false;
  bool enabled_ = true;
};

/// Replaces every Linear whose dotted module path matches a pattern of config.targets ('*' any run
/// of characters, dots included; '?' one) with a LoRALinear, drawing each A from `gen` in module
/// order (same seed, same adapters). Returns the replaced paths in model order. Error(usage) for a
/// bad rank/alpha/dropout, no targets, a pattern that matches no Linear (naming what it matches
/// instead, if anything), or q_proj, k_proj or v_proj on a model with a fused attn.qkv.
std::vector<std::string> inject_lora(Module& model, const LoRAConfig& config, Generator& gen);
/// merge() / unmerge() on every LoRALinear of `model`. Error(usage) when it has none.
void merge_lora(Module& model);
void unmerge_lora(Module& model);

/// Turns every LoRALinear of `model` into its base for its lifetime, and back on at the end.
/// Error(usage) when `model` has no LoRALinear or one is merged.
class AdaptersDisabled {
 public:
  explicit AdaptersDisabled(Module& model);
  ~AdaptersDisabled();
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  std::vector<LoRALinear*> layers_;
};

/// The parameters whose names match any of `include` (globs), in `params` order; sets
/// requires_grad on them and clears it (and any gradient) on the rest, so backward skips the
/// frozen ones. Error(usage) naming a pattern that matches no parameter.
NamedTensors select_trainable(const NamedTensors& params, const std::vector<std::string>& include);

/// Elements of lora_A and lora_B that inject_lora(GPT(model), config) adds, computed from the
/// config alone (no allocation). Same errors as inject_lora for the targets.
int64_t lora_parameter_count(const GPTConfig& model, const LoRAConfig& config);

/// Keeps in bf16 the weight of every Linear, LoRALinear base and Embedding of `model` that is not
/// trained (requires_grad false), converted in place (Tensor::retype_): half the memory of a frozen
/// model or a LoRA base. Biases, norms and other tensors stay f32 (small, and read by f32 kernels).
/// The layers multiply such a weight in bf16 (core/ops/linalg.h). Returns the elements converted.
/// With FrozenValues::loaded_next the values are dropped instead (Tensor::reset_storage_): a file
/// is about to fill them, and the model was built without writing its f32 ones (SkipInitScope).
enum class FrozenValues { convert, loaded_next };
int64_t keep_frozen_in_bf16(Module& model, FrozenValues values = FrozenValues::convert);

}  // namespace forge::nn
