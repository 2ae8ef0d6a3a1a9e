// Reductions: finite-difference checks of sum, mean, max, min and var (over dims, keepdim, size-1
// dims, strided inputs), exact tie handling, top-k and argmax semantics, errors, and parity of
// kernels/reduce and kernels::sum_dims with their plain references on random shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/kernels/elementwise.h"
#include "core/kernels/reduce.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

using testing::randn;
using testing::randn_strided;
using In = std::vector<Tensor>;

// ---- gradient checks ----

FORGE_GRADCHECK(sum, all) { EXPECT_GRADCHECK([](const In& v) { return sum(v[0]); }, {randn({3, 4})}); }
FORGE_GRADCHECK(sum, dims) {
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0], {0, 2}); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0], {-1}); }, {randn({2, 1, 4})});
}
FORGE_GRADCHECK(sum, keepdim) {
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0], {1}, true); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0], {0, 1, 2}, true); }, {randn({2, 1, 3})});
}
FORGE_GRADCHECK(sum, non_contiguous) {
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0], {1}); }, {randn_strided({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return sum(v[0]); }, {randn_strided({3, 5})});
}

FORGE_GRADCHECK(mean, all) { EXPECT_GRADCHECK([](const In& v) { return mean(v[0]); }, {randn({3, 4})}); }
FORGE_GRADCHECK(mean, dims_keepdim) {
  EXPECT_GRADCHECK([](const In& v) { return mean(v[0], {0, 2}, true); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return mean(v[0], {-1}); }, {randn_strided({3, 4})});
}

// Random normal values are distinct, so the arg-extreme is unique and finite differences are exact.
FORGE_GRADCHECK(max, dim) {
  EXPECT_GRADCHECK([](const In& v) { return max(v[0], 1); }, {randn({3, 4, 5})});
  EXPECT_GRADCHECK([](const In& v) { return max(v[0], -1, true); }, {randn({3, 4, 5}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return max(v[0], 0); }, {randn_strided({4, 3}, 3)});
}
FORGE_GRADCHECK(max, full) {
  EXPECT_GRADCHECK([](const In& v) { return max(v[0]); }, {randn({3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return max(v[0]); }, {randn_strided({3, 4}, 5)});
}
FORGE_GRADCHECK(min, dim) {
  EXPECT_GRADCHECK([](const In& v) { return min(v[0], 1); }, {randn({3, 4, 5})});
  EXPECT_GRADCHECK([](const In& v) { return min(v[0], 2, true); }, {randn({2, 1, 6}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return min(v[0], -1); }, {randn_strided({4, 3}, 3)});
}
FORGE_GRADCHECK(min, full) {
  EXPECT_GRADCHECK([](const In& v) { return min(v[0]); }, {randn({3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return min(v[0]); }, {randn_strided({2, 3, 4}, 5)});
}

FORGE_GRADCHECK(var, unbiased) {
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {1}); }, {randn({3, 5})});
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {1, 2}, true, true); }, {randn({2, 3, 4})});
}
FORGE_GRADCHECK(var, biased) {
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {0}, false); }, {randn({4, 3})});
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {-1, 0}, false, true); }, {randn({2, 3, 4})});
}
// Non-adjacent dims take the permuted path; a size-1 dim between reduced dims does not.
FORGE_GRADCHECK(var, multiple_dims_and_layouts) {
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {0, 2}); }, {randn({3, 2, 4})});
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {0, 2}); }, {randn({3, 1, 4})});
  EXPECT_GRADCHECK([](const In& v) { return var(v[0], {0, 1}, false); }, {randn_strided({3, 4})});
}

// ---- values and ties ----

Tensor f64(const std::vector<double>& values, const Shape& shape) {
  return testing::constant(values, shape);
}

