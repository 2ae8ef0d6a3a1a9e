// Cross-entropy and distillation-KL kernels, the hot path of every language model (2048 x 50257
// f32 logits are 400 MB). Forward: one read of each row, in 1024-element blocks that stay in L1
// between the block max and the exponential sums (online softmax). Backward: one read, one write.
// Rows with NaN or inf fall back to exact libm math so non-finite logits give PyTorch's answers.
#include "core/kernels/loss.h"
#include "core/kernels/isa.h"

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

// logsumexp of x / temp in f64 with libm; a NaN anywhere makes it NaN.
template <class T>
double exact_lse(const T* x, int64_t n, double temp) {
  double m = -std::numeric_limits<double>::infinity(), s = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = double(x[i]) / temp;
    if (v > m || v != v) m = v;
  }
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) / temp - m);
  return m + std::log(s);
}

// Exact stats in f64 with libm, for rows holding NaN or inf.
template <class T>
RowStats exact_row_stats(const T* x, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += double(x[i]);
  return {exact_lse(x, n, 1.0), total, true};
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

// A row of the distillation KL(p || q): p = softmax(x / temp), q = softmax(y / temp), where x is
// the teacher for forward KL and the student for reverse.
struct KLStats {
  double lse_x, lse_y, kl;
  bool finite;  // false: a NaN or inf was seen and nothing else is valid
};

// Online over both rows: with a = x / temp, b = y / temp and running maxima mx, my, the sums
// Sx = sum e^(a - mx), Sy = sum e^(b - my) and D = sum e^(a - mx) ((a - mx) - (b - my)), moved
// to new maxima as they grow. KL(p || q) = sum p (a - b) - lse_x + lse_y = D / Sx - log Sx +
// log Sy, so neither log-softmax is ever stored. Centring both rows on their maxima keeps a
// constant offset between student and teacher (which softmax ignores) out of D's f32 sums.
template <class T>
FORGE_CLONES KLStats row_kl(const T* x, const T* y, int64_t n, T inv_temp) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double mx = -inf, my = -inf, sx = 0, sy = 0, d = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T bx = -std::numeric_limits<T>::infinity(), by = bx, probe = T(0);
#pragma omp simd reduction(max : bx, by) reduction(+ : probe)
    for (int64_t i = b; i < e; ++i) {
      bx = x[i] > bx ? x[i] : bx;
      by = y[i] > by ? y[i] : by;
      probe += x[i] * T(0) + y[i] * T(0);
    }
    if (probe != T(0)) return {0, 0, 0, false};
    // Scaling by inv_temp > 0 keeps the order, so these are the maxima of a and b exactly.
    double nmx = std::max(mx, double(T(bx * inv_temp))),
           nmy = std::max(my, double(T(by * inv_temp)));
    if (b > 0) {  // before the first block there is nothing to move
      double r = std::exp(mx - nmx);
      d = (d + ((mx - nmx) - (my - nmy)) * sx) * r;
      sx *= r;
      sy *= std::exp(my - nmy);
    }
    mx = nmx;
    my = nmy;
    T tmx = T(mx), tmy = T(my), ex = T(0), ey = T(0), ed = T(0);
#pragma omp simd reduction(+ : ex, ey, ed)
    for (int64_t i = b; i < e; ++i) {
      T u = x[i] * inv_temp - tmx, v = y[i] * inv_temp - tmy, p = vm::exp(u);
      ex += p;
      ey += vm::exp(v);
      ed += p * (u - v);
    }
    sx += double(ex);
    sy += double(ey);
    d += double(ed);
  }
  return {mx + std::log(sx), my + std::log(sy), d / sx - std::log(sx) + std::log(sy), true};
}

// The definition, sum p (log p - log q), in f64 with libm: the oracle, and the fallback for rows
// holding NaN or inf (0 log 0 terms give NaN there, as in PyTorch's kl_div).
template <class T>
KLStats exact_row_kl(const T* x, const T* y, int64_t n, double temp) {
  double lse_x = exact_lse(x, n, temp), lse_y = exact_lse(y, n, temp), kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    double lp = double(x[i]) / temp - lse_x, lq = double(y[i]) / temp - lse_y;
    kl += std::exp(lp) * (lp - lq);
  }
  return {lse_x, lse_y, kl, true};
}

// Which row plays p in KL(p || q), and where the row's results go.
template <class T>
void store_kl(const KLStats& st, bool reverse, int64_t n, T* kl, T* lse_s, T* lse_t) {
  kl[n] = T(st.kl);
  lse_s[n] = T(reverse ? st.lse_x : st.lse_y);
  lse_t[n] = T(reverse ? st.lse_y : st.lse_x);
}

bool scored(const int64_t* targets, int64_t n, int64_t ignore_index) {
  return targets == nullptr || targets[n] != ignore_index;
}

