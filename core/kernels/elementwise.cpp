// Elementwise kernels. Each function is defined once as a scalar lambda over a math policy: the
// fast kernels instantiate it with vm:: (vectorisable f32 math) inside OpenMP SIMD loops, the
// reference kernels with libm in plain loops. The hot loops are compiled for AVX-512, AVX2 and
// baseline x86-64, picked at load time (target_clones), so one binary runs on any x86-64.
#include "core/kernels/elementwise.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/kernels/vecmath.h"

namespace forge::kernels {
namespace {

constexpr double kSqrt2 = 1.41421356237309504880, kSqrt2OverPi = 0.79788456080286535588,
                 kInvSqrt2Pi = 0.39894228040143267794, kGeluC = 0.044715;

// GELU's backward needs Phi(x) and phi(x); both come from e^{-x^2/2}, computed once.
struct FastMath {
  template <class T> static T exp(T x) { return vm::exp(x); }
  template <class T> static T tanh(T x) { return vm::tanh(x); }
  template <class T> static T erf(T x) { return vm::erf(x); }
  template <class T> static T sigmoid(T x) { return vm::sigmoid(x); }
  template <class T> static T normal_cdf(T x) { return vm::normal_cdf(x); }
  template <class T> static void normal_cdf_pdf(T x, T& cdf, T& pdf) {
    if constexpr (std::is_same_v<T, float>) {
      float e = vm::exp(-0.5f * x * x);
      cdf = 0.5f * (1.0f + vm::erf_with_exp(x * float(1 / 1.41421356237309504880), e));
      pdf = float(0.39894228040143267794) * e;
    } else {
      cdf = 0.5 * (1.0 + std::erf(x / 1.41421356237309504880));
      pdf = 0.39894228040143267794 * std::exp(-0.5 * x * x);
    }
  }
};
struct RefMath {
  template <class T> static T exp(T x) { return T(std::exp(double(x))); }
  template <class T> static T tanh(T x) { return T(std::tanh(double(x))); }
  template <class T> static T erf(T x) { return T(std::erf(double(x))); }
  template <class T> static T sigmoid(T x) { return T(1.0 / (1.0 + std::exp(-double(x)))); }
  template <class T> static T normal_cdf(T x) { return T(0.5 * std::erfc(-double(x) / kSqrt2)); }
  template <class T> static void normal_cdf_pdf(T x, T& cdf, T& pdf) {
    cdf = T(0.5 * (1.0 + std::erf(double(x) / 1.41421356237309504880)));
    pdf = T(0.39894228040143267794 * std::exp(-0.5 * double(x) * double(x)));
  }
};

template <class T>
T log1pexp(T x) { return T(std::fmax(double(x), 0.0) + std::log1p(std::exp(-std::fabs(double(x))))); }

// Calls body(f) with f the scalar forward function of `op`.
template <class T, class M, class Body>
void with_forward(Unary op, UnaryParams p, Body body) {
  const T a = T(p.a), b = T(p.b);
  switch (op) {
    case Unary::neg: return body([](T x) { return -x; });
    case Unary::exp: return body([](T x) { return M::exp(x); });
    case Unary::log: return body([](T x) { return std::log(x); });
    case Unary::sqrt: return body([](T x) { return std::sqrt(x); });
    case Unary::rsqrt: return body([](T x) { return T(1) / std::sqrt(x); });
    case Unary::abs: return body([](T x) { return std::fabs(x); });
    case Unary::tanh: return body([](T x) { return M::tanh(x); });
    case Unary::sigmoid: return body([](T x) { return M::sigmoid(x); });
    case Unary::relu: return body([](T x) { return x > T(0) ? x : T(0); });
    case Unary::gelu:
      return body([](T x) { return T(0.5) * x * (T(1) + M::erf(x * T(1 / kSqrt2))); });
    // 0.5 x (1 + tanh u) == x sigmoid(2u): no cancellation where tanh u is near -1.
    case Unary::gelu_tanh:
      return body([](T x) {
        return x * M::sigmoid(T(2 * kSqrt2OverPi) * (x + T(kGeluC) * x * x * x));
      });
    case Unary::silu: return body([](T x) { return x * M::sigmoid(x); });
    case Unary::log_sigmoid: return body([](T x) { return -log1pexp(-x); });
    case Unary::normal_cdf: return body([](T x) { return M::normal_cdf(x); });
    case Unary::softplus:
      return body([a, b](T x) { return a * x > b ? x : log1pexp(a * x) / a; });
    case Unary::clamp: return body([a, b](T x) { return x < a ? a : (x > b ? b : x); });
    case Unary::add_scalar: return body([a](T x) { return x + a; });
    case Unary::mul_scalar: return body([a](T x) { return x * a; });
    case Unary::pow_scalar:
      if (p.a == 2.0) return body([](T x) { return x * x; });
      return body([a](T x) { return T(std::pow(x, a)); });
  }
}

// Calls body(g) with g(x, y, dy) = dy * f'(x), where y = f(x) is available for output-based rules.
template <class T, class M, class Body>
void with_backward(Unary op, UnaryParams p, Body body) {
  const T a = T(p.a), b = T(p.b);
  switch (op) {
    case Unary::neg: return body([](T, T, T dy) { return -dy; });
    case Unary::exp: return body([](T, T y, T dy) { return dy * y; });
    case Unary::log: return body([](T x, T, T dy) { return dy / x; });
    case Unary::sqrt: return body([](T, T y, T dy) { return dy * T(0.5) / y; });
    case Unary::rsqrt: return body([](T, T y, T dy) { return dy * T(-0.5) * y * y * y; });
    case Unary::abs:
      return body([](T x, T, T dy) { return x > T(0) ? dy : (x < T(0) ? -dy : T(0)); });
    case Unary::tanh: return body([](T, T y, T dy) { return dy * (T(1) - y * y); });
    case Unary::sigmoid: return body([](T, T y, T dy) { return dy * y * (T(1) - y); });
    case Unary::relu: return body([](T x, T, T dy) { return x > T(0) ? dy : T(0); });
    case Unary::gelu:
      return body([](T x, T, T dy) {
        T cdf, pdf;
        M::normal_cdf_pdf(x, cdf, pdf);
        return dy * (cdf + x * pdf);
      });
    // d/dx of x s(2u), s = sigmoid: s + x s (1 - s) 2u'; 1 - tanh^2 never formed.
    case Unary::gelu_tanh:
      return body([](T x, T, T dy) {
        T x2 = x * x;
        T s = M::sigmoid(T(2 * kSqrt2OverPi) * (x + T(kGeluC) * x2 * x));
        T du = T(2 * kSqrt2OverPi) * (T(1) + T(3 * kGeluC) * x2);
        return dy * (s + x * s * (T(1) - s) * du);
      });
    case Unary::silu:
      return body([](T x, T, T dy) {
        T s = M::sigmoid(x);
        return dy * s * (T(1) + x * (T(1) - s));
      });
    case Unary::log_sigmoid: return body([](T x, T, T dy) { return dy * M::sigmoid(-x); });
    case Unary::normal_cdf:
      return body([](T x, T, T dy) { return dy * T(kInvSqrt2Pi) * M::exp(T(-0.5) * x * x); });
    case Unary::softplus:
      return body([a, b](T x, T, T dy) { return a * x > b ? dy : dy * M::sigmoid(a * x); });
    case Unary::clamp:
      return body([a, b](T x, T, T dy) { return (x >= a && x <= b) ? dy : T(0); });
    case Unary::add_scalar: return body([](T, T, T dy) { return dy; });
    case Unary::mul_scalar: return body([a](T, T, T dy) { return dy * a; });
    case Unary::pow_scalar:
      if (p.a == 0.0) return body([](T, T, T) { return T(0); });
      return body([a](T x, T, T dy) { return dy * a * T(std::pow(x, a - T(1))); });
  }
}

template <class T, class Body>
void with_binary(Binary op, Body body) {
  switch (op) {
    case Binary::add: return body([](T x, T y) { return x + y; });
    case Binary::sub: return body([](T x, T y) { return x - y; });
    case Binary::mul: return body([](T x, T y) { return x * y; });
    case Binary::div: return body([](T x, T y) { return x / y; });
    case Binary::pow: return body([](T x, T y) { return T(std::pow(x, y)); });
    // NaN propagates from either side, as in PyTorch.
    case Binary::minimum:
      return body([](T x, T y) { return x != x ? x : (y != y ? y : (x < y ? x : y)); });
    case Binary::maximum:
      return body([](T x, T y) { return x != x ? x : (y != y ? y : (x > y ? x : y)); });
  }
}

constexpr int64_t kParallelGrain = 32768;

template <class T, class F>
FORGE_CLONES
void map1(const T* x, T* y, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// One loop per operand set, so the SIMD body never tests a pointer.
template <class T, class F>
FORGE_CLONES
void map3(const T* x, const T* y, const T* dy, T* dx, int64_t n, F f) {
  if (x && y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = f(x[i], y[i], dy[i]);
  } else if (x) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = f(x[i], T(0), dy[i]);
  } else if (y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = f(T(0), y[i], dy[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = f(T(0), T(0), dy[i]);
  }
}

// Merges adjacent dimensions that are contiguous with each other in every operand, so that a
// broadcast over [B, T, C] + [C] becomes a 2-D loop and same-shape ops become 1-D.
struct Coalesced {
  std::vector<int64_t> shape, sa, sb;
};
Coalesced coalesce(const int64_t* shape, const int64_t* sa, const int64_t* sb, int ndim) {
  Coalesced c;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    if (!c.shape.empty() && c.sa.back() == sa[d] * shape[d] && c.sb.back() == sb[d] * shape[d]) {
      c.shape.back() *= shape[d];
      c.sa.back() = sa[d];
      c.sb.back() = sb[d];
    } else {
      c.shape.push_back(shape[d]);
      c.sa.push_back(sa[d]);
      c.sb.push_back(sb[d]);
    }
  }
  if (c.shape.empty()) c = {{1}, {0}, {0}};
  return c;
}

template <class T, class F>
FORGE_CLONES
void binary_rows(const T* a, const T* b, T* out, const Coalesced& c, F f) {
  int nd = int(c.shape.size());
  int64_t inner = c.shape[size_t(nd - 1)], ia = c.sa[size_t(nd - 1)], ib = c.sb[size_t(nd - 1)];
  int64_t rows = 1;
  for (int d = 0; d < nd - 1; ++d) rows *= c.shape[size_t(d)];
#pragma omp parallel for schedule(static) if (rows * inner > kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t oa = 0, ob = 0, rem = r;
    for (int d = nd - 2; d >= 0; --d) {
      int64_t i = rem % c.shape[size_t(d)];
      rem /= c.shape[size_t(d)];
      oa += i * c.sa[size_t(d)];
      ob += i * c.sb[size_t(d)];
    }
    const T* pa = a + oa;
    const T* pb = b + ob;
    T* po = out + r * inner;
    if (ia == 1 && ib == 1) {
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j) po[j] = f(pa[j], pb[j]);
    } else if (ia == 1 && ib == 0) {
      T vb = pb[0];
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j) po[j] = f(pa[j], vb);
    } else if (ia == 0 && ib == 1) {
      T va = pa[0];
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j) po[j] = f(va, pb[j]);
    } else {
      for (int64_t j = 0; j < inner; ++j) po[j] = f(pa[j * ia], pb[j * ib]);
    }
  }
}

