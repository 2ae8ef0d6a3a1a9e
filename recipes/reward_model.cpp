// reward_model, top to bottom: preference pairs (recipes/preference_config.h), the reward model on
// model.init_from's backbone (the LM head dropped, "head.score" at its init), the Bradley-Terry
// loss over [2B, L] batches (chosen rows first, each reward read at its row's last real token),
// pair accuracy and reward statistics on train and val lines, `forge eval`, and `forge score`.
#include "recipes/reward_model.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/ops.h"
#include "core/output_path.h"
#include "data/batch.h"
#include "data/jsonl.h"
#include "data/sft.h"
#include "nn/preference.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/preference_config.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

Metrics reward_metrics(const std::map<std::string, double>& sums) {
  const double pairs = std::max(1.0, sums.count("pairs") ? sums.at("pairs") : 0.0);
  auto mean = [&](const char* key) { return (sums.count(key) ? sums.at(key) : 0.0) / pairs; };
  return {{"reward_acc", mean("correct")},
          {"reward_margin", mean("chosen") - mean("rejected")},
          {"reward_chosen", mean("chosen")},
          {"reward_rejected", mean("rejected")}};
}

MemoryEstimate estimate_reward_model(const RunConfig& config) {
  nn::GPTConfig g = gpt_config(config.model);
  nn::check_config(g);
  const int64_t params = nn::gpt_backbone_parameters(g) + g.d_model;
  // Both rows of every pair run at once.
  RunConfig rows = config;
  rows.train.batch_size = 2 * config.train.batch_size;
  rows.model.context = preference_truncation(config).max_length;
  return estimate_memory(rows, params, params, 0.0);
}

void check_reward_model(ConfigChecker& checker) {
  check_model_family(checker);
  check_preference(checker);
}

int train_reward_model(const RunConfig& config) {
  PreferenceData data = load_preference_data(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::GPTRewardModel model(gpt_config(config.model), init);
  model.set_activation_checkpointing(config.train.activation_checkpointing);
  // The backbone comes from the language model; the score head keeps its init. A resume then
  // overwrites all of it with the run's own checkpoint.
  if (!config.model.init_from.empty())
    init_from_checkpoint(model, resolve_checkpoint(config.model.init_from),
                         {.allow_missing = {"head.*"}, .allow_unexpected = {"lm_head.*"}});
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, model.named_parameters());

  const int64_t B = config.train.batch_size;
  const double center = reward_model_settings(config).center_rewards_coefficient;
  PreferenceLoader loader(data.train, B, uint64_t(config.seed));
  Recipe recipe;
  recipe.eval_at_start = true;
  recipe.tokens_per_step =
      int64_t(mean_pair_tokens(*data.train) * double(B * config.train.grad_accum));
  recipe.micro_batch = [&](int64_t, int64_t) { return reward_loss(model, loader.next(), center); };
  recipe.skip_micro_batch = [&](int64_t, int64_t) { loader.skip(); };
  recipe.train_metrics = reward_metrics;
  recipe.evaluate = [&](bool full) {
    const int64_t pairs = full || config.train.eval_batches == 0 ? 0 : config.train.eval_batches * B;
    return evaluate_reward_model(model, *data.val, B, pairs, center);
  };
  recipe.data_state = [&] { return loader.cursor().to_counters("data."); };
  recipe.restore_data_state = [&](const DataState& state) {
    loader.restore(LoaderCursor::from_counters(state, "data.", loader.fingerprint()));
  };
  return run_training(config, model, *optimizer, recipe);
}

int eval_reward_model(const RunConfig& config, const fs::path& checkpoint, const CommandOptions&) {
  LoadedRewardModel loaded = load_reward_model(checkpoint);
  PreferenceData data = load_preference_data(config);
  NoGradGuard no_grad;
  const Metrics m = evaluate_reward_model(*loaded.model, *data.val, config.train.batch_size, 0,
                                          reward_model_settings(config).center_rewards_coefficient);
  print_eval(checkpoint.string(), read_checkpoint_info(checkpoint).step, m);
  return 0;
}

}  // namespace

