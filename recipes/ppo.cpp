// ppo, top to bottom: the ppo: section; the prompts; the value function (a model initialised from
// the reward model, or a head on the policy); one step = a rollout (generate_batch with the step's
// seed), its scoring (policy, reference, values, reward model: no gradient), rewards with the KL
// penalty, GAE and whitening (nn/ppo.h), then ppo_epochs passes of shuffled minibatch updates
// through StepContext; the adaptive KL controller; evaluation on held-out prompts; `forge eval`.
// docs/recipes/ppo.md describes the loop and every key.
#include "recipes/ppo.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>

#include "core/error.h"
#include "core/ops.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "data/records.h"
#include "data/sft.h"
#include "nn/classifier.h"
#include "nn/generate.h"
#include "nn/moe.h"
#include "nn/ppo.h"
#include "nn/preference.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/lora_config.h"
#include "recipes/policy.h"
#include "recipes/reward_model.h"
#include "recipes/rollout.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The ppo: section with the nn option structs its rollout and KL keys make.
struct PPOSettings : PPOSection {
  nn::SamplingOptions sampling;  // without the seed, which is the step's
  nn::KLControllerOptions kl;
  bool shared_value() const { return value == Value::shared; }
};

PPOSettings ppo_settings(const RunConfig& c) {
  PPOSettings s;
  static_cast<PPOSection&>(s) = ppo_section_settings(c);
  s.sampling.max_new_tokens = s.max_new_tokens;
  s.sampling.temperature = s.temperature;
  s.sampling.top_k = s.top_k;
  s.sampling.top_p = s.top_p;
  s.kl.init_kl_coef = s.kl_coef;
  s.kl.adaptive = s.adaptive_kl;
  s.kl.target = s.target_kl;
  s.kl.horizon = s.kl_horizon;
  return s;
}

// ---- prompts ------------------------------------------------------------------------------------

// The reward model's and the separate value model's limits. The reward model scores prompt +
// completion re-tokenized with its tokenizer and its preference.end_of_text after them (counted as
// the prompt's tokens + max_new_tokens: exact for byte tokenizers and for the policy's own one up
// to merges across the seam); the value model reads the policy's rows, less their last token.
std::vector<PromptLimit> reward_limits(const LoadedRewardModel& reward,
                                       const Tokenizer& reward_tokenizer, bool separate_value) {
  const int64_t context = reward.config.model.context;
  const int64_t eot =
      int64_t(end_of_text_ids(reward_tokenizer,
                              reward.config.get<std::string>("preference.end_of_text"))
                  .size());
  std::vector<PromptLimit> limits;
  if (separate_value) limits.push_back({"the value model's context", context, -1});
  limits.push_back({"the reward model's context", context, eot, &reward_tokenizer,
                    detail::concat(" and the reward model's preference.end_of_text (", eot,
                                   eot == 1 ? " token)" : " tokens)")});
  return limits;
}

// data.train's and data.val's prompts (JSONL {"prompt"} records or one a line), each fitting the
// policy's context and `limits`.
PromptSplits load_ppo_prompts(const RunConfig& config, const Tokenizer& tokenizer,
                              std::vector<PromptLimit> limits = {}) {
  const auto read = [](const fs::path& file) {
    Prompts p;
    p.text = read_texts(file, {"prompt", "a prompt record", {"prompt"}}, "prompt");
    return p;
  };
  return load_prompts(config, tokenizer, ppo_section_settings(config).max_new_tokens,
                      "ppo.max_new_tokens", read, std::move(limits));
}

// ---- the value function -------------------------------------------------------------------------

// V(s_t) for every position: a separate model, the reward model's backbone with a fresh head
// (InstructGPT), or a head on the policy's final hidden state (ppo.value: shared). The fresh head
// is zero, so the values start at 0 and the first updates fit the head before they move the rest.
// The value model trains in train mode, so it is built without the reward model's dropout: the
// updates must see the values the rollout saw (TRL disables dropout in every model too).
struct Critic {
  std::unique_ptr<nn::GPTRewardModel> model;
  std::unique_ptr<nn::Linear> head;

