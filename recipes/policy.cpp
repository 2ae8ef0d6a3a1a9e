// The policy and its reference, held-out text and `forge eval --prompts`, shared by dpo and ppo.
#include "recipes/policy.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/autograd.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "nn/preference.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/lora_config.h"

namespace forge {

namespace fs = std::filesystem;

std::unique_ptr<nn::GPT> load_frozen_base(const RunConfig& config, const fs::path& base) {
  Generator unused(uint64_t(config.seed), rng_stream("init"));
  auto copy = std::make_unique<nn::GPT>(gpt_config(config.model), unused);
  load_initial_weights(*copy, base);
  copy->eval();
  return copy;
}

Policy build_policy(const RunConfig& config, bool resuming, bool need_reference_copy) {
  Policy p;
  p.base = resolve_checkpoint(config.model.init_from);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  p.model = std::make_unique<nn::GPT>(gpt_config(config.model), init);
  p.model->set_activation_checkpointing(config.train.activation_checkpointing);
  const nn::LoRAConfig lora = lora_settings(config);
  p.lora = lora.rank > 0;
  if (p.lora || !resuming) load_initial_weights(*p.model, p.base);
  std::unique_ptr<nn::GPT> copy;
  if (p.lora) {
    Generator adapters(uint64_t(config.seed), rng_stream("lora"));
    nn::inject_lora(*p.model, lora, adapters);
  } else if (need_reference_copy) {
    copy = load_frozen_base(config, p.base);
  }
  p.reference = std::make_unique<ReferencePolicy>(*p.model, std::move(copy));
  return p;
}

std::vector<RunModel> policy_run_models(const Policy& policy, nn::Module* absent_copy) {
  std::vector<RunModel> models = {{"", policy.model.get()}};
  if (policy.lora) {
    models[0].adapters_only = true;
    models[0].source = policy.base;
    return models;
  }
  nn::Module* copy = policy.reference->copy();
  if (!copy) copy = absent_copy;
  if (copy) models.push_back({"reference", copy, false, false, policy.base});
  return models;
}

LoadedPolicy load_policy(const RunConfig& config, const fs::path& checkpoint) {
  LoadedPolicy p{load_gpt(checkpoint), nullptr};
  std::unique_ptr<nn::GPT> copy;
  if (lora_settings(config).rank == 0)
    copy = load_frozen_base(config, resolve_checkpoint(config.model.init_from));
  p.reference = std::make_unique<ReferencePolicy>(*p.loaded.model, std::move(copy));
  return p;
}

NamedTensors policy_trained_parameters(const RunConfig& config, const Policy& policy) {
  if (!policy.lora) return policy.model->named_parameters();
  return nn::select_trainable(policy.model->named_parameters(), lora_trainable_patterns(config));
}

std::unique_ptr<LMWindows> held_out_text(const RunConfig& config, const std::string& text_key,
                                         const std::string& fraction_key) {
  const std::string text = config.get<std::string>(text_key);
  if (text.empty()) return nullptr;
  RunConfig c = config;
  c.data.train = text;
  c.data.val.clear();
  c.data.val_fraction = config.get<double>(fraction_key);
  return std::move(load_lm_splits(c).val);
}

std::vector<double> completion_logprobs(const nn::GPT& model,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<nn::Completion>& completions,
                                        int64_t batch_size) {
  NoGradGuard no_grad;
  std::vector<double> out;
  for (size_t first = 0; first < completions.size(); first += size_t(batch_size)) {
    std::vector<std::vector<int32_t>> rows;
    std::vector<int64_t> prompt_len;
    for (size_t i = first; i < std::min(completions.size(), first + size_t(batch_size)); ++i) {
      const nn::Completion& c = completions[i];
      const std::vector<int64_t>& p = prompts[size_t(c.prompt_index)];
      rows.emplace_back(p.begin(), p.end());
      rows.back().insert(rows.back().end(), c.tokens.begin(), c.tokens.end());
      prompt_len.push_back(int64_t(p.size()));
    }
    std::vector<std::span<const int32_t>> spans(rows.begin(), rows.end());
    const NextTokenRows scored = next_token_rows(spans, prompt_len);
    for (float v : nn::sequence_logprobs(model.forward(scored.ids), scored.targets)
                       .contiguous()
                       .to_vector<float>())
      out.push_back(double(v));
  }
  return out;
}

std::vector<double> completion_rewards(const LoadedRewardModel& rm,
                                       const std::vector<std::string>& prompts,
                                       const std::vector<nn::Completion>& completions,
                                       const Tokenizer& tokenizer, int64_t batch_size) {
  std::vector<std::string> texts;
  for (const nn::Completion& c : completions)
    texts.push_back(prompts[size_t(c.prompt_index)] +
                    tokenizer.decode({c.tokens.begin(), c.tokens.end()}));
  return score_texts(rm, texts, batch_size, [&](size_t i) {
    return detail::concat("sample ", completions[i].sample_index, " of prompt ",
                          completions[i].prompt_index);
  });
}

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

}  // namespace

