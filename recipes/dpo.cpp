// dpo, top to bottom: the dpo: section, the policy and its reference, one step (policy forward on
// the [2B, L] batch of chosen and rejected rows, summed response log-probabilities, the reference's
// without grad or from the precomputed table, the loss of nn::dpo_loss), TRL's metrics on train and
// val lines plus the LM loss on held-out text (does the policy still write it?), and `forge eval`,
// which with --prompts samples from policy and reference and reports their KL and rewards.
#include "recipes/dpo.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <type_traits>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/ops.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "nn/generate.h"
#include "nn/lora.h"
#include "nn/preference.h"
#include "recipes/checkpoint.h"
#include "recipes/components.h"
#include "recipes/lm_objective.h"
#include "recipes/lora_config.h"
#include "recipes/preference_config.h"
#include "recipes/reward_model.h"
#include "recipes/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

nn::DPOOptions dpo_options(const RunConfig& c) {
  nn::DPOOptions o;
  o.beta = c.get<double>("dpo.beta");
  o.label_smoothing = c.get<double>("dpo.label_smoothing");
  const std::string type = c.get<std::string>("dpo.loss_type");
  o.loss_type = type == "ipo"     ? nn::DPOLossType::ipo
                : type == "hinge" ? nn::DPOLossType::hinge
                                  : nn::DPOLossType::sigmoid;
  return o;
}

// The summed response log-probabilities of a batch's 2B rows, [2B].
Tensor row_logprobs(const nn::GPT& model, const PreferenceBatch& batch) {
  return nn::sequence_logprobs(model.forward(batch.ids), batch.targets);
}

// The reference: a frozen copy of the base, or the policy itself with its LoRA adapters off. Always
// in eval mode and without gradient.
class Reference {
 public:
  Reference(nn::GPT& policy, std::unique_ptr<nn::GPT> copy)
      : policy_(policy), copy_(std::move(copy)) {}

  Tensor logprobs(const PreferenceBatch& batch) const {
    NoGradGuard no_grad;
    return with_model([&](const nn::GPT& m) { return row_logprobs(m, batch); });
  }
  nn::GPT* copy() const { return copy_.get(); }

  /// f(the reference model): the copy, or the policy with its adapters off and in eval mode for
  /// the call (its mode is restored after).
  template <class F>
  std::invoke_result_t<F, const nn::GPT&> with_model(F f) const {
    if (copy_) return f(*copy_);
    const bool training = policy_.is_training();
    policy_.eval();
    struct Restore {
      nn::GPT& m;
      bool on;
      ~Restore() { m.train(on); }
    } restore{policy_, training};
    nn::AdaptersDisabled off(policy_);
    return f(policy_);
  }

 private:
  nn::GPT& policy_;
  std::unique_ptr<nn::GPT> copy_;
};

// Reference log-probabilities of every pair of a dataset, in dataset order (precompute_reference).
struct ReferenceTable {
  std::vector<float> chosen, rejected;
};

ReferenceTable precompute(const Reference& reference, const PreferenceDataset& dataset,
                          int64_t batch_size) {
  ReferenceTable table;
  for (int64_t first = 0; first < dataset.size(); first += batch_size) {
    const PreferenceBatch batch = preference_batch_at(dataset, first, batch_size);
    const int64_t B = batch.pairs();
    const std::vector<float> lp = reference.logprobs(batch).contiguous().to_vector<float>();
    table.chosen.insert(table.chosen.end(), lp.begin(), lp.begin() + B);
    table.rejected.insert(table.rejected.end(), lp.begin() + B, lp.end());
  }
  return table;
}

// What one batch of pairs gives: the loss summed over pairs and TRL's metrics as sums.
MicroBatchLoss dpo_batch_loss(const nn::GPT& policy, const PreferenceBatch& batch,
                              const Tensor& reference_logps, const nn::DPOOptions& options) {
  const int64_t B = batch.pairs();
  const Tensor lp = row_logprobs(policy, batch);
  nn::DPOLogProbs logps{.policy_chosen = slice(lp, 0, 0, B),
                        .policy_rejected = slice(lp, 0, B, 2 * B),
                        .reference_chosen = slice(reference_logps, 0, 0, B),
                        .reference_rejected = slice(reference_logps, 0, B, 2 * B),
                        .chosen_tokens = slice(batch.target_counts, 0, 0, B),
                        .rejected_tokens = slice(batch.target_counts, 0, B, 2 * B)};
  const nn::DPOResult r = nn::dpo_loss(logps, options);
  MicroBatchLoss out{sum(r.losses), B};
  const std::vector<float> rc = r.chosen_rewards.contiguous().to_vector<float>();
  const std::vector<float> rr = r.rejected_rewards.contiguous().to_vector<float>();
  const std::vector<float> l = lp.detach().contiguous().to_vector<float>();
  out.sums["pairs"] = double(B);
  for (int64_t i = 0; i < B; ++i) {
    const auto k = size_t(i);
    out.sums["rewards_chosen"] += double(rc[k]);
    out.sums["rewards_rejected"] += double(rr[k]);
    out.sums["correct"] += rc[k] > rr[k] ? 1.0 : 0.0;
    out.sums["logps_chosen"] += double(l[k]);
    out.sums["logps_rejected"] += double(l[k + size_t(B)]);
  }
  return out;
}

