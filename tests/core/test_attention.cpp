// Fused attention: finite-difference checks of the op (f64 path), parity of the tiled f32 kernel and
// the f64 kernel with the reference loops over odd shapes, strided layouts and masks, the rule that a
// query with nothing to attend gives zeros (never NaN), and equality with the unfused composition.
// Grouped-query heads are checked the same ways, against repeated keys and values, and against
// PyTorch (tests/golden/llama_kernels.txt, written by make_llama_kernel_goldens.py). Packed rows
// (segment ids) against the reference and against each record attended alone.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/kernels/attention.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using testing::randn;
using In = std::vector<Tensor>;

AttentionOptions opts(bool causal, double scale = 0.0) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale;
  return o;
}

In qkv(int64_t B, int64_t H, int64_t T, int64_t S, int64_t D, int64_t Hkv = 0) {
  if (Hkv == 0) Hkv = H;
  return {randn({B, H, T, D}, 1), randn({B, Hkv, S, D}, 2), randn({B, Hkv, S, D}, 3)};
}

// ---- finite differences (f64) ----

FORGE_GRADCHECK(attention, non_causal) {
  EXPECT_GRADCHECK([](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); },
                   qkv(2, 2, 3, 5, 4));
}
FORGE_GRADCHECK(attention, causal_square) {
  EXPECT_GRADCHECK(
      [](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, opts(true)); },
      qkv(1, 2, 4, 4, 3));
}
// T < S: bottom-right aligned, query t sees keys s <= t + S - T (what a KV cache needs).
FORGE_GRADCHECK(attention, causal_fewer_queries) {
  EXPECT_GRADCHECK(
      [](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, opts(true)); },
      qkv(1, 2, 3, 6, 3));
}
// T > S: the first T - S queries see no key, so their rows and gradients are zero.
FORGE_GRADCHECK(attention, causal_more_queries) {
  EXPECT_GRADCHECK(
      [](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, opts(true)); },
      qkv(1, 1, 5, 3, 3));
}
// Batch 1 attends nothing: empty rows in the middle of a call.
FORGE_GRADCHECK(attention, padding_mask_with_empty_batch) {
  Tensor mask = testing::constant({1, 1, 0, 1, 0, 0, 0, 0, 0, 0}, {2, 5});
  EXPECT_GRADCHECK(
      [mask](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], mask); },
      qkv(2, 2, 3, 5, 4));
}
// Left padding under a causal mask: rows 0 and 1 see only padded keys.
FORGE_GRADCHECK(attention, causal_with_left_padding) {
  Tensor mask = testing::constant({0, 0, 1, 1, 1}, {1, 5});
  EXPECT_GRADCHECK(
      [mask](const In& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], mask, opts(true));
      },
      qkv(1, 2, 5, 5, 3));
}
// q, k, v as [B, T, H, D] leaves seen through transpose, as projections produce them.
FORGE_GRADCHECK(attention, transposed_views) {
  EXPECT_GRADCHECK(
      [](const In& v) {
        return scaled_dot_product_attention(transpose(v[0], 1, 2), transpose(v[1], 1, 2),
                                            transpose(v[2], 1, 2), {}, opts(true));
      },
      {randn({2, 4, 2, 3}, 1), randn({2, 4, 2, 3}, 2), randn({2, 4, 2, 3}, 3)});
}
// One fused projection [B, T, 3, H, D] split into q, k, v views; gradients meet in one leaf.
FORGE_GRADCHECK(attention, fused_qkv_views) {
  EXPECT_GRADCHECK(
      [](const In& v) {
        Tensor p = permute(v[0], {2, 0, 3, 1, 4});  // [3, B, H, T, D]
        auto part = [&](int64_t i) { return squeeze(slice(p, 0, i, i + 1), 0); };
        return scaled_dot_product_attention(part(0), part(1), part(2), {}, opts(true));
      },
      {randn({2, 4, 3, 2, 3}, 1)});
}
// The head dimension itself strided (copied by the op before the kernel).
FORGE_GRADCHECK(attention, strided_head_dim) {
  EXPECT_GRADCHECK([](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); },
                   {testing::randn_strided({1, 2, 3, 4}, 1), testing::randn_strided({1, 2, 5, 4}, 2),
                    testing::randn_strided({1, 2, 5, 4}, 3)});
}
FORGE_GRADCHECK(attention, custom_scale) {
  EXPECT_GRADCHECK(
      [](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, opts(false, 0.3)); },
      qkv(1, 2, 3, 4, 4));
}
FORGE_GRADCHECK(attention, head_dim_5_with_mask) {
  Tensor mask = testing::constant({1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1}, {2, 6});
  EXPECT_GRADCHECK(
      [mask](const In& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], mask, opts(true));
      },
      qkv(2, 1, 6, 6, 5));
}
// Gradients for a subset of inputs: the others are constants and their work is skipped.
FORGE_GRADCHECK(attention, some_inputs_constant) {
  In only_q = qkv(1, 2, 3, 4, 3), only_kv = qkv(1, 2, 3, 4, 3);
  only_q[1] = only_q[1].detach();
  only_q[2] = only_q[2].detach();
  only_kv[0] = only_kv[0].detach();
  auto f = [](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2], {}, opts(true)); };
  EXPECT_GRADCHECK(f, only_q);
  EXPECT_GRADCHECK(f, only_kv);
}

