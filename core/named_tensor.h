// A tensor with its dotted name: how nn hands parameters to optimizers and checkpoints without
// either knowing about Modules (docs/architecture.md: names are the interface).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace forge {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

using NamedTensors = std::vector<NamedTensor>;

}  // namespace forge
