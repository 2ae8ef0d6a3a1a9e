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
/// g *= factor, and in one pass sums[k] = the sum of squares (in double) of the scaled elements
/// [k*block, min(n, (k+1)*block)): the gradient arena's division by the number of targets, which
/// also yields the norm for clipping. A block's sum depends on its elements only, not on the
/// threads or on where a caller's range starts (at a multiple of block), so sums added in block
/// order give one norm however the buffer was split between threads or ranks.
template <class T>
void scale_block_sum_squares(T* g, int64_t n, T factor, int64_t block, double* sums);
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
