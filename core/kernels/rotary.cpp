// Rotary embedding kernels: one pass over the rows, each row's halves read once and written once.
// Memory-bound, so rows are split over threads in pieces and the per-row loop is compiled per ISA.
#include "core/kernels/rotary.h"
#include "core/kernels/isa.h"

#include <algorithm>

namespace forge::kernels {
namespace {

// Rows are handed out dynamically in pieces of about this many elements (see kernels/norm.cpp).
constexpr int64_t kParallelGrain = 16384;

// o = (x1 c - x2 s, x2 c + x1 s) over the half-length `half`; sign -1 turns back.
template <class T>
FORGE_CLONES void rotate_row(const T* x, const T* c, const T* s, T sign, int64_t half, T* o) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const T x1 = x[i], x2 = x[i + half], ci = c[i], si = sign * s[i];
    o[i] = x1 * ci - x2 * si;
    o[i + half] = x2 * ci + x1 * si;
  }
}

}  // namespace

template <class T>
void rotary_embedding(const RotaryShape& n, const RotaryParams<T>& p, const T* x, RowStrides xs,
                      T* out) {
  const int64_t half = n.D / 2, rows = n.B * n.H * n.T;
  const T sign = p.inverse ? T(-1) : T(1);
  const int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, n.D));
#pragma omp parallel for schedule(dynamic, piece) if (rows * n.D > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (n.H * n.T), h = r / n.T % n.H, t = r % n.T;
    const int64_t pos = p.positions ? p.positions[b * n.T + t] : p.pos0 + t;
    rotate_row(x + b * xs.b + h * xs.h + t * xs.row, p.cos + pos * half, p.sin + pos * half, sign,
               half, out + r * n.D);
  }
}

template void rotary_embedding<float>(const RotaryShape&, const RotaryParams<float>&,
                                      const float*, RowStrides, float*);
template void rotary_embedding<double>(const RotaryShape&, const RotaryParams<double>&,
                                       const double*, RowStrides, double*);

namespace ref {

template <class T>
void rotary_embedding(const RotaryShape& n, const RotaryParams<T>& p, const T* x, RowStrides xs,
                      T* out) {
  const int64_t half = n.D / 2;
  const double sign = p.inverse ? -1.0 : 1.0;
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h)
      for (int64_t t = 0; t < n.T; ++t) {
        const int64_t pos = p.positions ? p.positions[b * n.T + t] : p.pos0 + t;
        const T* xr = x + b * xs.b + h * xs.h + t * xs.row;
        T* o = out + ((b * n.H + h) * n.T + t) * n.D;
        for (int64_t i = 0; i < half; ++i) {
          const double c = double(p.cos[pos * half + i]), s = sign * double(p.sin[pos * half + i]);
          // rotate_half(x) = (-x2, x1)
          o[i] = T(double(xr[i]) * c - double(xr[i + half]) * s);
          o[i + half] = T(double(xr[i + half]) * c + double(xr[i]) * s);
        }
      }
}

template void rotary_embedding<float>(const RotaryShape&, const RotaryParams<float>&,
                                      const float*, RowStrides, float*);
template void rotary_embedding<double>(const RotaryShape&, const RotaryParams<double>&,
                                       const double*, RowStrides, double*);

}  // namespace ref

}  // namespace forge::kernels