// Grouped-query heads: dk and dv sum over the query heads sharing a key/value head.
FORGE_GRADCHECK(attention, grouped_query_causal_masked) {
  Tensor mask = testing::constant({0, 1, 1, 1, 1, 1, 1, 0, 1, 1}, {2, 5});
  EXPECT_GRADCHECK(
      [mask](const In& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], mask, opts(true));
      },
      qkv(2, 4, 3, 5, 3, 2));
}
FORGE_GRADCHECK(attention, multi_query) {
  EXPECT_GRADCHECK([](const In& v) { return scaled_dot_product_attention(v[0], v[1], v[2]); },
                   qkv(1, 4, 4, 3, 3, 1));
}
// Keys and values as strided views of one [B, S, 2, Hkv, D] projection, a decode-like T < S.
FORGE_GRADCHECK(attention, grouped_query_fused_kv_views) {
  EXPECT_GRADCHECK(
      [](const In& v) {
        Tensor kv = permute(v[1], {2, 0, 3, 1, 4});  // [2, B, Hkv, S, D]
        auto part = [&](int64_t i) { return squeeze(slice(kv, 0, i, i + 1), 0); };
        return scaled_dot_product_attention(v[0], part(0), part(1), {}, opts(true));
      },
      {randn({1, 4, 2, 3}, 1), randn({1, 5, 2, 2, 3}, 2)});
}

// Packed rows: queries attend only their own record's keys. Row 0 holds records of 3, 1 and 2
// tokens; row 1 one record and padding keys inside it.
AttentionOptions packed(const Tensor& segments, bool causal = true) {
  AttentionOptions o = opts(causal);
  o.segments = segments;
  return o;
}
FORGE_GRADCHECK(attention, packed_records_grouped_query) {
  Tensor segments = testing::ids({0, 0, 0, 1, 2, 2, 5, 5, 5, 5, 5, 5}, {2, 6});
  Tensor mask = testing::constant({1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1}, {2, 6});
  EXPECT_GRADCHECK(
      [=](const In& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], mask, packed(segments));
      },
      qkv(2, 4, 6, 6, 3, 2));
}
FORGE_GRADCHECK(attention, packed_records_bidirectional) {
  Tensor segments = testing::ids({0, 0, 1, 1, 1}, {1, 5});
  EXPECT_GRADCHECK(
      [=](const In& v) {
        return scaled_dot_product_attention(v[0], v[1], v[2], {}, packed(segments, false));
      },
      qkv(1, 2, 5, 5, 4));
}

// ---- kernel parity with the reference ----

// [B,H,T,D], [B,T,H,D], one [B,T,H+2Hkv,D] buffer (q, k, v heads side by side: a fused projection)
enum class Layout { dense, transposed, fused };

struct KernelCase {
  int64_t B, H, T, S, D;
  bool causal, masked;
  Layout layout;
  int64_t Hkv = 0;     // key/value heads; 0 means H
  int64_t record = 0;  // > 0: packed rows (T == S) of records of 1 to `record` tokens
  int64_t kv_heads() const { return Hkv == 0 ? H : Hkv; }
  std::string str() const {
    return "B=" + std::to_string(B) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(kv_heads()) + " T=" + std::to_string(T) +
           " S=" + std::to_string(S) + " D=" + std::to_string(D) + (causal ? " causal" : "") +
           (masked ? " masked" : "") + " layout=" + std::to_string(int(layout)) +
           (record ? " records<=" + std::to_string(record) : "");
  }
};

// q, k, v as raw pointers and strides into tensors of the case's layout.
template <class T>
struct Operands {
  Tensor qt, kt, vt;
  const T *q, *k, *v;
  kernels::RowStrides qs, ks, vs;
};

