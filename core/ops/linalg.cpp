// matmul, linear and grouped_linear: shape rules and autograd over kernels/matmul. Every transpose
// here, forward or backward, is a stride view or a pair of strides the kernel consumes without a
// copy.
#include "core/ops/linalg.h"

#include <atomic>

#include "core/autograd.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/matmul.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/ops/op_util.h"
#include "core/ops/reduce.h"

namespace forge {
namespace {

using op_util::check_float;

std::atomic<MatmulPrecision> g_precision{MatmulPrecision::fp32};

// A matmul operand: f32 or f64, or bf16 (a frozen weight: a bf16 tensor never requires grad).
void check_operand(const Tensor& t, const char* op, const char* what) {
  FORGE_CHECK(t.defined(), op, ": ", what, " is undefined");
  if (t.dtype() != DType::bf16) check_float(t, op, what);
}

// Whether a product of these operands computes in bf16: one of them is bf16, or both are f32
// and the precision says bf16.
bool in_bf16(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() == DType::bf16 || b.dtype() == DType::bf16) {
    FORGE_CHECK(a.dtype() != DType::f64 && b.dtype() != DType::f64, op,
                ": f64 and bf16 operands do not mix");
    return true;
  }
  return a.dtype() == DType::f32 && b.dtype() == DType::f32 &&
         g_precision.load(std::memory_order_relaxed) == MatmulPrecision::bf16;
}

// t in bf16: itself when it is, else a dense converted copy.
Tensor as_bf16(const Tensor& t) { return t.dtype() == DType::bf16 ? t : t.to(DType::bf16); }

// Strides of t's batch dims (all but the last two) seen through broadcasting to `batch`, followed
// by t's two matrix strides.
std::vector<int64_t> operand_strides(const Tensor& t, const Shape& batch) {
  std::vector<int64_t> s(batch.size() + 2, 0);
  const size_t own = size_t(t.dim()) - 2, lead = batch.size() - own;
  for (size_t d = 0; d < own; ++d) s[lead + d] = t.shape()[d] == 1 ? 0 : t.strides()[d];
  s[batch.size()] = t.strides()[own];
  s[batch.size() + 1] = t.strides()[own + 1];
  return s;
}

// out [batch..., M, N] = a [..., M, K] @ b [..., K, N] (+ bias [N], dense); a, b have rank >= 2.
// No autograd: callers pass detached tensors. bf16 operands give an f32 result (bias f32).
Tensor matmul_raw(const Tensor& a, const Tensor& b, const Tensor& bias = {}) {
  FORGE_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ (", dtype_name(a.dtype()), " vs ",
              dtype_name(b.dtype()), ")");
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  FORGE_CHECK(b.size(-2) == k, "matmul: inner dimensions differ: ", shape_str(a.shape()), " @ ",
              shape_str(b.shape()));
  kernels::MatmulGeometry g;
  g.batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                             Shape(b.shape().begin(), b.shape().end() - 2));
  g.m = m, g.n = n, g.k = k;
  g.a_strides = operand_strides(a, g.batch);
  g.b_strides = operand_strides(b, g.batch);
  Shape out_shape = g.batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  if (a.dtype() == DType::bf16) {
    Tensor out = empty(out_shape, DType::f32);
    kernels::matmul_bf16(g, a.data<bf16>(), b.data<bf16>(),
                         bias.defined() ? bias.data<float>() : nullptr, out.data<float>());
    return out;
  }
  Tensor out = empty(out_shape, a.dtype());
  FORGE_DISPATCH_FLOAT(a.dtype(), "matmul", [&] {
    kernels::matmul<scalar_t>(g, a.data<scalar_t>(), b.data<scalar_t>(),
                              bias.defined() ? bias.data<scalar_t>() : nullptr,
                              out.data<scalar_t>());
  });
  return out;
}

// A dense tensor's storage seen with another shape of the same size (no copy, no history).
Tensor dense_view(const Tensor& t, const Shape& shape) {
  if (shape == t.shape()) return t;
  return make_view(t, shape, contiguous_strides(shape), t.offset());
}

}  // namespace