Metrics evaluate_policy(const RunConfig& config, nn::GPT& policy, const ReferencePolicy& reference,
                        const CommandOptions& o) {
  const std::vector<std::string> prompts =
      read_texts(o.text("prompts", ""), {"prompt", "a prompt record", {"prompt"}}, "prompt");
  const fs::path output = o.text("output", "");
  if (!output.empty() && !fs::is_directory(output))
    throw Error(ExitCode::usage,
                "eval: --output " + quoted_path(output.string()) + ": not a directory");
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  const std::vector<std::vector<int64_t>> ids = encode_prompts(prompts, *tokenizer);
  nn::SamplingOptions sampling;
  sampling.max_new_tokens = o.integer("max-new-tokens", 96);
  sampling.temperature = o.number("temperature", 1.0);
  sampling.top_k = o.integer("top-k", 0);
  sampling.top_p = o.number("top-p", 1.0);
  sampling.seed = uint64_t(o.integer("seed", 0));
  nn::check_sampling(sampling);
  nn::BatchOptions batch;
  batch.num_samples = o.integer("num-samples", 4);
  batch.batch_size = o.integer("batch-size", 64);
  nn::check_batch(batch);
  std::optional<LoadedRewardModel> rm;
  if (o.has("reward-model")) rm = load_reward_model(resolve_checkpoint(o.text("reward-model", "")));

  NoGradGuard no_grad;
  policy.eval();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<nn::Completion> mine = nn::generate_batch(policy, ids, sampling, batch);
  const std::vector<nn::Completion> theirs = reference.with_model(
      [&](const nn::GPT& m) { return nn::generate_batch(m, ids, sampling, batch); });
  const std::vector<double> ref_logps = reference.with_model(
      [&](const nn::GPT& m) { return completion_logprobs(m, ids, mine, batch.batch_size); });
  double kl = 0, tokens = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    kl += mine[i].logprob - ref_logps[i];
    tokens += double(mine[i].tokens.size());
  }
  Metrics m = {{"samples", double(mine.size())},
               {"kl_per_token", kl / std::max(1.0, tokens)},
               {"kl_per_sample", kl / std::max<double>(1.0, double(mine.size()))},
               {"sample_tokens", tokens / std::max<double>(1.0, double(mine.size()))}};
  if (rm) {
    const std::vector<double> a =
        completion_rewards(*rm, prompts, mine, *tokenizer, batch.batch_size);
    const std::vector<double> b =
        completion_rewards(*rm, prompts, theirs, *tokenizer, batch.batch_size);
    double wins = 0;
    for (size_t i = 0; i < a.size(); ++i) wins += a[i] > b[i] ? 1.0 : a[i] == b[i] ? 0.5 : 0.0;
    m.push_back({"policy_reward", mean(a)});
    m.push_back({"reference_reward", mean(b)});
    m.push_back({"reward_win_rate", wins / std::max<double>(1.0, double(a.size()))});
  }
  if (!output.empty()) {
    write_file_atomic(output / "policy.jsonl", completion_records(prompts, mine, *tokenizer),
                      ExitCode::usage);
    write_file_atomic(output / "reference.jsonl", completion_records(prompts, theirs, *tokenizer),
                      ExitCode::usage);
  }
  std::fprintf(stderr, "eval: %zu samples from each model in %.1f s\n", mine.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return m;
}

std::vector<std::pair<std::string, std::string>> policy_eval_options() {
  return {{"prompts",
           "FILE: sample each prompt from the policy and the reference; report "
           "their KL (and rewards with --reward-model)"},
          {"num-samples", "K samples per prompt and model (default 4)"},
          {"max-new-tokens", "tokens per sample (default 96)"},
          {"temperature", "sampling temperature (default 1: the KL estimate needs 1)"},
          {"top-k", "default 0 (all tokens)"},
          {"top-p", "default 1 (off)"},
          {"seed", "sampling seed (default 0); both models draw the same numbers"},
          {"batch-size", "rows decoded together (default 64)"},
          {"reward-model", "RUN: a reward_model run that scores both models' samples"},
          {"output",
           "DIR: write policy.jsonl and reference.jsonl there (forge generate's "
           "records)"}};
}

}  // namespace forge