template <class T>
Operands<T> make_operands(const KernelCase& c, uint64_t seed) {
  Generator gen(seed);
  const DType dt = dtype_of<T>();
  const int64_t B = c.B, H = c.H, Hkv = c.kv_heads(), T_ = c.T, S = c.S, D = c.D;
  Operands<T> o;
  if (c.layout == Layout::fused) {
    // Rows for the longer of queries and keys: with S > T (decoding after a prefix) the keys and
    // values read S rows of the buffer, the queries T.
    const int64_t row = (H + 2 * Hkv) * D, rows = std::max(T_, S);
    o.qt = normal({B, rows, H + 2 * Hkv, D}, 0, 1, gen, dt);
    o.q = o.qt.template data<T>();
    o.k = o.q + H * D;
    o.v = o.q + (H + Hkv) * D;
    o.qs = o.ks = o.vs = {rows * row, D, row};
  } else if (c.layout == Layout::transposed) {
    o.qt = normal({B, T_, H, D}, 0, 1, gen, dt);
    o.kt = normal({B, S, Hkv, D}, 0, 1, gen, dt);
    o.vt = normal({B, S, Hkv, D}, 0, 1, gen, dt);
    o.q = o.qt.template data<T>(), o.k = o.kt.template data<T>(), o.v = o.vt.template data<T>();
    o.qs = {T_ * H * D, D, H * D};
    o.ks = o.vs = {S * Hkv * D, D, Hkv * D};
  } else {
    o.qt = normal({B, H, T_, D}, 0, 1, gen, dt);
    o.kt = normal({B, Hkv, S, D}, 0, 1, gen, dt);
    o.vt = normal({B, Hkv, S, D}, 0, 1, gen, dt);
    o.q = o.qt.template data<T>(), o.k = o.kt.template data<T>(), o.v = o.vt.template data<T>();
    o.qs = {H * T_ * D, T_ * D, D};
    o.ks = o.vs = {Hkv * S * D, S * D, D};
  }
  return o;
}

// Random keys switched off; with B > 1 the last batch attends nothing (empty rows).
std::vector<uint8_t> make_mask(const KernelCase& c, uint64_t seed) {
  Generator gen(seed);
  Tensor u = uniform({c.B, c.S}, 0, 1, gen);
  std::vector<uint8_t> m(static_cast<size_t>(c.B * c.S));
  for (int64_t i = 0; i < c.B * c.S; ++i) m[size_t(i)] = u.data<float>()[i] < 0.7f;
  if (c.B > 1)
    for (int64_t s = 0; s < c.S; ++s) m[size_t((c.B - 1) * c.S + s)] = 0;
  return m;
}

// Record ids [B, T] of packed rows: consecutive records of 1 to c.record tokens, the last one cut
// at the row's end.
std::vector<int64_t> make_segments(const KernelCase& c, uint64_t seed) {
  Generator gen(seed);
  Tensor u = uniform({c.B * c.T}, 0, 1, gen);
  std::vector<int64_t> ids(size_t(c.B * c.T));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0, id = 0; t < c.T; ++id) {
      const int64_t len = 1 + int64_t(u.data<float>()[b * c.T + t] * float(c.record));
      for (int64_t i = 0; i < len && t < c.T; ++i, ++t) ids[size_t(b * c.T + t)] = id;
    }
  return ids;
}

template <class T>
double max_abs(const std::vector<T>& x) {
  double m = 0;
  for (T e : x) m = std::max(m, std::fabs(double(e)));
  return m;
}

// max |got - want| <= tol · max(max |want|, 1), and no NaN. The floor matters where the exact answer
// is 0 but the fused kernel sums rounding noise: with S = 1, dS = P (dP - rowsum(dO∘O)) cancels.
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double limit = tol * std::max(max_abs(want), 1.0);
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(double(got[i]))) << what << " is NaN at " << i;
    double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  EXPECT_LE(worst, limit) << what << ": worst at " << at << " got " << got[at] << " want "
                          << want[at];
}

template <class T>
void expect_lse_close(const std::vector<T>& got, const std::vector<T>& want, double tol) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(double(want[i]))) {
      EXPECT_TRUE(std::isinf(double(got[i])) && got[i] > 0) << "lse " << i << " = " << got[i];
    } else {
      EXPECT_NEAR(double(got[i]), double(want[i]), tol * std::max(1.0, std::fabs(double(want[i]))))
          << "lse " << i;
    }
  }
}

