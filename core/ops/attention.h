// Fused scaled dot-product attention: softmax(q k^T * scale + masks) v without materialising the
// [T, S] score matrix per head in memory (online softmax, recomputation in backward).
#pragma once

#include "core/tensor.h"

namespace forge {

struct AttentionOptions {
  bool causal = false;  ///< query t attends to keys s <= t + (S - T) (aligned at the end, for KV caches)
  double scale = 0.0;   ///< 0 means 1/sqrt(D)
  /// [B, T] i64 record ids of packed rows (self-attention: T == S), non-decreasing along each row:
  /// query t attends only keys of its own record. Undefined: each row is one record.
  Tensor segments = {};
};

/// q [B, H, T, D], k and v [B, Hkv, S, D] -> [B, H, T, D]. Hkv dividing H is grouped-query
/// attention: query head h attends with key/value head h / (H / Hkv), read in place (no repeated
/// copy), and dk, dv sum over each group. key_padding_mask [B, S] (any dtype, nonzero = attend) may
/// be undefined. A query row with no key to attend to yields zeros, never NaN.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& key_padding_mask = {},
                                    const AttentionOptions& options = {});

}  // namespace forge
