// The rollout pieces ppo and grpo share (recipes/rollout.h): prompt files and their length checks,
// a step's prompts and seed, the sampling keys, sampling a rollout, and its rows as tensors.
#include "recipes/rollout.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <span>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/lm_data.h"
#include "data/records.h"
#include "data/sft.h"
#include "nn/preference.h"
#include "recipes/lm_objective.h"
#include "runtime/components.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

// The prompts of `file` (read by `read`) with their ids, each checked to leave room for the
// completion in every model's context (`limits`), before the first step rather than at the step
// that samples it.
Prompts read_checked(const fs::path& file, const Tokenizer& tokenizer, int64_t max_new_tokens,
                     const std::string& new_tokens_key, const PromptReader& read,
                     const std::vector<PromptLimit>& limits) {
  Prompts p = read(file);
  p.ids = encode_prompts(p.text, tokenizer);
  for (size_t i = 0; i < p.ids.size(); ++i)
    for (const PromptLimit& limit : limits) {
      const int64_t n = limit.tokenizer ? int64_t(limit.tokenizer->encode(p.text[i]).size())
                                        : int64_t(p.ids[i].size());
      if (n + max_new_tokens + limit.extra > limit.context)
        throw Error(ExitCode::data,
                    detail::concat(file.string(), ": prompt ", i + 1, " is ", n, " tokens; with ",
                                   new_tokens_key, " ", max_new_tokens, limit.extra_text,
                                   " it does not fit ", limit.model, " ", limit.context));
    }
  return p;
}

}  // namespace

PromptSplits load_prompts(const RunConfig& config, const Tokenizer& tokenizer,
                          int64_t max_new_tokens, const std::string& new_tokens_key,
                          const PromptReader& read, std::vector<PromptLimit> limits) {
  limits.insert(limits.begin(), {"model.context", config.model.context});
  PromptSplits s;
  s.train = read_checked(config.data.train, tokenizer, max_new_tokens, new_tokens_key, read, limits);
  if (!config.data.val.empty()) {
    s.val = read_checked(config.data.val, tokenizer, max_new_tokens, new_tokens_key, read, limits);
    return s;
  }
  const auto [train, val] =
      split_rows_by_fraction(int64_t(s.train.text.size()), config.data.val_fraction,
                             uint64_t(config.data.split_seed), "ppo_prompts");
  s.val = subset(s.train, val);
  s.train = subset(s.train, train);
  return s;
}

Prompts subset(const Prompts& p, const std::vector<int64_t>& rows) {
  Prompts out;
  for (int64_t r : rows) {
    out.text.push_back(p.text[size_t(r)]);
    out.ids.push_back(p.ids[size_t(r)]);
    if (!p.records.empty()) out.records.push_back(p.records[size_t(r)]);
  }
  return out;
}

std::vector<int64_t> step_prompts(int64_t n, uint64_t seed, int64_t step, int64_t count,
                                  const std::string& stream) {
  std::vector<int64_t> rows, order;
  int64_t epoch = -1;
  for (int64_t k = step * count; k < (step + 1) * count; ++k) {
    if (k / n != epoch) {
      epoch = k / n;
      order = philox_permutation(n, seed, rng_stream(stream, uint64_t(epoch)));
    }
    rows.push_back(order[size_t(k % n)]);
  }
  return rows;
}

uint64_t sampling_seed(const RunConfig& config, std::string_view purpose, int64_t step) {
  const std::array<uint32_t, 4> w =
      philox(uint64_t(config.seed), rng_stream(purpose, uint64_t(step)), 0);
  return uint64_t(w[0]) << 32 | w[1];
}

std::vector<ConfigKey> sampling_keys(const std::string& section, int64_t max_new_tokens) {
  const std::string p = section + ".";
  return {section_key(p + "generation_batch_size", integer_key(64, "[1, 65536]"),
                      "rows sampled together; the rollout does not depend on it"),
          section_key(p + "max_new_tokens", integer_key(max_new_tokens, "[1, 65536]"),
                      "tokens each completion may generate"),
          section_key(p + "temperature", number_key(1.0, "> 0"),
                      "sampling temperature; the policy's log-probabilities use "
                      "the same (as TRL)"),
          section_key(p + "top_k", integer_key(0, ">= 0"),
                      "sample among the k most likely; 0 = all"),
          section_key(p + "top_p", number_key(1.0, "(0, 1]"), "nucleus sampling; 1 = off"),
          section_key(p + "stop_text", string_key(""),
                      "a completion ends once it has generated this text (its "
                      "tokens are kept); "
                      "empty = completions run to max_new_tokens")};
}

void check_rollout(ConfigChecker& checker, int64_t max_new_tokens,
                   const std::string& new_tokens_key) {
  const RunConfig& c = checker.config();
  // Evaluation at step 0 and at the end samples held-out prompts, whatever train.eval_every.
  checker.cross({"data.val_fraction", "data.val"},
                !c.data.val.empty() || c.data.val_fraction > 0,
                "data.val_fraction: 0 and no data.val: " + c.recipe +
                    " evaluates on held-out prompts (at step 0 and at the end); name a prompt "
                    "file in data.val or hold out data.val_fraction > 0 of data.train");
  checker.cross({new_tokens_key, "model.context"}, max_new_tokens < c.model.context,
                new_tokens_key + ": completions must leave room for a prompt in model.context");
}

