// LayerNorm / RMSNorm kernels. Statistics are two-pass (mean, then squared deviations) with f32
// lanes per 1024-element block and f64 across blocks, so they stay exact to f32 rounding for
// any row length and offset. Row helpers are compiled per ISA (target_clones); threads split
// rows, and dweight/dbias come from per-chunk partial sums added in chunk order.
#include "core/kernels/norm.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace forge::kernels {
namespace {

// Rows are handed out dynamically in pieces of about kParallelGrain elements: on a shared machine a
// preempted thread then delays the others by one piece, not by half the job.
constexpr int64_t kParallelGrain = 16384;
constexpr int64_t kBlock = 1024;    // f32 partial sums stay this short before going to f64
constexpr int64_t kChunkRows = 32;  // rows per dweight/dbias partial sum (fixed: determinism)

// sum(x - shift) and sum((x - shift)^2); shift = 0 gives plain sums.
template <class T>
FORGE_CLONES void row_moments(const T* x, int64_t n, T shift, double* s1, double* s2) {
  double t1 = 0, t2 = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T a1 = T(0), a2 = T(0);
#pragma omp simd reduction(+ : a1, a2)
    for (int64_t i = b; i < e; ++i) {
      T d = x[i] - shift;
      a1 += d;
      a2 += d * d;
    }
    t1 += double(a1);
    t2 += double(a2);
  }
  *s1 = t1;
  *s2 = t2;
}

// y = (x - shift - delta) * r * w + b; w and b optional. The mean is split as shift (a T near it,
// so x - shift is exact) plus a small delta, which keeps full precision for large offsets.
template <class T>
FORGE_CLONES void row_affine(const T* x, const T* w, const T* b, T* y, int64_t n, T shift, T delta,
                             T r) {
  if (w && b) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - shift - delta) * r * w[i] + b[i];
  } else if (w) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - shift - delta) * r * w[i];
  } else if (b) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - shift - delta) * r + b[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - shift - delta) * r;
  }
}

// With xhat = (x - shift) * r and g = dy * w (or dy): sum(g) and sum(g * xhat).
template <class T>
FORGE_CLONES void row_grad_sums(const T* x, const T* w, const T* dy, int64_t n, T shift, T r,
                                double* sg, double* sgx) {
  double t1 = 0, t2 = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T a1 = T(0), a2 = T(0);
    if (w) {
#pragma omp simd reduction(+ : a1, a2)
      for (int64_t i = b; i < e; ++i) {
        T g = dy[i] * w[i];
        a1 += g;
        a2 += g * (x[i] - shift) * r;
      }
    } else {
#pragma omp simd reduction(+ : a1, a2)
      for (int64_t i = b; i < e; ++i) {
        a1 += dy[i];
        a2 += dy[i] * (x[i] - shift) * r;
      }
    }
    t1 += double(a1);
    t2 += double(a2);
  }
  *sg = t1;
  *sgx = t2;
}

// dx = r * (g - ka - xhat * kb), the normalisation's Jacobian applied to g = dy * w.
template <class T>
FORGE_CLONES void row_dx(const T* x, const T* w, const T* dy, T* dx, int64_t n, T shift, T r, T ka,
                         T kb) {
  if (w) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = r * (dy[i] * w[i] - ka - (x[i] - shift) * r * kb);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = r * (dy[i] - ka - (x[i] - shift) * r * kb);
  }
}

// dw += dy * xhat, db += dy (either may be null).
template <class T>
FORGE_CLONES void row_param_grads(const T* x, const T* dy, T* dw, T* db, int64_t n, T shift, T r) {
  if (dw) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dw[i] += dy[i] * (x[i] - shift) * r;
  }
  if (db) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) db[i] += dy[i];
  }
}

// out[c] = sum over chunks k (in order) of parts[k][c]. Serial: at [64, 768] this is ~50k adds,
// cheaper than waking threads.
template <class T>
void reduce_chunks(const std::vector<T>& parts, int64_t chunks, int64_t C, T* out) {
  if (!out) return;
  for (int64_t c = 0; c < C; ++c) out[c] = T(0);
  for (int64_t k = 0; k < chunks; ++k) {
    const T* p = parts.data() + k * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] += p[c];
  }
}

// Shared backward of both norms (rms_norm: mean == null, no dbias, no centring term).
template <class T>
void norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx, T* dw,
                   T* db, int64_t N, int64_t C) {
  int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  std::vector<T> dw_parts(dw ? size_t(chunks * C) : 0, T(0));
  std::vector<T> db_parts(db ? size_t(chunks * C) : 0, T(0));
#pragma omp parallel for schedule(dynamic) if (N * C > kParallelGrain)
  for (int64_t k = 0; k < chunks; ++k) {
    T* dw_k = dw ? dw_parts.data() + k * C : nullptr;
    T* db_k = db ? db_parts.data() + k * C : nullptr;
    for (int64_t row = k * kChunkRows; row < std::min(N, (k + 1) * kChunkRows); ++row) {
      const T *xr = x + row * C, *dyr = dy + row * C;
      T shift = mean ? mean[row] : T(0), r = rstd[row];
      if (dx) {
        double sg, sgx;
        row_grad_sums(xr, w, dyr, C, shift, r, &sg, &sgx);
        T ka = mean ? T(sg / double(C)) : T(0), kb = T(sgx / double(C));
        row_dx(xr, w, dyr, dx + row * C, C, shift, r, ka, kb);
      }
      if (dw_k || db_k) row_param_grads(xr, dyr, dw_k, db_k, C, shift, r);
    }
  }
  reduce_chunks(dw_parts, chunks, C, dw);
  reduce_chunks(db_parts, chunks, C, db);
}

}  // namespace

