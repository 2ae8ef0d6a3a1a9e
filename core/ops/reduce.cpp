// Sum-like reductions. Accumulation is in f64 for both dtypes (kernels::sum_dims), so large
// losses and statistics do not drift with tensor size.
#include "core/ops/reduce.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/kernels/elementwise.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"

namespace forge {
namespace {

// Normalises dims (negative, duplicates) into a per-dimension flag.
std::vector<bool> reduce_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  std::vector<bool> mask(size_t(x.dim()), false);
  for (int64_t d : dims) {
    FORGE_CHECK(d >= -x.dim() && d < x.dim(), op, ": dimension ", d, " out of range for shape ",
                shape_str(x.shape()));
    mask[size_t(d < 0 ? d + x.dim() : d)] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

}  // namespace

// out = sum of x over dims; backward broadcasts dout back (through the keepdim shape).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  FORGE_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, "sum: expected f32 or f64, got ",
              dtype_name(x.dtype()));
  std::vector<bool> mask = reduce_mask(x, dims, "sum");
  Tensor xc = x.contiguous();
  Shape kept = reduced_shape(x.shape(), mask, true);
  Tensor out = empty(reduced_shape(x.shape(), mask, keepdim), x.dtype());
  std::unique_ptr<bool[]> flags(new bool[mask.size() + 1]);
  std::copy(mask.begin(), mask.end(), flags.get());
  FORGE_DISPATCH_FLOAT(x.dtype(), "sum", [&] {
    kernels::sum_dims(xc.data<scalar_t>(), xc.shape().data(), flags.get(), int(xc.dim()),
                      out.data<scalar_t>());
  });
  if (needs_grad(x)) {
    Shape in_shape = x.shape();
    record(Op::sum, out, {x}, [in_shape, kept](const Tensor& dout) {
      return std::vector<Tensor>{expand(reshape(dout, kept), in_shape).contiguous()};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  std::vector<int64_t> all(size_t(x.dim()));
  for (int64_t d = 0; d < x.dim(); ++d) all[size_t(d)] = d;
  return sum(x, all, false);
}

// mean = sum / n over the reduced elements.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<bool> mask = reduce_mask(x, dims, "mean");
  int64_t n = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) n *= x.shape()[d];
  Tensor total;
  {
    NoGradGuard no_grad;
    total = sum(x, dims, keepdim);
  }
  Tensor out = mul(total, 1.0 / double(n));
  if (needs_grad(x)) {
    Shape in_shape = x.shape(), kept = reduced_shape(x.shape(), mask, true);
    double inv = 1.0 / double(n);
    record(Op::mean, out, {x}, [in_shape, kept, inv](const Tensor& dout) {
      return std::vector<Tensor>{mul(expand(reshape(dout, kept), in_shape).contiguous(), inv)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x) {
  std::vector<int64_t> all(size_t(x.dim()));
  for (int64_t d = 0; d < x.dim(); ++d) all[size_t(d)] = d;
  return mean(x, all, false);
}

}  // namespace forge
