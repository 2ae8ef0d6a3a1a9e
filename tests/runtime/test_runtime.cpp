// The runtime for runs of several models (runtime/trainer.h) and for initialising a model from
// another one's checkpoint (runtime/components.h): frozen models stay untouched, in eval mode and
// out of checkpoints, which reference them by digest; a custom step with several updates resumes
// exactly and is logged when any of its updates applied; adapters-only saves hold just the trained
// tensors; init_from maps names and names the offending file and tensor; a non-finite final
// evaluation fails after the last step is saved.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <functional>
#include <map>
#include <optional>

#include "core/allocator.h"
#include "core/ops.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "core/durable_file.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"
#include "runtime/metrics.h"
#include "runtime/trainer.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

RunConfig tiny_run(const fs::path& dir, int64_t steps) {
  RunConfig config = default_config();
  config.recipe = "gpt_pretrain";
  config.output_dir = dir.string();
  config.data.train = "tests/recipes/configs/tiny.txt";
  config.model.norm_placement = "pre";
  config.train.max_steps = steps;
  config.train.log_every = 1;
  config.train.keep_last = 0;
  return config;
}

std::unique_ptr<optim::Optimizer> adamw(const NamedTensors& params) {
  optim::OptimizerSpec spec;
  spec.name = "adamw";
  return optim::make_optimizer(spec, {optim::ParamGroup{params}});
}

// A checkpoint holding `module`'s state, as a frozen model's source.
fs::path save_source(const fs::path& run_dir, nn::Module& module) {
  CheckpointData data;
  data.step = 1;
  data.config_yaml = "recipe: gpt_pretrain\n";
  data.model = module.named_state();
  return save_checkpoint(run_dir, data, 0);
}

std::vector<double> values(const Tensor& t) { return t.contiguous().to_vector<double>(); }

struct TeacherRun {
  int64_t stop_after_step = -1;  // raise SIGTERM inside this step
  bool teacher_was_training = false;
  std::vector<double> teacher_after, student_after;
};

