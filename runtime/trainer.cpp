// The shared training loop. Every source of randomness in a step is a function of (seed, step):
// batches come from the recipe's counter-based sampler, dropout from the default generator set to
// stream ("dropout", step) before each forward. A checkpoint therefore needs only the trained
// parameters, optimizer state, the step and, for recipes whose loader keeps a cursor, that cursor,
// to continue exactly the trajectory of an uninterrupted run; frozen models and LoRA bases are
// reloaded from their sources, whose digests the checkpoint records. What a run needs besides the
// loop lives beside it: the run directory (run_directory.h), the ranks' agreements and the stop
// flag (rank_agreement.h), and the tests' fault injection (fault_injection.h).
#include "runtime/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

#include "core/allocator.h"
#include "core/checksum.h"
#include "core/comm.h"
#include "core/durable_file.h"
#include "core/file_io.h"
#include "core/ops.h"
#include "data/token_dataset.h"
#include "nn/aux_loss.h"
#include "optim/clip.h"
#include "optim/groups.h"
#include "optim/schedule.h"
#include "optim/sharded_adamw.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/fault_injection.h"
#include "runtime/rank_agreement.h"
#include "runtime/report.h"
#include "runtime/run_directory.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// Data parallelism shards each step's micro-batches over the ranks and keeps one update per step.
void check_data_parallel(const RunConfig& config, const Recipe& recipe, int ranks) {
  if (recipe.custom_step)
    throw Error(ExitCode::usage,
                detail::concat("recipe ", config.recipe, " updates several times per step and "
                               "does not run data-parallel; start it without mpirun"));
  FORGE_CHECK(!recipe.data_state || recipe.skip_micro_batch, "recipe ", config.recipe,
              " keeps a loader cursor but cannot skip another rank's micro-batches");
  const int64_t accum = config.train.grad_accum, batch = config.train.batch_size;
  if (accum % ranks == 0) return;
  // The same global batch in micro-batches a multiple of the ranks can share, when there is one.
  const int64_t global = accum * batch;
  std::string hint;
  for (int64_t a = ranks; a <= global; a += ranks)
    if (global % a == 0) {
      hint = detail::concat("; for the same ", global, " sequences per step set train.batch_size=",
                            global / a, " train.grad_accum=", a);
      break;
    }
  throw Error(ExitCode::usage,
              detail::concat("train.grad_accum = ", accum, " is not a multiple of the ", ranks,
                             " ranks: each rank runs grad_accum / ranks of a step's micro-batches",
                             hint));
}

optim::ScheduleSpec schedule_spec(const RunConfig& c) {
  optim::ScheduleSpec s;
  s.name = c.schedule.name;
  s.base_lr = c.optimizer.lr;
  s.warmup_steps = c.schedule.warmup_steps;
  s.max_steps = c.train.max_steps;
  s.min_lr = c.schedule.min_lr;
  s.cut_frac = c.schedule.cut_frac;
  s.ratio = c.schedule.ratio;
  s.d_model = c.schedule.noam_d_model;
  return s;
}

// Dropout masks of forward `index` of step `step` (forwards take disjoint counter ranges).
void seed_dropout(const RunConfig& c, int64_t step, int64_t index) {
  default_generator().set_state({uint64_t(c.seed), rng_stream("dropout", uint64_t(step)),
                                 uint64_t(index) << 40});
}

void check_same_model(const RunConfig& config, const std::string& stored_yaml, const fs::path& file) {
  RunConfig stored = load_config_string(stored_yaml, file.string(), {}, ConfigFiles::skip);
  if (stored.model == config.model) return;
  for (const ConfigKey& key : config_schema()) {
    if (key.path.rfind("model.", 0) != 0) continue;
    ConfigValue a = key.get(config), b = key.get(stored);
    if (a != b)
      throw Error(ExitCode::checkpoint,
                  detail::concat(file.string(), ": checkpoint was trained with ", key.path, " = ",
                                 format_config_value(b), ", the config says ",
                                 format_config_value(a),
                                 " (use another output_dir, or train.resume: never)"));
  }
}

// Every key of the config with its value as config.yaml prints it: what the ranks compare.
std::vector<std::pair<std::string, std::string>> printed_keys(const RunConfig& config) {
  std::vector<std::pair<std::string, std::string>> keys;
  for (const ConfigKey& key : config_schema())
    keys.emplace_back(key.path, format_config_value(key.get(config)));
  return keys;
}

