// Philox4x32-10 as in Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11).
#include "core/rng.h"

#include <cmath>

namespace forge {

std::array<uint32_t, 4> philox(uint64_t seed, uint64_t stream, uint64_t index) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0 = uint32_t(index), c1 = uint32_t(index >> 32), c2 = uint32_t(stream),
           c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(M0) * c0, p1 = uint64_t(M1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += W0;
    k1 += W1;
  }
  return {c0, c1, c2, c3};
}

uint64_t rng_stream(std::string_view purpose, uint64_t step) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, then mixed with the step
  for (char ch : purpose) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  h ^= step + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().set_state({seed, 0, 0}); }

double erfinv(double y) {
  if (y <= -1.0) return -INFINITY;
  if (y >= 1.0) return INFINITY;
  // Giles' single-precision approximation as a start, then Newton steps on erf(x) - y.
  double w = -std::log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
    x = p * y;
  } else {
    w = std::sqrt(w) - 3.0;
    double p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
    x = p * y;
  }
  for (int i = 0; i < 2; ++i) {
    double err = std::erf(x) - y;
    x -= err / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
  }
  return x;
}

}  // namespace forge
