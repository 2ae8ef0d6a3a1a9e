// The shared training loop. Every source of randomness in a step is a function of (seed, step):
// batches come from the recipe's counter-based sampler, dropout from the default generator set to
// stream ("dropout", step) before each forward. A checkpoint therefore needs only the trained
// parameters, optimizer state, the step and, for recipes whose loader keeps a cursor, that cursor,
// to continue exactly the trajectory of an uninterrupted run; frozen models and LoRA bases are
// reloaded from their sources, whose digests the checkpoint records.
#include "runtime/trainer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <string_view>

#include "core/allocator.h"
#include "core/checksum.h"
#include "core/comm.h"
#include "core/durable_file.h"
#include "core/ops.h"
#include "nn/aux_loss.h"
#include "optim/clip.h"
#include "optim/groups.h"
#include "optim/schedule.h"
#include "runtime/checkpoint.h"
#include "runtime/report.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }
bool g_setup_joined = false;

// The largest of the ranks' values: how the ranks of a data-parallel run take one decision.
int64_t agree_max(int64_t value) {
  world_comm().allreduce_max(&value, 1);
  return value;
}

// The stop request the run acts on. A signal may reach one rank only (kill, a scheduler) and at any
// moment: the ranks read their flags at the same points of the run and adopt the strongest request
// any of them saw, so that every decision to stop is taken by all of them after the same step.
int agree_on_stop() {
  const int64_t signal = g_stop_signal;
  return int(world_comm().size() == 1 ? signal : agree_max(signal));
}

// The ranks apply the same updates to the same weights. A checksum of every trained tensor,
// compared across ranks, catches a divergence (a rank that resumed another checkpoint, a kernel
// that is not deterministic) before the run trains N different models in silence.
void check_ranks_agree(const NamedTensors& params, int64_t step) {
  Comm& comm = world_comm();
  if (comm.size() == 1) return;
  uint32_t crc = 0;
  for (const NamedTensor& p : params) {
    Tensor t = p.tensor.contiguous();
    crc = crc32(t.raw_data(), size_t(t.numel()) * dtype_size(t.dtype()), crc);
  }
  int64_t v[4] = {step, -step, int64_t(crc), -int64_t(crc)};
  comm.allreduce_max(v, 4);
  if (v[0] != -v[1])
    throw AgreedError(
        ExitCode::checkpoint,
        detail::concat("the ranks resumed from different steps (", -v[1], " to ", v[0],
                       "): every rank must see the same run directory (a shared filesystem, "
                       "docs/distributed.md)"));
  if (v[2] != -v[3])
    throw AgreedError(ExitCode::internal,
                      detail::concat("the ranks' weights differ at step ", step, " (rank ",
                                     comm.rank(), " has checksum ", crc,
                                     "): they no longer train one model"));
}

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

const char* stop_signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }
int stop_exit_code(int signal) { return signal == SIGINT ? 130 : 143; }

// Under mpirun, FORGE_TEST_RANK=<r> limits the fault injection below to rank r.
bool fault_rank() {
  const char* rank = std::getenv("FORGE_TEST_RANK");
  return !rank || std::atoi(rank) == world_comm().rank();
}

// Fault injection for the signal tests: FORGE_TEST_RAISE=<SIGINT|SIGTERM>@<point> raises the signal
// whenever the run reaches <point> (setup, eval, final_eval, sample, report), so a test stops a run
// inside one deterministically instead of racing a kill against it; ERROR@<point> throws a data
// error there instead (an error of one rank under mpirun).
void fault_point(std::string_view point) {
  const char* spec = std::getenv("FORGE_TEST_RAISE");
  if (!spec || !fault_rank()) return;
  const std::string_view s = spec;
  const size_t at = s.find('@');
  if (at == std::string_view::npos || s.substr(at + 1) != point) return;
  if (s.substr(0, at) == "ERROR")
    throw Error(ExitCode::data, detail::concat("FORGE_TEST_RAISE: an error at ", point));
  std::raise(s.substr(0, at) == "SIGINT" ? SIGINT : SIGTERM);
}

// Installs SIGINT/SIGTERM handlers for the lifetime of a run, restoring the previous ones after;
// a stop request outlives neither.
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
    g_stop_signal = 0;
  }

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

