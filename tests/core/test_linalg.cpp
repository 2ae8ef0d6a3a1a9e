// matmul, linear and grouped_linear: finite-difference gradient checks (f64) over broadcasting,
// 1-D operands, transposed views and empty groups; parity of the f32 oneDNN kernels and the f64
// loops against kernels::ref on odd sizes and strided layouts; the primitive cache; and that
// transposed operands are not copied (counted through the caching allocator).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "core/allocator.h"
#include "core/kernels/matmul.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

using testing::randn;
using testing::randn_strided;

Tensor mm(const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }
Tensor lin(const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }
Tensor lin_nobias(const std::vector<Tensor>& in) { return linear(in[0], in[1]); }

// Four groups over 7 rows: 2 rows, none, 1 row, 4 rows.
const std::vector<int64_t> kOffsets = {0, 2, 2, 3, 7};
Tensor grouped(const std::vector<Tensor>& in) {
  return grouped_linear(in[0], in[1], in[2], kOffsets);
}
Tensor grouped_nobias(const std::vector<Tensor>& in) {
  return grouped_linear(in[0], in[1], Tensor(), kOffsets);
}

// ---- gradient checks ----

FORGE_GRADCHECK(matmul, two_d) { EXPECT_GRADCHECK(mm, {randn({3, 4}, 1), randn({4, 5}, 2)}); }
FORGE_GRADCHECK(matmul, batched) {
  EXPECT_GRADCHECK(mm, {randn({2, 3, 4}, 1), randn({2, 4, 5}, 2)});
}
FORGE_GRADCHECK(matmul, broadcast_batch) {
  EXPECT_GRADCHECK(mm, {randn({2, 1, 3, 4}, 1), randn({3, 4, 5}, 2)});
}
FORGE_GRADCHECK(matmul, batched_by_2d) {
  EXPECT_GRADCHECK(mm, {randn({2, 3, 4}, 1), randn({4, 5}, 2)});
}
FORGE_GRADCHECK(matmul, 2d_by_batched) {
  EXPECT_GRADCHECK(mm, {randn({3, 4}, 1), randn({2, 4, 5}, 2)});
}
FORGE_GRADCHECK(matmul, size_one_dims) {
  EXPECT_GRADCHECK(mm, {randn({1, 1, 4}, 1), randn({3, 4, 1}, 2)});
}
FORGE_GRADCHECK(matmul, vector_operands) {
  EXPECT_GRADCHECK(mm, {randn({4}, 1), randn({4, 5}, 2)});
  EXPECT_GRADCHECK(mm, {randn({2, 3, 4}, 1), randn({4}, 2)});
  EXPECT_GRADCHECK(mm, {randn({4}, 1), randn({2, 4, 3}, 2)});
  EXPECT_GRADCHECK(mm, {randn({4}, 1), randn({4}, 2)});
}
FORGE_GRADCHECK(matmul, transposed_inputs) {
  EXPECT_GRADCHECK(mm, {randn_strided({2, 3, 4}, 1), randn_strided({4, 5}, 2)});
  EXPECT_GRADCHECK(mm, {randn_strided({3, 4}, 1), randn_strided({2, 4, 5}, 2)});
}
FORGE_GRADCHECK(matmul, one_side_constant) {
  Tensor b = randn({4, 5}, 2).detach();
  EXPECT_GRADCHECK(mm, {randn({2, 3, 4}, 1), b});
  Tensor a = randn({2, 3, 4}, 1).detach();
  EXPECT_GRADCHECK(mm, {a, randn({4, 5}, 2)});
}

FORGE_GRADCHECK(linear, with_bias) {
  EXPECT_GRADCHECK(lin, {randn({5, 4}, 1), randn({3, 4}, 2), randn({3}, 3)});
}
FORGE_GRADCHECK(linear, without_bias) {
  EXPECT_GRADCHECK(lin_nobias, {randn({5, 4}, 1), randn({3, 4}, 2)});
}
FORGE_GRADCHECK(linear, three_d_input) {
  EXPECT_GRADCHECK(lin, {randn({2, 3, 4}, 1), randn({5, 4}, 2), randn({5}, 3)});
}
FORGE_GRADCHECK(linear, vector_input) {
  EXPECT_GRADCHECK(lin, {randn({4}, 1), randn({3, 4}, 2), randn({3}, 3)});
}
FORGE_GRADCHECK(linear, strided_operands) {
  EXPECT_GRADCHECK(lin, {randn_strided({2, 5, 4}, 1), randn_strided({3, 4}, 2), randn({3}, 3)});
}

