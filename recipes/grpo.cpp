// grpo, top to bottom: the grpo: section; the prompt records; one step = a rollout of G completions
// of each of the step's prompts (recipes/rollout.h, the step's seed), their rewards from the
// verifiers, group-relative (or rejection) advantages, the rollout's log-probabilities where the
// updates need them (num_iterations > 1: the sampling policy's; beta > 0: the reference's), then
// num_iterations passes of shuffled minibatch updates of nn::grpo_loss through StepContext;
// evaluation of held-out prompts by their rewards; `forge eval`. docs/recipes/grpo.md.
#include "recipes/grpo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/jsonl.h"
#include "data/records.h"
#include "nn/moe.h"
#include "nn/ppo.h"
#include "recipes/lm_objective.h"
#include "recipes/policy.h"
#include "recipes/rollout.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/lora_config.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The grpo: section with the options its sampling and loss keys make.
struct GRPOSettings : GRPOSection {
  RolloutSampling rollout;
  nn::GRPOLossOptions loss;
};

GRPOSettings grpo_settings(const RunConfig& c) {
  GRPOSettings s;
  static_cast<GRPOSection&>(s) = grpo_section_settings(c);
  s.rollout = rollout_sampling(c, "grpo");
  s.loss.epsilon = s.epsilon;
  s.loss.epsilon_high = s.epsilon_high > 0 ? s.epsilon_high : s.epsilon;
  s.loss.beta = s.beta;
  s.loss.type = s.loss_type == GRPOSection::LossType::grpo  ? nn::GRPOLossType::grpo
                : s.loss_type == GRPOSection::LossType::dapo ? nn::GRPOLossType::dapo
                                                             : nn::GRPOLossType::dr_grpo;
  s.loss.max_completion_length = s.max_new_tokens;
  return s;
}

// ---- prompts ------------------------------------------------------------------------------------

// A prompt file's records: JSONL objects with a "prompt" and the fields the verifiers read (each
// checked here, before the first step), or for a file of one prompt a line, {"prompt": line}.
PromptReader prompt_reader(const std::vector<std::string>& required) {
  return [required](const fs::path& file) {
    Prompts p;
    if (file.extension() != ".jsonl") {
      if (!required.empty())
        throw Error(ExitCode::data,
                    detail::concat(file.string(), ": grpo.rewards' answer verifier compares "
                                                  "with each record's \"",
                                   required.front(), "\": give JSONL records (a .jsonl file)"));
      p.text = read_texts(file, {"prompt", "a prompt record", {"prompt"}}, "prompt");
      for (const std::string& t : p.text) p.records.push_back({{"prompt", t}});
      return p;
    }
    JsonlSchema schema{"prompt", "a prompt record", {"prompt"}};
    schema.open = true;  // the verifiers' fields and any the external command reads
    for (const JsonlObject& o : read_jsonl_objects(file, schema)) {
      p.text.push_back(jsonl_nonempty_string(o, "prompt"));
      for (const std::string& field : required) {
        const auto it = o.value.find(field);
        if (it == o.value.end())
          o.fail_field(field.c_str(), "is missing: grpo.rewards' answer verifier compares the "
                                      "extracted answer with it");
        if (!it->is_string() && !it->is_number() && !it->is_boolean())
          o.fail_field(field.c_str(), "must be a string or a number");
      }
      p.records.push_back(o.value);
    }
    return p;
  };
}

// ---- rollouts -----------------------------------------------------------------------------------

// One rollout: rows ordered by (prompt, sample), so rows g * G .. g * G + G - 1 are prompt g's
// group. Per response token, the log-probabilities the updates compare with (num_iterations > 1)
// and the reference's (beta > 0); per row its advantage.
struct GRPORollout : RolloutRows {
  std::vector<std::vector<float>> logp, ref_logp;
  std::vector<double> advantages;
};

// What a step's rollout gives its train line.
struct RolloutStats {
  std::vector<std::vector<double>> rewards;  // per function, per row
  std::vector<double> total;
  double tokens = 0, t_generate = 0, t_score = 0;
};