template <class T, class F>
void binary_flat(const T* a, const T* b, T* out, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

}  // namespace

template <class T>
void unary_forward(Unary op, const T* x, T* y, int64_t n, UnaryParams p) {
  with_forward<T, FastMath>(op, p, [&](auto f) { map1(x, y, n, f); });
}

template <class T>
void unary_backward(Unary op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
                    UnaryParams p) {
  with_backward<T, FastMath>(op, p, [&](auto g) { map3(x, y, dy, dx, n, g); });
}

template <class T>
void binary_forward(Binary op, const T* a, const int64_t* a_strides, const T* b,
                    const int64_t* b_strides, T* out, const int64_t* shape, int ndim) {
  Coalesced c = coalesce(shape, a_strides, b_strides, ndim);
  with_binary<T>(op, [&](auto f) {
    if (c.shape.size() == 1 && c.sa[0] == 1 && c.sb[0] == 1)
      binary_flat(a, b, out, c.shape[0], f);
    else
      binary_rows(a, b, out, c, f);
  });
}

template <class T>
void select(const T* cond, const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = cond[i] != T(0) ? a[i] : b[i];
}

template <class T>
void sum_dims(const T* x, const int64_t* shape, const bool* reduce, int ndim, T* out) {
  // Coalesce neighbours with the same role; x is dense so merging is always legal.
  std::vector<int64_t> dims;
  std::vector<bool> red;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && red.back() == reduce[d]) {
      dims.back() *= shape[d];
    } else {
      dims.push_back(shape[d]);
      red.push_back(reduce[d]);
    }
  }
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  if (dims.empty() || total == 0) {  // nothing to reduce, or an empty input
    int64_t n_out = 1;
    for (int d = 0; d < ndim; ++d) n_out *= reduce[d] ? 1 : shape[d];
    for (int64_t i = 0; i < n_out; ++i) out[i] = dims.empty() && total ? x[i] : T(0);
    return;
  }
  int nd = int(dims.size());
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  for (int64_t d = nd - 1, s = 1; d >= 0; --d) {
    strides[size_t(d)] = s;
    s *= dims[size_t(d)];
  }
  // The innermost dimension is walked contiguously: summed when reduced, or kept as a row of
  // accumulators. A unit is one output element (inner reduced) or one output row (inner kept).
  int64_t inner = dims[size_t(nd - 1)];
  bool inner_reduced = red[size_t(nd - 1)];
  std::vector<int64_t> kept, reduced;  // indices into dims, excluding the innermost
  for (int d = 0; d < nd - 1; ++d) (red[size_t(d)] ? reduced : kept).push_back(d);
  int64_t units = 1, combos = 1;
  for (int64_t d : kept) units *= dims[size_t(d)];
  for (int64_t d : reduced) combos *= dims[size_t(d)];
  using Acc = double;