FORGE_GRADCHECK(grouped_linear, bias_and_empty_group) {
  EXPECT_GRADCHECK(grouped, {randn({7, 5}, 1), randn({4, 3, 5}, 2), randn({4, 3}, 3)});
}
FORGE_GRADCHECK(grouped_linear, without_bias) {
  EXPECT_GRADCHECK(grouped_nobias, {randn({7, 5}, 1), randn({4, 3, 5}, 2)});
}
FORGE_GRADCHECK(grouped_linear, strided_and_constant_operands) {
  EXPECT_GRADCHECK(grouped, {randn_strided({7, 5}, 1), randn_strided({4, 3, 5}, 2),
                             randn({4, 3}, 3)});
  EXPECT_GRADCHECK(grouped, {randn({7, 5}, 1).detach(), randn({4, 3, 5}, 2), randn({4, 3}, 3)});
  EXPECT_GRADCHECK(grouped, {randn({7, 5}, 1), randn({4, 3, 5}, 2).detach(), randn({4, 3}, 3)});
}

// ---- kernel parity ----

// One operand [batch..., rows, cols] laid out in a buffer: `trans` stores each matrix
// column-major, `pad` widens the leading dimension, `step` spaces elements (2 gives a layout with
// no unit stride, which the kernel must copy), `bcast[d]` gives batch dim d stride 0.
struct Layout {
  bool trans = false;
  int64_t pad = 0;
  int64_t step = 1;
  std::vector<bool> bcast = {};
};

template <class T>
struct Operand {
  std::vector<T> data;
  std::vector<int64_t> strides;
};

template <class T>
Operand<T> make_operand(const Shape& batch, int64_t rows, int64_t cols, const Layout& l,
                        std::mt19937& rng) {
  Operand<T> op;
  const size_t nb = batch.size();
  op.strides.assign(nb + 2, 0);
  int64_t rs = l.trans ? l.step : cols * l.step + l.pad;
  int64_t cs = l.trans ? rows * l.step + l.pad : l.step;
  op.strides[nb] = rs, op.strides[nb + 1] = cs;
  int64_t extent = std::max(rows * rs, cols * cs);
  for (size_t d = nb; d-- > 0;) {
    bool b = d < l.bcast.size() && l.bcast[d];
    op.strides[d] = b ? 0 : extent;
    if (!b) extent *= batch[d];
  }
  std::normal_distribution<double> normal;
  op.data.resize(size_t(extent));
  for (T& v : op.data) v = T(normal(rng));
  return op;
}

struct ParityCase {
  Shape batch;
  int64_t m, n, k;
  Layout a, b;
  bool bias = false;
  float beta = 0.f;
};

std::string describe(const ParityCase& c) {
  std::ostringstream s;
  s << "batch " << shape_str(c.batch) << " m " << c.m << " n " << c.n << " k " << c.k
    << " a.trans " << c.a.trans << " a.step " << c.a.step << " b.trans " << c.b.trans
    << " b.step " << c.b.step << " bias " << c.bias << " beta " << c.beta;
  return s.str();
}

// Runs kernels::matmul<T> and ref::matmul<T> on the same inputs; each element must be within
// `rtol` of the bound sum_q |a||b| (+|bias| + |beta c|), which scales with the rounding budget.
template <class T>
void expect_parity(const ParityCase& c, double rtol, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  auto a = make_operand<T>(c.batch, c.m, c.k, c.a, rng);
  auto b = make_operand<T>(c.batch, c.k, c.n, c.b, rng);
  kernels::MatmulGeometry g{c.batch, c.m, c.n, c.k, a.strides, b.strides};
  std::vector<T> bias(size_t(c.n));
  std::normal_distribution<double> normal;
  for (T& v : bias) v = T(normal(rng));
  const size_t numel = size_t(shape_numel(c.batch) * c.m * c.n);
  std::vector<T> c0(numel);
  for (T& v : c0) v = T(normal(rng));
  if (c.beta == 0.f) c0.assign(numel, T(NAN));  // beta 0 must not read C

  std::vector<T> fast = c0, ref = c0;
  kernels::matmul<T>(g, a.data.data(), b.data.data(), c.bias ? bias.data() : nullptr, fast.data(),
                     c.beta);
  kernels::ref::matmul<T>(g, a.data.data(), b.data.data(), c.bias ? bias.data() : nullptr,
                          ref.data(), c.beta);
  // The error bound: the same product over absolute values.
  for (T& v : a.data) v = std::abs(v);
  for (T& v : b.data) v = std::abs(v);
  for (T& v : bias) v = std::abs(v);
  std::vector<T> bound = c0;
  for (T& v : bound) v = std::abs(v);
  kernels::ref::matmul<T>(g, a.data.data(), b.data.data(), c.bias ? bias.data() : nullptr,
                          bound.data(), std::abs(c.beta));
  for (size_t i = 0; i < numel; ++i) {
    ASSERT_FALSE(std::isnan(double(fast[i]))) << "element " << i;
    ASSERT_LE(std::abs(double(fast[i]) - double(ref[i])), rtol * (double(bound[i]) + 1e-30))
        << "element " << i << ": kernel " << fast[i] << ", reference " << ref[i];
  }
}

