// Batched matrix product on raw buffers: C = A·B (+ bias over N) (+ beta·C), and the grouped GEMMs
// of mixture-of-experts layers. Operands are strided views (a transposed operand is just swapped
// strides, a broadcast batch dimension has stride 0), so callers never copy. f32 runs on oneDNN's
// matmul primitive, cached per geometry (grouped GEMMs: per geometry without the group sizes); f64
// runs a plain loop (gradient checks); kernels::ref is the triple-loop oracle for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

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

/// Whether oneDNN multiplies bf16 natively here (AVX512-BF16 or AMX-BF16, and ONEDNN_MAX_CPU_ISA
/// does not hold it below avx512_core_bf16).
bool bf16_native();

/// How matmul_bf16 computes: `native` is oneDNN's bf16 GEMM (bf16_native() must hold), `widened`
/// an f32 GEMM of the operands converted to f32, which gives the same products exactly and differs
/// only in the order of the f32 sums; `best` is native where the CPU has it.
enum class Bf16Kernel { best, native, widened };

/// C (f32) = A·B + bias + beta·C with A and B in bf16: exact products, f32 sums. Same geometry
/// and contract as matmul; bias is f32.
void matmul_bf16(const MatmulGeometry& g, const bf16* a, const bf16* b, const float* bias, float* c,
                 float beta = 0.f, Bf16Kernel kernel = Bf16Kernel::best);

/// Geometry of a grouped GEMM (the experts of a mixture of experts): G products over blocks of
/// shared buffers, group g owning positions r0 = offsets[g] .. r1 = offsets[g + 1] - 1 of one
/// ragged dimension.
///  - Ragged M (forward and input gradient): C[r0:r1] = A[r0:r1] · B_g + bias[g], with B_g at
///    b + g * b_group_stride, bias dense [G, N] or null, C dense [M, N].
///  - Ragged K (weight gradient): C_g = A[:, r0:r1] · B[r0:r1], C dense [G, M, N], no bias; an
///    empty group gives zeros.
struct GroupedMatmulGeometry {
  std::vector<int64_t> offsets;                  ///< G + 1 non-decreasing positions
  bool ragged_k = false;                         ///< the groups split K, else M
  int64_t m = 0, n = 0, k = 0;                   ///< the ragged one equals offsets.back()
  int64_t a_strides[2] = {}, b_strides[2] = {};  ///< A: M, K strides; B: K, N strides
  int64_t b_group_stride = 0;                    ///< ragged M only
};

/// One GEMM per non-empty group, each operand read in place at its group's offset. In f32 all
/// groups, whatever their sizes, share one oneDNN primitive (the ragged dim is a runtime
/// dimension), so group sizes that change every step create no primitives.
template <class T>
void grouped_matmul(const GroupedMatmulGeometry& g, const T* a, const T* b, const T* bias, T* c);
/// grouped_matmul of bf16 operands with f32 sums, bias and result, computed as matmul_bf16 does.
void grouped_matmul_bf16(const GroupedMatmulGeometry& g, const bf16* a, const bf16* b,
                         const float* bias, float* c, Bf16Kernel kernel = Bf16Kernel::best);

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
/// Same contract as kernels::grouped_matmul: a plain loop over groups, rows, columns and K.
template <class T>
void grouped_matmul(const GroupedMatmulGeometry& g, const T* a, const T* b, const T* bias, T* c);
}  // namespace ref

}  // namespace forge::kernels
