// Autoregressive sampling from a GPT: temperature, top-k and nucleus (top-p) filtering, with the
// KV cache while the sequence fits the context. Draws are counter-based (seed, token index), so the
// same seed gives the same text; temperature 0 is greedy decoding.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/gpt.h"

namespace forge::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  ///< 0 = greedy (argmax)
  int64_t top_k = 0;         ///< keep the k most likely tokens; 0 = all
  double top_p = 1.0;        ///< keep the smallest set whose probability reaches top_p; 1 = all
  uint64_t seed = 0;
  /// Optional: asked before each token; generation ends early when it returns true (a trainer
  /// sampling mid-run notices a stop request this way).
  std::function<bool()> stop = {};
};

/// Throws Error(usage) quoting a bad option (negative temperature, top_p outside (0, 1], ...).
void check_sampling(const SamplingOptions& options);

/// Picks the next token from `logits` (length V); `draw` numbers the random draw.
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     uint64_t draw);

/// Continues `prompt` by up to max_new_tokens tokens and returns only the new ones. Positions past
/// the context fall back to a full forward over the last `context` tokens per step, as nanoGPT
/// does, because learned absolute positions cannot slide inside a cache.
std::vector<int64_t> generate(const GPT& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

}  // namespace forge::nn
