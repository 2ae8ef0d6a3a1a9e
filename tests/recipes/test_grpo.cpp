// GRPO's pieces: advantages, the k3 KL and the loss in its three normalisations against PyTorch
// 1.13 running TRL's formulas (tests/golden/grpo/grpo.txt, written by make_grpo_goldens.py) in f64
// and f32; finite-difference checks of the loss and of k3; groups of equal rewards giving no
// gradient; online rejection's advantages; and the verifiers: the answer and regex rewards, regexes
// refused at set-up naming their key, the external command's protocol, its timeout (its process
// group killed) and every way its output can be wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "nn/ppo.h"
#include "recipes/verifier.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge {
namespace {

using In = std::vector<Tensor>;
constexpr int64_t G = 3, B = 9, T = 7;

// The goldens by name, a [B, T] one as a tensor, and a comparison with one.
const char* const kGoldens = "grpo/grpo.txt";
const std::vector<double>& golden(const std::string& name) {
  static const testing::Goldens table = testing::load_goldens(kGoldens);
  return testing::golden_values(table, name, kGoldens);
}
Tensor bt(const std::string& name, DType dt = DType::f64) { return from_vector(golden(name), {B, T}, dt); }
void expect_golden(const std::vector<double>& got, const std::string& name, double rtol) {
  testing::expect_near_golden(got, golden(name), name, rtol);
}

const std::vector<std::pair<DType, double>> kDTypes = {{DType::f64, 1e-12}, {DType::f32, 2e-5}};

nn::GRPOLossOptions case_options(const std::string& c) {
  const std::vector<double>& o = golden(c + ".options");
  return {.epsilon = o.at(0),
          .epsilon_high = o.at(1),
          .beta = o.at(2),
          .type = nn::GRPOLossType(int(golden(c + ".type").at(0))),
          .max_completion_length = T};
}

TEST(GrpoGolden, AdvantagesAndTheWeightedRewardMatchTorch) {
  expect_golden(nn::group_advantages(golden("rewards"), G, true), "advantages.scaled", 1e-12);
  expect_golden(nn::group_advantages(golden("rewards"), G, false), "advantages.unscaled", 1e-12);
  const Rewards rewards({.rewards = {"answer", "regex"},
                         .weights = golden("weights"),
                         .answer_pattern = "(\\d+)",
                         .format_pattern = "x"});
  expect_golden(rewards.total({golden("answer"), golden("format")}), "rewards", 1e-12);
  EXPECT_EQ(nn::zero_variance_groups(golden("rewards"), G), 1);
}

TEST(GrpoGolden, K3MatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes)
    expect_golden(nn::k3_kl(bt("logp_new", dt), bt("ref_logp", dt), bt("mask")).to_vector<double>(),
                  "k3", rtol);
}

TEST(GrpoGolden, LossesAndGradientsMatchTorchInEveryNormalisation) {
  for (int i = 0; i < 5; ++i) {
    const std::string c = "case" + std::to_string(i);
    const nn::GRPOLossOptions o = case_options(c);
    const bool scaled = golden(c + ".scaled").at(0) != 0;
    for (const auto& [dt, rtol] : kDTypes) {
      Tensor logp = bt("logp_new", dt).set_requires_grad(true);
      const Tensor adv = from_vector(golden(scaled ? "advantages.scaled" : "advantages.unscaled"),
                                     {B}, dt);
      const nn::GRPOLoss l =
          nn::grpo_loss(logp, bt("logp_old", dt), bt("ref_logp", dt), adv, bt("mask"), o);
      const Tensor loss = l.loss_sum / double(l.units);
      loss.backward();
      expect_golden({loss.item()}, c + ".loss", rtol);
      expect_golden(logp.grad().to_vector<double>(), c + ".dlogp", rtol);
      expect_golden({l.clip_frac}, c + ".clip_frac", 1e-12);
      expect_golden({l.kl}, c + ".kl", rtol);
      // dapo's units are the batch's tokens, grpo's and dr_grpo's its rows.
      EXPECT_EQ(l.units, o.type == nn::GRPOLossType::dapo ? 40 : B) << c;
    }
  }
}

