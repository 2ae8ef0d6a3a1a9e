// Layout ops that copy: cat (and stack, derived from it), index_select, index_add and gather. Each
// folds its tensors into dense [outer, n, inner] blocks around the axis and calls kernels/index;
// scatter-adds (index_add, the backwards of the gathers) are deterministic. Bad indices are data
// errors: they come from token ids, labels, masks or expert routes a user supplied.
#include <numeric>

#include "core/autograd.h"
#include "core/kernels/index.h"
#include "core/ops/layout.h"
#include "core/ops/op_util.h"

namespace forge {
namespace {

using op_util::check_float;
using op_util::Fold;
using op_util::fold_at;
using op_util::scatter_into_zeros;
using op_util::wrap_dim;

// Calls f(T{}) with T the element type of `dtype` (copies work for every dtype).
template <class F>
void dispatch_any(DType dtype, F f) {
  switch (dtype) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::bf16: return f(bf16{});
    case DType::i64: return f(int64_t{});
  }
}

// The index as a dense i64 buffer, every entry checked against [0, limit).
Tensor checked_index(const Tensor& index, int64_t limit, int64_t dim, const Tensor& x,
                     const char* op) {
  FORGE_CHECK(index.defined() && index.dtype() == DType::i64, op, ": index must be i64, got ",
              index.defined() ? dtype_name(index.dtype()) : "undefined");
  Tensor ic = index.contiguous();
  int64_t p = kernels::first_out_of_range(ic.data<int64_t>(), ic.numel(), limit);
  if (p >= 0) {
    Shape at(ic.shape().size());
    for (int64_t d = ic.dim() - 1, rem = p; d >= 0; --d) {
      at[size_t(d)] = rem % ic.shape()[size_t(d)];
      rem /= ic.shape()[size_t(d)];
    }
    throw Error(ExitCode::data,
                detail::concat(op, ": index ", ic.data<int64_t>()[p], " at position ",
                               shape_str(at), " is out of range [0, ", limit, ") for dimension ",
                               dim, " of shape ", shape_str(x.shape())));
  }
  return ic;
}


// out[o, j, i] = x[o, index(o, j, i), i]; backward: dx[o, index(o, j, i), i] += dout[o, j, i].
Tensor gather_op(Op op, const Tensor& x, const Tensor& index, const kernels::AxisIndex& g,
                 const Shape& out_shape) {
  Tensor xc = x.detach().contiguous();
  Tensor out = empty(out_shape, x.dtype());
  dispatch_any(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    kernels::gather_axis(xc.data<T>(), index.data<int64_t>(), g, out.data<T>());
  });
  if (needs_grad(x)) {
    Shape in_shape = x.shape();
    record(op, out, {x}, [index, g, in_shape](const Tensor& dout) {
      return std::vector<Tensor>{scatter_into_zeros(dout, index, g, in_shape)};
    });
  }
  return out;
}

}  // namespace

// out = xs[0] ++ xs[1] ++ ... along dim; backward hands each input its slice of dout.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "cat: no tensors given");
  const Tensor& x0 = xs[0];
  FORGE_CHECK(x0.defined(), "cat: tensor 0 is undefined");
  dim = wrap_dim(dim, x0.dim(), "cat");
  Shape shape = x0.shape();
  shape[size_t(dim)] = 0;
  bool grad = false;
  for (size_t t = 0; t < xs.size(); ++t) {
    const Tensor& x = xs[t];
    FORGE_CHECK(x.defined(), "cat: tensor ", t, " is undefined");
    FORGE_CHECK(x.dtype() == x0.dtype(), "cat: tensor ", t, " is ", dtype_name(x.dtype()),
                ", tensor 0 is ", dtype_name(x0.dtype()));
    bool fits = x.dim() == x0.dim();
    for (int64_t d = 0; fits && d < x.dim(); ++d)
      fits = d == dim || x.shape()[size_t(d)] == x0.shape()[size_t(d)];
    FORGE_CHECK(fits, "cat: tensor ", t, " has shape ", shape_str(x.shape()), " but tensor 0 has ",
                shape_str(x0.shape()), " (shapes may differ only in dimension ", dim, ")");
    shape[size_t(dim)] += x.shape()[size_t(dim)];
    grad = grad || x.requires_grad();
  }
  Fold f = fold_at(shape, dim);
  std::vector<Tensor> dense;
  std::vector<const void*> ptrs;
  std::vector<int64_t> row_bytes, sizes;
  for (const Tensor& x : xs) {
    dense.push_back(x.detach().contiguous());
    ptrs.push_back(dense.back().raw_data());
    sizes.push_back(x.shape()[size_t(dim)]);
    row_bytes.push_back(sizes.back() * f.inner * int64_t(dtype_size(x.dtype())));
  }
  Tensor out = empty(shape, x0.dtype());
  kernels::cat_rows(ptrs.data(), row_bytes.data(), int(xs.size()), f.outer, out.raw_data());
  if (grad && grad_enabled()) {
    std::vector<bool> want;
    for (const Tensor& x : xs) want.push_back(x.requires_grad());
    record(Op::cat, out, xs, [sizes, want, dim](const Tensor& dout) {
      std::vector<Tensor> dxs(sizes.size());
      int64_t start = 0;
      for (size_t t = 0; t < sizes.size(); ++t) {
        if (want[t]) dxs[t] = slice(dout, dim, start, start + sizes[t]);
        start += sizes[t];
      }
      return dxs;
    });
  }
  return out;
}