Metrics dpo_metrics(const std::map<std::string, double>& sums) {
  const double pairs = std::max(1.0, sums.count("pairs") ? sums.at("pairs") : 0.0);
  auto mean = [&](const char* key) { return (sums.count(key) ? sums.at(key) : 0.0) / pairs; };
  return {{"rewards_chosen", mean("rewards_chosen")},
          {"rewards_rejected", mean("rewards_rejected")},
          {"rewards_margin", mean("rewards_chosen") - mean("rewards_rejected")},
          {"rewards_acc", mean("correct")},
          {"logps_chosen", mean("logps_chosen")},
          {"logps_rejected", mean("logps_rejected")}};
}

// Reference log-probabilities of a batch [2B]: from the table when there is one.
Tensor reference_logps(const Reference& reference, const ReferenceTable* table,
                       const PreferenceBatch& batch) {
  if (!table) return reference.logprobs(batch);
  std::vector<double> v;
  for (const auto* side : {&table->chosen, &table->rejected})
    for (int64_t i : batch.indices) v.push_back(double((*side)[size_t(i)]));
  return from_vector(v, {int64_t(v.size())}, DType::f32);
}

Metrics evaluate_pairs(const nn::GPT& policy, const Reference& reference,
                       const ReferenceTable* table, const PreferenceDataset& dataset,
                       int64_t batch_size, int64_t pairs, const nn::DPOOptions& options) {
  NoGradGuard no_grad;
  const int64_t n = pairs > 0 ? std::min(pairs, dataset.size()) : dataset.size();
  double total = 0;
  std::map<std::string, double> sums;
  for (int64_t first = 0; first < n && (first == 0 || !stop_requested()); first += batch_size) {
    const PreferenceBatch batch = preference_batch_at(dataset, first, std::min(batch_size, n - first));
    MicroBatchLoss r =
        dpo_batch_loss(policy, batch, reference_logps(reference, table, batch), options);
    total += r.loss_sum.item();
    for (const auto& [key, value] : r.sums) sums[key] += value;
  }
  Metrics m = {{"loss", total / std::max(1.0, sums["pairs"])}};
  for (Metric& metric : dpo_metrics(sums)) m.push_back(std::move(metric));
  return m;
}

// dpo.eval_text's held-out end as LM windows, or nothing when the key is empty.
std::unique_ptr<LMWindows> eval_text_windows(const RunConfig& config) {
  const std::string text = config.get<std::string>("dpo.eval_text");
  if (text.empty()) return nullptr;
  RunConfig c = config;
  c.data.train = text;
  c.data.val.clear();
  c.data.val_fraction = config.get<double>("dpo.eval_text_fraction");
  return std::move(load_lm_splits(c).val);
}

// A frozen copy of the base policy, in eval mode.
std::unique_ptr<nn::GPT> load_base(const RunConfig& config, const fs::path& base) {
  Generator unused(uint64_t(config.seed), rng_stream("init"));
  auto copy = std::make_unique<nn::GPT>(gpt_config(config.model), unused);
  load_initial_weights(*copy, base);
  copy->eval();
  return copy;
}

struct Policy {
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<Reference> reference;
  fs::path base;
  bool lora = false;
};

// The policy from model.init_from (with adapters when lora.rank > 0) and its reference. A full
// fine-tune's resume overwrites the policy from its checkpoint, so the base is read then only for
// the reference; `need_reference_copy` false (precomputed) skips even that.
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
    copy = load_base(config, p.base);
  }
  p.reference = std::make_unique<Reference>(*p.model, std::move(copy));
  return p;
}

