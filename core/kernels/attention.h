// Fused scaled-dot-product attention kernels on raw buffers. The f32 kernel is tiled (online
// softmax in forward; probabilities recomputed from the saved log-sum-exp in backward), so no
// [T, S] matrix ever exists; f64 runs a simple unblocked version of the same algorithm for gradient
// checks. kernels::ref materialises each softmax row in double: the oracle for both. Grouped-query
// attention reads each query head's key/value head in place; nothing repeats k or v.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// Batch, query heads, key/value heads, queries, keys, head dimension. Hkv divides H; query head h
/// reads key/value head h / (H / Hkv) (Hugging Face's repeat_kv order). Hkv == H is multi-head
/// attention, Hkv == 1 multi-query.
struct AttentionShape {
  int64_t B = 0, H = 0, Hkv = 0, T = 0, S = 0, D = 0;
};

/// Element strides of a [B, heads, rows, D] operand whose last dimension is dense (stride 1). Any
/// other layout works, e.g. transposed [B, T, H, D] or fused-qkv [B, T, 3, H, D] views, or 0 to
/// broadcast.
struct RowStrides {
  int64_t b = 0, h = 0, row = 0;
};

struct AttentionParams {
  bool causal = false;                ///< query t attends key s iff s <= t + (S - T)
  double scale = 1.0;                 ///< scores are q·k * scale
  const uint8_t* key_mask = nullptr;  ///< [B, S] dense, nonzero = attend; null = every key
  /// [B, T] dense record ids of packed rows (T == S), non-decreasing along each row: query t
  /// attends only keys of its own record. Null = one record a row. Other records' key tiles are
  /// skipped.
  const int64_t* segments = nullptr;
};

/// q [B, H, T, D], k and v [B, Hkv, S, D] (strided as RowStrides says) -> out [B, H, T, D] (dense)
/// = softmax(q kᵀ scale + masks) v; lse [B, H, T] (dense) is the log-sum-exp
/// of each row's scaled scores, +inf for a row with no key to attend (its output row is zero).
template <class T>
void attention_forward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                       const T* k, RowStrides ks, const T* v, RowStrides vs, T* out, T* lse);

/// dq [B, H, T, D], dk and dv [B, Hkv, S, D] (dense, overwritten; each kv head's gradient sums its
/// group of query heads) from dout [B, H, T, D] (dense) and the forward's out and lse. A null
/// gradient pointer skips that gradient and the work only it needs.
template <class T>
void attention_backward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                        const T* k, RowStrides ks, const T* v, RowStrides vs, const T* out,
                        const T* dout, const T* lse, T* dq, T* dk, T* dv);

namespace ref {
template <class T>
void attention_forward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                       const T* k, RowStrides ks, const T* v, RowStrides vs, T* out, T* lse);
/// Recomputes every softmax row from q and k and uses the textbook softmax backward; out and lse
/// are accepted for signature parity and not read, so the oracle trusts nothing the forward saved.
template <class T>
void attention_backward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                        const T* k, RowStrides ks, const T* v, RowStrides vs, const T* out,
                        const T* dout, const T* lse, T* dq, T* dk, T* dv);
}  // namespace ref

}  // namespace forge::kernels