// A student Linear learns to match a frozen teacher Linear on inputs 1..k.
int train_with_teacher(const fs::path& dir, const fs::path& teacher_file, TeacherRun& run) {
  RunConfig config = tiny_run(dir, 5);
  Generator gen(3);
  nn::Linear student(1, 1, true, gen), teacher(1, 1, true, gen);
  init_from_checkpoint(teacher, teacher_file);
  auto optimizer = adamw(student.named_parameters());
  Recipe recipe;
  recipe.tokens_per_step = 1;
  recipe.micro_batch = [&](int64_t step, int64_t) {
    if (step + 1 == run.stop_after_step) std::raise(SIGTERM);
    run.teacher_was_training |= teacher.is_training();
    Tensor x = from_vector(std::vector<double>{double(step + 1)}, {1, 1});
    Tensor target = teacher.forward(x);
    EXPECT_FALSE(target.requires_grad());
    Tensor d = student.forward(x) - target;
    return MicroBatchLoss{sum(d * d), 1};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  int code = run_training(config, {{"", &student}, {"teacher", &teacher, false, false, teacher_file}},
                          *optimizer, recipe);
  run.teacher_after = values(teacher.weight);
  run.teacher_after.push_back(values(teacher.bias)[0]);
  run.student_after = values(student.weight);
  run.student_after.push_back(values(student.bias)[0]);
  return code;
}

TEST(Runtime, AFrozenModelIsUntouchedInEvalModeAndReferencedNotSaved) {
  testing::TempDir source_dir, run_dir;
  Generator gen(9);
  nn::Linear source(1, 1, true, gen);
  const fs::path teacher_file = save_source(source_dir.path(), source);
  std::vector<double> before = values(source.weight);
  before.push_back(values(source.bias)[0]);

  TeacherRun run;
  ASSERT_EQ(train_with_teacher(run_dir.path(), teacher_file, run), 0);
  EXPECT_EQ(run.teacher_after, before);  // bitwise
  EXPECT_FALSE(run.teacher_was_training);

  CheckpointInfo info = read_checkpoint_info(checkpoint_path(run_dir.path(), 5));
  std::vector<std::string> saved;
  for (const TensorSpec& s : info.model) saved.push_back(s.name);
  EXPECT_EQ(saved, (std::vector<std::string>{"weight", "bias"}));  // the student only
  ASSERT_EQ(info.references.count("teacher"), 1u);
  EXPECT_EQ(info.references.at("teacher").path, teacher_file.string());
  EXPECT_EQ(info.references.at("teacher").digest, file_digest(teacher_file, ExitCode::checkpoint));
}

TEST(Runtime, ResumeWithAFrozenModelIsExactAndRefusesAChangedSource) {
  testing::TempDir source_dir, whole_dir, split_dir;
  Generator gen(9);
  nn::Linear source(1, 1, true, gen);
  const fs::path teacher_file = save_source(source_dir.path(), source);

  TeacherRun whole, first, second;
  ASSERT_EQ(train_with_teacher(whole_dir.path(), teacher_file, whole), 0);
  first.stop_after_step = 3;
  ASSERT_EQ(train_with_teacher(split_dir.path(), teacher_file, first), 143);
  ASSERT_EQ(train_with_teacher(split_dir.path(), teacher_file, second), 0);
  EXPECT_EQ(second.student_after, whole.student_after);  // bitwise

  // The teacher's file changes under a stopped run: resuming would train against other targets.
  testing::TempDir third_dir;
  TeacherRun stopped, resumed;
  stopped.stop_after_step = 2;
  ASSERT_EQ(train_with_teacher(third_dir.path(), teacher_file, stopped), 143);
  {
    NoGradGuard no_grad;
    source.weight.copy_(full({1, 1}, 5.0));
  }
  save_source(source_dir.path(), source);  // step 1 again: same file name, new weights
  testing::expect_error(ExitCode::checkpoint, "now has digest",
                        [&] { train_with_teacher(third_dir.path(), teacher_file, resumed); });
}

struct CustomRun {
  int64_t stop_after_step = -1;
  std::vector<double> weights;
};

// Two updates per step on different inputs, as PPO's epochs over one rollout.
int train_custom(const fs::path& dir, CustomRun& run) {
  RunConfig config = tiny_run(dir, 4);
  Generator gen(5);
  nn::Linear model(2, 1, true, gen);
  auto optimizer = adamw(model.named_parameters());
  Recipe recipe;
  recipe.tokens_per_step = 2;
  recipe.custom_step = [&](StepContext& ctx) {
    if (ctx.step() + 1 == run.stop_after_step) std::raise(SIGTERM);
    double total = 0;
    for (int u = 0; u < 2; ++u) {
      Tensor x = from_vector(std::vector<double>{double(ctx.step()), double(u + 1)}, {1, 2});
      Tensor y = model.forward(x);
      UpdateResult r = ctx.backward_and_update(MicroBatchLoss{sum(y * y), 1});
      total += r.accumulated.loss;
    }
    return StepOutcome{total / 2, {{"updates", 2.0}}};
  };
  recipe.eval_at_start = true;
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  recipe.train_metrics = [](const std::map<std::string, double>& sums) {
    return Metrics{{"updates", sums.at("updates")}};
  };
  int code = run_training(config, model, *optimizer, recipe);
  run.weights = values(model.weight);
  return code;
}

TEST(Runtime, ACustomStepWithSeveralUpdatesResumesExactly) {
  testing::TempDir whole_dir, split_dir;
  CustomRun whole, first, second;
  ASSERT_EQ(train_custom(whole_dir.path(), whole), 0);
  first.stop_after_step = 3;
  ASSERT_EQ(train_custom(split_dir.path(), first), 143);
  ASSERT_EQ(train_custom(split_dir.path(), second), 0);
  EXPECT_EQ(second.weights, whole.weights);  // bitwise

  auto lines = [](const testing::TempDir& dir) {
    std::vector<std::string> out;
    for (const auto& r : read_metrics(dir.path() / "metrics.jsonl"))
      if (r.split == "train")
        out.push_back(std::to_string(r.step) + " " + std::to_string(*r.number("loss")) + " " +
                      std::to_string(*r.number("updates")));
    return out;
  };
  EXPECT_EQ(lines(split_dir), lines(whole_dir));
  EXPECT_EQ(lines(whole_dir).size(), 4u);
  // The initial model is evaluated once, at step 0, also when the run was resumed.
  for (const testing::TempDir* dir : {&whole_dir, &split_dir}) {
    std::vector<int64_t> val_steps;
    for (const auto& r : read_metrics(dir->path() / "metrics.jsonl"))
      if (r.split == "val") val_steps.push_back(r.step);
    EXPECT_EQ(val_steps, (std::vector<int64_t>{0, 4}));
  }
  // Two AdamW updates per step: the optimizer's step count is 8 after 4 steps.
  CheckpointData data = load_checkpoint(checkpoint_path(whole_dir.path(), 4),
                                        specs_of(nn::Linear(2, 1).named_state()));
  bool found = false;
  for (const NamedTensor& t : data.optim)
    if (t.name.find("step") != std::string::npos) {
      EXPECT_EQ(t.tensor.item(), 8.0) << t.name;
      found = true;
    }
  EXPECT_TRUE(found);
}

// Three updates a step under nan_policy: skip; the last update of step 2 and every update of step 3
// have a non-finite loss. Step 2 applied two updates: it is logged and evaluated like any other,
// its lr and grad_norm those of its last applied update; step 3 applied none.
TEST(Runtime, ACustomStepIsLoggedAndEvaluatedWhenAnyOfItsUpdatesApplied) {
  testing::TempDir dir;
  RunConfig config = tiny_run(dir.path(), 4);
  config.train.nan_policy = "skip";
  config.train.eval_every = 2;
  Generator gen(5);
  nn::Linear model(2, 1, true, gen);
  auto optimizer = adamw(model.named_parameters());
  Recipe recipe;
  recipe.custom_step = [&](StepContext& ctx) {
    const int64_t step = ctx.step() + 1;
    double total = 0;
    int applied = 0;
    for (int u = 0; u < 3; ++u) {
      Tensor y = model.forward(ones({1, 2}));
      Tensor loss = sum(y * y);
      if ((step == 2 && u == 2) || step == 3) loss = mul(loss, NAN);
      UpdateResult r = ctx.backward_and_update(MicroBatchLoss{loss, 1});
      if (r.skipped) continue;
      total += r.accumulated.loss;
      applied++;
    }
    return StepOutcome{applied > 0 ? total / applied : 0.0};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  ASSERT_EQ(run_training(config, model, *optimizer, recipe), 0);

  std::map<int64_t, MetricsRecord> train;
  std::vector<int64_t> val_steps;
  for (const MetricsRecord& r : read_metrics(dir.path() / "metrics.jsonl")) {
    if (r.split == "train") train.emplace(r.step, r);
    if (r.split == "val") val_steps.push_back(r.step);
  }
  ASSERT_EQ(train.size(), 3u);
  ASSERT_EQ(train.count(2), 1u);
  EXPECT_EQ(val_steps, (std::vector<int64_t>{2, 4}));
  // Updates skipped since the previous train line: step 3's three are counted in step 4's.
  EXPECT_EQ(train.at(1).number("skipped_updates"), std::optional<double>(0.0));
  EXPECT_EQ(train.at(2).number("skipped_updates"), std::optional<double>(1.0));
  EXPECT_EQ(train.at(4).number("skipped_updates"), std::optional<double>(3.0));
  EXPECT_GT(*train.at(2).number("lr"), 0.0);
  EXPECT_GT(*train.at(2).number("grad_norm"), 0.0);
  EXPECT_TRUE(std::isfinite(*train.at(2).number("loss")));
}

TEST(Runtime, AdaptersOnlyModelsSaveTheTrainedTensorsAndReferenceTheirBase) {
  testing::TempDir base_dir, run_dir;
  Generator gen(2);
  nn::Linear base(3, 2, true, gen);
  const fs::path base_file = save_source(base_dir.path(), base);
  nn::Linear model(3, 2, true, gen);
  init_from_checkpoint(model, base_file);
  model.weight.set_requires_grad(false);  // only the bias trains, as adapters would
  auto optimizer = adamw({{"bias", model.bias}});
  RunConfig config = tiny_run(run_dir.path(), 2);
  Recipe recipe;
  recipe.micro_batch = [&](int64_t, int64_t) {
    return MicroBatchLoss{sum(model.forward(ones({1, 3}))), 1};
  };
  recipe.evaluate = [](bool) { return Metrics{{"loss", 0.0}}; };
  ASSERT_EQ(run_training(config, {{"", &model, true, true, base_file}}, *optimizer, recipe), 0);
  CheckpointInfo info = read_checkpoint_info(checkpoint_path(run_dir.path(), 2));
  ASSERT_EQ(info.model.size(), 1u);
  EXPECT_EQ(info.model[0].name, "bias");
  EXPECT_EQ(info.references.at("model").digest, file_digest(base_file, ExitCode::checkpoint));
  EXPECT_EQ(values(model.weight), values(base.weight));  // the frozen base never moved
}

TEST(InitFrom, RenamesAllowsMissingAndUnexpectedAndNamesTheOffender) {
  // A "teacher" of three blocks; the "student" takes blocks 0 and 2 as its 0 and 1.
  struct Stack : nn::Module {
    explicit Stack(int n, Generator& gen) {
      blocks = register_module("blocks", std::make_shared<nn::ModuleList<nn::Linear>>());
      for (int i = 0; i < n; ++i) blocks->push_back(std::make_shared<nn::Linear>(2, 2, true, gen));
      head = register_module("head", std::make_shared<nn::Linear>(2, 1, true, gen));
    }
    std::shared_ptr<nn::ModuleList<nn::Linear>> blocks;
    std::shared_ptr<nn::Linear> head;
  };
  testing::TempDir dir;
  Generator gen(4);
  Stack teacher(3, gen), student(2, gen);
  const fs::path file = save_source(dir.path(), teacher);

  InitOptions options;
  options.rename = {{"blocks.2.", "blocks.1."}, {"blocks.1.", "dropped.1."}};
  options.allow_unexpected = {"dropped.*"};
  InitReport report = init_from_checkpoint(student, file, options);
  EXPECT_EQ(report.copied, 6);
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"blocks.1.weight", "blocks.1.bias"}));
  EXPECT_EQ(values((*student.blocks)[1]->weight), values((*teacher.blocks)[2]->weight));
  EXPECT_EQ(values((*student.blocks)[0]->bias), values((*teacher.blocks)[0]->bias));

  // Without the allowance, the unused teacher block is an error naming the file and tensor.
  options.allow_unexpected = {};
  testing::expect_error(ExitCode::checkpoint, file.string() + ": tensor 'blocks.1.weight' has no place",
                        [&] { init_from_checkpoint(student, file, options); });
  // A head of another shape names both.
  struct Wide : nn::Module {
    explicit Wide(Generator& gen) { head = register_module("head", std::make_shared<nn::Linear>(2, 3, true, gen)); }
    std::shared_ptr<nn::Linear> head;
  } other(gen);
  InitOptions lenient;
  lenient.allow_unexpected = {"blocks.*"};
  testing::expect_error(ExitCode::checkpoint, "'head.weight' of the model is f32 [3, 2]",
                        [&] { init_from_checkpoint(other, file, lenient); });
  // A model tensor the checkpoint lacks, unless allowed to stay at its init.
  Stack deeper(4, gen);
  testing::expect_error(ExitCode::checkpoint, "has no tensor for 'blocks.3.weight'",
                        [&] { init_from_checkpoint(deeper, file); });
  InitOptions keep;
  keep.allow_missing = {"blocks.3.*"};
  EXPECT_EQ(init_from_checkpoint(deeper, file, keep).missing,
            (std::vector<std::string>{"blocks.3.weight", "blocks.3.bias"}));
  // A missing file.
  testing::expect_error(ExitCode::checkpoint, "missing.h5",
                        [&] { init_from_checkpoint(student, dir.path() / "missing.h5"); });
}

