// Parity of the fused update and gradient-statistics kernels (core/kernels/optim) with their plain
// references, on sizes that take the threaded path and odd tails.
#include <gtest/gtest.h>

#include <cmath>

#include "core/kernels/optim.h"
#include "core/ops.h"

namespace forge {
namespace {

std::vector<float> randn(int64_t n, uint64_t seed) {
  Generator g(seed);
  return normal({n}, 0, 1, g).to_vector<float>();
}

TEST(OptimKernels, AdamWMatchesReference) {
  for (int64_t n : {1, 17, 100003}) {
    auto p = randn(n, 1), g = randn(n, 2), m = randn(n, 3), v = randn(n, 4);
    for (auto& x : v) x = x * x;
    auto p2 = p, m2 = m, v2 = v;
    kernels::AdamWCoeffs<float> c{0.999f, 0.9f, 0.1f, 0.99f, 0.01f, 0.3f, 1e-8f, -0.01f};
    kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), n, c);
    kernels::ref::adamw_update(p2.data(), g.data(), m2.data(), v2.data(), n, c);
    for (int64_t i = 0; i < n; ++i) {
      // The vector clones contract to FMA, the reference does not: last-bit differences that
      // cancellation can lift to ~1e-6 of the inputs' scale.
      ASSERT_NEAR(m[size_t(i)], m2[size_t(i)], 1e-6f * (1 + std::fabs(m2[size_t(i)]))) << i;
      ASSERT_NEAR(v[size_t(i)], v2[size_t(i)], 1e-6f * (1 + std::fabs(v2[size_t(i)]))) << i;
      ASSERT_NEAR(p[size_t(i)], p2[size_t(i)], 1e-6f * (1 + std::fabs(p2[size_t(i)]))) << i;
    }
  }
}

TEST(OptimKernels, SgdMomentumMatchesReference) {
  for (bool nesterov : {false, true})
    for (bool first : {true, false}) {
      const int64_t n = 70001;
      auto p = randn(n, 5), g = randn(n, 6), buf = randn(n, 7);
      auto p2 = p, buf2 = buf;
      kernels::sgd_momentum_update(p.data(), g.data(), buf.data(), n, 0.01f, -0.1f, 0.9f, first, nesterov);
      kernels::ref::sgd_momentum_update(p2.data(), g.data(), buf2.data(), n, 0.01f, -0.1f, 0.9f, first,
                                        nesterov);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(buf[size_t(i)], buf2[size_t(i)], 1e-6f * (1 + std::fabs(buf2[size_t(i)])));
        ASSERT_NEAR(p[size_t(i)], p2[size_t(i)], 1e-6f * (1 + std::fabs(p2[size_t(i)])));
      }
    }
}

TEST(OptimKernels, StatisticsMatchPlainLoops) {
  const int64_t n = 100001;
  auto g = randn(n, 8);
  double expected = 0;
  for (float x : g) expected += double(x) * double(x);
  EXPECT_NEAR(kernels::sum_squares(g.data(), n), expected, 1e-9 * expected);
  EXPECT_TRUE(kernels::all_finite(g.data(), n));
  g[size_t(n - 1)] = INFINITY;
  EXPECT_FALSE(kernels::all_finite(g.data(), n));
  g[size_t(n - 1)] = NAN;
  EXPECT_FALSE(kernels::all_finite(g.data(), n));
  std::vector<float> s = {1, -2, 4};
  kernels::scale(s.data(), 3, 0.5f);
  EXPECT_EQ(s, (std::vector<float>{0.5f, -1, 2}));
  // The fused pass: the same scaling, and each block's sum of squares of the scaled values, the
  // same whether the blocks are summed from the start or from a later block.
  auto h = randn(n, 9), h2 = h;
  const int64_t block = 1000, blocks = (n + block - 1) / block;
  const size_t nb = static_cast<size_t>(blocks);
  std::vector<double> scaled(nb, 0.0), sums(nb, 0.0), tail(nb, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    h2[size_t(i)] *= 0.25f;
    scaled[size_t(i / block)] += double(h2[size_t(i)]) * double(h2[size_t(i)]);
  }
  auto h3 = h;
  kernels::scale_block_sum_squares(h.data(), n, 0.25f, block, sums.data());
  for (int64_t k = 0; k < blocks; ++k) EXPECT_NEAR(sums[k], scaled[k], 1e-9 * scaled[k]) << k;
  EXPECT_EQ(h, h2);
  kernels::scale_block_sum_squares(h3.data() + 2 * block, n - 2 * block, 0.25f, block,
                                   tail.data() + 2);
  for (int64_t k = 2; k < blocks; ++k) EXPECT_EQ(tail[k], sums[k]) << k;
  h[7] = NAN;
  kernels::scale_block_sum_squares(h.data(), n, 1.0f, block, sums.data());
  EXPECT_FALSE(std::isfinite(sums[0]));
}

}  // namespace
}  // namespace forge
