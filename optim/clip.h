// Gradient clipping by global norm and the non-finite gradient check behind the NaN policy. Both
// act on the .grad() of named parameters; parameters without a gradient are ignored.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/named_tensor.h"

namespace forge::optim {

/// torch.nn.utils.clip_grad_norm_: returns the global L2 norm of all gradients (accumulated in
/// double) and, when it exceeds max_norm, scales every gradient in place by max_norm/(norm+1e-6).
/// A non-finite norm leaves the gradients untouched (the NaN policy decides what happens next);
/// max_norm <= 0 only measures.
double clip_grad_norm(const std::vector<NamedTensor>& params, double max_norm);
/// What clip_grad_norm scales gradients of global norm `norm` by: max_norm / (norm + 1e-6) when a
/// finite norm exceeds max_norm > 0, else exactly 1 (for a caller that measured the norm itself,
/// as the trainer does on its gradient arena).
double clip_factor(double norm, double max_norm);

/// The name of the first parameter whose gradient holds a NaN or an infinity, if any.
std::optional<std::string> first_nonfinite_grad(const std::vector<NamedTensor>& params);

/// The name of the first parameter holding a NaN or an infinity, if any (an update that
/// overflowed: its loss and gradients were still finite).
std::optional<std::string> first_nonfinite_param(const std::vector<NamedTensor>& params);

}  // namespace forge::optim
