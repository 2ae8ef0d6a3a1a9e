// Elementwise ops: thin autograd wrappers over kernels/elementwise. Each backward names the
// forward line it differentiates; binary backwards undo broadcasting with sum_to().
#include "core/ops/elementwise.h"

#include <cmath>

#include "core/autograd.h"
#include "core/kernels/elementwise.h"
#include "core/kernels/random.h"
#include "core/ops/layout.h"
#include "core/ops/op_util.h"
#include "core/ops/reduce.h"

namespace forge {
namespace {

using op_util::check_float;

using kernels::Binary;
using kernels::Unary;
using kernels::UnaryParams;

// Strides of `t` seen through broadcasting to `shape` (0 on added or stretched dimensions).
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape s(shape.size(), 0);
  size_t lead = shape.size() - size_t(t.dim());
  for (size_t d = 0; d < size_t(t.dim()); ++d)
    s[lead + d] = t.shape()[d] == 1 ? 0 : t.strides()[d];
  return s;
}

Tensor unary_raw(Unary op, const Tensor& x, UnaryParams p = {}) {
  Tensor xc = x.contiguous();
  Tensor y = empty(xc.shape(), xc.dtype());
  FORGE_DISPATCH_FLOAT(xc.dtype(), "unary", [&] {
    kernels::unary_forward(op, xc.data<scalar_t>(), y.data<scalar_t>(), xc.numel(), p);
  });
  return y;
}

// dx = dy * f'(x). Only the operands the rule reads are passed (the other may be undefined).
Tensor unary_grad(Unary op, const Tensor& x, const Tensor& y, const Tensor& dy, UnaryParams p = {}) {
  Tensor dyc = dy.contiguous();
  Tensor dx = empty(dyc.shape(), dyc.dtype());
  FORGE_DISPATCH_FLOAT(dyc.dtype(), "unary backward", [&] {
    kernels::unary_backward(op, x.defined() ? x.data<scalar_t>() : nullptr,
                            y.defined() ? y.data<scalar_t>() : nullptr, dyc.data<scalar_t>(),
                            dx.data<scalar_t>(), dyc.numel(), p);
  });
  return dx;
}

// A unary op whose derivative reads x (saved) or y (saved), never both.
enum class Saves { input, output, nothing };

Tensor unary_op(Op op, Unary kind, const Tensor& x, Saves saves, UnaryParams p = {}) {
  check_float(x, op_name(op));
  Tensor y = unary_raw(kind, x, p);
  if (needs_grad(x)) {
    Tensor saved_x = saves == Saves::input ? x.contiguous().detach() : Tensor();
    Tensor saved_y = saves == Saves::output ? y.detach() : Tensor();
    record(op, y, {x}, [kind, p, saved_x, saved_y](const Tensor& dy) {
      return std::vector<Tensor>{unary_grad(kind, saved_x, saved_y, dy, p)};
    });
  }
  return y;
}

Tensor binary_raw(Binary op, const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.dtype() == b.dtype(), "binary op: dtypes differ (", dtype_name(a.dtype()), " vs ",
              dtype_name(b.dtype()), ")");
  Shape shape = broadcast_shapes(a.shape(), b.shape());
  Shape sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  Tensor out = empty(shape, a.dtype());
  FORGE_DISPATCH_FLOAT(a.dtype(), "binary op", [&] {
    kernels::binary_forward(op, a.data<scalar_t>(), sa.data(), b.data<scalar_t>(), sb.data(),
                            out.data<scalar_t>(), shape.data(), int(shape.size()));
  });
  return out;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    FORGE_CHECK(da == db || da == 1 || db == 1, "cannot broadcast shapes ", shape_str(a), " and ",
                shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  size_t lead = size_t(g.dim()) - shape.size();
  std::vector<int64_t> dims;
  for (size_t d = 0; d < size_t(g.dim()); ++d)
    if (d < lead || (shape[d - lead] == 1 && g.shape()[d] != 1)) dims.push_back(int64_t(d));
  return reshape(sum(g, dims, true), shape);
}

// ---- binary ops ----

// a + b, shapes broadcast.
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::add, a, b);
  if (needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    record(Op::add, out, {a, b}, [sa, sb](const Tensor& dout) {
      return std::vector<Tensor>{sum_to(dout, sa), sum_to(dout, sb)};
    });
  }
  return out;
}

// a - b
Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::sub, a, b);
  if (needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    record(Op::sub, out, {a, b}, [sa, sb](const Tensor& dout) {
      return std::vector<Tensor>{sum_to(dout, sa), sum_to(neg(dout), sb)};
    });
  }
  return out;
}