// The models of a run as the checkpoint sees them: which tensors are saved (names prefixed by the
// model's name) and which sources are referenced.
class RunModels {
 public:
  RunModels(const std::vector<RunModel>& models, const optim::Optimizer& optimizer)
      : models_(models) {
    std::set<const TensorImpl*> trained;
    for (const NamedTensor& p : optimizer.parameters()) trained.insert(p.tensor.impl());
    std::set<std::string> names;
    int trainable = 0;
    for (const RunModel& m : models_) {
      FORGE_CHECK(m.module, "run_training: model '", m.name, "' is null");
      FORGE_CHECK(names.insert(m.name).second, "run_training: two models named '", m.name, "'");
      FORGE_CHECK(m.source.empty() == (m.trainable && !m.adapters_only),
                  "run_training: model '", m.name,
                  "' needs a source exactly when it is frozen or saves adapters only");
      if (!m.source.empty())
        references_[reference_name(m)] = {m.source.string(),
                                          checkpoint_digest(m.source)};
      if (!m.trainable) {
        for (NamedTensor p : m.module->named_parameters()) p.tensor.set_requires_grad(false);
        continue;
      }
      trainable++;
      if (!m.name.empty()) auxiliary_.push_back(m.name);
      const std::string prefix = m.name.empty() ? "" : m.name + ".";
      for (const NamedTensor& t : m.module->named_state())
        if (!m.adapters_only || trained.count(t.tensor.impl()))
          saved_.push_back({prefix + t.name, t.tensor});
    }
    FORGE_CHECK(trainable > 0, "run_training: no trained model");
  }

  void set_training() const {
    for (const RunModel& m : models_) m.module->train(m.trainable);
  }
  void set_eval() const {
    for (const RunModel& m : models_) m.module->eval();
  }
  const NamedTensors& saved() const { return saved_; }
  const std::map<std::string, ModelReference>& references() const { return references_; }
  /// The trained models besides the main one, saved as "<name>.<tensor>".
  const std::vector<std::string>& auxiliary() const { return auxiliary_; }

  // A checkpoint written against other sources than this run's would continue a different run.
  void check_references(const CheckpointInfo& info, const fs::path& file) const {
    for (const auto& [name, ref] : references_) {
      auto it = info.references.find(name);
      if (it == info.references.end())
        throw Error(ExitCode::checkpoint,
                    detail::concat(file.string(), ": has no reference for model '", name,
                                   "' (", ref.path, "): it was written by a different run setup"));
      if (it->second.digest != ref.digest)
        throw Error(ExitCode::checkpoint,
                    detail::concat(file.string(), ": model '", name, "' was ", it->second.path,
                                   " with digest ", it->second.digest, ", but ", ref.path,
                                   " now has digest ", ref.digest,
                                   " (the file changed; use another output_dir, or "
                                   "train.resume: never)"));
    }
    for (const auto& [name, ref] : info.references)
      if (!references_.count(name))
        throw Error(ExitCode::checkpoint,
                    detail::concat(file.string(), ": references model '", name, "' (", ref.path,
                                   ") that this run does not use"));
  }

 private:
  static std::string reference_name(const RunModel& m) { return m.name.empty() ? "model" : m.name; }

  std::vector<RunModel> models_;
  NamedTensors saved_;
  std::map<std::string, ModelReference> references_;
  std::vector<std::string> auxiliary_;
};

// The keys that may name a token dataset, with their paths.
std::vector<std::pair<std::string, std::string>> dataset_keys(const RunConfig& config) {
  return {{"data.train", config.data.train}, {"data.val", config.data.val}};
}

// The token datasets a run reads (data.train, data.val), as checkpoint counters
// "dataset.<key>.tokens", ".documents" and ".crc32" (TokenDatasetIdentity): a resume on other
// contents would continue the run on other data.
DataState dataset_identities(const RunConfig& config) {
  DataState out;
  for (const auto& [key, path] : dataset_keys(config)) {
    if (path.empty() || !is_token_dataset_path(path)) continue;
    TokenDatasetIdentity id;
    try {
      id = read_token_dataset_identity(path);
    } catch (const Error& e) {
      if (e.code() != ExitCode::data) throw;
      throw Error(ExitCode::data, key + ": " + e.what());
    }
    out["dataset." + key + ".tokens"] = id.num_tokens;
    out["dataset." + key + ".documents"] = id.num_documents;
    out["dataset." + key + ".crc32"] = int64_t(id.crc32);
  }
  return out;
}