// output_dir is the user's choice: a path under a read-only directory, or below a file, is a usage
// error naming it, not a filesystem exception.
void create_run_directory(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // also fails (ENOTDIR) when dir exists as a file
  if (ec)
    throw Error(ExitCode::usage, detail::concat("output_dir ", dir.string(),
                                                ": cannot create the run directory: ", ec.message()));
}

// An advisory lock on the run directory while a trainer uses it: flock(2) on <run>/train.lock,
// which holds the owner's pid for the message a second trainer prints. The kernel drops the lock
// when its process dies, however it dies, so a killed run resumes at once. The file stays behind:
// removing it would let a waiting and a new trainer lock two different files.
class RunDirectoryLock {
 public:
  RunDirectoryLock(const fs::path& dir, ProgressPrinter& progress) {
    const fs::path file = dir / "train.lock";
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error(ExitCode::usage, detail::concat(file.string(), ": cannot create the lock file: ",
                                                  std::strerror(errno)));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
        progress.message(detail::concat("forge: warning: ", file.string(),
                                        ": cannot record this process's pid: ", std::strerror(errno)));
      return;
    }
    const int err = errno;
    if (err != EWOULDBLOCK) {  // a filesystem without flock (some network mounts): train unguarded
      progress.message(detail::concat("forge: warning: ", file.string(), ": cannot lock (",
                                      std::strerror(err),
                                      "); a second trainer on this directory would not be noticed"));
      return;
    }
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    std::string holder(buf, size_t(std::max<ssize_t>(n, 0)));
    holder.erase(holder.find_last_not_of("\n") + 1);
    ::close(fd_);
    throw Error(ExitCode::usage,
                detail::concat(dir.string(), ": in use by another forge train (pid ",
                               holder.empty() ? "unknown" : holder, ", holding ", file.string(),
                               "); wait for it or stop it, or choose another output_dir"));
  }
  ~RunDirectoryLock() { ::close(fd_); }
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  int fd_ = -1;
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

// Loads the latest checkpoint into the trained models and the optimizer; returns the step to
// continue from.
int64_t resume(const RunConfig& config, const RunModels& models, optim::Optimizer& optimizer,
               const Recipe& recipe, ProgressPrinter& progress) {
  std::string warning;
  std::optional<fs::path> file = latest_checkpoint(config.output_dir, &warning);
  if (!warning.empty()) progress.message("forge: warning: " + warning);
  if (!file) return 0;
  CheckpointInfo info = read_checkpoint_info(*file);
  check_same_model(config, info.config_yaml, *file);
  models.check_references(info, *file);
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

// A fresh directory for an earlier run's record: <run>/previous-<UTC time>, with -2, -3 ... when
// that name is taken, so an earlier moved-aside run is never overwritten.
fs::path claim_previous_directory(const fs::path& dir) {
  const std::time_t now = std::time(nullptr);
  std::tm utc = {};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  for (int n = 1;; ++n) {
    std::string name = std::string("previous-") + stamp;
    if (n > 1) name += '-' + std::to_string(n);
    const fs::path candidate = dir / name;
    std::error_code ec;
    if (fs::create_directory(candidate, ec)) return candidate;
    if (ec)
      throw Error(ExitCode::usage,
                  detail::concat(candidate.string(), ": cannot create it to move the earlier run "
                                 "aside (train.resume: never): ", ec.message(),
                                 "; nothing was moved"));
  }
}

// train.resume: never starts over without losing the earlier run: its record moves into
// previous-<UTC time>/ by one rename per entry. A crash between two renames leaves every file in
// one of the two places. checkpoints/ goes last: moved first, a crash would leave metrics.jsonl
// beside no checkpoint, and the next run, starting from step 0, would overwrite it.
void move_earlier_run_aside(const fs::path& dir, ProgressPrinter& progress) {
  std::vector<std::string> entries;
  std::error_code ec;
  for (const char* name : {"metrics.jsonl", "report.html", "checkpoints"})
    if (fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found) entries.push_back(name);
  if (entries.empty()) return;  // a config.yaml alone records nothing worth keeping
  if (fs::exists(fs::symlink_status(dir / "config.yaml", ec)))
    entries.insert(entries.begin(), "config.yaml");
  const fs::path previous = claim_previous_directory(dir);
  std::string moved;
  for (const std::string& name : entries) {
    fs::rename(dir / name, previous / name, ec);
    if (ec)
      throw Error(ExitCode::usage,
                  detail::concat(dir.string(), ": cannot move ", name, " aside to ",
                                 previous.string(), " (train.resume: never): ", ec.message(),
                                 moved.empty() ? "; nothing was moved" : "; moved already:" + moved,
                                 "; nothing was deleted"));
    moved += " " + name + (name == "checkpoints" ? "/" : "");
  }
  progress.message(detail::concat("train.resume is never: moved the earlier run (", moved.substr(1),
                                  ") to ", previous.string()));
}

void save(const RunConfig& config, int64_t step, const RunModels& models,
          optim::Optimizer& optimizer, const Recipe& recipe, ProgressPrinter& progress) {
  CheckpointData data;
  data.step = step;
  data.config_yaml = to_yaml(config);
  data.model = models.saved();
  data.optim = optimizer.state();
  data.references = models.references();
  data.auxiliary = models.auxiliary();
  data.counters["rng.seed"] = config.seed;
  if (recipe.data_state) data.counters.merge(recipe.data_state());
  fs::path file = save_checkpoint(config.output_dir, data, int(config.train.keep_last));
  progress.message("saved " + file.string());
}

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
               config.train.allreduce_overlap),
        skip_(std::move(skip)) {}

  void begin(int64_t step) {
    step_ = step;
    forwards_ = 0;
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

  const UpdateResult& last() const { return last_; }

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
      arena_.reset();
      // A finite loss and gradient can still overflow the weights (a learning rate far too high);
      // such a model must never reach a checkpoint, and no policy can skip an applied update.
      if (std::optional<std::string> bad = optim::first_nonfinite_param(params_))
        abort_numerical(detail::concat("non-finite parameter '", *bad,
                                       "' after the update of step ", step, " (lr ", r.lr,
                                       ": too high?)"));
    }
    seed_dropout(config_, step_, forwards_);
    last_ = r;
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
  UpdateResult last_{};
};