RolloutSampling rollout_sampling(const RunConfig& c, const std::string& section) {
  const std::string p = section + ".";
  RolloutSampling s;
  s.generation_batch_size = c.get<int64_t>(p + "generation_batch_size");
  s.sampling.max_new_tokens = c.get<int64_t>(p + "max_new_tokens");
  s.sampling.temperature = c.get<double>(p + "temperature");
  s.sampling.top_k = c.get<int64_t>(p + "top_k");
  s.sampling.top_p = c.get<double>(p + "top_p");
  s.stop_text = c.get<std::string>(p + "stop_text");
  return s;
}

std::vector<std::string> sample_rollout(const nn::GPT& policy, const Tokenizer& tokenizer,
                                        const RolloutSampling& s, const Prompts& prompts,
                                        uint64_t seed, int64_t num_samples, RolloutRows& ro) {
  NoGradGuard no_grad;
  nn::SamplingOptions sampling = s.sampling;
  sampling.seed = seed;
  sampling.vocab_limit = tokenizer.vocab_size();  // the completions are decoded for the reward
  nn::BatchOptions batch;
  batch.batch_size = s.generation_batch_size;
  batch.num_samples = num_samples;
  for (int32_t id : end_of_text_ids(tokenizer, s.stop_text)) batch.end_of_text.push_back(id);
  const std::vector<nn::Completion> completions =
      nn::generate_batch(policy, prompts.ids, sampling, batch);
  std::vector<std::string> texts;
  for (const nn::Completion& c : completions) {
    const std::vector<int64_t>& p = prompts.ids[size_t(c.prompt_index)];
    ro.tokens.emplace_back(p.begin(), p.end());
    ro.tokens.back().insert(ro.tokens.back().end(), c.tokens.begin(), c.tokens.end());
    ro.prompt_len.push_back(int64_t(p.size()));
    ro.finished.push_back(c.finished);
    texts.push_back(
        tokenizer.decode_continuation({p.begin(), p.end()}, {c.tokens.begin(), c.tokens.end()}));
  }
  return texts;
}

NextTokenRows rollout_rows(const RolloutRows& ro, const std::vector<int64_t>& rows) {
  std::vector<std::span<const int32_t>> spans;
  std::vector<int64_t> prompt_len;
  for (int64_t r : rows) {
    spans.emplace_back(ro.tokens[size_t(r)]);
    prompt_len.push_back(ro.prompt_len[size_t(r)]);
  }
  return next_token_rows(spans, prompt_len);
}

Tensor to_columns(const RolloutRows& ro, const std::vector<std::vector<float>>& per_token,
                  const std::vector<int64_t>& rows, int64_t width) {
  std::vector<float> out(size_t(int64_t(rows.size()) * width), 0.0f);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = size_t(rows[i]);
    const int64_t first = ro.prompt_len[r] - 1;
    std::copy(per_token[r].begin(), per_token[r].end(),
              out.begin() + long(int64_t(i) * width + first));
  }
  return from_vector(out, {int64_t(rows.size()), width});
}

void from_columns(const RolloutRows& ro, const Tensor& t, const std::vector<int64_t>& rows,
                  std::vector<std::vector<float>>& per_token) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  const int64_t width = t.size(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t r = size_t(rows[i]);
    const auto first = v.begin() + long(int64_t(i) * width + ro.prompt_len[r] - 1);
    per_token[r].assign(first, first + long(ro.response_tokens(int64_t(r))));
  }
}

Tensor response_mask(const NextTokenRows& rows) {
  std::vector<float> mask;
  for (int64_t t : rows.targets.contiguous().to_vector<int64_t>())
    mask.push_back(t == LMWindows::kIgnoreTarget ? 0.0f : 1.0f);
  return from_vector(mask, rows.targets.shape());
}

std::vector<int64_t> iota_rows(int64_t first, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  std::iota(rows.begin(), rows.end(), first);
  return rows;
}

PolicyForward policy_forward(const nn::GPT& model, const NextTokenRows& rows, double temperature) {
  PolicyForward f;
  f.hidden = model.forward(rows.ids, nn::GPTOutput::hidden);
  f.logits = model.head(f.hidden);
  if (temperature != 1.0) f.logits = mul(f.logits, 1.0 / temperature);
  f.logp = nn::token_logprobs(f.logits, rows.targets);
  return f;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

PassTotals minibatch_passes(StepContext& context, const RunConfig& config, int64_t rows,
                            int64_t passes, const std::string& stream,
                            const std::function<MicroBatchLoss(const std::vector<int64_t>&)>&
                                micro_loss) {
  const int64_t B = config.train.batch_size;
  const int64_t minibatch = B * config.train.grad_accum;
  PassTotals totals;
  for (int64_t pass = 0; pass < passes; ++pass) {
    const std::vector<int64_t> order =
        philox_permutation(rows, uint64_t(config.seed),
                           rng_stream(stream + std::to_string(pass), uint64_t(context.step())));
    for (int64_t first = 0; first < rows; first += minibatch) {
      const UpdateResult r =
          context.accumulate_and_update(config.train.grad_accum, [&](int64_t micro) {
            const auto begin = order.begin() + long(first + micro * B);
            return micro_loss(std::vector<int64_t>(begin, begin + long(B)));
          });
      totals.loss_sum += r.accumulated.loss * double(r.accumulated.num_targets);
      totals.units += double(r.accumulated.num_targets);
      for (const auto& [key, value] : r.accumulated.sums) totals.sums[key] += value;
    }
  }
  return totals;
}

}  // namespace forge