std::vector<ParityCase> parity_cases() {
  std::vector<ParityCase> cases;
  const int64_t sizes[] = {1, 7, 33, 129};
  // Every (m, n, k) from the odd sizes, 2-D, cycling through the four transpose combinations.
  int i = 0;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) {
        ParityCase c{{}, m, n, k, {}, {}};
        c.a.trans = i & 1, c.b.trans = (i >> 1) & 1;
        c.bias = i % 3 == 0;
        ++i;
        cases.push_back(c);
      }
  auto add = [&](ParityCase c) { cases.push_back(c); };
  Layout dense, trans{true}, bcast{false, 0, 1, {true}}, trans_bcast{true, 0, 1, {true}};
  add({{3}, 7, 33, 129, dense, dense});                    // batched dense
  add({{3}, 33, 7, 33, trans, trans});                     // batched, both transposed
  add({{4}, 33, 129, 7, dense, bcast});                    // 2-D weight broadcast (folds into M)
  add({{4}, 33, 129, 7, trans, bcast});                    // ... with A transposed (cannot fold)
  add({{4}, 33, 129, 7, dense, trans_bcast, true});        // ... B transposed, bias
  add({{2, 3}, 7, 33, 7, {false, 0, 1, {true, false}}, {false, 0, 1, {false, true}}});
  add({{2, 3}, 7, 7, 33, {false, 0, 1, {false, true}}, {true, 0, 1, {true, false}}});
  add({{3}, 7, 33, 7, bcast, dense});                      // A broadcast
  add({{3}, 7, 33, 7, bcast, trans_bcast});                // both broadcast: A gets expanded
  add({{2, 3, 4}, 7, 7, 7, trans, dense});                 // batch dims merge into one
  add({{2}, 33, 33, 33, {false, 5}, {true, 3}});           // padded leading dims
  add({{2}, 7, 33, 129, {false, 0, 2}, {true, 0, 2}});     // no unit stride: copied
  add({{2}, 7, 33, 129, {true, 0, 2, {true}}, {false, 0, 2}});
  add({{3}, 1, 33, 7, {false, 0, 2}, bcast});              // strided row vector
  add({{3}, 7, 1, 33, dense, {true, 0, 2}});               // strided column vector
  add({{}, 129, 33, 7, dense, dense, true, 1.f});          // accumulate
  add({{3}, 33, 7, 129, trans, bcast, true, 0.5f});        // accumulate, scaled
  add({{}, 7, 1, 33, dense, dense, false, 1.f});           // N = 1 accumulate
  return cases;
}

TEST(MatmulKernel, F32MatchesReference) {
  uint32_t seed = 1;
  for (const ParityCase& c : parity_cases()) expect_parity<float>(c, 1e-5, seed++);
}

TEST(MatmulKernel, F64MatchesReference) {
  uint32_t seed = 1;
  for (const ParityCase& c : parity_cases()) expect_parity<double>(c, 1e-13, seed++);
}

