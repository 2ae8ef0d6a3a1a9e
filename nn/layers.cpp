// Basic layers: each constructor allocates and initialises its parameters, each forward is one
// fused op from core/ops.
#include "nn/layers.h"

#include <cmath>

#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, Generator& gen,
               double init_std) {
  FORGE_CHECK(in_features > 0 && out_features > 0, "Linear: sizes must be positive, got in ",
              in_features, ", out ", out_features);
  FORGE_CHECK(init_std >= 0.0, "Linear: init_std must be >= 0, got ", init_std);
  if (init_std > 0.0) {
    weight = register_parameter("weight", normal({out_features, in_features}, 0.0, init_std, gen));
    if (with_bias) bias = register_parameter("bias", zeros({out_features}));
    return;
  }
  const double bound = 1.0 / std::sqrt(double(in_features));
  weight = register_parameter("weight", uniform({out_features, in_features}, -bound, bound, gen));
  if (with_bias) bias = register_parameter("bias", uniform({out_features}, -bound, bound, gen));
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, double init_std) {
  FORGE_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ",
              num_embeddings, " x ", dim);
  FORGE_CHECK(init_std > 0.0, "Embedding: init_std must be positive, got ", init_std);
  weight = register_parameter("weight", normal({num_embeddings, dim}, 0.0, init_std, gen));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight, ids); }

LayerNorm::LayerNorm(int64_t dim, double eps_, bool with_bias) : eps(eps_) {
  FORGE_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", ones({dim}));
  if (with_bias) bias = register_parameter("bias", zeros({dim}));
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double eps_) : eps(eps_) {
  FORGE_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", ones({dim}));
}

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps); }

Dropout::Dropout(double p_) : p(p_) {
  FORGE_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p, is_training()); }

}  // namespace forge::nn