MicroBatchLoss reward_loss(const nn::GPTRewardModel& model, const PreferenceBatch& batch,
                           double center_rewards_coefficient) {
  const int64_t B = batch.pairs();
  const Tensor r = model.rewards(batch.rows, batch.row_mask);
  const Tensor chosen = slice(r, 0, 0, B), rejected = slice(r, 0, B, 2 * B);
  MicroBatchLoss out{
      sum(nn::bradley_terry_loss(chosen, rejected, batch.margins, center_rewards_coefficient)), B};
  const std::vector<float> c = chosen.detach().contiguous().to_vector<float>();
  const std::vector<float> j = rejected.detach().contiguous().to_vector<float>();
  out.sums["pairs"] = double(B);
  for (int64_t i = 0; i < B; ++i) {
    out.sums["correct"] += c[size_t(i)] > j[size_t(i)] ? 1.0 : 0.0;
    out.sums["chosen"] += double(c[size_t(i)]);
    out.sums["rejected"] += double(j[size_t(i)]);
  }
  return out;
}

Metrics evaluate_reward_model(const nn::GPTRewardModel& model, const PreferenceDataset& dataset,
                              int64_t batch_size, int64_t pairs, double center_rewards_coefficient) {
  const int64_t n = pairs > 0 ? std::min(pairs, dataset.size()) : dataset.size();
  double total = 0;
  std::map<std::string, double> sums;
  for (int64_t first = 0; first < n && (first == 0 || !stop_requested()); first += batch_size) {
    MicroBatchLoss r = reward_loss(
        model, preference_batch_at(dataset, first, std::min(batch_size, n - first)),
        center_rewards_coefficient);
    total += r.loss_sum.item();
    for (const auto& [key, value] : r.sums) sums[key] += value;
  }
  Metrics m = {{"loss", total / std::max(1.0, sums["pairs"])}};
  for (Metric& metric : reward_metrics(sums)) m.push_back(std::move(metric));
  return m;
}

LoadedRewardModel load_reward_model(const fs::path& file, bool dropout) {
  LoadedRewardModel loaded{stored_config(file), nullptr};
  if (loaded.config.recipe != "reward_model")
    throw Error(ExitCode::checkpoint, quoted_path(file.string()) + ": a " + loaded.config.recipe +
                                          " checkpoint, not a reward_model one");
  if (!dropout) loaded.config.model.dropout = 0.0;
  Generator init(uint64_t(loaded.config.seed), rng_stream("init"));
  loaded.model = std::make_unique<nn::GPTRewardModel>(gpt_config(loaded.config.model), init);
  init_from_checkpoint(*loaded.model, file);
  loaded.model->eval();
  return loaded;
}

std::vector<double> score_texts(const LoadedRewardModel& rm, const std::vector<std::string>& texts,
                                int64_t batch_size,
                                const std::function<std::string(size_t)>& names) {
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(rm.config.data.tokenizer, rm.config.data.special_tokens);
  const std::vector<int32_t> eot =
      end_of_text_ids(*tokenizer, preference_settings(rm.config).end_of_text);
  const int64_t context = rm.config.model.context;
  std::vector<std::vector<int32_t>> rows;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> row = tokenizer->encode(texts[i]);
    row.insert(row.end(), eot.begin(), eot.end());
    if (int64_t(row.size()) > context || row.empty())
      throw Error(ExitCode::data, detail::concat(names(i), " is ", row.size(),
                                                 " tokens; the reward model reads 1 to ", context));
    rows.push_back(std::move(row));
  }
  NoGradGuard no_grad;
  std::vector<double> out;
  for (size_t first = 0; first < rows.size(); first += size_t(batch_size)) {
    const std::vector<std::vector<int32_t>> batch(
        rows.begin() + long(first),
        rows.begin() + long(std::min(rows.size(), first + size_t(batch_size))));
    const int64_t width = longest_row(batch);
    const Tensor r = rm.model->rewards(pad_rows(batch, width, 0), padding_mask(batch, width));
    for (float v : r.contiguous().to_vector<float>()) out.push_back(double(v));
  }
  return out;
}