// The mean of each group's (unbiased) standard deviation, TRL's reward_std; 0 for groups of one.
double mean_group_std(const std::vector<double>& r, int64_t G) {
  if (G < 2) return 0;
  double out = 0;
  for (size_t first = 0; first < r.size(); first += size_t(G)) {
    double mean = 0, var = 0;
    for (size_t i = first; i < first + size_t(G); ++i) mean += r[i] / double(G);
    for (size_t i = first; i < first + size_t(G); ++i) var += (r[i] - mean) * (r[i] - mean);
    out += std::sqrt(var / double(G - 1));
  }
  return out / double(r.size() / size_t(G));
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// The standard deviation over every completion (unbiased, as TRL's nanstd), 0 for one.
double std_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

std::vector<VerifierSample> verifier_samples(const Prompts& prompts,
                                             const std::vector<std::string>& completions,
                                             int64_t G) {
  std::vector<VerifierSample> out;
  for (size_t i = 0; i < completions.size(); ++i)
    out.push_back({&prompts.records[i / size_t(G)], completions[i]});
  return out;
}

// Samples G completions of every prompt, scores them with the verifiers, sets the advantages and,
// without gradient in batches of `batch_size`, the log-probabilities the updates need. A stop
// request does not cut the rollout short: the step must be whole for its checkpoint.
GRPORollout collect_rollout(nn::GPT& policy, const ReferencePolicy* reference,
                            const Tokenizer& tokenizer, const Rewards& rewards,
                            const GRPOSettings& s, const Prompts& prompts, uint64_t seed,
                            int64_t batch_size, RolloutStats& stats) {
  NoGradGuard no_grad;
  const auto t0 = Clock::now();
  const bool training = policy.is_training();
  policy.eval();
  GRPORollout ro;
  const std::vector<std::string> completions =
      sample_rollout(policy, tokenizer, s.rollout, prompts, seed, s.num_generations, ro);
  stats.t_generate = seconds_since(t0);

  const auto t1 = Clock::now();
  stats.rewards = rewards.score(verifier_samples(prompts, completions, s.num_generations));
  stats.total = rewards.total(stats.rewards);
  ro.advantages = s.advantage == GRPOSection::Advantage::group
                      ? nn::group_advantages(stats.total, s.num_generations, s.scale_rewards)
                      : nn::rejection_advantages(stats.total, s.rejection_threshold);
  const size_t n = size_t(ro.size());
  for (size_t r = 0; r < n; ++r) stats.tokens += double(ro.response_tokens(int64_t(r)));
  if (s.num_iterations > 1) ro.logp.resize(n);
  if (s.beta > 0) ro.ref_logp.resize(n);
  for (int64_t first = 0; first < int64_t(n) && (s.num_iterations > 1 || s.beta > 0);
       first += batch_size) {
    const std::vector<int64_t> rows = iota_rows(first, std::min(batch_size, int64_t(n) - first));
    const NextTokenRows batch = rollout_rows(ro, rows);
    const double T = s.rollout.sampling.temperature;
    if (s.num_iterations > 1) from_columns(ro, policy_forward(policy, batch, T).logp, rows, ro.logp);
    if (s.beta > 0)
      from_columns(ro, reference->with_model([&](const nn::GPT& ref) {
        return policy_forward(ref, batch, T).logp;
      }),
                   rows, ro.ref_logp);
  }
  policy.train(training);
  stats.t_score = seconds_since(t1);
  return ro;
}

// The GRPO loss of rollout rows `rows` (with graph) as nn::grpo_loss normalises it, and the
// statistics as sums over their response tokens.
MicroBatchLoss grpo_micro_loss(const nn::GPT& policy, const GRPOSettings& s, const GRPORollout& ro,
                               const std::vector<int64_t>& rows) {
  const NextTokenRows batch = rollout_rows(ro, rows);
  const int64_t width = batch.targets.size(1);
  const Tensor mask = response_mask(batch);
  const PolicyForward f = policy_forward(policy, batch, s.rollout.sampling.temperature);
  // With one update per rollout the sampling policy is this one: its log-probabilities are
  // these, detached (TRL's shortcut), so the ratio is exactly 1.
  const Tensor old = s.num_iterations > 1 ? to_columns(ro, ro.logp, rows, width) : f.logp.detach();
  const Tensor ref = s.beta > 0 ? to_columns(ro, ro.ref_logp, rows, width) : Tensor();
  std::vector<double> advantages;
  double tokens = 0;
  for (int64_t r : rows) {
    advantages.push_back(ro.advantages[size_t(r)]);
    tokens += double(ro.response_tokens(r));
  }
  const nn::GRPOLoss l =
      nn::grpo_loss(f.logp, old, ref, from_vector(advantages, {int64_t(rows.size())}, DType::f32),
                    mask, s.loss);
  MicroBatchLoss out{l.loss_sum, l.units};
  NoGradGuard no_grad;
  const double entropy = nn::entropy_from_logits(f.logits.detach(), mask).item();
  out.sums = {{"clip_frac", l.clip_frac * tokens},
              {"kl", l.kl * tokens},
              {"ratio", l.ratio_mean * tokens},
              {"entropy", entropy * tokens},
              {"update_tokens", tokens}};
  return out;
}

// ---- evaluation ---------------------------------------------------------------------------------

// Held-out prompts answered once each at grpo.eval_temperature (0: greedy) with the step-0 seed,
// scored by the verifiers: "loss" is the negated mean reward.
Metrics evaluate(nn::GPT& policy, const Tokenizer& tokenizer, const Rewards& rewards,
                 const GRPOSettings& s, const Prompts& val, int64_t count, uint64_t seed) {
  NoGradGuard no_grad;
  const int64_t n = count > 0 ? std::min<int64_t>(count, int64_t(val.ids.size()))
                              : int64_t(val.ids.size());
  const Prompts p = subset(val, iota_rows(0, n));
  RolloutSampling sampling = s.rollout;
  sampling.sampling.temperature = s.eval_temperature;
  sampling.sampling.stop = stop_requested;
  RolloutRows rows;
  const std::vector<std::string> completions =
      sample_rollout(policy, tokenizer, sampling, p, seed, 1, rows);
  if (stop_requested()) return {};
  const std::vector<std::vector<double>> per_function =
      rewards.score(verifier_samples(p, completions, 1));
  const double reward = mean_of(rewards.total(per_function));
  Metrics out = {{"loss", -reward}, {"reward", reward}};
  for (size_t f = 0; f < per_function.size(); ++f)
    out.push_back({"reward_" + rewards.functions()[f]->name(), mean_of(per_function[f])});
  double tokens = 0;
  for (int64_t r = 0; r < rows.size(); ++r) tokens += double(rows.response_tokens(r));
  out.push_back({"completion_length", tokens / std::max<double>(1.0, double(n))});
  return out;
}

// ---- training -----------------------------------------------------------------------------------

int train_grpo(const RunConfig& config) {
  const GRPOSettings s = grpo_settings(config);
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(config.data.tokenizer, config.data.special_tokens);
  const Rewards rewards(verifier_options(s));
  const PromptSplits prompts = load_prompts(config, *tokenizer, s.max_new_tokens,
                                            "grpo.max_new_tokens",
                                            prompt_reader(rewards.required_fields()));

  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  // beta 0 compares with no reference, so none is built: a full policy's copy is not loaded.
  Policy policy =
      s.beta > 0 ? build_policy(config, resuming, true) : build_policy(config, resuming);
  nn::GPT& model = *policy.model;
  // MoE layers route each token alone in the rollout and the updates alike, so the updates'
  // log-probabilities start equal to the rollout's.
  const nn::DeterministicRouting routing(model);
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(
      config, policy_trained_parameters(config, policy), lora_lr_scale(config));
  const std::vector<RunModel> models = policy_run_models(policy);

  const int64_t B = config.train.batch_size;
  const int64_t G = s.num_generations;
  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step = s.prompts_per_step * G * s.max_new_tokens;
  recipe.custom_step = [&](StepContext& context) -> StepOutcome {
    const int64_t step = context.step();
    const Prompts batch_prompts = subset(
        prompts.train, step_prompts(int64_t(prompts.train.ids.size()), uint64_t(config.seed), step,
                                    s.prompts_per_step, "grpo_prompts"));
    RolloutStats rs;
    const GRPORollout ro =
        collect_rollout(model, policy.reference.get(), *tokenizer, rewards, s, batch_prompts,
                        sampling_seed(config, "grpo_rollout", step), B, rs);

    const auto t_update = Clock::now();
    PassTotals passes = minibatch_passes(
        context, config, ro.size(), s.num_iterations, "grpo_minibatch_",
        [&](const std::vector<int64_t>& rows) { return grpo_micro_loss(model, s, ro, rows); });
    std::map<std::string, double>& sums = passes.sums;
    const double update_tokens = std::max(1.0, sums["update_tokens"]);
    std::map<std::string, double> out;
    for (const char* key : {"clip_frac", "kl", "ratio", "entropy"})
      out[key] = sums[key] / update_tokens;
    out["reward"] = mean_of(rs.total);
    out["reward_std"] = mean_group_std(rs.total, G);
    for (size_t f = 0; f < rs.rewards.size(); ++f) {
      const std::string name = "reward_" + rewards.functions()[f]->name();
      out[name] = mean_of(rs.rewards[f]);
      out[name + "_std"] = std_of(rs.rewards[f]);
    }
    out["frac_reward_zero_std"] =
        double(nn::zero_variance_groups(rs.total, G)) / double(s.prompts_per_step);
    if (s.advantage == GRPOSection::Advantage::rejection)
      out["kept_frac"] = mean_of(ro.advantages);
    out["completion_length"] = rs.tokens / double(ro.size());
    out["time_rollout_s"] = rs.t_generate;
    out["time_score_s"] = rs.t_score;
    out["time_update_s"] = seconds_since(t_update);
    return {passes.loss(), std::move(out)};
  };
  std::vector<std::string> keys = {"reward", "reward_std"};
  for (const auto& f : rewards.functions()) {
    keys.push_back("reward_" + f->name());
    keys.push_back("reward_" + f->name() + "_std");
  }
  for (const char* key : {"frac_reward_zero_std", "kept_frac", "kl", "clip_frac", "ratio",
                          "entropy", "completion_length", "time_rollout_s", "time_score_s",
                          "time_update_s"})
    keys.push_back(key);
  recipe.train_metrics = [keys](const std::map<std::string, double>& sums) {
    Metrics out;
    for (const std::string& key : keys)
      if (sums.count(key)) out.push_back({key, sums.at(key)});
    return out;
  };
  recipe.evaluate = [&](bool full) {
    return evaluate(model, *tokenizer, rewards, s, prompts.val,
                    full ? 0 : config.train.eval_batches * B, sampling_seed(config, "grpo_eval", 0));
  };
  recipe.sample = [&] {
    const std::string prompt = prompts.val.text.empty() ? std::string("\n") : prompts.val.text[0];
    return sample_text(model, *tokenizer, prompt, config);
  };
  return run_training(config, models, *optimizer, recipe);
}

// ---- forge eval ---------------------------------------------------------------------------------

int eval_grpo(const RunConfig& config, const fs::path& checkpoint, const CommandOptions& options) {
  const GRPOSettings s = grpo_settings(config);
  return eval_policy(config, checkpoint, options, [&](nn::GPT& policy, const ReferencePolicy&) {
    std::unique_ptr<Tokenizer> tokenizer =
        make_tokenizer(config.data.tokenizer, config.data.special_tokens);
    const Rewards rewards(verifier_options(s));
    const PromptSplits prompts =
        load_prompts(config, *tokenizer, s.max_new_tokens, "grpo.max_new_tokens",
                     prompt_reader(rewards.required_fields()));
    return evaluate(policy, *tokenizer, rewards, s, prompts.val, 0,
                    sampling_seed(config, "grpo_eval", 0));
  });
}

MemoryEstimate estimate_grpo(const RunConfig& config) {
  const GRPOSection s = grpo_section_settings(config);
  return estimate_policy_memory(
      config, {.reference_copy = s.beta > 0,
               .rows = std::max(config.train.batch_size, s.generation_batch_size)});
}

void check_grpo(ConfigChecker& checker) {
  check_policy(checker, "a trained policy");
  check_policy_dropout(checker);
  const RunConfig& c = checker.config();
  const GRPOSection g = grpo_section_settings(c);
  checker.cross({"grpo.num_generations", "grpo.advantage"},
                g.num_generations >= 2 || g.advantage == GRPOSection::Advantage::rejection,
                "grpo.num_generations: 1 makes each completion its own group, whose mean is its "
                "reward: every advantage is 0 and nothing learns; sample 2 or more (or use "
                "grpo.advantage: rejection)");
  const int64_t minibatch = c.train.batch_size * c.train.grad_accum;
  const int64_t rows = g.prompts_per_step * g.num_generations;
  checker.cross({"grpo.prompts_per_step", "grpo.num_generations", "train.batch_size",
                 "train.grad_accum"},
                rows % minibatch == 0,
                detail::concat("grpo.prompts_per_step: ", g.prompts_per_step, " x ",
                               "grpo.num_generations ", g.num_generations, " = ", rows,
                               " completions must split into minibatches of train.batch_size x "
                               "train.grad_accum = ",
                               minibatch, " rows"));
  check_rollout(checker, g.max_new_tokens, "grpo.max_new_tokens");
  for (const VerifierProblem& p : check_verifiers(verifier_options(g)))
    checker.cross({p.key}, false, p.message);
}

GRPOSection::Advantage advantage_of(const std::string& name) {
  return name == "rejection" ? GRPOSection::Advantage::rejection : GRPOSection::Advantage::group;
}

GRPOSection::LossType loss_type_of(const std::string& name) {
  return name == "grpo"      ? GRPOSection::LossType::grpo
         : name == "dr_grpo" ? GRPOSection::LossType::dr_grpo
                             : GRPOSection::LossType::dapo;
}

}  // namespace

