// Fused scaled-dot-product attention: shape checks, the padding mask turned into bytes, packed
// rows' segment ids checked, and the node.
// Forward saves q, k, v, the output and the per-row log-sum-exp; backward recomputes probabilities
// tile by tile in kernels/attention, so memory stays O(T·D) per head instead of O(T·S).
#include "core/ops/attention.h"

#include <cmath>
#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/kernels/attention.h"

namespace forge {
namespace {

using MaskBytes = std::shared_ptr<const std::vector<uint8_t>>;
using SegmentIds = std::shared_ptr<const std::vector<int64_t>>;

// The kernels need a dense last dimension; any other strides pass through, so transposed [B, T, H, D]
// and fused-qkv views are read in place.
Tensor dense_last_dim(const Tensor& t) {
  return t.size(3) <= 1 || t.strides()[3] == 1 ? t : t.contiguous();
}

kernels::RowStrides row_strides(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2]};
}

kernels::AttentionParams params(bool causal, double scale, const MaskBytes& mask,
                                const SegmentIds& segments) {
  return {causal, scale, mask ? mask->data() : nullptr, segments ? segments->data() : nullptr};
}

MaskBytes mask_bytes(const Tensor& mask) {
  Tensor m = mask.detach().to(DType::f64).contiguous();
  const double* src = m.data<double>();
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(m.numel()));
  for (size_t i = 0; i < bytes->size(); ++i) (*bytes)[i] = src[i] != 0.0;
  return bytes;
}

// segments [B, T] i64, checked to be non-decreasing along each row (records are contiguous).
SegmentIds segment_ids(const Tensor& segments, int64_t B, int64_t T, int64_t S) {
  FORGE_CHECK(segments.dtype() == DType::i64 && segments.shape() == Shape({B, T}) && T == S,
              "attention: segments must be i64 [B, T] = ", shape_str({B, T}),
              " of self-attention (T == S, got S ", S, "), got ", dtype_name(segments.dtype()),
              " ", shape_str(segments.shape()));
  Tensor s = segments.contiguous();
  auto ids = std::make_shared<std::vector<int64_t>>(s.data<int64_t>(),
                                                    s.data<int64_t>() + s.numel());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t)
      FORGE_CHECK((*ids)[size_t(b * T + t)] >= (*ids)[size_t(b * T + t - 1)],
                  "attention: segments must not decrease along a row; row ", b, " goes from ",
                  (*ids)[size_t(b * T + t - 1)], " to ", (*ids)[size_t(b * T + t)], " at ", t);
  return ids;
}

}  // namespace

// q [B, H, T, D], k and v [B, Hkv, S, D], key_padding_mask [B, S] -> out [B, H, T, D]
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& key_padding_mask, const AttentionOptions& options) {
  FORGE_CHECK(q.defined() && k.defined() && v.defined(), "attention: undefined q, k or v");
  FORGE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be [B, H, T|S, D], got ", shape_str(q.shape()), ", ",
              shape_str(k.shape()), ", ", shape_str(v.shape()));
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  FORGE_CHECK(k.shape() == Shape({B, Hkv, S, D}) && v.shape() == k.shape(),
              "attention: k and v must be [B, Hkv, S, D] matching q ", shape_str(q.shape()),
              ", got k ", shape_str(k.shape()), " and v ", shape_str(v.shape()));
  FORGE_CHECK(Hkv > 0 && H % Hkv == 0, "attention: ", Hkv,
              " key/value heads must divide the query's ", H, " heads (q ", shape_str(q.shape()),
              ", k ", shape_str(k.shape()), ")");
  FORGE_CHECK(D > 0, "attention: head dimension must be positive, got q ", shape_str(q.shape()));
  FORGE_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "attention: dtypes differ (q ",
              dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()),
              ")");
  FORGE_CHECK(!key_padding_mask.defined() || key_padding_mask.shape() == Shape({B, S}),
              "attention: key_padding_mask must be [B, S] = ", shape_str({B, S}), ", got ",
              key_padding_mask.defined() ? shape_str(key_padding_mask.shape()) : "");
  const double scale = options.scale == 0.0 ? 1.0 / std::sqrt(double(D)) : options.scale;
  FORGE_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", options.scale);

  Tensor qd = dense_last_dim(q), kd = dense_last_dim(k), vd = dense_last_dim(v);
  MaskBytes mask = key_padding_mask.defined() ? mask_bytes(key_padding_mask) : nullptr;
  SegmentIds segments =
      options.segments.defined() ? segment_ids(options.segments, B, T, S) : nullptr;
  const kernels::AttentionShape shape{B, H, Hkv, T, S, D};
  const bool causal = options.causal;
  Tensor out = empty({B, H, T, D}, q.dtype()), lse = empty({B, H, T}, q.dtype());
  FORGE_DISPATCH_FLOAT(q.dtype(), "attention", [&] {
    kernels::attention_forward(shape, params(causal, scale, mask, segments),
                               qd.data<scalar_t>(), row_strides(qd), kd.data<scalar_t>(),
                               row_strides(kd), vd.data<scalar_t>(), row_strides(vd),
                               out.data<scalar_t>(), lse.data<scalar_t>());
  });

  if (needs_grad(q, k, v)) {
    const bool want_q = q.requires_grad(), want_k = k.requires_grad(), want_v = v.requires_grad();
    record(Op::attention, out, {q, k, v},
           [sq = qd.detach(), sk = kd.detach(), sv = vd.detach(), so = out.detach(), lse, mask,
            segments, shape, causal, scale, want_q, want_k, want_v](const Tensor& dout) {
             // Differentiates out = softmax(q kᵀ scale + masks) v through the flash recurrences.
             Tensor g = dout.contiguous();
             Tensor dq = want_q ? empty(sq.shape(), g.dtype()) : Tensor();
             Tensor dk = want_k ? empty(sk.shape(), g.dtype()) : Tensor();
             Tensor dv = want_v ? empty(sv.shape(), g.dtype()) : Tensor();
             FORGE_DISPATCH_FLOAT(g.dtype(), "attention backward", [&] {
               auto ptr = [](const Tensor& t) { return t.defined() ? t.data<scalar_t>() : nullptr; };
               kernels::attention_backward(
                   shape, params(causal, scale, mask, segments), sq.data<scalar_t>(),
                   row_strides(sq), sk.data<scalar_t>(), row_strides(sk), sv.data<scalar_t>(),
                   row_strides(sv), so.data<scalar_t>(), g.data<scalar_t>(), lse.data<scalar_t>(),
                   ptr(dq), ptr(dk), ptr(dv));
             });
             return std::vector<Tensor>{dq, dk, dv};
           });
  }
  return out;
}

}  // namespace forge