  nn::Module& module() const { return model ? static_cast<nn::Module&>(*model) : *head; }
  /// values [B, L] of `ids`; `policy_hidden` [B, L, C] is the policy's, for the shared head.
  Tensor values(const Tensor& ids, const Tensor& policy_hidden) const {
    if (model) return model->values(ids);
    return reshape(head->forward(policy_hidden), {ids.size(0), ids.size(1)});
  }
};

Critic build_critic(const PPOSettings& s, const nn::GPT& policy, const LoadedRewardModel& reward,
                    const fs::path& reward_file) {
  Critic c;
  NoGradGuard no_grad;
  if (s.shared_value()) {
    Generator unused(0, rng_stream("value_head"));
    c.head = std::make_unique<nn::Linear>(policy.config().d_model, 1, false, unused);
    c.head->weight.zero_();
  } else {
    if (reward.config.model.dropout > 0)
      std::fprintf(stderr,
                   "forge: warning: %s: the value model from ppo.reward_model runs without its "
                   "stored model.dropout %g (PPO's updates must reproduce the rollout's values)\n",
                   printable(reward_file.string()).c_str(), reward.config.model.dropout);
    c.model = std::move(load_reward_model(reward_file, false).model);
    c.model->score->weight.zero_();
  }
  return c;
}

// ---- rollouts -----------------------------------------------------------------------------------

// One rollout: per row the prompt + completion tokens and, per response token j (the position
// prompt_len - 1 + j of next_token_rows' layout predicts it), the quantities PPO needs.
struct Rollout : RolloutRows {
  std::vector<std::vector<float>> logp, ref_logp, values, advantages, returns;
  std::vector<double> scores;  // the reward model's, with the missing-EOS penalty
};

// The models a PPO step reads.
struct PPOModels {
  nn::GPT& policy;
  const ReferencePolicy& reference;
  const LoadedRewardModel& reward;
  const Critic& critic;
  const Tokenizer& tokenizer;
};

// Rollout statistics for the train line.
struct RolloutStats {
  double entropy_sum = 0, tokens = 0;
};

// Samples the prompts, then scores every row without gradient in batches of `batch_size`: the
// policy's and the reference's log-probabilities, the values, the reward model's score. A stop
// request does not cut the rollout short: the checkpoint it leads to is written at the end of the
// step, which must be whole (a rollout takes about a second).
Rollout collect_rollout(const PPOModels& m, const PPOSettings& s, const Prompts& prompts,
                        uint64_t seed, int64_t batch_size, RolloutStats& stats, double& t_generate,
                        double& t_score) {
  NoGradGuard no_grad;
  const auto t0 = Clock::now();
  const bool training = m.policy.is_training();
  m.policy.eval();
  Rollout ro;
  std::vector<std::string> texts =
      sample_rollout(m.policy, m.tokenizer, {s.sampling, s.generation_batch_size, s.stop_text},
                     prompts, seed, 1, ro);
  t_generate = seconds_since(t0);

  const auto t1 = Clock::now();
  for (size_t i = 0; i < texts.size(); ++i) texts[i] = prompts.text[i] + texts[i];
  const size_t n = ro.tokens.size();
  for (auto* v : {&ro.logp, &ro.ref_logp, &ro.values, &ro.advantages, &ro.returns}) v->resize(n);
  for (int64_t first = 0; first < int64_t(n); first += batch_size) {
    const std::vector<int64_t> rows = iota_rows(first, std::min(batch_size, int64_t(n) - first));
    const NextTokenRows batch_rows = rollout_rows(ro, rows);
    const Tensor mask = response_mask(batch_rows);
    const PolicyForward f = policy_forward(m.policy, batch_rows, s.sampling.temperature);
    from_columns(ro, f.logp, rows, ro.logp);
    const double tokens = sum(mask).item();
    stats.entropy_sum += nn::entropy_from_logits(f.logits, mask).item() * tokens;
    stats.tokens += tokens;
    from_columns(ro, m.reference.with_model([&](const nn::GPT& ref) {
      return policy_forward(ref, batch_rows, s.sampling.temperature).logp;
    }),
                 rows, ro.ref_logp);
    from_columns(ro, m.critic.values(batch_rows.ids, f.hidden), rows, ro.values);
  }
  m.policy.train(training);
  ro.scores = score_texts(m.reward, texts, batch_size, [&](size_t i) {
    return detail::concat("the completion of rollout row ", i);
  });
  for (size_t i = 0; i < n; ++i)
    if (!ro.finished[i] && !s.stop_text.empty()) ro.scores[i] -= s.missing_eos_penalty;
  t_score = seconds_since(t1);
  return ro;
}

