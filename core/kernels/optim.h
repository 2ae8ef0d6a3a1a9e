// Fused parameter-update and gradient-statistics kernels behind optim/: one pass over a
// parameter's elements per call, in place. Plain references in kernels::ref are the test oracle.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// Per-step constants of one AdamW update (torch 1.13 _single_tensor_adamw).
template <class T>
struct AdamWCoeffs {
  T decay;          // 1 - lr*wd
  T beta1, one_minus_beta1, beta2, one_minus_beta2;
  T bc2_sqrt;       // sqrt(1 - beta2^t)
  T eps;
  T neg_step_size;  // -lr / (1 - beta1^t)
};

/// p, m, v [n] updated in place from g [n].
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWCoeffs<T>& c);
/// p -= lr * (g + wd*p), with neg_lr = -lr.
template <class T>
void sgd_update(T* p, const T* g, int64_t n, T wd, T neg_lr);
/// torch.optim.SGD with momentum, dampening 0: d = g + wd*p; buf = first ? d : momentum*buf + d;
/// p -= lr * (nesterov ? d + momentum*buf : buf).
template <class T>
void sgd_momentum_update(T* p, const T* g, T* buf, int64_t n, T wd, T neg_lr, T momentum,
                         bool first, bool nesterov);
/// Sum of squares, accumulated in double.
template <class T>
double sum_squares(const T* g, int64_t n);
/// g *= factor.
template <class T>
void scale(T* g, int64_t n, T factor);
/// g *= factor, and the sum of squares of the scaled g accumulated in double, in one pass: the
/// gradient arena's division by the number of targets, which also yields the norm for clipping
/// and, when it is not finite, tells that a gradient is not.
template <class T>
double scale_sum_squares(T* g, int64_t n, T factor);
/// False when any element is NaN or infinite.
template <class T>
bool all_finite(const T* g, int64_t n);

namespace ref {
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWCoeffs<T>& c);
template <class T>
void sgd_momentum_update(T* p, const T* g, T* buf, int64_t n, T wd, T neg_lr, T momentum,
                         bool first, bool nesterov);
}  // namespace ref

}  // namespace forge::kernels
