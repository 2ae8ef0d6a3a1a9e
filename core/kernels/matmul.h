// Batched matrix product on raw buffers: C = A·B (+ bias over N) (+ beta·C). Operands are strided
// views (a transposed operand is just swapped strides, a broadcast batch dimension has stride 0),
// so callers never copy. f32 runs on oneDNN's matmul primitive, cached per geometry; f64 runs a
// plain loop (gradient checks); kernels::ref::matmul is the triple-loop oracle for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace forge::kernels {

/// Geometry of C[batch..., M, N] = A[batch..., M, K] · B[batch..., K, N]. C is dense row-major.
struct MatmulGeometry {
  std::vector<int64_t> batch;      ///< output batch sizes (may be empty)
  int64_t m = 0, n = 0, k = 0;
  std::vector<int64_t> a_strides;  ///< batch.size() + 2 strides: batch (0 = broadcast), M, K
  std::vector<int64_t> b_strides;  ///< batch.size() + 2 strides: batch (0 = broadcast), K, N
};

/// C = A·B + bias + beta·C. `bias` is dense [N] or null; with beta == 0, C is write-only (its old
/// contents may be NaN). Operand layouts oneDNN cannot take are copied to dense scratch first.
template <class T>
void matmul(const MatmulGeometry& g, const T* a, const T* b, const T* bias, T* c, float beta = 0.f);

/// Primitive cache counters (f32 path): distinct geometries cached, and lookups that found one.
struct MatmulCacheStats {
  size_t entries = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
};
MatmulCacheStats matmul_cache_stats();

namespace ref {
/// Same contract as kernels::matmul; accumulates each dot product in double.
template <class T>
void matmul(const MatmulGeometry& g, const T* a, const T* b, const T* bias, T* c, float beta = 0.f);
}  // namespace ref

}  // namespace forge::kernels