TEST(Reduce, MaxMinAlongDimValuesAndFirstArg) {
  Tensor x = f64({1, 5, 3, 7, 2, 7}, {2, 3});
  EXPECT_EQ(max(x, 1).to_vector<double>(), (std::vector<double>{5, 7}));
  EXPECT_EQ(min(x, 0).to_vector<double>(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(max(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0, true).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(argmax(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(argmax(x, 1).dtype(), DType::i64);
}

TEST(Reduce, MaxAlongDimSendsTheGradientToTheFirstTie) {
  Tensor x = f64({7, 2, 7, 1, 1, 1}, {2, 3}).set_requires_grad(true);
  max(x, 1).backward(f64({10, 20}, {2}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10, 0, 0, 20, 0, 0}));
  Tensor y = f64({3, 0, 3, 0}, {2, 2}).set_requires_grad(true);
  min(y, 0).backward(f64({1, 2}, {2}));
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 2, 0, 0}));
}

TEST(Reduce, FullMaxMinSplitTheGradientEvenlyAmongTies) {
  Tensor x = f64({1, 3, 3, 2, 3, -4}, {2, 3}).set_requires_grad(true);
  Tensor m = max(x);
  EXPECT_EQ(m.item(), 3.0);
  EXPECT_EQ(m.dim(), 0);
  m.backward(full({}, 6.0, DType::f64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 2, 2, 0, 2, 0}));
  Tensor y = f64({-4, 1, -4, -4}, {4}).set_requires_grad(true);
  min(y).backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1. / 3, 0, 1. / 3, 1. / 3}));
}

TEST(Reduce, NanPropagatesThroughMaxMinAndArgmax) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64({1, nan, 3, 2, 0, 5}, {2, 3});
  EXPECT_TRUE(std::isnan(max(x, 1).at({0})));
  EXPECT_TRUE(std::isnan(min(x, 1).at({0})));
  EXPECT_EQ(min(x, 1).at({1}), 0.0);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(std::isnan(min(x).item()));
}

TEST(Reduce, VarMatchesTheDefinition) {
  Tensor x = randn({3, 4, 5}, 7).detach();
  for (bool unbiased : {true, false})
    for (const std::vector<int64_t>& dims : {std::vector<int64_t>{1}, {0, 2}, {0, 1, 2}, {-1}}) {
      int64_t n = 1;
      for (int64_t d : dims) n *= x.size(d);
      Tensor dev = sub(x, mean(x, dims, true));
      Tensor expected = div(sum(mul(dev, dev), dims), scalar(double(n - unbiased), DType::f64));
      Tensor got = var(x, dims, unbiased);
      ASSERT_EQ(got.shape(), expected.shape());
      auto g = got.to_vector<double>(), e = expected.to_vector<double>();
      for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], e[i], 1e-12);
    }
  EXPECT_EQ(var(x, {1}, true, true).shape(), (Shape{3, 1, 5}));
}

TEST(Reduce, TopkIsSortedWithIndicesAndCarriesNoGradient) {
  Tensor x = f64({4, 1, 4, 9, -2, 0, 5, 5, 5, 1}, {2, 5}).set_requires_grad(true);
  TopK top = topk(x, 3);
  EXPECT_EQ(top.values.to_vector<double>(), (std::vector<double>{9, 4, 4, 5, 5, 5}));
  EXPECT_EQ(top.indices.to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 2, 1, 2, 3}));
  EXPECT_FALSE(top.values.requires_grad());
  EXPECT_EQ(top.indices.dtype(), DType::i64);
  TopK low = topk(x, 2, 1, false);
  EXPECT_EQ(low.values.to_vector<double>(), (std::vector<double>{-2, 1, 0, 1}));
  EXPECT_EQ(low.indices.to_vector<int64_t>(), (std::vector<int64_t>{4, 1, 0, 4}));
  TopK cols = topk(x, 1, 0);  // along a strided axis
  EXPECT_EQ(cols.values.shape(), (Shape{1, 5}));
  EXPECT_EQ(cols.values.to_vector<double>(), (std::vector<double>{4, 5, 5, 9, 1}));
  EXPECT_EQ(cols.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 0, 1}));
  EXPECT_EQ(topk(x, 0).values.shape(), (Shape{2, 0}));
  EXPECT_EQ(topk(x, 5).indices.to_vector<int64_t>()[4], 4);
}

TEST(Reduce, BadDimensionsAndSizesAreRejected) {
  Tensor x = randn({2, 3}).detach();
  auto code = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return int(e.code());
    }
    return -1;
  };
  const int internal = int(ExitCode::internal);
  EXPECT_EQ(code([&] { max(x, 2); }), internal);
  EXPECT_EQ(code([&] { min(x, -3); }), internal);
  EXPECT_EQ(code([&] { argmax(x, 5); }), internal);
  EXPECT_EQ(code([&] { var(x, {0, 2}); }), internal);
  EXPECT_EQ(code([&] { var(x, {}); }), internal);
  EXPECT_EQ(code([&] { sum(x, {-3}); }), internal);
  EXPECT_EQ(code([&] { mean(x, {2}); }), internal);
  EXPECT_EQ(code([&] { topk(x, 4, 1); }), internal);
  EXPECT_EQ(code([&] { topk(x, -1, 1); }), internal);
  EXPECT_EQ(code([&] { max(zeros({2, 0})); }), internal);
  EXPECT_EQ(code([&] { max(zeros({2, 0}), 1); }), internal);
  EXPECT_EQ(code([&] { max(arange(3, DType::i64), 0); }), internal);
  try {
    max(x, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dimension 2"), std::string::npos) << e.what();
  }
}