// Ragged M (forward, input gradient) and ragged K (weight gradient) over uneven groups (an empty
// one, one of a single row), K and N off every vector width, B read transposed, A row- and
// column-major; each element within rtol of the bound sum_q |a||b| (+ |bias|).
template <class T>
void expect_grouped_parity(bool ragged_k, bool a_trans, bool bias, double rtol) {
  SCOPED_TRACE(std::string(ragged_k ? "ragged K" : "ragged M") + (a_trans ? ", A transposed" : "") +
               (bias ? ", bias" : ""));
  const std::vector<int64_t> offsets = {0, 13, 13, 14, 43, 50};
  const int64_t groups = 5, total = 50, fixed_m = 19, n = 21, k = 37;
  kernels::GroupedMatmulGeometry g{offsets, ragged_k, ragged_k ? fixed_m : total, n,
                                   ragged_k ? total : k};
  // A [M, K] dense row- or column-major; B [K, N] stored as [N, K] rows (a weight read
  // transposed), one per group when M is ragged.
  g.a_strides[0] = a_trans ? 1 : g.k, g.a_strides[1] = a_trans ? g.m : 1;
  g.b_strides[0] = 1, g.b_strides[1] = g.k;
  g.b_group_stride = ragged_k ? 0 : n * g.k;
  std::mt19937 rng(ragged_k * 4 + a_trans * 2 + bias);
  std::normal_distribution<double> normal;
  auto fill = [&](size_t count) {
    std::vector<T> v(count);
    for (T& e : v) e = T(normal(rng));
    return v;
  };
  std::vector<T> a = fill(size_t(g.m * g.k)), b = fill(size_t((ragged_k ? 1 : groups) * n * g.k));
  std::vector<T> bs = fill(size_t(groups * n));
  const T* pbias = bias ? bs.data() : nullptr;
  const size_t numel = size_t(ragged_k ? groups * g.m * n : total * n);
  std::vector<T> fast(numel, T(NAN)), ref(numel, T(NAN)), bound(numel, T(NAN));
  kernels::grouped_matmul<T>(g, a.data(), b.data(), pbias, fast.data());
  kernels::ref::grouped_matmul<T>(g, a.data(), b.data(), pbias, ref.data());
  for (std::vector<T>* v : {&a, &b, &bs})
    for (T& e : *v) e = std::abs(e);
  kernels::ref::grouped_matmul<T>(g, a.data(), b.data(), pbias, bound.data());
  for (size_t i = 0; i < numel; ++i) {
    ASSERT_FALSE(std::isnan(double(fast[i]))) << "element " << i;
    ASSERT_LE(std::abs(double(fast[i]) - double(ref[i])), rtol * (double(bound[i]) + 1e-30))
        << "element " << i << ": kernel " << fast[i] << ", reference " << ref[i];
  }
  if (ragged_k) {  // group 1 is empty: its product is exactly zero
    for (int64_t i = 0; i < g.m * n; ++i) ASSERT_EQ(fast[size_t(g.m * n + i)], T(0));
  }
}

TEST(MatmulKernel, GroupedMatchesReference) {
  for (bool ragged_k : {false, true})
    for (bool a_trans : {false, true})
      for (bool bias : {false, true}) {
        if (ragged_k && bias) continue;  // weight gradients have no bias
        expect_grouped_parity<float>(ragged_k, a_trans, bias, 1e-5);
        expect_grouped_parity<double>(ragged_k, a_trans, bias, 1e-13);
      }
}