int score_records(const fs::path& checkpoint, const fs::path& input, const fs::path& output,
                  int64_t batch_size) {
  const std::vector<JsonlObject> records = read_jsonl_objects(
      input, {"score input", "a record to score", {"prompt", "completion", "chosen", "rejected"},
              kMaxPreferenceFileBytes, /*open=*/true});
  // A preference record gets both of its responses scored, any other record its completion.
  std::vector<std::string> texts, names;
  std::vector<std::vector<std::string>> fields;
  for (const JsonlObject& o : records) {
    const std::string prompt = jsonl_string(o, "prompt");
    const bool pair = o.value.contains("chosen") || o.value.contains("rejected");
    fields.push_back(pair ? std::vector<std::string>{"chosen", "rejected"}
                          : std::vector<std::string>{"completion"});
    for (const std::string& f : fields.back()) {
      texts.push_back(prompt + jsonl_string(o, f.c_str()));
      names.push_back(o.where + ": prompt + " + f);
    }
  }
  const LoadedRewardModel rm = load_reward_model(checkpoint);
  const std::vector<double> rewards =
      score_texts(rm, texts, batch_size, [&](size_t i) { return names[i]; });
  std::string jsonl;
  size_t next = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    nlohmann::json record = records[i].value;
    for (const std::string& f : fields[i])
      record[f == "completion" ? "reward" : "reward_" + f] = rewards[next++];
    jsonl += record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  if (output.empty())
    std::fwrite(jsonl.data(), 1, jsonl.size(), stdout);
  else
    write_file_atomic(output, jsonl, ExitCode::usage);
  std::fprintf(stderr, "score: %zu rewards of %zu records\n", rewards.size(), records.size());
  return 0;
}

ConfigSection reward_model_section() {
  return {"reward_model",
          "the Bradley-Terry loss of the reward_model recipe",
          {section_key("reward_model.center_rewards_coefficient", number_key(0.0, ">= 0"),
                       "adds c (r_chosen + r_rejected)^2 per pair, keeping rewards centred on 0 "
                       "(TRL's center_rewards_coefficient; 0 = off). A record's \"margin\" asks "
                       "r_chosen - r_rejected to exceed it")}};
}

RewardModelSection reward_model_settings(const RunConfig& config) {
  return {.center_rewards_coefficient =
              config.get<double>("reward_model.center_rewards_coefficient")};
}

namespace {

// forge score: options checked before the work, so a typo does not cost the whole scoring.
int score_command(const CommandOptions& options) {
  if (!options.has("checkpoint")) throw Error(ExitCode::usage, "score: --checkpoint is required");
  if (!options.has("input")) throw Error(ExitCode::usage, "score: --input is required");
  const int64_t batch = options.integer("batch-size", 64);
  if (batch < 1) throw Error(ExitCode::usage, "score: --batch-size must be at least 1");
  const fs::path output = options.text("output", "");
  const fs::path checkpoint = options.text("checkpoint", "");
  const fs::path file = resolve_checkpoint(checkpoint);
  const fs::path input = options.text("input", "");
  if (!output.empty()) {
    std::vector<fs::path> inputs = checkpoint_inputs(checkpoint, file);
    inputs.push_back(input);
    check_output_path("score: --output", output, inputs, OutputShape::file);
  }
  return score_records(file, input, output, batch);
}

}  // namespace

RecipeSpec reward_model_recipe() {
  return {.name = "reward_model",
          .doc = "a reward model (a GPT with a scalar head) trained on preference pairs with the "
                 "Bradley-Terry loss",
          .families = {"gpt"},
          .sections = {"preference", "reward_model"},
          .check = check_reward_model,
          .train = train_reward_model,
          .eval = eval_reward_model,
          .estimate = estimate_reward_model,
          .commands = {{
              .name = "score",
              .summary = "--checkpoint RM --input FILE.jsonl [--output FILE.jsonl]   a reward "
                         "model's reward\n"
                         "                                      added to each record",
              .usage =
                  "usage: forge score --checkpoint RM-RUN-or-FILE --input FILE.jsonl [--output "
                  "FILE.jsonl]\n"
                  "                   [--batch-size N]\n"
                  "Adds a reward_model run's rewards to JSONL records and keeps their other "
                  "fields: \"reward\"\n"
                  "for {\"prompt\", \"completion\"} (forge generate's records), "
                  "\"reward_chosen\" and\n"
                  "\"reward_rejected\" for {\"prompt\", \"chosen\", \"rejected\"}. Writes "
                  "--output whole at\n"
                  "the end, else stdout. --batch-size: texts per forward (default 64).\n",
              .options = {"checkpoint", "input", "output", "batch-size"},
              .run = score_command,
          }}};
}

}  // namespace forge