// Derived: each input gains a size-1 dim at `dim`, then cat (no node of its own).
Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  FORGE_CHECK(!xs.empty(), "stack: no tensors given");
  dim = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t t = 0; t < xs.size(); ++t) {
    FORGE_CHECK(xs[t].defined() && xs[t].shape() == xs[0].shape(), "stack: tensor ", t,
                " has shape ", xs[t].defined() ? shape_str(xs[t].shape()) : "undefined",
                " but tensor 0 has ", shape_str(xs[0].shape()));
    parts.push_back(unsqueeze(xs[t], dim));
  }
  return cat(parts, dim);
}

// out = x with dim indexed by the 1-D i64 `index` (repeats allowed).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  FORGE_CHECK(x.defined(), "index_select: undefined tensor");
  dim = wrap_dim(dim, x.dim(), "index_select");
  FORGE_CHECK(index.defined() && index.dim() == 1, "index_select: index must be 1-D, got shape ",
              index.defined() ? shape_str(index.shape()) : "undefined");
  Fold f = fold_at(x.shape(), dim);
  Tensor ic = checked_index(index, f.n, dim, x, "index_select");
  Shape shape = x.shape();
  shape[size_t(dim)] = ic.numel();
  kernels::AxisIndex g{f.outer, f.n, ic.numel(), f.inner, {0, 1, 0}};
  return gather_op(Op::index_select, x, ic, g, shape);
}

// torch.index_add: out = x, then out[.., index[j], ..] += source[.., j, ..] along dim, repeats
// adding up in the order of j.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
  check_float(x, "index_add", "x");
  check_float(source, "index_add", "source");
  dim = wrap_dim(dim, x.dim(), "index_add");
  FORGE_CHECK(index.defined() && index.dim() == 1, "index_add: index must be 1-D, got shape ",
              index.defined() ? shape_str(index.shape()) : "undefined");
  FORGE_CHECK(source.dtype() == x.dtype(), "index_add: source is ", dtype_name(source.dtype()),
              ", x is ", dtype_name(x.dtype()));
  Shape expected = x.shape();
  expected[size_t(dim)] = index.numel();
  FORGE_CHECK(source.shape() == expected, "index_add: source has shape ",
              shape_str(source.shape()), ", expected ", shape_str(expected),
              " (x's shape with the ", index.numel(), " indices at dimension ", dim, ")");
  Fold f = fold_at(x.shape(), dim);
  Tensor ic = checked_index(index, f.n, dim, x, "index_add");
  Tensor out = x.detach().clone();
  Tensor sc = source.detach().contiguous();
  kernels::AxisIndex g{f.outer, f.n, ic.numel(), f.inner, {0, 1, 0}};
  FORGE_DISPATCH_FLOAT(x.dtype(), "index_add", [&] {
    kernels::scatter_add_axis(sc.data<scalar_t>(), ic.data<int64_t>(), g, out.data<scalar_t>());
  });
  if (needs_grad(x, source)) {
    bool want_x = x.requires_grad(), want_source = source.requires_grad();
    record(Op::index_add, out, {x, source}, [ic, dim, want_x, want_source](const Tensor& dout) {
      // out = x + scatter(source): x passes dout through, source reads it back where it was added.
      return std::vector<Tensor>{want_x ? dout : Tensor(),
                                 want_source ? index_select(dout, dim, ic) : Tensor()};
    });
  }
  return out;
}

// torch.gather: out has index's shape, out[.., j, ..] = x[.., index[.., j, ..], ..] along dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  FORGE_CHECK(x.defined() && index.defined(), "gather: undefined tensor");
  dim = wrap_dim(dim, x.dim(), "gather");
  FORGE_CHECK(index.dim() == x.dim(), "gather: index of shape ", shape_str(index.shape()),
              " must have the rank of x, shape ", shape_str(x.shape()));
  // Off the gather axis the index may be shorter than x: narrow x to it first (a differentiable
  // view), so the kernel sees blocks of matching shape.
  Tensor src = x;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim) continue;
    FORGE_CHECK(index.shape()[size_t(d)] <= x.shape()[size_t(d)], "gather: index of shape ",
                shape_str(index.shape()), " exceeds x of shape ", shape_str(x.shape()),
                " in dimension ", d);
    if (index.shape()[size_t(d)] < x.shape()[size_t(d)])
      src = slice(src, d, 0, index.shape()[size_t(d)]);
  }
  Fold f = fold_at(src.shape(), dim);
  Tensor ic = checked_index(index, f.n, dim, x, "gather");
  int64_t m = index.shape()[size_t(dim)];
  kernels::AxisIndex g{f.outer, f.n, m, f.inner, {m * f.inner, f.inner, 1}};
  return gather_op(Op::gather, src, ic, g, index.shape());
}

// dx of `shape` holding dout scatter-added at the positions `index` (the backward of a gather).
Tensor op_util::scatter_into_zeros(const Tensor& dout, const Tensor& index,
                                   const kernels::AxisIndex& g, const Shape& shape) {
  Tensor dc = dout.contiguous();
  Tensor dx = zeros(shape, dc.dtype());
  FORGE_DISPATCH_FLOAT(dc.dtype(), "scatter_add", [&] {
    kernels::scatter_add_axis(dc.data<scalar_t>(), index.data<int64_t>(), g, dx.data<scalar_t>());
  });
  return dx;
}

}  // namespace forge
