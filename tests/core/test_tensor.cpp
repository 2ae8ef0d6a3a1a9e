// Tensor handles, dtypes, printing, the Philox generator and initialisers, and the caching
// allocator.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "core/allocator.h"
#include "core/kernels/copy.h"
#include "core/ops.h"

namespace forge {
namespace {

TEST(Tensor, FactoriesShapesAndAccess) {
  Tensor t = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.at({1, 2}), 6.0);
  EXPECT_EQ(zeros({2, 2}, DType::f64).to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(full({3}, 2.5).to_vector<float>(), std::vector<float>(3, 2.5f));
  EXPECT_EQ(arange(4, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(scalar(7.0).item(), 7.0);
  EXPECT_THROW(t.item(), Error);
  EXPECT_THROW(t.at({2, 0}), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(empty({-1}), Error);
}

TEST(Tensor, ViewsShareStorageAndContiguousCopiesOnlyWhenNeeded) {
  Tensor t = arange(12).detach();
  Tensor m = reshape(t, {3, 4});
  EXPECT_TRUE(m.shares_storage(t));
  Tensor tr = transpose(m, 0, 1);
  EXPECT_TRUE(tr.shares_storage(t));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.at({3, 2}), 11.0);
  Tensor c = tr.contiguous();
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_TRUE(m.contiguous().shares_storage(t));
  Tensor cl = m.clone();
  {
    NoGradGuard g;
    cl.fill_(0);
  }
  EXPECT_EQ(t.at({5}), 5.0);
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  Tensor x = from_vector(std::vector<double>{1.0, -2.5, 3.14159265358979, 1e-3}, {4}, DType::f64);
  EXPECT_EQ(x.to(DType::f32).to(DType::f64).at({2}), double(float(3.14159265358979)));
  Tensor b = x.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.to(DType::f32).at({0}), 1.0);
  EXPECT_EQ(b.to(DType::f32).at({1}), -2.5);
  EXPECT_NEAR(b.to(DType::f32).at({2}), 3.14159265358979, 3.14159265358979 / 128);
  EXPECT_EQ(x.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3, 0}));
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to the even one, 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(Tensor, SkipInitScopeDrawsNothingAndEndsWithItsLifetime) {
  Generator a(9), b(9);
  Tensor first = normal({8}, 0.0, 1.0, a);
  {
    const SkipInitScope skip;
    {
      const SkipInitScope nested;
    }
    Tensor skipped = normal({1000}, 0.0, 1.0, b);
    uniform({1000}, -1.0, 1.0, b);
    trunc_normal({1000}, 0.0, 1.0, -2.0, 2.0, b);
    EXPECT_EQ(skipped.shape(), Shape({1000}));
  }
  // b drew nothing inside, so it continues where a did after its first draw.
  EXPECT_EQ(normal({8}, 0.0, 1.0, b).to_vector<float>(), first.to_vector<float>());
  EXPECT_NE(normal({8}, 0.0, 1.0, b).to_vector<float>(), first.to_vector<float>());
}

TEST(Tensor, ResetStorageChangesTheDtypeOfEveryHandleAndRefusesTrainedTensors) {
  Tensor w = ones({3, 4});
  Tensor handle = w;
  w.reset_storage_(DType::bf16);
  EXPECT_EQ(handle.dtype(), DType::bf16);
  EXPECT_EQ(handle.shape(), Shape({3, 4}));
  EXPECT_TRUE(handle.is_contiguous());
  Tensor trained = ones({2});
  trained.set_requires_grad(true);
  EXPECT_THROW(trained.reset_storage_(DType::bf16), Error);
}

TEST(Tensor, PrintingShowsValuesShapeAndDtype) {
  Tensor t = from_vector(std::vector<double>{1, 2.5, -3, 4}, {2, 2});
  EXPECT_EQ(t.str(), "tensor([[1, 2.5],\n        [-3, 4]], shape=[2, 2], dtype=f32)");
  std::string big = arange(1000).str();
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_NE(big.find("999"), std::string::npos);
  EXPECT_LT(big.size(), 120u);
  EXPECT_NE(zeros({1}).set_requires_grad(true).str().find("requires_grad"), std::string::npos);
  EXPECT_EQ(Tensor().str(), "Tensor(undefined)");
}

TEST(Tensor, StridedCopyMatchesReference) {
  Generator g(4);
  Tensor src = normal({6, 5, 7}, 0, 1, g);
  const Shape strides[] = {{35, 7, 1}, {1, 6, 30}, {7, 42, 1}};
  const Shape shape = {6, 5, 7};
  for (const Shape& dst_strides : strides) {
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      Tensor a = zeros({300}, dt), b = zeros({300}, dt);
      kernels::copy_strided(src.raw_data(), DType::f32, src.strides().data(), a.raw_data(), dt,
                            dst_strides.data(), shape.data(), 3);
      kernels::ref::copy_strided(src.raw_data(), DType::f32, src.strides().data(), b.raw_data(), dt,
                                 dst_strides.data(), shape.data(), 3);
      EXPECT_EQ(a.to(DType::f64).to_vector<double>(), b.to(DType::f64).to_vector<double>());
    }
  }
}

TEST(Rng, PhiloxMatchesPublishedTestVectors) {
  // Known-answer tests of Philox4x32-10 from the Random123 distribution (kat_vectors).
  auto zero = philox(0, 0, 0);
  EXPECT_EQ(zero, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto ones_ = philox(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(ones_, (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Rng, SameNumbersForAnyThreadCount) {
  auto draw = [](int threads) {
    omp_set_num_threads(threads);
    Generator g(2024);
    auto a = normal({300000}, 0, 1, g).to_vector<float>();
    auto b = uniform({300000}, -1, 1, g).to_vector<float>();
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  int saved = omp_get_max_threads();
  auto one = draw(1), two = draw(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(Rng, GeneratorStateResumesTheStream) {
  Generator g(7);
  normal({10}, 0, 1, g);
  GeneratorState mid = g.state();
  auto expected = normal({10}, 0, 1, g).to_vector<float>();
  Generator h(0);
  h.set_state(mid);
  EXPECT_EQ(normal({10}, 0, 1, h).to_vector<float>(), expected);
  EXPECT_NE(rng_stream("dropout", 1), rng_stream("dropout", 2));
  EXPECT_NE(rng_stream("dropout", 1), rng_stream("init", 1));
}

double moment(const std::vector<double>& v, int k, double center) {
  double s = 0;
  for (double x : v) s += std::pow(x - center, k);
  return s / double(v.size());
}

TEST(Rng, InitialiserStatistics) {
  Generator g(1);
  const int64_t n = 200000;
  auto u = uniform({n}, -2, 3, g, DType::f64).to_vector<double>();
  EXPECT_GE(*std::min_element(u.begin(), u.end()), -2.0);
  EXPECT_LT(*std::max_element(u.begin(), u.end()), 3.0);
  EXPECT_NEAR(moment(u, 1, 0), 0.5, 0.02);
  EXPECT_NEAR(moment(u, 2, 0.5), 25.0 / 12, 0.03);

  auto z = normal({n}, 1.0, 2.0, g, DType::f64).to_vector<double>();
  EXPECT_NEAR(moment(z, 1, 0), 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(moment(z, 2, 1.0)), 2.0, 0.02);
  EXPECT_NEAR(moment(z, 4, 1.0) / std::pow(moment(z, 2, 1.0), 2), 3.0, 0.05);  // kurtosis

  // N(0, 1) truncated to [-2, 2] has standard deviation 0.8796.
  auto t = trunc_normal({n}, 0.0, 1.0, -2.0, 2.0, g, DType::f64).to_vector<double>();
  EXPECT_GE(*std::min_element(t.begin(), t.end()), -2.0);
  EXPECT_LE(*std::max_element(t.begin(), t.end()), 2.0);
  EXPECT_NEAR(moment(t, 1, 0), 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(moment(t, 2, 0)), 0.8796, 0.01);
  EXPECT_THROW(trunc_normal({3}, 0, 1, 2, -2, g), Error);
}

TEST(Rng, ErfinvInvertsErf) {
  for (double x : {-3.0, -1.0, -1e-4, 0.0, 0.3, 2.5})
    EXPECT_NEAR(erfinv(std::erf(x)), x, 1e-9 * (1 + std::fabs(x))) << x;
}

TEST(Allocator, ReusesBlocksAndCountsBytes) {
  allocator::reset_peak();
  AllocatorStats s0 = allocator::stats();
  {
    Tensor a = empty({1 << 16});
    AllocatorStats s1 = allocator::stats();
    EXPECT_EQ(s1.current_bytes - s0.current_bytes, allocator::round_size(4 << 16));
    EXPECT_GE(s1.peak_bytes, s1.current_bytes);
  }
  AllocatorStats s2 = allocator::stats();
  EXPECT_EQ(s2.current_bytes, s0.current_bytes);
  { Tensor b = empty({1 << 16}); }
  EXPECT_EQ(allocator::stats().system_allocs, s2.system_allocs);  // served from the cache
  EXPECT_EQ(allocator::round_size(1), 512u);
  EXPECT_EQ(allocator::round_size(513), 1024u);
  EXPECT_LE(allocator::round_size((1 << 20) + 1), size_t((1 << 20) * 1.126));
  allocator::empty_cache();
  EXPECT_EQ(allocator::stats().cached_bytes, 0u);
}

}  // namespace
}  // namespace forge