// a * b: d/da = b, d/db = a (each saved only if the other side needs it).
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::mul, a, b);
  if (needs_grad(a, b)) {
    Tensor sa = b.requires_grad() ? a.detach() : Tensor();
    Tensor sb = a.requires_grad() ? b.detach() : Tensor();
    Shape shape_a = a.shape(), shape_b = b.shape();
    record(Op::mul, out, {a, b}, [sa, sb, shape_a, shape_b](const Tensor& dout) {
      return std::vector<Tensor>{sb.defined() ? sum_to(mul(dout, sb), shape_a) : Tensor(),
                                 sa.defined() ? sum_to(mul(dout, sa), shape_b) : Tensor()};
    });
  }
  return out;
}

// a / b: d/da = 1/b, d/db = -a/b^2 = -out/b.
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::div, a, b);
  if (needs_grad(a, b)) {
    Tensor sb = b.detach(), so = b.requires_grad() ? out.detach() : Tensor();
    Shape shape_a = a.shape(), shape_b = b.shape();
    bool want_a = a.requires_grad();
    record(Op::div, out, {a, b}, [sb, so, shape_a, shape_b, want_a](const Tensor& dout) {
      Tensor q = div(dout, sb);
      return std::vector<Tensor>{want_a ? sum_to(q, shape_a) : Tensor(),
                                 so.defined() ? sum_to(neg(mul(q, so)), shape_b) : Tensor()};
    });
  }
  return out;
}

