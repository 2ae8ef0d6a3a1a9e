// Multi-head self-attention, with q, k and v projected by one fused matrix or three (the Llama
// family's layout): causal for decoders (GPT), bidirectional with a key-padding mask for encoders
// (BERT). Grouped-query attention (fewer key/value heads than query heads), an explicit head
// dimension, optional rotary position embedding (the GPT-NeoX / Llama "rotate half" convention,
// with Llama's frequency scalings) and a preallocated KV cache holding the key/value heads only.
// The attention itself is core's fused scaled_dot_product_attention, whose causal mask is aligned
// bottom-right, so new queries attend to every cached key.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {

/// Rows packed with several records (data/packing.h), i64 [B, T] each: the position of every token
/// within its record (0 at the record's start) and its record's id, non-decreasing along a row.
/// Attention then stays within each record, so each computes what it would alone.
struct PackedRows {
  Tensor positions;
  Tensor segments;
};

/// Keys and values of every layer for generation: k[l] and v[l] are [B, Hkv, capacity, D] and
/// slots [0, length) hold the prefix decoded so far.
struct KVCache {
  std::vector<Tensor> k;
  std::vector<Tensor> v;
  int64_t length = 0;
  /// Left padding, for rows of different lengths decoded together: row b's sequence begins at
  /// slot start[b], which is its position 0, and the slots before it are masked out of attention,
  /// so each row computes what it would alone. Empty: every row begins at slot 0.
  std::vector<int64_t> start;

  int64_t batch() const { return k.empty() ? 0 : k[0].size(0); }
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(2); }
  bool padded() const { return !start.empty(); }
  /// Starts a new sequence; the storage is kept.
  void reset() { length = 0; }
  /// [B, T] i64: the positions of slots length .. length+T-1 of each row (0 on its padding).
  Tensor positions(int64_t T) const;
  /// [B, S] i64: 1 where a row's slot s < S holds one of its tokens, 0 on its padding.
  Tensor key_mask(int64_t S) const;
};

/// Zero-filled cache for `n_layers` layers of [batch, n_kv_heads, capacity, head_dim].
KVCache make_kv_cache(int64_t n_layers, int64_t batch, int64_t n_kv_heads, int64_t capacity,
                      int64_t head_dim);

/// The cache of rows `rows` of `cache`, in that order (a row may repeat: one prompt's prefix
/// shared by several samples); the storage is copied.
KVCache select_rows(const KVCache& cache, const std::vector<int64_t>& rows);

/// How rotary frequencies are stretched for contexts longer than the training one, as Hugging
/// Face's `rope_scaling` (docs/interop.md): none; linear (every frequency divided by factor, i.e.
/// positions compressed); llama3 (Llama 3.1: wavelengths longer than original_context /
/// low_freq_factor divided by factor, shorter than original_context / high_freq_factor kept, a
/// smooth blend between).
enum class RopeScalingType { none, linear, llama3 };
struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_context = 8192;
};

/// Rotary frequency i < D/2: theta^(-2i/D), scaled as `scaling` says.
std::vector<double> rotary_frequencies(int64_t head_dim, double theta,
                                       const RopeScaling& scaling = {});
/// cos and sin of position p times each frequency, as [positions, D/2] f32 tables (computed in
/// f64).
struct RotaryTables {
  Tensor cos;
  Tensor sin;
};
RotaryTables rotary_tables(int64_t positions, int64_t head_dim, double theta,
                           const RopeScaling& scaling = {});
/// Rotates x [B, H, T, D] for absolute positions pos0 .. pos0+T-1: with x = [x1, x2] split in
/// halves, returns [x1 cos - x2 sin, x2 cos + x1 sin] (rotate-half convention).
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables, int64_t pos0);
/// The same with each row's own positions, i64 [B, T] (a left-padded batch).
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables, const Tensor& positions);

struct AttentionConfig {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;     ///< key/value heads, dividing n_heads; 0 = n_heads
  int64_t head_dim = 0;       ///< 0 = d_model / n_heads
  int64_t context = 0;        ///< longest sequence (rotary tables are built for it)
  bool causal = true;         ///< false: each query sees every key the padding mask allows (BERT)
  double dropout = 0.0;       ///< on the output projection (the residual branch)
  bool bias = true;           ///< q/k/v and proj biases
  bool qkv_bias = false;      ///< q/k/v biases even without `bias` (Qwen2)
  bool fused_qkv = true;      ///< one "qkv" projection; false: "q", "k", "v" apart
  bool rotary = false;        ///< rotate q and k by their absolute positions
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double init_std = 0.0;       ///< qkv weight ~ N(0, init_std); 0 = Linear's default
  double proj_init_std = 0.0;  ///< proj weight likewise (GPT-2 scales residual projections down)
};

/// x [B, T, C] -> [B, T, C]. With H heads, Hkv key/value heads and head dimension D: children
/// "qkv" (Linear C -> (H + 2 Hkv) D, output laid out [q | k | v], heads contiguous within each) or,
/// unfused, "q" (C -> H D), "k" and "v" (C -> Hkv D); and "proj" (H D -> C). Each is replaceable
/// by any UnaryModule (LoRA). Non-persistent buffers "rope_cos", "rope_sin" with rotary.
class SelfAttention : public Module {
 public:
  /// With rotary positions, `tables` (built for this config: the context's positions, head_dim,
  /// theta and scaling) are used instead of building them: a model's layers share one set, which
  /// for a hub model's long context is tens of MiB a layer.
  SelfAttention(const AttentionConfig& config, Generator& gen = default_generator(),
                const RotaryTables* tables = nullptr);

  /// Without a cache, positions start at 0. With one, x holds the slots after the cache's
  /// `length`; their keys and values are written to layer `layer` of the cache and the queries
  /// attend to the whole prefix (a padded cache: each row to its own slots, at its own
  /// positions). The caller advances cache->length once every layer has run.
  /// Cached attention is for inference: it refuses to run while recording a graph.
  Tensor forward(const Tensor& x, KVCache* cache = nullptr, size_t layer = 0) const {
    return forward(x, Tensor(), cache, layer);
  }
  /// As above, attending only to keys where key_padding_mask [B, S] (any dtype) is nonzero; S is
  /// T, or the cache's length + T when decoding. Undefined means every key. The mask goes to the
  /// fused kernel as is: no [B, H, T, S] bias is ever built. A padded cache brings its own mask,
  /// so key_padding_mask must then be undefined.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask, KVCache* cache = nullptr,
                 size_t layer = 0) const;
  /// Packed rows: each query attends causally to its own record's keys (the fused kernel skips
  /// the others), rotated by its position within the record.
  Tensor forward(const Tensor& x, const PackedRows& packed) const;

  int64_t n_heads() const { return config_.n_heads; }
  int64_t n_kv_heads() const { return config_.n_kv_heads; }
  int64_t head_dim() const { return config_.head_dim; }

  std::shared_ptr<UnaryModule> qkv;   ///< a Linear as built; null unfused
  std::shared_ptr<UnaryModule> q;     ///< Linears as built, unfused only
  std::shared_ptr<UnaryModule> k;
  std::shared_ptr<UnaryModule> v;
  std::shared_ptr<UnaryModule> proj;  ///< a Linear as built
  std::shared_ptr<Dropout> resid_drop;

 private:
  Tensor attend(const Tensor& x, const Tensor& key_padding_mask, KVCache* cache, size_t layer,
                const PackedRows* packed) const;

  AttentionConfig config_;
  RotaryTables rope_;
};

}  // namespace forge::nn
