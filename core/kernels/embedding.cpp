// Embedding kernels. Backward zeroes the dense gradient in parallel 1 MB pieces (for a 50257 x 768
// table that fill is most of the cost), then threads take groups of columns and add the dout rows
// into them walking the ids in order: deterministic without atomics.
#include "core/kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace forge::kernels {
namespace {
// Work goes out dynamically in pieces (rows, fill blocks, column groups): on a shared machine a
// preempted thread then delays the others by one piece, not by half the job.
constexpr int64_t kParallelGrain = 16384;  // elements below which threads cost more than they give
constexpr int64_t kFillBlock = 262144;     // 1 MB of f32 per zero-fill piece
constexpr int64_t kColumnGroup = 64;       // four cache lines of f32, never shared by two threads
}  // namespace

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t C) {
  int64_t piece = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, C));
#pragma omp parallel for schedule(dynamic, piece) if (n * C > kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * C, weight + ids[i] * C, size_t(C) * sizeof(T));
}

template <class T>
void embedding_backward(const T* dout, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t C, int64_t padding_idx) {
  int64_t total = V * C, blocks = (total + kFillBlock - 1) / kFillBlock;
  int64_t groups = (C + kColumnGroup - 1) / kColumnGroup;
#pragma omp parallel if (total > kParallelGrain)
  {
#pragma omp for schedule(dynamic)
    for (int64_t k = 0; k < blocks; ++k) {
      int64_t begin = k * kFillBlock, end = std::min(total, begin + kFillBlock);
      std::memset(dweight + begin, 0, size_t(end - begin) * sizeof(T));
    }
    // The implicit barrier above: every row is zero before any thread adds into it.
#pragma omp for schedule(dynamic)
    for (int64_t g = 0; g < groups; ++g) {
      int64_t c0 = g * kColumnGroup, c1 = std::min(C, c0 + kColumnGroup);
      for (int64_t i = 0; i < n; ++i) {
        if (ids[i] == padding_idx) continue;
        T* dst = dweight + ids[i] * C;
        const T* src = dout + i * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
}

namespace ref {

template <class T>
void embedding_forward(const T* weight, const int64_t* ids, T* out, int64_t n, int64_t C) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = weight[ids[i] * C + c];
}

template <class T>
void embedding_backward(const T* dout, const int64_t* ids, T* dweight, int64_t n, int64_t V,
                        int64_t C, int64_t padding_idx) {
  for (int64_t k = 0; k < V * C; ++k) dweight[k] = T(0);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] != padding_idx)
      for (int64_t c = 0; c < C; ++c) dweight[ids[i] * C + c] += dout[i * C + c];
}

}  // namespace ref

#define FORGE_EMBEDDING_INSTANTIATE(T)                                                         \
  template void embedding_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t);          \
  template void embedding_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t, int64_t, \
                                      int64_t);                                                \
  template void ref::embedding_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t);     \
  template void ref::embedding_backward<T>(const T*, const int64_t*, T*, int64_t, int64_t,     \
                                           int64_t, int64_t);
FORGE_EMBEDDING_INSTANTIATE(float)
FORGE_EMBEDDING_INSTANTIATE(double)
#undef FORGE_EMBEDDING_INSTANTIATE
// Frozen bf16 tables are gathered as they are (core/ops/nn.cpp widens the rows).
template void embedding_forward<bf16>(const bf16*, const int64_t*, bf16*, int64_t, int64_t);

}  // namespace forge::kernels