// What the rewards, GAE and whitening give a rollout, besides the advantages and returns they store
// in it.
struct Returns {
  double kl_sum = 0, kl_tokens = 0, score_sum = 0, reward_sum = 0, reward_sq = 0, score_sq = 0;
  double explained_variance = 0;
};

// The population variance of every response token's value of `x`, or of x - y.
double variance(const std::vector<std::vector<float>>& x,
                const std::vector<std::vector<float>>* y = nullptr) {
  double s = 0, sq = 0, n = 0;
  for (size_t r = 0; r < x.size(); ++r)
    for (size_t j = 0; j < x[r].size(); ++j) {
      const double v = double(x[r][j]) - (y ? double((*y)[r][j]) : 0.0);
      s += v;
      sq += v * v;
      n += 1;
    }
  return n > 0 ? std::max(0.0, sq / n - (s / n) * (s / n)) : 0.0;
}

Returns compute_advantages(Rollout& ro, const PPOSettings& s, double kl_coef) {
  NoGradGuard no_grad;
  const std::vector<int64_t> rows = iota_rows(0, ro.size());
  const NextTokenRows all = rollout_rows(ro, rows);
  const int64_t width = all.targets.size(1);
  const Tensor mask = response_mask(all);
  const Tensor logp = to_columns(ro, ro.logp, rows, width);
  const Tensor ref = to_columns(ro, ro.ref_logp, rows, width);
  const Tensor values = to_columns(ro, ro.values, rows, width);
  const nn::PPORewards r = nn::per_token_rewards(
      logp, ref, from_vector(ro.scores, {ro.size()}, DType::f32), mask, kl_coef);
  const Tensor rewards = s.whiten_rewards ? nn::whiten(r.rewards, mask, false) : r.rewards;
  const nn::PPOAdvantages a = nn::gae(rewards, values, mask, s.gamma, s.lam);
  from_columns(ro, nn::whiten(a.advantages, mask), rows, ro.advantages);
  from_columns(ro, a.returns, rows, ro.returns);

  Returns out;
  const std::vector<float> kl_rows = sum(r.kl, {1}).contiguous().to_vector<float>();
  for (int64_t i = 0; i < ro.size(); ++i) {
    const double kl = double(kl_rows[size_t(i)]), score = ro.scores[size_t(i)];
    const double reward = score - kl_coef * kl;
    out.kl_sum += kl;
    out.score_sum += score;
    out.score_sq += score * score;
    out.reward_sum += reward;
    out.reward_sq += reward * reward;
  }
  const double n = sum(mask).item();
  out.kl_tokens = n;
  const double var_returns = variance(ro.returns);
  out.explained_variance =
      var_returns > 0 ? 1.0 - variance(ro.returns, &ro.values) / var_returns : 0.0;
  return out;
}

