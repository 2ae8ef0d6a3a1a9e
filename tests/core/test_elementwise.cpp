// Elementwise ops: finite-difference checks (broadcasting, size-1 dims, strided inputs) and
// parity of the vectorised kernels with their plain references.
#include <gtest/gtest.h>

#include <cmath>

#include "core/kernels/elementwise.h"
#include "core/kernels/random.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

using testing::randn;
using testing::randn_strided;
using testing::rand_uniform;
using In = std::vector<Tensor>;

// ---- binary ops: broadcasting both ways, size-1 dims, a strided operand ----

FORGE_GRADCHECK(add, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return add(v[0], v[1]); }, {randn({2, 3, 4}, 1), randn({3, 1}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return add(v[0], v[1]); }, {randn({1, 4}, 3), randn_strided({3, 4}, 4)});
}
FORGE_GRADCHECK(sub, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return sub(v[0], v[1]); }, {randn({4}, 1), randn({2, 3, 4}, 2)});
}
FORGE_GRADCHECK(mul, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return mul(v[0], v[1]); }, {randn({2, 1, 4}, 1), randn({3, 1}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return mul(v[0], v[0]); }, {randn_strided({3, 5}, 3)});
}
FORGE_GRADCHECK(div, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return div(v[0], v[1]); },
                   {randn({2, 3}, 1), rand_uniform({3}, 0.5, 2.0, 2)});
}
FORGE_GRADCHECK(pow, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return pow(v[0], v[1]); },
                   {rand_uniform({2, 3}, 0.5, 2.0, 1), randn({1, 3}, 2)});
}
FORGE_GRADCHECK(minimum, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return minimum(v[0], v[1]); }, {randn({3, 4}, 1), randn({4}, 2)});
}
FORGE_GRADCHECK(maximum, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return maximum(v[0], v[1]); },
                   {randn_strided({3, 4}, 1), randn({3, 1}, 2)});
}

// ---- scalar and unary ops ----

#define UNARY_CASE(op_id, expr, input)                                     \
  FORGE_GRADCHECK(op_id, strided) {                                        \
    EXPECT_GRADCHECK([](const In& v) { const Tensor& x = v[0]; return expr; }, {input}); \
  }

UNARY_CASE(add_scalar, add(x, 2.5), randn({3, 4}))
UNARY_CASE(mul_scalar, mul(x, -1.5), randn_strided({3, 4}))
UNARY_CASE(pow_scalar, pow(x, 2.5), rand_uniform({2, 3}, 0.5, 2.0))
UNARY_CASE(neg, neg(x), randn_strided({3, 2}))
UNARY_CASE(exp, exp(x), randn_strided({3, 4}))
UNARY_CASE(log, log(x), rand_uniform({3, 4}, 0.2, 3.0))
UNARY_CASE(sqrt, sqrt(x), rand_uniform({3, 4}, 0.2, 3.0))
UNARY_CASE(rsqrt, rsqrt(x), rand_uniform({3, 4}, 0.2, 3.0))
UNARY_CASE(abs, abs(x), randn({3, 4}))
UNARY_CASE(tanh, tanh(x), randn_strided({3, 4}))
UNARY_CASE(sigmoid, sigmoid(x), randn({3, 4}))
UNARY_CASE(relu, relu(x), randn({3, 4}))
UNARY_CASE(gelu, gelu(x), mul(randn({3, 4}), 2.0).detach().set_requires_grad(true))
UNARY_CASE(gelu_tanh, gelu(x, GeluApprox::tanh), randn_strided({3, 4}))
UNARY_CASE(silu, silu(x), randn({3, 4}))
UNARY_CASE(log_sigmoid, log_sigmoid(x), mul(randn({3, 4}), 5.0).detach().set_requires_grad(true))
UNARY_CASE(normal_cdf, normal_cdf(x), randn_strided({3, 4}))
UNARY_CASE(softplus, softplus(x, 2.0, 5.0), mul(randn({3, 4}), 3.0).detach().set_requires_grad(true))
UNARY_CASE(clamp, clamp(x, -0.5, 0.7), randn({4, 4}))
// Rounding to f32 makes small steps meaningless; the function is linear, so a large step is exact.
FORGE_GRADCHECK(cast, through_f32) {
  EXPECT_GRADCHECK([](const In& v) { return v[0].to(DType::f32).to(DType::f64); }, {randn({3, 2})},
                   testing::GradCheckOptions{1e-2, 1e-4, 1e-4});
}