template <class T>
void check_parity(const KernelCase& c, double tol) {
  SCOPED_TRACE(c.str());
  Operands<T> o = make_operands<T>(c, 7);
  std::vector<uint8_t> mask = c.masked ? make_mask(c, 8) : std::vector<uint8_t>();
  std::vector<int64_t> segments = c.record ? make_segments(c, 10) : std::vector<int64_t>();
  const kernels::AttentionShape n{c.B, c.H, c.kv_heads(), c.T, c.S, c.D};
  const kernels::AttentionParams p{c.causal, 1.0 / std::sqrt(double(c.D)),
                                   c.masked ? mask.data() : nullptr,
                                   c.record ? segments.data() : nullptr};
  const size_t nq = size_t(c.B * c.H * c.T * c.D), nk = size_t(c.B * c.kv_heads() * c.S * c.D);
  const size_t nrows = size_t(c.B * c.H * c.T);
  // Outputs start as NaN, so an element a kernel forgets to write fails the comparison.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> out(nq, nan), lse(nrows, nan), out_ref(nq, nan), lse_ref(nrows, nan);
  kernels::attention_forward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out.data(), lse.data());
  kernels::ref::attention_forward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out_ref.data(),
                                     lse_ref.data());
  expect_close(out, out_ref, tol, "out");
  expect_lse_close(lse, lse_ref, tol);

  Generator gen(9);
  Tensor g = normal({c.B, c.H, c.T, c.D}, 0, 1, gen, dtype_of<T>());
  const T* dout = g.data<T>();
  std::vector<T> dq(nq, nan), dk(nk, nan), dv(nk, nan), dq_ref(nq, nan), dk_ref(nk, nan),
      dv_ref(nk, nan);
  kernels::attention_backward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out.data(), dout,
                                 lse.data(), dq.data(), dk.data(), dv.data());
  kernels::ref::attention_backward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out_ref.data(), dout,
                                      lse_ref.data(), dq_ref.data(), dk_ref.data(), dv_ref.data());
  expect_close(dq, dq_ref, tol, "dq");
  expect_close(dk, dk_ref, tol, "dk");
  expect_close(dv, dv_ref, tol, "dv");

  // Asking for one gradient gives the same values as asking for all three.
  std::vector<T> only(nk, nan);
  kernels::attention_backward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out.data(), dout,
                                 lse.data(), nullptr, nullptr, only.data());
  EXPECT_EQ(only, dv);
  only.assign(nk, nan);
  kernels::attention_backward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out.data(), dout,
                                 lse.data(), nullptr, only.data(), nullptr);
  EXPECT_EQ(only, dk);
  only.assign(nq, nan);
  kernels::attention_backward<T>(n, p, o.q, o.qs, o.k, o.ks, o.v, o.vs, out.data(), dout,
                                 lse.data(), only.data(), nullptr, nullptr);
  EXPECT_EQ(only, dq);
}

// Odd sizes around the 64-wide tiles (1, 7, 65, 130), head dims off the 16-float vector width,
// T < S, T > S, decode steps, every layout, with and without masks.
const std::vector<KernelCase> kCases = {
    {1, 1, 1, 1, 5, false, false, Layout::dense},
    {1, 1, 1, 1, 5, true, true, Layout::fused},
    {2, 3, 7, 7, 16, true, false, Layout::transposed},
    {1, 2, 65, 65, 64, true, true, Layout::fused},
    {2, 2, 130, 130, 64, true, false, Layout::dense},
    {2, 1, 65, 130, 80, true, true, Layout::transposed},
    {1, 2, 130, 65, 24, true, false, Layout::dense},
    {2, 2, 7, 130, 128, false, true, Layout::dense},
    {3, 1, 1, 130, 64, true, true, Layout::transposed},
    {4, 2, 1, 97, 32, true, true, Layout::dense},
    {2, 3, 1, 65, 24, false, false, Layout::transposed},
    {2, 1, 130, 7, 5, false, true, Layout::dense},
    {1, 1, 130, 1, 32, true, false, Layout::transposed},
    {2, 2, 65, 1, 16, false, true, Layout::dense},
    {1, 1, 7, 65, 48, true, false, Layout::dense},
    {1, 3, 130, 130, 5, false, true, Layout::fused},
};

TEST(AttentionKernel, F32MatchesReference) {
  for (const KernelCase& c : kCases) check_parity<float>(c, 1e-5);
}

