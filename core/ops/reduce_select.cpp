// Selection and moment reductions: max/min (along a dim and over everything), var, and the
// gradient-free top-k and argmax. Each folds x into a dense [outer, n, inner] block around the
// reduced axis and calls kernels/reduce; max/min backward scatters through kernels/index.
#include <algorithm>

#include "core/autograd.h"
#include "core/kernels/index.h"
#include "core/kernels/reduce.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/ops/op_util.h"
#include "core/ops/reduce.h"

namespace forge {
namespace {

using op_util::check_float;
using op_util::Fold;
using op_util::fold_at;
using op_util::scatter_into_zeros;
using op_util::wrap_dim;

// `shape` without `dim`, or with it set to 1 when keepdim.
Shape drop_dim(const Shape& shape, int64_t dim, bool keepdim) {
  Shape out = shape;
  if (keepdim)
    out[size_t(dim)] = 1;
  else
    out.erase(out.begin() + dim);
  return out;
}

// An element of x along `dim`, checked up front so the kernels never see an empty axis.
int64_t nonempty_dim(const Tensor& x, int64_t dim, const char* op) {
  dim = wrap_dim(dim, x.dim(), op);
  FORGE_CHECK(x.shape()[size_t(dim)] > 0, op, ": dimension ", dim, " of shape ",
              shape_str(x.shape()), " is empty");
  return dim;
}


// out = max (largest) or min of x along dim; backward sends dout to the first arg-extreme:
// dx[.., arg, ..] = dout, zero elsewhere.
Tensor extreme_along(Op op, const Tensor& x, int64_t dim, bool keepdim, bool largest) {
  const char* name = op_name(op);
  check_float(x, name);
  dim = nonempty_dim(x, dim, name);
  Fold f = fold_at(x.shape(), dim);
  Tensor xc = x.detach().contiguous();
  Tensor out = empty(drop_dim(x.shape(), dim, keepdim), x.dtype());
  bool grad = needs_grad(x);
  Tensor arg = grad ? empty({f.outer, 1, f.inner}, DType::i64) : Tensor();
  FORGE_DISPATCH_FLOAT(x.dtype(), name, [&] {
    kernels::extreme_dim(xc.data<scalar_t>(), f.outer, f.n, f.inner, largest,
                         out.data<scalar_t>(), grad ? arg.data<int64_t>() : nullptr);
  });
  if (grad) {
    Shape in_shape = x.shape();
    kernels::AxisIndex g{f.outer, f.n, 1, f.inner, {f.inner, 0, 1}};
    record(op, out, {x}, [arg, g, in_shape](const Tensor& dout) {
      return std::vector<Tensor>{scatter_into_zeros(dout, arg, g, in_shape)};
    });
  }
  return out;
}

// out = max or min of all elements; backward splits dout evenly among the elements equal to out.
Tensor extreme_all(Op op, const Tensor& x, bool largest) {
  const char* name = op_name(op);
  check_float(x, name);
  FORGE_CHECK(x.numel() > 0, name, ": empty tensor of shape ", shape_str(x.shape()));
  Tensor xc = x.detach().contiguous();
  Tensor out = empty({}, x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), name, [&] {
    kernels::extreme_dim(xc.data<scalar_t>(), 1, xc.numel(), 1, largest, out.data<scalar_t>(),
                         nullptr);
  });
  if (needs_grad(x)) {
    Tensor value = out.detach();
    record(op, out, {x}, [xc, value](const Tensor& dout) {
      Tensor dx = empty(xc.shape(), xc.dtype());
      FORGE_DISPATCH_FLOAT(xc.dtype(), "max/min backward", [&] {
        kernels::spread_to_ties(xc.data<scalar_t>(), xc.numel(), value.data<scalar_t>()[0],
                                scalar_t(dout.item()), dx.data<scalar_t>());
      });
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(Op::max, x, dim, keepdim, true);
}
Tensor min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_along(Op::min, x, dim, keepdim, false);
}
Tensor max(const Tensor& x) { return extreme_all(Op::max, x, true); }
Tensor min(const Tensor& x) { return extreme_all(Op::min, x, false); }

// out = sum over dims of (x - mean)^2 / (n - c), c = 1 if unbiased else 0.
// backward: dx = 2 (x - mean) / (n - c) * dout (the mean's own dependence on x drops out because
// the deviations sum to zero).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, bool unbiased, bool keepdim) {
  check_float(x, "var");
  FORGE_CHECK(!dims.empty(), "var: no dimensions given for shape ", shape_str(x.shape()));
  int64_t nd = x.dim();
  std::vector<bool> reduce(static_cast<size_t>(nd), false);
  for (int64_t d : dims) reduce[size_t(wrap_dim(d, nd, "var"))] = true;
  Shape kept_shape, out_shape;  // kept_shape has 1 on reduced dims
  std::vector<int64_t> order;   // kept dims, then reduced dims
  int64_t first = nd, last = -1, n = 1;
  for (int64_t d = 0; d < nd; ++d) {
    int64_t s = x.shape()[size_t(d)];
    kept_shape.push_back(reduce[size_t(d)] ? 1 : s);
    if (!reduce[size_t(d)] || keepdim) out_shape.push_back(reduce[size_t(d)] ? 1 : s);
    if (!reduce[size_t(d)]) order.push_back(d);
    if (reduce[size_t(d)]) n *= s;
    if (reduce[size_t(d)] && s > 1) {
      first = std::min(first, d);
      last = d;
    }
  }
  FORGE_CHECK(n > 0, "var: reducing over an empty dimension of shape ", shape_str(x.shape()));
  for (int64_t d = 0; d < nd; ++d)
    if (reduce[size_t(d)]) order.push_back(d);
  // Reduced dims that sit next to each other (size-1 dims aside) fold into [outer, n, inner] as
  // laid out; others are first permuted behind the kept dims, which costs one copy.
  bool adjacent = true;
  for (int64_t d = first; d <= last; ++d)
    if (!reduce[size_t(d)] && x.shape()[size_t(d)] > 1) adjacent = false;
  Tensor xc = adjacent ? x.detach().contiguous() : permute(x.detach(), order).contiguous();
  int64_t outer = 1, inner = 1;
  if (adjacent) {  // with no reduced dim above size 1, first = nd and everything is outer
    for (int64_t d = 0; d < nd; ++d) {
      if (d < first) outer *= x.shape()[size_t(d)];
      if (d > last && d >= first) inner *= x.shape()[size_t(d)];
    }
  } else {
    outer = x.numel() / n;
  }
  int64_t correction = unbiased ? 1 : 0;
  Tensor out = empty(out_shape, x.dtype()), mean = empty(kept_shape, x.dtype());
  FORGE_DISPATCH_FLOAT(x.dtype(), "var", [&] {
    kernels::var_dim(xc.data<scalar_t>(), outer, n, inner, correction, out.data<scalar_t>(),
                     mean.data<scalar_t>());
  });
  if (needs_grad(x)) {
    Tensor saved_x = x.detach();
    double scale = 2.0 / double(n - correction);
    record(Op::var, out, {x}, [saved_x, mean, kept_shape, scale](const Tensor& dout) {
      return std::vector<Tensor>{mul(sub(saved_x, mean), mul(reshape(dout, kept_shape), scale))};
    });
  }
  return out;
}

// The k best entries along dim by a heap scan, sorted best first; values carry no gradient.
TopK topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  check_float(x, "topk");
  dim = wrap_dim(dim, x.dim(), "topk");
  Fold f = fold_at(x.shape(), dim);
  FORGE_CHECK(k >= 0 && k <= f.n, "topk: k = ", k, " out of range [0, ", f.n, "] for dimension ",
              dim, " of shape ", shape_str(x.shape()));
  Tensor xc = x.detach().contiguous();
  Shape shape = x.shape();
  shape[size_t(dim)] = k;
  TopK result{empty(shape, x.dtype()), empty(shape, DType::i64)};
  FORGE_DISPATCH_FLOAT(x.dtype(), "topk", [&] {
    kernels::topk_dim(xc.data<scalar_t>(), f.outer, f.n, f.inner, k, largest,
                      result.values.data<scalar_t>(), result.indices.data<int64_t>());
  });
  return result;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_float(x, "argmax");
  dim = nonempty_dim(x, dim, "argmax");
  Fold f = fold_at(x.shape(), dim);
  Tensor xc = x.detach().contiguous();
  Tensor out = empty(drop_dim(x.shape(), dim, keepdim), DType::i64);
  FORGE_DISPATCH_FLOAT(x.dtype(), "argmax", [&] {
    kernels::extreme_dim(xc.data<scalar_t>(), f.outer, f.n, f.inner, true,
                         static_cast<scalar_t*>(nullptr), out.data<int64_t>());
  });
  return out;
}

}  // namespace forge
