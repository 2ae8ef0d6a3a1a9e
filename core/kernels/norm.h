// LayerNorm and RMSNorm kernels over the last dimension of a dense [N, C] buffer. Forward saves
// per-row statistics (mean, rstd) so backward is one fused pass producing dx and the dweight /
// dbias partial sums; those are reduced over fixed row chunks in a fixed order, so results do not
// depend on the thread count. kernels::ref holds the plain test oracles.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// y = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(var + eps) (biased variance).
/// w and b may be null (no affine part); mean and rstd [N] receive the row statistics.
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                        int64_t C, double eps);
/// From dy: dx (overwritten) and dw, db [C] (overwritten). Any of dx, dw, db may be null (not
/// wanted); w may be null (no affine part).
template <class T>
void layer_norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx,
                         T* dw, T* db, int64_t N, int64_t C);

/// y = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps); w may be null.
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps);
/// From dy: dx and dw [C] (overwritten, either may be null); w may be null.
template <class T>
void rms_norm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t N,
                       int64_t C);

namespace ref {
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t N,
                        int64_t C, double eps);
template <class T>
void layer_norm_backward(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, T* dx,
                         T* dw, T* db, int64_t N, int64_t C);
template <class T>
void rms_norm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t C, double eps);
template <class T>
void rms_norm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t N,
                       int64_t C);
}  // namespace ref

}  // namespace forge::kernels