// a ** b: d/da = b a^(b-1), d/db = out log(a).
Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(Binary::pow, a, b);
  if (needs_grad(a, b)) {
    Tensor sa = a.detach(), sb = b.detach(), so = out.detach();
    bool want_a = a.requires_grad(), want_b = b.requires_grad();
    record(Op::pow, out, {a, b}, [sa, sb, so, want_a, want_b](const Tensor& dout) {
      Tensor da, db;
      if (want_a) da = sum_to(mul(dout, mul(sb, pow(sa, add(sb, -1.0)))), sa.shape());
      if (want_b) db = sum_to(mul(dout, mul(so, log(sa))), sb.shape());
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

namespace {
// minimum/maximum backward: the gradient goes to the selected side, split evenly on ties.
Tensor select_binary(Op op, Binary kind, const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw(kind, a, b);
  if (needs_grad(a, b)) {
    Tensor sa = a.detach(), sb = b.detach(), so = out.detach();
    record(op, out, {a, b}, [sa, sb, so](const Tensor& dout) {
      Tensor one = ones({}, dout.dtype()), zero = zeros({}, dout.dtype());
      Tensor ties = where(sub(sa, sb), zero, full({}, 0.5, dout.dtype()));
      Tensor wa = where(sub(sa, so), zero, one), wb = where(sub(sb, so), zero, one);
      Tensor ga = mul(dout, sub(wa, mul(ties, wb)));  // a picked: 1, tie: 0.5, else 0
      Tensor gb = mul(dout, sub(wb, mul(ties, wa)));
      return std::vector<Tensor>{sum_to(ga, sa.shape()), sum_to(gb, sb.shape())};
    });
  }
  return out;
}
}  // namespace

Tensor minimum(const Tensor& a, const Tensor& b) {
  return select_binary(Op::minimum, Binary::minimum, a, b);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return select_binary(Op::maximum, Binary::maximum, a, b);
}

// ---- scalar and unary ops ----

Tensor add(const Tensor& a, double s) {
  return unary_op(Op::add_scalar, Unary::add_scalar, a, Saves::nothing, {s, 0});
}
Tensor mul(const Tensor& a, double s) {
  return unary_op(Op::mul_scalar, Unary::mul_scalar, a, Saves::nothing, {s, 0});
}
Tensor pow(const Tensor& a, double exponent) {
  return unary_op(Op::pow_scalar, Unary::pow_scalar, a, Saves::input, {exponent, 0});
}
Tensor neg(const Tensor& x) { return unary_op(Op::neg, Unary::neg, x, Saves::nothing); }
Tensor exp(const Tensor& x) { return unary_op(Op::exp, Unary::exp, x, Saves::output); }
Tensor log(const Tensor& x) { return unary_op(Op::log, Unary::log, x, Saves::input); }
Tensor sqrt(const Tensor& x) { return unary_op(Op::sqrt, Unary::sqrt, x, Saves::output); }
Tensor rsqrt(const Tensor& x) { return unary_op(Op::rsqrt, Unary::rsqrt, x, Saves::output); }
Tensor abs(const Tensor& x) { return unary_op(Op::abs, Unary::abs, x, Saves::input); }
Tensor tanh(const Tensor& x) { return unary_op(Op::tanh, Unary::tanh, x, Saves::output); }
Tensor sigmoid(const Tensor& x) { return unary_op(Op::sigmoid, Unary::sigmoid, x, Saves::output); }
Tensor relu(const Tensor& x) { return unary_op(Op::relu, Unary::relu, x, Saves::input); }
Tensor gelu(const Tensor& x, GeluApprox approx) {
  return approx == GeluApprox::tanh ? unary_op(Op::gelu_tanh, Unary::gelu_tanh, x, Saves::input)
                                    : unary_op(Op::gelu, Unary::gelu, x, Saves::input);
}
Tensor silu(const Tensor& x) { return unary_op(Op::silu, Unary::silu, x, Saves::input); }
Tensor log_sigmoid(const Tensor& x) {
  return unary_op(Op::log_sigmoid, Unary::log_sigmoid, x, Saves::input);
}
Tensor normal_cdf(const Tensor& x) {
  return unary_op(Op::normal_cdf, Unary::normal_cdf, x, Saves::input);
}
Tensor softplus(const Tensor& x, double beta, double threshold) {
  FORGE_CHECK(beta > 0, "softplus: beta must be positive, got ", beta);
  return unary_op(Op::softplus, Unary::softplus, x, Saves::input, {beta, threshold});
}
Tensor clamp(const Tensor& x, double low, double high) {
  FORGE_CHECK(low <= high, "clamp: low ", low, " exceeds high ", high);
  return unary_op(Op::clamp, Unary::clamp, x, Saves::input, {low, high});
}

// ---- selection and masking ----

namespace {
// Expands cond, a and b to one shape and selects; returns the dense condition for backward.
Tensor select_raw(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor* mask_out) {
  FORGE_CHECK(a.dtype() == b.dtype(), "where: a is ", dtype_name(a.dtype()), ", b is ",
              dtype_name(b.dtype()));
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape()), b.shape());
  Tensor c = expand(cond, shape).to(a.dtype()).contiguous();
  Tensor ae = expand(a, shape).contiguous(), be = expand(b, shape).contiguous();
  Tensor out = empty(shape, a.dtype());
  FORGE_DISPATCH_FLOAT(a.dtype(), "where", [&] {
    kernels::select(c.data<scalar_t>(), ae.data<scalar_t>(), be.data<scalar_t>(),
                    out.data<scalar_t>(), out.numel());
  });
  if (mask_out) *mask_out = c.detach();
  return out;
}
}  // namespace

// cond ? a : b (select rather than arithmetic, so infinities in the unselected side stay out).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor mask;
  Tensor out = select_raw(cond.detach(), a.detach(), b.detach(), &mask);
  if (needs_grad(a, b)) {
    Shape sa = a.shape(), sb = b.shape();
    record(Op::where, out, {a, b}, [mask, sa, sb](const Tensor& dout) {
      Tensor zero = zeros({}, dout.dtype());
      return std::vector<Tensor>{sum_to(where(mask, dout, zero), sa),
                                 sum_to(where(mask, zero, dout), sb)};
    });
  }
  return out;
}

// mask ? value : x, with the mask broadcast to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_float(x, "masked_fill");
  FORGE_CHECK(broadcast_shapes(x.shape(), mask.shape()) == x.shape(), "masked_fill: mask of shape ",
              shape_str(mask.shape()), " does not broadcast to ", shape_str(x.shape()));
  Tensor saved;
  Tensor out = select_raw(mask.detach(), full({}, value, x.dtype()), x.detach(), &saved);
  if (needs_grad(x)) {
    record(Op::masked_fill, out, {x}, [saved](const Tensor& dout) {
      return std::vector<Tensor>{where(saved, zeros({}, dout.dtype()), dout)};
    });
  }
  return out;
}

// y = x * mask, mask in {0, 1/(1-p)} drawn from the generator's counter range.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  FORGE_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  check_float(x, "dropout");
  Tensor mask = empty(x.shape(), x.dtype());
  GeneratorState state = gen.state();
  uint64_t first = gen.advance(kernels::dropout_blocks(x.numel()));
  FORGE_DISPATCH_FLOAT(x.dtype(), "dropout", [&] {
    kernels::fill_dropout_mask(mask.data<scalar_t>(), mask.numel(), p, state, first);
  });
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x, mask);
  }
  if (needs_grad(x)) record(Op::dropout, out, {x}, [mask](const Tensor& dout) {
      return std::vector<Tensor>{mul(dout, mask)};
    });
  return out;
}

}  // namespace forge
