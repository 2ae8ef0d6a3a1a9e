// Rotary embedding: finite-difference checks of the op (f64), parity of the kernel with the
// reference loop in f32 and f64 over strided layouts, both position forms and the inverse rotation,
// PyTorch goldens for values and gradients (tests/golden/llama_kernels.txt, written by
// make_llama_kernel_goldens.py), and the errors for positions outside the tables.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/kernels/rotary.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using In = std::vector<Tensor>;

struct Tables {
  Tensor cos, sin;
};

// cos and sin [P, D/2] (f32) of Llama's angles p * 10000^(-2i/D).
Tables tables(int64_t P, int64_t D) {
  const int64_t half = D / 2;
  std::vector<double> c(size_t(P * half)), s(c.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * std::pow(10000.0, -2.0 * double(i) / double(D));
      c[size_t(p * half + i)] = std::cos(angle);
      s[size_t(p * half + i)] = std::sin(angle);
    }
  return {from_vector(c, {P, half}), from_vector(s, {P, half})};
}

// The k part of a fused [B, T, 3, H, D] projection, seen as [B, H, T, D].
Tensor k_view(const Tensor& fused) { return transpose(squeeze(slice(fused, 2, 1, 2), 2), 1, 2); }

// ---- finite differences (f64) ----

FORGE_GRADCHECK(rotary_embedding, pos0) {
  const Tables t = tables(9, 6);
  EXPECT_GRADCHECK([t](const In& v) { return rotary_embedding(v[0], t.cos, t.sin, 3); },
                   {testing::randn({2, 3, 4, 6}, 1)});
}
// Each row its own positions, on a strided view of a fused projection; the gradient reaches the
// k part of the leaf only.
FORGE_GRADCHECK(rotary_embedding, positions_on_fused_view) {
  const Tables t = tables(9, 4);
  Tensor positions = testing::ids({0, 0, 1, 2, 5, 6, 7, 8}, {2, 4});
  EXPECT_GRADCHECK(
      [t, positions](const In& v) {
        return rotary_embedding(k_view(v[0]), t.cos, t.sin, positions);
      },
      {testing::randn({2, 4, 3, 2, 4}, 2)});
}

// ---- kernel parity with the reference ----

struct KernelCase {
  int64_t B, H, T, D, P;
  bool fused, positions, inverse;
};

template <class T>
void check_parity(const KernelCase& c, double tol) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " T=" +
               std::to_string(c.T) + " D=" + std::to_string(c.D) + (c.fused ? " fused" : "") +
               (c.positions ? " positions" : "") + (c.inverse ? " inverse" : ""));
  Generator gen(5);
  const DType dt = dtype_of<T>();
  // Fused: x is the middle third of [B, T, 3, H, D]; dense otherwise.
  Tensor buf = c.fused ? normal({c.B, c.T, 3, c.H, c.D}, 0, 1, gen, dt)
                       : normal({c.B, c.H, c.T, c.D}, 0, 1, gen, dt);
  const T* x = buf.data<T>() + (c.fused ? c.H * c.D : 0);
  using Strides = kernels::RowStrides;
  const Strides xs = c.fused ? Strides{c.T * 3 * c.H * c.D, c.D, 3 * c.H * c.D}
                             : Strides{c.H * c.T * c.D, c.T * c.D, c.D};
  const Tables t = tables(c.P, c.D);
  Tensor cos = t.cos.to(dt), sin = t.sin.to(dt);
  std::vector<int64_t> pos(size_t(c.B * c.T));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i * 7 % size_t(c.P));
  const kernels::RotaryParams<T> p{cos.data<T>(), sin.data<T>(), c.positions ? pos.data() : nullptr,
                                   c.P - c.T, c.inverse};
  const kernels::RotaryShape n{c.B, c.H, c.T, c.D};
  const size_t count = size_t(c.B * c.H * c.T * c.D);
  std::vector<T> out(count, std::numeric_limits<T>::quiet_NaN()), want(count);
  kernels::rotary_embedding<T>(n, p, x, xs, out.data());
  kernels::ref::rotary_embedding<T>(n, p, x, xs, want.data());
  for (size_t i = 0; i < count; ++i)
    ASSERT_NEAR(double(out[i]), double(want[i]), tol * std::max(1.0, std::fabs(double(want[i]))))
        << "element " << i;
}

