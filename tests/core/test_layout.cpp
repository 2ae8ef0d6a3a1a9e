// Layout ops: finite-difference checks of the views (reshape, permute, slice, expand, contiguous,
// and the derived transpose/squeeze/unsqueeze/flatten/split) and the copies (cat and stack,
// index_select, index_add, gather); view semantics (shared storage, no allocation, strides,
// printing); values; index and shape errors; and parity of kernels/index with its plain references.
#include <gtest/gtest.h>

#include <cstring>

#include "core/allocator.h"
#include "core/kernels/index.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

using testing::randn;
using testing::randn_strided;
using In = std::vector<Tensor>;

// ---- gradient checks: views ----

FORGE_GRADCHECK(reshape, contiguous_and_inferred) {
  EXPECT_GRADCHECK([](const In& v) { return reshape(v[0], {4, -1}); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return flatten(unsqueeze(v[0], 1), 1); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return squeeze(v[0], -2); }, {randn({3, 1, 2})});
}
// The input's strides do not allow a view, so reshape records a contiguous copy first.
FORGE_GRADCHECK(reshape, non_contiguous_copies) {
  EXPECT_GRADCHECK([](const In& v) { return reshape(v[0], {12}); }, {randn_strided({3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return reshape(transpose(v[0], 0, 2), {4, 6}); },
                   {randn({2, 3, 4})});
}

FORGE_GRADCHECK(permute, three_d) {
  EXPECT_GRADCHECK([](const In& v) { return permute(v[0], {2, 0, 1}); }, {randn({2, 3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return mul(transpose(v[0], 0, 1), v[1]); },
                   {randn_strided({3, 4}, 1), randn({4, 3}, 2)});
}

FORGE_GRADCHECK(slice, step_and_negative_start) {
  EXPECT_GRADCHECK([](const In& v) { return slice(v[0], 1, -5, 7, 2); }, {randn({3, 7})});
  EXPECT_GRADCHECK([](const In& v) { return slice(v[0], 0, 1, 5, 3); }, {randn_strided({5, 3})});
}
FORGE_GRADCHECK(slice, split_pieces) {
  EXPECT_GRADCHECK(
      [](const In& v) {
        std::vector<Tensor> parts = split(v[0], std::vector<int64_t>{2, 3}, 1);
        return mul(parts[0], slice(parts[1], 1, 1, 3));
      },
      {randn({2, 5})});
  EXPECT_GRADCHECK([](const In& v) { return split(v[0], 2, 0)[2]; }, {randn({5, 3})});
}

FORGE_GRADCHECK(expand, stretch_and_new_dims) {
  EXPECT_GRADCHECK([](const In& v) { return expand(v[0], {2, 3, 4}); }, {randn({3, 1})});
  EXPECT_GRADCHECK([](const In& v) { return expand(v[0], {5, -1, 3}); }, {randn({2, 1})});
  EXPECT_GRADCHECK([](const In& v) { return mul(expand(v[0], {3, 4}), v[1]); },
                   {randn({1, 4}, 1), randn_strided({3, 4}, 2)});
}

FORGE_GRADCHECK(contiguous, transposed_leaf) {
  EXPECT_GRADCHECK([](const In& v) { return v[0].contiguous(); }, {randn_strided({3, 4})});
  EXPECT_GRADCHECK([](const In& v) { return v[0].clone(); }, {randn({2, 3})});
}

// ---- gradient checks: copies ----

FORGE_GRADCHECK(cat, three_inputs_middle_dim) {
  Tensor constant = randn({2, 1, 4}, 3).detach();  // needs no gradient
  EXPECT_GRADCHECK([](const In& v) { return cat({v[0], v[1], v[2]}, 1); },
                   {randn({2, 3, 4}, 1), constant, randn_strided({2, 2, 4}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return cat({v[0], v[1]}, -1); },
                   {randn({3, 2}, 1), randn({3, 1}, 2)});
}
FORGE_GRADCHECK(cat, stack) {
  EXPECT_GRADCHECK([](const In& v) { return stack({v[0], v[1], v[0]}, 1); },
                   {randn({2, 3}, 1), randn_strided({2, 3}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return stack({v[0], v[1]}, -1); },
                   {randn({3}, 1), randn({3}, 2)});
}

FORGE_GRADCHECK(index_select, repeated_indices) {
  Tensor index = testing::ids({2, 0, 2, 2, 1}, {5});
  EXPECT_GRADCHECK([index](const In& v) { return index_select(v[0], 1, index); },
                   {randn({3, 4, 2})});
  EXPECT_GRADCHECK([index](const In& v) { return index_select(v[0], 0, index); },
                   {randn_strided({3, 4})});
}

// Repeated indices, along a middle and the first dim, with either operand constant.
FORGE_GRADCHECK(index_add, repeated_indices) {
  Tensor index = testing::ids({2, 0, 2, 2, 1}, {5});
  auto middle = [index](const In& v) { return index_add(v[0], 1, index, v[1]); };
  EXPECT_GRADCHECK(middle, {randn({3, 4, 2}, 1), randn({3, 5, 2}, 2)});
  EXPECT_GRADCHECK(middle, {randn({3, 4, 2}, 1).detach(), randn({3, 5, 2}, 2)});
  EXPECT_GRADCHECK(middle, {randn({3, 4, 2}, 1), randn({3, 5, 2}, 2).detach()});
  EXPECT_GRADCHECK([index](const In& v) { return index_add(v[0], 0, index, v[1]); },
                   {randn_strided({3, 4}, 1), randn_strided({5, 4}, 2)});
}

FORGE_GRADCHECK(gather, torch_semantics) {
  // Index smaller than x off the gather axis (dim 0: 2 of 3), repeats along it.
  Tensor index = testing::ids({3, 0, 0, 1, 3, 3, 2, 2, 1, 0, 0, 0}, {2, 3, 2});
  EXPECT_GRADCHECK([index](const In& v) { return gather(v[0], 1, index); }, {randn({3, 4, 2})});
  Tensor rows = testing::ids({2, 0, 1, 2, 0, 0}, {2, 3});
  EXPECT_GRADCHECK([rows](const In& v) { return gather(v[0], 0, rows); }, {randn_strided({3, 4})});
  Tensor last = testing::ids({4, 4, 0, 1, 2, 3, 3, 3}, {2, 4});
  EXPECT_GRADCHECK([last](const In& v) { return gather(v[0], -1, last); }, {randn({2, 5})});
}

// ---- view semantics ----

TEST(Layout, ViewsShareStorageAndDoNotAllocate) {
  Tensor x = randn({2, 3, 4});
  uint64_t before = allocator::stats().allocs;
  Tensor r = reshape(x, {6, 4});
  Tensor p = permute(x, {2, 0, 1});
  Tensor s = slice(x, 2, 1, 4, 2);
  Tensor e = expand(unsqueeze(x, 0), {5, 2, 3, 4});
  Tensor t = transpose(x, 0, 2);
  Tensor f = flatten(x, 1);
  Tensor q = squeeze(unsqueeze(x, 1), 1);
  std::vector<Tensor> parts = split(x, 1, 1);
  Tensor rt = reshape(t, {4, 3, 2, 1});  // only adds a size-1 dim: still a view
  EXPECT_EQ(allocator::stats().allocs, before) << "a view op allocated storage";
  for (const Tensor& v : {r, p, s, e, t, f, q, parts[2], rt}) {
    EXPECT_TRUE(v.shares_storage(x));
    EXPECT_TRUE(v.requires_grad());
  }
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 12, 4, 1}));
  EXPECT_EQ(parts[2].offset(), 8);
  EXPECT_EQ(t.at({3, 2, 1}), x.at({1, 2, 3}));
}

TEST(Layout, ReshapeOfATransposedTensorCopies) {
  Tensor m = reshape(arange(6, DType::f64), {2, 3});
  Tensor t = transpose(m, 0, 1);
  Tensor r = reshape(t, {6});
  EXPECT_FALSE(r.shares_storage(m));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_FALSE(flatten(t).shares_storage(m));
}

TEST(Layout, SliceWithStepStridesTheView) {
  Tensor x = reshape(arange(20), {4, 5});
  Tensor s = slice(x, 1, 1, 5, 2);
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Shape{5, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18}));
  Tensor neg = slice(x, 0, -2, 4);
  EXPECT_EQ(neg.offset(), 10);
  EXPECT_EQ(neg.shape(), (Shape{2, 5}));
  EXPECT_EQ(slice(x, 1, 0, 100).shape(), (Shape{4, 5}));  // end clamps
  EXPECT_EQ(slice(x, 1, 4, 2).shape(), (Shape{4, 0}));
  Tensor twice = slice(slice(x, 1, 0, 5, 2), 1, 1, 3, 2);  // columns 2 (of 0, 2, 4), step 4
  EXPECT_EQ(twice.strides(), (Shape{5, 4}));
  EXPECT_EQ(twice.to_vector<float>(), (std::vector<float>{2, 7, 12, 17}));
}

TEST(Layout, PrintingSmallAndLargeTensors) {
  Tensor small = transpose(reshape(arange(6), {2, 3}), 0, 1);
  EXPECT_EQ(small.str(), "tensor([[0, 3],\n        [1, 4],\n        [2, 5]], shape=[3, 2], dtype=f32)");
  EXPECT_EQ(arange(10).str(), "tensor([0, 1, 2, ..., 7, 8, 9], shape=[10], dtype=f32)");
  std::string big = reshape(arange(400), {20, 20}).str();
  EXPECT_NE(big.find("[0, 1, 2, ..., 17, 18, 19]"), std::string::npos) << big;
  EXPECT_NE(big.find("...,\n"), std::string::npos) << big;  // rows elided too
  EXPECT_NE(big.find("[380, 381, 382, ..., 397, 398, 399]"), std::string::npos) << big;
  EXPECT_EQ(big.find("200"), std::string::npos) << big;
}

// ---- values ----

TEST(Layout, CatAndStackValues) {
  Tensor a = reshape(arange(4), {2, 2}), b = from_vector(std::vector<float>{4, 5}, {2, 1});
  EXPECT_EQ(cat({a, b}, 1).to_vector<float>(), (std::vector<float>{0, 1, 4, 2, 3, 5}));
  EXPECT_EQ(cat({a, a}, 0).shape(), (Shape{4, 2}));
  EXPECT_EQ(cat({a, transpose(a, 0, 1)}, 0).to_vector<float>(),
            (std::vector<float>{0, 1, 2, 3, 0, 2, 1, 3}));
  EXPECT_EQ(cat({a, b.detach()}, -1).shape(), (Shape{2, 3}));
  EXPECT_EQ(stack({a, a}, 2).to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(stack({a, a}, 0).shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(cat({arange(2, DType::i64), arange(3, DType::i64)}, 0).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 0, 1, 2}));
  EXPECT_EQ(cat({zeros({2, 0}), a}, 1).to_vector<float>(), a.to_vector<float>());
}

TEST(Layout, IndexSelectAndGatherValues) {
  Tensor x = reshape(arange(12), {3, 4});
  EXPECT_EQ(index_select(x, 0, testing::ids({2, 0, 2}, {3})).to_vector<float>(),
            (std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(index_select(x, 1, testing::ids({3, 0}, {2})).to_vector<float>(),
            (std::vector<float>{3, 0, 7, 4, 11, 8}));
  EXPECT_EQ(index_select(x, 1, testing::ids({}, {0})).shape(), (Shape{3, 0}));
  EXPECT_EQ(index_select(arange(5, DType::i64), 0, testing::ids({4, 4}, {2})).to_vector<int64_t>(),
            (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(gather(x, 1, testing::ids({3, 0, 1, 1}, {2, 2})).to_vector<float>(),
            (std::vector<float>{3, 0, 5, 5}));
  EXPECT_EQ(gather(x, 0, testing::ids({2, 0, 1, 0}, {1, 4})).to_vector<float>(),
            (std::vector<float>{8, 1, 6, 3}));
  Tensor xt = transpose(x, 0, 1);  // [4, 3], non-contiguous
  EXPECT_EQ(gather(xt, 1, testing::ids({2, 1}, {2, 1})).to_vector<float>(), (std::vector<float>{8, 5}));
}

TEST(Layout, IndexAddValuesWithRepeatedIndices) {
  Tensor x = reshape(arange(6), {3, 2});
  Tensor source = reshape(arange(8), {4, 2});  // rows [0, 1], [2, 3], [4, 5], [6, 7]
  // Row 0 gains source row 1; row 2 gains rows 0, 2 and 3; row 1 is left alone.
  EXPECT_EQ(index_add(x, 0, testing::ids({2, 0, 2, 2}, {4}), source).to_vector<float>(),
            (std::vector<float>{2, 4, 2, 3, 14, 18}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));  // not in place
  Tensor cols = from_vector(std::vector<float>{10, 20, 30, 40}, {2, 2});
  EXPECT_EQ(index_add(transpose(x, 0, 1), -1, testing::ids({1, 1}, {2}), cols).to_vector<float>(),
            (std::vector<float>{0, 32, 4, 1, 73, 5}));
  EXPECT_EQ(index_add(x, 1, testing::ids({}, {0}), zeros({3, 0})).to_vector<float>(),
            x.to_vector<float>());
}

TEST(Layout, IndexAddGradientsWithRepeatedIndices) {
  Tensor x = zeros({3}, DType::f64).set_requires_grad(true);
  Tensor source = zeros({4}, DType::f64).set_requires_grad(true);
  Tensor w = from_vector(std::vector<double>{1, 10, 100}, {3}, DType::f64);
  Tensor index = testing::ids({2, 0, 2, 2}, {4});
  sum(mul(index_add(x, 0, index, source), w)).backward();
  ASSERT_TRUE(x.grad().defined() && source.grad().defined());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 10, 100}));
  EXPECT_EQ(source.grad().to_vector<double>(), (std::vector<double>{100, 1, 100, 100}));
  Tensor fixed = zeros({3}, DType::f64), only = zeros({4}, DType::f64).set_requires_grad(true);
  sum(mul(index_add(fixed, 0, index, only), w)).backward();
  EXPECT_FALSE(fixed.grad().defined());
  ASSERT_TRUE(only.grad().defined());
  EXPECT_EQ(only.grad().to_vector<double>(), (std::vector<double>{100, 1, 100, 100}));
}

TEST(Layout, IndexBackwardAddsRepeatsDeterministically) {
  Tensor x = ones({3, 2}, DType::f64).set_requires_grad(true);
  sum(index_select(x, 0, testing::ids({1, 1, 1, 0}, {4}))).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 3, 3, 0, 0}));
  Tensor y = ones({2, 3}, DType::f64).set_requires_grad(true);
  sum(gather(y, 1, testing::ids({2, 2, 2, 0}, {2, 2}))).backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{0, 0, 2, 1, 0, 1}));
}

