// Elementwise ops with numpy broadcasting. Binary ops align shapes from the right; size-1 and
// missing dimensions broadcast. sum_to() is the one helper every binary backward uses to undo it.
#pragma once

#include "core/tensor.h"

namespace forge {

/// Shape of broadcasting a with b; throws naming both shapes when they are incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
/// Sums `g` over the dimensions that broadcasting added or stretched, giving a tensor of `shape`.
Tensor sum_to(const Tensor& g, const Shape& shape);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
/// a ** b elementwise (a > 0 where b is not an integer).
Tensor pow(const Tensor& a, const Tensor& b);
/// Elementwise min / max; on ties the gradient is split evenly, as PyTorch does.
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApprox { none, tanh };
/// x * Phi(x) (erf form), or the tanh approximation used by GPT-2.
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);
Tensor silu(const Tensor& x);
/// log(sigmoid(x)), stable for large |x|.
Tensor log_sigmoid(const Tensor& x);
/// Standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2, elementwise; gradient
/// exp(-x^2 / 2) / sqrt(2 pi).
Tensor normal_cdf(const Tensor& x);
/// log(1 + exp(beta x)) / beta, linear above `threshold` as in PyTorch.
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// Gradient flows where low <= x <= high.
Tensor clamp(const Tensor& x, double low, double high);

/// cond ? a : b, all three broadcast together; cond is any dtype, nonzero meaning true.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// x with `value` where mask (broadcast to x) is nonzero.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
/// Inverted dropout: zeroes with probability p and scales survivors by 1/(1-p); identity when
/// !training or p == 0. The mask comes from the counter-based generator.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen = default_generator());

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator-(double s, const Tensor& a) { return add(neg(a), s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator/(double s, const Tensor& a) { return mul(pow(a, -1.0), s); }

}  // namespace forge
