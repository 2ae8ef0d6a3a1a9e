// Fused layers and losses with hand-written backward passes: the hot paths of every model.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace forge {

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

/// Normalises over the last dimension; weight and bias [C] may be undefined (no affine part).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
/// x / sqrt(mean(x^2) + eps) * weight over the last dimension; weight may be undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

/// weight [V, C] rows at i64 `ids` (any shape) -> [..., C]. Rows equal to padding_idx (>= 0)
/// receive no gradient. An id outside [0, V) is an error naming the id and its position.
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);

enum class Reduction { mean, sum, none };
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   ///< targets equal to this contribute nothing
  double label_smoothing = 0.0;  ///< mass spread uniformly over all classes, as in PyTorch
  Reduction reduction = Reduction::mean;  ///< mean divides by the number of non-ignored targets
};
/// Fused log-softmax + negative log-likelihood: logits [N, V], i64 targets [N] -> scalar
/// (or [N] with Reduction::none). A target outside [0, V) that is not ignore_index is an error.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});

/// How kd_kl_div compares a student's and a teacher's distributions at a temperature.
struct KLDivOptions {
  double temperature = 1.0;     ///< T > 0: both logits are divided by T
  bool reverse = false;         ///< KL(p_s || p_t) (mode-seeking) instead of KL(p_t || p_s)
  int64_t ignore_index = -100;  ///< rows whose target is this are not scored
  /// mean divides by the number of scored rows (0 when none)
  Reduction reduction = Reduction::mean;
};
/// Knowledge-distillation loss T^2 KL(p_t || p_s) per row, p_s = softmax(student / T),
/// p_t = softmax(teacher / T); student and teacher logits [N, V] (same dtype), targets i64 [N] or
/// an undefined Tensor (every row scored) -> scalar (or [N] with Reduction::none; unscored rows 0).
/// Only the student receives a gradient: T (p_s - p_t) per scored row (forward KL).
/// Targets only select rows: values other than ignore_index are not checked against [0, V). The
/// teacher gets no gradient even when it requires grad: it is the fixed distribution to match.
Tensor kd_kl_div(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& targets,
                 const KLDivOptions& options = {});

/// The smooth load estimator of noisy top-k gating (Shazeer et al. 2017), fused: clean, noisy and
/// noise_std [N, E] (same dtype), 1 <= k < E -> load [E], load_e = sum_n Phi((clean[n, e] -
/// threshold[n, e]) / noise_std[n, e]) with Phi the standard normal CDF and the threshold the k-th
/// largest of noisy[n] excluding entry e: its (k+1)-th largest when e is among its k largest, else
/// its k-th. Gradients reach clean, noise_std and, through the two thresholds, noisy. `ranked`, when
/// given, is topk(noisy, k + 1, 1).indices already computed by the caller (checked for range).
Tensor topk_load(const Tensor& clean, const Tensor& noisy, const Tensor& noise_std, int64_t k,
                 const Tensor& ranked = {});

/// Cosine of the angle between a and b along dim (broadcasting), each norm clamped below by eps.
Tensor cosine_similarity(const Tensor& a, const Tensor& b, int64_t dim = -1, double eps = 1e-8);

}  // namespace forge