TEST(MatmulKernel, EmptyInnerDimensionGivesBias) {
  kernels::MatmulGeometry g{{}, 2, 3, 0, {0, 1}, {3, 1}};
  std::vector<float> bias = {1, 2, 3}, c(6, NAN);
  kernels::matmul<float>(g, nullptr, nullptr, bias.data(), c.data());
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

TEST(MatmulKernel, PrimitiveCacheHitOnRepeatedShape) {
  Tensor a = normal({37, 41}, 0, 1), b = normal({41, 43}, 0, 1);
  auto before = kernels::matmul_cache_stats();
  matmul(a, b);
  auto first = kernels::matmul_cache_stats();
  EXPECT_EQ(first.misses, before.misses + 1);
  EXPECT_EQ(first.entries, before.entries + 1);
  matmul(a, b);
  matmul(normal({37, 41}, 0, 1), normal({41, 43}, 0, 1));  // new buffers, same geometry
  auto second = kernels::matmul_cache_stats();
  EXPECT_EQ(second.misses, first.misses);
  EXPECT_EQ(second.hits, first.hits + 2);
  EXPECT_EQ(second.entries, first.entries);
}

// ---- no copies of transposed operands ----

// Allocation requests made by fn (after one warm-up call, so caches are filled).
template <class Fn>
uint64_t allocations(Fn fn) {
  fn();
  uint64_t before = allocator::stats().allocs;
  fn();
  return allocator::stats().allocs - before;
}

TEST(Matmul, TransposedViewsAreNotCopied) {
  Tensor a = normal({48, 32}, 0, 1), b = normal({40, 48}, 0, 1);
  Tensor at = transpose(a, 0, 1), bt = transpose(b, 0, 1);  // [32, 48], [48, 40]
  Tensor x = normal({4, 16, 32}, 0, 1), w = normal({32, 24}, 0, 1);
  // Only the output is allocated.
  EXPECT_EQ(allocations([&] { matmul(at, bt); }), 1u);
  EXPECT_EQ(allocations([&] { matmul(transpose(x, -1, -2), x); }), 1u);
  EXPECT_EQ(allocations([&] { matmul(x, transpose(transpose(w, 0, 1), 0, 1)); }), 1u);
  EXPECT_EQ(allocations([&] { linear(x, transpose(w, 0, 1)); }), 1u);
  EXPECT_EQ(allocations([&] { linear(x, normal({24, 32}, 0, 1), zeros({24})); }), 3u);  // + w, b
  // A layout without a unit stride is copied, so the count above can tell.
  Tensor strided = slice(slice(normal({64, 96}, 0, 1), 0, 0, 64, 2), 1, 0, 96, 2);  // [32, 48]
  EXPECT_GT(allocations([&] { matmul(strided, bt); }), 1u);
}

TEST(Matmul, StridedF32MatchesDenseF64) {
  Tensor at = transpose(normal({48, 32}, 0, 1), 0, 1);
  Tensor strided = slice(normal({40, 96}, 0, 1), 1, 0, 96, 2);  // [40, 48], column stride 2
  Tensor bt = transpose(strided, 0, 1);                          // [48, 40]
  Tensor got = matmul(at, bt);
  Tensor want = matmul(at.to(DType::f64).contiguous(), bt.to(DType::f64).contiguous());
  ASSERT_EQ(got.shape(), (Shape{32, 40}));
  for (int64_t i = 0; i < 32; i += 5)
    for (int64_t j = 0; j < 40; j += 3) EXPECT_NEAR(got.at({i, j}), want.at({i, j}), 1e-4);
}

TEST(Matmul, ShapesAndErrors) {
  EXPECT_EQ(matmul(zeros({2, 1, 3, 4}), zeros({5, 4, 6})).shape(), (Shape{2, 5, 3, 6}));
  EXPECT_EQ(matmul(zeros({4}), zeros({3, 4, 6})).shape(), (Shape{3, 6}));
  EXPECT_EQ(matmul(zeros({3, 4, 6}), zeros({6})).shape(), (Shape{3, 4}));
  EXPECT_EQ(matmul(zeros({4}), zeros({4})).shape(), (Shape{}));
  EXPECT_EQ(linear(zeros({2, 3, 4}), zeros({5, 4})).shape(), (Shape{2, 3, 5}));
  try {
    matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] @ [4, 5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(linear(zeros({2, 4}), zeros({5, 3})), Error);
  EXPECT_THROW(linear(zeros({2, 4}), zeros({5, 4}), zeros({4})), Error);
  EXPECT_THROW(matmul(zeros({2, 2}), zeros({2, 2}, DType::f64)), Error);
}

// Three groups, the middle one empty: y rows 0 by w0 = I, rows 1-2 by w2; sum(y) backward.
TEST(GroupedLinear, ValuesAndGradientsByHand) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}, DType::f64);
  Tensor w = from_vector(std::vector<double>{1, 0, 0, 1, 7, 7, 7, 7, 1, 1, 2, -1}, {3, 2, 2},
                         DType::f64);
  Tensor b = from_vector(std::vector<double>{10, 20, 5, 5, 30, 40}, {3, 2}, DType::f64);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  Tensor y = grouped_linear(x, w, b, {0, 1, 1, 3});
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{11, 22, 37, 42, 41, 44}));
  sum(y).backward();
  ASSERT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1, 3, 0, 3, 0}));
  EXPECT_EQ(w.grad().to_vector<double>(),
            (std::vector<double>{1, 2, 1, 2, 0, 0, 0, 0, 8, 10, 8, 10}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1, 1, 0, 0, 2, 2}));
}

// The f32 oneDNN path, forward and backward, against linear run on each group's rows.
TEST(GroupedLinear, F32MatchesLinearPerGroup) {
  const std::vector<int64_t> offsets = {0, 13, 13, 14, 43, 50};
  const int64_t groups = 5;
  Tensor x = normal({50, 37}, 0, 1).set_requires_grad(true);
  Tensor w = normal({groups, 21, 37}, 0, 1).set_requires_grad(true);
  Tensor b = normal({groups, 21}, 0, 1).set_requires_grad(true);
  Tensor dy = normal({50, 21}, 0, 1);
  Tensor y = grouped_linear(x, w, b, offsets);
  y.backward(dy);
  Tensor xr = x.detach().set_requires_grad(true), wr = w.detach().set_requires_grad(true);
  Tensor br = b.detach().set_requires_grad(true);
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < groups; ++g)
    parts.push_back(linear(slice(xr, 0, offsets[size_t(g)], offsets[size_t(g) + 1]),
                           squeeze(slice(wr, 0, g, g + 1), 0), squeeze(slice(br, 0, g, g + 1), 0)));
  Tensor want = cat(parts, 0);
  want.backward(dy);
  auto expect_close = [](const Tensor& got, const Tensor& ref, const char* what) {
    ASSERT_TRUE(got.defined()) << what;
    ASSERT_EQ(got.shape(), ref.shape()) << what;
    std::vector<float> a = got.to_vector<float>(), e = ref.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_NEAR(a[i], e[i], 1e-4 * (1 + std::abs(e[i]))) << what << " element " << i;
  };
  expect_close(y, want, "y");
  expect_close(x.grad(), xr.grad(), "dx");
  expect_close(w.grad(), wr.grad(), "dweight");
  expect_close(b.grad(), br.grad(), "dbias");
  ASSERT_FALSE(HasFatalFailure());
  // Group 1 has no rows: its weight and bias get exact zeros.
  EXPECT_EQ(sum(abs(slice(w.grad(), 0, 1, 2))).item(), 0.0);
  EXPECT_EQ(sum(abs(slice(b.grad(), 0, 1, 2))).item(), 0.0);
}

