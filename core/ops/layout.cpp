// Views: new shape and strides over the same storage, with backward passes that map the gradient
// back to the input's geometry. Copying layout ops (cat, index_select, gather) live in
// layout_copy.cpp.
#include "core/ops/layout.h"

#include <algorithm>
#include <numeric>

#include "core/autograd.h"
#include "core/ops/elementwise.h"
#include "core/ops/op_util.h"
#include "core/ops/reduce.h"

namespace forge {
namespace {

using op_util::wrap_dim;

// Strides for viewing `x` as `shape` without a copy, or empty if the layout does not allow it
// (PyTorch's computeStride: each run of merged input dims must be contiguous within itself).
Shape view_strides(const Tensor& x, const Shape& shape) {
  if (x.numel() == 0) return contiguous_strides(shape);
  const Shape& old_shape = x.shape();
  const Shape& old_strides = x.strides();
  Shape strides(shape.size());
  int64_t view_d = int64_t(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = int64_t(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[size_t(d)];
    if (d == 0 || (old_shape[size_t(d - 1)] != 1 &&
                   old_strides[size_t(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[size_t(view_d)] == 1)) {
        strides[size_t(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[size_t(view_d)];
        view_d--;
      }
      if (view_numel != tensor_numel) return {};
      if (d > 0) {
        chunk_base_stride = old_strides[size_t(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return {};
  return strides;
}

// Records the backward of a view: the gradient of the view, mapped back by `back`.
Tensor finish_view(Op op, const Tensor& x, Tensor view,
                   std::function<Tensor(const Tensor&)> back) {
  if (needs_grad(x)) record(op, view, {x}, [back = std::move(back)](const Tensor& dout) {
      return std::vector<Tensor>{back(dout)};
    });
  return view;
}

}  // namespace

// x viewed (or copied) as `shape`; backward reshapes the gradient back.
Tensor reshape(const Tensor& x, const Shape& requested) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      FORGE_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(requested));
      infer = int64_t(i);
    } else {
      FORGE_CHECK(shape[i] >= 0, "reshape: invalid size in ", shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    FORGE_CHECK(known > 0 && x.numel() % known == 0, "reshape: cannot infer -1 in ",
                shape_str(requested), " for ", x.numel(), " elements");
    shape[size_t(infer)] = x.numel() / known;
  }
  FORGE_CHECK(shape_numel(shape) == x.numel(), "reshape: shape ", shape_str(requested),
              " does not fit ", x.numel(), " elements of shape ", shape_str(x.shape()));
  if (shape == x.shape()) return x;
  Shape strides = view_strides(x, shape);
  Tensor src = x;
  if (strides.empty() && !shape.empty()) {
    src = x.contiguous();  // records its own node, so the chain stays differentiable
    strides = contiguous_strides(shape);
  }
  Tensor view = make_view(src, shape, strides, src.offset());
  Shape in_shape = src.shape();
  return finish_view(Op::reshape, src, view,
                     [in_shape](const Tensor& dout) { return reshape(dout, in_shape); });
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  int64_t n = x.dim();
  if (n == 0) return reshape(x, {1});
  start_dim = wrap_dim(start_dim, n, "flatten");
  end_dim = wrap_dim(end_dim, n, "flatten");
  FORGE_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= x.shape()[size_t(d)];
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + end_dim + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim() + 1, "unsqueeze");
  Shape shape = x.shape();
  shape.insert(shape.begin() + dim, 1);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "squeeze");
  FORGE_CHECK(x.shape()[size_t(dim)] == 1, "squeeze: dimension ", dim, " of shape ",
              shape_str(x.shape()), " is not 1");
  Shape shape = x.shape();
  shape.erase(shape.begin() + dim);
  return reshape(x, shape);
}

// out dim i is x dim dims[i]; backward applies the inverse permutation.
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t n = x.dim();
  FORGE_CHECK(int64_t(dims.size()) == n, "permute: ", dims.size(), " dims for a ", n, "-d tensor");
  std::vector<int64_t> inverse(static_cast<size_t>(n), -1);
  Shape shape(static_cast<size_t>(n)), strides(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[size_t(i)], n, "permute");
    FORGE_CHECK(inverse[size_t(d)] < 0, "permute: dimension ", d, " repeated");
    inverse[size_t(d)] = i;
    shape[size_t(i)] = x.shape()[size_t(d)];
    strides[size_t(i)] = x.strides()[size_t(d)];
  }
  Tensor view = make_view(x, shape, strides, x.offset());
  return finish_view(Op::permute, x, view,
                     [inverse](const Tensor& dout) { return permute(dout, inverse); });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(size_t(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[size_t(wrap_dim(dim0, x.dim(), "transpose"))],
            dims[size_t(wrap_dim(dim1, x.dim(), "transpose"))]);
  return permute(x, dims);
}

// out = x[start:end:step] along dim; backward writes dout into a zero tensor of x's shape.
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap_dim(dim, x.dim(), "slice");
  FORGE_CHECK(step > 0, "slice: step must be positive, got ", step);
  int64_t size = x.shape()[size_t(dim)];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = x.shape(), strides = x.strides();
  shape[size_t(dim)] = (end - start + step - 1) / step;
  strides[size_t(dim)] *= step;
  Tensor view = make_view(x, shape, strides, x.offset() + start * x.strides()[size_t(dim)]);
  Shape in_shape = x.shape();
  return finish_view(Op::slice, x, view, [in_shape, dim, start, end, step](const Tensor& dout) {
    Tensor dx = zeros(in_shape, dout.dtype());
    slice(dx, dim, start, end, step).copy_(dout);
    return dx;
  });
}

// Stride-0 view; backward sums over the stretched dimensions.
Tensor expand(const Tensor& x, const Shape& requested) {
  FORGE_CHECK(requested.size() >= size_t(x.dim()), "expand: cannot expand shape ",
              shape_str(x.shape()), " to fewer dimensions ", shape_str(requested));
  size_t lead = requested.size() - size_t(x.dim());
  Shape shape(requested.size()), strides(requested.size(), 0);
  for (size_t d = 0; d < requested.size(); ++d) {
    int64_t want = requested[d];
    if (d < lead) {
      FORGE_CHECK(want >= 0, "expand: -1 not allowed for a new dimension in ", shape_str(requested));
      shape[d] = want;
      continue;
    }
    int64_t have = x.shape()[d - lead];
    if (want == -1) want = have;
    FORGE_CHECK(have == want || have == 1, "expand: shape ", shape_str(x.shape()),
                " cannot expand to ", shape_str(requested));
    shape[d] = want;
    strides[d] = have == want ? x.strides()[d - lead] : 0;
  }
  if (shape == x.shape()) return x;
  Tensor view = make_view(x, shape, strides, x.offset());
  Shape in_shape = x.shape();
  return finish_view(Op::expand, x, view,
                     [in_shape](const Tensor& dout) { return sum_to(dout, in_shape); });
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  FORGE_CHECK(size > 0, "split: size must be positive, got ", size);
  int64_t d = wrap_dim(dim, x.dim(), "split"), n = x.shape()[size_t(d)];
  std::vector<Tensor> parts;
  for (int64_t start = 0; start < n; start += size)
    parts.push_back(slice(x, d, start, std::min(start + size, n)));
  return parts;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  FORGE_CHECK(total == x.shape()[size_t(d)], "split: sizes add up to ", total, " but dimension ", d,
              " has ", x.shape()[size_t(d)]);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice(x, d, start, start + s));
    start += s;
  }
  return parts;
}

}  // namespace forge
