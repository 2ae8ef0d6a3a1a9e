// Random fills from Philox blocks. Element i takes its bits from block (first_block + i / per_block),
// so values depend on the index alone and threads can split the range freely.
#pragma once

#include <cstdint>

#include "core/rng.h"

namespace forge::kernels {

/// Blocks consumed by each fill for n elements (what the caller reserves with Generator::advance).
inline uint64_t uniform_blocks(int64_t n) { return uint64_t(n + 1) / 2; }
inline uint64_t normal_blocks(int64_t n) { return uint64_t(n + 1) / 2; }

/// Uniform in [low, high).
template <class T>
void fill_uniform(T* out, int64_t n, double low, double high, const GeneratorState& g,
                  uint64_t first_block);
/// Normal(mean, std) by Box-Muller, one pair per block.
template <class T>
void fill_normal(T* out, int64_t n, double mean, double std, const GeneratorState& g,
                 uint64_t first_block);
/// Normal(mean, std) truncated to [low, high] by inverse CDF.
template <class T>
void fill_trunc_normal(T* out, int64_t n, double mean, double std, double low, double high,
                       const GeneratorState& g, uint64_t first_block);
/// keep[i] = uniform >= p, scaled output mask: mask[i] = keep ? 1/(1-p) : 0.
template <class T>
void fill_dropout_mask(T* mask, int64_t n, double p, const GeneratorState& g, uint64_t first_block);
inline uint64_t dropout_blocks(int64_t n) { return uint64_t(n + 3) / 4; }

namespace ref {
/// One scalar Philox call per element: the oracle for the lane-parallel fill_dropout_mask.
template <class T>
void fill_dropout_mask(T* mask, int64_t n, double p, const GeneratorState& g, uint64_t first_block);
}  // namespace ref

}  // namespace forge::kernels
