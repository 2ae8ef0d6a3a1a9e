// Branch-free float math that compilers vectorise inside `#pragma omp simd` loops (libm calls do
// not vectorise without -ffast-math, which would break NaN detection). Accurate to a few ulp in
// f32; the f64 overloads forward to libm because f64 serves gradient checks, not speed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace forge::vm {

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

/// e^x for f32: range reduction x = n ln2 + r, degree-6 polynomial on r, exponent by bit shift.
inline float exp(float x) {
  // Comparisons, not fminf/fmaxf (library calls that stop vectorisation); NaN passes through.
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bits_to_float((int32_t(n) + 127) << 23);
}
inline double exp(double x) { return std::exp(x); }

/// tanh via exp: 1 - 2 / (e^{2x} + 1), exact enough in f32 across the range (saturates cleanly).
inline float tanh(float x) {
  float e = exp(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}
inline double tanh(double x) { return std::tanh(x); }

/// erf for f32 (Abramowitz-Stegun 7.1.26 is too coarse; this is a rational fit with |err| < 2e-7).
inline float erf(float x) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.5f * a);
  // Numerical Recipes erfc Chebyshev form, accurate to 1.2e-7 relative.
  float y = t * exp(-a * a - 1.26551223f +
                    t * (1.00002368f +
                         t * (0.37409196f +
                              t * (0.09678418f +
                                   t * (-0.18628806f +
                                        t * (0.27886807f +
                                             t * (-1.13520398f +
                                                  t * (1.48851587f +
                                                       t * (-0.82215223f + t * 0.17087277f)))))))));
  float r = 1.0f - y;
  return std::copysign(r, x);
}
inline double erf(double x) { return std::erf(x); }

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// log(1 + e^x) computed without overflow: max(x, 0) + log1p(e^-|x|).
inline float log1pexp(float x) { return std::fmax(x, 0.0f) + std::log1p(exp(-std::fabs(x))); }
inline double log1pexp(double x) { return std::fmax(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

}  // namespace forge::vm
