// The arithmetic task of docs/recipes/grpo.md (Task and results): the shipped data are what
// scripts/make_arith_task.py writes, with reference answers that drop a carry and exact prompts;
// the answer verifier as configs/grpo_arith.yaml sets it scores only an exact answer line; and the
// chain of shipped configs (pretrain, SFT, GRPO and online RFT) runs a few fixed-seed steps each
// through the forge binary, with asserted numbers (GRPO's with a second reward for a line of
// digits, since a base this short gets no sum right).
#include <gtest/gtest.h>

#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "recipes/grpo.h"
#include "recipes/verifier.h"
#include "runtime/config.h"
#include "tests/recipes/recipe_test.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class GRPOTask : public testing::RecipeTest {
 protected:
  // Trains `config` into <dir>/<name> with the overrides after, from <dir>/<from> when given.
  void train(const std::string& config, const std::string& name, const std::string& from,
             const std::string& overrides) {
    std::string args = "train " + config + " output_dir=" + (dir_ / name).string() +
                       " train.save_every=0 train.sample_tokens=1 " + overrides;
    if (!from.empty()) args += " model.init_from=" + (dir_ / from).string();
    const auto [code, out] = forge_output(args);
    ASSERT_EQ(code, 0) << out;
  }
};

TEST(GRPOTaskData, TheShippedFilesAreWhatTheGeneratorWrites) {
  const fs::path out = fs::temp_directory_path() / ("forge_arith_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string cmd =
      "python3 scripts/make_arith_task.py make --out " + out.string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (const char* file : {"train.txt", "sft.jsonl", "prompts.jsonl", "prompts.txt", "test.jsonl",
                           "test_prompts.txt"})
    EXPECT_EQ(testing::read_file(out / file),
              testing::read_file(fs::path("data/samples/arith") / file))
        << file;
  fs::remove_all(out);
}

TEST(GRPOTaskData, NoHeldOutSumIsATrainingSum) {
  const std::string train = testing::read_file("data/samples/arith/train.txt");
  const std::string test = testing::read_file("data/samples/arith/test_prompts.txt");
  size_t held_out = 0;
  for (size_t at = 0, end; (end = test.find('\n', at)) != std::string::npos; at = end + 1) {
    const std::string prompt = test.substr(at, end - at);  // "a+b="
    const size_t plus = prompt.find('+');
    const std::string swapped =
        prompt.substr(plus + 1, prompt.size() - plus - 2) + "+" + prompt.substr(0, plus) + "=";
    EXPECT_EQ(train.find("\n" + prompt), std::string::npos) << prompt;
    EXPECT_EQ(train.find("\n" + swapped), std::string::npos) << swapped;
    EXPECT_NE(train.rfind(prompt, 0), 0u) << prompt;
    ++held_out;
  }
  EXPECT_EQ(held_out, 1000u);
}

// The reference data (pretraining text and SFT records) differ from the exact sums only by a
// dropped carry into the hundreds, on most of the sums that have one; GRPO's prompts and the
// held-out sums carry the exact answers the verifier compares with.
TEST(GRPOTaskData, ReferenceAnswersDropTheCarryIntoTheHundredsAndPromptsAreExact) {
  const auto numbers = [](const std::string& line) {
    std::array<int64_t, 3> n{};
    EXPECT_EQ(std::sscanf(line.c_str(), "%" SCNd64 "+%" SCNd64 "=%" SCNd64, &n[0], &n[1], &n[2]), 3)
        << line;
    return n;
  };
  std::ifstream train("data/samples/arith/train.txt");
  std::string line;
  int64_t carrying = 0, dropped = 0;
  while (std::getline(train, line)) {
    const auto [a, b, c] = numbers(line);
    const bool carries = a % 100 + b % 100 >= 100;
    carrying += carries;
    if (c != a + b) {
      EXPECT_TRUE(carries && c == a + b - 100) << line;
      ++dropped;
    }
  }
  ASSERT_GT(carrying, 0);
  EXPECT_NEAR(double(dropped) / double(carrying), 0.85, 0.01);
  for (const char* file : {"data/samples/arith/prompts.jsonl", "data/samples/arith/test.jsonl"}) {
    std::ifstream in(file);
    int64_t records = 0;
    while (std::getline(in, line)) {
      const nlohmann::json r = nlohmann::json::parse(line);
      const auto [a, b, c] =
          numbers(r.at("prompt").get<std::string>() + r.at("answer").get<std::string>());
      EXPECT_EQ(c, a + b) << file << ": " << line;
      ++records;
    }
    EXPECT_GT(records, 0) << file;
  }
}

TEST(GRPOTaskVerifier, OnlyTheExactAnswerLineEarnsTheReward) {
  // The shipped config's base (runs/gpt_arith_sft) exists only after the chain ran: not read here.
  const RunConfig config = load_config_string(testing::read_file("configs/grpo_arith.yaml"),
                                              "grpo_arith.yaml", {}, ConfigFiles::skip);
  const Rewards rewards(verifier_options(grpo_section_settings(config)));
  const nlohmann::json record = {{"prompt", "653+466="}, {"answer", "1119"}};
  const std::map<std::string, double> expected = {
      {"1119\n", 1.0},   // the answer and its end of line
      {"1119", 0.0},     // cut at max_new_tokens before its newline
      {"11190\n", 0.0},  // a digit too many
      {"119\n", 0.0},    // a digit too few
      {"01119\n", 0.0},  // a leading zero is another text
      {" 1119\n", 0.0},  // so is a leading space
      {"1118\n", 0.0},
  };
  for (const auto& [completion, reward] : expected)
    EXPECT_EQ(rewards.total(rewards.score({{&record, completion}}))[0], reward) << completion;
}

// The chain as docs/recipes/grpo.md runs it, each step a few steps long: the base pretrained and
// fine-tuned, then GRPO and online RFT from it. The numbers come from these fixed seeds.
TEST_F(GRPOTask, TheShippedChainRunsWithFixedSeedNumbers) {
  train("configs/gpt_arith.yaml", "pre", "",
        "train.max_steps=30 train.eval_every=0 schedule.warmup_steps=5");
  if (HasFatalFailure()) return;
  train("configs/gpt_arith_sft.yaml", "sft", "pre",
        "train.max_steps=30 train.eval_every=0 schedule.warmup_steps=5");
  if (HasFatalFailure()) return;
  // A held-out file of 32 sums keeps the evaluations short.
  {
    std::ifstream in("data/samples/arith/test.jsonl");
    std::ofstream out(dir_ / "val.jsonl");
    std::string line;
    for (int i = 0; i < 32 && std::getline(in, line); ++i) out << line << "\n";
  }
  // So short a base gets no sum right: a second reward, for an answer line of digits, gives the
  // groups something to compare.
  const std::string grpo =
      "train.max_steps=4 schedule.warmup_steps=2 train.eval_every=0 train.log_every=1 "
      "'grpo.rewards=[answer, regex]' "
      "'grpo.format_pattern=\"\\\\A[0-9]+\\\\n\"' data.val=" + (dir_ / "val.jsonl").string();
  train("configs/grpo_arith.yaml", "grpo", "sft", grpo);
  if (HasFatalFailure()) return;
  train("configs/grpo_arith_rft.yaml", "rft", "sft", grpo);
  if (HasFatalFailure()) return;

  const std::map<int64_t, double> sft = losses(dir_ / "sft", "val");
  ASSERT_EQ(sft.size(), 2u);  // step 0 and the end
  EXPECT_LT(sft.at(30), sft.at(0));
  for (const char* run : {"grpo", "rft"}) {
    SCOPED_TRACE(run);
    const std::map<int64_t, double> reward = losses(dir_ / run, "train", "reward");
    ASSERT_EQ(reward.size(), 4u);
    for (const auto& [step, r] : reward) EXPECT_TRUE(r >= 0 && r <= 1) << step;
    const std::map<int64_t, double> val = losses(dir_ / run, "val", "reward");
    ASSERT_EQ(val.size(), 2u);  // the base at step 0, the policy at the end
  }
  // Values from these fixed seeds (any ISA within the tolerances).
  EXPECT_NEAR(sft.at(0), 2.6063, 2e-3);
  EXPECT_NEAR(sft.at(30), 1.8508, 5e-3);
  EXPECT_NEAR(losses(dir_ / "grpo", "train", "reward").at(1), 0.7266, 1e-4);  // 93 of 128
  EXPECT_NEAR(losses(dir_ / "grpo", "train", "reward").at(4), 0.7500, 1e-4);
  EXPECT_NEAR(losses(dir_ / "grpo", "train").at(4), 0.0384, 2e-3);
  EXPECT_NEAR(losses(dir_ / "rft", "train").at(4), -0.7118, 2e-3);
  EXPECT_EQ(losses(dir_ / "grpo", "val", "reward").at(0), 1.0);  // no sum right, every line digits
  // Both start from the same base and answer the same held-out sums greedily at step 0.
  EXPECT_EQ(losses(dir_ / "grpo", "val", "reward").at(0),
            losses(dir_ / "rft", "val", "reward").at(0));
  // The same seed samples the same first rollout, so its rewards agree too.
  EXPECT_EQ(losses(dir_ / "grpo", "train", "reward").at(1),
            losses(dir_ / "rft", "train", "reward").at(1));
}

}  // namespace
}  // namespace forge