TEST(AttentionKernel, F32MatchesReferenceOnRandomShapes) {
  const int64_t sizes[] = {1, 7, 65, 130}, dims[] = {5, 16, 64, 80};
  Generator gen(3);
  Tensor u = uniform({8, 6}, 0, 1, gen);
  auto pick = [&](int64_t i, int64_t j, int64_t n) { return int64_t(u.at({i, j}) * double(n)); };
  for (int64_t i = 0; i < 8; ++i) {
    KernelCase c{1 + pick(i, 0, 2), 1 + pick(i, 1, 2), sizes[pick(i, 2, 4)], sizes[pick(i, 3, 4)],
                 dims[pick(i, 4, 4)], pick(i, 5, 2) == 1, i % 2 == 0, Layout::transposed};
    if (c.T == c.S && i % 3 == 0) c.layout = Layout::fused;
    check_parity<float>(c, 1e-5);
  }
}

TEST(AttentionKernel, F64MatchesReference) {
  for (const KernelCase& c : kCases)
    if (c.T * c.S <= 130 * 65) check_parity<double>(c, 1e-12);
}

// Four query heads over two key/value heads (groups of two) and over one (multi-query), causal and
// masked, T != S as against a KV cache, decode steps, each layout.
const std::vector<KernelCase> kGroupedCases = {
    {2, 4, 7, 130, 16, true, true, Layout::dense, 2},
    {1, 4, 65, 130, 64, true, false, Layout::transposed, 2},
    {2, 4, 130, 65, 24, false, true, Layout::fused, 2},
    {2, 4, 1, 97, 32, true, true, Layout::dense, 2},
    {2, 4, 65, 130, 64, true, true, Layout::fused, 1},
    {1, 4, 130, 7, 5, false, false, Layout::dense, 1},
    {3, 4, 1, 65, 80, true, false, Layout::transposed, 1},
    {1, 4, 130, 130, 48, true, true, Layout::transposed, 1},
};

TEST(AttentionKernel, GroupedQueryF32MatchesReference) {
  for (const KernelCase& c : kGroupedCases) check_parity<float>(c, 1e-5);
}

TEST(AttentionKernel, GroupedQueryF64MatchesReference) {
  for (const KernelCase& c : kGroupedCases) check_parity<double>(c, 1e-12);
}

// Packed rows: records shorter than a tile (whole key blocks skipped in both passes), about a tile
// (records straddling tile edges), longer than one, non-causal as an encoder would pack, padded
// keys inside records, grouped heads, each layout.
const std::vector<KernelCase> kPackedCases = {
    {2, 2, 7, 7, 16, true, false, Layout::dense, 0, 3},
    {2, 2, 300, 300, 32, true, false, Layout::dense, 0, 40},
    {1, 4, 300, 300, 24, true, true, Layout::transposed, 2, 150},
    {2, 4, 130, 130, 64, true, false, Layout::fused, 1, 70},
    {1, 2, 400, 400, 16, false, false, Layout::dense, 0, 90},
    {2, 3, 65, 65, 5, false, true, Layout::fused, 0, 20},
    {1, 2, 260, 260, 80, true, true, Layout::dense, 0, 300},
};

TEST(AttentionKernel, PackedF32MatchesReference) {
  for (const KernelCase& c : kPackedCases) check_parity<float>(c, 1e-5);
}

TEST(AttentionKernel, PackedF64MatchesReference) {
  for (const KernelCase& c : kPackedCases) check_parity<double>(c, 1e-12);
}

// ---- the op ----

bool any_nan(const Tensor& t) {
  for (double x : t.to(DType::f64).contiguous().to_vector<double>())
    if (std::isnan(x)) return true;
  return false;
}

// Every element of t[b, :, rows] (rows along dim 2; all when rows is empty) is exactly zero.
void expect_zero(const Tensor& t, int64_t b, const std::vector<int64_t>& rows, const char* what) {
  for (int64_t h = 0; h < t.size(1); ++h)
    for (int64_t r = 0; r < t.size(2); ++r) {
      if (!rows.empty() && std::find(rows.begin(), rows.end(), r) == rows.end()) continue;
      for (int64_t d = 0; d < t.size(3); ++d)
        ASSERT_EQ(t.at({b, h, r, d}), 0.0) << what << " at [" << b << ", " << h << ", " << r
                                           << ", " << d << "]";
    }
}

