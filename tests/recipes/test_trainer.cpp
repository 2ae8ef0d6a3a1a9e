// The shared runtime's hooks for recipes: a data cursor that is checkpointed and restored (so a
// loader that keeps state resumes exactly), and recipe-specific sums that become train metrics.
// A one-parameter model keeps these runs to milliseconds.
#include <gtest/gtest.h>

#include <csignal>

#include "core/ops.h"
#include "nn/layers.h"
#include "recipes/checkpoint.h"
#include "recipes/metrics.h"
#include "recipes/trainer.h"
#include "tests/test_util.h"

namespace forge {
namespace {

struct CursorRun {
  std::vector<int64_t> consumed;  // the batch index every micro-batch read
  int64_t cursor = 0;
  int64_t stop_after_step = -1;  // raise SIGTERM inside this step
};

// Trains a bias-only Linear for 6 steps of 2 micro-batches; "batch" k is the number k.
int train_with_cursor(const std::string& dir, CursorRun& run) {
  RunConfig config = default_config();
  config.recipe = "gpt_pretrain";
  config.output_dir = dir;
  config.data.train = "tests/recipes/configs/tiny.txt";
  config.model.norm_placement = "pre";
  config.train.max_steps = 6;
  config.train.grad_accum = 2;
  config.train.log_every = 1;
  config.train.save_every = 0;
  config.train.keep_last = 0;
  Generator gen(1);
  nn::Linear model(1, 1, true, gen);
  auto optimizer = optim::make_optimizer(optim::OptimizerSpec{},
                                         {optim::ParamGroup{model.named_parameters()}});
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
  return run_training(config, model, *optimizer, recipe);
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

}  // namespace
}  // namespace forge
