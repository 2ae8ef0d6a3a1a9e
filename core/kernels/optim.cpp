// The update loops are the whole optimizer step, so they are vectorised for AVX-512, AVX2 and
// baseline x86-64 (target_clones) and split across threads only above a grain where waking a
// second thread pays off.
#include "core/kernels/optim.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>

namespace forge::kernels {
namespace {
constexpr int64_t kParallelGrain = 1 << 15;
}  // namespace

// The lines mirror torch: param.mul_(decay); exp_avg.mul_(b1).add_(g, alpha=1-b1);
// exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2); denom = exp_avg_sq.sqrt() / bc2_sqrt + eps;
// param.addcdiv_(exp_avg, denom, value=-step_size).
template <class T>
FORGE_CLONES void adamw_update(T* p, const T* g, T* m, T* v, int64_t n,
                               const AdamWCoeffs<T>& c) {
  const AdamWCoeffs<T> k = c;
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i] * k.decay;
    T mi = m[i] * k.beta1 + k.one_minus_beta1 * g[i];
    T vi = v[i] * k.beta2 + k.one_minus_beta2 * g[i] * g[i];
    m[i] = mi;
    v[i] = vi;
    T denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
    p[i] = pi + k.neg_step_size * mi / denom;
  }
}

template <class T>
FORGE_CLONES void sgd_update(T* p, const T* g, int64_t n, T wd, T neg_lr) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] + neg_lr * (g[i] + wd * p[i]);
}

template <class T>
FORGE_CLONES void sgd_momentum_update(T* p, const T* g, T* buf, int64_t n, T wd, T neg_lr,
                                      T momentum, bool first, bool nesterov) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] + wd * p[i];
    T b = first ? d : buf[i] * momentum + d;
    buf[i] = b;
    p[i] = p[i] + neg_lr * (nesterov ? d + momentum * b : b);
  }
}

template <class T>
FORGE_CLONES double sum_squares(const T* g, int64_t n) {
  double acc = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) acc += double(g[i]) * double(g[i]);
  return acc;
}

template <class T>
FORGE_CLONES void scale(T* g, int64_t n, T factor) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) g[i] *= factor;
}

template <class T>
FORGE_CLONES void scale_block_sum_squares(T* g, int64_t n, T factor, int64_t block,
                                          double* sums) {
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t k = 0; k < blocks; ++k) {
    T* x = g + k * block;
    const int64_t m = std::min(block, n - k * block);
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < m; ++i) {
      const T y = x[i] * factor;
      x[i] = y;
      acc += double(y) * double(y);
    }
    sums[k] = acc;
  }
}

// x*0 is NaN exactly for NaN and infinite x, so one vectorisable sum finds both.
template <class T>
FORGE_CLONES bool all_finite(const T* g, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += g[i] * T(0);
  return acc == acc;
}

namespace ref {

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWCoeffs<T>& c) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] *= c.decay;
    m[i] = m[i] * c.beta1 + c.one_minus_beta1 * g[i];
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * g[i] * g[i];
    p[i] += c.neg_step_size * m[i] / (std::sqrt(v[i]) / c.bc2_sqrt + c.eps);
  }
}

template <class T>
void sgd_momentum_update(T* p, const T* g, T* buf, int64_t n, T wd, T neg_lr, T momentum,
                         bool first, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] + wd * p[i];
    buf[i] = first ? d : buf[i] * momentum + d;
    p[i] += neg_lr * (nesterov ? d + momentum * buf[i] : buf[i]);
  }
}

}  // namespace ref

#define FORGE_INSTANTIATE(T)                                                                    \
  template void adamw_update<T>(T*, const T*, T*, T*, int64_t, const AdamWCoeffs<T>&);          \
  template void sgd_update<T>(T*, const T*, int64_t, T, T);                                     \
  template void sgd_momentum_update<T>(T*, const T*, T*, int64_t, T, T, T, bool, bool);         \
  template double sum_squares<T>(const T*, int64_t);                                            \
  template void scale<T>(T*, int64_t, T);                                                       \
  template void scale_block_sum_squares<T>(T*, int64_t, T, int64_t, double*);                   \
  template bool all_finite<T>(const T*, int64_t);                                               \
  template void ref::adamw_update<T>(T*, const T*, T*, T*, int64_t, const AdamWCoeffs<T>&);     \
  template void ref::sgd_momentum_update<T>(T*, const T*, T*, int64_t, T, T, T, bool, bool);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::kernels