TEST(GrpoLoss, Gradcheck) {
  const Tensor mask = testing::ids({1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0}, {3, 4});
  const Tensor old = testing::randn({3, 4}, 1).detach();
  const Tensor ref = (old + 0.3 * testing::randn({3, 4}, 2)).detach();
  const Tensor adv = testing::constant({1.2, -0.7, 0.4}, {3});
  const Tensor logp = (old + 0.3 * testing::randn({3, 4}, 3)).detach();
  for (nn::GRPOLossType type :
       {nn::GRPOLossType::grpo, nn::GRPOLossType::dapo, nn::GRPOLossType::dr_grpo}) {
    const nn::GRPOLossOptions o{.epsilon = 0.1, .epsilon_high = 0.2, .beta = 0.3, .type = type,
                                .max_completion_length = 5};
    const nn::GRPOLoss l = nn::grpo_loss(logp, old, ref, adv, mask, o);
    EXPECT_TRUE(l.clip_frac > 0 && l.clip_frac < 1) << l.clip_frac;  // both branches checked
    EXPECT_GRADCHECK(
        [&](const In& x) {
          const nn::GRPOLoss r = nn::grpo_loss(x[0], old, ref, adv, mask, o);
          return r.loss_sum / double(r.units);
        },
        {logp.clone().set_requires_grad(true)});
  }
}

TEST(GrpoLoss, K3IsNonNegativeZeroAtTheReferenceAndHasItsGradient) {
  const Tensor mask = testing::ids({1, 1, 0, 1, 1, 1}, {2, 3});
  const Tensor logp = testing::randn({2, 3}, 4).detach();
  const Tensor ref = (logp + testing::randn({2, 3}, 5)).detach();
  for (double v : nn::k3_kl(logp, ref, mask).to_vector<double>()) EXPECT_GE(v, 0.0);
  for (double v : nn::k3_kl(logp, logp, mask).to_vector<double>()) EXPECT_EQ(v, 0.0);
  // Masked positions hold anything and give 0.
  const Tensor junk = testing::constant({0, 0, 1e30, 0, 0, 0}, {2, 3});
  EXPECT_EQ(nn::k3_kl(logp, logp + junk, mask).to_vector<double>()[2], 0.0);
  EXPECT_GRADCHECK([&](const In& x) { return nn::k3_kl(x[0], ref, mask); },
                   {logp.clone().set_requires_grad(true)});
}

TEST(GrpoLoss, GroupsOfEqualRewardsGiveNoGradient) {
  // Two groups of three, each all right or all wrong: every advantage is 0, scaled or not, and with
  // beta 0 the loss has no gradient at all, however far the policy moved from the rollout's.
  const std::vector<double> rewards = {1, 1, 1, 0, 0, 0};
  const Tensor mask = testing::ids(std::vector<double>(24, 1.0), {6, 4});
  const Tensor old = testing::randn({6, 4}, 6).detach();
  for (bool scale : {true, false}) {
    const std::vector<double> a = nn::group_advantages(rewards, 3, scale);
    EXPECT_EQ(a, std::vector<double>(6, 0.0));
    EXPECT_EQ(nn::zero_variance_groups(rewards, 3), 2);
    for (nn::GRPOLossType type : {nn::GRPOLossType::grpo, nn::GRPOLossType::dapo}) {
      Tensor logp = (old + 0.5 * testing::randn({6, 4}, 7)).detach().set_requires_grad(true);
      const nn::GRPOLoss l = nn::grpo_loss(logp, old, Tensor(), testing::constant(a, {6}), mask,
                                           {.type = type});
      l.loss_sum.backward();
      for (double g : logp.grad().to_vector<double>()) EXPECT_EQ(g, 0.0);
    }
  }
}

TEST(GrpoLoss, RejectionKeepsWhatReachesTheThreshold) {
  EXPECT_EQ(nn::rejection_advantages({0, 1, 0.5, 2, 0.99}, 1.0),
            (std::vector<double>{0, 1, 0, 1, 0}));
  // With the kept completions' advantage 1 and the ratio 1, the loss is the negated summed
  // log-probability of the kept tokens: SFT on them.
  const Tensor mask = testing::ids({1, 1, 1, 1}, {2, 2});
  Tensor logp = testing::randn({2, 2}, 8);
  const nn::GRPOLoss l = nn::grpo_loss(logp, logp.detach(), Tensor(),
                                       testing::constant({1, 0}, {2}), mask,
                                       {.type = nn::GRPOLossType::dapo});
  l.loss_sum.backward();
  EXPECT_EQ(logp.grad().to_vector<double>(), (std::vector<double>{-1, -1, 0, 0}));
}