// Group sizes change every training step: the grouped GEMMs must share primitives across sizes
// (1-row and empty groups included) rather than create one per size.
TEST(GroupedLinear, NewGroupSizesCreateNoPrimitives) {
  Tensor x = normal({40, 24}, 0, 1).set_requires_grad(true);
  Tensor w = normal({4, 20, 24}, 0, 1).set_requires_grad(true);
  Tensor b = normal({4, 20}, 0, 1).set_requires_grad(true);
  auto step = [&](const std::vector<int64_t>& offsets) {
    grouped_linear(x, w, b, offsets).backward(ones({40, 20}));
  };
  step({0, 10, 20, 30, 40});
  auto warm = kernels::matmul_cache_stats();
  step({0, 3, 20, 21, 40});
  step({0, 0, 17, 39, 40});
  step({0, 1, 2, 3, 40});
  auto after = kernels::matmul_cache_stats();
  EXPECT_EQ(after.misses, warm.misses);
  EXPECT_EQ(after.entries, warm.entries);
  EXPECT_EQ(after.hits, warm.hits + 3 * 4 * 3 - 3);  // 3 GEMMs a group, none for the empty one
}

TEST(GroupedLinear, BadShapesAndOffsetsAreRejectedNamingThem) {
  Tensor x = zeros({6, 4}), w = zeros({3, 5, 4}), b = zeros({3, 5});
  auto message = [&](const Tensor& xi, const Tensor& wi, const Tensor& bi,
                     const std::vector<int64_t>& offsets) {
    try {
      grouped_linear(xi, wi, bi, offsets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto expect_message = [](const std::string& what, const char* part) {
    EXPECT_NE(what.find(part), std::string::npos) << what;
  };
  expect_message(message(x, w, b, {0, 2, 6}), "3 offsets for 3 groups (expected G + 1 = 4)");
  expect_message(message(x, w, b, {1, 2, 4, 6}), "offsets[0] is 1, expected 0");
  expect_message(message(x, w, b, {0, 4, 2, 6}), "offsets[2] = 2 is less than offsets[1] = 4");
  expect_message(message(x, w, b, {0, 2, 4, 5}), "offsets[3] is 5, expected M = 6");
  expect_message(message(x, zeros({3, 5, 3}), b, {0, 2, 4, 6}), "expected x [M, K] and weight");
  expect_message(message(x, w, zeros({5}), {0, 2, 4, 6}), "bias [5] does not match");
  expect_message(message(x, w, b.to(DType::f64), {0, 2, 4, 6}), "bias is f64");
  expect_message(message(x.to(DType::f64), w, b, {0, 2, 4, 6}), "x is f64, weight is f32");
  EXPECT_EQ(grouped_linear(x, w, Tensor(), {0, 0, 6, 6}).shape(), (Shape{6, 5}));
}

TEST(Linear, F32MatchesF64WithBias) {
  Tensor x = normal({3, 5, 33}, 0, 1), w = normal({7, 33}, 0, 1), b = normal({7}, 0, 1);
  Tensor got = linear(x, w, b);
  Tensor want = linear(x.to(DType::f64), w.to(DType::f64), b.to(DType::f64));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t n = 0; n < 7; ++n) EXPECT_NEAR(got.at({i, t, n}), want.at({i, t, n}), 1e-4);
}

// ---- bf16 ----

// kernels::matmul_bf16 against ref::matmul in f64 on the same bf16 values: products of bf16 values
// are exact in f32, so the kernel may differ from the exact sum only by f32 rounding of the sums.
void expect_bf16_parity(const ParityCase& c, kernels::Bf16Kernel kernel, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  auto a = make_operand<float>(c.batch, c.m, c.k, c.a, rng);
  auto b = make_operand<float>(c.batch, c.k, c.n, c.b, rng);
  std::vector<bf16> ab(a.data.size()), bb(b.data.size());
  std::vector<double> ad(a.data.size()), bd(b.data.size());
  for (size_t i = 0; i < ab.size(); ++i) ab[i] = f32_to_bf16(a.data[i]), ad[i] = bf16_to_f32(ab[i]);
  for (size_t i = 0; i < bb.size(); ++i) bb[i] = f32_to_bf16(b.data[i]), bd[i] = bf16_to_f32(bb[i]);
  kernels::MatmulGeometry g{c.batch, c.m, c.n, c.k, a.strides, b.strides};
  std::normal_distribution<double> normal;
  std::vector<float> bias(size_t(c.n));
  for (float& v : bias) v = float(normal(rng));
  std::vector<double> bias_d(bias.begin(), bias.end());
  const size_t numel = size_t(shape_numel(c.batch) * c.m * c.n);
  std::vector<float> c0(numel);
  for (float& v : c0) v = float(normal(rng));
  if (c.beta == 0.f) c0.assign(numel, NAN);
  std::vector<float> fast = c0;
  std::vector<double> ref(c0.begin(), c0.end());
  kernels::matmul_bf16(g, ab.data(), bb.data(), c.bias ? bias.data() : nullptr, fast.data(),
                       c.beta, kernel);
  kernels::ref::matmul<double>(g, ad.data(), bd.data(), c.bias ? bias_d.data() : nullptr,
                               ref.data(), c.beta);
  for (double& v : ad) v = std::abs(v);
  for (double& v : bd) v = std::abs(v);
  for (double& v : bias_d) v = std::abs(v);
  std::vector<double> bound(c0.begin(), c0.end());
  for (double& v : bound) v = std::abs(v);
  kernels::ref::matmul<double>(g, ad.data(), bd.data(), c.bias ? bias_d.data() : nullptr,
                               bound.data(), std::abs(c.beta));
  for (size_t i = 0; i < numel; ++i) {
    ASSERT_FALSE(std::isnan(fast[i])) << "element " << i;
    ASSERT_LE(std::abs(double(fast[i]) - ref[i]), 1e-5 * (bound[i] + 1e-30))
        << "element " << i << ": kernel " << fast[i] << ", reference " << ref[i];
  }
}

TEST(MatmulKernel, Bf16WidenedMatchesReferenceOnTheBf16Values) {
  uint32_t seed = 1;
  for (const ParityCase& c : parity_cases())
    expect_bf16_parity(c, kernels::Bf16Kernel::widened, seed++);
}

TEST(MatmulKernel, Bf16NativeMatchesReferenceOnTheBf16Values) {
  if (!kernels::bf16_native()) GTEST_SKIP() << "oneDNN has no bf16 GEMM on this CPU";
  uint32_t seed = 1;
  for (const ParityCase& c : parity_cases())
    expect_bf16_parity(c, kernels::Bf16Kernel::native, seed++);
}

// The exact value of the bf16 computation: operands rounded to bf16, products and sums in f64.
Tensor rounded(const Tensor& t) { return t.to(DType::bf16).to(DType::f64); }

// Each element of got within rtol of the bound sum |a||b| that want's absolute-value twin gives.
void expect_within(const Tensor& got, const Tensor& want, const Tensor& bound, double rtol) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), DType::f32);
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>(),
                      b = bound.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(g[i] - w[i]), rtol * b[i] + 1e-30)
        << "element " << i << ": " << g[i] << " vs " << w[i];
}

