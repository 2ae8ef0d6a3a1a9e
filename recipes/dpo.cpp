// dpo, top to bottom: the dpo: section, the policy and its reference (none for orpo and simpo),
// one step (policy forward on the [2B, L] batch of chosen and rejected rows, summed response
// log-probabilities, the reference's without grad or from the precomputed table, ORPO's NLL, the
// loss of nn::dpo_loss), TRL's metrics on train and val lines plus the LM loss on held-out text
// (does the policy still write it?), and `forge eval`, which with --prompts samples from policy
// and reference (the base) and reports their KL and rewards.
#include "recipes/dpo.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/ops.h"
#include "nn/lora.h"
#include "nn/moe.h"
#include "nn/preference.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/lora_config.h"
#include "recipes/policy.h"
#include "recipes/preference_config.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

nn::DPOOptions loss_options(const DPOSection& dpo) {
  return {.beta = dpo.beta,
          .label_smoothing = dpo.label_smoothing,
          .loss_type = dpo.loss_type,
          .simpo_gamma = dpo.simpo_gamma};
}

// The summed response log-probabilities of a batch's 2B rows, [2B].
Tensor row_logprobs(const nn::GPT& model, const PreferenceBatch& batch) {
  return nn::sequence_logprobs(model.forward(batch.ids), batch.targets);
}

// TRL's ORPO NLL term of the [2B, L-1, V] logits of a batch: the mean cross-entropy of every token
// of the chosen rows after the first, prompt included.
Tensor chosen_nll(const Tensor& logits, const PreferenceBatch& batch) {
  const int64_t B = batch.pairs(), T = logits.size(1), V = logits.size(2);
  return cross_entropy(reshape(slice(logits, 0, 0, B), {B * T, V}),
                       reshape(chosen_row_targets(batch), {B * T}));
}

// The reference's summed response log-probabilities of a batch [2B], without gradient.
Tensor reference_row_logprobs(const ReferencePolicy& reference, const PreferenceBatch& batch) {
  NoGradGuard no_grad;
  return reference.with_model([&](const nn::GPT& m) { return row_logprobs(m, batch); });
}

// Reference log-probabilities of every pair of a dataset, in dataset order (precompute_reference).
struct ReferenceTable {
  std::vector<float> chosen, rejected;
};

ReferenceTable precompute(const ReferencePolicy& reference, const PreferenceDataset& dataset,
                          int64_t batch_size) {
  ReferenceTable table;
  for (int64_t first = 0; first < dataset.size(); first += batch_size) {
    const PreferenceBatch batch = preference_batch_at(dataset, first, batch_size);
    const int64_t B = batch.pairs();
    const std::vector<float> lp =
        reference_row_logprobs(reference, batch).contiguous().to_vector<float>();
    table.chosen.insert(table.chosen.end(), lp.begin(), lp.begin() + B);
    table.rejected.insert(table.rejected.end(), lp.begin() + B, lp.end());
  }
  return table;
}

// What one batch of pairs gives: the loss summed over pairs and TRL's metrics as sums.
// reference_logps is undefined for the losses that compare no reference.
MicroBatchLoss dpo_batch_loss(const nn::GPT& policy, const PreferenceBatch& batch,
                              const Tensor& reference_logps, const nn::DPOOptions& options) {
  const int64_t B = batch.pairs();
  const Tensor logits = policy.forward(batch.ids);
  const Tensor lp = nn::sequence_logprobs(logits, batch.targets);
  nn::DPOLogProbs logps{.policy_chosen = slice(lp, 0, 0, B),
                        .policy_rejected = slice(lp, 0, B, 2 * B),
                        .chosen_tokens = slice(batch.target_counts, 0, 0, B),
                        .rejected_tokens = slice(batch.target_counts, 0, B, 2 * B)};
  if (reference_logps.defined()) {
    logps.reference_chosen = slice(reference_logps, 0, 0, B);
    logps.reference_rejected = slice(reference_logps, 0, B, 2 * B);
  }
  if (options.loss_type == nn::DPOLossType::orpo) logps.chosen_nll = chosen_nll(logits, batch);
  const nn::DPOResult r = nn::dpo_loss(logps, options);
  MicroBatchLoss out{sum(r.losses), B};
  if (r.log_odds.defined()) {
    // Sums whose mean over pairs is TRL's batch mean (the NLL is the batch's, once per pair).
    out.sums["nll_loss"] = double(B) * logps.chosen_nll.item();
    out.sums["log_odds_chosen"] = sum(r.log_odds).item();
    out.sums["log_odds_ratio"] = sum(log_sigmoid(r.log_odds)).item();
  }
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
  Metrics m = {{"rewards_chosen", mean("rewards_chosen")},
               {"rewards_rejected", mean("rewards_rejected")},
               {"rewards_margin", mean("rewards_chosen") - mean("rewards_rejected")},
               {"rewards_acc", mean("correct")},
               {"logps_chosen", mean("logps_chosen")},
               {"logps_rejected", mean("logps_rejected")}};
  for (const char* key : {"nll_loss", "log_odds_chosen", "log_odds_ratio"})
    if (sums.count(key)) m.push_back({key, mean(key)});
  return m;
}

