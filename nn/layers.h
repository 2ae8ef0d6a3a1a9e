// The basic layers: thin Modules that own their parameters and call the fused ops of core/ops.
// Constructors initialise from the generator they are given: PyTorch's defaults, or N(0, init_std)
// when a model asks for its own scheme (GPT-2's 0.02), so no weight is ever drawn twice.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace forge::nn {

/// A module mapping one tensor to one tensor. Holding layers through this interface lets a model
/// pick LayerNorm or RMSNorm from its config, and lets a later module swap (LoRA) override forward.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
};

/// y = x W^T + b: x [..., in] -> [..., out]. Parameters "weight" [out, in] and "bias" [out].
class Linear : public UnaryModule {
 public:
  /// init_std > 0: weight ~ N(0, init_std), bias 0. init_std == 0: weight and bias
  /// ~ U(-1/sqrt(in), 1/sqrt(in)), as torch.nn.Linear.
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator& gen = default_generator(), double init_std = 0.0);
  Tensor forward(const Tensor& x) const override;

  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }

  Tensor weight;
  Tensor bias;  ///< undefined without bias
};

/// A weight as f32 ops read it: itself, or widened to f32 when kept in bf16 (a frozen table read
/// by slicing rather than through embedding()).
inline Tensor widened(const Tensor& weight) {
  return weight.dtype() == DType::bf16 ? weight.to(DType::f32) : weight;
}

/// Rows of "weight" [num, dim] at i64 ids: ids [...] -> [..., dim].
class Embedding : public UnaryModule {
 public:
  /// weight ~ N(0, init_std); 1 is torch.nn.Embedding's default.
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen = default_generator(),
            double init_std = 1.0);
  Tensor forward(const Tensor& ids) const override;

  Tensor weight;
};

/// Normalises the last dimension; "weight" [dim] = 1 and "bias" [dim] = 0 (bias optional).
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) const override;

  Tensor weight;
  Tensor bias;  ///< undefined without bias
  double eps;
};

/// x / sqrt(mean(x^2) + eps) * weight over the last dimension; "weight" [dim] = 1.
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const override;

  Tensor weight;
  double eps;
};

/// Inverted dropout with probability p while training, identity in eval mode. Masks come from the
/// default generator, whose state the trainer sets per step (reproducible runs and resumes).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p);
  Tensor forward(const Tensor& x) const override;

  double p;
};

}  // namespace forge::nn