// ---- errors ----

template <class F>
Error error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ExitCode::ok, "no error");
}

TEST(Layout, OutOfRangeIndicesAreDataErrorsNamingValuePositionAndRange) {
  Tensor x = reshape(arange(12), {3, 4});
  Error e = error_of([&] { index_select(x, 0, testing::ids({0, 3}, {2})); });
  EXPECT_EQ(e.code(), ExitCode::data);
  std::string what = e.what();
  EXPECT_NE(what.find("index 3 at position [1]"), std::string::npos) << what;
  EXPECT_NE(what.find("[0, 3)"), std::string::npos) << what;
  EXPECT_EQ(error_of([&] { index_select(x, 1, testing::ids({-1}, {1})); }).code(), ExitCode::data);
  e = error_of([&] { gather(x, 1, testing::ids({0, 1, 2, 4}, {2, 2})); });
  EXPECT_EQ(e.code(), ExitCode::data);
  what = e.what();
  EXPECT_NE(what.find("index 4 at position [1, 1]"), std::string::npos) << what;
  EXPECT_NE(what.find("[0, 4)"), std::string::npos) << what;
  EXPECT_EQ(error_of([&] { gather(x, 0, testing::ids({-2}, {1, 1})); }).code(), ExitCode::data);
  e = error_of([&] { index_add(x, 1, testing::ids({0, 4, 1}, {3}), zeros({3, 3})); });
  EXPECT_EQ(e.code(), ExitCode::data);
  what = e.what();
  EXPECT_NE(what.find("index_add: index 4 at position [1]"), std::string::npos) << what;
  EXPECT_NE(what.find("[0, 4)"), std::string::npos) << what;
}

