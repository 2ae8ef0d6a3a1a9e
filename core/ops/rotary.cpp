// Rotary embedding op: checks shapes and positions against the tables, calls kernels/rotary and
// records a node whose backward is the inverse rotation (a rotation's transpose), so it saves only
// the tables and positions, never x.
#include "core/ops/rotary.h"

#include <utility>

#include "core/autograd.h"
#include "core/kernels/rotary.h"
#include "core/ops/op_util.h"

namespace forge {
namespace {

// Both overloads: positions is undefined when rows take pos0 + t.
// x [B, H, T, D], cos and sin [P, D/2], positions [B, T] -> out [B, H, T, D]
Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
              int64_t pos0) {
  const char* op = "rotary_embedding";
  op_util::check_float(x, op, "x");
  op_util::check_float(cos, op, "cos");
  op_util::check_float(sin, op, "sin");
  FORGE_CHECK(x.dim() == 4, "rotary_embedding: x must be [B, H, T, D], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  FORGE_CHECK(D % 2 == 0, "rotary_embedding: head dimension must be even, got x ",
              shape_str(x.shape()));
  FORGE_CHECK(cos.dim() == 2 && cos.size(1) == D / 2 && sin.shape() == cos.shape(),
              "rotary_embedding: cos and sin must be [P, ", D / 2, "] for x ", shape_str(x.shape()),
              ", got ", shape_str(cos.shape()), " and ", shape_str(sin.shape()));
  const int64_t P = cos.size(0);
  Tensor pos;
  if (positions.defined()) {
    FORGE_CHECK(positions.dtype() == DType::i64 && positions.shape() == Shape({B, T}),
                "rotary_embedding: positions must be i64 [", B, ", ", T, "], got ",
                dtype_name(positions.dtype()), " ", shape_str(positions.shape()));
    pos = positions.contiguous();
  }
  for (int64_t b = 0; b < (pos.defined() ? B : 1); ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos.defined() ? pos.data<int64_t>()[b * T + t] : pos0 + t;
      FORGE_CHECK(p >= 0 && p < P, "rotary_embedding: position ", p, " (batch ", b, ", row ", t,
                  ") is outside the cos/sin tables' ", P, " positions");
    }

  // The kernel needs a dense last dimension; other strides are read in place.
  Tensor xd = D <= 1 || x.strides()[3] == 1 ? x : x.contiguous();
  Tensor cos_x = cos.detach().to(x.dtype()).contiguous();
  Tensor sin_x = sin.detach().to(x.dtype()).contiguous();
  const kernels::RotaryShape shape{B, H, T, D};
  const int64_t* pos_ptr = pos.defined() ? pos.data<int64_t>() : nullptr;
  Tensor out = empty({B, H, T, D}, x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), op, [&] {
    kernels::rotary_embedding<scalar_t>(
        shape, {cos_x.data<scalar_t>(), sin_x.data<scalar_t>(), pos_ptr, pos0, false},
        xd.data<scalar_t>(), {xd.strides()[0], xd.strides()[1], xd.strides()[2]},
        out.data<scalar_t>());
  });

  if (needs_grad(x)) {
    // Positions are copied: a caller's position buffer may change (a decode step) before backward.
    Tensor saved = pos.defined() ? pos.clone() : Tensor();
    record(Op::rotary_embedding, out, {x},
           [cos_x, sin_x, pos = std::move(saved), pos0, shape](const Tensor& dout) {
             // out = R(θ) x per pair of halves  ->  dx = R(θ)ᵀ dout = R(-θ) dout
             Tensor g = dout.contiguous();
             Tensor dx = empty(g.shape(), g.dtype());
             const int64_t* pos_ptr = pos.defined() ? pos.data<int64_t>() : nullptr;
             FORGE_DISPATCH_FLOAT(g.dtype(), "rotary_embedding backward", [&] {
               kernels::rotary_embedding<scalar_t>(
                   shape, {cos_x.data<scalar_t>(), sin_x.data<scalar_t>(), pos_ptr, pos0, true},
                   g.data<scalar_t>(), {shape.H * shape.T * shape.D, shape.T * shape.D, shape.D},
                   dx.data<scalar_t>());
             });
             return std::vector<Tensor>{dx};
           });
  }
  return out;
}

}  // namespace

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t pos0) {
  return rotary(x, cos, sin, Tensor(), pos0);
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                        const Tensor& positions) {
  FORGE_CHECK(positions.defined(), "rotary_embedding: positions is undefined");
  return rotary(x, cos, sin, positions, 0);
}

}  // namespace forge