// The PPO loss of rollout rows `rows` summed over their response tokens (with graph), and the
// statistics as token-weighted sums.
MicroBatchLoss ppo_micro_loss(const PPOModels& m, const PPOSettings& s, const Rollout& ro,
                              const std::vector<int64_t>& rows) {
  const NextTokenRows batch = rollout_rows(ro, rows);
  const int64_t width = batch.targets.size(1);
  const Tensor mask = response_mask(batch);
  const PolicyForward f = policy_forward(m.policy, batch, s.sampling.temperature);
  const nn::PPOPolicyLoss pg =
      nn::ppo_policy_loss(f.logp, to_columns(ro, ro.logp, rows, width),
                          to_columns(ro, ro.advantages, rows, width), mask, s.clip_range);
  const nn::PPOValueLoss vf = nn::ppo_value_loss(
      m.critic.values(batch.ids, f.hidden), to_columns(ro, ro.values, rows, width),
      to_columns(ro, ro.returns, rows, width), mask, s.clip_range_value);
  Tensor loss = pg.loss + mul(vf.loss, s.vf_coef);
  if (s.entropy_coef > 0)
    loss = loss - mul(nn::entropy_from_logits(f.logits, mask), s.entropy_coef);
  int64_t tokens = 0;
  for (int64_t r : rows) tokens += ro.response_tokens(r);
  const double n = double(tokens);
  MicroBatchLoss out{mul(loss, n), tokens};
  out.sums = {{"policy_loss", pg.loss.item() * n}, {"value_loss", vf.loss.item() * n},
              {"clip_frac", pg.clip_frac * n},     {"approx_kl", pg.approx_kl * n},
              {"ratio", pg.ratio_mean * n},        {"value_clip_frac", vf.clip_frac * n}};
  return out;
}

// ---- evaluation ---------------------------------------------------------------------------------

// Held-out prompts sampled once each, by the policy and by the reference with the same draws (the
// reference's scores are computed once per prompt count: it never changes).
class Evaluator {
 public:
  Evaluator(const RunConfig& config, const PPOSettings& s, const Prompts& prompts,
            std::unique_ptr<LMWindows> text)
      : config_(config), s_(s), prompts_(prompts), text_(std::move(text)) {}

  Metrics evaluate(const PPOModels& m, int64_t prompts, double kl_coef) {
    NoGradGuard no_grad;
    const int64_t n = prompts > 0 ? std::min<int64_t>(prompts, int64_t(prompts_.ids.size()))
                                  : int64_t(prompts_.ids.size());
    const Prompts p = subset(prompts_, iota_rows(0, n));
    nn::SamplingOptions sampling = s_.sampling;
    sampling.seed = sampling_seed(config_, "ppo_eval", 0);
    sampling.stop = stop_requested;
    sampling.vocab_limit = m.tokenizer.vocab_size();
    nn::BatchOptions batch;
    batch.batch_size = s_.generation_batch_size;
    for (int32_t id : end_of_text_ids(m.tokenizer, s_.stop_text)) batch.end_of_text.push_back(id);
    const std::vector<nn::Completion> mine = nn::generate_batch(m.policy, p.ids, sampling, batch);
    if (stop_requested()) return {};
    const int64_t B = config_.train.batch_size;
    if (!reference_scores_.count(n)) {
      const std::vector<nn::Completion> theirs = m.reference.with_model(
          [&](const nn::GPT& ref) { return nn::generate_batch(ref, p.ids, sampling, batch); });
      if (stop_requested()) return {};
      reference_scores_[n] = completion_rewards(m.reward, p.text, theirs, m.tokenizer, B);
    }
    const std::vector<double>& theirs = reference_scores_[n];
    const std::vector<double> scores = completion_rewards(m.reward, p.text, mine, m.tokenizer, B);
    // The KL of the distribution the samples were drawn from (the policy's at ppo.temperature,
    // top_k and top_p) to the reference at the same temperature. The reference is not truncated:
    // its own top-k/top-p would make the KL infinite as soon as the policy draws a token outside
    // them, the common case once it has learned.
    const std::vector<double> ref_logp = m.reference.with_model([&](const nn::GPT& ref) {
      return completion_logprobs(ref, p.ids, mine, B, s_.sampling.temperature);
    });
    double kl = 0, tokens = 0, score = 0, ref_score = 0, wins = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      kl += mine[i].sampling_logprob - ref_logp[i];
      tokens += double(mine[i].tokens.size());
      score += scores[i];
      ref_score += theirs[i];
      wins += scores[i] > theirs[i] ? 1.0 : scores[i] == theirs[i] ? 0.5 : 0.0;
    }
    const double count = double(mine.size());
    // The loss is what PPO maximises, negated: the score less the KL penalty, per sample.
    Metrics out = {{"loss", -(score - kl_coef * kl) / count},
                   {"score", score / count},
                   {"reference_score", ref_score / count},
                   {"reward_win_rate", wins / count},
                   {"kl", kl / count},
                   {"kl_per_token", kl / std::max(1.0, tokens)},
                   {"response_length", tokens / count}};
    if (text_ && !stop_requested())
      out.push_back(
          {"text_loss", lm_eval(m.policy, *text_, B, config_.train.eval_batches, prompts == 0)
                            .front()
                            .value.as_double()});
    return out;
  }

 private:
  const RunConfig& config_;
  const PPOSettings& s_;
  const Prompts& prompts_;
  std::unique_ptr<LMWindows> text_;
  std::map<int64_t, std::vector<double>> reference_scores_;
};