// Whether metrics.jsonl holds a val line for `step`.
bool has_val_line(const fs::path& metrics_path, int64_t step) {
  for (const MetricsRecord& r : read_metrics(metrics_path))
    if (r.split == "val" && r.step == step) return true;
  return false;
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

AccumulatedLoss accumulate_gradients(optim::GradArena& arena, int64_t n,
                                     const std::function<MicroBatchLoss(int64_t micro)>& micro,
                                     const std::function<void(int64_t micro)>& skip) {
  Comm& comm = arena.comm();
  const int64_t ranks = comm.size(), rank = comm.rank();
  double loss_sum = 0.0, aux_sum = 0.0;
  int64_t targets = 0;
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
    std::vector<double> v = {loss_sum, double(targets), aux_sum, double(has_aux)};
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
          std::move(aux), sum_squares, waited.waited, waited.exposed};
}

SetupOutcome join_setup(int exit_code) {
  Comm& comm = world_comm();
  g_setup_joined = true;
  if (comm.size() == 1) return exit_code ? SetupOutcome{0, exit_code} : SetupOutcome{};
  int64_t v[2] = {exit_code, exit_code ? comm.size() - comm.rank() : 0};
  comm.allreduce_max(v, 2);
  if (v[1] == 0) return {};
  return {int(comm.size() - v[1]), int(v[0])};
}

bool setup_joined() { return g_setup_joined; }

int run_training(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 const Recipe& recipe) {
  return run_training(config, std::vector<RunModel>{RunModel{"", &model}}, optimizer, recipe);
}