// Error(data) naming the split's key when a dataset the checkpoint recorded has other contents
// now (a checkpoint without the counters predates them, or read text).
void check_same_datasets(const RunConfig& config, const DataState& now, const DataState& saved,
                         const fs::path& file) {
  for (const auto& [key, path] : dataset_keys(config)) {
    const std::string p = "dataset." + key + ".";
    auto identity = [&p](const DataState& s) -> std::optional<TokenDatasetIdentity> {
      if (!s.count(p + "tokens") || !s.count(p + "documents") || !s.count(p + "crc32"))
        return std::nullopt;
      return TokenDatasetIdentity{s.at(p + "tokens"), s.at(p + "documents"),
                                  uint32_t(s.at(p + "crc32"))};
    };
    const std::optional<TokenDatasetIdentity> was = identity(saved), is = identity(now);
    if (!was || was == is) continue;
    throw Error(ExitCode::data,
                detail::concat(key, ": ", quoted_path(path), ": the dataset changed since ",
                               file.string(), " was written (then ", was->describe(), ", now ",
                               is ? is->describe() : std::string("not a token dataset"),
                               "); use another output_dir, or train.resume: never"));
  }
}

// Loads the latest checkpoint into the trained models and the optimizer; returns the step to
// continue from.
int64_t resume(const RunConfig& config, const RunModels& models, optim::Optimizer& optimizer,
               const Recipe& recipe, const DataState& datasets, ProgressPrinter& progress) {
  std::string warning;
  std::optional<fs::path> file = latest_checkpoint(config.output_dir, &warning);
  if (!warning.empty()) progress.message("forge: warning: " + warning);
  if (!file) return 0;
  CheckpointInfo info = read_checkpoint_info(*file);
  check_same_model(config, info.config_yaml, *file);
  models.check_references(info, *file);
  check_same_datasets(config, datasets, info.counters, *file);
  CheckpointData data = load_checkpoint(*file, specs_of(models.saved()));
  NoGradGuard no_grad;
  for (size_t i = 0; i < data.model.size(); ++i) {
    Tensor target = models.saved()[i].tensor;
    target.copy_(data.model[i].tensor);
  }
  optimizer.load_state(data.optim);
  if (recipe.restore_data_state) recipe.restore_data_state(data.counters);
  progress.message(detail::concat("resuming from ", file->string(), " (step ", data.step, ")"));
  return data.step;
}

// A sharded optimizer's state is gathered from the ranks tensor by tensor as it is written: the
// other ranks join the gathers (TrainingRun::save).
void save_run(const RunConfig& config, int64_t step, const RunModels& models,
              const optim::Optimizer& optimizer, const optim::ShardedAdamW* sharded,
              const Recipe& recipe, const DataState& datasets, ProgressPrinter& progress) {
  CheckpointData data;
  data.step = step;
  data.config_yaml = to_yaml(config);
  data.model = models.saved();
  if (sharded)
    data.optim_stream = [sharded](const std::function<void(const NamedTensor&)>& write) {
      sharded->gather_state(write);
    };
  else
    data.optim = optimizer.state();
  data.references = models.references();
  data.auxiliary = models.auxiliary();
  data.counters["rng.seed"] = config.seed;
  if (recipe.data_state) data.counters.merge(recipe.data_state());
  data.counters.insert(datasets.begin(), datasets.end());
  fs::path file = save_checkpoint(config.output_dir, data, int(config.train.keep_last));
  progress.message("saved " + file.string());
}

// With train.shard_optimizer, the recipe's AdamW trained with its state sharded over the ranks.
std::unique_ptr<optim::ShardedAdamW> shard(const RunConfig& config, optim::Optimizer& optimizer) {
  if (!config.train.shard_optimizer) return nullptr;
  const auto* adamw = dynamic_cast<const optim::AdamW*>(&optimizer);
  if (!adamw)
    throw Error(ExitCode::usage,
                detail::concat("train.shard_optimizer shards AdamW's state only; recipe ",
                               config.recipe, " trains with ", optimizer.name()));
  return std::make_unique<optim::ShardedAdamW>(*adamw, world_comm());
}

