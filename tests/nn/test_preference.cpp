// Preference losses (nn/preference.h): values and gradients against PyTorch 1.13 written with TRL's
// formulas (tests/golden/preference.txt, written by make_preference_goldens.py) for
// sequence_logprobs, every DPO loss type (sigmoid with label smoothing), ORPO and SimPO without a
// reference, DPO, ORPO and SimPO from logits end to end and the Bradley-Terry loss with margin and
// centring; finite-difference checks of each; that ignored positions and the reference take no part
// in gradients; and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "nn/preference.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using In = std::vector<Tensor>;

const std::vector<double>& golden(const std::string& name) {
  static const testing::Goldens table = testing::load_goldens("preference.txt");
  return testing::golden_values(table, name, "preference.txt");
}

Tensor golden_tensor(const std::string& name, const Shape& shape, DType dt = DType::f64) {
  return from_vector(golden(name), shape, dt);
}

void expect_golden(const Tensor& got, const std::string& name, double rtol) {
  ASSERT_TRUE(got.defined()) << name;
  testing::expect_near_golden(got.to_vector<double>(), golden(name), name, rtol);
}

// The number of scored targets per row of [R, T] targets, as a [R] tensor.
Tensor target_counts(const Tensor& targets) {
  const int64_t R = targets.size(0), T = targets.size(1);
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  std::vector<double> counts(static_cast<size_t>(R), 0.0);
  for (int64_t i = 0; i < R * T; ++i) counts[size_t(i / T)] += t[size_t(i)] != -100;
  return from_vector(counts, {R}, DType::i64);
}

void check_sequence_logprobs(DType dt, double rtol) {
  Tensor logits = golden_tensor("seq.logits", {3, 6, 11}, dt).set_requires_grad(true);
  const Tensor targets = golden_tensor("seq.targets", {3, 6}, DType::i64);
  const Tensor out = sequence_logprobs(logits, targets);
  ASSERT_EQ(out.shape(), (Shape{3}));
  out.backward(golden_tensor("seq.r", {3}, dt));
  expect_golden(out, "seq.out", rtol);
  expect_golden(logits.grad(), "seq.dlogits", rtol);
}

TEST(PreferenceLoss, SequenceLogprobsMatchTorch) {
  check_sequence_logprobs(DType::f64, 1e-12);
  check_sequence_logprobs(DType::f32, 1e-5);
}

TEST(PreferenceLoss, IgnoredPositionsChangeNothing) {
  // Row 0's first two positions are a prompt, row 1's last two padding, row 2 is all ignored:
  // their logits may be anything, and get no gradient.
  const Tensor targets = golden_tensor("seq.targets", {3, 6}, DType::i64);
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  const Tensor logits = golden_tensor("seq.logits", {3, 6, 11});
  std::vector<double> moved = logits.to_vector<double>();
  for (size_t i = 0; i < moved.size(); ++i)
    if (t[i / 11] == -100) moved[i] += 37.0 * std::sin(double(i));
  Tensor other = from_vector(moved, {3, 6, 11}, DType::f64).set_requires_grad(true);
  const Tensor out = sequence_logprobs(other, targets);
  EXPECT_EQ(out.to_vector<double>(), sequence_logprobs(logits, targets).to_vector<double>());
  EXPECT_EQ(out.to_vector<double>()[2], 0.0);
  sum(out).backward();
  const std::vector<double> g = other.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (t[i / 11] == -100) {
      EXPECT_EQ(g[i], 0.0) << "position " << i / 11;
    }
  }
}

TEST(PreferenceLoss, SequenceLogprobsGradcheck) {
  const Tensor targets = testing::ids({2, -100, 4, 0, -100, -100, 1, 3}, {2, 4});
  EXPECT_GRADCHECK([targets](const In& v) { return sequence_logprobs(v[0], targets); },
                   {testing::randn({2, 4, 5}, 1)});
  // Logits from a transpose: not contiguous.
  EXPECT_GRADCHECK(
      [targets](const In& v) { return sequence_logprobs(transpose(v[0], 0, 1), targets); },
      {testing::randn({4, 2, 5}, 2)});
}