// Held-out prompts an evaluation samples: all for the final one, else eval_batches x batch_size.
int64_t eval_prompts(const RunConfig& config, bool full) {
  return full ? 0 : config.train.eval_batches * config.train.batch_size;
}

// ---- training -----------------------------------------------------------------------------------

const char* const kKLCoefCounter = "ppo.kl_coef_bits";

int train_ppo(const RunConfig& config) {
  const PPOSettings s = ppo_settings(config);
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  const fs::path rm_file = resolve_checkpoint(s.reward_model);
  const LoadedRewardModel reward = load_reward_model(rm_file);
  store_frozen(config, *reward.model);
  const std::unique_ptr<Tokenizer> reward_tokenizer =
      make_tokenizer(reward.config.data.tokenizer, reward.config.data.special_tokens);
  const PromptSplits prompts =
      load_ppo_prompts(config, *tokenizer, reward_limits(reward, *reward_tokenizer, !s.shared_value()));

  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  Policy policy = build_policy(config, resuming, true);
  nn::GPT& model = *policy.model;
  const Critic critic = build_critic(s, model, reward, rm_file);
  // MoE layers route each token alone (no noise, no capacity) in the rollout and the updates
  // alike, so the updates' log-probabilities and values start equal to the rollout's.
  const nn::DeterministicRouting policy_routing(model), value_routing(critic.module());
  NamedTensors trained = policy_trained_parameters(config, policy);
  for (const NamedTensor& t : critic.module().named_parameters())
    trained.push_back({"value." + t.name, t.tensor});
  // One optimizer over the policy and the value function, as TRL's PPOTrainer: one backward of
  // pg_loss + vf_coef * vf_loss and one clipping of their joint gradient norm.
  std::unique_ptr<optim::Optimizer> optimizer =
      build_optimizer(config, trained, lora_lr_scale(config));

  std::vector<RunModel> models = policy_run_models(policy);
  models.push_back({"value", &critic.module()});
  models.push_back({"reward", reward.model.get(), false, false, rm_file});

  const PPOModels m{model, *policy.reference, reward, critic, *tokenizer};
  nn::KLController kl(s.kl);
  Evaluator evaluator(config, s, prompts.val,
                      held_out_text(config, s.eval_text, s.eval_text_fraction));
  const int64_t B = config.train.batch_size;

  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step = s.rollout_batch * s.sampling.max_new_tokens;
  // A step is one rollout, so its outcome's "sums" already hold the step's statistics (token means
  // of the updates, rollout means); train_metrics only puts them in order.
  recipe.custom_step = [&](StepContext& context) -> StepOutcome {
    const int64_t step = context.step();
    RolloutStats rs;
    double t_generate = 0, t_score = 0;
    const Prompts batch_prompts =
        subset(prompts.train, step_prompts(int64_t(prompts.train.ids.size()), uint64_t(config.seed),
                                           step, s.rollout_batch, "ppo_prompts"));
    Rollout ro = collect_rollout(m, s, batch_prompts, sampling_seed(config, "ppo_rollout", step), B,
                                 rs, t_generate, t_score);
    const double kl_coef = kl.value();
    const Returns ret = compute_advantages(ro, s, kl_coef);

    const auto t_update = Clock::now();
    const PassTotals passes = minibatch_passes(
        context, config, ro.size(), s.ppo_epochs, "ppo_minibatch_",
        [&](const std::vector<int64_t>& rows) { return ppo_micro_loss(m, s, ro, rows); });
    std::map<std::string, double> sums = passes.sums;
    const double tokens_sum = passes.units;
    for (auto& [key, value] : sums) value /= std::max(1.0, tokens_sum);
    const double P = double(ro.size());
    const double score_mean = ret.score_sum / P, reward_mean = ret.reward_sum / P;
    sums["score"] = score_mean;
    sums["score_std"] = std::sqrt(std::max(0.0, ret.score_sq / P - score_mean * score_mean));
    sums["reward"] = reward_mean;
    sums["reward_std"] = std::sqrt(std::max(0.0, ret.reward_sq / P - reward_mean * reward_mean));
    sums["kl"] = ret.kl_sum / P;
    sums["kl_per_token"] = ret.kl_sum / std::max(1.0, ret.kl_tokens);
    sums["kl_coef"] = kl_coef;
    sums["entropy"] = rs.entropy_sum / std::max(1.0, rs.tokens);
    sums["explained_variance"] = ret.explained_variance;
    sums["response_length"] = ret.kl_tokens / P;
    sums["time_rollout_s"] = t_generate;
    sums["time_score_s"] = t_score;
    sums["time_update_s"] = seconds_since(t_update);
    kl.update(ret.kl_sum / P, ro.size());
    return {passes.loss(), std::move(sums)};
  };
  recipe.train_metrics = [](const std::map<std::string, double>& sums) {
    Metrics out;
    for (const char* key : {"score", "score_std", "reward", "reward_std", "kl", "kl_per_token",
                            "kl_coef", "entropy", "policy_loss", "value_loss", "clip_frac",
                            "approx_kl", "ratio", "value_clip_frac", "explained_variance",
                            "response_length", "time_rollout_s", "time_score_s", "time_update_s"})
      if (sums.count(key)) out.push_back({key, sums.at(key)});
    return out;
  };
  recipe.evaluate = [&](bool full) {
    return evaluator.evaluate(m, eval_prompts(config, full), s.kl.init_kl_coef);
  };
  recipe.data_state = [&] {
    return DataState{{kKLCoefCounter, std::bit_cast<int64_t>(kl.value())}};
  };
  recipe.restore_data_state = [&](const DataState& state) {
    const auto it = state.find(kKLCoefCounter);
    if (it == state.end())
      throw Error(ExitCode::checkpoint,
                  detail::concat("the checkpoint has no counter '", kKLCoefCounter,
                                 "' (the KL controller's coefficient): not a ppo checkpoint"));
    kl.restore(std::bit_cast<double>(it->second));
  };
  recipe.sample = [&] {
    const std::string prompt = prompts.val.text.empty() ? std::string("\n") : prompts.val.text[0];
    return sample_text(model, *tokenizer, prompt, config);
  };
  return run_training(config, models, *optimizer, recipe);
}

