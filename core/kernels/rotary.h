// Rotary position embedding kernels on raw buffers, in Hugging Face's rotate-half layout: the two
// halves (x1, x2) of each head vector turn by their position's angles,
// out = (x1 cos - x2 sin, x2 cos + x1 sin). The kernel splits rows over threads with per-ISA
// vector loops; kernels::ref is the plain loop in double, the oracle for both dtypes.
#pragma once

#include <cstdint>

#include "core/kernels/attention.h"

namespace forge::kernels {

/// Batch, heads, rows (positions), head dimension (even).
struct RotaryShape {
  int64_t B = 0, H = 0, T = 0, D = 0;
};

/// The angles of each row: cos and sin tables [P, D/2] (dense). Row t of batch b takes table row
/// positions[b * T + t] when positions ([B, T], dense) is set, else pos0 + t; every one must be
/// in [0, P) (the op checks). inverse negates sin: the rotation back, which is also the backward.
template <class T>
struct RotaryParams {
  const T* cos = nullptr;
  const T* sin = nullptr;
  const int64_t* positions = nullptr;
  int64_t pos0 = 0;
  bool inverse = false;
};

/// out [B, H, T, D] (dense) = x [B, H, T, D] (strided as xs says) rotated.
template <class T>
void rotary_embedding(const RotaryShape& n, const RotaryParams<T>& p, const T* x, RowStrides xs,
                      T* out);

namespace ref {
template <class T>
void rotary_embedding(const RotaryShape& n, const RotaryParams<T>& p, const T* x, RowStrides xs,
                      T* out);
}  // namespace ref

}  // namespace forge::kernels