TEST(PreferenceLoss, TokenLogprobsAreTheSequenceSumsTerms) {
  const Tensor logits = golden_tensor("seq.logits", {3, 6, 11}, DType::f64);
  const Tensor targets = golden_tensor("seq.targets", {3, 6}, DType::i64);
  const Tensor per_token = token_logprobs(logits, targets);
  ASSERT_EQ(per_token.shape(), (Shape{3, 6}));
  expect_golden(sum(per_token, {1}), "seq.out", 1e-12);
  const std::vector<double> lp = per_token.to_vector<double>();
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == -100)
      EXPECT_EQ(lp[i], 0.0) << i;  // ignored: exactly 0
    else
      EXPECT_LT(lp[i], 0.0) << i;
  }
  const Tensor ignored = testing::ids({2, -100, 4, 0, -100, -100, 1, 3}, {2, 4});
  EXPECT_GRADCHECK([ignored](const In& v) { return token_logprobs(v[0], ignored); },
                   {testing::randn({2, 4, 5}, 3)});
}

// The inputs of goldens "dpo.*", with the policy's log-probabilities requiring grad.
DPOLogProbs golden_logps() {
  return {golden_tensor("dpo.pc", {8}).set_requires_grad(true),
          golden_tensor("dpo.pr", {8}).set_requires_grad(true),
          golden_tensor("dpo.rc", {8}),
          golden_tensor("dpo.rr", {8}),
          golden_tensor("dpo.nc", {8}, DType::i64),
          golden_tensor("dpo.nr", {8}, DType::i64)};
}

// Backward of the pairs' mean loss, then the losses, their mean, the rewards and the policy's
// gradients against goldens `key`.*.
void expect_loss_goldens(const DPOResult& r, const DPOLogProbs& in, const std::string& key) {
  const Tensor loss = mean(r.losses);
  loss.backward();
  expect_golden(r.losses, key + ".losses", 1e-12);
  expect_golden(loss, key + ".loss", 1e-12);
  expect_golden(r.chosen_rewards, key + ".chosen_rewards", 1e-12);
  expect_golden(r.rejected_rewards, key + ".rejected_rewards", 1e-12);
  expect_golden(in.policy_chosen.grad(), key + ".dpc", 1e-12);
  expect_golden(in.policy_rejected.grad(), key + ".dpr", 1e-12);
}

TEST(PreferenceLoss, DPOLossesMatchTorchForEveryLossType) {
  const std::vector<std::pair<std::string, DPOLossType>> variants = {
      {"sigmoid", DPOLossType::sigmoid},
      {"sigmoid_ls", DPOLossType::sigmoid},
      {"ipo", DPOLossType::ipo},
      {"hinge", DPOLossType::hinge}};
  for (const auto& [name, type] : variants) {
    const std::string key = "dpo_" + name;
    DPOLogProbs in = golden_logps();
    // The reference asks for a gradient here only to show that it never gets one.
    in.reference_chosen.set_requires_grad(true);
    const DPOOptions options{golden(key + ".beta").at(0), golden(key + ".label_smoothing").at(0),
                             type};
    const DPOResult r = dpo_loss(in, options);
    expect_loss_goldens(r, in, key);
    EXPECT_FALSE(in.reference_chosen.grad().defined()) << key;
    EXPECT_FALSE(r.chosen_rewards.requires_grad()) << key;
  }
}

