// Autoregressive sampling from a GPT: temperature, top-k and nucleus (top-p) filtering, with the
// KV cache while the sequence fits the context. Draws are counter-based (seed, row, token index),
// so the same seed gives the same text; temperature 0 is greedy decoding. generate_batch samples
// many prompts, several times each, in left-padded batches: what PPO rollouts and DPO evaluation
// call, and `forge generate --prompts`.
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
  /// Draw only ids below this: the tokenizer's vocabulary, for a model whose vocabulary is padded
  /// past it (an id the tokenizer cannot decode is never drawn). 0 = every id of the model.
  int64_t vocab_limit = 0;
  /// Optional: asked before each token; generation ends early when it returns true (a trainer
  /// sampling mid-run notices a stop request this way).
  std::function<bool()> stop = {};
};

/// Throws Error(usage) quoting a bad option (negative temperature, top_p outside (0, 1], ...).
void check_sampling(const SamplingOptions& options);

/// The Philox stream of sample `sample` of prompt `prompt`. Sample 0 of prompt 0 draws as
/// generate() does, so one prompt gives the same tokens through either function.
uint64_t sample_stream(int64_t prompt, int64_t sample);

/// Picks the next token from `logits` (length V) with draw `draw` of `stream`, among the first
/// options.vocab_limit ids when it is set.
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     uint64_t stream, uint64_t draw);

/// log P(token) under the distribution sample_token draws from: softmax(logits / temperature)
/// restricted to the ids below vocab_limit, then to the top-k, then top-p, candidates and
/// renormalised; -infinity for a token it never draws. Greedy (temperature 0): 0 for the argmax,
/// else -infinity.
double sampling_log_probability(const float* logits, int64_t vocab, const SamplingOptions& options,
                                int64_t token);

/// Continues `prompt` by up to max_new_tokens tokens and returns only the new ones. Positions past
/// the context fall back to a full forward over the last `context` tokens per step, as nanoGPT
/// does, because learned absolute positions cannot slide inside a cache. `ends`, when given, is
/// told each new token and ends generation after one for which it returns true (a chat reply's
/// end-of-turn token, kept in the result).
std::vector<int64_t> generate(const GPT& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options,
                              const std::function<bool(int64_t token)>& ends = {});

/// What generate_batch does besides sampling.
struct BatchOptions {
  int64_t num_samples = 1;  ///< completions per prompt (K)
  int64_t batch_size = 64;  ///< rows (a prompt's sample) decoded together in one forward
  /// A completion ends once it has generated these ids (e.g. "%\n" in bytes, or one special id);
  /// they stay in its tokens and its log-probability. Empty: completions run to max_new_tokens.
  std::vector<int64_t> end_of_text = {};
  /// Optional: called after each batch of rows with the rows and tokens completed so far.
  std::function<void(int64_t rows_done, int64_t rows_total, int64_t tokens)> progress = {};
};

/// Throws Error(usage) quoting a bad option (num_samples or batch_size below 1).
void check_batch(const BatchOptions& options);

/// What generate_batch checks of its prompts before it samples, for a caller that checks before it
/// loads the model (`context` and `vocab` from its config): Error(usage) for an empty prompt or one
/// whose length plus sampling.max_new_tokens exceeds `context`, Error(data) for an id outside
/// [0, vocab).
void check_prompts(const std::vector<std::vector<int64_t>>& prompts, int64_t context, int64_t vocab,
                   const SamplingOptions& sampling);

/// One sample of one prompt.
struct Completion {
  int64_t prompt_index = 0;
  int64_t sample_index = 0;
  std::vector<int64_t> tokens;  ///< the generated ids only
  bool finished = false;        ///< ended at end_of_text (false: max_new_tokens was reached)
  /// Sum over `tokens` of log softmax(logits)[token] with the model's raw logits, at temperature
  /// 1 and before top-k / top-p: the log-likelihood under the model itself, which is what PPO's
  /// ratios and DPO's margins compare, whatever filter drew the tokens.
  double logprob = 0.0;
  /// The same sum under the distribution the tokens were drawn from (sampling_log_probability:
  /// temperature, top-k and top-p), from the logits that drew them; always finite.
  double sampling_logprob = 0.0;
};

/// K = options.num_samples completions of every prompt, ordered by (prompt, sample). A row's draws
/// depend only on (seed, prompt index, sample index, token index), and its logits equal those of
/// running it alone (up to float rounding: left padding is masked and positions are the row's
/// own), so the result does not depend on batch_size or on which rows share a batch. Rows are
/// batched by prompt length, a prompt is prefilled once for its samples, and finished rows leave
/// the batch. Every prompt must fit with its completion: Error(usage) when a prompt's length plus
/// max_new_tokens exceeds the context (no sliding window, unlike generate()), Error(usage) for an
/// empty prompt or for more completions than memory holds, Error(data) for an id outside the
/// vocabulary. When sampling.stop returns true the call returns early with incomplete rows:
/// discard that result. MoE models route each token alone in eval mode (nn/moe.h), so batch
/// independence holds for them too.
std::vector<Completion> generate_batch(const GPT& model,
                                       const std::vector<std::vector<int64_t>>& prompts,
                                       const SamplingOptions& sampling,
                                       const BatchOptions& options);

}  // namespace forge::nn