TEST(Linear, Bf16PrecisionIsTheExactProductOfBf16OperandsForwardAndBackward) {
  Tensor x = normal({3, 5, 33}, 0, 1).set_requires_grad(true);
  Tensor w = normal({7, 33}, 0, 1).set_requires_grad(true);
  Tensor b = normal({7}, 0, 1).set_requires_grad(true);
  Tensor dy = normal({3, 5, 7}, 0, 1);
  Tensor y;
  {
    MatmulPrecisionScope bf16_scope(MatmulPrecision::bf16);
    y = linear(x, w, b);
    y.backward(dy);
  }
  EXPECT_EQ(matmul_precision(), MatmulPrecision::fp32);  // the scope restored it
  Tensor xr = rounded(x.detach()), wr = rounded(w.detach()), dyr = rounded(dy);
  Tensor xa = abs(xr), wa = abs(wr), dya = abs(dyr);
  Tensor bd = b.detach().to(DType::f64);
  expect_within(y, linear(xr, wr, bd), linear(xa, wa, abs(bd)), 1e-5);
  // dx = dy·w, dw = dyᵀ·x, each from the bf16-rounded gradient and operands.
  expect_within(x.grad(), matmul(dyr, wr), matmul(dya, wa), 1e-5);
  Tensor dyr2 = reshape(dyr, {15, 7}), dya2 = reshape(dya, {15, 7});
  expect_within(w.grad(), matmul(transpose(dyr2, 0, 1), reshape(xr, {15, 33})),
                matmul(transpose(dya2, 0, 1), reshape(xa, {15, 33})), 1e-5);
  // The bias gradient is the row sum of the f32 gradient, not of its bf16 rounding.
  std::vector<double> db = b.grad().to_vector<double>();
  std::vector<double> want = sum(reshape(dy.to(DType::f64), {15, 7}), {0}).to_vector<double>();
  for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db[i], want[i], 1e-5);
}