TEST(InitFrom, KeepsNoCopyOfTheFilesTensorsInTheAllocatorsCache) {
  // Once copied, the tensors read from the file are freed into the caching allocator, in the sizes
  // of the weights, which a training step's activations seldom take: kept there, they would hold
  // a second copy of a fine-tune's base for the whole run (514 MiB of SmolLM2-135M's 2.8 GB peak).
  testing::TempDir dir;
  Generator gen(4);
  nn::Linear source(256, 512, true, gen), target(256, 512, true, gen);
  const fs::path file = save_source(dir.path(), source);
  init_from_checkpoint(target, file);
  EXPECT_LT(allocator::stats().cached_bytes, size_t(256 * 512 * 4));
  EXPECT_EQ(values(target.weight), values(source.weight));
}

TEST(InitFrom, HoldsOneTensorOfTheFileAtATime) {
  // Each tensor is copied into the model as it is read: loading a 1B-parameter base costs its own
  // size plus its largest tensor, not twice the model.
  struct Stack : nn::Module {
    explicit Stack(Generator& gen) {
      blocks = register_module("blocks", std::make_shared<nn::ModuleList<nn::Linear>>());
      for (int i = 0; i < 4; ++i)
        blocks->push_back(std::make_shared<nn::Linear>(256, 512, false, gen));
    }
    std::shared_ptr<nn::ModuleList<nn::Linear>> blocks;
  };
  testing::TempDir dir;
  Generator gen(4);
  Stack source(gen), target(gen);
  const fs::path file = save_source(dir.path(), source);
  const size_t one = 256 * 512 * 4;
  allocator::reset_peak();
  const size_t before = allocator::stats().current_bytes;
  init_from_checkpoint(target, file);
  EXPECT_LE(allocator::stats().peak_bytes - before, one);
  EXPECT_EQ(values((*target.blocks)[3]->weight), values((*source.blocks)[3]->weight));
}