TEST(Attention, RowsWithNothingToAttendAreZeroWithZeroGradients) {
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gen(5);
    auto leaf = [&](int64_t rows) {
      return normal({2, 2, rows, 8}, 0, 1, gen, dt).set_requires_grad(true);
    };
    Tensor q = leaf(5), k = leaf(5), v = leaf(5);
    // Batch 0: keys 0 and 4 padded, so causal row 0 (which sees only key 0) is empty; batch 1:
    // every key padded.
    Tensor mask = from_vector(std::vector<double>{0, 1, 1, 1, 0, 0, 0, 0, 0, 0}, {2, 5}, DType::i64);
    Tensor out = scaled_dot_product_attention(q, k, v, mask, opts(true));
    out.backward(normal(out.shape(), 0, 1, gen, dt));
    EXPECT_FALSE(any_nan(out) || any_nan(q.grad()) || any_nan(k.grad()) || any_nan(v.grad()));
    expect_zero(out, 1, {}, "out");
    expect_zero(out, 0, {0}, "out");
    expect_zero(q.grad(), 1, {}, "dq");
    expect_zero(q.grad(), 0, {0}, "dq");
    expect_zero(k.grad(), 1, {}, "dk");
    expect_zero(v.grad(), 1, {}, "dv");
    expect_zero(k.grad(), 0, {0, 4}, "dk of padded keys");
    expect_zero(v.grad(), 0, {0, 4}, "dv of padded keys");
  }
}

// With one query (a decoding step against a KV cache) causal attends every key.
TEST(Attention, CausalSingleQueryAttendsAllKeys) {
  Generator gen(6);
  Tensor q = normal({2, 3, 1, 16}, 0, 1, gen), k = normal({2, 3, 9, 16}, 0, 1, gen),
         v = normal({2, 3, 9, 16}, 0, 1, gen);
  Tensor a = scaled_dot_product_attention(q, k, v, {}, opts(true));
  Tensor b = scaled_dot_product_attention(q, k, v, {}, opts(false));
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
}

// Strided views are read in place and give bit-identical results and gradients to dense copies.
TEST(Attention, TransposedViewsMatchContiguousInputs) {
  Generator gen(7);
  Tensor x = normal({2, 70, 3, 24}, 0, 1, gen);  // [B, T, H, D]
  Tensor dy = normal({2, 3, 70, 24}, 0, 1, gen);
  std::vector<std::vector<float>> results;
  for (bool dense : {false, true}) {
    Tensor leaf = x.clone().set_requires_grad(true);
    Tensor view = transpose(leaf, 1, 2);
    if (dense) view = view.contiguous();
    Tensor out = scaled_dot_product_attention(view, view, view, {}, opts(true));
    out.backward(dy);
    results.push_back(out.to_vector<float>());
    results.push_back(leaf.grad().to_vector<float>());
  }
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(results[1], results[3]);
}

// A packed row gives each record what it gives alone: outputs and gradients of records of 50, 130,
// 7 and 69 tokens (across 64-row and 128-key tiles) in one row of 256 equal those of each record
// attended by itself, f64 to rounding, f32 within 1e-5; and the f32 kernel gives the same bits for
// any thread count.
TEST(Attention, PackedRowEqualsRecordsAlone) {
  const int64_t H = 4, Hkv = 2, D = 16, lengths[] = {50, 130, 7, 69}, T = 256;
  std::vector<double> ids;
  for (size_t r = 0; r < 4; ++r) ids.insert(ids.end(), size_t(lengths[r]), double(r));
  const Tensor segments = testing::ids(ids, {1, T});
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gen(21);
    const Tensor q0 = normal({1, H, T, D}, 0, 1, gen, dt),
                 k0 = normal({1, Hkv, T, D}, 0, 1, gen, dt),
                 v0 = normal({1, Hkv, T, D}, 0, 1, gen, dt),
                 dy = normal({1, H, T, D}, 0, 1, gen, dt);
    auto run = [&](int64_t from, int64_t to, const AttentionOptions& o) {
      auto part = [&](const Tensor& x) { return slice(x, 2, from, to).contiguous(); };
      Tensor q = part(q0).set_requires_grad(true), k = part(k0).set_requires_grad(true),
             v = part(v0).set_requires_grad(true);
      Tensor out = scaled_dot_product_attention(q, k, v, {}, o);
      out.backward(part(dy));
      std::vector<std::vector<double>> got;
      for (const Tensor& t : {out, q.grad(), k.grad(), v.grad()})
        got.push_back(t.to_vector<double>());
      return got;
    };
    const auto whole = run(0, T, packed(segments));
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    const char* what[] = {"out", "dq", "dk", "dv"};
    int64_t from = 0;
    for (int64_t len : lengths) {
      SCOPED_TRACE(from);
      const auto alone = run(from, from + len, opts(true));
      for (size_t i = 0; i < 4; ++i) {
        const int64_t heads = i == 0 || i == 1 ? H : Hkv;
        std::vector<double> mine;
        for (int64_t h = 0; h < heads; ++h)
          mine.insert(mine.end(), whole[i].begin() + (h * T + from) * D,
                      whole[i].begin() + (h * T + from + len) * D);
        expect_close(mine, alone[i], tol, what[i]);
      }
      from += len;
    }
    if (dt == DType::f32) {
      const int saved = omp_get_max_threads();
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        EXPECT_EQ(run(0, T, packed(segments)), whole) << threads << " threads";
      }
      omp_set_num_threads(saved);
    }
  }
}

