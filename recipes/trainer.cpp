// The shared training loop. Every source of randomness in a step is a function of (seed, step):
// batches come from the recipe's counter-based sampler, dropout from the default generator set to
// stream ("dropout", step) before each micro-batch. A checkpoint therefore needs only parameters,
// optimizer state, the step and, for recipes whose loader keeps a cursor, that cursor, to continue
// exactly the trajectory of an uninterrupted run.
#include "recipes/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/allocator.h"
#include "core/ops.h"
#include "optim/clip.h"
#include "optim/groups.h"
#include "optim/schedule.h"
#include "recipes/checkpoint.h"
#include "recipes/report.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the lifetime of a run, restoring the previous ones after.
class SignalScope {
 public:
  SignalScope() {
    g_stop_signal = 0;
    struct sigaction sa = {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

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

// Dropout masks of micro-batch `micro` of step `step` (micro-batches take disjoint counter ranges).
void seed_dropout(const RunConfig& c, int64_t step, int64_t micro) {
  default_generator().set_state({uint64_t(c.seed), rng_stream("dropout", uint64_t(step)),
                                 uint64_t(micro) << 40});
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

// Loads the latest checkpoint into model and optimizer; returns the step to continue from.
int64_t resume(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
               const Recipe& recipe, ProgressPrinter& progress) {
  std::string warning;
  std::optional<fs::path> file = latest_checkpoint(config.output_dir, &warning);
  if (!warning.empty()) progress.message("forge: warning: " + warning);
  if (!file) return 0;
  CheckpointInfo info = read_checkpoint_info(*file);
  check_same_model(config, info.config_yaml, *file);
  CheckpointData data = load_checkpoint(*file, specs_of(model.named_state()));
  model.load_named(data.model);
  optimizer.load_state(data.optim);
  if (recipe.restore_data_state) recipe.restore_data_state(data.counters);
  progress.message(detail::concat("resuming from ", file->string(), " (step ", data.step, ")"));
  return data.step;
}

// Removes a previous run's checkpoints when the config asks for a fresh start.
void clear_checkpoints(const fs::path& dir, ProgressPrinter& progress) {
  fs::path ckpt = dir / "checkpoints";
  if (!fs::exists(ckpt)) return;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    fs::remove(entry.path());
    removed++;
  }
  if (removed)
    progress.message(detail::concat("train.resume is never: removed ", removed,
                                    " files of an earlier run in ", ckpt.string()));
}

void save(const RunConfig& config, int64_t step, nn::Module& model, optim::Optimizer& optimizer,
          const Recipe& recipe, ProgressPrinter& progress) {
  CheckpointData data;
  data.step = step;
  data.config_yaml = to_yaml(config);
  data.model = model.named_state();
  data.optim = optimizer.state();
  data.counters["rng.seed"] = config.seed;
  if (recipe.data_state) data.counters.merge(recipe.data_state());
  fs::path file = save_checkpoint(config.output_dir, data, int(config.train.keep_last));
  progress.message("saved " + file.string());
}

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

}  // namespace

AccumulatedLoss accumulate_gradients(const NamedTensors& params, int64_t n,
                                     const std::function<MicroBatchLoss(int64_t micro)>& micro) {
  double loss_sum = 0.0;
  int64_t targets = 0;
  std::map<std::string, double> sums;
  for (int64_t m = 0; m < n; ++m) {
    MicroBatchLoss mb = micro(m);
    mb.loss_sum.backward();
    loss_sum += mb.loss_sum.item();
    targets += mb.num_targets;
    for (const auto& [key, value] : mb.sums) sums[key] += value;
  }
  NoGradGuard no_grad;
  double scale = targets > 0 ? 1.0 / double(targets) : 0.0;
  for (NamedTensor p : params)
    if (p.tensor.grad().defined()) p.tensor.set_grad(mul(p.tensor.grad(), scale));
  return {targets > 0 ? loss_sum / double(targets) : 0.0, targets, std::move(sums)};
}

Metrics evaluate_model(nn::Module& model, const Recipe& recipe, bool full) {
  NoGradGuard no_grad;
  model.eval();
  Metrics metrics = recipe.evaluate(full);
  model.train();
  return metrics;
}

int run_training(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 const Recipe& recipe) {
  const TrainConfig& tc = config.train;
  const fs::path dir = config.output_dir;
  fs::create_directories(dir);
  ProgressPrinter progress(tc.max_steps, ProgressPrinter::is_terminal(stderr));
  SignalScope signals;

  int64_t start = 0;
  if (tc.resume == "auto")
    start = resume(config, model, optimizer, recipe, progress);
  else
    clear_checkpoints(dir, progress);
  write_file_atomic(dir / "config.yaml", to_yaml(config), ExitCode::usage);
  if (start >= tc.max_steps) {
    progress.message(detail::concat("the run in ", dir.string(), " is complete at step ", start,
                                    "; raise train.max_steps to train further"));
    return 0;
  }
  const fs::path metrics_path = dir / "metrics.jsonl";
  if (start > 0 && fs::exists(metrics_path)) truncate_after_step(metrics_path, start);
  MetricsWriter metrics(metrics_path, /*append=*/start > 0);

  // Fault injection for the kill-and-resume test: die by SIGKILL right after this step.
  const char* crash_env = std::getenv("FORGE_TEST_SIGKILL_AFTER_STEP");
  const int64_t crash_at = crash_env ? std::atoll(crash_env) : -1;
  const optim::ScheduleSpec schedule = schedule_spec(config);
  const NamedTensors params = optimizer.parameters();
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double window_start = 0.0;
  int64_t window_tokens = 0, last_save = start;

  auto run_eval = [&](int64_t step, bool full) {
    Metrics val = evaluate_model(model, recipe, full);
    metrics.write(step, "val", val);
    progress.message(detail::concat("step ", step, ": val ", describe_metrics(val)));
    // tokens_per_s measures training: the next window starts after the evaluation.
    window_start = elapsed();
    window_tokens = 0;
  };

  model.train();
  for (int64_t i = start; i < tc.max_steps; ++i) {
    const int64_t step = i + 1;  // updates completed after this iteration
    optim::apply_unfreezing(optimizer.groups(), i);

    const AccumulatedLoss acc = accumulate_gradients(params, tc.grad_accum, [&](int64_t micro) {
      seed_dropout(config, i, micro);
      return recipe.micro_batch(i, micro);
    });
    const double loss = acc.loss;

    std::optional<std::string> bad_grad = optim::first_nonfinite_grad(params);
    if (!std::isfinite(loss) || bad_grad) {
      std::string what =
          std::isfinite(loss)
              ? detail::concat("non-finite gradient in '", *bad_grad, "' at step ", step)
              : detail::concat("non-finite loss (", loss, ") at step ", step,
                               bad_grad ? "; first non-finite gradient in '" + *bad_grad + "'" : "");
      if (tc.nan_policy == "abort") {
        progress.finish();
        std::optional<fs::path> good = latest_checkpoint(dir);
        throw Error(ExitCode::numerical,
                    what + (good ? " (last good checkpoint: " + good->string() + ")"
                                 : " (no checkpoint was written yet)"));
      }
      progress.message("forge: warning: " + what + ": update skipped (train.nan_policy: skip)");
      optimizer.zero_grad();
      continue;
    }

    double grad_norm = optim::clip_grad_norm(
        params, tc.clip_grad_norm > 0 ? tc.clip_grad_norm : INFINITY);
    double lr = optim::learning_rate(schedule, i);
    optimizer.step(lr);
    optimizer.zero_grad();
    window_tokens += recipe.tokens_per_step;

    double now = elapsed();
    ProgressStats stats{step, loss, lr, double(window_tokens) / std::max(now - window_start, 1e-9),
                        now};
    progress.step(stats);
    if (step % tc.log_every == 0 || step == tc.max_steps) {
      Metrics line = {{"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                      {"tokens_per_s", stats.tokens_per_s}, {"elapsed_s", now},
                      {"peak_mem_mb", double(allocator::stats().peak_bytes) / 1048576.0}};
      if (recipe.train_metrics) {
        Metrics extra = recipe.train_metrics(acc.sums);
        line.insert(line.end(), extra.begin(), extra.end());
      }
      metrics.write(step, "train", line);
      progress.log(stats);
      window_start = now;
      window_tokens = 0;
    }
    if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != tc.max_steps) run_eval(step, false);
    if (tc.sample_every > 0 && recipe.sample && step % tc.sample_every == 0)
      progress.message(recipe.sample());
    if (g_stop_signal) {
      save(config, step, model, optimizer, recipe, progress);
      progress.finish();
      std::fprintf(stderr, "forge: stopped by %s at step %lld; resume with the same command\n",
                   g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)step);
      return g_stop_signal == SIGINT ? 130 : 143;
    }
    if (tc.save_every > 0 && step % tc.save_every == 0) {
      save(config, step, model, optimizer, recipe, progress);
      last_save = step;
    }
    if (step == crash_at) std::raise(SIGKILL);
  }

  const int64_t final_step = tc.max_steps;
  run_eval(final_step, /*full=*/true);  // the whole validation split, always
  if (last_save != final_step) save(config, final_step, model, optimizer, recipe, progress);
  progress.finish();
  write_report(dir);
  if (recipe.sample) std::printf("%s\n", recipe.sample().c_str());
  return 0;
}

}  // namespace forge
