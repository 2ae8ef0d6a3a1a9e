// Selection and moment reductions along one axis: max/min with the arg position, variance, top-k.
// Every kernel sees its input as a dense [outer, n, inner] block reduced over the middle axis, the
// shape any single dim (or run of adjacent dims) of a contiguous tensor folds into. NaN counts as
// the most extreme value for max, min and top-k (as in PyTorch), so it propagates. Every kernel has
// a plain reference in kernels::ref that the parity tests compare against.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// out[o, i] = max (largest) or min over j of x[o, j, i]; arg[o, i] = the first j holding it.
/// Needs n >= 1. `out` or `arg` may be null when not wanted.
template <class T>
void extreme_dim(const T* x, int64_t outer, int64_t n, int64_t inner, bool largest, T* out,
                 int64_t* arg);
/// Gradient of a full max/min: dx[i] = g / count where x[i] equals `value` (or both are NaN),
/// else 0; count is the number of such ties.
template <class T>
void spread_to_ties(const T* x, int64_t n, T value, T g, T* dx);
/// mean[o, i] and var[o, i] = sum over j of (x[o, j, i] - mean)^2 / (n - correction), accumulated
/// in f64 with two passes (exact enough that no Welford update is needed).
template <class T>
void var_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t correction, T* var,
             T* mean);
/// values[o, r, i] = the r-th largest (or smallest) x[o, :, i], indices its j; ties keep the
/// lower j first. Needs 0 <= k <= n.
template <class T>
void topk_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest,
              T* values, int64_t* indices);

namespace ref {
template <class T>
void extreme_dim(const T* x, int64_t outer, int64_t n, int64_t inner, bool largest, T* out,
                 int64_t* arg);
template <class T>
void spread_to_ties(const T* x, int64_t n, T value, T g, T* dx);
template <class T>
void var_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t correction, T* var,
             T* mean);
template <class T>
void topk_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest,
              T* values, int64_t* indices);
}  // namespace ref

}  // namespace forge::kernels
