// parallel_for: one dynamic OpenMP loop; a single item runs on the calling thread.
#include "core/kernels/parallel.h"

#include <omp.h>

namespace forge::kernels {

void parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (int64_t i = 0; i < n; ++i) body(i);
}

int max_threads() { return omp_get_max_threads(); }

}  // namespace forge::kernels