int run_training(const RunConfig& config, const std::vector<RunModel>& model_list,
                 optim::Optimizer& optimizer, const Recipe& recipe) {
  FORGE_CHECK(bool(recipe.micro_batch) != bool(recipe.custom_step),
              "run_training: a recipe has either micro_batch or custom_step");
  Comm& comm = world_comm();
  // Under mpirun every rank trains; rank 0 alone reads the terminal's attention and writes the
  // run directory (config.yaml, metrics, report, checkpoints), and it alone evaluates and samples.
  const bool lead = comm.rank() == 0;
  if (comm.size() > 1) check_data_parallel(config, recipe, comm.size());
  const TrainConfig& tc = config.train;
  const fs::path dir = config.output_dir;
  if (lead) create_run_directory(dir);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> quiet(
      lead ? nullptr : std::fopen("/dev/null", "w"), &std::fclose);
  ProgressPrinter progress(tc.max_steps, lead && ProgressPrinter::is_terminal(stderr),
                           lead ? stderr : quiet.get());
  std::optional<RunDirectoryLock> lock;
  if (lead) lock.emplace(dir, progress);  // before anything in the directory is read
  SignalScope signals;
  const RunModels models(model_list, optimizer);

  // Nothing in the directory is written before the checkpoint to continue from has loaded.
  int64_t start = 0;
  if (tc.resume == "auto")
    start = resume(config, models, optimizer, recipe, progress);
  else if (lead)
    move_earlier_run_aside(dir, progress);
  if (start < 0)
    throw Error(ExitCode::checkpoint,
                detail::concat((dir / "checkpoints").string(), ": the latest checkpoint has step ",
                               start, "; a step is never negative"));
  const fs::path metrics_path = dir / "metrics.jsonl";
  // A run stopped during its final evaluation has its last checkpoint but no final val line: the
  // same command finishes it.
  const bool complete =
      start > tc.max_steps || (start == tc.max_steps && has_val_line(metrics_path, start));
  fault_point("setup");
  if (const SetupOutcome setup = join_setup(0); setup.failed_rank >= 0)
    throw PeerSetupFailed{setup.exit_code};
  check_ranks_agree(optimizer.parameters(), start);
  if (lead) write_file_atomic(dir / "config.yaml", to_yaml(config), ExitCode::usage);
  if (complete) {
    progress.message(detail::concat("the run in ", dir.string(), " is complete at step ", start,
                                    "; raise train.max_steps to train further"));
    return 0;
  }
  if (start > 0 && lead) truncate_after_step(metrics_path, start);
  std::optional<MetricsWriter> metrics;
  if (lead) metrics.emplace(metrics_path, /*append=*/start > 0);
  // After a save the other ranks wait for rank 0: an exit while it still writes would make mpirun
  // end the job, and the checkpoint with it.
  auto save_all = [&](int64_t step) {
    if (lead) save(config, step, models, optimizer, recipe, progress);
    agree_max(0);
  };

  // Fault injection for the kill-and-resume test: die by SIGKILL right after this step.
  const char* crash_env = std::getenv("FORGE_TEST_SIGKILL_AFTER_STEP");
  const int64_t crash_at = crash_env && fault_rank() ? std::atoll(crash_env) : -1;
  Updater updater(config, optimizer, progress, recipe.skip_micro_batch);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double window_start = 0.0, window_wait = 0.0, window_exposed = 0.0;
  int64_t window_tokens = 0, window_steps = 0, last_save = start;

  // Returns the evaluation's "loss", or nullopt when a stop request cut it short: a partial
  // evaluation is not logged. Under mpirun the other ranks wait at the agreement on stopping.
  int stop = 0;  // the agreed stop request: the signal, or 0
  auto run_eval = [&](int64_t step, bool full) -> std::optional<double> {
    fault_point(step == tc.max_steps ? "final_eval" : "eval");
    Metrics val;
    if (lead) {
      NoGradGuard no_grad;
      models.set_eval();
      val = recipe.evaluate(full);
      models.set_training();
    }
    if ((stop = agree_on_stop())) return std::nullopt;
    // tokens_per_s measures training: the next window starts after the evaluation.
    window_start = elapsed();
    window_tokens = 0;
    if (!lead) return 0.0;
    metrics->write(step, "val", val);
    progress.message(detail::concat("step ", step, ": val ", describe_metrics(val)));
    for (const Metric& m : val)
      if (m.key == "loss") return m.value.as_double();
    return 0.0;
  };
  auto stopped = [&](const std::string& when) {
    progress.finish();
    if (lead)
      std::fprintf(stderr, "forge: stopped by %s %s\n", stop_signal_name(stop), when.c_str());
    return stop_exit_code(stop);
  };
  // A sample of the model's text: rank 0's only.
  auto sample = [&]() -> std::optional<std::string> {
    std::optional<std::string> text;
    if (lead) {
      fault_point("sample");
      text = recipe.sample();
    }
    if ((stop = agree_on_stop())) return std::nullopt;
    return text;
  };

  if (start == 0 && recipe.eval_at_start) {
    run_eval(0, /*full=*/true);
    if (stop)
      return stopped("during the evaluation before the first step (no step to save); the same "
                     "command starts over");
  }
  models.set_training();
  for (int64_t i = start; i < tc.max_steps; ++i) {
    const int64_t step = i + 1;  // steps completed after this iteration
    optim::apply_unfreezing(optimizer.groups(), i);
    if (recipe.begin_step) recipe.begin_step(i);
    updater.begin(i);

    StepOutcome outcome;
    if (recipe.custom_step) {
      outcome = recipe.custom_step(updater);
    } else {
      UpdateResult r = updater.accumulate_and_update(
          tc.grad_accum, [&](int64_t micro) { return recipe.micro_batch(i, micro); });
      outcome = {r.accumulated.loss, r.accumulated.sums};
    }
    stop = agree_on_stop();
    const UpdateResult& last = updater.last();
    const bool log_step = step % tc.log_every == 0 || step == tc.max_steps;
    if (log_step) check_ranks_agree(optimizer.parameters(), step);
    if (!last.skipped) {
      window_tokens += recipe.tokens_per_step;
      window_wait += last.accumulated.allreduce_wait_s;
      window_exposed += last.accumulated.allreduce_exposed_s;
      window_steps++;
      double now = elapsed();
      ProgressStats stats{step, outcome.loss, last.lr,
                          double(window_tokens) / std::max(now - window_start, 1e-9), now};
      progress.step(stats);
      if (log_step) {
        Metrics line = {{"loss", outcome.loss}, {"lr", last.lr}, {"grad_norm", last.grad_norm},
                        {"tokens_per_s", stats.tokens_per_s}, {"elapsed_s", now},
                        {"peak_mem_mb", double(allocator::stats().peak_bytes) / 1048576.0}};
        if (comm.size() > 1) {
          const double steps = double(std::max<int64_t>(window_steps, 1));
          line.push_back({"allreduce_wait_s", window_wait / steps});
          line.push_back({"allreduce_exposed_s", window_exposed / steps});
        }
        if (recipe.train_metrics) {
          Metrics extra = recipe.train_metrics(outcome.sums);
          line.insert(line.end(), extra.begin(), extra.end());
        }
        const Metrics& aux = last.accumulated.aux;
        line.insert(line.end(), aux.begin(), aux.end());
        if (lead) metrics->write(step, "train", line);
        progress.log(stats);
        window_start = now;
        window_tokens = 0;
        window_wait = window_exposed = 0.0;
        window_steps = 0;
      }
      if (tc.eval_every > 0 && step % tc.eval_every == 0 && step != tc.max_steps && !stop)
        run_eval(step, false);
      if (tc.sample_every > 0 && recipe.sample && step % tc.sample_every == 0 && !stop)
        if (std::optional<std::string> text = sample(); text && lead) progress.text(*text);
    }
    if (stop) {
      save_all(step);
      return stopped(detail::concat("at step ", step, "; resume with the same command"));
    }
    if (tc.save_every > 0 && step % tc.save_every == 0) {
      save_all(step);
      last_save = step;
    }
    if (step == crash_at) std::raise(SIGKILL);
  }

  const int64_t final_step = tc.max_steps;
  // The whole split, always. Stopped during it, the run saves its final step and exits; resuming
  // runs the evaluation again.
  const std::optional<double> final_loss = run_eval(final_step, /*full=*/true);
  if (agree_max(final_loss && !std::isfinite(*final_loss))) {
    progress.finish();
    throw Error(ExitCode::numerical,
                detail::concat("the final validation loss at step ", final_step, " is ",
                               final_loss ? *final_loss : NAN));
  }
  if (last_save != final_step) save_all(final_step);
  if (!final_loss)
    return stopped(detail::concat("during the final evaluation of step ", final_step,
                                  "; the same command finishes it"));
  progress.finish();
  if (lead) {
    fault_point("report");
    write_report(dir);
  }
  std::optional<std::string> text;
  if (!(stop = agree_on_stop()) && recipe.sample) text = sample();
  if (stop)
    return stopped(detail::concat("after the final evaluation of step ", final_step));
  if (text && lead) std::printf("%s\n", text->c_str());
  return 0;
}

bool stop_requested() { return g_stop_signal != 0; }

}  // namespace forge