MatmulPrecision matmul_precision() { return g_precision.load(std::memory_order_relaxed); }

void set_matmul_precision(MatmulPrecision precision) {
  g_precision.store(precision, std::memory_order_relaxed);
}

// a [..., M, K] @ b [..., K, N] -> [..., M, N]; a 1-D [K] acts as [1, K], b 1-D [K] as [K, 1].
// In bf16 the operands are converted once and saved so for backward, which multiplies the
// incoming gradient converted to bf16 (what autocast does); gradients stay f32.
Tensor matmul(const Tensor& a, const Tensor& b) {
  check_operand(a, "matmul", "a");
  check_operand(b, "matmul", "b");
  FORGE_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must be at least 1-D, got ",
              shape_str(a.shape()), " @ ", shape_str(b.shape()));
  const bool bf = in_bf16(a, b, "matmul");
  Tensor a2 = a.dim() == 1 ? unsqueeze(a.detach(), 0) : a.detach();
  Tensor b2 = b.dim() == 1 ? unsqueeze(b.detach(), 1) : b.detach();
  if (bf) a2 = as_bf16(a2), b2 = as_bf16(b2);
  Tensor out2 = matmul_raw(a2, b2);
  Shape shape = out2.shape();
  if (b.dim() == 1) shape.erase(shape.end() - 1);
  if (a.dim() == 1) shape.erase(shape.end() - (b.dim() == 1 ? 1 : 2));
  Tensor out = dense_view(out2, shape);
  if (needs_grad(a, b)) {
    // dA needs B and dB needs A: save each only when the other side wants its gradient.
    Tensor sa = b.requires_grad() ? a2 : Tensor(), sb = a.requires_grad() ? b2 : Tensor();
    Shape a2_shape = a2.shape(), b2_shape = b2.shape(), out2_shape = out2.shape();
    Shape a_shape = a.shape(), b_shape = b.shape();
    record(Op::matmul, out, {a, b},
           [sa, sb, bf, a2_shape, b2_shape, out2_shape, a_shape, b_shape](const Tensor& dout) {
             Tensor dc = reshape(dout, out2_shape);  // restores dims dropped for 1-D operands
             if (bf) dc = as_bf16(dc);
             Tensor da, db;
             // C = A·B  =>  dA = dC·Bᵀ, summed over the batch dims A was broadcast along.
             if (sb.defined())
               da = reshape(sum_to(matmul_raw(dc, transpose(sb, -1, -2)), a2_shape), a_shape);
             // dB = Aᵀ·dC. A 2-D B is shared by every batch, so the batch sum is part of one
             // GEMM: [K, batch·M]·[batch·M, N].
             if (sa.defined() && b2_shape.size() == 2) {
               const int64_t k = a2_shape.back(), n = b2_shape.back();
               db = matmul_raw(transpose(reshape(sa, {-1, k}), 0, 1), reshape(dc, {-1, n}));
               db = reshape(db, b_shape);
             } else if (sa.defined()) {
               db = reshape(sum_to(matmul_raw(transpose(sa, -1, -2), dc), b2_shape), b_shape);
             }
             return std::vector<Tensor>{da, db};
           });
  }
  return out;
}

