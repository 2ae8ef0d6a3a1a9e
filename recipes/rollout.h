// What the recipes that sample their policy and learn from the samples (ppo, grpo) share: prompt
// files checked against every model's context before the first step, the prompts and the sampling
// seed of a step as functions of (seed, step), the sampling keys of their sections and their
// rules, the rollout's rows in next_token_rows' layout with per-response-token vectors moved in
// and out of them, the policy's tempered log-probabilities of a batch of rows, and the passes of
// minibatch updates over a rollout.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "data/batch.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "runtime/config.h"
#include "runtime/registry.h"
#include "runtime/trainer.h"

namespace forge {

/// Prompts with their ids under the policy's tokenizer and, for grpo, the JSONL record each came
/// from (its verifiers read the record's other fields).
struct Prompts {
  std::vector<std::string> text;
  std::vector<std::vector<int64_t>> ids;
  std::vector<nlohmann::json> records;  ///< empty, or one per prompt
};

/// A model that reads a prompt with its completion of up to max_new_tokens: a row is the prompt's
/// tokens + max_new_tokens + `extra` long and must fit `context`.
struct PromptLimit {
  std::string model;                     ///< "model.context", "the value model's context", ...
  int64_t context = 0;
  int64_t extra = 0;
  const Tokenizer* tokenizer = nullptr;  ///< one that re-tokenizes the text; null: the policy's ids
  std::string extra_text = {};           ///< what `extra` is, for the message
};

/// Reads one prompt file: the texts, and the records when the recipe keeps them.
using PromptReader = std::function<Prompts(const std::filesystem::path& file)>;

/// The prompts `read` gives for data.train and data.val (or data.val_fraction of data.train's,
/// split by data.split_seed), their ids under `tokenizer`, each checked to leave room for
/// `max_new_tokens` (the key `new_tokens_key` sets) in model.context and in every model of
/// `limits`: Error(data) naming the file, the prompt and the context otherwise.
struct PromptSplits {
  Prompts train, val;
};
PromptSplits load_prompts(const RunConfig& config, const Tokenizer& tokenizer,
                          int64_t max_new_tokens, const std::string& new_tokens_key,
                          const PromptReader& read, std::vector<PromptLimit> limits = {});

/// Prompts `rows` of `p`, in that order.
Prompts subset(const Prompts& p, const std::vector<int64_t>& rows);

/// The prompts of step `step`: rows step * count .. step * count + count - 1 of the endless sequence
/// of epochs over n prompts, each a seeded shuffle (Philox stream `stream`), so a step's prompts
/// are a function of (seed, step).
std::vector<int64_t> step_prompts(int64_t n, uint64_t seed, int64_t step, int64_t count,
                                  const std::string& stream);

/// The seed of a step's (or an evaluation's) sampling: one Philox draw under the run's seed.
uint64_t sampling_seed(const RunConfig& config, std::string_view purpose, int64_t step);

/// The keys `section`.generation_batch_size, max_new_tokens, temperature, top_k, top_p and
/// stop_text, as ppo and grpo declare them.
std::vector<ConfigKey> sampling_keys(const std::string& section, int64_t max_new_tokens);

/// The rules of such a recipe: held-out prompts to evaluate on (data.val, or data.val_fraction > 0),
/// and completions of `max_new_tokens` (the key `new_tokens_key`) that leave room in model.context.
void check_rollout(ConfigChecker& checker, int64_t max_new_tokens,
                   const std::string& new_tokens_key);

/// Those keys' values as sampling options (without the seed, which is the step's) and the batch
/// options of generate_batch (end of text from stop_text under `tokenizer`).
struct RolloutSampling {
  nn::SamplingOptions sampling;
  int64_t generation_batch_size = 0;
  std::string stop_text;
};
RolloutSampling rollout_sampling(const RunConfig& config, const std::string& section);

/// A rollout's rows: prompt + completion tokens, where each completion starts, whether it reached
/// the stop text.
struct RolloutRows {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int64_t> prompt_len;
  std::vector<bool> finished;
  int64_t size() const { return int64_t(tokens.size()); }
  int64_t response_tokens(int64_t r) const {
    return int64_t(tokens[size_t(r)].size()) - prompt_len[size_t(r)];
  }
};

/// Samples `num_samples` completions of every prompt with the policy in eval mode (its mode
/// restored), ordered by (prompt, sample), into `rows`; returns each completion's text, decoded as
/// a continuation of its prompt.
std::vector<std::string> sample_rollout(const nn::GPT& policy, const Tokenizer& tokenizer,
                                        const RolloutSampling& s, const Prompts& prompts,
                                        uint64_t seed, int64_t num_samples, RolloutRows& rows);

/// Rows `rows` of a rollout as next_token_rows lays them out, [n, W].
NextTokenRows rollout_rows(const RolloutRows& ro, const std::vector<int64_t>& rows);

/// Per-response-token vectors of rows `rows` placed at their columns of a [n, width] f32 tensor, 0
/// elsewhere; and back.
Tensor to_columns(const RolloutRows& ro, const std::vector<std::vector<float>>& per_token,
                  const std::vector<int64_t>& rows, int64_t width);
void from_columns(const RolloutRows& ro, const Tensor& t, const std::vector<int64_t>& rows,
                  std::vector<std::vector<float>>& per_token);

/// 1 where a target is a response token, else 0: f32 [n, W].
Tensor response_mask(const NextTokenRows& rows);

/// first, first + 1, ..., first + count - 1.
std::vector<int64_t> iota_rows(int64_t first, int64_t count);

/// The policy's per-token log-probabilities of `targets` at the sampling temperature (the
/// distribution the tokens were drawn from, as TRL scales its logits), and its hidden states.
struct PolicyForward {
  Tensor hidden, logits, logp;
};
PolicyForward policy_forward(const nn::GPT& model, const NextTokenRows& rows, double temperature);

/// Seconds since `t`, for a step's timings on its train line.
double seconds_since(std::chrono::steady_clock::time_point t);

/// What the update passes over a rollout give its train line: the losses weighted by what each
/// update's loss divided by (tokens or rows), and the micro-batches' sums added up.
struct PassTotals {
  double loss_sum = 0, units = 0;
  std::map<std::string, double> sums;
  double loss() const { return loss_sum / (units > 0 ? units : 1.0); }
};

/// `passes` passes over a rollout of `rows` rows, each a fresh shuffle (Philox stream `stream` +
/// the pass's index, at the context's step) cut into minibatches of train.batch_size x
/// train.grad_accum rows, one update each through `context`; `micro_loss` is the loss of the
/// train.batch_size rows it is handed.
PassTotals minibatch_passes(StepContext& context, const RunConfig& config, int64_t rows,
                            int64_t passes, const std::string& stream,
                            const std::function<MicroBatchLoss(const std::vector<int64_t>&)>&
                                micro_loss);

}  // namespace forge