FORGE_GRADCHECK(where, broadcast) {
  Tensor cond = testing::constant({1, 0, 0, 1}, {4});
  EXPECT_GRADCHECK([cond](const In& v) { return where(cond, v[0], v[1]); },
                   {randn({3, 4}, 1), randn({3, 1}, 2)});
}
FORGE_GRADCHECK(masked_fill, broadcast) {
  Tensor mask = testing::constant({0, 1, 0}, {3, 1});
  EXPECT_GRADCHECK([mask](const In& v) { return masked_fill(v[0], mask, -3.0); }, {randn_strided({3, 4})});
}
FORGE_GRADCHECK(dropout, fixed_generator) {
  EXPECT_GRADCHECK(
      [](const In& v) {
        Generator g(7);
        return dropout(v[0], 0.3, true, g);
      },
      {randn({5, 6})});
}

// ---- values ----

TEST(Elementwise, BroadcastShapesAndErrors) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5}), (Shape{5}));
  try {
    broadcast_shapes({2, 3}, {4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
}

TEST(Elementwise, ValuesAgainstLibm) {
  Tensor x = from_vector(std::vector<double>{-3.0, -0.5, 0.0, 0.25, 2.0}, {5}, DType::f64);
  auto v = gelu(x).to_vector<double>();
  for (int i = 0; i < 5; ++i) {
    double xi = x.at({i});
    EXPECT_NEAR(v[size_t(i)], 0.5 * xi * (1 + std::erf(xi / std::sqrt(2.0))), 1e-15);
  }
  EXPECT_NEAR(softplus(x, 1.0, 20.0).at({4}), std::log1p(std::exp(2.0)), 1e-15);
  EXPECT_NEAR(log_sigmoid(from_vector(std::vector<double>{-800}, {1}, DType::f64)).item(), -800, 1e-9);
  EXPECT_TRUE(std::isnan(maximum(from_vector(std::vector<double>{NAN}, {1}, DType::f64),
                                 from_vector(std::vector<double>{1}, {1}, DType::f64)).item()));
}

// Phi and its derivative at hand values (from Python's math.erfc and math.exp), in f64 and f32.
TEST(Elementwise, NormalCdfValuesAndGradient) {
  const std::vector<double> x = {-8, -3, -1, 0, 0.5, 1.96, 4};
  const std::vector<double> cdf = {6.220960574271819e-16, 0.0013498980316300957,
                                   0.15865525393145707,   0.5,
                                   0.6914624612740131,    0.9750021048517795,
                                   0.9999683287581669};
  const std::vector<double> pdf = {5.052271083536893e-15, 0.0044318484119380075,
                                   0.24197072451914337,   0.3989422804014327,
                                   0.3520653267642995,    0.058440944333451476,
                                   0.00013383022576488537};
  for (DType dtype : {DType::f64, DType::f32}) {
    const double rtol = dtype == DType::f64 ? 1e-13 : 1e-5;
    Tensor in = from_vector(x, {7}, dtype).set_requires_grad(true);
    Tensor y = normal_cdf(in);
    sum(y).backward();
    std::vector<double> got = y.to(DType::f64).to_vector<double>();
    std::vector<double> grad = in.grad().to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(got[i], cdf[i], rtol * cdf[i]) << dtype_name(dtype) << " x = " << x[i];
      EXPECT_NEAR(grad[i], pdf[i], rtol * pdf[i]) << dtype_name(dtype) << " x = " << x[i];
    }
  }
}

TEST(Elementwise, MinMaxSplitTiesEvenly) {
  Tensor a = from_vector(std::vector<double>{1.0, 2.0}, {2}, DType::f64).set_requires_grad(true);
  Tensor b = from_vector(std::vector<double>{1.0, 5.0}, {2}, DType::f64).set_requires_grad(true);
  sum(maximum(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.5, 0.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.5, 1.0}));
}

