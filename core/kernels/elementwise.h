// Elementwise kernels on raw buffers. Unary ops take dense buffers; binary ops take strides for
// each input (0 on broadcast dimensions) and write a dense output. Every kernel has a plain
// reference in kernels::ref that the parity tests compare against.
#pragma once

#include <cstdint>

namespace forge::kernels {

enum class Unary {
  neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu, gelu, gelu_tanh, silu, log_sigmoid,
  normal_cdf,
  softplus,    // p.a = beta, p.b = threshold
  clamp,       // p.a = low, p.b = high
  add_scalar,  // p.a = s
  mul_scalar,  // p.a = s
  pow_scalar,  // p.a = exponent
};
struct UnaryParams {
  double a = 0.0, b = 0.0;
};
enum class Binary { add, sub, mul, div, pow, minimum, maximum };

/// y = f(x) over n dense elements.
template <class T>
void unary_forward(Unary op, const T* x, T* y, int64_t n, UnaryParams p = {});
/// dx = dy * f'(x); `y` is the forward output (ops whose derivative is cheaper from y read it).
template <class T>
void unary_backward(Unary op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
                    UnaryParams p = {});
/// out = a (op) b with per-input strides over `shape` (row-major dense output).
template <class T>
void binary_forward(Binary op, const T* a, const int64_t* a_strides, const T* b,
                    const int64_t* b_strides, T* out, const int64_t* shape, int ndim);
/// out[i] = cond[i] != 0 ? a[i] : b[i] over n dense elements.
template <class T>
void select(const T* cond, const T* a, const T* b, T* out, int64_t n);
/// out[j] = sum of x over the dims where keep[d] is false; x dense with `shape`, out dense with
/// the kept dims.
template <class T>
void sum_dims(const T* x, const int64_t* shape, const bool* reduce, int ndim, T* out);

namespace ref {
template <class T>
void unary_forward(Unary op, const T* x, T* y, int64_t n, UnaryParams p = {});
template <class T>
void unary_backward(Unary op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
                    UnaryParams p = {});
template <class T>
void binary_forward(Binary op, const T* a, const int64_t* a_strides, const T* b,
                    const int64_t* b_strides, T* out, const int64_t* shape, int ndim);
template <class T>
void select(const T* cond, const T* a, const T* b, T* out, int64_t n);
template <class T>
void sum_dims(const T* x, const int64_t* shape, const bool* reduce, int ndim, T* out);
}  // namespace ref

}  // namespace forge::kernels
