// Each uniform and each normal uses two 32-bit words (53-bit uniforms, so f64 draws are exact
// enough for gradient checks); dropout uses one word per element.
#include "core/kernels/random.h"

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

// Block b decides elements 4b .. 4b+3, one word each.
template <class T>
void fill_dropout_mask(T* mask, int64_t n, double p, const GeneratorState& g, uint64_t first_block) {
  T scale = T(1.0 / (1.0 - p));
  float threshold = float(p);
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t b = 0; b < blocks; ++b) {
    auto w = philox(g.seed, g.stream, first_block + uint64_t(b));
    for (int64_t k = 0; k < 4 && 4 * b + k < n; ++k)
      mask[4 * b + k] = uniform_from_bits(w[size_t(k)]) >= threshold ? scale : T(0);
  }
}

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