TEST(InitFrom, ABf16WeightTakesTheFilesF32ValuesRounded) {
  testing::TempDir dir;
  Generator gen(4);
  nn::Linear source(64, 32, true, gen), target(64, 32, true, gen);
  const fs::path file = save_source(dir.path(), source);
  target.weight.set_requires_grad(false);
  target.weight.reset_storage_(DType::bf16);  // a frozen base narrowed before its file is read
  init_from_checkpoint(target, file);
  ASSERT_EQ(target.weight.dtype(), DType::bf16);
  EXPECT_EQ(values(target.weight.to(DType::f32)),
            values(source.weight.detach().to(DType::bf16).to(DType::f32)));
  EXPECT_EQ(values(target.bias), values(source.bias));
}

// A one-weight model trained with plain SGD on loss = w * x; `evaluate` is the recipe's.
int train_linear(const fs::path& dir, double lr, const std::function<Metrics(bool)>& evaluate,
                 int64_t save_every = 1) {
  RunConfig config = tiny_run(dir, 3);
  config.optimizer.lr = lr;
  config.train.save_every = save_every;
  Generator gen(1);
  nn::Linear model(1, 1, false, gen);
  optim::OptimizerSpec spec;
  spec.name = "sgd";
  auto optimizer = optim::make_optimizer(spec, {optim::ParamGroup{model.named_parameters()}});
  Recipe recipe;
  recipe.micro_batch = [&](int64_t, int64_t) {
    return MicroBatchLoss{sum(model.forward(ones({1, 1}))), 1};
  };
  recipe.evaluate = evaluate;
  return run_training(config, model, *optimizer, recipe);
}

