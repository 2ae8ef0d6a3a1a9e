// The shared runtime's hooks for recipes: a data cursor that is checkpointed and restored (so a
// loader that keeps state resumes exactly), and recipe-specific sums that become train metrics.
// Its care of the run directory: stop requests honoured inside evaluations, samples and skipped
// steps; train.resume: never moving the earlier run aside; the directory lock; nothing written
// before a checkpoint has loaded; no directory that is not a run written into, no file of a run
// written through a symlink or opened when it is a FIFO. A one-parameter model keeps these runs to
// milliseconds.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <set>

#include "core/ops.h"
#include "data/tokenizer.h"
#include "nn/aux_loss.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "recipes/lm_objective.h"
#include "runtime/metrics.h"
#include "runtime/run_directory.h"
#include "runtime/trainer.h"
#include "tests/fake_comm.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

struct CursorRun {
  std::vector<int64_t> consumed;  // the batch index every micro-batch read
  int64_t cursor = 0;
  int64_t stop_after_step = -1;  // raise SIGTERM inside this step
};

// A run into `dir` of `steps` steps of 2 micro-batches, each logged, none saved.
RunConfig two_micro_batch_config(const std::string& dir, int64_t steps) {
  RunConfig config = default_config();
  config.recipe = "gpt_pretrain";
  config.output_dir = dir;
  config.data.train = "tests/recipes/configs/tiny.txt";
  config.model.norm_placement = "pre";
  config.train.max_steps = steps;
  config.train.grad_accum = 2;
  config.train.log_every = 1;
  config.train.save_every = 0;
  config.train.keep_last = 0;
  return config;
}

// A bias-only Linear and its optimizer: runs of it take milliseconds.
struct OneParameterModel {
  Generator gen{1};
  nn::Linear model{1, 1, true, gen};
  std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(
      optim::OptimizerSpec{}, {optim::ParamGroup{model.named_parameters()}});
};