#pragma omp parallel for schedule(static) if (total > kParallelGrain && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t base = 0, rem = u;
    for (size_t k = kept.size(); k-- > 0;) {
      int64_t d = kept[k];
      base += (rem % dims[size_t(d)]) * strides[size_t(d)];
      rem /= dims[size_t(d)];
    }
    std::vector<Acc> row(inner_reduced ? 1 : size_t(inner), Acc(0));
    for (int64_t cidx = 0; cidx < combos; ++cidx) {
      int64_t off = base, crem = cidx;
      for (size_t k = reduced.size(); k-- > 0;) {
        int64_t d = reduced[k];
        off += (crem % dims[size_t(d)]) * strides[size_t(d)];
        crem /= dims[size_t(d)];
      }
      const T* px = x + off;
      if (inner_reduced) {
        Acc s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < inner; ++j) s += Acc(px[j]);
        row[0] += s;
      } else {
        Acc* pr = row.data();
#pragma omp simd
        for (int64_t j = 0; j < inner; ++j) pr[j] += Acc(px[j]);
      }
    }
    if (inner_reduced)
      out[u] = T(row[0]);
    else
      for (int64_t j = 0; j < inner; ++j) out[u * inner + j] = T(row[size_t(j)]);
  }
}

namespace ref {

template <class T>
void unary_forward(Unary op, const T* x, T* y, int64_t n, UnaryParams p) {
  with_forward<T, RefMath>(op, p, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  });
}