// Reference log-probabilities of a batch [2B]: from the table when there is one; undefined without
// a reference (orpo, simpo).
Tensor reference_logps(const ReferencePolicy* reference, const ReferenceTable* table,
                       const PreferenceBatch& batch) {
  if (!table && !reference) return {};
  if (!table) return reference_row_logprobs(*reference, batch);
  std::vector<double> v;
  for (const auto* side : {&table->chosen, &table->rejected})
    for (int64_t i : batch.indices) v.push_back(double((*side)[size_t(i)]));
  return from_vector(v, {int64_t(v.size())}, DType::f32);
}

Metrics evaluate_pairs(const nn::GPT& policy, const ReferencePolicy* reference,
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

int train_dpo(const RunConfig& config) {
  const DPOSection dpo = dpo_settings(config);
  PreferenceData data = load_preference_data(config);
  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  // ORPO and SimPO compare no reference: neither a copy of the base nor the adapters-off policy.
  const bool referenced = nn::needs_reference(dpo.loss_type);
  Policy policy = referenced ? build_policy(config, resuming, !dpo.precompute_reference)
                             : build_policy(config, resuming);
  nn::GPT& model = *policy.model;
  // MoE layers route each token alone (no noise, no capacity) in train mode as the reference does
  // in eval mode, so the implicit rewards start at 0.
  const nn::DeterministicRouting routing(model);
  std::unique_ptr<optim::Optimizer> optimizer =
      build_optimizer(config, policy_trained_parameters(config, policy), lora_lr_scale(config));

  const int64_t B = config.train.batch_size;
  std::optional<ReferenceTable> train_table, val_table;
  if (dpo.precompute_reference) {
    // A full fine-tune computes the table with the base itself, loaded only for this and freed.
    std::unique_ptr<ReferencePolicy> once;
    const ReferencePolicy* ref = policy.reference.get();
    if (!policy.lora) {
      once = std::make_unique<ReferencePolicy>(model, load_frozen_base(config, policy.base));
      ref = once.get();
    }
    train_table = precompute(*ref, *data.train, B);
    val_table = precompute(*ref, *data.val, B);
  }

  // A precomputed reference is no module: an empty one stands for it.
  nn::Module precomputed_reference;
  const std::vector<RunModel> models =
      policy_run_models(policy, train_table ? &precomputed_reference : nullptr);

  const nn::DPOOptions options = loss_options(dpo);
  PreferenceLoader loader(data.train, B, uint64_t(config.seed));
  std::unique_ptr<LMWindows> text = held_out_text(config, dpo.eval_text, dpo.eval_text_fraction);
  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step =
      int64_t(mean_pair_tokens(*data.train) * double(B * config.train.grad_accum));
  recipe.micro_batch = [&](int64_t, int64_t) {
    const PreferenceBatch batch = loader.next();
    return dpo_batch_loss(
        model, batch,
        reference_logps(policy.reference.get(), train_table ? &*train_table : nullptr, batch),
        options);
  };
  recipe.skip_micro_batch = [&](int64_t, int64_t) { loader.skip(); };
  recipe.train_metrics = dpo_metrics;
  recipe.evaluate = [&](bool full) {
    const int64_t pairs = full || config.train.eval_batches == 0 ? 0 : config.train.eval_batches * B;
    Metrics m = evaluate_pairs(model, policy.reference.get(), val_table ? &*val_table : nullptr,
                               *data.val, B, pairs, options);
    if (text && !stop_requested())
      m.push_back(text_loss(model, *text, B, config.train.eval_batches, full));
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

int eval_dpo(const RunConfig& config, const fs::path& checkpoint, const CommandOptions& options) {
  const DPOSection dpo = dpo_settings(config);
  return eval_policy(config, checkpoint, options, [&](nn::GPT& policy, const ReferencePolicy& ref) {
    PreferenceData data = load_preference_data(config);
    const int64_t B = config.train.batch_size;
    const ReferencePolicy* compared = nn::needs_reference(dpo.loss_type) ? &ref : nullptr;
    Metrics m = evaluate_pairs(policy, compared, nullptr, *data.val, B, 0, loss_options(dpo));
    if (std::unique_ptr<LMWindows> text =
            held_out_text(config, dpo.eval_text, dpo.eval_text_fraction))
      m.push_back(text_loss(policy, *text, B, 0, true));
    return m;
  });
}

MemoryEstimate estimate_dpo(const RunConfig& config) {
  // Both rows of every pair run at once.
  const DPOSection dpo = dpo_settings(config);
  return estimate_policy_memory(
      config, {.reference_copy = nn::needs_reference(dpo.loss_type) && !dpo.precompute_reference,
               .rows = 2 * config.train.batch_size,
               .row_length = preference_truncation(config).max_length});
}

void check_dpo(ConfigChecker& checker) {
  check_policy(checker, "a trained policy (its reference)");
  check_preference(checker);
  check_policy_dropout(checker);
  const DPOSection dpo = dpo_settings(checker.config());
  checker.cross({"dpo.label_smoothing", "dpo.loss_type"},
                dpo.label_smoothing == 0 || dpo.loss_type == nn::DPOLossType::sigmoid ||
                    dpo.loss_type == nn::DPOLossType::simpo,
                "dpo.label_smoothing: conservative DPO smooths the sigmoid and simpo losses only");
  checker.cross({"dpo.precompute_reference", "dpo.loss_type"},
                !dpo.precompute_reference || nn::needs_reference(dpo.loss_type),
                "dpo.precompute_reference: dpo.loss_type " +
                    checker.config().get<std::string>("dpo.loss_type") +
                    " compares no reference; set false");
}

}  // namespace

ConfigSection dpo_section() {
  return {
      "dpo",
      "Direct Preference Optimization: the loss and the reference",
      {section_key("dpo.beta", number_key(0.1, "> 0"),
                   "how far the policy may move from the reference: the implicit reward is "
                   "beta * (log pi - log ref); IPO's tau, ORPO's lambda, SimPO's beta"),
       section_key("dpo.loss_type",
                   choice_key("sigmoid", {"sigmoid", "ipo", "hinge", "orpo", "simpo"}),
                   "sigmoid (DPO), ipo (Azar et al., on per-token averaged log-probabilities), "
                   "hinge (SLiC), or without a reference: orpo (NLL + beta * odds-ratio loss) or "
                   "simpo (length-normalised rewards, margin simpo_gamma)"),
       section_key("dpo.label_smoothing", number_key(0.0, "[0, 0.5)"),
                   "the assumed chance that a pair's labels are flipped (conservative DPO; sigmoid "
                   "and simpo only)"),
       section_key("dpo.simpo_gamma", number_key(0.5, ">= 0"),
                   "SimPO's target reward margin gamma, TRL's simpo_gamma (simpo only)"),
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

DPOSection dpo_settings(const RunConfig& config) {
  const std::string type = config.get<std::string>("dpo.loss_type");
  return {.beta = config.get<double>("dpo.beta"),
          .loss_type = type == "ipo"     ? nn::DPOLossType::ipo
                       : type == "hinge" ? nn::DPOLossType::hinge
                       : type == "orpo"  ? nn::DPOLossType::orpo
                       : type == "simpo" ? nn::DPOLossType::simpo
                                         : nn::DPOLossType::sigmoid,
          .label_smoothing = config.get<double>("dpo.label_smoothing"),
          .simpo_gamma = config.get<double>("dpo.simpo_gamma"),
          .precompute_reference = config.get<bool>("dpo.precompute_reference"),
          .eval_text = config.get<std::string>("dpo.eval_text"),
          .eval_text_fraction = config.get<double>("dpo.eval_text_fraction")};
}

RecipeSpec dpo_recipe() {
  return {.name = "dpo",
          .doc = "Direct Preference Optimization of a pretrained GPT (full or LoRA) against a "
                 "frozen reference, or ORPO and SimPO without one",
          .families = {"gpt"},
          .sections = {"preference", "dpo", "lora"},
          .check = check_dpo,
          .train = train_dpo,
          .eval = eval_dpo,
          .estimate = estimate_dpo,
          .eval_options = policy_eval_options()};
}

}  // namespace forge