// Trains a bias-only Linear for 6 steps of 2 micro-batches; "batch" k is the number k.
int train_with_cursor(const std::string& dir, CursorRun& run) {
  const RunConfig config = two_micro_batch_config(dir, 6);
  OneParameterModel one;
  nn::Linear& model = one.model;
  Recipe recipe;
  recipe.tokens_per_step = 2;
  recipe.micro_batch = [&](int64_t step, int64_t) {
    int64_t k = run.cursor++;
    run.consumed.push_back(k);
    if (step + 1 == run.stop_after_step) std::raise(SIGTERM);
    Tensor x = from_vector(std::vector<double>{double(k)}, {1, 1});
    return MicroBatchLoss{sum(model.forward(x)), 1, {{"seen", double(k)}, {"count", 1.0}}};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  recipe.train_metrics = [](const std::map<std::string, double>& sums) {
    return Metrics{{"mean_index", sums.at("seen") / sums.at("count")}};
  };
  recipe.data_state = [&] { return DataState{{"data.cursor", run.cursor}}; };
  recipe.restore_data_state = [&](const DataState& state) { run.cursor = state.at("data.cursor"); };
  return run_training(config, model, *one.optimizer, recipe);
}

// An auxiliary loss (nn/aux_loss.h) joins its micro-batch's objective weighted by the
// micro-batch's targets: micro-batches of 3 and 1 targets with per-target losses w and 2w and
// auxiliary losses w^2 and 2w^2 train on (3w + 2w) / 4 + (3w^2 + 2w^2) / 4, whose gradient at
// w = 2 is 5/4 + 10w/4 = 6.25; the loss is logged without the auxiliary part, which is logged as
// aux_loss, and statistics as their mean over the reports.
TEST(AccumulateGradients, AuxiliaryLossesAreWeightedByTheirMicroBatchTargets) {
  Tensor w = scalar(2.0, DType::f64).set_requires_grad(true);
  optim::GradArena arena({{"w", w}}, world_comm());
  AccumulatedLoss acc = accumulate_gradients(arena, 2, [&](int64_t m) {
    const int64_t targets = m == 0 ? 3 : 1;
    nn::report_aux_loss(w * w * double(m + 1));
    nn::report_aux_stat("cv_load_l1", double(m));
    return MicroBatchLoss{w * double(targets * (m + 1)), targets};
  });
  EXPECT_DOUBLE_EQ(acc.loss, 2.5);
  EXPECT_DOUBLE_EQ(w.grad().item(), 6.25);
  ASSERT_EQ(acc.aux.size(), 2u);
  EXPECT_EQ(acc.aux[0].key, "aux_loss");
  EXPECT_DOUBLE_EQ(acc.aux[0].value.as_double(), 5.0);
  EXPECT_EQ(acc.aux[1].key, "cv_load_l1");
  EXPECT_DOUBLE_EQ(acc.aux[1].value.as_double(), 0.5);
  // Without a report nothing is added or logged.
  arena.reset();
  AccumulatedLoss plain = accumulate_gradients(
      arena, 1, [&](int64_t) { return MicroBatchLoss{w * 3.0, 3}; });
  EXPECT_DOUBLE_EQ(w.grad().item(), 1.0);
  EXPECT_TRUE(plain.aux.empty());
}

// Micro-batches that count their real tokens (padding left out) set tokens_per_s: each train line's
// rate times the seconds since the previous line is the tokens of the steps between, not
// Recipe::tokens_per_step.
TEST(Trainer, TokensPerSecondCountsTheMicroBatchesRealTokens) {
  testing::TempDir dir;
  const RunConfig config = two_micro_batch_config(dir.path().string(), 5);
  OneParameterModel one;
  nn::Linear& model = one.model;
  Recipe recipe;
  recipe.tokens_per_step = 1000;
  recipe.micro_batch = [&](int64_t step, int64_t micro) {
    Tensor x = from_vector(std::vector<double>{1.0}, {1, 1});
    return MicroBatchLoss{.loss_sum = sum(model.forward(x)), .num_targets = 1, .sums = {},
                          .num_tokens = 3 + step + micro};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  ASSERT_EQ(run_training(config, model, *one.optimizer, recipe), 0);
  std::vector<MetricsRecord> train;
  for (const MetricsRecord& r : read_metrics(dir.path() / "metrics.jsonl"))
    if (r.split == "train") train.push_back(r);
  ASSERT_EQ(train.size(), 5u);
  for (size_t i = 1; i < train.size(); ++i) {
    const double seconds = *train[i].number("elapsed_s") - *train[i - 1].number("elapsed_s");
    const double tokens = *train[i].number("tokens_per_s") * seconds;
    const auto step = int64_t(i);  // 0-based index of the step logged on line i
    EXPECT_NEAR(tokens, double((3 + step) + (4 + step)), 1e-6 * tokens) << "line " << i;
  }
}

// Rank 1 of 2 runs micro-batches 1 and 3, skips 0 and 2 in order (a loader cursor stays in step),
// and reports the global numbers of targets and tokens.
TEST(AccumulateGradients, EachRankRunsItsShareOfTheMicroBatches) {
  Tensor a = ones({2, 3}).set_requires_grad(true);
  testing::FakeComm comm(1, 2);
  optim::GradArena arena({{"a", a}}, comm);
  std::vector<int64_t> ran, skipped, order;
  AccumulatedLoss acc = accumulate_gradients(
      arena, 4,
      [&](int64_t m) {
        ran.push_back(m);
        order.push_back(m);
        return MicroBatchLoss{mul(sum(a), double(m)), 3, {}, 5};
      },
      [&](int64_t m) {
        skipped.push_back(m);
        order.push_back(m);
      });
  EXPECT_EQ(ran, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(acc.num_targets, 12);
  EXPECT_EQ(acc.num_tokens, 20);
  // This rank's sum (1 + 3) * 6 and the other rank's equal one, over 12 targets.
  EXPECT_DOUBLE_EQ(acc.loss, 2 * 4 * 6.0 / 12);
  EXPECT_FLOAT_EQ(a.grad().data<float>()[0], 2 * 4 / 12.0f);
}

TEST(Trainer, ADataCursorIsCheckpointedAndRestoredOnResume) {
  testing::TempDir whole_dir, split_dir;
  CursorRun whole;
  ASSERT_EQ(train_with_cursor(whole_dir.path().string(), whole), 0);
  EXPECT_EQ(whole.consumed, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));

  // Stopped during step 3, then a new process (a fresh cursor) resumes from the checkpoint.
  CursorRun first;
  first.stop_after_step = 3;
  ASSERT_EQ(train_with_cursor(split_dir.path().string(), first), 143);
  auto info = read_checkpoint_info(checkpoint_path(split_dir.path(), 3));
  EXPECT_EQ(info.counters.at("data.cursor"), 6);
  CursorRun second;
  ASSERT_EQ(train_with_cursor(split_dir.path().string(), second), 0);
  EXPECT_EQ(second.consumed, (std::vector<int64_t>{6, 7, 8, 9, 10, 11}));

  // The train lines (recipe metrics included) equal the uninterrupted run's.
  auto lines = [](const testing::TempDir& dir) {
    std::vector<std::pair<int64_t, double>> out;
    for (const auto& r : read_metrics(dir.path() / "metrics.jsonl"))
      if (r.split == "train") out.emplace_back(r.step, *r.number("mean_index"));
    return out;
  };
  auto want = lines(whole_dir);
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(want[2], (std::pair<int64_t, double>{3, 4.5}));  // step 3 read batches 4 and 5
  EXPECT_EQ(lines(split_dir), want);
}

// A bias-only Linear trained with SGD for 6 steps on loss = bias (the run of `dir`); `setup` adapts
// the config and the recipe (whose evaluate returns loss 0).
int train_bias(const fs::path& dir, const std::function<void(RunConfig&, Recipe&)>& setup = {}) {
  RunConfig config = default_config();
  config.recipe = "gpt_pretrain";
  config.output_dir = dir.string();
  config.data.train = "tests/recipes/configs/tiny.txt";
  config.model.norm_placement = "pre";
  config.optimizer.name = "sgd";
  config.train.max_steps = 6;
  config.train.log_every = 1;
  config.train.save_every = 0;
  config.train.keep_last = 0;
  Recipe recipe;
  Generator gen(1);
  nn::Linear model(1, 1, true, gen);
  recipe.micro_batch = [&](int64_t, int64_t) {
    return MicroBatchLoss{sum(model.forward(zeros({1, 1}))), 1};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  if (setup) setup(config, recipe);
  optim::OptimizerSpec spec;
  spec.name = config.optimizer.name;
  auto optimizer = optim::make_optimizer(spec, {optim::ParamGroup{model.named_parameters()}});
  return run_training(config, model, *optimizer, recipe);
}

std::vector<int64_t> steps_of(const fs::path& dir, const std::string& split) {
  std::vector<int64_t> steps;
  for (const auto& r : read_metrics(dir / "metrics.jsonl"))
    if (r.split == split) steps.push_back(r.step);
  return steps;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Stopped in the second periodic evaluation (step 4), after two of its ten batches: the evaluation
// returns early and is not logged, step 4 is saved, and the resumed run goes on from there.
TEST(Trainer, AStopDuringAPeriodicEvaluationCutsItShortAndSavesTheCurrentStep) {
  testing::TempDir dir;
  int evaluations = 0, batches = 0;
  auto setup = [&](bool stop) {
    return [&, stop](RunConfig& config, Recipe& recipe) {
      config.train.eval_every = 2;
      recipe.evaluate = [&, stop](bool) {
        ++evaluations;
        for (int b = 0; b < 10 && !stop_requested(); ++b) {
          ++batches;
          if (stop && evaluations == 2 && b == 1) std::raise(SIGINT);
        }
        return Metrics{{"loss", 0.0}};
      };
    };
  };
  EXPECT_EQ(train_bias(dir.path(), setup(true)), 130);
  EXPECT_EQ(batches, 12);
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_path(dir.path(), 4));
  EXPECT_EQ(steps_of(dir.path(), "val"), (std::vector<int64_t>{2}));
  EXPECT_EQ(train_bias(dir.path(), setup(false)), 0);
  EXPECT_EQ(steps_of(dir.path(), "val"), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(steps_of(dir.path(), "train"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

// Stopped in the evaluation before the first step there is nothing to save: the same command
// starts over.
TEST(Trainer, AStopDuringTheEvaluationBeforeTheFirstStepSavesNothing) {
  testing::TempDir dir;
  bool stop = true;
  auto setup = [&](RunConfig&, Recipe& recipe) {
    recipe.eval_at_start = true;
    recipe.evaluate = [&](bool) {
      if (stop) std::raise(SIGINT);
      return Metrics{{"loss", 0.0}};
    };
  };
  EXPECT_EQ(train_bias(dir.path(), setup), 130);
  EXPECT_FALSE(stop_requested());  // the request ended with the run
  EXPECT_FALSE(latest_checkpoint(dir.path()));
  EXPECT_EQ(steps_of(dir.path(), "val"), (std::vector<int64_t>{}));
  stop = false;
  EXPECT_EQ(train_bias(dir.path(), setup), 0);
  EXPECT_EQ(steps_of(dir.path(), "val"), (std::vector<int64_t>{0, 6}));
}

// A step that nan_policy: skip skips is a step like another for a stop request.
TEST(Trainer, AStopDuringASkippedStepSavesIt) {
  testing::TempDir dir;
  EXPECT_EQ(train_bias(dir.path(),
                       [](RunConfig& config, Recipe& recipe) {
                         config.train.nan_policy = "skip";
                         auto finite = recipe.micro_batch;
                         recipe.micro_batch = [finite](int64_t step, int64_t micro) {
                           MicroBatchLoss loss = finite(step, micro);
                           if (step != 2) return loss;
                           std::raise(SIGTERM);
                           return MicroBatchLoss{mul(loss.loss_sum, NAN), 1};
                         };
                       }),
            143);
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_path(dir.path(), 3));
  EXPECT_EQ(steps_of(dir.path(), "train"), (std::vector<int64_t>{1, 2}));
}

// The recipes' evaluation and sampling loops poll stop_requested(): after a stop request lm_eval
// scores no batch after the first and sample_text generates no further token.
TEST(Trainer, LmEvalAndSamplingStopAtAStopRequest) {
  testing::TempDir dir;
  RunConfig small = default_config();
  small.model.vocab_size = 256;
  small.model.context = 8;
  small.model.d_model = 8;
  small.model.n_layers = 1;
  small.model.n_heads = 1;
  small.model.norm_placement = "pre";
  small.train.sample_tokens = 5;
  Generator gen(3);
  nn::GPT gpt(gpt_config(small.model), gen);
  auto tokens = std::make_shared<const std::vector<int32_t>>(64, 7);
  LMWindows windows(tokens, 8);
  std::unique_ptr<Tokenizer> bytes = make_tokenizer("bytes");
  const double one_batch = lm_eval(gpt, windows, 2, 1, false)[2].value.as_double();
  std::vector<int64_t> scored;
  std::vector<size_t> sample_sizes;
  EXPECT_EQ(train_bias(dir.path(),
                       [&](RunConfig&, Recipe& recipe) {
                         recipe.evaluate = [&](bool full) {
                           if (full) {
                             for (int stop = 0; stop < 2; ++stop) {
                               if (stop) std::raise(SIGTERM);
                               Metrics m = lm_eval(gpt, windows, 2, 0, true);
                               scored.push_back(int64_t(m[2].value.as_double()));
                               sample_sizes.push_back(sample_text(gpt, *bytes, "ab", small).size());
                             }
                           }
                           return Metrics{{"loss", 0.0}};
                         };
                       }),
            143);
  ASSERT_EQ(scored.size(), 2u);
  EXPECT_GT(scored[0], int64_t(one_batch));
  EXPECT_EQ(scored[1], int64_t(one_batch));
  EXPECT_EQ(sample_sizes[1], std::string("--- sample (5 tokens) ---\nab").size());
  EXPECT_GT(sample_sizes[0], sample_sizes[1]);
}

fs::path only_previous_directory(const fs::path& dir, size_t expected_count) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("previous-", 0) == 0) found.push_back(entry.path());
  EXPECT_EQ(found.size(), expected_count);
  std::sort(found.begin(), found.end());
  return found.empty() ? fs::path() : found.front();
}

// train.resume: never keeps the earlier run whole in previous-<UTC time>/ (a stray directory in
// checkpoints/ included), and a later fresh start never overwrites an earlier moved-aside run.
TEST(Trainer, ResumeNeverMovesTheEarlierRunAsideAndNeverOverwritesOne) {
  testing::TempDir dir;
  auto never = [](RunConfig& config, Recipe&) { config.train.resume = "never"; };
  ASSERT_EQ(train_bias(dir.path(), [](RunConfig& config, Recipe&) { config.train.save_every = 3; }), 0);
  fs::create_directory(dir.path() / "checkpoints" / "stray");
  const std::string metrics = read_file(dir.path() / "metrics.jsonl");
  const std::string config = read_file(dir.path() / "config.yaml");
  ASSERT_EQ(train_bias(dir.path(), never), 0);
  const fs::path previous = only_previous_directory(dir.path(), 1);
  EXPECT_EQ(read_file(previous / "metrics.jsonl"), metrics);
  EXPECT_EQ(read_file(previous / "config.yaml"), config);
  EXPECT_TRUE(fs::exists(previous / "report.html"));
  EXPECT_TRUE(fs::is_directory(previous / "checkpoints" / "stray"));
  EXPECT_EQ(latest_checkpoint(previous), checkpoint_path(previous, 6));
  EXPECT_TRUE(fs::exists(checkpoint_path(previous, 3)));
  EXPECT_EQ(steps_of(dir.path(), "train"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir.path(), 3)));  // the new run saved only its end

  ASSERT_EQ(train_bias(dir.path(), never), 0);  // possibly within the same second
  EXPECT_EQ(only_previous_directory(dir.path(), 2), previous);
  EXPECT_EQ(read_file(previous / "metrics.jsonl"), metrics);
  EXPECT_TRUE(fs::exists(checkpoint_path(previous, 3)));
}

// When previous-<UTC time> cannot be made (here: its path would pass PATH_MAX), the run refuses
// with a usage error and the earlier run stays where it was.
TEST(Trainer, ResumeNeverRefusesWhenItCannotMoveTheEarlierRunAside) {
  testing::TempDir tmp;
  const size_t length = 4076;  // train.lock fits in PATH_MAX (4096), previous-<UTC time>/ does not
  std::string path = tmp.path().string();
  while (path.size() + 250 < length) path += "/" + std::string(200, 'd');
  path += "/" + std::string(length - path.size() - 1, 'e');
  const fs::path dir = path;
  fs::create_directories(dir / "checkpoints");
  std::ofstream(dir / kRunMarker) << "";
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"split\": \"train\", \"loss\": 1.0}\n";
  testing::expect_error(ExitCode::usage, "nothing was moved", [&] {
    train_bias(dir, [](RunConfig& config, Recipe&) { config.train.resume = "never"; });
  });
  EXPECT_EQ(steps_of(dir, "train"), (std::vector<int64_t>{1}));
  EXPECT_TRUE(fs::is_directory(dir / "checkpoints"));
}

// A checkpoint whose step is negative is refused before metrics.jsonl or config.yaml is touched.
TEST(Trainer, ACheckpointWithANegativeStepChangesNothing) {
  testing::TempDir dir;
  ASSERT_EQ(train_bias(dir.path()), 0);
  const std::string metrics = read_file(dir.path() / "metrics.jsonl");
  const std::string config = read_file(dir.path() / "config.yaml");
  // The step attribute rewritten in place, as a corrupt or hostile file would carry it.
  hid_t file = H5Fopen(checkpoint_path(dir.path(), 6).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t attr = H5Aopen(file, "step", H5P_DEFAULT);
  const int64_t step = -3;
  ASSERT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &step), 0);
  H5Aclose(attr);
  H5Fclose(file);
  EXPECT_THROW(train_bias(dir.path(), [](RunConfig& c, Recipe&) { c.train.max_steps = 8; }), Error);
  EXPECT_EQ(read_file(dir.path() / "metrics.jsonl"), metrics);
  EXPECT_EQ(read_file(dir.path() / "config.yaml"), config);
}

// While a trainer holds <run>/train.lock, another one is refused naming the directory and the
// holder's pid; once it is released (as the kernel does when its process dies) training goes on.
TEST(Trainer, ASecondTrainerOnTheRunDirectoryIsRefusedNamingTheHolder) {
  testing::TempDir dir;
  const fs::path lock_file = dir.path() / "train.lock";
  std::ofstream(dir.path() / kRunMarker) << "";  // the holder made the directory a run
  int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  testing::expect_error(ExitCode::usage, dir.path().string() + ": in use by another forge train (pid 4242",
                        [&] { train_bias(dir.path()); });
  EXPECT_FALSE(fs::exists(dir.path() / "metrics.jsonl"));
  ::close(fd);
  EXPECT_EQ(train_bias(dir.path()), 0);
  EXPECT_EQ(read_file(lock_file), std::to_string(::getpid()) + "\n");
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    names.insert(entry.path().filename().string());
  return names;
}

// A directory holding anything but a run (the user's files, and no .forge-run) is refused before
// anything is written into it; an empty one becomes a run, marked.
TEST(Trainer, ADirectoryThatIsNotARunIsRefusedAndLeftAsItWas) {
  testing::TempDir dir;
  std::ofstream(dir.path() / "notes.txt") << "mine\n";
  std::ofstream(dir.path() / "config.yaml") << "mine too\n";
  testing::expect_error(ExitCode::usage,
                        "output_dir " + dir.path().string() +
                            ": exists, is not empty and is not a Forge run directory",
                        [&] { train_bias(dir.path()); });
  EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"config.yaml", "notes.txt"}));
  EXPECT_EQ(read_file(dir.path() / "config.yaml"), "mine too\n");
  testing::TempDir empty;
  ASSERT_EQ(train_bias(empty.path()), 0);
  EXPECT_TRUE(fs::is_regular_file(empty.path() / kRunMarker));
}