// The experts of a mixture of experts multiply as linear does, with an empty group and a one-row one.
TEST(GroupedLinear, Bf16PrecisionIsTheExactProductOfBf16OperandsForwardAndBackward) {
  const std::vector<int64_t> offsets = {0, 13, 13, 14, 43, 50};
  Tensor x = normal({50, 37}, 0, 1).set_requires_grad(true);
  Tensor w = normal({5, 21, 37}, 0, 1).set_requires_grad(true);
  Tensor b = normal({5, 21}, 0, 1).set_requires_grad(true);
  Tensor dy = normal({50, 21}, 0, 1);
  Tensor y;
  {
    MatmulPrecisionScope bf16_scope(MatmulPrecision::bf16);
    y = grouped_linear(x, w, b, offsets);
    y.backward(dy);
  }
  Tensor xr = rounded(x.detach()), wr = rounded(w.detach()), dyr = rounded(dy);
  Tensor xa = abs(xr), wa = abs(wr), dya = abs(dyr);
  Tensor bd = b.detach().to(DType::f64);
  expect_within(y, grouped_linear(xr, wr, bd, offsets), grouped_linear(xa, wa, abs(bd), offsets),
                1e-5);
  // dx and dw from the f64 op's own backward on the rounded operands and gradient.
  Tensor xg = xr.detach().set_requires_grad(true), wg = wr.detach().set_requires_grad(true);
  grouped_linear(xg, wg, Tensor(), offsets).backward(dyr);
  Tensor xb = xa.detach().set_requires_grad(true), wb = wa.detach().set_requires_grad(true);
  grouped_linear(xb, wb, Tensor(), offsets).backward(dya);
  expect_within(x.grad(), xg.grad(), xb.grad(), 1e-5);
  expect_within(w.grad(), wg.grad(), wb.grad(), 1e-5);
  EXPECT_EQ(sum(abs(slice(w.grad(), 0, 1, 2))).item(), 0.0);  // the empty group
  // The bias gradient is the row sum of the f32 gradient, not of its bf16 rounding.
  std::vector<double> db = b.grad().to_vector<double>();
  std::vector<double> want = sum(slice(dy.to(DType::f64), 0, 14, 43), {0}).to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(db[3 * 21 + i], want[i], 1e-5);
}

// Against f32 the bf16 result is within 2^-8 of the bound sum |a||b|: each operand is rounded by
// at most 2^-9 of itself, so each product by about 2^-8 (docs/core.md).
TEST(Matmul, Bf16PrecisionIsWithinItsDocumentedToleranceOfF32) {
  Tensor a = normal({4, 9, 130}, 0, 1).set_requires_grad(true);
  Tensor b = normal({130, 17}, 0, 1).set_requires_grad(true);
  Tensor dy = normal({4, 9, 17}, 0, 1);
  Tensor y = matmul(a, b);
  y.backward(dy);
  Tensor da = a.grad(), db = b.grad();
  a.set_grad(Tensor()), b.set_grad(Tensor());
  Tensor y16;
  {
    MatmulPrecisionScope bf16_scope(MatmulPrecision::bf16);
    y16 = matmul(a, b);
    y16.backward(dy);
  }
  Tensor aa = abs(a.detach()), ba = abs(b.detach()), dya = abs(dy);
  expect_within(y16, y, matmul(aa, ba), std::ldexp(1.0, -8));
  expect_within(a.grad(), da, matmul(dya, transpose(ba, 0, 1)), std::ldexp(1.0, -8));
  expect_within(b.grad(), db,
                matmul(transpose(reshape(aa, {36, 130}), 0, 1), reshape(dya, {36, 17})),
                std::ldexp(1.0, -8));
  // And bf16 is not f32: the rounding shows.
  EXPECT_GT(max(abs(y16 - y)).item(), 1e-4);
}

TEST(Linear, AFrozenBf16WeightMultipliesAsBf16PrecisionDoes) {
  Tensor x = normal({6, 33}, 0, 1), w = normal({7, 33}, 0, 1), b = normal({7}, 0, 1);
  Tensor frozen = linear(x, w.to(DType::bf16), b);
  Tensor scoped;
  {
    MatmulPrecisionScope bf16_scope(MatmulPrecision::bf16);
    scoped = linear(x, w, b);
  }
  EXPECT_EQ(frozen.dtype(), DType::f32);
  EXPECT_EQ(frozen.to_vector<float>(), scoped.to_vector<float>());
  // Gradients reach x through the bf16 weight.
  Tensor xg = x.clone().set_requires_grad(true);
  sum(linear(xg, w.to(DType::bf16), b)).backward();
  EXPECT_TRUE(xg.grad().defined());
  EXPECT_EQ(xg.grad().dtype(), DType::f32);
}

}  // namespace
}  // namespace forge
