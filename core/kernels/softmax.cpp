// Softmax kernels. Last-dimension rows (inner == 1) take the fast path: vectorised vm::exp with
// sums carried in f64 across 1024-element blocks, each helper compiled per ISA (target_clones).
// A row holding NaN or inf falls back to exact libm math, so non-finite inputs give PyTorch's
// answers (NaN stays NaN, -inf gives exactly 0). Other dimensions run SIMD across `inner`.
#include "core/kernels/softmax.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kernels/vecmath.h"

namespace forge::kernels {
namespace {

// Work is handed out dynamically in pieces of about kParallelGrain elements: on a shared machine a
// thread that gets preempted then holds up the others by one piece, not by half the job.
constexpr int64_t kParallelGrain = 16384;
constexpr int64_t kLanes = 64;    // inner positions processed together on strided paths
constexpr int64_t kBlock = 1024;  // f32 partial sums stay this short before going to f64

template <class T>
struct RowMax {
  T max;
  bool finite;  // no NaN or inf in the row (x * 0 is NaN exactly for those)
};

template <class T>
FORGE_CLONES RowMax<T> row_max(const T* x, int64_t n) {
  T m = -std::numeric_limits<T>::infinity(), probe = T(0);
#pragma omp simd reduction(max : m) reduction(+ : probe)
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;  // not std::max: GCC vectorises only this form
    probe += x[i] * T(0);
  }
  return {m, probe == T(0)};
}

// sum(exp(x - m)), f32 lanes per block, blocks summed in f64.
template <class T>
FORGE_CLONES double row_sum_exp(const T* x, int64_t n, T m) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += vm::exp(x[i] - m);
    total += double(s);
  }
  return total;
}

// y = exp(x - m); returns sum(y).
template <class T>
FORGE_CLONES double row_exp_store(const T* x, T* y, int64_t n, T m) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      y[i] = vm::exp(x[i] - m);
      s += y[i];
    }
    total += double(s);
  }
  return total;
}

// sum(a * b), or sum(a) when b is null.
template <class T>
FORGE_CLONES double row_dot(const T* a, const T* b, int64_t n) {
  double total = 0;
  for (int64_t k = 0; k < n; k += kBlock) {
    int64_t e = std::min(n, k + kBlock);
    T s = T(0);
    if (b) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = k; i < e; ++i) s += a[i] * b[i];
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t i = k; i < e; ++i) s += a[i];
    }
    total += double(s);
  }
  return total;
}

template <class T>
FORGE_CLONES void row_scale(T* y, int64_t n, T a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

template <class T>
FORGE_CLONES void row_add(const T* x, T* y, int64_t n, T a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + a;
}

// softmax backward, from y = softmax(x) and s = sum(dy y).
template <class T>
FORGE_CLONES void row_softmax_grad(const T* y, const T* dy, T* dx, int64_t n, T s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - s);
}

// log_softmax backward, from y = log_softmax(x) and s = sum(dy).
template <class T>
FORGE_CLONES void row_log_softmax_grad(const T* y, const T* dy, T* dx, int64_t n, T s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] - vm::exp(y[i]) * s;
}

template <class T>
void ref_row_forward(const T* x, T* y, int64_t C, int64_t stride, bool log) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < C; ++c) {
    double v = double(x[c * stride]);
    if (v > m || v != v) m = v;
  }
  double s = 0;
  for (int64_t c = 0; c < C; ++c) s += std::exp(double(x[c * stride]) - m);
  double lse = m + std::log(s);
  for (int64_t c = 0; c < C; ++c) {
    double v = double(x[c * stride]);
    y[c * stride] = T(log ? v - lse : std::exp(v - m) / s);
  }
}

template <class T>
void fast_row_forward(const T* x, T* y, int64_t C, bool log) {
  RowMax<T> rm = row_max(x, C);
  if (!rm.finite) return ref_row_forward(x, y, C, 1, log);
  if (log) {
    T lse = T(double(rm.max) + std::log(row_sum_exp(x, C, rm.max)));
    row_add(x, y, C, -lse);
  } else {
    double s = row_exp_store(x, y, C, rm.max);
    row_scale(y, C, T(1.0 / s));
  }
}

template <class T>
void fast_row_backward(const T* y, const T* dy, T* dx, int64_t C, bool log) {
  if (log) {
    row_log_softmax_grad(y, dy, dx, C, T(row_dot(dy, static_cast<const T*>(nullptr), C)));
  } else {
    row_softmax_grad(y, dy, dx, C, T(row_dot(dy, y, C)));
  }
}