// The updates of one step: under nan_policy: skip some may have been skipped. A step is logged
// and evaluated when any applied, with the lr and gradient norm of its last applied update.
struct StepUpdates {
  int64_t applied = 0, skipped = 0;
  UpdateResult last_applied{};
};

// The shared update policy behind both step forms.
class Updater final : public StepContext {
 public:
  Updater(const RunConfig& config, optim::Optimizer& optimizer, ProgressPrinter& progress,
          std::function<void(int64_t step, int64_t micro)> skip)
      : config_(config),
        optimizer_(optimizer),
        progress_(progress),
        schedule_(schedule_spec(config)),
        params_(optimizer.parameters()),
        arena_(params_, world_comm(), int64_t(config.train.allreduce_bucket_mb * 1048576.0),
               config.train.allreduce_overlap, config.train.shard_optimizer),
        skip_(std::move(skip)) {}

  void begin(int64_t step) {
    step_ = step;
    forwards_ = 0;
    updates_ = {};
    seed_dropout(config_, step_, forwards_);
  }
  int64_t step() const override { return step_; }

  UpdateResult accumulate_and_update(
      int64_t n, const std::function<MicroBatchLoss(int64_t micro)>& micro) override {
    // Dropout follows the micro-batch's index, not the rank that runs it.
    AccumulatedLoss acc = accumulate_gradients(
        arena_, n,
        [&](int64_t m) {
          seed_dropout(config_, step_, forwards_ + m);
          return micro(m);
        },
        [&](int64_t m) {
          if (skip_) skip_(step_, m);
        });
    forwards_ += n;
    return update(std::move(acc));
  }

  UpdateResult backward_and_update(const MicroBatchLoss& loss) override {
    forwards_++;
    AccumulatedLoss acc = accumulate_gradients(arena_, 1, [&](int64_t) { return loss; });
    return update(std::move(acc));
  }

  // The updates of the step begun last.
  const StepUpdates& updates() const { return updates_; }

 private:
  UpdateResult update(AccumulatedLoss acc) {
    UpdateResult r{std::move(acc)};
    const int64_t step = step_ + 1;
    const double loss = r.accumulated.loss;
    // The division by the number of targets measured the gradients' norm on the way: only a
    // non-finite one calls for the scan that names the parameter.
    const double norm = std::sqrt(r.accumulated.grad_sum_squares);
    std::optional<std::string> bad_grad;
    if (!std::isfinite(norm)) bad_grad = optim::first_nonfinite_grad(params_);
    if (!std::isfinite(loss) || bad_grad) {
      std::string what =
          std::isfinite(loss)
              ? detail::concat("non-finite gradient in '", *bad_grad, "' at step ", step)
              : detail::concat("non-finite loss (", loss, ") at step ", step,
                               bad_grad ? "; first non-finite gradient in '" + *bad_grad + "'" : "");
      if (config_.train.nan_policy == "abort") abort_numerical(what);
      progress_.message("forge: warning: " + what + ": update skipped (train.nan_policy: skip)");
      arena_.reset();
      r.skipped = true;
    } else {
      r.grad_norm = norm;
      const double factor = optim::clip_factor(norm, config_.train.clip_grad_norm);
      if (factor != 1.0) arena_.scale(factor);
      r.lr = optim::learning_rate(schedule_, step_);
      optimizer_.step(r.lr);
      arena_.gather_parameters();
      arena_.reset();
      // A finite loss and gradient can still overflow the weights (a learning rate far too high);
      // such a model must never reach a checkpoint, and no policy can skip an applied update.
      if (std::optional<std::string> bad = optim::first_nonfinite_param(params_))
        abort_numerical(detail::concat("non-finite parameter '", *bad,
                                       "' after the update of step ", step, " (lr ", r.lr,
                                       ": too high?)"));
    }
    seed_dropout(config_, step_, forwards_);
    if (r.skipped) {
      updates_.skipped++;
    } else {
      updates_.applied++;
      updates_.last_applied = r;
    }
    return r;
  }

  [[noreturn]] void abort_numerical(const std::string& what) {
    progress_.finish();
    std::optional<fs::path> good = latest_checkpoint(config_.output_dir);
    throw Error(ExitCode::numerical,
                what + (good ? " (last good checkpoint: " + good->string() + ")"
                             : " (no checkpoint was written yet)"));
  }