TEST(Attention, RejectsBadSegments) {
  Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 3, 4});
  testing::expect_error(ExitCode::internal, "segments must not decrease along a row; row 0 goes "
                        "from 1 to 0 at 2", [&] {
    scaled_dot_product_attention(q, k, k, {}, packed(testing::ids({0, 1, 0}, {1, 3})));
  });
  testing::expect_error(ExitCode::internal, "segments must be i64 [B, T] = [1, 3]", [&] {
    scaled_dot_product_attention(q, k, k, {}, packed(testing::ids({0, 1}, {1, 2})));
  });
  testing::expect_error(ExitCode::internal, "of self-attention (T == S, got S 5)", [&] {
    Tensor kv = zeros({1, 2, 5, 4});
    scaled_dot_product_attention(q, kv, kv, {}, packed(testing::ids({0, 1, 1}, {1, 3})));
  });
}

TEST(Attention, RejectsMismatchedShapes) {
  Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 5, 4});
  EXPECT_THROW(scaled_dot_product_attention(q, k, zeros({1, 2, 5, 3})), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, zeros({2, 2, 5, 4}), zeros({2, 2, 5, 4})), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, k, zeros({1, 4})), Error);
  EXPECT_THROW(scaled_dot_product_attention(zeros({2, 3, 4}), k, k), Error);
  const char* what = "3 key/value heads must divide the query's 4 heads";
  testing::expect_error(ExitCode::internal, what, [] {
    Tensor kv = zeros({1, 3, 5, 4});
    scaled_dot_product_attention(zeros({1, 4, 3, 4}), kv, kv);
  });
}

// k and v repeated per group (Hugging Face's repeat_kv) through plain multi-head attention give the
// same output and dq bit for bit, and dk, dv equal to the repeat's backward (the group sum) up to
// summation order, in f32 (tiled kernel) and f64.
TEST(Attention, GroupedQueryEqualsMultiHeadOnRepeatedKeysAndValues) {
  const int64_t B = 2, H = 6, Hkv = 2, T = 70, S = 90, D = 24;
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gen(12);
    Tensor q0 = normal({B, H, T, D}, 0, 1, gen, dt), k0 = normal({B, Hkv, S, D}, 0, 1, gen, dt),
           v0 = normal({B, Hkv, S, D}, 0, 1, gen, dt), dy = normal({B, H, T, D}, 0, 1, gen, dt);
    Tensor mask = from_vector(std::vector<double>(size_t(B * S), 1.0), {B, S}, DType::i64);
    mask.data<int64_t>()[S + 3] = 0;
    auto repeat_kv = [&](const Tensor& x) {
      return reshape(expand(unsqueeze(x, 2), {B, Hkv, H / Hkv, S, D}), {B, H, S, D});
    };
    std::vector<std::vector<double>> got[2];
    for (int repeated = 0; repeated < 2; ++repeated) {
      Tensor q = q0.clone().set_requires_grad(true), k = k0.clone().set_requires_grad(true),
             v = v0.clone().set_requires_grad(true);
      Tensor out = repeated ? scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), mask,
                                                           opts(true))
                            : scaled_dot_product_attention(q, k, v, mask, opts(true));
      out.backward(dy);
      for (const Tensor& t : {out, q.grad(), k.grad(), v.grad()})
        got[repeated].push_back(t.to_vector<double>());
    }
    EXPECT_EQ(got[0][0], got[1][0]) << "out";
    EXPECT_EQ(got[0][1], got[1][1]) << "dq";
    const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    expect_close(got[0][2], got[1][2], tol, "dk");
    expect_close(got[0][3], got[1][3], tol, "dv");
  }
}