TEST(Runtime, AnUpdateThatOverflowsTheWeightsStopsBeforeAnythingIsSaved) {
  testing::TempDir dir;
  // The loss and gradient of step 1 are finite; the update (lr * 1 in f32) is not.
  testing::expect_error(ExitCode::numerical, "non-finite parameter 'weight' after the update of step 1",
                        [&] { train_linear(dir.path(), 1e39, [](bool) { return Metrics{{"loss", 0.0}}; }); });
  EXPECT_FALSE(latest_checkpoint(dir.path()));
}

// Every update passed the finite-parameter check, so the steps since the last periodic save (step
// 2) reach a checkpoint before the final evaluation fails.
TEST(Runtime, ANonFiniteFinalEvaluationIsANumericalErrorAfterTheLastStepIsSaved) {
  testing::TempDir dir;
  testing::expect_error(ExitCode::numerical, "the final validation loss at step 3 is nan", [&] {
    train_linear(
        dir.path(), 0.1, [](bool full) { return Metrics{{"loss", full ? NAN : 0.0}}; },
        /*save_every=*/2);
  });
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_path(dir.path(), 3));
}

// The stopped final evaluation is cut short and not logged; the checkpoint of the last step is
// written, and the same command finishes the run (the evaluation, then nothing more).
TEST(Runtime, ASignalDuringTheFinalEvaluationSavesAndTheSameCommandFinishesIt) {
  testing::TempDir dir;
  bool stop = true;
  auto evaluate = [&](bool full) {
    if (full && stop) std::raise(SIGTERM);
    return Metrics{{"loss", 0.5}};
  };
  auto val_steps = [&] {
    std::vector<int64_t> steps;
    for (const auto& r : read_metrics(dir.path() / "metrics.jsonl"))
      if (r.split == "val") steps.push_back(r.step);
    return steps;
  };
  EXPECT_EQ(train_linear(dir.path(), 0.1, evaluate), 143);
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_path(dir.path(), 3));
  EXPECT_EQ(val_steps(), (std::vector<int64_t>{}));
  EXPECT_FALSE(fs::exists(dir.path() / "report.html"));
  stop = false;
  EXPECT_EQ(train_linear(dir.path(), 0.1, evaluate), 0);
  EXPECT_EQ(val_steps(), (std::vector<int64_t>{3}));
  EXPECT_TRUE(fs::exists(dir.path() / "report.html"));
  EXPECT_EQ(train_linear(dir.path(), 0.1, evaluate), 0);  // complete: nothing is run again
  EXPECT_EQ(val_steps(), (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace forge