// ---- forge eval ---------------------------------------------------------------------------------

int eval_ppo(const RunConfig& config, const fs::path& checkpoint, const CommandOptions& options) {
  const PPOSettings s = ppo_settings(config);
  return eval_policy(config, checkpoint, options, [&](nn::GPT& policy, const ReferencePolicy& ref) {
    std::unique_ptr<Tokenizer> tokenizer =
        make_tokenizer(config.data.tokenizer, config.data.special_tokens);
    const PromptSplits prompts = load_ppo_prompts(config, *tokenizer);
    const LoadedRewardModel reward = load_reward_model(resolve_checkpoint(s.reward_model));
    const Critic no_critic;
    const PPOModels m{policy, ref, reward, no_critic, *tokenizer};
    Evaluator evaluator(config, s, prompts.val,
                        held_out_text(config, s.eval_text, s.eval_text_fraction));
    return evaluator.evaluate(m, 0, s.kl.init_kl_coef);
  });
}

MemoryEstimate estimate_ppo(const RunConfig& config) {
  // The reward model's size (and the separate value model's, its copy) from its stored config. The
  // loader has found the checkpoint; one that does not read stops validate as it would train.
  const PPOSettings s = ppo_settings(config);
  const RunConfig rm = stored_config(resolve_checkpoint(s.reward_model));
  const int64_t reward = nn::gpt_backbone_parameters(gpt_config(rm.model)) + rm.model.d_model;
  return estimate_policy_memory(
      config, {.reference_copy = true,
               .frozen_parameters = reward,
               .trained_parameters = s.shared_value() ? config.model.d_model : reward,
               .rows = std::max(config.train.batch_size, s.generation_batch_size)});
}