TEST(GrpoLoss, OptionsOutOfRangeAreRefused) {
  const Tensor mask = testing::ids({1, 1}, {1, 2});
  const Tensor lp = testing::constant({-1, -1}, {1, 2});
  const Tensor a = testing::constant({1}, {1});
  testing::expect_error(ExitCode::usage, "epsilon_high must be finite and >= 0", [&] {
    nn::grpo_loss(lp, lp, Tensor(), a, mask, {.epsilon_high = -1});
  });
  testing::expect_error(ExitCode::usage, "dr_grpo needs max_completion_length", [&] {
    nn::grpo_loss(lp, lp, Tensor(), a, mask, {.type = nn::GRPOLossType::dr_grpo});
  });
}

// ---- verifiers ----------------------------------------------------------------------------------

struct Samples {
  std::vector<nlohmann::json> records;
  std::vector<VerifierSample> list(const std::vector<std::string>& completions) const {
    std::vector<VerifierSample> out;
    for (size_t i = 0; i < completions.size(); ++i) out.push_back({&records[i], completions[i]});
    return out;
  }
};

TEST(GrpoVerifier, TheAnswerIsGroupOneOfTheLastMatch) {
  const Rewards r({.rewards = {"answer"}, .answer_field = "answer",
                   .answer_pattern = "(-?[0-9]+(?:\\.[0-9]+)?)"});
  const Samples s{{{{"answer", "12"}}, {{"answer", "12"}}, {{"answer", 12}}, {{"answer", "-3"}},
                   {{"answer", "7"}}}};
  const auto got = r.score(s.list({"3 + 9 = 12", "12 is not 13", " so 12\n", "x = -3 ", "none"}));
  EXPECT_EQ(got.at(0), (std::vector<double>{1, 0, 1, 1, 0}));
  EXPECT_EQ(r.required_fields(), std::vector<std::string>{"answer"});
  // An empty match does not stall the search: the last one counts (here the empty group at the end).
  VerifierRegex empty("([0-9]*)", "grpo.answer_pattern", 1);
  std::string group = "unset";
  EXPECT_TRUE(empty.last_group("ab12c", group));
  EXPECT_EQ(group, "");
}

TEST(GrpoVerifier, TheRegexRewardSearchesTheCompletion) {
  const Rewards r({.rewards = {"regex"}, .format_pattern = "\\A<a>.*</a>\\Z"});
  const Samples s{{{}, {}, {}}};
  EXPECT_EQ(r.score(s.list({"<a>12</a>", "x<a>12</a>", "<a>1"})).at(0),
            (std::vector<double>{1, 0, 0}));
}

TEST(GrpoVerifier, ConfigProblemsNameTheirKey) {
  auto problems = [](const VerifierOptions& o) {
    std::vector<std::string> keys;
    for (const VerifierProblem& p : check_verifiers(o)) {
      keys.push_back(p.key);
      EXPECT_EQ(p.message.rfind(p.key + ": ", 0), 0u) << p.message;
    }
    return keys;
  };
  EXPECT_EQ(problems({.rewards = {"answer"}, .answer_pattern = "(unclosed"}),
            std::vector<std::string>{"grpo.answer_pattern"});
  EXPECT_EQ(problems({.rewards = {"answer"}, .answer_pattern = "[0-9]+"}),
            std::vector<std::string>{"grpo.answer_pattern"});  // no group to capture the answer
  EXPECT_EQ(problems({.rewards = {"regex"}, .format_pattern = "[z-a]"}),
            std::vector<std::string>{"grpo.format_pattern"});
  EXPECT_EQ(problems({.rewards = {"command"}}), std::vector<std::string>{"grpo.command"});
  EXPECT_EQ(problems({.rewards = {"answr"}, .answer_pattern = "(x)"}),
            std::vector<std::string>{"grpo.rewards"});
  EXPECT_EQ(problems({.rewards = {"regex", "regex"}, .format_pattern = "x"}),
            std::vector<std::string>{"grpo.rewards"});
  EXPECT_EQ(problems({}), std::vector<std::string>{"grpo.rewards"});
  // The regex of a function not listed is not read.
  EXPECT_TRUE(problems({.rewards = {"regex"}, .answer_pattern = "(", .format_pattern = "x"})
                  .empty());
  testing::expect_error(ExitCode::usage, "grpo.answer_pattern: '(unclosed' does not compile", [] {
    Rewards r({.rewards = {"answer"}, .answer_pattern = "(unclosed"});
  });
}