TEST(Elementwise, DropoutKeepsExpectationAndIsReproducible) {
  Generator g1(42), g2(42);
  Tensor x = ones({100000});
  Tensor a = dropout(x, 0.25, true, g1), b = dropout(x, 0.25, true, g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NEAR(mean(a).item(), 1.0, 0.01);
  auto v = a.to_vector<float>();
  double dropped = std::count(v.begin(), v.end(), 0.0f) / double(v.size());
  EXPECT_NEAR(dropped, 0.25, 0.01);
  EXPECT_TRUE(dropout(x, 0.25, false).shares_storage(x));  // eval mode is the identity
}

// ---- kernel parity: fast kernels vs kernels::ref ----

TEST(Elementwise, DropoutMaskMatchesTheScalarPhiloxReference) {
  // Sizes around the 64-element lane groups and the parallel threshold; an offset first block and
  // a seed with high bits set, so every counter and key word is exercised.
  const GeneratorState g{0x123456789ABCDEFull, 0xFEDCBA9876543210ull, 0};
  for (int64_t n : {1, 3, 63, 64, 65, 1000, 70001}) {
    std::vector<float> fast(size_t(n), -1.0f), want(size_t(n), -2.0f);
    kernels::fill_dropout_mask(fast.data(), n, 0.3, g, (uint64_t(1) << 32) - 5);
    kernels::ref::fill_dropout_mask(want.data(), n, 0.3, g, (uint64_t(1) << 32) - 5);
    EXPECT_EQ(fast, want) << "n = " << n;
  }
}

struct UnaryCase {
  kernels::Unary op;
  double low, high;
  kernels::UnaryParams p;
};

TEST(ElementwiseKernels, UnaryForwardAndBackwardMatchReference) {
  using kernels::Unary;
  const UnaryCase cases[] = {
      {Unary::neg, -5, 5, {}},         {Unary::exp, -80, 80, {}},      {Unary::log, 1e-3, 50, {}},
      {Unary::sqrt, 0, 50, {}},        {Unary::rsqrt, 1e-3, 50, {}},   {Unary::abs, -5, 5, {}},
      {Unary::tanh, -12, 12, {}},      {Unary::sigmoid, -30, 30, {}},  {Unary::relu, -5, 5, {}},
      {Unary::gelu, -10, 10, {}},      {Unary::gelu_tanh, -10, 10, {}}, {Unary::silu, -20, 20, {}},
      {Unary::log_sigmoid, -30, 30, {}}, {Unary::softplus, -30, 30, {2.0, 20.0}},
      {Unary::normal_cdf, -15, 10, {}},
      {Unary::clamp, -3, 3, {-1.0, 2.0}}, {Unary::add_scalar, -3, 3, {1.5, 0}},
      {Unary::mul_scalar, -3, 3, {-2.0, 0}}, {Unary::pow_scalar, 0.1, 3, {1.7, 0}},
  };
  const int64_t n = 4099;  // odd, larger than a vector and than the parallel grain of one row
  for (const auto& c : cases) {
    Generator g(int(c.op) + 1);
    std::vector<float> x = uniform({n}, c.low, c.high, g).to_vector<float>();
    std::vector<float> dy = normal({n}, 0, 1, g).to_vector<float>();
    std::vector<float> y(n), y_ref(n), dx(n), dx_ref(n);
    kernels::unary_forward(c.op, x.data(), y.data(), n, c.p);
    kernels::ref::unary_forward(c.op, x.data(), y_ref.data(), n, c.p);
    kernels::unary_backward(c.op, x.data(), y_ref.data(), dy.data(), dx.data(), n, c.p);
    kernels::ref::unary_backward(c.op, x.data(), y_ref.data(), dy.data(), dx_ref.data(), n, c.p);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(y[size_t(i)], y_ref[size_t(i)], 2e-6 * (1 + std::fabs(y_ref[size_t(i)])))
          << "forward op " << int(c.op) << " at x=" << x[size_t(i)];
      ASSERT_NEAR(dx[size_t(i)], dx_ref[size_t(i)], 2e-6 * (1 + std::fabs(dx_ref[size_t(i)])))
          << "backward op " << int(c.op) << " at x=" << x[size_t(i)];
    }
  }
}