TEST(PreferenceLoss, DPOFromLogitsMatchesTorch) {
  // One [2B, T, V] forward, chosen rows first; IPO averages over each row's scored tokens.
  const Tensor reference = golden_tensor("e2e.reference", {4, 5, 7});
  const Tensor targets = golden_tensor("e2e.targets", {4, 5}, DType::i64);
  const Tensor counts = target_counts(targets);
  for (const auto& [name, type] : {std::pair{"sigmoid", DPOLossType::sigmoid},
                                   std::pair{"ipo", DPOLossType::ipo}}) {
    const std::string key = std::string("e2e_") + name;
    Tensor policy = golden_tensor("e2e.policy", {4, 5, 7}).set_requires_grad(true);
    const Tensor pi = sequence_logprobs(policy, targets);
    const Tensor ref = sequence_logprobs(reference, targets);
    const DPOLogProbs in{slice(pi, 0, 0, 2),     slice(pi, 0, 2, 4),
                         slice(ref, 0, 0, 2),    slice(ref, 0, 2, 4),
                         slice(counts, 0, 0, 2), slice(counts, 0, 2, 4)};
    const Tensor loss = mean(dpo_loss(in, {0.1, 0.0, type}).losses);
    loss.backward();
    expect_golden(loss, key + ".loss", 1e-12);
    expect_golden(policy.grad(), key + ".dpolicy", 1e-12);
  }
}

TEST(PreferenceLoss, ORPOAndSimPOMatchTorchWithoutAReference) {
  for (const auto& [name, type] : {std::pair{"orpo", DPOLossType::orpo},
                                   std::pair{"simpo", DPOLossType::simpo},
                                   std::pair{"simpo_ls", DPOLossType::simpo}}) {
    const std::string key = name;
    DPOLogProbs in{.policy_chosen = golden_tensor("ref_free.pc", {8}).set_requires_grad(true),
                   .policy_rejected = golden_tensor("ref_free.pr", {8}).set_requires_grad(true),
                   .chosen_tokens = golden_tensor("dpo.nc", {8}, DType::i64),
                   .rejected_tokens = golden_tensor("dpo.nr", {8}, DType::i64),
                   .chosen_nll = golden_tensor("ref_free.nll", {}).set_requires_grad(true)};
    const DPOOptions options{.beta = golden(key + ".beta").at(0),
                             .label_smoothing = golden(key + ".label_smoothing").at(0),
                             .loss_type = type,
                             .simpo_gamma = golden(key + ".gamma").at(0)};
    const DPOResult r = dpo_loss(in, options);
    expect_loss_goldens(r, in, key);
    if (type == DPOLossType::orpo) {
      expect_golden(r.log_odds, key + ".log_odds", 1e-12);
      expect_golden(in.chosen_nll.grad(), key + ".dnll", 1e-12);
      EXPECT_FALSE(r.log_odds.requires_grad());
    } else {
      EXPECT_FALSE(r.log_odds.defined()) << key;
      EXPECT_FALSE(in.chosen_nll.grad().defined()) << key;  // SimPO has no NLL term
    }
  }
  EXPECT_TRUE(needs_reference(DPOLossType::hinge));
  EXPECT_FALSE(needs_reference(DPOLossType::orpo) || needs_reference(DPOLossType::simpo));
}

TEST(PreferenceLoss, ORPOAndSimPOFromLogitsMatchTorch) {
  // Averages over each row's scored tokens; ORPO's NLL over the chosen rows' whole rows.
  const Tensor targets = golden_tensor("e2e.targets", {4, 5}, DType::i64);
  const Tensor row_targets = golden_tensor("e2e.row_targets", {2, 5}, DType::i64);
  const Tensor counts = target_counts(targets);
  for (const auto& [name, options] :
       {std::pair{"orpo", DPOOptions{.beta = 0.1, .loss_type = DPOLossType::orpo}},
        std::pair{"simpo",
                  DPOOptions{.beta = 2.0, .loss_type = DPOLossType::simpo, .simpo_gamma = 1.2}}}) {
    const std::string key = std::string("e2e_") + name;
    Tensor policy = golden_tensor("e2e.policy", {4, 5, 7}).set_requires_grad(true);
    const Tensor pi = sequence_logprobs(policy, targets);
    const DPOLogProbs in{
        .policy_chosen = slice(pi, 0, 0, 2),
        .policy_rejected = slice(pi, 0, 2, 4),
        .chosen_tokens = slice(counts, 0, 0, 2),
        .rejected_tokens = slice(counts, 0, 2, 4),
        .chosen_nll = cross_entropy(reshape(slice(policy, 0, 0, 2), {10, 7}),
                                    reshape(row_targets, {10}))};
    const Tensor loss = mean(dpo_loss(in, options).losses);
    loss.backward();
    expect_golden(loss, key + ".loss", 1e-12);
    expect_golden(policy.grad(), key + ".dpolicy", 1e-12);
  }
}

