// Matrix products on oneDNN (f32) with a reference path for f64: matmul, linear and the grouped
// linear of mixture-of-experts layers. Transposed operands (views from transpose()) are passed to
// the kernel as strides, never copied.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace forge {

/// The type that matmul and linear multiply f32 operands in. `bf16` rounds both operands to bf16
/// and multiplies them with f32 sums into an f32 result, in backward too (the gradients are f32);
/// it is what `train.precision: bf16` sets for a run (docs/core.md). A bf16 operand (a frozen
/// weight kept in bf16) is multiplied so whatever the setting. Process-wide, like
/// torch.set_float32_matmul_precision; f64 always computes in f64.
enum class MatmulPrecision { fp32, bf16 };
MatmulPrecision matmul_precision();
void set_matmul_precision(MatmulPrecision precision);

/// Sets the matmul precision for its scope and restores the previous one after.
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision precision)
      : previous_(matmul_precision()) { set_matmul_precision(precision); }
  ~MatmulPrecisionScope() { set_matmul_precision(previous_); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision previous_;
};

/// a [..., M, K] @ b [..., K, N] -> [..., M, N]; batch dimensions broadcast. 1-D operands are
/// treated as a row (a) or column (b) vector and that dimension is dropped from the result.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x [..., K] · weight [N, K]^T + bias [N] -> [..., N]; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
/// Grouped linear (one weight per group, e.g. per expert of a mixture of experts): rows
/// offsets[g] .. offsets[g+1] - 1 of x [M, K] times weight[g]^T, plus bias[g]:
/// x [M, K], weight [G, N, K], bias [G, N] or undefined, offsets G + 1 non-decreasing host values
/// with offsets[0] = 0 and offsets[G] = M -> [M, N]. Empty groups are allowed (their weight
/// gets a zero gradient). One GEMM per non-empty group on oneDNN; backward the same way
/// (dx per group, dweight[g] = dy_g^T x_g, dbias[g] = row sums of dy_g). Under
/// MatmulPrecision::bf16 it multiplies as linear does.
Tensor grouped_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const std::vector<int64_t>& offsets);

}  // namespace forge