void check_ppo(ConfigChecker& checker) {
  check_policy(checker, "a trained policy (also its reference)");
  check_policy_dropout(checker);
  const RunConfig& c = checker.config();
  const PPOSection p = ppo_section_settings(c);
  checker.cross({"ppo.reward_model"}, !p.reward_model.empty(),
                "ppo.reward_model: name the reward_model run (or checkpoint) "
                "that scores the "
                "rollouts");
  const int64_t minibatch = c.train.batch_size * c.train.grad_accum;
  const int64_t rollout = p.rollout_batch;
  checker.cross({"ppo.rollout_batch", "train.batch_size", "train.grad_accum"},
                rollout % minibatch == 0,
                detail::concat("ppo.rollout_batch: ", rollout,
                               " rows must split into minibatches of train.batch_size x "
                               "train.grad_accum = ",
                               minibatch, " rows"));
  check_rollout(checker, p.max_new_tokens, "ppo.max_new_tokens");
  checker.cross(
      {"ppo.missing_eos_penalty", "ppo.stop_text"},
      p.missing_eos_penalty == 0 || !p.stop_text.empty(),
      "ppo.missing_eos_penalty: a completion can only miss "
      "ppo.stop_text when it is set");
}

}  // namespace

PPOSection ppo_section_settings(const RunConfig& c) {
  PPOSection p;
  p.reward_model = c.get<std::string>("ppo.reward_model");
  p.value = c.get<std::string>("ppo.value") == "shared" ? PPOSection::Value::shared
                                                         : PPOSection::Value::separate;
  p.rollout_batch = c.get<int64_t>("ppo.rollout_batch");
  p.ppo_epochs = c.get<int64_t>("ppo.ppo_epochs");
  p.generation_batch_size = c.get<int64_t>("ppo.generation_batch_size");
  p.max_new_tokens = c.get<int64_t>("ppo.max_new_tokens");
  p.temperature = c.get<double>("ppo.temperature");
  p.top_k = c.get<int64_t>("ppo.top_k");
  p.top_p = c.get<double>("ppo.top_p");
  p.stop_text = c.get<std::string>("ppo.stop_text");
  p.missing_eos_penalty = c.get<double>("ppo.missing_eos_penalty");
  p.kl_coef = c.get<double>("ppo.kl_coef");
  p.adaptive_kl = c.get<bool>("ppo.adaptive_kl");
  p.target_kl = c.get<double>("ppo.target_kl");
  p.kl_horizon = c.get<double>("ppo.kl_horizon");
  p.gamma = c.get<double>("ppo.gamma");
  p.lam = c.get<double>("ppo.lam");
  p.clip_range = c.get<double>("ppo.clip_range");
  p.clip_range_value = c.get<double>("ppo.clip_range_value");
  p.vf_coef = c.get<double>("ppo.vf_coef");
  p.entropy_coef = c.get<double>("ppo.entropy_coef");
  p.whiten_rewards = c.get<bool>("ppo.whiten_rewards");
  p.eval_text = c.get<std::string>("ppo.eval_text");
  p.eval_text_fraction = c.get<double>("ppo.eval_text_fraction");
  return p;
}