  const RunConfig& config_;
  optim::Optimizer& optimizer_;
  ProgressPrinter& progress_;
  const optim::ScheduleSpec schedule_;
  const NamedTensors params_;
  optim::GradArena arena_;
  const std::function<void(int64_t step, int64_t micro)> skip_;
  int64_t step_ = 0, forwards_ = 0;
  StepUpdates updates_{};
};

std::string describe_metrics(const Metrics& metrics) {
  std::string s;
  for (const Metric& m : metrics) {
    char buf[64];
    if (m.value.kind() == MetricValue::Kind::integer)
      std::snprintf(buf, sizeof buf, "%s%s %lld", s.empty() ? "" : ", ", m.key.c_str(),
                    (long long)m.value.as_double());
    else
      std::snprintf(buf, sizeof buf, "%s%s %.4f", s.empty() ? "" : ", ", m.key.c_str(),
                    m.value.as_double());
    s += buf;
  }
  return s;
}

// One call of run_training, set up: the run directory (rank 0's), the models resumed or fresh, and
// what the loop does besides training: progress and train lines, evaluations, samples, checkpoints
// and stopping. Under mpirun every rank trains; rank 0 alone reads the terminal's attention and
// writes the run directory (config.yaml, metrics, report, checkpoints), and it alone evaluates and
// samples; the others wait for it at the agreements on stopping.
class TrainingRun {
 public:
  TrainingRun(const RunConfig& config, const std::vector<RunModel>& model_list,
              optim::Optimizer& optimizer, const Recipe& recipe)
      : config_(config),
        sharded_(shard(config, optimizer)),
        optimizer_(sharded_ ? *sharded_ : optimizer),
        recipe_(recipe),
        dir_(config.output_dir),
        lead_(world_comm().rank() == 0),
        quiet_(lead_ ? nullptr : std::fopen("/dev/null", "w"), &std::fclose),
        progress_(config.train.max_steps, lead_ && ProgressPrinter::is_terminal(stderr),
                  lead_ ? stderr : quiet_.get()) {
    if (lead_) directory_.emplace(dir_, progress_);  // before anything in the directory is read
    check_run_files(dir_);  // every rank reads the run it resumes
    signals_.emplace();
    models_.emplace(model_list, optimizer);
    datasets_ = dataset_identities(config);
    // Nothing in the directory is written before the checkpoint to continue from has loaded.
    if (config.train.resume == "auto")
      start_ = resume(config, *models_, optimizer_, recipe, datasets_, progress_);
    else if (lead_)
      move_earlier_run_aside(dir_, progress_);
    if (start_ < 0)
      throw Error(ExitCode::checkpoint,
                  detail::concat((dir_ / "checkpoints").string(), ": the latest checkpoint has step ",
                                 start_, "; a step is never negative"));
    complete_ = run_complete(dir_, start_, config.train.max_steps);
    fault_point("setup");
    if (const SetupOutcome setup = join_setup(0); setup.failed_rank >= 0)
      throw PeerSetupFailed{setup.exit_code};
    check_ranks_resolved_one_config(printed_keys(config));
    check_ranks_agree(optimizer.parameters(), start_);
    if (lead_) write_file_atomic(dir_ / "config.yaml", to_yaml(config), ExitCode::usage);
    last_save_ = start_;
    if (complete_) {
      progress_.message(detail::concat("the run in ", dir_.string(), " is complete at step ",
                                       start_, "; raise train.max_steps to train further"));
      return;
    }
    const fs::path metrics_path = dir_ / "metrics.jsonl";
    if (start_ > 0 && lead_) truncate_after_step(metrics_path, start_);
    if (lead_) metrics_.emplace(metrics_path, /*append=*/start_ > 0);
    updater_.emplace(config, optimizer_, progress_, recipe.skip_micro_batch);
    models_->set_training();
    t0_ = std::chrono::steady_clock::now();
  }

  int64_t start() const { return start_; }
  bool complete() const { return complete_; }
  void message(const std::string& line) { progress_.message(line); }
  int64_t last_saved() const { return last_save_; }
  // The agreed stop request: the signal, or 0.
  int stop() const { return stop_; }
  int check_stop() { return stop_ = agree_on_stop(); }