// d = w (p_s - p_t), or reverse d = w p_s ((lp - lq) - kl) with lp = a - lse_s = log p_s and
// lq = b - lse_t = log p_t; a = s / temp, b = t / temp. Each log-probability is formed on its own
// (small where p matters), not as (a - b) minus a row constant: that difference would carry the
// f32 rounding of any offset between student and teacher.
template <class T>
FORGE_CLONES void row_kl_grad(const T* s, const T* t, T* d, int64_t n, T inv_temp, T lse_s, T lse_t,
                              T kl, T w, bool reverse) {
  if (reverse) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      T lp = s[i] * inv_temp - lse_s, lq = t[i] * inv_temp - lse_t;
      d[i] = w * vm::exp(lp) * ((lp - lq) - kl);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      d[i] = w * (vm::exp(s[i] * inv_temp - lse_s) - vm::exp(t[i] * inv_temp - lse_t));
  }
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

template <class T>
void kd_kl_div_forward(const T* student, const T* teacher, const int64_t* targets, T* kl, T* lse_s,
                       T* lse_t, int64_t N, int64_t V, int64_t ignore_index, double temp,
                       bool reverse) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
#pragma omp parallel for schedule(dynamic, piece) if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    if (!scored(targets, n, ignore_index)) {
      kl[n] = lse_s[n] = lse_t[n] = T(0);
      continue;
    }
    const T *x = (reverse ? student : teacher) + n * V, *y = (reverse ? teacher : student) + n * V;
    KLStats st = row_kl(x, y, V, T(1.0 / temp));
    if (!st.finite) st = exact_row_kl(x, y, V, temp);
    store_kl(st, reverse, n, kl, lse_s, lse_t);
  }
}

template <class T>
void kd_kl_div_backward(const T* student, const T* teacher, const int64_t* targets, const T* lse_s,
                        const T* lse_t, const T* kl, const T* scale, T* dstudent, int64_t N,
                        int64_t V, int64_t ignore_index, double temp, bool reverse) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, V));
#pragma omp parallel for schedule(dynamic, piece) if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* d = dstudent + n * V;
    if (!scored(targets, n, ignore_index)) {
      std::memset(d, 0, size_t(V) * sizeof(T));
      continue;
    }
    row_kl_grad(student + n * V, teacher + n * V, d, V, T(1.0 / temp), lse_s[n], lse_t[n],
                reverse ? kl[n] : T(0), T(double(scale[n]) / temp), reverse);
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

template <class T>
void kd_kl_div_forward(const T* student, const T* teacher, const int64_t* targets, T* kl, T* lse_s,
                       T* lse_t, int64_t N, int64_t V, int64_t ignore_index, double temp,
                       bool reverse) {
  for (int64_t n = 0; n < N; ++n) {
    if (!scored(targets, n, ignore_index)) {
      kl[n] = lse_s[n] = lse_t[n] = T(0);
      continue;
    }
    const T *x = (reverse ? student : teacher) + n * V, *y = (reverse ? teacher : student) + n * V;
    store_kl(exact_row_kl(x, y, V, temp), reverse, n, kl, lse_s, lse_t);
  }
}

template <class T>
void kd_kl_div_backward(const T* student, const T* teacher, const int64_t* targets, const T* lse_s,
                        const T* lse_t, const T* kl, const T* scale, T* dstudent, int64_t N,
                        int64_t V, int64_t ignore_index, double temp, bool reverse) {
  for (int64_t n = 0; n < N; ++n) {
    bool ignored = !scored(targets, n, ignore_index);
    for (int64_t c = 0; c < V; ++c) {
      double lp = double(student[n * V + c]) / temp - double(lse_s[n]);
      double lq = double(teacher[n * V + c]) / temp - double(lse_t[n]);
      double g = reverse ? std::exp(lp) * ((lp - lq) - double(kl[n])) : std::exp(lp) - std::exp(lq);
      dstudent[n * V + c] = ignored ? T(0) : T(double(scale[n]) * g / temp);
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
                                               int64_t, int64_t, int64_t, double);                \
  template void kd_kl_div_forward<T>(const T*, const T*, const int64_t*, T*, T*, T*, int64_t,     \
                                     int64_t, int64_t, double, bool);                             \
  template void kd_kl_div_backward<T>(const T*, const T*, const int64_t*, const T*, const T*,     \
                                      const T*, const T*, T*, int64_t, int64_t, int64_t, double,  \
                                      bool);                                                      \
  template void ref::kd_kl_div_forward<T>(const T*, const T*, const int64_t*, T*, T*, T*,         \
                                          int64_t, int64_t, int64_t, double, bool);               \
  template void ref::kd_kl_div_backward<T>(const T*, const T*, const int64_t*, const T*,          \
                                           const T*, const T*, const T*, T*, int64_t, int64_t,    \
                                           int64_t, double, bool);
FORGE_LOSS_INSTANTIATE(float)
FORGE_LOSS_INSTANTIATE(double)
#undef FORGE_LOSS_INSTANTIATE

}  // namespace forge::kernels
