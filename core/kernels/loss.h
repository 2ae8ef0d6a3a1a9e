// Softmax losses on dense logits [N, V] with i64 targets [N]: cross-entropy, and the KL divergence
// of knowledge distillation between a student's and a teacher's logits. Forward reads each row
// once (online max and rescaled sums of exponentials) and keeps only per-row logsumexps (and the
// row's KL where backward needs it); backward rebuilds the softmaxes from them in the one pass that
// writes the gradient. kernels::ref holds the plain test oracles.
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

/// kl[n] = KL(p_t || p_s) of row n (reverse: KL(p_s || p_t)), p_s = softmax(student[n] / temp),
/// p_t = softmax(teacher[n] / temp), not scaled by temp^2; lse_s[n], lse_t[n] = logsumexp of
/// student[n] / temp and teacher[n] / temp. Rows whose target is ignore_index get 0 in all three;
/// targets may be null (every row scored).
template <class T>
void kd_kl_div_forward(const T* student, const T* teacher, const int64_t* targets, T* kl, T* lse_s,
                       T* lse_t, int64_t N, int64_t V, int64_t ignore_index, double temp,
                       bool reverse);
/// dstudent[n] = scale[n] d kl[n] / d student[n]: scale[n] (p_s - p_t) / temp, reverse
/// scale[n] p_s ((log p_s - log p_t) - kl[n]) / temp (kl is read only when reverse); rows whose
/// target is ignore_index are zero.
template <class T>
void kd_kl_div_backward(const T* student, const T* teacher, const int64_t* targets, const T* lse_s,
                        const T* lse_t, const T* kl, const T* scale, T* dstudent, int64_t N,
                        int64_t V, int64_t ignore_index, double temp, bool reverse);

namespace ref {
template <class T>
void cross_entropy_forward(const T* logits, const int64_t* targets, T* loss, T* lse, int64_t N,
                           int64_t V, int64_t ignore_index, double smoothing);
template <class T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* lse, const T* scale,
                            T* dlogits, int64_t N, int64_t V, int64_t ignore_index,
                            double smoothing);
template <class T>
void kd_kl_div_forward(const T* student, const T* teacher, const int64_t* targets, T* kl, T* lse_s,
                       T* lse_t, int64_t N, int64_t V, int64_t ignore_index, double temp,
                       bool reverse);
template <class T>
void kd_kl_div_backward(const T* student, const T* teacher, const int64_t* targets, const T* lse_s,
                        const T* lse_t, const T* kl, const T* scale, T* dstudent, int64_t N,
                        int64_t V, int64_t ignore_index, double temp, bool reverse);
}  // namespace ref

}  // namespace forge::kernels
