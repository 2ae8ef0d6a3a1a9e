// The smooth load estimator of noisy top-k gating (Shazeer et al. 2017) as one pass over the
// router's [N, E] logits, forward and backward: the composite of gathers, a where and the normal
// CDF costs a dozen small ops per MoE layer and step. kernels::ref is the plain double-precision
// version the parity tests compare against.
#pragma once

#include <cstdint>

namespace forge::kernels {

/// Row n of `top` [N, k+1] holds the indices of noisy[n]'s k+1 largest entries, largest first.
/// z[n, e] = (clean[n, e] - threshold) / noise_std[n, e], the threshold being noisy[n, top[n, k]]
/// (the (k+1)-th largest) when e is among top[n, 0..k-1], else noisy[n, top[n, k-1]] (the k-th);
/// load[e] = sum_n Phi(z[n, e]). All buffers dense row-major.
template <class T>
void topk_load_forward(const T* clean, const T* noisy, const T* noise_std, const int64_t* top,
                       int64_t N, int64_t E, int64_t k, T* z, T* load);
/// Given dload [E] and the forward's z: dclean = dload phi(z) / noise_std, dnoise_std = -dclean z,
/// and each row's -sum of its dclean added to noisy at the threshold it used. Null outputs are
/// skipped.
template <class T>
void topk_load_backward(const T* noise_std, const int64_t* top, const T* z, const T* dload,
                        int64_t N, int64_t E, int64_t k, T* dclean, T* dnoisy, T* dnoise_std);

namespace ref {
template <class T>
void topk_load_forward(const T* clean, const T* noisy, const T* noise_std, const int64_t* top,
                       int64_t N, int64_t E, int64_t k, T* z, T* load);
template <class T>
void topk_load_backward(const T* noise_std, const int64_t* top, const T* z, const T* dload,
                        int64_t N, int64_t E, int64_t k, T* dclean, T* dnoisy, T* dnoise_std);
}  // namespace ref

}  // namespace forge::kernels
