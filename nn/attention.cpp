// Self-attention: project to q, k, v (one matmul or three), view them as heads without copying,
// rotate q and k (core's fused rotary op), append to the KV cache when decoding, run the fused
// attention op (causal and/or key-padding masked), merge heads and project back. A left-padded
// cache supplies each row's positions and padding mask, so rows of different lengths decode
// together.
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

KVCache make_kv_cache(int64_t n_layers, int64_t batch, int64_t n_kv_heads, int64_t capacity,
                      int64_t head_dim) {
  FORGE_CHECK(n_layers > 0 && batch > 0 && n_kv_heads > 0 && capacity > 0 && head_dim > 0,
              "make_kv_cache: sizes must be positive, got layers ", n_layers, ", batch ", batch,
              ", kv heads ", n_kv_heads, ", capacity ", capacity, ", head_dim ", head_dim);
  KVCache cache;
  for (int64_t l = 0; l < n_layers; ++l) {
    cache.k.push_back(zeros({batch, n_kv_heads, capacity, head_dim}));
    cache.v.push_back(zeros({batch, n_kv_heads, capacity, head_dim}));
  }
  return cache;
}

Tensor KVCache::positions(int64_t T) const {
  Tensor out = empty({int64_t(start.size()), T}, DType::i64);
  int64_t* p = out.data<int64_t>();
  for (size_t b = 0; b < start.size(); ++b)
    for (int64_t t = 0; t < T; ++t)
      p[int64_t(b) * T + t] = std::max<int64_t>(length + t - start[b], 0);
  return out;
}

Tensor KVCache::key_mask(int64_t S) const {
  Tensor out = empty({int64_t(start.size()), S}, DType::i64);
  int64_t* m = out.data<int64_t>();
  for (size_t b = 0; b < start.size(); ++b)
    for (int64_t s = 0; s < S; ++s) m[int64_t(b) * S + s] = s >= start[b];
  return out;
}

KVCache select_rows(const KVCache& cache, const std::vector<int64_t>& rows) {
  Tensor index = empty({int64_t(rows.size())}, DType::i64);
  std::copy(rows.begin(), rows.end(), index.data<int64_t>());
  KVCache out;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    out.k.push_back(index_select(cache.k[l], 0, index));
    out.v.push_back(index_select(cache.v[l], 0, index));
  }
  out.length = cache.length;
  if (cache.padded())
    for (int64_t r : rows) out.start.push_back(cache.start[size_t(r)]);
  return out;
}

std::vector<double> rotary_frequencies(int64_t head_dim, double theta,
                                       const RopeScaling& scaling) {
  FORGE_CHECK(head_dim % 2 == 0, "rotary: head dimension must be even, got ", head_dim);
  FORGE_CHECK(scaling.type == RopeScalingType::none || scaling.factor > 0, "rotary: scaling factor "
              "must be positive, got ", scaling.factor);
  std::vector<double> freq(size_t(head_dim / 2));
  for (size_t i = 0; i < freq.size(); ++i)
    freq[i] = std::pow(theta, -2.0 * double(i) / double(head_dim));
  if (scaling.type == RopeScalingType::linear)
    for (double& f : freq) f /= scaling.factor;
  if (scaling.type == RopeScalingType::llama3) {
    // transformers' _compute_llama3_parameters: long wavelengths (low frequencies) are stretched
    // by factor, short ones kept, and the band between blends the two linearly in 1/wavelength.
    FORGE_CHECK(scaling.high_freq_factor > scaling.low_freq_factor && scaling.original_context > 0,
                "rotary: llama3 scaling needs high_freq_factor > low_freq_factor and a positive "
                "original context");
    const double old = double(scaling.original_context);
    const double low_wavelen = old / scaling.low_freq_factor;
    const double high_wavelen = old / scaling.high_freq_factor;
    for (double& f : freq) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= scaling.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1 - smooth) * f / scaling.factor + smooth * f;
      }
    }
  }
  return freq;
}

