// All differentiable operations, one include. Each group's header documents shapes and semantics;
// the implementation files keep forward, backward and node of an op side by side.
#pragma once

#include "core/autograd.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/layout.h"
#include "core/ops/linalg.h"
#include "core/ops/nn.h"
#include "core/ops/reduce.h"
#include "core/ops/rotary.h"
#include "core/tensor.h"