  StepOutcome train_step(int64_t i) {
    optim::apply_unfreezing(optimizer_.groups(), i);
    if (recipe_.begin_step) recipe_.begin_step(i);
    updater_->begin(i);
    if (recipe_.custom_step) return recipe_.custom_step(*updater_);
    const UpdateResult r = updater_->accumulate_and_update(
        config_.train.grad_accum, [&](int64_t micro) { return recipe_.micro_batch(i, micro); });
    return {r.accumulated.loss, r.accumulated.sums};
  }

  // Shows step `step` unless train.nan_policy: skip skipped all its updates, and writes its train
  // line when `log`: the outcome's loss, the lr and gradient norm of its last applied update, and
  // over the steps since the previous line the throughput, the all-reduce waits and the updates
  // skipped. Returns whether any update of the step applied.
  bool show_step(int64_t step, const StepOutcome& outcome, bool log) {
    const StepUpdates& updates = updater_->updates();
    window_.skipped_updates += updates.skipped;
    if (updates.applied == 0) return false;
    const UpdateResult& last = updates.last_applied;
    const int64_t tokens = last.accumulated.num_tokens;
    window_.tokens += tokens > 0 ? tokens : recipe_.tokens_per_step;
    window_.wait_s += last.accumulated.allreduce_wait_s;
    window_.exposed_s += last.accumulated.allreduce_exposed_s;
    window_.steps++;
    const double now = elapsed();
    ProgressStats stats{step, outcome.loss, last.lr,
                        double(window_.tokens) / std::max(now - window_.start_s, 1e-9), now};
    progress_.step(stats);
    if (!log) return true;
    Metrics line = {{"loss", outcome.loss}, {"lr", last.lr}, {"grad_norm", last.grad_norm},
                    {"tokens_per_s", stats.tokens_per_s}, {"elapsed_s", now},
                    {"peak_mem_mb", double(allocator::stats().peak_bytes) / 1048576.0}};
    if (world_comm().size() > 1) {
      const double steps = double(std::max<int64_t>(window_.steps, 1));
      line.push_back({"allreduce_wait_s", window_.wait_s / steps});
      line.push_back({"allreduce_exposed_s", window_.exposed_s / steps});
    }
    if (config_.train.nan_policy == "skip")
      line.push_back({"skipped_updates", window_.skipped_updates});
    if (recipe_.train_metrics) {
      Metrics extra = recipe_.train_metrics(outcome.sums);
      line.insert(line.end(), extra.begin(), extra.end());
    }
    const Metrics& aux = last.accumulated.aux;
    line.insert(line.end(), aux.begin(), aux.end());
    if (lead_) metrics_->write(step, "train", line);
    progress_.log(stats);
    window_ = {now};
    return true;
  }

  // Returns the evaluation's "loss", or nullopt when a stop request cut it short: a partial
  // evaluation is not logged.
  std::optional<double> evaluate(int64_t step, bool full) {
    fault_point(step == config_.train.max_steps ? "final_eval" : "eval");
    Metrics val;
    if (lead_) {
      NoGradGuard no_grad;
      models_->set_eval();
      val = recipe_.evaluate(full);
      models_->set_training();
    }
    if (check_stop()) return std::nullopt;
    // tokens_per_s measures training: the next window starts after the evaluation.
    window_.start_s = elapsed();
    window_.tokens = 0;
    if (!lead_) return 0.0;
    metrics_->write(step, "val", val);
    progress_.message(detail::concat("step ", step, ": val ", describe_metrics(val)));
    for (const Metric& m : val)
      if (m.key == "loss") return m.value.as_double();
    return 0.0;
  }

  void show_sample() {
    if (std::optional<std::string> text = sample(); text && lead_) progress_.text(*text);
  }

  // After a save the other ranks wait for rank 0: an exit while it still writes would make mpirun
  // end the job, and the checkpoint with it. Every rank joins the gathers of a sharded state.
  void save(int64_t step) {
    if (lead_)
      save_run(config_, step, *models_, optimizer_, sharded_.get(), recipe_, datasets_, progress_);
    else if (sharded_)
      sharded_->gather_state([](const NamedTensor&) {});
    agree_max(0);
    last_save_ = step;
  }