// Head dimensions on and off the vector widths (D/2 = 1, 5, 32, 64), enough rows to run threads.
const std::vector<KernelCase> kCases = {
    {1, 1, 1, 2, 1, false, false, false},    {2, 3, 7, 10, 16, true, true, false},
    {2, 3, 7, 10, 16, false, false, true},   {4, 8, 130, 64, 200, true, false, false},
    {2, 4, 65, 128, 70, false, true, true},  {3, 2, 33, 128, 40, true, true, true},
};

TEST(RotaryKernel, F32MatchesReference) {
  for (const KernelCase& c : kCases) check_parity<float>(c, 1e-6);
}

TEST(RotaryKernel, F64MatchesReference) {
  for (const KernelCase& c : kCases) check_parity<double>(c, 1e-14);
}

// ---- the op ----

// Against PyTorch 1.13 (Hugging Face's apply_rotary_pos_emb) in f64, and f32 within its rounding:
// positions 11..15 up to the tables' last row, and per-row positions of a left-padded batch, both
// on the k part of a fused projection; values and the gradient of sum(out * r) in the leaf.
TEST(Rotary, MatchesPyTorch) {
  const std::string file = "llama_kernels.txt";
  static const testing::Goldens table = testing::load_goldens(file);
  const int64_t B = 2, H = 3, T = 5, D = 10, P = 16;
  for (const std::string key : {"rotary_pos0", "rotary_positions"}) {
    auto values = [&](const std::string& part) {
      return testing::golden_values(table, key + "." + part, file);
    };
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(key + " " + dtype_name(dt));
      Tensor fused = from_vector(values("fused"), {B, T, 3, H, D}, dt).set_requires_grad(true);
      Tensor cos = from_vector(values("cos"), {P, D / 2});
      Tensor sin = from_vector(values("sin"), {P, D / 2});
      Tensor out = key == "rotary_pos0"
                       ? rotary_embedding(k_view(fused), cos, sin, 11)
                       : rotary_embedding(k_view(fused), cos, sin,
                                          from_vector(values("positions"), {B, T}, DType::i64));
      EXPECT_EQ(out.dtype(), dt);
      EXPECT_TRUE(out.is_contiguous());
      out.backward(from_vector(values("r"), out.shape(), dt));
      const double rtol = dt == DType::f64 ? 1e-12 : 1e-6;
      testing::expect_near_golden(out.to_vector<double>(), values("out"), key + ".out", rtol);
      testing::expect_near_golden(fused.grad().to_vector<double>(), values("dfused"),
                                  key + ".dfused", rtol);
    }
  }
}

// Backward rotates by the positions the forward used, even when the caller's buffer changes between.
TEST(Rotary, BackwardUsesTheForwardsPositions) {
  const Tables t = tables(8, 4);
  std::vector<std::vector<double>> grads;
  for (bool overwrite : {false, true}) {
    Tensor x = testing::randn({1, 2, 3, 4}, 3);
    Tensor positions = testing::ids({1, 4, 7}, {1, 3});
    Tensor out = rotary_embedding(x, t.cos, t.sin, positions);
    if (overwrite) positions.fill_(0.0);
    out.backward(testing::randn({1, 2, 3, 4}, 4).detach());
    grads.push_back(x.grad().to_vector<double>());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

TEST(Rotary, RejectsPositionsOutsideTheTablesAndBadShapes) {
  const Tables t = tables(8, 4);
  Tensor x = zeros({2, 1, 3, 4});
  testing::expect_error(ExitCode::internal, "position 8 (batch 0, row 2) is outside the cos/sin "
                        "tables' 8 positions", [&] { rotary_embedding(x, t.cos, t.sin, 6); });
  testing::expect_error(ExitCode::internal, "position -1 (batch 0, row 0)",
                        [&] { rotary_embedding(x, t.cos, t.sin, -1); });
  Tensor positions = testing::ids({0, 1, 2, 3, 9, 4}, {2, 3});
  testing::expect_error(ExitCode::internal, "position 9 (batch 1, row 1) is outside",
                        [&] { rotary_embedding(x, t.cos, t.sin, positions); });
  EXPECT_THROW(rotary_embedding(x, t.cos, t.sin, testing::ids({0, 1, 2}, {1, 3})), Error);
  EXPECT_THROW(rotary_embedding(zeros({2, 1, 3, 6}), t.cos, t.sin, 0), Error);
  EXPECT_THROW(rotary_embedding(zeros({2, 1, 3, 5}), t.cos, t.sin, 0), Error);
  EXPECT_THROW(rotary_embedding(zeros({1, 3, 4}), t.cos, t.sin, 0), Error);
}

}  // namespace
}  // namespace forge