int train_dpo(const RunConfig& config) {
  PreferenceData data = load_preference_data(config);
  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  const bool precomputed = config.get<bool>("dpo.precompute_reference");
  Policy policy = build_policy(config, resuming, !precomputed);
  nn::GPT& model = *policy.model;
  NamedTensors trained = model.named_parameters();
  if (policy.lora)
    trained = nn::select_trainable(model.named_parameters(), lora_trainable_patterns(config));
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, trained);

  const int64_t B = config.train.batch_size;
  std::optional<ReferenceTable> train_table, val_table;
  if (precomputed) {
    // A full fine-tune computes the table with the base itself, loaded only for this and freed.
    std::unique_ptr<Reference> once;
    const Reference* ref = policy.reference.get();
    if (!policy.lora) {
      once = std::make_unique<Reference>(model, load_base(config, policy.base));
      ref = once.get();
    }
    train_table = precompute(*ref, *data.train, B);
    val_table = precompute(*ref, *data.val, B);
  }

  std::vector<RunModel> models = {{"", &model}};
  // The reference is referenced by path and digest, so a resume against another base fails. A
  // LoRA policy's main entry already references the base; a precomputed reference is no module,
  // so an empty one stands for it.
  nn::Module precomputed_reference;
  if (policy.lora) {
    models[0].adapters_only = true;
    models[0].source = policy.base;
  } else {
    nn::Module* ref = policy.reference->copy();
    models.push_back({"reference", ref ? ref : &precomputed_reference, false, false, policy.base});
  }

  const nn::DPOOptions options = dpo_options(config);
  PreferenceLoader loader(data.train, B, uint64_t(config.seed));
  std::unique_ptr<LMWindows> text = eval_text_windows(config);
  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step =
      int64_t(mean_pair_tokens(*data.train) * double(B * config.train.grad_accum));
  recipe.micro_batch = [&](int64_t, int64_t) {
    const PreferenceBatch batch = loader.next();
    return dpo_batch_loss(
        model, batch,
        reference_logps(*policy.reference, train_table ? &*train_table : nullptr, batch), options);
  };
  recipe.train_metrics = dpo_metrics;
  recipe.evaluate = [&](bool full) {
    const int64_t pairs = full || config.train.eval_batches == 0 ? 0 : config.train.eval_batches * B;
    Metrics m = evaluate_pairs(model, *policy.reference, val_table ? &*val_table : nullptr,
                               *data.val, B, pairs, options);
    if (text && !stop_requested())
      m.push_back({"text_loss", lm_eval(model, *text, B, config.train.eval_batches, full)
                                    .front()
                                    .value.as_double()});
    return m;
  };
  recipe.data_state = [&] { return loader.cursor().to_counters("data."); };
  recipe.restore_data_state = [&](const DataState& state) {
    loader.restore(LoaderCursor::from_counters(state, "data.", loader.fingerprint()));
  };
  recipe.sample = [&] {
    const PreferenceDataset& v = *data.val;
    const std::string prompt =
        v.size() > 0 ? data.tokenizer->decode({v.chosen[0].begin(),
                                               v.chosen[0].begin() + v.prompt_len[0]})
                     : std::string("\n");
    return sample_text(model, *data.tokenizer, prompt, config);
  };
  return run_training(config, models, *optimizer, recipe);
}

// ---- forge eval ----------------------------------------------------------------------------------

// The reference's summed log-probability of each completion (its prompt not scored), in batches.
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