// x [..., K] · w [N, K]ᵀ + bias [N] -> [..., N]: one GEMM over M = x.numel() / K rows, with w read
// transposed through its strides and the bias added inside the GEMM. In bf16 (as matmul) x and w
// are converted once and saved so; the bias stays f32.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_float(x, "linear", "x");
  check_operand(weight, "linear", "weight");
  FORGE_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1),
              "linear: x ", shape_str(x.shape()), " does not match weight ",
              shape_str(weight.shape()), " (expected x [..., K] and weight [N, K])");
  const bool bf = in_bf16(x, weight, "linear");
  FORGE_CHECK(bf || x.dtype() == weight.dtype(), "linear: x is ", dtype_name(x.dtype()),
              ", weight is ", dtype_name(weight.dtype()));
  const int64_t k = weight.size(1), n = weight.size(0);
  if (bias.defined()) {
    FORGE_CHECK(bias.shape() == Shape{n}, "linear: bias ", shape_str(bias.shape()),
                " does not match weight ", shape_str(weight.shape()), " (expected [", n, "])");
    FORGE_CHECK(bias.dtype() == x.dtype(), "linear: bias is ", dtype_name(bias.dtype()),
                ", x is ", dtype_name(x.dtype()));
  }
  Tensor x2 = reshape(x.detach(), {-1, k});  // [M, K], a view unless x's layout forbids it
  Tensor w = weight.detach();
  if (bf) x2 = as_bf16(x2), w = as_bf16(w);
  Tensor out2 = matmul_raw(x2, transpose(w, 0, 1),
                           bias.defined() ? bias.detach().contiguous() : Tensor());
  Shape shape = x.shape();
  shape.back() = n;
  Tensor out = dense_view(out2, shape);
  if (needs_grad(x, weight, bias)) {
    Tensor sx = weight.requires_grad() ? x2 : Tensor(), sw = x.requires_grad() ? w : Tensor();
    bool want_bias = bias.defined() && bias.requires_grad();
    Shape x_shape = x.shape();
    record(Op::linear, out, {x, weight, bias},
           [sx, sw, bf, want_bias, x_shape, n](const Tensor& dout) {
             Tensor dy = reshape(dout, {-1, n});  // [M, N]
             Tensor dyb = bf ? as_bf16(dy) : dy;
             Tensor dx, dw, db;
             // y = x·wᵀ + b  =>  dx = dy·w [M, N]·[N, K], dw = dyᵀ·x [N, M]·[M, K], db = Σ_rows dy.
             if (sw.defined()) dx = dense_view(matmul_raw(dyb, sw), x_shape);
             if (sx.defined()) dw = matmul_raw(transpose(dyb, 0, 1), sx);
             if (want_bias) db = sum(dy, {0});
             return std::vector<Tensor>{dx, dw, db};
           });
  }
  return out;
}

namespace {

// The checks of grouped_linear's operands and offsets; returns G.
int64_t check_grouped(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const std::vector<int64_t>& offsets) {
  check_float(x, "grouped_linear", "x");
  check_float(weight, "grouped_linear", "weight");
  FORGE_CHECK(x.dim() == 2 && weight.dim() == 3 && x.size(1) == weight.size(2),
              "grouped_linear: x ", shape_str(x.shape()), " does not match weight ",
              shape_str(weight.shape()), " (expected x [M, K] and weight [G, N, K])");
  FORGE_CHECK(x.dtype() == weight.dtype(), "grouped_linear: x is ", dtype_name(x.dtype()),
              ", weight is ", dtype_name(weight.dtype()));
  const int64_t m = x.size(0), groups = weight.size(0), n = weight.size(1);
  if (bias.defined()) {
    FORGE_CHECK(bias.shape() == (Shape{groups, n}), "grouped_linear: bias ",
                shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()),
                " (expected [", groups, ", ", n, "])");
    FORGE_CHECK(bias.dtype() == x.dtype(), "grouped_linear: bias is ", dtype_name(bias.dtype()),
                ", x is ", dtype_name(x.dtype()));
  }
  FORGE_CHECK(int64_t(offsets.size()) == groups + 1, "grouped_linear: ", offsets.size(),
              " offsets for ", groups, " groups (expected G + 1 = ", groups + 1, ")");
  FORGE_CHECK(offsets.front() == 0, "grouped_linear: offsets[0] is ", offsets.front(),
              ", expected 0");
  for (size_t g = 1; g < offsets.size(); ++g)
    FORGE_CHECK(offsets[g] >= offsets[g - 1], "grouped_linear: offsets[", g, "] = ", offsets[g],
                " is less than offsets[", g - 1, "] = ", offsets[g - 1],
                " (offsets must be non-decreasing)");
  FORGE_CHECK(offsets.back() == m, "grouped_linear: offsets[", groups, "] is ", offsets.back(),
              ", expected M = ", m, " (the rows of x ", shape_str(x.shape()), ")");
  return groups;
}

}  // namespace

