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
  // NaN has no integer value (the conversion is undefined); p is NaN already and carries it.
  return p * bits_to_float((int32_t(n == n ? n : 0.0f) + 127) << 23);
}
inline double exp(double x) { return std::exp(x); }

/// tanh via exp: 1 - 2 / (e^{2x} + 1), exact enough in f32 across the range (saturates cleanly).
inline float tanh(float x) {
  float e = exp(2.0f * x);
  return 1.0f - 2.0f / (e + 1.0f);
}
inline double tanh(double x) { return std::tanh(x); }

/// erf for f32 from e^{-x^2}: Abramowitz & Stegun 7.1.26, |error| < 1.5e-7. Callers that also
/// need e^{-x^2} (GELU's backward) use erf_with_exp to share it.
inline float erf_with_exp(float x, float exp_neg_x2) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  float r = 1.0f - p * t * exp_neg_x2;
  return x < 0.0f ? -r : r;
}
inline float erf(float x) { return erf_with_exp(x, exp(-x * x)); }
inline double erf(double x) { return std::erf(x); }

/// Standard normal CDF for f32 as erfc(|x| / sqrt 2) / 2 with Numerical Recipes' erfcc (fractional
/// error < 1.2e-7): the lower tail keeps its relative accuracy, where 1 + erf(x / sqrt 2) would
/// cancel down to an absolute error of 1e-7.
inline float normal_cdf(float x) {
  float t = 1.0f / (1.0f + 0.5f * 0.70710678118654752f * std::fabs(x));
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  // (|x| / sqrt 2)^2 as x^2 / 2: one rounding less in the exponent, whose error scales the result.
  float half_erfc = 0.5f * t * exp(p - 0.5f * x * x);
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}
inline double normal_cdf(double x) { return 0.5 * std::erfc(-x * 0.70710678118654752440); }

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// log(1 + e^x) computed without overflow: max(x, 0) + log1p(e^-|x|).
inline float log1pexp(float x) { return std::fmax(x, 0.0f) + std::log1p(exp(-std::fabs(x))); }
inline double log1pexp(double x) { return std::fmax(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

}  // namespace forge::vm