class GrpoCommand : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  const std::filesystem::path& dir_ = tmp_.path();
};

TEST_F(GrpoCommand, ReadsOneRecordPerCompletionAndPrintsOneRewardPerLine) {
  const std::string in = (dir_ / "in.jsonl").string();
  const Rewards r({.rewards = {"command"},
                   .command = "tee " + in + " | awk '{ print NR / 2 }'",
                   .command_timeout = 10});
  const Samples s{{{{"prompt", "1+1="}, {"answer", "2"}},
                   {{"prompt", "1+1="}, {"answer", "2"}, {"completion", "old"}},
                   {{"prompt", "é\n"}}}};
  const std::vector<std::string> completions = {"2", "3\n", "\"q\""};
  EXPECT_EQ(r.score(s.list(completions)).at(0), (std::vector<double>{0.5, 1.0, 1.5}));
  // Each line is the record with "completion" set: JSON, one a line, fields kept.
  std::ifstream lines(in);
  std::string line;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(std::getline(lines, line));
    nlohmann::json want = s.records[i];
    want["completion"] = completions[i];
    EXPECT_EQ(nlohmann::json::parse(line), want) << line;
  }
  EXPECT_FALSE(std::getline(lines, line));
}

TEST_F(GrpoCommand, ACommandThatStopsReadingIsJudgedByItsOutput) {
  // 4 MB of records to a command that closes its stdin at once and answers later: the writes fail
  // (EPIPE) instead of killing the process with SIGPIPE, and the two lines it printed are the
  // rewards.
  const std::string big(1 << 21, 'x');
  const Samples s{{{{"prompt", big}}, {{"prompt", big}}}};
  const std::vector<VerifierSample> samples = s.list({"a", "b"});
  EXPECT_EQ(run_verifier_command("exec 0<&-; sleep 0.2; echo 1; echo 2",
                                 verifier_record(samples[0]) + "\n" + verifier_record(samples[1]),
                                 2, 10),
            (std::vector<double>{1, 2}));
}

TEST_F(GrpoCommand, AHangingCommandIsKilledAtItsTimeoutWithItsChildren) {
  const std::string marker = (dir_ / "late").string();
  for (const std::string& command :
       {std::string("sleep 30"),
        // Prints its answer, but a child it left behind holds its output open.
        "(sleep 3; touch " + marker + ") & echo 1"}) {
    const auto start = std::chrono::steady_clock::now();
    testing::expect_error(ExitCode::data, "grpo.command: no answer within grpo.command_timeout 0.5 s",
                          [&] { run_verifier_command(command, "{}\n", 1, 0.5); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 2.0) << command;
  }
  // The whole process group went: the child never woke up to touch the marker.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(GrpoCommand, BadOutputIsOneLineNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"kill -SEGV $$", "grpo.command: killed by signal 11"},
      {"exit 3", "grpo.command: exited with status 3"},
      {"echo 1", "grpo.command: printed 1 lines for 2 completions"},
      {"echo 1; echo abc", "grpo.command: line 2 of its output is 'abc', not a finite number"},
      {"echo 1; echo nan", "line 2 of its output is 'nan', not a finite number"},
      {"echo 1; echo 1e999", "line 2 of its output is '1e999', not a finite number"},
      {"echo 1; echo 2; echo 3", "grpo.command: printed more than 2 lines"},
      {"echo 1; echo", "line 2 of its output is '', not a finite number"},
      {"no-such-verifier-command",
       "grpo.command: exited with status 127 (its stderr: sh: 1: no-such-verifier-command: not "
       "found)"},
      {"echo why >&2; echo; echo x >&2; exit 2", "exited with status 2 (its stderr: x)"}};
  for (const auto& c : cases)
    testing::expect_error(ExitCode::data, c.second,
                          [&] { run_verifier_command(c.first, "{}\n{}\n", 2, 10); });
  // A trailing newline or none, white space around a number: both fine.
  EXPECT_EQ(run_verifier_command("printf ' 1 \\n-2.5'", "{}\n{}\n", 2, 10),
            (std::vector<double>{1, -2.5}));
}

}  // namespace
}  // namespace forge