TEST(PreferenceLoss, BradleyTerryLossMatchesTorch) {
  const Tensor margin = golden_tensor("bt.margin", {8});
  for (const std::string name : {"plain", "margin_center"}) {
    const std::string key = "bt_" + name;
    Tensor chosen = golden_tensor("bt.chosen", {8}).set_requires_grad(true);
    Tensor rejected = golden_tensor("bt.rejected", {8}).set_requires_grad(true);
    const Tensor losses = bradley_terry_loss(chosen, rejected, name == "plain" ? Tensor() : margin,
                                             golden(key + ".coefficient").at(0));
    ASSERT_EQ(losses.shape(), (Shape{8}));
    const Tensor loss = mean(losses);
    loss.backward();
    expect_golden(loss, key + ".loss", 1e-12);
    expect_golden(chosen.grad(), key + ".dchosen", 1e-12);
    expect_golden(rejected.grad(), key + ".drejected", 1e-12);
  }
}

TEST(PreferenceLoss, LossesGradcheck) {
  const Tensor rc = testing::randn({6}, 3).detach(), rr = testing::randn({6}, 4).detach();
  const Tensor nc = testing::ids({3, 1, 7, 2, 5, 4}, {6});
  const Tensor nr = testing::ids({2, 6, 1, 1, 3, 9}, {6});
  for (const DPOOptions options : {DPOOptions{0.7, 0.0, DPOLossType::sigmoid},
                                   DPOOptions{0.7, 0.3, DPOLossType::sigmoid},
                                   DPOOptions{0.3, 0.0, DPOLossType::ipo},
                                   DPOOptions{0.7, 0.0, DPOLossType::hinge}}) {
    auto losses = [&](const In& v) {
      return dpo_loss({v[0], v[1], rc, rr, nc, nr}, options).losses;
    };
    EXPECT_GRADCHECK(losses, {testing::randn({6}, 1), testing::randn({6}, 2)});
  }
  // ORPO's averages must be below 0: the inputs are their logs of minus.
  for (const DPOOptions options :
       {DPOOptions{.beta = 0.3, .loss_type = DPOLossType::orpo},
        DPOOptions{.beta = 2.0, .loss_type = DPOLossType::simpo, .simpo_gamma = 0.7},
        DPOOptions{.beta = 2.0, .label_smoothing = 0.2, .loss_type = DPOLossType::simpo}}) {
    auto losses = [&](const In& v) {
      return dpo_loss({.policy_chosen = -exp(v[0]),
                       .policy_rejected = -exp(v[1]),
                       .chosen_tokens = nc,
                       .rejected_tokens = nr,
                       .chosen_nll = v[2]},
                      options)
          .losses;
    };
    EXPECT_GRADCHECK(losses, {testing::randn({6}, 10), testing::randn({6}, 11),
                              testing::randn({}, 12)});
  }
  const Tensor margin = testing::rand_uniform({6}, 0.0, 1.0, 5).detach();
  EXPECT_GRADCHECK([&](const In& v) { return bradley_terry_loss(v[0], v[1], margin, 0.05); },
                   {testing::randn({6}, 6), testing::randn({6}, 7)});
  EXPECT_GRADCHECK([&](const In& v) { return bradley_terry_loss(v[0], v[1]); },
                   {testing::randn({6}, 8), testing::randn({6}, 9)});
}

