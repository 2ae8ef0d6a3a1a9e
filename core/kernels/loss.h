// Softmax cross-entropy kernels on dense logits [N, V] with i64 targets [N]. Forward reads the
// logits once per row (online max and rescaled sum of exponentials) and keeps only the row's
// logsumexp; backward rebuilds the softmax from it in the one pass that writes dlogits.
// kernels::ref holds the plain test oracles.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// loss[n] = (1 - eps) (lse - x[n, t]) + eps (lse - mean_c x[n, c]) with t = targets[n] and
/// eps = smoothing; lse[n] = logsumexp of row n. Rows whose target is ignore_index get loss 0 (and
/// lse 0). Every other target must lie in [0, V) (the caller checks).
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t N,
                           int64_t V, int64_t ignore_index, double smoothing);
/// dlogits[n, c] = scale[n] (exp(x[n, c] - lse[n]) - (1 - eps) [c == t] - eps / V); rows whose
/// target is ignore_index are zero.
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, const T* scale,
                            T* dlogits, int64_t N, int64_t V, int64_t ignore_index,
                            double smoothing);

namespace ref {
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t N,
                           int64_t V, int64_t ignore_index, double smoothing);
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, const T* scale,
                            T* dlogits, int64_t N, int64_t V, int64_t ignore_index,
                            double smoothing);
}  // namespace ref

}  // namespace forge::kernels