  int stopped(const std::string& when) {
    progress_.finish();
    if (lead_)
      std::fprintf(stderr, "forge: stopped by %s %s\n", stop_signal_name(stop_), when.c_str());
    return stop_exit_code(stop_);
  }

  void end_progress() { progress_.finish(); }

  // The end of a run: the report, then a sample of the model's text.
  int report_and_sample(int64_t final_step) {
    if (lead_) {
      fault_point("report");
      write_report(dir_);
    }
    std::optional<std::string> text;
    if (!check_stop() && recipe_.sample) text = sample();
    if (stop_)
      return stopped(detail::concat("after the final evaluation of step ", final_step));
    if (text && lead_) std::printf("%s\n", text->c_str());
    return 0;
  }

 private:
  // A sample of the model's text: rank 0's only.
  std::optional<std::string> sample() {
    std::optional<std::string> text;
    if (lead_) {
      fault_point("sample");
      text = recipe_.sample();
    }
    if (check_stop()) return std::nullopt;
    return text;
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  const RunConfig& config_;
  const std::unique_ptr<optim::ShardedAdamW> sharded_;
  optim::Optimizer& optimizer_;  // the recipe's, or sharded_
  const Recipe& recipe_;
  const fs::path dir_;
  const bool lead_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet_;
  ProgressPrinter progress_;
  std::optional<RunDirectory> directory_;
  std::optional<SignalScope> signals_;
  std::optional<RunModels> models_;
  DataState datasets_;  // dataset_identities(config_), taken before training reads a batch
  std::optional<MetricsWriter> metrics_;
  std::optional<Updater> updater_;
  int64_t start_ = 0, last_save_ = 0;
  bool complete_ = false;
  int stop_ = 0;
  std::chrono::steady_clock::time_point t0_{};
  // The steps since the previous train line.
  struct Window {
    double start_s = 0, wait_s = 0, exposed_s = 0;
    int64_t tokens = 0, steps = 0, skipped_updates = 0;
  } window_;
};

}  // namespace

AccumulatedLoss accumulate_gradients(optim::GradArena& arena, int64_t n,
                                     const std::function<MicroBatchLoss(int64_t micro)>& micro,
                                     const std::function<void(int64_t micro)>& skip) {
  Comm& comm = arena.comm();
  const int64_t ranks = comm.size(), rank = comm.rank();
  double loss_sum = 0.0, aux_sum = 0.0;
  int64_t targets = 0, tokens = 0;
  bool has_aux = false;
  std::map<std::string, double> sums;
  std::map<std::string, std::pair<double, int64_t>> stats;
  nn::AuxCollector collector;
  int64_t last = -1;  // this rank's last micro-batch: its backward overlaps the all-reduce
  for (int64_t m = rank; m < n; m += ranks) last = m;
  for (int64_t m = 0; m < n; ++m) {
    if (m % ranks != rank) {
      if (skip) skip(m);
      continue;
    }
    MicroBatchLoss mb = micro(m);
    nn::AuxReport report = collector.take();
    Tensor objective = mb.loss_sum;
    if (!report.losses.empty()) {
      // An auxiliary loss is a mean over the micro-batch: weighted by its targets, it survives the
      // division by the step's total below as the target-weighted mean over micro-batches.
      Tensor aux = report.losses[0];
      for (size_t i = 1; i < report.losses.size(); ++i) aux = aux + report.losses[i];
      aux = mul(aux, double(mb.num_targets));
      objective = objective + aux;
      aux_sum += aux.item();
      has_aux = true;
    }
    if (m == last) arena.arm();
    objective.backward();
    loss_sum += mb.loss_sum.item();
    targets += mb.num_targets;
    tokens += mb.num_tokens;
    for (const auto& [key, value] : mb.sums) sums[key] += value;
    for (const auto& [key, stat] : report.stats) {
      stats[key].first += stat.first;
      stats[key].second += stat.second;
    }
  }
  NoGradGuard no_grad;
  const optim::GradArena::Wait waited = arena.reduce();
  if (ranks > 1) {
    // Every rank reports the same keys (one recipe, one model): checked by a hash, then summed.
    std::string keys;
    for (const auto& [key, value] : sums) keys += key + '\n';
    for (const auto& [key, stat] : stats) keys += key + '\n';
    const int64_t h = int64_t(fnv1a64(keys.data(), keys.size()) >> 2);
    int64_t same[2] = {h, -h};
    comm.allreduce_max(same, 2);
    FORGE_CHECK(same[0] == -same[1], "the ranks' micro-batches reported different metrics: ", keys);
    std::vector<double> v = {loss_sum, double(targets), aux_sum, double(has_aux), double(tokens)};
    for (const auto& [key, value] : sums) v.push_back(value);
    for (const auto& [key, stat] : stats) {
      v.push_back(stat.first);
      v.push_back(double(stat.second));
    }
    comm.allreduce_sum(v.data(), int64_t(v.size()));
    size_t i = 0;
    loss_sum = v[i++];
    targets = int64_t(v[i++]);
    aux_sum = v[i++];
    has_aux = v[i++] > 0;
    tokens = int64_t(v[i++]);
    for (auto& [key, value] : sums) value = v[i++];
    for (auto& [key, stat] : stats) {
      stat.first = v[i++];
      stat.second = int64_t(v[i++]);
    }
  }
  double scale = targets > 0 ? 1.0 / double(targets) : 0.0;
  const double sum_squares = arena.scale(scale);
  Metrics aux;
  if (has_aux) aux.push_back({"aux_loss", aux_sum * scale});
  for (const auto& [key, stat] : stats) aux.push_back({key, stat.first / double(stat.second)});
  return {targets > 0 ? loss_sum / double(targets) : 0.0, targets, std::move(sums),
          std::move(aux), sum_squares, waited.waited, waited.exposed, tokens};
}