TEST(PreferenceLoss, BadOptionsAndInputsAreOneLineErrors) {
  const DPOLogProbs in = golden_logps();
  auto dpo = [&](DPOOptions o, DPOLogProbs x) { return [o, x] { dpo_loss(x, o); }; };
  testing::expect_error(ExitCode::usage, "dpo: beta must be finite and > 0, got 0",
                        dpo({0.0, 0.0, DPOLossType::sigmoid}, in));
  testing::expect_error(ExitCode::usage, "dpo: beta must be finite and > 0, got nan",
                        dpo({std::nan(""), 0.0, DPOLossType::sigmoid}, in));
  testing::expect_error(ExitCode::usage, "label_smoothing must be in [0, 0.5), got 0.5",
                        dpo({0.1, 0.5, DPOLossType::sigmoid}, in));
  testing::expect_error(ExitCode::usage,
                        "label_smoothing applies to the sigmoid and simpo losses only, got 0.1",
                        dpo({0.1, 0.1, DPOLossType::hinge}, in));
  testing::expect_error(ExitCode::usage,
                        "label_smoothing applies to the sigmoid and simpo losses only, got 0.1",
                        dpo({0.1, 0.1, DPOLossType::orpo}, in));
  testing::expect_error(ExitCode::usage, "dpo: simpo_gamma must be finite, got inf",
                        dpo({.loss_type = DPOLossType::simpo, .simpo_gamma = HUGE_VAL}, in));
  testing::expect_error(ExitCode::usage, "dpo: the orpo loss needs chosen_nll (its NLL term)",
                        dpo({.loss_type = DPOLossType::orpo}, in));
  DPOLogProbs vector_nll = in;
  vector_nll.chosen_nll = in.policy_chosen.detach();
  testing::expect_error(ExitCode::internal, "dpo: chosen_nll must be a scalar of f64, got [8]",
                        dpo({.loss_type = DPOLossType::orpo}, vector_nll));
  DPOLogProbs no_counts = in;
  no_counts.rejected_tokens = Tensor();
  testing::expect_error(ExitCode::usage, "the ipo loss needs rejected_tokens",
                        dpo({0.1, 0.0, DPOLossType::ipo}, no_counts));
  testing::expect_error(ExitCode::usage, "the simpo loss needs rejected_tokens",
                        dpo({0.1, 0.0, DPOLossType::simpo}, no_counts));
  DPOLogProbs zero_count = in;
  zero_count.chosen_tokens = testing::ids({1, 2, 3, 0, 5, 6, 7, 8}, {8});
  testing::expect_error(ExitCode::usage, "dpo: chosen_tokens[3] is 0",
                        dpo({0.1, 0.0, DPOLossType::ipo}, zero_count));
  EXPECT_NO_THROW(dpo_loss(zero_count, {0.1, 0.0, DPOLossType::sigmoid}));  // counts unused
  DPOLogProbs short_ref = in;
  short_ref.reference_rejected = slice(in.reference_rejected, 0, 0, 7);
  testing::expect_error(ExitCode::internal, "dpo: reference_rejected must be [B] = [8], got [7]",
                        dpo({}, short_ref));
  DPOLogProbs f32 = in;
  f32.policy_rejected = in.policy_rejected.to(DType::f32);
  testing::expect_error(ExitCode::internal, "dpo: policy_rejected is f32", dpo({}, f32));

  const Tensor r = golden_tensor("bt.chosen", {8});
  testing::expect_error(ExitCode::usage, "center_rewards_coefficient must be finite and >= 0",
                        [&] { bradley_terry_loss(r, r, Tensor(), -0.01); });
  testing::expect_error(ExitCode::internal, "reward loss: margin must be [B] = [8], got [2, 4]",
                        [&] { bradley_terry_loss(r, r, reshape(r, {2, 4})); });
  testing::expect_error(ExitCode::internal,
                        "sequence_logprobs: targets [3, 5] must be [N, T] = [3, 6]",
                        [&] {
                          sequence_logprobs(golden_tensor("seq.logits", {3, 6, 11}),
                                            testing::ids(std::vector<double>(15, 0.0), {3, 5}));
                        });
}

}  // namespace
}  // namespace forge::nn
