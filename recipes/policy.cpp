// The policy of finetune, dpo and ppo: its set-up, rules and memory estimate; its reference,
// held-out text and `forge eval --prompts`, shared by dpo and ppo.
#include "recipes/policy.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "core/autograd.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/ops.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "nn/preference.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/lora_config.h"

namespace forge {

namespace fs = std::filesystem;

// The models below are built without initial values (SkipInitScope) when a file gives them all,
// and a bf16 base is narrowed before its file is read: loading then never holds the f32 model, so
// a bf16 base's peak is its bf16 size plus one tensor of the file.

std::unique_ptr<nn::GPT> load_frozen_base(const RunConfig& config, const fs::path& base) {
  std::unique_ptr<nn::GPT> copy;
  {
    const SkipInitScope from_file;
    Generator unused(uint64_t(config.seed), rng_stream("init"));
    copy = std::make_unique<nn::GPT>(gpt_config(config.model), unused);
  }
  copy->eval();
  store_frozen(config, *copy, nn::FrozenValues::loaded_next);
  load_initial_weights(*copy, base);
  return copy;
}

Policy build_policy(const RunConfig& config, bool resuming) {
  Policy p;
  p.base = resolve_checkpoint(config.model.init_from);
  const nn::LoRAConfig lora = lora_settings(config);
  p.lora = lora.rank > 0;
  const bool from_base = p.lora || !resuming;  // else the run's own checkpoint fills it
  {
    std::optional<SkipInitScope> from_file;
    if (from_base) from_file.emplace();
    Generator init(uint64_t(config.seed), rng_stream("init"));
    p.model = std::make_unique<nn::GPT>(gpt_config(config.model), init);
  }
  p.model->set_activation_checkpointing(config.train.activation_checkpointing);
  if (!p.lora) {
    if (from_base) load_initial_weights(*p.model, p.base);
    return p;
  }
  Generator adapters(uint64_t(config.seed), rng_stream("lora"));
  nn::inject_lora(*p.model, lora, adapters);
  // The base is frozen once the trained tensors are chosen.
  if (config.model.frozen_dtype == "bf16") {
    nn::select_trainable(p.model->named_parameters(), lora_trainable_patterns(config));
    nn::keep_frozen_in_bf16(*p.model, nn::FrozenValues::loaded_next);
  }
  load_initial_weights(*p.model, p.base, {"*.lora_A", "*.lora_B"});
  return p;
}

Policy build_policy(const RunConfig& config, bool resuming, bool need_reference_copy) {
  Policy p = build_policy(config, resuming);
  std::unique_ptr<nn::GPT> copy;
  if (!p.lora && need_reference_copy) copy = load_frozen_base(config, p.base);
  p.reference = std::make_unique<ReferencePolicy>(*p.model, std::move(copy));
  return p;
}

void check_policy(ConfigChecker& checker, const std::string& starts_from) {
  check_model_family(checker);
  check_lora(checker);
  const RunConfig& c = checker.config();
  checker.cross({"model.init_from", "recipe"}, !c.model.init_from.empty(),
                "model.init_from: recipe " + c.recipe + " starts from " + starts_from +
                    "; name its run directory or checkpoint");
}

void check_policy_dropout(ConfigChecker& checker) {
  const RunConfig& c = checker.config();
  const std::string why = " runs without dropout, as TRL's: the log-probabilities it compares "
                          "must not carry dropout's noise (a reference's, where there is one, "
                          "must equal the policy's before any update); set 0";
  checker.cross({"model.dropout"}, c.model.dropout == 0.0,
                detail::concat("model.dropout: ", c.model.dropout, ": ", c.recipe, "'s policy",
                               why));
  checker.cross({"lora.dropout"}, c.get<double>("lora.dropout") == 0.0,
                detail::concat("lora.dropout: ", c.get<double>("lora.dropout"), ": ", c.recipe,
                               "'s policy (its adapters)", why));
}

std::vector<RunModel> policy_run_models(const Policy& policy, nn::Module* absent_copy) {
  std::vector<RunModel> models = {{"", policy.model.get()}};
  if (policy.lora) {
    models[0].adapters_only = true;
    models[0].source = policy.base;
    return models;
  }
  nn::Module* copy = policy.reference ? policy.reference->copy() : nullptr;
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

MemoryEstimate estimate_policy_memory(const RunConfig& config, const PolicyMemory& extra) {
  const nn::GPTConfig g = gpt_config(config.model);
  nn::check_config(g);
  const int64_t params = nn::gpt_num_parameters(g);
  const nn::LoRAConfig lora = lora_settings(config);
  int64_t total = params + extra.frozen_parameters + extra.trained_parameters;
  int64_t trained = extra.trained_parameters;
  if (lora.rank > 0) {
    total += nn::lora_parameter_count(g, lora);
    trained += lora_trainable_parameters(g, config);
  } else {
    total += extra.reference_copy ? params : 0;
    trained += params;
  }
  RunConfig rows = config;
  if (extra.rows > 0) rows.train.batch_size = extra.rows;
  if (extra.row_length > 0) rows.model.context = extra.row_length;
  return estimate_memory(rows, total, trained,
                         double(rows.train.batch_size * rows.model.context));
}

std::unique_ptr<LMWindows> held_out_text(const RunConfig& config, const std::string& text,
                                         double fraction) {
  if (text.empty()) return nullptr;
  RunConfig c = config;
  c.data.train = text;
  c.data.val.clear();
  c.data.val_fraction = fraction;
  return std::move(load_lm_splits(c).val);
}

Metric text_loss(const nn::GPT& model, const LMWindows& text, int64_t batch_size, int64_t batches,
                 bool full) {
  NoGradGuard no_grad;
  return {"text_loss", lm_eval(model, text, batch_size, batches, full).front().value};
}

std::vector<double> completion_logprobs(const nn::GPT& model,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const std::vector<nn::Completion>& completions,
                                        int64_t batch_size, double temperature) {
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
    Tensor logits = model.forward(scored.ids);
    if (temperature != 1.0) logits = mul(logits, 1.0 / temperature);
    for (float v :
         nn::sequence_logprobs(logits, scored.targets).contiguous().to_vector<float>())
      out.push_back(double(v));
  }
  return out;
}

std::vector<double> completion_rewards(const LoadedRewardModel& rm,
                                       const std::vector<std::string>& prompts,
                                       const std::vector<nn::Completion>& completions,
                                       const Tokenizer& tokenizer, int64_t batch_size) {
  std::vector<std::string> texts;
  for (const nn::Completion& c : completions) {
    const std::string& prompt = prompts[size_t(c.prompt_index)];
    texts.push_back(prompt + tokenizer.decode_continuation(tokenizer.encode(prompt),
                                                           {c.tokens.begin(), c.tokens.end()}));
  }
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
  sampling.vocab_limit = tokenizer->vocab_size();
  nn::check_sampling(sampling);
  if (sampling.temperature == 0)
    throw Error(ExitCode::usage,
                "eval: --temperature 0: --prompts reports the KL of the distribution the policy "
                "samples from, and greedy decoding has none; give a temperature above 0");
  nn::BatchOptions batch;
  batch.num_samples = o.integer("num-samples", 4);
  batch.batch_size = o.integer("batch-size", 64);
  nn::check_batch(batch);
  check_generation_memory(config.model, ids, sampling, batch, machine_memory(), "eval");
  std::optional<LoadedRewardModel> rm;
  if (o.has("reward-model")) rm = load_reward_model(resolve_checkpoint(o.text("reward-model", "")));

  NoGradGuard no_grad;
  policy.eval();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<nn::Completion> mine = nn::generate_batch(policy, ids, sampling, batch);
  const std::vector<nn::Completion> theirs = reference.with_model(
      [&](const nn::GPT& m) { return nn::generate_batch(m, ids, sampling, batch); });
  // As PPO's evaluation: the KL of the distribution the samples were drawn from (tempered, cut to
  // top-k and top-p) to the reference at the same temperature, not cut, since its own cut would
  // make the KL infinite whenever the policy draws a token outside it.
  const std::vector<double> ref_logps = reference.with_model([&](const nn::GPT& m) {
    return completion_logprobs(m, ids, mine, batch.batch_size, sampling.temperature);
  });
  double kl = 0, tokens = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    kl += mine[i].sampling_logprob - ref_logps[i];
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

int eval_policy(
    const RunConfig& config, const fs::path& checkpoint, const CommandOptions& options,
    const std::function<Metrics(nn::GPT& policy, const ReferencePolicy& reference)>& metrics) {
  // A LoRA run's checkpoint loads as its base with the adapters, which off are the reference.
  const LoadedPolicy policy = load_policy(config, checkpoint);
  Metrics m = metrics(*policy.loaded.model, *policy.reference);
  if (options.has("prompts"))
    for (Metric& metric : evaluate_policy(config, *policy.loaded.model, *policy.reference, options))
      m.push_back(std::move(metric));
  print_eval(checkpoint.string(), policy.loaded.step, m);
  return 0;
}

std::vector<std::pair<std::string, std::string>> policy_eval_options() {
  return {{"prompts",
           "FILE: sample each prompt from the policy and the reference; report the KL of the "
           "policy's sampling distribution to the reference (and rewards with --reward-model)"},
          {"num-samples", "K samples per prompt and model (default 4)"},
          {"max-new-tokens", "tokens per sample (default 96)"},
          {"temperature",
           "sampling temperature above 0 (default 1); the KL compares the policy's sampling "
           "distribution (this temperature, top-k, top-p) with the reference at this temperature"},
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