// ---- kernel parity: fast kernels vs kernels::ref ----

// Values from a small integer range (so ties occur) with some NaNs mixed in when asked.
template <class T>
std::vector<T> tie_values(int64_t n, uint64_t seed, bool with_nan) {
  Generator g(seed);
  std::vector<double> u = uniform({n}, 0, 1, g, DType::f64).to_vector<double>();
  std::vector<T> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = T(std::floor(u[i] * 9) - 4);
    if (with_nan && u[i] > 0.995) v[i] = std::numeric_limits<T>::quiet_NaN();
  }
  return v;
}

template <class T>
bool same(T a, T b) { return a == b || (a != a && b != b); }

struct Block {
  int64_t outer, n, inner;
};
// Contiguous and strided axes, n = 1, chunk boundaries (256 columns) and sizes above the
// parallel grain for both the row and the column paths.
const Block kBlocks[] = {{1, 1, 1},    {7, 1, 5},      {5, 13, 1},    {1, 100003, 1},
                         {40, 1000, 1}, {3, 17, 300},  {1, 300, 257}, {2, 5, 2000},
                         {64, 9, 3}};

template <class T>
void check_extreme_parity() {
  for (const Block& b : kBlocks)
    for (bool with_nan : {false, true})
      for (bool largest : {true, false}) {
        int64_t total = b.outer * b.n * b.inner, m = b.outer * b.inner;
        std::vector<T> x = tie_values<T>(total, uint64_t(total + with_nan), with_nan);
        std::vector<T> out(static_cast<size_t>(m)), out_ref(static_cast<size_t>(m));
        std::vector<int64_t> arg(static_cast<size_t>(m)), arg_ref(static_cast<size_t>(m)), arg_only(static_cast<size_t>(m));
        kernels::extreme_dim(x.data(), b.outer, b.n, b.inner, largest, out.data(), arg.data());
        kernels::ref::extreme_dim(x.data(), b.outer, b.n, b.inner, largest, out_ref.data(),
                                  arg_ref.data());
        kernels::extreme_dim(x.data(), b.outer, b.n, b.inner, largest, static_cast<T*>(nullptr),
                             arg_only.data());
        for (int64_t i = 0; i < m; ++i) {
          ASSERT_TRUE(same(out[size_t(i)], out_ref[size_t(i)]))
              << b.outer << "x" << b.n << "x" << b.inner << " largest " << largest << " at " << i;
          ASSERT_EQ(arg[size_t(i)], arg_ref[size_t(i)]) << b.outer << "x" << b.n << "x" << b.inner;
          ASSERT_EQ(arg_only[size_t(i)], arg_ref[size_t(i)]);
        }
      }
}
TEST(ReduceKernels, ExtremeMatchesReference) {
  check_extreme_parity<float>();
  check_extreme_parity<double>();
}

TEST(ReduceKernels, SpreadToTiesMatchesReference) {
  for (bool with_nan : {false, true}) {
    std::vector<double> x = tie_values<double>(50001, 3, with_nan);
    double value = with_nan ? std::numeric_limits<double>::quiet_NaN() : 4.0;
    std::vector<double> dx(x.size()), dx_ref(x.size());
    kernels::spread_to_ties(x.data(), int64_t(x.size()), value, 3.0, dx.data());
    kernels::ref::spread_to_ties(x.data(), int64_t(x.size()), value, 3.0, dx_ref.data());
    EXPECT_EQ(dx, dx_ref);
    double total = 0;
    for (double d : dx) total += d;
    EXPECT_NEAR(total, 3.0, 1e-9);
  }
}

