// Global-norm clipping and the non-finite scan: one pass per gradient each, sums carried in double
// so the norm of a large model's f32 gradients does not lose the small contributions.
#include "optim/clip.h"

#include <cmath>

#include "core/autograd.h"
#include "core/error.h"
#include "core/kernels/optim.h"

namespace forge::optim {
namespace {

using kernels::all_finite;
using kernels::scale;
using kernels::sum_squares;

// The gradient of `p` as a contiguous f32/f64 tensor owned by p (made contiguous in place once, so
// in-place scaling reaches the real gradient); undefined when there is none.
Tensor dense_grad(const NamedTensor& p) {
  Tensor grad = p.tensor.grad();
  if (!grad.defined()) return grad;
  FORGE_CHECK(grad.dtype() == DType::f32 || grad.dtype() == DType::f64, "clip_grad_norm: gradient of '",
              p.name, "' must be f32 or f64, got ", dtype_name(grad.dtype()));
  if (!grad.is_contiguous()) {
    grad = grad.contiguous();
    Tensor owner = p.tensor;
    owner.set_grad(grad);
  }
  return grad;
}

}  // namespace

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm) || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

double clip_grad_norm(const std::vector<NamedTensor>& params, double max_norm) {
  NoGradGuard no_grad;
  double total = 0;
  for (const NamedTensor& p : params) {
    Tensor g = dense_grad(p);
    if (!g.defined()) continue;
    total += g.dtype() == DType::f32 ? sum_squares(g.data<float>(), g.numel())
                                     : sum_squares(g.data<double>(), g.numel());
  }
  const double norm = std::sqrt(total);
  const double factor = clip_factor(norm, max_norm);
  if (factor == 1.0) return norm;
  for (const NamedTensor& p : params) {
    Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    if (g.dtype() == DType::f32) scale(g.data<float>(), g.numel(), float(factor));
    else scale(g.data<double>(), g.numel(), factor);
  }
  return norm;
}

std::optional<std::string> first_nonfinite_grad(const std::vector<NamedTensor>& params) {
  for (const NamedTensor& p : params) {
    Tensor g = dense_grad(p);
    if (!g.defined()) continue;
    bool ok = g.dtype() == DType::f32 ? all_finite(g.data<float>(), g.numel())
                                      : all_finite(g.data<double>(), g.numel());
    if (!ok) return p.name;
  }
  return std::nullopt;
}

std::optional<std::string> first_nonfinite_param(const std::vector<NamedTensor>& params) {
  for (const NamedTensor& p : params) {
    Tensor t = p.tensor.contiguous();
    bool ok = t.dtype() == DType::f32 ? all_finite(t.data<float>(), t.numel())
                                      : all_finite(t.data<double>(), t.numel());
    if (!ok) return p.name;
  }
  return std::nullopt;
}

}  // namespace forge::optim
