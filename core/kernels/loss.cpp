// Cross-entropy kernels, the hot path of every language model (2048 x 50257 f32 logits are
// 400 MB). Forward: one read of each row, in 1024-element blocks that stay in L1 between the
// block max and the exponential sum (online softmax). Backward: one read, one write. Rows with
// NaN or inf fall back to exact libm math so non-finite logits give PyTorch's answers.
#include "core/kernels/loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/kernels/vecmath.h"

namespace forge::kernels {
namespace {

constexpr int64_t kBlock = 1024;  // L1-resident block; f32 partial sums stay this short
// Rows are handed out dynamically in pieces of about this many elements, so a preempted thread on
// a shared machine delays the others by one piece, not by half the job.
constexpr int64_t kParallelGrain = 16384;

#define FORGE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

struct RowStats {
  double lse;
  double sum;   // sum of the logits (label smoothing reads their mean)
  bool finite;  // false: a NaN or inf was seen and nothing else is valid
};

template <class T>
FORGE_CLONES RowStats row_stats(const T* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity(), s = 0, total = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T bm = -std::numeric_limits<T>::infinity(), probe = T(0), bs = T(0);
#pragma omp simd reduction(max : bm) reduction(+ : probe, bs)
    for (int64_t i = b; i < e; ++i) {
      bm = x[i] > bm ? x[i] : bm;  // not std::max: GCC vectorises only this form
      probe += x[i] * T(0);        // NaN exactly when x is NaN or inf
      bs += x[i];
    }
    if (probe != T(0)) return {0, 0, false};
    if (double(bm) > m) {
      s *= std::exp(m - double(bm));  // rescale the running sum to the new maximum
      m = double(bm);
    }
    T tm = T(m), es = T(0);
#pragma omp simd reduction(+ : es)
    for (int64_t i = b; i < e; ++i) es += vm::exp(x[i] - tm);
    s += double(es);
    total += double(bs);
  }
  return {m + std::log(s), total, true};
}

// Exact stats in f64 with libm, for rows holding NaN or inf.
template <class T>
RowStats exact_row_stats(const T* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity(), s = 0, total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = double(x[i]);
    if (v > m || v != v) m = v;
    total += v;
  }
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return {m + std::log(s), total, true};
}

// d = a * exp(x - lse) - off: the softmax scaled by the row's weight, minus the smoothing mass.
template <class T>
FORGE_CLONES void row_grad(const T* x, T* d, int64_t n, T lse, T a, T off) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = a * vm::exp(x[i] - lse) - off;
}

template <class T>
T row_loss(const RowStats& st, double target_logit, int64_t V, double smoothing) {
  double nll = st.lse - target_logit;
  if (smoothing == 0.0) return T(nll);
  return T((1.0 - smoothing) * nll + smoothing * (st.lse - st.sum / double(V)));
}

}  // namespace

template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t N,
                           int64_t V, int64_t ignore_index, double smoothing) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
#pragma omp parallel for schedule(dynamic, piece) if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) {
      loss[n] = lse[n] = T(0);
      continue;
    }
    const T* x = logits + n * V;
    RowStats st = row_stats(x, V);
    if (!st.finite) st = exact_row_stats(x, V);
    lse[n] = T(st.lse);
    loss[n] = row_loss<T>(st, double(x[targets[n]]), V, smoothing);
  }
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, const T* scale,
                            T* dlogits, int64_t N, int64_t V, int64_t ignore_index,
                            double smoothing) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
#pragma omp parallel for schedule(dynamic, piece) if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* d = dlogits + n * V;
    if (targets[n] == ignore_index) {
      std::memset(d, 0, size_t(V) * sizeof(T));
      continue;
    }
    T a = scale[n];
    row_grad(logits + n * V, d, V, lse[n], a, T(double(a) * smoothing / double(V)));
    d[targets[n]] -= T(double(a) * (1.0 - smoothing));
  }
}

namespace ref {

template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t N,
                           int64_t V, int64_t ignore_index, double smoothing) {
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == ignore_index) {
      loss[n] = lse[n] = T(0);
      continue;
    }
    RowStats st = exact_row_stats(logits + n * V, V);
    lse[n] = T(st.lse);
    loss[n] = row_loss<T>(st, double(logits[n * V + targets[n]]), V, smoothing);
  }
}

template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, const T* scale,
                            T* dlogits, int64_t N, int64_t V, int64_t ignore_index,
                            double smoothing) {
  for (int64_t n = 0; n < N; ++n) {
    bool ignored = targets[n] == ignore_index;
    for (int64_t c = 0; c < V; ++c) {
      double p = std::exp(double(logits[n * V + c]) - double(lse[n]));
      double target = (c == targets[n] ? 1.0 - smoothing : 0.0) + smoothing / double(V);
      dlogits[n * V + c] = ignored ? T(0) : T(double(scale[n]) * (p - target));
    }
  }
}

}  // namespace ref

#define FORGE_LOSS_INSTANTIATE(T)                                                                 \
  template void cross_entropy_forward<T>(const T*, const int64_t*, T*, T*, int64_t, int64_t,      \
                                         int64_t, double);                                        \
  template void cross_entropy_backward<T>(const T*, const int64_t*, const T*, const T*, T*,       \
                                          int64_t, int64_t, int64_t, double);                     \
  template void ref::cross_entropy_forward<T>(const T*, const int64_t*, T*, T*, int64_t, int64_t, \
                                              int64_t, double);                                   \
  template void ref::cross_entropy_backward<T>(const T*, const int64_t*, const T*, const T*, T*,  \
                                               int64_t, int64_t, int64_t, double);
FORGE_LOSS_INSTANTIATE(float)
FORGE_LOSS_INSTANTIATE(double)
#undef FORGE_LOSS_INSTANTIATE
#undef FORGE_CLONES

}  // namespace forge::kernels