ConfigSection ppo_section() {
  ConfigSection section = {
      "ppo",
      "PPO from a reward model: rollouts, the KL penalty, GAE and the clipped "
      "updates",
      {section_key("ppo.reward_model", checkpoint_key(),
                   "the reward_model run (or checkpoint) that scores each "
                   "completion after its "
                   "prompt; frozen"),
       section_key("ppo.value", choice_key("separate", {"separate", "shared"}),
                   "separate: a value model initialised from the reward model "
                   "with a fresh head "
                   "(InstructGPT); shared: a value head on the policy's last "
                   "hidden state"),
       section_key("ppo.rollout_batch", integer_key(64, "[2, 65536]"),
                   "prompts sampled per step (one completion each); a multiple of "
                   "train.batch_size x train.grad_accum, the rows of one update"),
       section_key("ppo.ppo_epochs", integer_key(4, "[1, 1024]"),
                   "passes over each rollout, each in shuffled minibatches "
                   "(one update each)"),
       section_key("ppo.missing_eos_penalty", number_key(0.0, ">= 0"),
                   "subtracted from the score of a completion that did not "
                   "reach stop_text "
                   "(TRL's)"),
       section_key("ppo.kl_coef", number_key(0.05, ">= 0"),
                   "the per-token KL penalty -kl_coef (log pi - log ref); the adaptive "
                   "controller's start"),
       section_key("ppo.adaptive_kl", boolean_key(false),
                   "adapt kl_coef towards target_kl (Ziegler et al. 2019)"),
       section_key("ppo.target_kl", number_key(6.0, "> 0"),
                   "the KL to the reference (nats per completion) the adaptive "
                   "controller steers to"),
       section_key("ppo.kl_horizon", number_key(10000.0, "> 0"),
                   "the adaptive controller's horizon, in completions"),
       section_key("ppo.gamma", number_key(1.0, "[0, 1]"), "GAE's discount"),
       section_key("ppo.lam", number_key(0.95, "[0, 1]"), "GAE's lambda"),
       section_key("ppo.clip_range", number_key(0.2, "> 0"), "the policy ratio's clip epsilon"),
       section_key("ppo.clip_range_value", number_key(0.2, "> 0"),
                   "how far a value may move from the rollout's before its "
                   "loss is clipped"),
       section_key("ppo.vf_coef", number_key(0.1, ">= 0"),
                   "weight of the value loss in pg_loss + vf_coef * vf_loss"),
       section_key("ppo.entropy_coef", number_key(0.0, ">= 0"),
                   "weight of the entropy bonus (0 = none, as TRL)"),
       section_key("ppo.whiten_rewards", boolean_key(false),
                   "whiten the per-token rewards before GAE (TRL's whiten_rewards)"),
       section_key("ppo.eval_text", optional_path_key(),
                   "a text file whose held-out end each evaluation scores with "
                   "the policy as "
                   "text_loss; empty = none"),
       section_key("ppo.eval_text_fraction", number_key(0.1, "(0, 1)"),
                   "the last fraction of ppo.eval_text scored")}};
  const std::vector<ConfigKey> sampling = sampling_keys("ppo", 96);
  section.keys.insert(section.keys.begin() + 4, sampling.begin(), sampling.end());
  return section;
}

RecipeSpec ppo_recipe() {
  return {.name = "ppo",
          .doc = "PPO of a pretrained GPT (full or LoRA) against a reward model, with a KL "
                 "penalty to a frozen reference (RLHF)",
          .families = {"gpt"},
          .sections = {"ppo", "lora"},
          .check = check_ppo,
          .train = train_ppo,
          .eval = eval_ppo,
          .estimate = estimate_ppo,
          .eval_options = policy_eval_options()};
}

}  // namespace forge