template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                        int64_t C, double eps) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C));
#pragma omp parallel for schedule(dynamic, piece) if (N * C > kParallelGrain)
  for (int64_t row = 0; row < N; ++row) {
    const T* xr = x + row * C;
    double s1, s2;
    row_moments(xr, C, T(0), &s1, &s2);
    T m = T(s1 / double(C));
    row_moments(xr, C, m, &s1, &s2);  // second pass: deviations from the rounded mean
    double delta = s1 / double(C), var = std::max(0.0, s2 / double(C) - delta * delta);
    T r = T(1.0 / std::sqrt(var + eps));
    mean[row] = T(double(m) + delta);
    rstd[row] = r;
    row_affine(xr, w, b, y + row * C, C, m, T(delta), r);
  }
}

template <class T>
void layer_norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx,
                         T* dw, T* db, int64_t N, int64_t C) {
  norm_backward(x, w, mean, rstd, dy, dx, dw, db, N, C);
}

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C));
#pragma omp parallel for schedule(dynamic, piece) if (N * C > kParallelGrain)
  for (int64_t row = 0; row < N; ++row) {
    const T* xr = x + row * C;
    double s1, s2;
    row_moments(xr, C, T(0), &s1, &s2);
    T r = T(1.0 / std::sqrt(s2 / double(C) + eps));
    rstd[row] = r;
    row_affine(xr, w, static_cast<const T*>(nullptr), y + row * C, C, T(0), T(0), r);
  }
}

template <class T>
void rms_norm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t N,
                       int64_t C) {
  norm_backward(x, w, static_cast<const T*>(nullptr), rstd, dy, dx, dw, static_cast<T*>(nullptr), N,
                C);
}

namespace ref {

template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                        int64_t C, double eps) {
  for (int64_t row = 0; row < N; ++row) {
    const T* xr = x + row * C;
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += double(xr[c]);
    m /= double(C);
    for (int64_t c = 0; c < C; ++c) v += (double(xr[c]) - m) * (double(xr[c]) - m);
    double r = 1.0 / std::sqrt(v / double(C) + eps);
    mean[row] = T(m);
    rstd[row] = T(r);
    for (int64_t c = 0; c < C; ++c)
      y[row * C + c] =
          T((double(xr[c]) - m) * r * (w ? double(w[c]) : 1.0) + (b ? double(b[c]) : 0.0));
  }
}

template <class T>
void layer_norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx,
                         T* dw, T* db, int64_t N, int64_t C) {
  std::vector<double> dw_acc(size_t(C), 0.0), db_acc(size_t(C), 0.0);
  for (int64_t row = 0; row < N; ++row) {
    double m = double(mean[row]), r = double(rstd[row]), sg = 0, sgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      double xhat = (double(x[row * C + c]) - m) * r,
             g = double(dy[row * C + c]) * (w ? double(w[c]) : 1.0);
      sg += g;
      sgx += g * xhat;
      dw_acc[size_t(c)] += double(dy[row * C + c]) * xhat;
      db_acc[size_t(c)] += double(dy[row * C + c]);
    }
    if (!dx) continue;
    for (int64_t c = 0; c < C; ++c) {
      double xhat = (double(x[row * C + c]) - m) * r,
             g = double(dy[row * C + c]) * (w ? double(w[c]) : 1.0);
      dx[row * C + c] = T(r * (g - sg / double(C) - xhat * sgx / double(C)));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    if (dw) dw[c] = T(dw_acc[size_t(c)]);
    if (db) db[c] = T(db_acc[size_t(c)]);
  }
}

template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps) {
  for (int64_t row = 0; row < N; ++row) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(x[row * C + c]) * double(x[row * C + c]);
    double r = 1.0 / std::sqrt(ms / double(C) + eps);
    rstd[row] = T(r);
    for (int64_t c = 0; c < C; ++c)
      y[row * C + c] = T(double(x[row * C + c]) * r * (w ? double(w[c]) : 1.0));
  }
}

template <class T>
void rms_norm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t N,
                       int64_t C) {
  std::vector<double> dw_acc(size_t(C), 0.0);
  for (int64_t row = 0; row < N; ++row) {
    double r = double(rstd[row]), sgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      double xhat = double(x[row * C + c]) * r;
      sgx += double(dy[row * C + c]) * (w ? double(w[c]) : 1.0) * xhat;
      dw_acc[size_t(c)] += double(dy[row * C + c]) * xhat;
    }
    if (!dx) continue;
    for (int64_t c = 0; c < C; ++c) {
      double xhat = double(x[row * C + c]) * r,
             g = double(dy[row * C + c]) * (w ? double(w[c]) : 1.0);
      dx[row * C + c] = T(r * (g - xhat * sgx / double(C)));
    }
  }
  if (dw)
    for (int64_t c = 0; c < C; ++c) dw[c] = T(dw_acc[size_t(c)]);
}

}  // namespace ref

#define FORGE_NORM_INSTANTIATE(T)                                                                  \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t,  \
                                      double);                                                     \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,   \
                                       T*, int64_t, int64_t);                                      \
  template void rms_norm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);         \
  template void rms_norm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t,      \
                                     int64_t);                                                     \
  template void ref::layer_norm_forward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t,      \
                                           int64_t, double);                                       \
  template void ref::layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*,  \
                                            T*, T*, int64_t, int64_t);                             \
  template void ref::rms_norm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);    \
  template void ref::rms_norm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, \
                                          int64_t);
FORGE_NORM_INSTANTIATE(float)
FORGE_NORM_INSTANTIATE(double)
#undef FORGE_NORM_INSTANTIATE

}  // namespace forge::kernels