GRPOSection grpo_section_settings(const RunConfig& c) {
  GRPOSection g;
  g.num_generations = c.get<int64_t>("grpo.num_generations");
  g.prompts_per_step = c.get<int64_t>("grpo.prompts_per_step");
  g.num_iterations = c.get<int64_t>("grpo.num_iterations");
  const RolloutSampling r = rollout_sampling(c, "grpo");
  g.generation_batch_size = r.generation_batch_size;
  g.max_new_tokens = r.sampling.max_new_tokens;
  g.temperature = r.sampling.temperature;
  g.top_k = r.sampling.top_k;
  g.top_p = r.sampling.top_p;
  g.stop_text = r.stop_text;
  g.advantage = advantage_of(c.get<std::string>("grpo.advantage"));
  g.scale_rewards = c.get<bool>("grpo.scale_rewards");
  g.rejection_threshold = c.get<double>("grpo.rejection_threshold");
  g.loss_type = loss_type_of(c.get<std::string>("grpo.loss_type"));
  g.epsilon = c.get<double>("grpo.epsilon");
  g.epsilon_high = c.get<double>("grpo.epsilon_high");
  g.beta = c.get<double>("grpo.beta");
  g.rewards = c.get<std::vector<std::string>>("grpo.rewards");
  g.answer_weight = c.get<double>("grpo.answer_weight");
  g.regex_weight = c.get<double>("grpo.regex_weight");
  g.command_weight = c.get<double>("grpo.command_weight");
  g.answer_field = c.get<std::string>("grpo.answer_field");
  g.answer_pattern = c.get<std::string>("grpo.answer_pattern");
  g.format_pattern = c.get<std::string>("grpo.format_pattern");
  g.command = c.get<std::string>("grpo.command");
  g.command_timeout = c.get<double>("grpo.command_timeout");
  g.eval_temperature = c.get<double>("grpo.eval_temperature");
  return g;
}

