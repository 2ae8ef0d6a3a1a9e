// A parallel loop over independent items for code outside the kernels (per-row sampling in
// nn/generate, documents in data/prepare), so that OpenMP pragmas stay in core/kernels as the
// design asks.
#pragma once

#include <cstdint>
#include <functional>

namespace forge::kernels {

/// Calls body(i) for i in [0, n) on the OpenMP threads, items handed out one at a time (their
/// costs may differ). body must not throw: an exception cannot leave an OpenMP region.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

/// How many threads parallel_for may use (OMP_NUM_THREADS, else the cores).
int max_threads();

}  // namespace forge::kernels
