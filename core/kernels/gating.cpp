// topk_load forward and backward: the per-row threshold choice, then the CDF and the density as
// flat loops vecmath vectorises (f32: its erfc-based normal_cdf, accurate in the lower tail).
#include "core/kernels/gating.h"
#include "core/kernels/isa.h"

#include <cmath>
#include <vector>

#include "core/kernels/vecmath.h"

namespace forge::kernels {
namespace {

constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// Marks the k largest experts of row n in `in_top` (size E), as the threshold choice needs.
void mark_top(const int64_t* top_row, int64_t E, int64_t k, std::vector<uint8_t>& in_top) {
  in_top.assign(size_t(E), 0);
  for (int64_t j = 0; j < k; ++j) in_top[size_t(top_row[j])] = 1;
}

// z for every entry: the row logic (which threshold) stays out of the loops that evaluate the CDF
// and the density, so those vectorise.
template <class T>
void standardise(const T* clean, const T* noisy, const T* noise_std, const int64_t* top,
                 int64_t N, int64_t E, int64_t k, T* z) {
  std::vector<uint8_t> in_top;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* t = top + n * (k + 1);
    mark_top(t, E, k, in_top);
    const T stay = noisy[n * E + t[k]], enter = noisy[n * E + t[k - 1]];
    for (int64_t e = 0; e < E; ++e) {
      const int64_t i = n * E + e;
      z[i] = (clean[i] - (in_top[size_t(e)] ? stay : enter)) / noise_std[i];
    }
  }
}

// The CDF and the density over flat arrays, compiled for AVX-512, AVX2 and baseline x86-64 and
// picked at load time, as the elementwise kernels are.
template <class T>
FORGE_CLONES
void cdf_of(const T* z, T* p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = vm::normal_cdf(z[i]);
}

// g = dload_e phi(z) / noise_std over [N, E].
template <class T>
FORGE_CLONES
void density_grad(const T* z, const T* noise_std, const T* dload, int64_t N, int64_t E, T* g) {
  for (int64_t n = 0; n < N; ++n) {
    const T* zr = z + n * E;
    const T* sr = noise_std + n * E;
    T* gr = g + n * E;
#pragma omp simd
    for (int64_t e = 0; e < E; ++e)
      gr[e] = dload[e] * T(kInvSqrt2Pi) * vm::exp(T(-0.5) * zr[e] * zr[e]) / sr[e];
  }
}

}  // namespace

template <class T>
void topk_load_forward(const T* clean, const T* noisy, const T* noise_std, const int64_t* top,
                       int64_t N, int64_t E, int64_t k, T* z, T* load) {
  standardise(clean, noisy, noise_std, top, N, E, k, z);
  std::vector<T> p(size_t(N * E));
  T* pp = p.data();
  cdf_of(z, pp, N * E);
  std::vector<double> sum(size_t(E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) sum[size_t(e)] += double(pp[n * E + e]);
  for (int64_t e = 0; e < E; ++e) load[e] = T(sum[size_t(e)]);
}

template <class T>
void topk_load_backward(const T* noise_std, const int64_t* top, const T* z, const T* dload,
                        int64_t N, int64_t E, int64_t k, T* dclean, T* dnoisy, T* dnoise_std) {
  // g = d load_e / d clean = dload_e phi(z) / noise_std; the threshold enters with the opposite
  // sign and the noise scale through z.
  std::vector<T> g(size_t(N * E));
  T* gp = g.data();
  density_grad(z, noise_std, dload, N, E, gp);
  if (dclean)
    for (int64_t i = 0; i < N * E; ++i) dclean[i] = gp[i];
  if (dnoise_std)
    for (int64_t i = 0; i < N * E; ++i) dnoise_std[i] = -gp[i] * z[i];
  if (!dnoisy) return;
  for (int64_t i = 0; i < N * E; ++i) dnoisy[i] = T(0);
  std::vector<uint8_t> in_top;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* t = top + n * (k + 1);
    mark_top(t, E, k, in_top);
    T to_stay = 0, to_enter = 0;
    for (int64_t e = 0; e < E; ++e) (in_top[size_t(e)] ? to_stay : to_enter) -= gp[n * E + e];
    dnoisy[n * E + t[k]] += to_stay;
    dnoisy[n * E + t[k - 1]] += to_enter;
  }
}

namespace ref {

template <class T>
void topk_load_forward(const T* clean, const T* noisy, const T* noise_std, const int64_t* top,
                       int64_t N, int64_t E, int64_t k, T* z, T* load) {
  for (int64_t e = 0; e < E; ++e) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      bool in = false;
      for (int64_t j = 0; j < k; ++j) in = in || top[n * (k + 1) + j] == e;
      const double threshold = noisy[n * E + top[n * (k + 1) + (in ? k : k - 1)]];
      const double zz = (double(clean[n * E + e]) - threshold) / double(noise_std[n * E + e]);
      z[n * E + e] = T(zz);
      sum += 0.5 * std::erfc(-zz / std::sqrt(2.0));
    }
    load[e] = T(sum);
  }
}

template <class T>
void topk_load_backward(const T* noise_std, const int64_t* top, const T* z, const T* dload,
                        int64_t N, int64_t E, int64_t k, T* dclean, T* dnoisy, T* dnoise_std) {
  for (int64_t i = 0; dnoisy && i < N * E; ++i) dnoisy[i] = T(0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) {
      bool in = false;
      for (int64_t j = 0; j < k; ++j) in = in || top[n * (k + 1) + j] == e;
      const int64_t i = n * E + e;
      const double zz = double(z[i]);
      const double g = double(dload[e]) * std::exp(-0.5 * zz * zz) / std::sqrt(2.0 * M_PI) /
                       double(noise_std[i]);
      if (dclean) dclean[i] = T(g);
      if (dnoise_std) dnoise_std[i] = T(-g * zz);
      if (dnoisy) dnoisy[n * E + top[n * (k + 1) + (in ? k : k - 1)]] += T(-g);
    }
}

}  // namespace ref

#define FORGE_INSTANTIATE_GATING(T)                                                             \
  template void topk_load_forward<T>(const T*, const T*, const T*, const int64_t*, int64_t,     \
                                     int64_t, int64_t, T*, T*);                                 \
  template void topk_load_backward<T>(const T*, const int64_t*, const T*, const T*, int64_t,    \
                                      int64_t, int64_t, T*, T*, T*);                            \
  template void ref::topk_load_forward<T>(const T*, const T*, const T*, const int64_t*,         \
                                          int64_t, int64_t, int64_t, T*, T*);                   \
  template void ref::topk_load_backward<T>(const T*, const int64_t*, const T*, const T*,        \
                                           int64_t, int64_t, int64_t, T*, T*, T*);
FORGE_INSTANTIATE_GATING(float)
FORGE_INSTANTIATE_GATING(double)
#undef FORGE_INSTANTIATE_GATING

}  // namespace forge::kernels