// A [C, inner] slab at columns [i0, i0 + w): softmax down each column, w columns at a time.
template <class T>
void strided_forward(const T* x, T* y, int64_t C, int64_t inner, int64_t w, bool log) {
  T m[kLanes], s[kLanes];
  for (int64_t i = 0; i < w; ++i) {
    m[i] = -std::numeric_limits<T>::infinity();
    s[i] = T(0);
  }
  for (int64_t c = 0; c < C; ++c) {
    const T* xc = x + c * inner;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) m[i] = (xc[i] > m[i] || xc[i] != xc[i]) ? xc[i] : m[i];
  }
  for (int64_t c = 0; c < C; ++c) {
    const T* xc = x + c * inner;
    T* yc = y + c * inner;
    for (int64_t i = 0; i < w; ++i) {
      T e = std::exp(xc[i] - m[i]);
      if (!log) yc[i] = e;
      s[i] += e;
    }
  }
  for (int64_t i = 0; i < w; ++i)
    s[i] = log ? T(double(m[i]) + std::log(double(s[i]))) : T(1) / s[i];
  for (int64_t c = 0; c < C; ++c) {
    const T* xc = x + c * inner;
    T* yc = y + c * inner;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) yc[i] = log ? xc[i] - s[i] : yc[i] * s[i];
  }
}

template <class T>
void strided_backward(const T* y, const T* dy, T* dx, int64_t C, int64_t inner, int64_t w,
                      bool log) {
  T s[kLanes];
  for (int64_t i = 0; i < w; ++i) s[i] = T(0);
  for (int64_t c = 0; c < C; ++c) {
    const T *yc = y + c * inner, *dyc = dy + c * inner;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) s[i] += log ? dyc[i] : dyc[i] * yc[i];
  }
  for (int64_t c = 0; c < C; ++c) {
    const T *yc = y + c * inner, *dyc = dy + c * inner;
    T* dxc = dx + c * inner;
    for (int64_t i = 0; i < w; ++i)
      dxc[i] = log ? dyc[i] - std::exp(yc[i]) * s[i] : yc[i] * (dyc[i] - s[i]);
  }
}

// Runs body(offset, width) over every (outer row, block of kLanes inner columns) pair.
template <class Body>
void for_each_slab(int64_t outer, int64_t C, int64_t inner, Body body) {
  int64_t blocks = (inner + kLanes - 1) / kLanes, tasks = outer * blocks;
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C * kLanes));
#pragma omp parallel for schedule(dynamic, piece) if (outer * C * inner > kParallelGrain)
  for (int64_t t = 0; t < tasks; ++t) {
    int64_t o = t / blocks, i0 = (t % blocks) * kLanes;
    body(o * C * inner + i0, std::min(kLanes, inner - i0));
  }
}

}  // namespace

template <class T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t C, int64_t inner, bool log) {
  if (inner == 1) {
    int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C));
#pragma omp parallel for schedule(dynamic, piece) if (outer * C > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) fast_row_forward(x + o * C, y + o * C, C, log);
    return;
  }
  for_each_slab(outer, C, inner, [&](int64_t base, int64_t w) {
    strided_forward(x + base, y + base, C, inner, w, log);
  });
}

template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t C, int64_t inner,
                      bool log) {
  if (inner == 1) {
    int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C));
#pragma omp parallel for schedule(dynamic, piece) if (outer * C > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o)
      fast_row_backward(y + o * C, dy + o * C, dx + o * C, C, log);
    return;
  }
  for_each_slab(outer, C, inner, [&](int64_t base, int64_t w) {
    strided_backward(y + base, dy + base, dx + base, C, inner, w, log);
  });
}

namespace ref {

template <class T>
void softmax_forward(const T* x, T* y, int64_t outer, int64_t C, int64_t inner, bool log) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      ref_row_forward(x + o * C * inner + i, y + o * C * inner + i, C, inner, log);
}

template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t outer, int64_t C, int64_t inner,
                      bool log) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t base = o * C * inner + i;
      double s = 0;
      for (int64_t c = 0; c < C; ++c) {
        int64_t k = base + c * inner;
        s += log ? double(dy[k]) : double(dy[k]) * double(y[k]);
      }
      for (int64_t c = 0; c < C; ++c) {
        int64_t k = base + c * inner;
        dx[k] = T(log ? double(dy[k]) - std::exp(double(y[k])) * s
                      : double(y[k]) * (double(dy[k]) - s));
      }
    }
}

}  // namespace ref

#define FORGE_SOFTMAX_INSTANTIATE(T)                                                          \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t, bool);            \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool); \
  template void ref::softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t, bool);       \
  template void ref::softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);
FORGE_SOFTMAX_INSTANTIATE(float)
FORGE_SOFTMAX_INSTANTIATE(double)
#undef FORGE_SOFTMAX_INSTANTIATE

}  // namespace forge::kernels