int run_training(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 const Recipe& recipe) {
  return run_training(config, std::vector<RunModel>{RunModel{"", &model}}, optimizer, recipe);
}

int run_training(const RunConfig& config, const std::vector<RunModel>& model_list,
                 optim::Optimizer& optimizer, const Recipe& recipe) {
  FORGE_CHECK(bool(recipe.micro_batch) != bool(recipe.custom_step),
              "run_training: a recipe has either micro_batch or custom_step");
  if (world_comm().size() > 1) check_data_parallel(config, recipe, world_comm().size());
  const TrainConfig& tc = config.train;
  const RunPrecision precision = resolve_precision(tc);
  const MatmulPrecisionScope precision_scope(precision.matmul);
  TrainingRun run(config, model_list, optimizer, recipe);
  if (run.complete()) return 0;
  if (!precision.line.empty()) run.message(precision.line);

  if (run.start() == 0 && recipe.eval_at_start && !run.evaluate(0, /*full=*/true))
    return run.stopped("during the evaluation before the first step (no step to save); the same "
                       "command starts over");
  for (int64_t i = run.start(); i < tc.max_steps; ++i) {
    const int64_t step = i + 1;  // steps completed after this iteration
    const StepOutcome outcome = run.train_step(i);
    run.check_stop();
    const bool log_step = step % tc.log_every == 0 || step == tc.max_steps;
    if (log_step) check_ranks_agree(optimizer.parameters(), step);
    if (run.show_step(step, outcome, log_step)) {
      if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != tc.max_steps && !run.stop())
        run.evaluate(step, /*full=*/false);
      if (tc.sample_every > 0 && recipe.sample && step % tc.sample_every == 0 && !run.stop())
        run.show_sample();
    }
    if (run.stop()) {
      run.save(step);
      return run.stopped(detail::concat("at step ", step, "; resume with the same command"));
    }
    if (tc.save_every > 0 && step % tc.save_every == 0) run.save(step);
    fault_after_step(step);
  }

  const int64_t final_step = tc.max_steps;
  // Every update passed the finite-parameter check: the last step is saved before the final
  // evaluation, which can then fail or be stopped without losing a step.
  if (run.last_saved() != final_step) run.save(final_step);
  // The whole split, always. Stopped during it, the same command runs it again.
  const std::optional<double> final_loss = run.evaluate(final_step, /*full=*/true);
  if (!final_loss)
    return run.stopped(detail::concat("during the final evaluation of step ", final_step,
                                      "; the same command finishes it"));
  run.end_progress();
  if (agree_max(!std::isfinite(*final_loss)))
    throw Error(ExitCode::numerical,
                detail::concat("the final validation loss at step ", final_step, " is ",
                               *final_loss, "; step ", final_step, " is saved in ",
                               checkpoint_path(config.output_dir, final_step).string()));
  return run.report_and_sample(final_step);
}

}  // namespace forge