template <class T>
void check_var_parity() {
  for (const Block& b : kBlocks)
    for (int64_t correction : {0, 1}) {
      if (b.n <= correction) continue;
      int64_t total = b.outer * b.n * b.inner, m = b.outer * b.inner;
      Generator g{uint64_t(total)};
      std::vector<T> x = normal({total}, 3.0, 2.0, g, dtype_of<T>()).template to_vector<T>();
      std::vector<T> v(static_cast<size_t>(m)), v_ref(static_cast<size_t>(m)), mu(static_cast<size_t>(m)), mu_ref(static_cast<size_t>(m));
      kernels::var_dim(x.data(), b.outer, b.n, b.inner, correction, v.data(), mu.data());
      kernels::ref::var_dim(x.data(), b.outer, b.n, b.inner, correction, v_ref.data(),
                            mu_ref.data());
      const double tol = sizeof(T) == 4 ? 1e-6 : 1e-12;
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_NEAR(v[size_t(i)], v_ref[size_t(i)], tol * (1 + std::fabs(v_ref[size_t(i)])))
            << b.outer << "x" << b.n << "x" << b.inner;
        ASSERT_NEAR(mu[size_t(i)], mu_ref[size_t(i)], tol * (1 + std::fabs(mu_ref[size_t(i)])));
      }
    }
}
TEST(ReduceKernels, VarMatchesReference) {
  check_var_parity<float>();
  check_var_parity<double>();
}

template <class T>
void check_topk_parity() {
  for (const Block& b : kBlocks)
    for (int64_t k : {int64_t(1), int64_t(3), b.n / 2, b.n})
      for (bool largest : {true, false}) {
        if (k > b.n || b.n > 20000) continue;  // the reference sorts: keep it quick
        int64_t total = b.outer * b.n * b.inner, m = b.outer * k * b.inner;
        std::vector<T> x = tie_values<T>(total, uint64_t(total + k), true);
        std::vector<T> v(static_cast<size_t>(m)), v_ref(static_cast<size_t>(m));
        std::vector<int64_t> idx(static_cast<size_t>(m)), idx_ref(static_cast<size_t>(m));
        kernels::topk_dim(x.data(), b.outer, b.n, b.inner, k, largest, v.data(), idx.data());
        kernels::ref::topk_dim(x.data(), b.outer, b.n, b.inner, k, largest, v_ref.data(),
                               idx_ref.data());
        for (int64_t i = 0; i < m; ++i) {
          ASSERT_TRUE(same(v[size_t(i)], v_ref[size_t(i)])) << b.outer << "x" << b.n << "x"
                                                            << b.inner << " k " << k;
          ASSERT_EQ(idx[size_t(i)], idx_ref[size_t(i)]) << b.outer << "x" << b.n << "x" << b.inner
                                                        << " k " << k << " at " << i;
        }
      }
}
TEST(ReduceKernels, TopkMatchesReference) {
  check_topk_parity<float>();
  check_topk_parity<double>();
}

// kernels::sum_dims (the lead's kernel behind sum and mean) over every reduce mask of a 5-d shape
// with a size-1 dim: leading, trailing, middle, alternating, all and none; then large shapes that
// take the parallel paths.
template <class T>
void check_sum_parity(const Shape& shape, int mask) {
  int nd = int(shape.size());
  bool reduce[8] = {};
  for (int d = 0; d < nd; ++d) reduce[d] = (mask >> d) & 1;
  int64_t n = shape_numel(shape), n_out = 1;
  for (int d = 0; d < nd; ++d) n_out *= reduce[d] ? 1 : shape[size_t(d)];
  Generator g{uint64_t(mask + 1)};
  std::vector<T> x = normal({n}, 0.5, 1.0, g, dtype_of<T>()).template to_vector<T>();
  std::vector<T> out(static_cast<size_t>(n_out)), ref(static_cast<size_t>(n_out));
  kernels::sum_dims(x.data(), shape.data(), reduce, nd, out.data());
  kernels::ref::sum_dims(x.data(), shape.data(), reduce, nd, ref.data());
  const double tol = sizeof(T) == 4 ? 1e-6 : 1e-12;
  for (int64_t i = 0; i < n_out; ++i)
    ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], tol * (1 + std::fabs(ref[size_t(i)])))
        << "shape " << shape_str(shape) << " mask " << mask << " at " << i;
}
TEST(ReduceKernels, SumDimsMatchesReferenceForEveryDimCombination) {
  const Shape small = {3, 1, 5, 4, 6};
  for (int mask = 0; mask < 32; ++mask) {
    check_sum_parity<float>(small, mask);
    check_sum_parity<double>(small, mask);
  }
  const Shape large = {6, 70, 2, 130};
  for (int mask = 0; mask < 16; ++mask) check_sum_parity<float>(large, mask);
  check_sum_parity<double>({1, 100003}, 2);
  check_sum_parity<double>({100003, 1}, 1);
  check_sum_parity<double>({0, 4}, 1);
}

}  // namespace
}  // namespace forge