TEST(Layout, BadShapesAndDimsAreRejected) {
  Tensor x = reshape(arange(12), {3, 4});
  const ExitCode internal = ExitCode::internal;
  EXPECT_EQ(error_of([&] { cat({}, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { cat({x, zeros({2, 3})}, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { cat({x, x}, 2); }).code(), internal);
  EXPECT_EQ(error_of([&] { cat({x, x.to(DType::f64)}, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { cat({x, zeros({12})}, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { stack({x, zeros({4, 3})}, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { stack({x}, 3); }).code(), internal);
  EXPECT_EQ(error_of([&] { index_select(x, 0, arange(2)); }).code(), internal);  // f32 index
  EXPECT_EQ(error_of([&] { index_select(x, 0, testing::ids({0, 1}, {1, 2})); }).code(), internal);
  EXPECT_EQ(error_of([&] { index_select(x, 2, testing::ids({0}, {1})); }).code(), internal);
  EXPECT_EQ(error_of([&] { gather(x, 0, testing::ids({0}, {1})); }).code(), internal);  // rank
  EXPECT_EQ(error_of([&] { gather(x, 0, testing::ids({0, 0, 0, 0, 0}, {1, 5})); }).code(), internal);
  Tensor ids2 = testing::ids({0, 2}, {2});
  EXPECT_EQ(error_of([&] { index_add(x, 0, ids2, zeros({2, 3})); }).code(), internal);  // shape
  EXPECT_EQ(error_of([&] { index_add(x, 0, ids2, zeros({2, 4}, DType::f64)); }).code(), internal);
  EXPECT_EQ(error_of([&] { index_add(x, 0, ids2, zeros({4})); }).code(), internal);  // rank
  EXPECT_EQ(error_of([&] { index_add(x, 0, testing::ids({0, 2}, {1, 2}), zeros({2, 4})); }).code(),
            internal);
  EXPECT_EQ(error_of([&] { index_add(x, 2, ids2, zeros({2, 4})); }).code(), internal);
  std::string what = error_of([&] { index_add(x, 1, ids2, zeros({3, 3})); }).what();
  EXPECT_NE(what.find("source has shape [3, 3], expected [3, 2]"), std::string::npos) << what;
  EXPECT_EQ(error_of([&] { reshape(x, {5, -1}); }).code(), internal);
  EXPECT_EQ(error_of([&] { reshape(x, {-1, -1}); }).code(), internal);
  EXPECT_EQ(error_of([&] { permute(x, {0, 0}); }).code(), internal);
  EXPECT_EQ(error_of([&] { transpose(x, 0, 2); }).code(), internal);
  EXPECT_EQ(error_of([&] { slice(x, 0, 0, 2, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { expand(x, {3, 5}); }).code(), internal);
  EXPECT_EQ(error_of([&] { squeeze(x, 0); }).code(), internal);
  EXPECT_EQ(error_of([&] { split(x, std::vector<int64_t>{1, 2}, 1); }).code(), internal);
  Error e = error_of([&] { cat({x, zeros({2, 3})}, 0); });
  EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
}

// ---- kernel parity: fast kernels vs kernels::ref ----

TEST(IndexKernels, CatRowsMatchesReference) {
  const int64_t widths[][3] = {{12, 0, 40}, {4, 4, 4}, {1, 3, 5}, {4096, 8, 1000}};
  for (const auto& w : widths)
    for (int64_t outer : {1, 7, 300}) {
      std::vector<std::vector<char>> inputs;
      std::vector<const void*> ptrs;
      int64_t row = 0;
      for (int t = 0; t < 3; ++t) {
        inputs.emplace_back(static_cast<size_t>(outer * w[t]));
        for (size_t b = 0; b < inputs.back().size(); ++b) inputs.back()[b] = char(b * 7 + t);
        ptrs.push_back(inputs.back().data());
        row += w[t];
      }
      std::vector<char> out(static_cast<size_t>(outer * row)), ref(static_cast<size_t>(outer * row));
      kernels::cat_rows(ptrs.data(), w, 3, outer, out.data());
      kernels::ref::cat_rows(ptrs.data(), w, 3, outer, ref.data());
      ASSERT_EQ(out, ref) << "widths " << w[0] << "," << w[1] << "," << w[2] << " outer " << outer;
    }
}

// index_select geometry (one index per row) and gather geometry (one per element), with repeated
// indices, inner = 1, ragged column cuts and sizes above the parallel grain.
std::vector<kernels::AxisIndex> geometries() {
  std::vector<kernels::AxisIndex> out;
  const int64_t sizes[][4] = {{1, 5, 9, 1},  {4, 3, 2, 7},   {1, 50, 400, 300},
                              {300, 7, 5, 1}, {2, 9, 4, 513}, {64, 30, 30, 20}};
  for (const auto& s : sizes) {
    out.push_back({s[0], s[1], s[2], s[3], {0, 1, 0}});
    out.push_back({s[0], s[1], s[2], s[3], {s[2] * s[3], s[3], 1}});
  }
  return out;
}

std::vector<int64_t> random_index(const kernels::AxisIndex& g, uint64_t seed) {
  bool per_row = g.index_strides[2] == 0;
  int64_t count = per_row ? g.m : g.outer * g.m * g.inner;
  Generator gen(seed);
  std::vector<double> u = uniform({count}, 0, 1, gen, DType::f64).to_vector<double>();
  std::vector<int64_t> index(static_cast<size_t>(count));
  for (size_t i = 0; i < index.size(); ++i) index[i] = int64_t(u[i] * double(g.n)) % g.n;
  return index;
}

template <class T>
void check_gather_parity(const kernels::AxisIndex& g, const std::vector<int64_t>& index) {
  int64_t nx = g.outer * g.n * g.inner, nout = g.outer * g.m * g.inner;
  std::vector<T> x(static_cast<size_t>(nx));
  for (int64_t i = 0; i < nx; ++i) std::memcpy(&x[size_t(i)], &i, sizeof(T) < 8 ? sizeof(T) : 8);
  std::vector<T> out(static_cast<size_t>(nout)), ref(static_cast<size_t>(nout));
  kernels::gather_axis(x.data(), index.data(), g, out.data());
  kernels::ref::gather_axis(x.data(), index.data(), g, ref.data());
  ASSERT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(T)), 0)
      << g.outer << "x" << g.n << "->" << g.m << "x" << g.inner;
}

template <class T>
void check_scatter_parity(const kernels::AxisIndex& g, const std::vector<int64_t>& index) {
  int64_t nx = g.outer * g.n * g.inner, nout = g.outer * g.m * g.inner;
  Generator gen{uint64_t(nout)};
  std::vector<T> dout = normal({nout}, 0, 1, gen, dtype_of<T>()).template to_vector<T>();
  std::vector<T> dx(static_cast<size_t>(nx), T(0.5)), ref(static_cast<size_t>(nx), T(0.5));
  kernels::scatter_add_axis(dout.data(), index.data(), g, dx.data());
  kernels::ref::scatter_add_axis(dout.data(), index.data(), g, ref.data());
  ASSERT_EQ(dx, ref) << g.outer << "x" << g.n << "<-" << g.m << "x" << g.inner;  // same order
}

TEST(IndexKernels, GatherAndScatterAddMatchReference) {
  uint64_t seed = 1;
  for (const kernels::AxisIndex& g : geometries()) {
    std::vector<int64_t> index = random_index(g, seed++);
    check_gather_parity<float>(g, index);
    check_gather_parity<double>(g, index);
    check_gather_parity<int64_t>(g, index);
    check_gather_parity<bf16>(g, index);
    check_scatter_parity<float>(g, index);
    check_scatter_parity<double>(g, index);
  }
}

TEST(IndexKernels, FirstOutOfRange) {
  const int64_t index[] = {0, 4, 2, 5, -1};
  EXPECT_EQ(kernels::first_out_of_range(index, 5, 5), 3);
  EXPECT_EQ(kernels::first_out_of_range(index, 3, 5), -1);
  EXPECT_EQ(kernels::first_out_of_range(index + 4, 1, 5), 0);
}

}  // namespace
}  // namespace forge