// y[r0:r1] = x[r0:r1] · w[g]ᵀ + b[g] for each group g = [r0, r1): one GEMM per non-empty group,
// reading its rows of x and its weight in place (w[g]ᵀ through swapped strides).
namespace {
// c = the grouped product of a and b as `g` lays them out: bf16 operands (f32 c) or both f32/f64.
void grouped_product(const kernels::GroupedMatmulGeometry& g, const Tensor& a, const Tensor& b,
                     const Tensor& bias, const Tensor& c) {
  if (a.dtype() == DType::bf16) {
    kernels::grouped_matmul_bf16(g, a.data<bf16>(), b.data<bf16>(),
                                 bias.defined() ? bias.data<float>() : nullptr, c.data<float>());
    return;
  }
  FORGE_DISPATCH_FLOAT(a.dtype(), "grouped_linear", [&] {
    kernels::grouped_matmul<scalar_t>(g, a.data<scalar_t>(), b.data<scalar_t>(),
                                      bias.defined() ? bias.data<scalar_t>() : nullptr,
                                      c.data<scalar_t>());
  });
}
}  // namespace

// In bf16 (as linear) x and the experts' weights are converted once and saved so, the incoming
// gradient is rounded to bf16 in backward, and results, gradients and the bias stay f32.
Tensor grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const std::vector<int64_t>& offsets) {
  const int64_t groups = check_grouped(x, weight, bias, offsets);
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(1);
  Tensor xd = x.detach(), w = weight.detach();
  const bool bf = in_bf16(xd, w, "grouped_linear");
  if (bf) xd = as_bf16(xd), w = as_bf16(w);
  Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  const Shape& xs = xd.strides();
  const Shape& ws = w.strides();
  Tensor out = empty({m, n}, x.dtype());
  grouped_product({offsets, false, m, n, k, {xs[0], xs[1]}, {ws[2], ws[1]}, ws[0]}, xd, w, b, out);
  if (needs_grad(x, weight, bias)) {
    Tensor sx = weight.requires_grad() ? xd : Tensor(), sw = x.requires_grad() ? w : Tensor();
    bool want_bias = bias.defined() && bias.requires_grad();
    record(Op::grouped_linear, out, {x, weight, bias},
           [sx, sw, bf, want_bias, offsets, groups, m, n, k](const Tensor& dout) {
             Tensor dy = dout.contiguous();  // [M, N]
             Tensor dyb = bf ? as_bf16(dy) : dy;
             Tensor dx, dw, db;
             // y_g = x_g·w_gᵀ + b_g  =>  dx_g = dy_g·w_g [m_g, N]·[N, K], dw_g = dy_gᵀ·x_g
             // [N, m_g]·[m_g, K] (zero for an empty group), db_g = Σ_rows dy_g.
             if (sw.defined()) {
               const Shape& ws = sw.strides();
               dx = empty({m, k}, dy.dtype());
               grouped_product({offsets, false, m, k, n, {n, 1}, {ws[1], ws[2]}, ws[0]}, dyb, sw,
                               Tensor(), dx);
             }
             if (sx.defined()) {
               const Shape& xs = sx.strides();
               dw = empty({groups, n, k}, dy.dtype());
               grouped_product({offsets, true, n, k, m, {1, n}, {xs[0], xs[1]}}, dyb, sx, Tensor(),
                               dw);
             }
             if (want_bias) {
               db = empty({groups, n}, dy.dtype());
               FORGE_DISPATCH_FLOAT(dy.dtype(), "grouped_linear backward", [&] {
                 const scalar_t* pdy = dy.data<scalar_t>();
                 const bool reduce_rows[2] = {true, false};
                 for (int64_t i = 0; i < groups; ++i) {
                   const int64_t r0 = offsets[size_t(i)];
                   const int64_t block[2] = {offsets[size_t(i) + 1] - r0, n};
                   kernels::sum_dims(pdy + r0 * n, block, reduce_rows, 2,
                                     db.data<scalar_t>() + i * n);
                 }
               });
             }
             return std::vector<Tensor>{dx, dw, db};
           });
  }
  return out;
}

}  // namespace forge