RotaryTables rotary_tables(int64_t positions, int64_t head_dim, double theta,
                           const RopeScaling& scaling) {
  const std::vector<double> freq = rotary_frequencies(head_dim, theta, scaling);
  const int64_t half = head_dim / 2;
  std::vector<double> c(static_cast<size_t>(positions * half)), s(c.size());
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * freq[size_t(i)];
      c[size_t(p * half + i)] = std::cos(angle);
      s[size_t(p * half + i)] = std::sin(angle);
    }
  return {from_vector(c, {positions, half}), from_vector(s, {positions, half})};
}

// x [B, H, T, D], tables [P, D/2] -> [B, H, T, D]
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables, int64_t pos0) {
  return rotary_embedding(x, tables.cos, tables.sin, pos0);
}

// x [B, H, T, D], positions [B, T] -> [B, H, T, D]
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables, const Tensor& positions) {
  return rotary_embedding(x, tables.cos, tables.sin, positions);
}

namespace {

// The config with its defaults resolved: Hkv = H and D = C / H unless given.
AttentionConfig resolved(AttentionConfig c) {
  FORGE_CHECK(c.n_heads > 0 && c.d_model > 0, "attention: d_model ", c.d_model, " and n_heads ",
              c.n_heads, " must be positive");
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  if (c.head_dim == 0) {
    FORGE_CHECK(c.d_model % c.n_heads == 0, "attention: d_model ", c.d_model,
                " must be a multiple of n_heads ", c.n_heads, " unless head_dim is given");
    c.head_dim = c.d_model / c.n_heads;
  }
  FORGE_CHECK(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 && c.head_dim > 0,
              "attention: n_kv_heads ", c.n_kv_heads, " must divide n_heads ", c.n_heads,
              " and head_dim ", c.head_dim, " must be positive");
  return c;
}

}  // namespace

SelfAttention::SelfAttention(const AttentionConfig& config, Generator& gen,
                             const RotaryTables* tables)
    : config_(resolved(config)) {
  const AttentionConfig& c = config_;
  const int64_t q_width = c.n_heads * c.head_dim, kv_width = c.n_kv_heads * c.head_dim;
  const bool in_bias = c.bias || c.qkv_bias;
  auto make_linear = [&](int64_t in, int64_t out, bool bias, double init_std) {
    return std::make_shared<Linear>(in, out, bias, gen, init_std);
  };
  if (c.fused_qkv) {
    register_module("qkv", make_linear(c.d_model, q_width + 2 * kv_width, in_bias, c.init_std),
                    qkv);
  } else {
    register_module("q", make_linear(c.d_model, q_width, in_bias, c.init_std), q);
    register_module("k", make_linear(c.d_model, kv_width, in_bias, c.init_std), k);
    register_module("v", make_linear(c.d_model, kv_width, in_bias, c.init_std), v);
  }
  register_module("proj", make_linear(q_width, c.d_model, c.bias, c.proj_init_std), proj);
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(c.dropout));
  if (c.rotary) {
    if (tables) {
      FORGE_CHECK(tables->cos.shape() == Shape({c.context, head_dim() / 2}), "attention: rotary "
                  "tables ", shape_str(tables->cos.shape()), " are not for ", c.context,
                  " positions of head dimension ", head_dim());
      rope_ = *tables;
    } else {
      rope_ = rotary_tables(c.context, head_dim(), c.rope_theta, c.rope_scaling);
    }
    register_buffer("rope_cos", rope_.cos, /*persistent=*/false);
    register_buffer("rope_sin", rope_.sin, /*persistent=*/false);
  }
}

Tensor SelfAttention::forward(const Tensor& x, const Tensor& key_padding_mask, KVCache* cache,
                              size_t layer) const {
  return attend(x, key_padding_mask, cache, layer, nullptr);
}

