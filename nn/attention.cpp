// Self-attention: project to q, k, v in one matmul, view them as heads without copying, rotate q
// and k (rotary), append to the KV cache when decoding, run the fused attention op (causal and/or
// key-padding masked), merge heads and project back.
#include "nn/attention.h"

#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

KVCache make_kv_cache(int64_t n_layers, int64_t batch, int64_t n_heads, int64_t capacity,
                      int64_t head_dim) {
  FORGE_CHECK(n_layers > 0 && batch > 0 && n_heads > 0 && capacity > 0 && head_dim > 0,
              "make_kv_cache: sizes must be positive, got layers ", n_layers, ", batch ", batch,
              ", heads ", n_heads, ", capacity ", capacity, ", head_dim ", head_dim);
  KVCache cache;
  for (int64_t l = 0; l < n_layers; ++l) {
    cache.k.push_back(zeros({batch, n_heads, capacity, head_dim}));
    cache.v.push_back(zeros({batch, n_heads, capacity, head_dim}));
  }
  return cache;
}

RotaryTables rotary_tables(int64_t positions, int64_t head_dim, double theta) {
  FORGE_CHECK(head_dim % 2 == 0, "rotary: head dimension must be even, got ", head_dim);
  const int64_t half = head_dim / 2;
  std::vector<double> c(static_cast<size_t>(positions * half)), s(c.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double angle = double(p) * std::pow(theta, -2.0 * double(i) / double(head_dim));
      c[size_t(p * half + i)] = std::cos(angle);
      s[size_t(p * half + i)] = std::sin(angle);
    }
  return {from_vector(c, {positions, half}), from_vector(s, {positions, half})};
}

// x [B, H, T, D], tables [P, D/2] -> [B, H, T, D]
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables, int64_t pos0) {
  const int64_t T = x.size(2), half = x.size(3) / 2;
  FORGE_CHECK(x.size(3) == 2 * tables.cos.size(1), "rotary: head dimension ", x.size(3),
              " does not match tables of ", shape_str(tables.cos.shape()));
  FORGE_CHECK(pos0 >= 0 && pos0 + T <= tables.cos.size(0), "rotary: positions ", pos0, "..",
              pos0 + T - 1, " exceed the ", tables.cos.size(0), " positions of the tables");
  Tensor cos = slice(tables.cos, 0, pos0, pos0 + T).to(x.dtype());  // [T, D/2] broadcasts
  Tensor sin = slice(tables.sin, 0, pos0, pos0 + T).to(x.dtype());
  Tensor x1 = slice(x, 3, 0, half), x2 = slice(x, 3, half, 2 * half);
  return cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

SelfAttention::SelfAttention(const AttentionConfig& config, Generator& gen)
    : config_(config) {
  FORGE_CHECK(config.n_heads > 0 && config.d_model % config.n_heads == 0, "attention: d_model ",
              config.d_model, " must be a positive multiple of n_heads ", config.n_heads);
  register_module("qkv", std::make_shared<Linear>(config.d_model, 3 * config.d_model, config.bias,
                                                  gen, config.init_std), qkv);
  register_module("proj", std::make_shared<Linear>(config.d_model, config.d_model, config.bias, gen,
                                                   config.proj_init_std), proj);
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(config.dropout));
  if (config.rotary) {
    rope_ = rotary_tables(config.context, head_dim(), config.rope_theta);
    register_buffer("rope_cos", rope_.cos, /*persistent=*/false);
    register_buffer("rope_sin", rope_.sin, /*persistent=*/false);
  }
}

// x [B, T, C], key_padding_mask [B, S] or undefined -> [B, T, C]
Tensor SelfAttention::forward(const Tensor& x, const Tensor& key_padding_mask, KVCache* cache,
                              size_t layer) const {
  FORGE_CHECK(x.dim() == 3 && x.size(2) == config_.d_model, "attention: x must be [B, T, ",
              config_.d_model, "], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = n_heads(), D = head_dim();
  std::vector<Tensor> parts = split(qkv->forward(x), C, 2);  // three [B, T, C] views
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
  Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);  // [B, H, T, D] views
  const int64_t pos0 = cache ? cache->length : 0;
  if (config_.rotary) {
    q = apply_rotary(q, rope_, pos0);
    k = apply_rotary(k, rope_, pos0);
  }
  if (cache) {
    FORGE_CHECK(layer < cache->k.size(), "attention: cache has ", cache->k.size(),
                " layers, asked for layer ", layer);
    FORGE_CHECK(!grad_enabled() || !k.requires_grad(),
                "attention: the KV cache is for inference; run under NoGradGuard");
    const Tensor& ck = cache->k[layer];
    const Tensor& cv = cache->v[layer];
    FORGE_CHECK(ck.shape() == Shape({B, H, ck.size(2), D}), "attention: cache layer ", layer,
                " is ", shape_str(ck.shape()), ", input needs [", B, ", ", H, ", *, ", D, "]");
    if (pos0 + T > ck.size(2))
      throw Error(ExitCode::usage, detail::concat("attention: ", pos0 + T,
                                                  " positions exceed the KV cache capacity ",
                                                  ck.size(2)));
    slice(ck, 2, pos0, pos0 + T).copy_(k);
    slice(cv, 2, pos0, pos0 + T).copy_(v);
    k = slice(ck, 2, 0, pos0 + T);
    v = slice(cv, 2, 0, pos0 + T);
  }
  AttentionOptions options;
  options.causal = config_.causal;
  Tensor y = scaled_dot_product_attention(q, k, v, key_padding_mask, options);  // [B, H, T, D]
  y = reshape(transpose(y, 1, 2), {B, T, C});
  return resid_drop->forward(proj->forward(y));
}

}  // namespace forge::nn