// A run written before markers existed is recognised by its checkpoints/LATEST naming a
// checkpoint: it resumes, and is marked from then on. Without a checkpoint it is not a run.
TEST(Trainer, ARunFromBeforeMarkersResumesAndIsMarked) {
  testing::TempDir dir;
  ASSERT_EQ(train_bias(dir.path()), 0);
  fs::remove(dir.path() / kRunMarker);
  ASSERT_EQ(train_bias(dir.path(), [](RunConfig& c, Recipe&) { c.train.max_steps = 8; }), 0);
  EXPECT_EQ(steps_of(dir.path(), "train"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(fs::is_regular_file(dir.path() / kRunMarker));
  fs::remove(dir.path() / kRunMarker);
  fs::remove(checkpoint_path(dir.path(), 8));
  testing::expect_error(ExitCode::usage, "is not a Forge run directory",
                        [&] { train_bias(dir.path()); });
}

// No file of a run is written through a symlink planted in its place: train.lock (which took the
// trainer's pid), metrics.jsonl (truncated), config.yaml, and checkpoints/ (whose *.tmp files a
// save deletes) pointing elsewhere are refused, naming them, and what they point to is unchanged.
TEST(Trainer, NoFileOfARunIsWrittenThroughASymlink) {
  testing::TempDir dir;
  const fs::path victim = dir.path() / "victim.txt", elsewhere = dir.path() / "elsewhere";
  const fs::path run = dir.path() / "run";
  std::ofstream(victim) << "the user's own\n";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere / "draft.tmp") << "the user's too\n";
  for (const std::string name : {"train.lock", "metrics.jsonl", "config.yaml", "checkpoints"}) {
    fs::remove_all(run);
    fs::create_directories(run);
    std::ofstream(run / kRunMarker) << "";
    fs::create_symlink(name == "checkpoints" ? elsewhere : victim, run / name);
    testing::expect_error(ExitCode::usage, (run / name).string() + ": is a symlink",
                          [&] { train_bias(run); });
    EXPECT_EQ(read_file(victim), "the user's own\n") << name;
    EXPECT_EQ(names_in(elsewhere), (std::set<std::string>{"draft.tmp"})) << name;
  }
}

// A run file that is a FIFO is refused, naming it, without being opened: reading metrics.jsonl or
// LATEST on resume used to wait forever for a writer.
TEST(Trainer, RunFilesThatAreFifosAreRefusedWithoutBlocking) {
  testing::TempDir dir;
  ASSERT_EQ(train_bias(dir.path()), 0);
  const fs::path metrics = dir.path() / "metrics.jsonl";
  const fs::path latest = dir.path() / "checkpoints" / "LATEST";
  for (const fs::path& file : {metrics, latest}) {
    const fs::path kept = file.string() + ".kept";
    fs::rename(file, kept);
    ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
    testing::expect_error(ExitCode::usage, file.string() + ": is a FIFO", [&] {
      train_bias(dir.path(), [](RunConfig& c, Recipe&) { c.train.max_steps = 8; });
    });
    fs::remove(file);
    fs::rename(kept, file);
  }
}

}  // namespace
}  // namespace forge