VerifierOptions verifier_options(const GRPOSection& g) {
  std::vector<double> weights;
  for (const std::string& name : g.rewards)
    weights.push_back(name == "answer" ? g.answer_weight
                      : name == "regex" ? g.regex_weight
                                        : g.command_weight);
  return {.rewards = g.rewards,
          .weights = weights,
          .answer_field = g.answer_field,
          .answer_pattern = g.answer_pattern,
          .format_pattern = g.format_pattern,
          .command = g.command,
          .command_timeout = g.command_timeout};
}

ConfigSection grpo_section() {
  ConfigSection section = {
      "grpo",
      "GRPO from checkable rewards: G completions per prompt, group-relative advantages, the "
      "clipped loss with a k3 KL to the reference",
      {section_key("grpo.num_generations", integer_key(8, "[1, 65536]").aka({"G"}),
                   "completions sampled per prompt, the group whose mean (and std) each "
                   "completion's reward is compared with; 1 only with advantage: rejection"),
       section_key("grpo.prompts_per_step", integer_key(8, "[1, 65536]"),
                   "prompts of one rollout; prompts_per_step x num_generations completions, a "
                   "multiple of train.batch_size x train.grad_accum (the rows of one update)"),
       section_key("grpo.num_iterations", integer_key(1, "[1, 1024]"),
                   "passes over each rollout (mu), each in shuffled minibatches (one update each); "
                   "above 1 the rollout's log-probabilities are kept for the ratio"),
       section_key("grpo.advantage", choice_key("group", {"group", "rejection"}),
                   "group: (r - mean) / std over the prompt's completions (GRPO); rejection: 1 "
                   "for a completion whose reward reaches rejection_threshold, else 0 (online "
                   "rejection-sampling fine-tuning)"),
       section_key("grpo.scale_rewards", boolean_key(true),
                   "divide the group advantages by the group's std + 1e-4; false is Dr. GRPO's "
                   "r - mean"),
       section_key("grpo.rejection_threshold", number_key(1.0, ""),
                   "with advantage: rejection, the reward a completion must reach to be trained "
                   "on"),
       section_key("grpo.loss_type", choice_key("dapo", {"grpo", "dapo", "dr_grpo"}),
                   "grpo: each completion's token mean, then the mean over completions (the "
                   "paper); dapo: the mean over every response token of the update; dr_grpo: "
                   "the sum over completions x max_new_tokens"),
       section_key("grpo.epsilon", number_key(0.2, ">= 0"),
                   "the ratio's clip: 1 - epsilon below and, unless epsilon_high is set, "
                   "1 + epsilon above"),
       section_key("grpo.epsilon_high", number_key(0.0, ">= 0"),
                   "the ratio's upper clip 1 + epsilon_high (DAPO's clip-higher: 0.28); "
                   "0 = epsilon"),
       section_key("grpo.beta", number_key(0.0, ">= 0"),
                   "weight of the k3 KL to the reference per token (the paper's 0.04); 0 loads "
                   "no reference model"),
       section_key("grpo.rewards", string_list_key({"answer"}),
                   "the reward functions, each at most once: answer (exact match of the final "
                   "answer), regex (format_pattern matches), command (an external verifier)"),
       section_key("grpo.answer_weight", number_key(1.0, ""),
                   "the answer reward's weight in the reward, the weighted sum of rewards"),
       section_key("grpo.regex_weight", number_key(1.0, ""),
                   "the regex reward's weight in the reward"),
       section_key("grpo.command_weight", number_key(1.0, ""),
                   "the command reward's weight in the reward"),
       section_key("grpo.answer_field", string_key("answer"),
                   "the prompt record field the answer verifier compares with (a string or a "
                   "number's JSON text)"),
       section_key("grpo.answer_pattern", string_key("(-?[0-9]+(?:\\.[0-9]+)?)"),
                   "Oniguruma regex in Python syntax; group 1 of its last match in the "
                   "completion is the final answer, compared after trimming white space; the "
                   "default takes the last number"),
       section_key("grpo.format_pattern", string_key(""),
                   "the regex reward's pattern (Python syntax): 1 when it matches somewhere in "
                   "the completion (anchor with \\A and \\Z), else 0"),
       section_key("grpo.command", string_key(""),
                   "the command reward's verifier, run by /bin/sh -c once per step: one JSONL "
                   "record per completion on stdin, one number per line on stdout"),
       section_key("grpo.command_timeout", number_key(60.0, "> 0"),
                   "seconds the command may take per call before its process group is killed "
                   "(an error)"),
       section_key("grpo.eval_temperature", number_key(0.0, ">= 0"),
                   "sampling temperature of the held-out prompts' answers at evaluation; "
                   "0 = greedy")}};
  const std::vector<ConfigKey> sampling = sampling_keys("grpo", 256);
  section.keys.insert(section.keys.begin() + 3, sampling.begin(), sampling.end());
  return section;
}

RecipeSpec grpo_recipe() {
  return {.name = "grpo",
          .doc = "GRPO of a pretrained GPT (full or LoRA) from checkable rewards (exact answers, "
                 "regexes, an external verifier), or online rejection-sampling fine-tuning",
          .families = {"gpt"},
          .sections = {"grpo", "lora"},
          .check = check_grpo,
          .train = train_grpo,
          .eval = eval_grpo,
          .estimate = estimate_grpo,
          .eval_options = policy_eval_options()};
}

}  // namespace forge
