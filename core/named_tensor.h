// A tensor with its dotted name: how nn hands parameters to optimizers and checkpoints without
// either knowing about Modules (DESIGN.md §3: names are the API).
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
