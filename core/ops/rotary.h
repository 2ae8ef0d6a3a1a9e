// Rotary position embedding as one fused op, in Hugging Face's rotate-half layout: Llama-family
// attention turns q and k by their positions' angles before attending. One pass reads a strided
// view (e.g. of a fused qkv projection) and writes the rotated heads densely.
#pragma once

#include "core/tensor.h"

namespace forge {

/// x [B, H, T, D] (last dimension dense, other strides free) at positions pos0 .. pos0 + T - 1 ->
/// [B, H, T, D] dense in x's dtype (f32 or f64): x * cos + rotate_half(x) * sin, rotate_half(x) =
/// cat(-x2, x1) over the halves of D. cos and sin are [P, D/2] tables (f32; converted to x's
/// dtype) whose row p holds the angles of position p. Differentiable in x only.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos0);

/// The same with every row's own positions: positions [B, T] (i64), e.g. a left-padded batch.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                        const Tensor& positions);

}  // namespace forge