template <class T>
void unary_backward(Unary op, const T* x, const T* y, const T* dy, T* dx, int64_t n,
                    UnaryParams p) {
  with_backward<T, RefMath>(op, p, [&](auto g) {
    for (int64_t i = 0; i < n; ++i) dx[i] = g(x ? x[i] : T(0), y ? y[i] : T(0), dy[i]);
  });
}

template <class T>
void binary_forward(Binary op, const T* a, const int64_t* a_strides, const T* b,
                    const int64_t* b_strides, T* out, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  with_binary<T>(op, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t oa = 0, ob = 0, rem = i;
      for (int d = ndim - 1; d >= 0; --d) {
        int64_t k = rem % shape[d];
        rem /= shape[d];
        oa += k * a_strides[d];
        ob += k * b_strides[d];
      }
      out[i] = f(a[oa], b[ob]);
    }
  });
}

template <class T>
void select(const T* cond, const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cond[i] != T(0) ? a[i] : b[i];
}

template <class T>
void sum_dims(const T* x, const int64_t* shape, const bool* reduce, int ndim, T* out) {
  int64_t n = 1, n_out = 1;
  for (int d = 0; d < ndim; ++d) {
    n *= shape[d];
    n_out *= reduce[d] ? 1 : shape[d];
  }
  std::vector<double> acc(size_t(n_out), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t o = 0, rem = i, scale = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t k = rem % shape[d];
      rem /= shape[d];
      if (!reduce[d]) {
        o += k * scale;
        scale *= shape[d];
      }
    }
    acc[size_t(o)] += double(x[i]);
  }
  for (int64_t i = 0; i < n_out; ++i) out[i] = T(acc[size_t(i)]);
}

}  // namespace ref

#define FORGE_INSTANTIATE(T)                                                                    \
  template void unary_forward<T>(Unary, const T*, T*, int64_t, UnaryParams);                    \
  template void unary_backward<T>(Unary, const T*, const T*, const T*, T*, int64_t, UnaryParams); \
  template void binary_forward<T>(Binary, const T*, const int64_t*, const T*, const int64_t*,   \
                                  T*, const int64_t*, int);                                     \
  template void sum_dims<T>(const T*, const int64_t*, const bool*, int, T*);                    \
  template void select<T>(const T*, const T*, const T*, T*, int64_t);                           \
  template void ref::select<T>(const T*, const T*, const T*, T*, int64_t);                      \
  template void ref::unary_forward<T>(Unary, const T*, T*, int64_t, UnaryParams);               \
  template void ref::unary_backward<T>(Unary, const T*, const T*, const T*, T*, int64_t,        \
                                       UnaryParams);                                            \
  template void ref::binary_forward<T>(Binary, const T*, const int64_t*, const T*,              \
                                       const int64_t*, T*, const int64_t*, int);                \
  template void ref::sum_dims<T>(const T*, const int64_t*, const bool*, int, T*);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::kernels