// The parity test above bounds absolute error; Phi's lower tail also needs relative accuracy
// (1 + erf(x / sqrt 2) in f32 would cancel to noise below x = -5, or to 0).
TEST(ElementwiseKernels, NormalCdfKeepsRelativeAccuracyInTheLowerTail) {
  const int64_t n = 4099;
  std::vector<float> x(n), y(n), y_ref(n);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = -12.0f + 9.0f * float(i) / float(n - 1);
  kernels::unary_forward(kernels::Unary::normal_cdf, x.data(), y.data(), n);
  kernels::ref::unary_forward(kernels::Unary::normal_cdf, x.data(), y_ref.data(), n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(y[size_t(i)], y_ref[size_t(i)], 1e-5 * y_ref[size_t(i)]) << "x = " << x[size_t(i)];
}

TEST(ElementwiseKernels, BinaryBroadcastStridesMatchReference) {
  using kernels::Binary;
  struct Geometry {
    Shape shape, sa, sb;
  };
  const Geometry geometries[] = {
      {{1000}, {1}, {1}},                 // dense
      {{37, 129}, {129, 1}, {0, 1}},      // row broadcast (bias)
      {{37, 129}, {1, 0}, {129, 1}},      // column broadcast
      {{5, 7, 9}, {63, 1, 7}, {0, 9, 1}}, // transposed a, broadcast b
      {{3, 1, 40}, {40, 40, 1}, {0, 0, 0}},  // scalar b
  };
  for (Binary op : {Binary::add, Binary::sub, Binary::mul, Binary::div, Binary::pow,
                    Binary::minimum, Binary::maximum}) {
    for (const auto& geo : geometries) {
      Generator g(3);
      std::vector<float> a = uniform({5000}, 0.5, 2, g).to_vector<float>();
      std::vector<float> b = uniform({5000}, 0.5, 2, g).to_vector<float>();
      int64_t n = shape_numel(geo.shape);
      std::vector<float> out(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
      int nd = int(geo.shape.size());
      kernels::binary_forward(op, a.data(), geo.sa.data(), b.data(), geo.sb.data(), out.data(),
                              geo.shape.data(), nd);
      kernels::ref::binary_forward(op, a.data(), geo.sa.data(), b.data(), geo.sb.data(),
                                   ref.data(), geo.shape.data(), nd);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_FLOAT_EQ(out[size_t(i)], ref[size_t(i)]) << "op " << int(op) << " shape "
                                                        << shape_str(geo.shape) << " at " << i;
    }
  }
}

TEST(ElementwiseKernels, SelectMatchesReference) {
  Generator g(9);
  const int64_t n = 70001;
  auto c = uniform({n}, -1, 1, g).to_vector<float>();
  for (auto& v : c) v = v > 0 ? 1.0f : 0.0f;
  auto a = normal({n}, 0, 1, g).to_vector<float>(), b = normal({n}, 0, 1, g).to_vector<float>();
  std::vector<float> out(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
  kernels::select(c.data(), a.data(), b.data(), out.data(), n);
  kernels::ref::select(c.data(), a.data(), b.data(), ref.data(), n);
  EXPECT_EQ(out, ref);
}

}  // namespace
}  // namespace forge
