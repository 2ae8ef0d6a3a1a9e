// Each uniform and each normal uses two 32-bit words (53-bit uniforms, so f64 draws are exact
// enough for gradient checks); dropout uses one word per element.
#include "core/kernels/random.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>

namespace forge::kernels {

template <class T>
void fill_uniform(T* out, int64_t n, double low, double high, const GeneratorState& g,
                  uint64_t first_block) {
  double scale = high - low;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    auto w = philox(g.seed, g.stream, first_block + uint64_t(i / 2));
    int k = int(i % 2) * 2;
    out[i] = T(low + scale * uniform_from_bits(w[k], w[k + 1]));
  }
}

// Block b gives elements 2b (cosine branch) and 2b + 1 (sine branch) of one Box-Muller pair.
template <class T>
void fill_normal(T* out, int64_t n, double mean, double std, const GeneratorState& g,
                 uint64_t first_block) {
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < pairs; ++b) {
    auto w = philox(g.seed, g.stream, first_block + uint64_t(b));
    double u1 = 1.0 - uniform_from_bits(w[0], w[1]);  // (0, 1]: log never sees 0
    double u2 = uniform_from_bits(w[2], w[3]);
    double r = std::sqrt(-2.0 * std::log(u1)), s, c;
    sincos(2.0 * M_PI * u2, &s, &c);
    out[2 * b] = T(mean + std * r * c);
    if (2 * b + 1 < n) out[2 * b + 1] = T(mean + std * r * s);
  }
}

template <class T>
void fill_trunc_normal(T* out, int64_t n, double mean, double std, double low, double high,
                       const GeneratorState& g, uint64_t first_block) {
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  double lo = cdf((low - mean) / std), hi = cdf((high - mean) / std);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    auto w = philox(g.seed, g.stream, first_block + uint64_t(i / 2));
    int k = int(i % 2) * 2;
    double u = lo + (hi - lo) * uniform_from_bits(w[k], w[k + 1]);
    double x = mean + std * std::sqrt(2.0) * erfinv(2.0 * u - 1.0);
    out[i] = T(std::fmin(std::fmax(x, low), high));
  }
}

namespace {
constexpr int64_t kLanes = 16;

// Philox4x32-10 (core/rng.cpp) for kLanes consecutive counters at once, lane-parallel so that the
// compiler turns the 32x32->64 multiplies into vector ones; bit-identical to philox().
FORGE_CLONES void philox_lanes(uint64_t seed, uint64_t stream, uint64_t first,
                               uint32_t (&out)[4][kLanes]) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    const uint64_t index = first + uint64_t(l);
    c0[l] = uint32_t(index);
    c1[l] = uint32_t(index >> 32);
    c2[l] = uint32_t(stream);
    c3[l] = uint32_t(stream >> 32);
  }
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const uint64_t p0 = uint64_t(M0) * c0[l], p1 = uint64_t(M1) * c2[l];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[l] ^ k0, n2 = uint32_t(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = uint32_t(p1);
      c3[l] = uint32_t(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
    k0 += W0;
    k1 += W1;
  }
  for (int64_t l = 0; l < kLanes; ++l) {
    out[0][l] = c0[l];
    out[1][l] = c1[l];
    out[2][l] = c2[l];
    out[3][l] = c3[l];
  }
}
}  // namespace

// Block b decides elements 4b .. 4b+3, one word each; blocks are generated kLanes at a time.
template <class T>
void fill_dropout_mask(T* mask, int64_t n, double p, const GeneratorState& g, uint64_t first_block) {
  const T scale = T(1.0 / (1.0 - p));
  const float threshold = float(p);
  const int64_t groups = (n + 4 * kLanes - 1) / (4 * kLanes);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t grp = 0; grp < groups; ++grp) {
    uint32_t w[4][kLanes];
    philox_lanes(g.seed, g.stream, first_block + uint64_t(grp * kLanes), w);
    const int64_t base = grp * 4 * kLanes, count = std::min<int64_t>(4 * kLanes, n - base);
    for (int64_t e = 0; e < count; ++e)
      mask[base + e] = uniform_from_bits(w[e % 4][e / 4]) >= threshold ? scale : T(0);
  }
}

namespace ref {
template <class T>
void fill_dropout_mask(T* mask, int64_t n, double p, const GeneratorState& g, uint64_t first_block) {
  for (int64_t i = 0; i < n; ++i) {
    auto w = philox(g.seed, g.stream, first_block + uint64_t(i / 4));
    mask[i] = uniform_from_bits(w[size_t(i % 4)]) >= float(p) ? T(1.0 / (1.0 - p)) : T(0);
  }
}
template void fill_dropout_mask<float>(float*, int64_t, double, const GeneratorState&, uint64_t);
template void fill_dropout_mask<double>(double*, int64_t, double, const GeneratorState&, uint64_t);
}  // namespace ref

#define FORGE_INSTANTIATE(T)                                                                     \
  template void fill_uniform<T>(T*, int64_t, double, double, const GeneratorState&, uint64_t);   \
  template void fill_normal<T>(T*, int64_t, double, double, const GeneratorState&, uint64_t);    \
  template void fill_trunc_normal<T>(T*, int64_t, double, double, double, double,                \
                                     const GeneratorState&, uint64_t);                           \
  template void fill_dropout_mask<T>(T*, int64_t, double, const GeneratorState&, uint64_t);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::kernels