// What the reward model gives each completion after its prompt.
std::vector<double> rewards_of(const LoadedRewardModel& rm, const std::vector<std::string>& prompts,
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

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// forge eval --prompts: K samples of every prompt from the policy and from the reference (the same
// draws), the policy's KL to the reference per token on its own samples, and with --reward-model
// both models' mean reward and the policy's win rate by reward (ties half).
Metrics evaluate_policy(const RunConfig& config, nn::GPT& policy, const Reference& reference,
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
    const std::vector<double> a = rewards_of(*rm, prompts, mine, *tokenizer, batch.batch_size);
    const std::vector<double> b = rewards_of(*rm, prompts, theirs, *tokenizer, batch.batch_size);
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

int eval_dpo(const RunConfig& config, const fs::path& checkpoint, const CommandOptions& options) {
  // A LoRA run's checkpoint loads as its base with the adapters, which off are the reference.
  LoadedGPT loaded = load_gpt(checkpoint);
  std::unique_ptr<nn::GPT> copy;
  if (lora_settings(config).rank == 0)
    copy = load_base(config, resolve_checkpoint(config.model.init_from));
  const Reference reference(*loaded.model, std::move(copy));
  PreferenceData data = load_preference_data(config);
  Metrics m = evaluate_pairs(*loaded.model, reference, nullptr, *data.val, config.train.batch_size,
                             0, dpo_options(config));
  if (std::unique_ptr<LMWindows> text = eval_text_windows(config)) {
    NoGradGuard no_grad;
    m.push_back({"text_loss", lm_eval(*loaded.model, *text, config.train.batch_size, 0, true)
                                  .front()
                                  .value.as_double()});
  }
  if (options.has("prompts"))
    for (Metric& metric : evaluate_policy(config, *loaded.model, reference, options))
      m.push_back(std::move(metric));
  print_eval(checkpoint.string(), loaded.step, m);
  return 0;
}

MemoryEstimate estimate_dpo(const RunConfig& config) {
  nn::GPTConfig g = gpt_config(config.model);
  nn::check_config(g);
  const int64_t params = nn::gpt_num_parameters(g);
  const nn::LoRAConfig lora = lora_settings(config);
  const bool copy = lora.rank == 0 && !config.get<bool>("dpo.precompute_reference");
  const int64_t adapters = lora.rank > 0 ? nn::lora_parameter_count(g, lora) : 0;
  // Both rows of every pair run at once, and their logits are kept for backward.
  RunConfig rows = config;
  rows.train.batch_size = 2 * config.train.batch_size;
  rows.model.context = preference_truncation(config).max_length;
  return estimate_memory(rows, params * (copy ? 2 : 1) + adapters,
                         lora.rank > 0 ? adapters : params,
                         double(rows.train.batch_size * rows.model.context));
}

void check_dpo(ConfigChecker& checker) {
  check_model_family(checker);
  check_preference(checker);
  check_lora(checker);
  const RunConfig& c = checker.config();
  checker.cross({"model.init_from", "recipe"}, !c.model.init_from.empty(),
                "model.init_from: recipe dpo starts from a trained policy (its reference); name "
                "its run directory or checkpoint");
  checker.cross({"dpo.label_smoothing", "dpo.loss_type"},
                c.get<double>("dpo.label_smoothing") == 0 ||
                    c.get<std::string>("dpo.loss_type") == "sigmoid",
                "dpo.label_smoothing: conservative DPO smooths the sigmoid loss only");
}

}  // namespace

ConfigSection dpo_section() {
  return {
      "dpo",
      "Direct Preference Optimization: the loss and the reference",
      {section_key("dpo.beta", number_key(0.1, "> 0"),
                   "how far the policy may move from the reference: the implicit reward is "
                   "beta * (log pi - log ref); IPO's tau"),
       section_key("dpo.loss_type", choice_key("sigmoid", {"sigmoid", "ipo", "hinge"}),
                   "sigmoid (DPO), ipo (Azar et al., on per-token averaged log-probabilities) or "
                   "hinge (SLiC)"),
       section_key("dpo.label_smoothing", number_key(0.0, "[0, 0.5)"),
                   "the assumed chance that a pair's labels are flipped (conservative DPO; sigmoid "
                   "only)"),
       section_key("dpo.precompute_reference", boolean_key(false),
                   "compute the reference's log-probabilities of every pair once before training "
                   "instead of a reference forward per step (a full fine-tune then frees the "
                   "reference's weights)"),
       section_key("dpo.eval_text", optional_path_key(),
                   "a text file whose held-out end each evaluation scores with the policy as "
                   "text_loss (does it still write the base's language?); empty = none"),
       section_key("dpo.eval_text_fraction", number_key(0.1, "(0, 1)"),
                   "the last fraction of dpo.eval_text scored, as data.val_fraction splits a "
                   "pretraining text")}};
}

RecipeSpec dpo_recipe() {
  return {.name = "dpo",
          .doc = "Direct Preference Optimization of a pretrained GPT (full or LoRA) against a "
                 "frozen reference",
          .families = {"gpt"},
          .sections = {"preference", "dpo", "lora"},
          .check = check_dpo,
          .train = train_dpo,
          .eval = eval_dpo,
          .estimate = estimate_dpo,
          .eval_options = {
              {"prompts", "FILE: sample each prompt from the policy and the reference; report "
                          "their KL (and rewards with --reward-model)"},
              {"num-samples", "K samples per prompt and model (default 4)"},
              {"max-new-tokens", "tokens per sample (default 96)"},
              {"temperature", "sampling temperature (default 1: the KL estimate needs 1)"},
              {"top-k", "default 0 (all tokens)"},
              {"top-p", "default 1 (off)"},
              {"seed", "sampling seed (default 0); both models draw the same numbers"},
              {"batch-size", "rows decoded together (default 64)"},
              {"reward-model", "RUN: a reward_model run that scores both models' samples"},
              {"output", "DIR: write policy.jsonl and reference.jsonl there (forge generate's "
                         "records)"}}};
}

}  // namespace forge