Tensor SelfAttention::forward(const Tensor& x, const PackedRows& packed) const {
  return attend(x, Tensor(), nullptr, 0, &packed);
}

// x [B, T, C], key_padding_mask [B, S] or undefined, packed positions and segments [B, T] or null
// -> [B, T, C]
Tensor SelfAttention::attend(const Tensor& x, const Tensor& key_padding_mask, KVCache* cache,
                             size_t layer, const PackedRows* packed) const {
  FORGE_CHECK(x.dim() == 3 && x.size(2) == config_.d_model, "attention: x must be [B, T, ",
              config_.d_model, "], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), H = n_heads(), Hkv = n_kv_heads(),
                D = head_dim();
  auto heads = [&](const Tensor& t, int64_t n) {
    return transpose(reshape(t, {B, T, n, D}), 1, 2);  // [B, n, T, D], a view
  };
  Tensor qh, kh, vh;  // [B, H | Hkv, T, D]
  if (qkv) {
    Tensor fused = qkv->forward(x);  // [B, T, (H + 2 Hkv) D]
    qh = heads(slice(fused, 2, 0, H * D), H);
    kh = heads(slice(fused, 2, H * D, (H + Hkv) * D), Hkv);
    vh = heads(slice(fused, 2, (H + Hkv) * D, (H + 2 * Hkv) * D), Hkv);
  } else {
    qh = heads(q->forward(x), H);
    kh = heads(k->forward(x), Hkv);
    vh = heads(v->forward(x), Hkv);
  }
  const int64_t pos0 = cache ? cache->length : 0;
  const bool padded = cache && cache->padded();
  if (padded)
    FORGE_CHECK(int64_t(cache->start.size()) == B && !key_padding_mask.defined(),
                "attention: a padded cache needs one start per row (", cache->start.size(),
                " for ", B, " rows) and masks its padding itself (no key_padding_mask)");
  if (config_.rotary && (padded || packed)) {
    Tensor positions = packed ? packed->positions : cache->positions(T);
    qh = apply_rotary(qh, rope_, positions);
    kh = apply_rotary(kh, rope_, positions);
  } else if (config_.rotary) {
    qh = apply_rotary(qh, rope_, pos0);
    kh = apply_rotary(kh, rope_, pos0);
  }
  if (cache) {
    FORGE_CHECK(layer < cache->k.size(), "attention: cache has ", cache->k.size(),
                " layers, asked for layer ", layer);
    FORGE_CHECK(!grad_enabled() || !kh.requires_grad(),
                "attention: the KV cache is for inference; run under NoGradGuard");
    const Tensor& ck = cache->k[layer];
    const Tensor& cv = cache->v[layer];
    FORGE_CHECK(ck.shape() == Shape({B, Hkv, ck.size(2), D}), "attention: cache layer ", layer,
                " is ", shape_str(ck.shape()), ", input needs [", B, ", ", Hkv, ", *, ", D, "]");
    if (pos0 + T > ck.size(2))
      throw Error(ExitCode::usage, detail::concat("attention: ", pos0 + T,
                                                  " positions exceed the KV cache capacity ",
                                                  ck.size(2)));
    slice(ck, 2, pos0, pos0 + T).copy_(kh);
    slice(cv, 2, pos0, pos0 + T).copy_(vh);
    kh = slice(ck, 2, 0, pos0 + T);
    vh = slice(cv, 2, 0, pos0 + T);
  }
  AttentionOptions options;
  options.causal = config_.causal;
  if (packed) options.segments = packed->segments;
  Tensor mask = padded ? cache->key_mask(pos0 + T) : key_padding_mask;
  Tensor y = scaled_dot_product_attention(qh, kh, vh, mask, options);  // [B, H, T, D]
  y = reshape(transpose(y, 1, 2), {B, T, H * D});
  return resid_drop->forward(proj->forward(y));
}

}  // namespace forge::nn