// Against PyTorch 1.13 in f64 (softmax over q kᵀ with k, v repeat_interleave'd per group): outputs
// and the gradients of sum(out * r), for groups of two with a causal padded call where T < S, and
// multi-query without masks; f32 within its rounding.
TEST(Attention, GroupedQueryMatchesPyTorch) {
  const std::string file = "llama_kernels.txt";
  static const testing::Goldens table = testing::load_goldens(file);
  struct Golden {
    const char* name;
    int64_t B, H, Hkv, T, S, D;
    bool causal, masked;
  };
  for (const Golden& c : {Golden{"gqa_causal_masked", 2, 4, 2, 3, 5, 6, true, true},
                          Golden{"mqa", 1, 4, 1, 4, 4, 8, false, false}}) {
    const std::string key = c.name;
    auto values = [&](const std::string& part) {
      return testing::golden_values(table, key + "." + part, file);
    };
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(key + " " + dtype_name(dt));
      auto leaf = [&](const char* part, const Shape& shape) {
        return from_vector(values(part), shape, dt).set_requires_grad(true);
      };
      Tensor q = leaf("q", {c.B, c.H, c.T, c.D}), k = leaf("k", {c.B, c.Hkv, c.S, c.D}),
             v = leaf("v", {c.B, c.Hkv, c.S, c.D});
      Tensor mask = c.masked ? from_vector(values("mask"), {c.B, c.S}, DType::i64) : Tensor();
      Tensor out = scaled_dot_product_attention(q, k, v, mask, opts(c.causal));
      out.backward(from_vector(values("r"), out.shape(), dt));
      const double rtol = dt == DType::f64 ? 1e-12 : 1e-5;
      testing::expect_near_golden(out.to_vector<double>(), values("out"), key + ".out", rtol);
      testing::expect_near_golden(q.grad().to_vector<double>(), values("dq"), key + ".dq", rtol);
      testing::expect_near_golden(k.grad().to_vector<double>(), values("dk"), key + ".dk", rtol);
      testing::expect_near_golden(v.grad().to_vector<double>(), values("dv"), key + ".dv", rtol);
    }
  }
}

// The fused op equals softmax(q kᵀ scale + masks) v built from matmul, masked_fill and softmax, in
// values and in gradients (rows all have something to attend; the composition would give NaN), with
// an explicit scale and with the default 1/sqrt(D).
TEST(Attention, MatchesUnfusedComposition) {
  const int64_t B = 2, H = 2, T = 5, S = 7, D = 6;
  In in = qkv(B, H, T, S, D);
  std::vector<double> pad = {1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1};
  Tensor mask = testing::constant(pad, {B, S});
  std::vector<double> hide_pad(pad.size()), hide_future(size_t(T * S));
  for (size_t i = 0; i < pad.size(); ++i) hide_pad[i] = 1.0 - pad[i];
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) hide_future[size_t(t * S + s)] = s > t + S - T;
  Tensor hidden_pad = testing::constant(hide_pad, {B, 1, 1, S});
  Tensor hidden_future = testing::constant(hide_future, {T, S});
  const double inf = std::numeric_limits<double>::infinity();
  Generator gen(11);
  Tensor dy = normal({B, H, T, D}, 0, 1, gen, DType::f64);

  auto grads = [&](const Tensor& out) {
    for (const Tensor& t : in) t.impl()->grad = Tensor();
    out.backward(dy);
    std::vector<std::vector<double>> g;
    for (const Tensor& t : in) g.push_back(t.grad().contiguous().to_vector<double>());
    return g;
  };
  for (double scale : {0.45, 0.0}) {
    SCOPED_TRACE(scale);
    Tensor fused = scaled_dot_product_attention(in[0], in[1], in[2], mask, opts(true, scale));
    auto g_fused = grads(fused);
    Tensor att = mul(matmul(in[0], transpose(in[1], -2, -1)),
                     scale == 0.0 ? 1.0 / std::sqrt(double(D)) : scale);
    att = masked_fill(masked_fill(att, hidden_future, -inf), hidden_pad, -inf);
    Tensor composed = matmul(softmax(att, -1), in[2]);
    auto g_composed = grads(composed);
    expect_close(fused.to_vector<double>(), composed.to_vector<double>(), 1e-12, "out");
    for (size_t i = 0; i < 3; ++i) expect_close(g_fused[i], g_composed[i], 1e-12, "grad");
  }
}

}  // namespace
}  // namespace forge
