// PPO's pieces (nn/ppo.h): values, statistics and gradients against PyTorch 1.13 running TRL's
// formulas over one rollout (tests/golden/ppo.txt, written by make_ppo_goldens.py) in f64 and f32;
// finite-difference checks of the two losses and the entropy; that masked positions, whatever
// they hold, change no output and get no gradient; the KL controller; and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "nn/ppo.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge::nn {
namespace {

using In = std::vector<Tensor>;

constexpr int64_t B = 4, T = 7, V = 11;

const std::vector<double>& golden(const std::string& name) {
  static const testing::Goldens table = testing::load_goldens("ppo.txt");
  return testing::golden_values(table, name, "ppo.txt");
}

Tensor golden_tensor(const std::string& name, const Shape& shape, DType dt = DType::f64) {
  return from_vector(golden(name), shape, dt);
}

// A [B, T] golden.
Tensor bt(const std::string& name, DType dt = DType::f64) {
  return golden_tensor(name, {B, T}, dt);
}

void expect_golden(const Tensor& got, const std::string& name, double rtol) {
  ASSERT_TRUE(got.defined()) << name;
  testing::expect_near_golden(got.to_vector<double>(), golden(name), name, rtol);
}

void expect_golden(double got, const std::string& name, double rtol) {
  testing::expect_near_golden({got}, golden(name), name, rtol);
}

// The golden mask as i64, the dtype a recipe's masks come in.
Tensor golden_mask() { return golden_tensor("mask", {B, T}, DType::i64); }

// Rollout tensors in f64 and in f32; f32 goldens are the f64 ones to float precision.
const std::vector<std::pair<DType, double>> kDTypes = {{DType::f64, 1e-12}, {DType::f32, 1e-5}};

TEST(PpoRollout, PerTokenRewardsMatchTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    const PPORewards r = per_token_rewards(bt("logp", dt), bt("ref_logp", dt),
                                           golden_tensor("scores", {B}, dt), golden_mask(),
                                           golden("kl_coef").at(0));
    EXPECT_EQ(r.rewards.dtype(), dt);
    EXPECT_EQ(r.rewards.shape(), (Shape{B, T}));
    expect_golden(r.rewards, "rewards.rewards", rtol);
    expect_golden(r.kl, "rewards.kl", rtol);
  }
}

TEST(PpoRollout, GaeMatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    for (const std::string name : {"gae_lm", "gae_discounted"}) {
      const PPOAdvantages a = gae(bt("rewards.rewards", dt), bt("values", dt), golden_mask(),
                                  golden(name + ".gamma").at(0), golden(name + ".lam").at(0));
      EXPECT_EQ(a.advantages.dtype(), dt);
      expect_golden(a.advantages, name + ".advantages", rtol);
      expect_golden(a.returns, name + ".returns", rtol);
    }
  }
}

TEST(PpoRollout, GaeByHand) {
  // One row, gamma 0.5, lam 0.5, response tokens at 0, 2 (a hole at 1, skipped) and padding at 3.
  const Tensor r = testing::constant({1, 99, 2, 99}, {1, 4});
  const Tensor v = testing::constant({4, 99, 8, 99}, {1, 4});
  const Tensor m = testing::ids({1, 0, 1, 0}, {1, 4});
  const PPOAdvantages a = gae(r, v, m, 0.5, 0.5);
  // t = 2: delta = 2 - 8 = -6, A = -6. t = 0: delta = 1 + 0.5 * 8 - 4 = 1, A = 1 + 0.25 * -6.
  EXPECT_EQ(a.advantages.to_vector<double>(), (std::vector<double>{-0.5, 0, -6, 0}));
  EXPECT_EQ(a.returns.to_vector<double>(), (std::vector<double>{3.5, 0, 2, 0}));
}

TEST(PpoRollout, WhitenMatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    const Tensor adv = bt("gae_lm.advantages", dt);
    expect_golden(whiten(adv, golden_mask()), "whiten.shifted", rtol);
    expect_golden(whiten(adv, golden_mask(), false), "whiten.unshifted", rtol);
  }
}

TEST(PpoLoss, PolicyLossMatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    Tensor logp_new = bt("logp_new", dt).set_requires_grad(true);
    // The old log-probabilities and the advantages ask for a gradient only to show they get none.
    Tensor logp_old = bt("logp", dt).set_requires_grad(true);
    Tensor advantages = bt("whiten.shifted", dt).set_requires_grad(true);
    const PPOPolicyLoss p = ppo_policy_loss(logp_new, logp_old, advantages, golden_mask(),
                                            golden("clip_range").at(0));
    ASSERT_EQ(p.loss.dim(), 0);
    p.loss.backward();
    expect_golden(p.loss, "policy.loss", rtol);
    expect_golden(p.clip_frac, "policy.clip_frac", 1e-15);
    expect_golden(p.approx_kl, "policy.approx_kl", rtol);
    expect_golden(p.ratio_mean, "policy.ratio_mean", rtol);
    expect_golden(logp_new.grad(), "policy.dlogp_new", rtol);
    EXPECT_FALSE(logp_old.grad().defined());
    EXPECT_FALSE(advantages.grad().defined());
  }
}

TEST(PpoLoss, ValueLossMatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    Tensor values_new = bt("values_new", dt).set_requires_grad(true);
    Tensor values_old = bt("values", dt).set_requires_grad(true);
    Tensor returns = bt("gae_lm.returns", dt).set_requires_grad(true);
    const PPOValueLoss v = ppo_value_loss(values_new, values_old, returns, golden_mask(),
                                          golden("clip_range_value").at(0));
    ASSERT_EQ(v.loss.dim(), 0);
    v.loss.backward();
    expect_golden(v.loss, "value.loss", rtol);
    expect_golden(v.clip_frac, "value.clip_frac", 1e-15);
    expect_golden(values_new.grad(), "value.dvalues_new", rtol);
    EXPECT_FALSE(values_old.grad().defined());
    EXPECT_FALSE(returns.grad().defined());
  }
}

TEST(PpoLoss, EntropyMatchesTorch) {
  for (const auto& [dt, rtol] : kDTypes) {
    Tensor logits = golden_tensor("entropy.logits", {B, T, V}, dt).set_requires_grad(true);
    const Tensor h = entropy_from_logits(logits, golden_mask());
    ASSERT_EQ(h.dim(), 0);
    h.backward();
    expect_golden(h, "entropy.value", rtol);
    expect_golden(logits.grad(), "entropy.dlogits", rtol);
  }
}

TEST(PpoLoss, LossesGradcheck) {
  // Values spread so that some ratios and values are clipped on each side, with masked positions.
  const Tensor mask = testing::ids({1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0}, {3, 4});
  const Tensor logp_old = testing::randn({3, 4}, 1).detach();
  const Tensor adv = testing::randn({3, 4}, 2).detach();
  const Tensor logp_new = (logp_old + 0.3 * testing::randn({3, 4}, 3)).detach();
  for (double clip : {0.2, 0.05}) {
    const double clip_frac = ppo_policy_loss(logp_new, logp_old, adv, mask, clip).clip_frac;
    EXPECT_TRUE(clip_frac > 0 && clip_frac < 1) << clip_frac;  // both branches are checked
    EXPECT_GRADCHECK(
        [&](const In& x) { return ppo_policy_loss(x[0], logp_old, adv, mask, clip).loss; },
        {logp_new.clone().set_requires_grad(true)});
  }
  const Tensor v_old = testing::randn({3, 4}, 4).detach();
  const Tensor returns = testing::randn({3, 4}, 5).detach();
  const Tensor v_new = (v_old + 0.5 * testing::randn({3, 4}, 6)).detach();
  for (double clip : {0.2, 0.5}) {
    const double clip_frac = ppo_value_loss(v_new, v_old, returns, mask, clip).clip_frac;
    EXPECT_TRUE(clip_frac > 0 && clip_frac < 1) << clip_frac;
    EXPECT_GRADCHECK(
        [&](const In& x) { return ppo_value_loss(x[0], v_old, returns, mask, clip).loss; },
        {v_new.clone().set_requires_grad(true)});
  }
  EXPECT_GRADCHECK([&](const In& x) { return entropy_from_logits(x[0], mask); },
                   {testing::randn({3, 4, 5}, 7)});
  // Logits from a transpose: not contiguous.
  EXPECT_GRADCHECK(
      [&](const In& x) { return entropy_from_logits(transpose(x[0], 0, 1), mask); },
      {testing::randn({4, 3, 5}, 8)});
}

// `x` with every masked position replaced by a value from `junk` (cycled): inf, nan, huge.
Tensor junk_at_masked(const Tensor& x, const Tensor& mask, std::vector<double> junk) {
  const std::vector<double> m = mask.to_vector<double>();
  const int64_t inner = x.numel() / mask.numel();
  std::vector<double> v = x.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    if (m[i / size_t(inner)] == 0) v[i] = junk[i % junk.size()];
  return from_vector(v, x.shape(), x.dtype());
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << what << "[" << i << "]";
}

TEST(PpoLoss, MaskedPositionsChangeNothing) {
  const Tensor mask = golden_mask();
  const std::vector<double> m = mask.to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> junk = {inf, -inf, nan, 1e300, -1e4, 37.0};
  auto moved = [&](const std::string& name) { return junk_at_masked(bt(name), mask, junk); };

  const double kl_coef = golden("kl_coef").at(0);
  const Tensor scores = golden_tensor("scores", {B});
  const PPORewards r0 = per_token_rewards(bt("logp"), bt("ref_logp"), scores, mask, kl_coef);
  const PPORewards r1 = per_token_rewards(moved("logp"), moved("ref_logp"), scores, mask, kl_coef);
  expect_same(r0.rewards, r1.rewards, "rewards");
  expect_same(r0.kl, r1.kl, "kl");

  const PPOAdvantages a0 = gae(bt("rewards.rewards"), bt("values"), mask, 1.0, 0.95);
  const PPOAdvantages a1 = gae(moved("rewards.rewards"), moved("values"), mask, 1.0, 0.95);
  expect_same(a0.advantages, a1.advantages, "advantages");
  expect_same(a0.returns, a1.returns, "returns");
  expect_same(whiten(bt("gae_lm.advantages"), mask), whiten(moved("gae_lm.advantages"), mask),
              "whiten");

  // Each loss with clean and with junk inputs: the same loss, statistics and gradient, which is 0
  // at masked positions.
  auto check_grad = [&](const Tensor& g0, const Tensor& g1, const std::string& what) {
    expect_same(g0, g1, what);
    const std::vector<double> g = g1.to_vector<double>();
    for (size_t i = 0; i < g.size(); ++i) {
      if (m[i / (g.size() / m.size())] == 0) {
        EXPECT_EQ(g[i], 0.0) << what << "[" << i << "]";
      }
    }
  };
  {
    Tensor clean = bt("logp_new").set_requires_grad(true);
    Tensor junky = moved("logp_new").set_requires_grad(true);
    const PPOPolicyLoss p0 = ppo_policy_loss(clean, bt("logp"), bt("whiten.shifted"), mask);
    const PPOPolicyLoss p1 = ppo_policy_loss(junky, moved("logp"), moved("whiten.shifted"), mask);
    p0.loss.backward();
    p1.loss.backward();
    expect_same(p0.loss, p1.loss, "policy loss");
    EXPECT_EQ(p0.clip_frac, p1.clip_frac);
    EXPECT_EQ(p0.approx_kl, p1.approx_kl);
    EXPECT_EQ(p0.ratio_mean, p1.ratio_mean);
    check_grad(clean.grad(), junky.grad(), "dlogp_new");
  }
  {
    Tensor clean = bt("values_new").set_requires_grad(true);
    Tensor junky = moved("values_new").set_requires_grad(true);
    const PPOValueLoss v0 = ppo_value_loss(clean, bt("values"), bt("gae_lm.returns"), mask);
    const PPOValueLoss v1 = ppo_value_loss(junky, moved("values"), moved("gae_lm.returns"), mask);
    v0.loss.backward();
    v1.loss.backward();
    expect_same(v0.loss, v1.loss, "value loss");
    EXPECT_EQ(v0.clip_frac, v1.clip_frac);
    check_grad(clean.grad(), junky.grad(), "dvalues_new");
  }
  {
    // Logits must be finite (documented): masked rows get other finite values.
    const Tensor logits = golden_tensor("entropy.logits", {B, T, V});
    Tensor clean = logits.clone().set_requires_grad(true);
    Tensor junky = junk_at_masked(logits, mask, {40.0, -1e4, 3.0, 0.0}).set_requires_grad(true);
    const Tensor h0 = entropy_from_logits(clean, mask), h1 = entropy_from_logits(junky, mask);
    h0.backward();
    h1.backward();
    expect_same(h0, h1, "entropy");
    check_grad(clean.grad(), junky.grad(), "dlogits");
  }
}

TEST(PpoKLController, AdaptiveMatchesTorch) {
  const std::vector<double>& o = golden("kl_ctl.options");
  KLController ctl({o.at(0), true, o.at(1), o.at(2)});
  EXPECT_EQ(ctl.value(), o.at(0));
  const std::vector<double>& kls = golden("kl_ctl.kls");
  const std::vector<double>& steps = golden("kl_ctl.n_steps");
  const std::vector<double>& want = golden("kl_ctl.values");
  ASSERT_EQ(kls.size(), want.size());
  for (size_t i = 0; i < kls.size(); ++i) {
    ctl.update(kls[i], int64_t(steps[i]));
    EXPECT_EQ(ctl.value(), want[i]) << "update " << i;  // the same double operations as TRL's
  }
  // Its state is one double: a controller restored from it continues identically.
  KLController resumed({o.at(0), true, o.at(1), o.at(2)});
  resumed.restore(want[2]);
  for (size_t i = 3; i < kls.size(); ++i) resumed.update(kls[i], int64_t(steps[i]));
  EXPECT_EQ(resumed.value(), want.back());
}

TEST(PpoKLController, FixedNeverMoves) {
  KLController fixed({0.05, false, 0.0, 0.0});  // target and horizon unused, so unchecked
  fixed.update(100.0, 512);
  fixed.update(0.0, 512);
  EXPECT_EQ(fixed.value(), 0.05);
  KLController adaptive({0.05, true, 6.0, 10000.0});
  adaptive.update(6.0, 512);  // on target: no change
  EXPECT_EQ(adaptive.value(), 0.05);
  adaptive.update(100.0, 0);  // no samples: no change
  EXPECT_EQ(adaptive.value(), 0.05);
}

TEST(PpoErrors, BadOptionsAndInputsAreOneLineErrors) {
  const Tensor mask = golden_mask(), x = bt("logp"), scores = golden_tensor("scores", {B});
  const double nan = std::nan("");
  testing::expect_error(ExitCode::usage,
                        "per_token_rewards: kl_coef must be finite and >= 0, got -0.1",
                        [&] { per_token_rewards(x, x, scores, mask, -0.1); });
  testing::expect_error(ExitCode::usage, "gae: gamma must be in [0, 1], got 1.5",
                        [&] { gae(x, x, mask, 1.5, 0.95); });
  testing::expect_error(ExitCode::usage, "gae: lam must be in [0, 1], got -0.5",
                        [&] { gae(x, x, mask, 1.0, -0.5); });
  testing::expect_error(ExitCode::usage, "gae: gamma must be in [0, 1], got nan",
                        [&] { gae(x, x, mask, nan, 0.95); });
  testing::expect_error(ExitCode::usage,
                        "ppo_policy_loss: clip_range must be finite and >= 0, got -0.2",
                        [&] { ppo_policy_loss(x, x, x, mask, -0.2); });
  testing::expect_error(ExitCode::usage,
                        "ppo_value_loss: clip_range_value must be finite and >= 0, got -1",
                        [&] { ppo_value_loss(x, x, x, mask, -1.0); });
  testing::expect_error(ExitCode::usage, "ppo_value_loss: clip_range_value must be finite",
                        [&] { ppo_value_loss(x, x, x, mask, nan); });
  testing::expect_error(ExitCode::usage, "kl controller: target must be finite and > 0, got 0",
                        [] { KLController({0.2, true, 0.0, 10000.0}); });
  testing::expect_error(ExitCode::usage, "kl controller: horizon must be finite and > 0, got -1",
                        [] { KLController({0.2, true, 6.0, -1.0}); });
  testing::expect_error(ExitCode::usage, "kl controller: init_kl_coef must be finite and >= 0",
                        [] { KLController({-0.2, false, 6.0, 10000.0}); });
  KLController ctl;
  testing::expect_error(ExitCode::numerical, "kl controller: the current KL is nan",
                        [&] { ctl.update(nan, 256); });
  testing::expect_error(ExitCode::checkpoint, "a saved kl_coef must be finite and >= 0, got inf",
                        [&] { ctl.restore(std::numeric_limits<double>::infinity()); });
  EXPECT_EQ(ctl.value(), 0.2);

  // Shapes, dtypes and masks: the recipe's mistakes, Error(internal).
  const Tensor short_x = slice(x, 1, 0, 6);
  testing::expect_error(ExitCode::internal, "gae: values must be [B, T] = [4, 7], got [4, 6]",
                        [&] { gae(x, short_x, mask, 1.0, 0.95); });
  testing::expect_error(ExitCode::internal, "ppo_policy_loss: advantages is f32",
                        [&] { ppo_policy_loss(x, x, x.to(DType::f32), mask); });
  testing::expect_error(ExitCode::internal,
                        "ppo_value_loss: mask must be [B, T] = [4, 7], got [4, 6]",
                        [&] { ppo_value_loss(x, x, x, slice(mask, 1, 0, 6)); });
  testing::expect_error(ExitCode::internal, "per_token_rewards: scores must be [B] = [4]",
                        [&] { per_token_rewards(x, x, slice(scores, 0, 0, 3), mask, 0.1); });
  std::vector<double> m = mask.to_vector<double>();
  m[5] = 2;
  testing::expect_error(ExitCode::internal, "whiten: mask[5] is 2; a mask holds 0 or 1",
                        [&] { whiten(x, testing::ids(m, {B, T})); });
  std::vector<double> one(size_t(B * T), 0.0);
  one[3] = 1;
  testing::expect_error(ExitCode::internal, "whiten: the unbiased variance needs 2 tokens",
                        [&] { whiten(x, testing::ids(one, {B, T})); });
  const Tensor none = zeros({B, T}, DType::i64);
  testing::expect_error(ExitCode::internal, "ppo_policy_loss: the mask selects no token",
                        [&] { ppo_policy_loss(x, x, x, none); });
  testing::expect_error(ExitCode::internal, "per_token_rewards: row 1 has no response token",
                        [&] { per_token_rewards(x, x, scores, testing::ids(one, {B, T}), 0.1); });
  testing::expect_error(ExitCode::internal,
                        "entropy_from_logits: logits must be [B, T, V], got [4, 7]",
                        [&] { entropy_from_logits(x, mask); });
  testing::expect_error(ExitCode::internal, "entropy_from_logits: mask must be [B, T] = [4, 7]",
                        [&] { entropy_from_logits(zeros({B, T, V}), transpose(mask, 0, 1)); });
}

}  // namespace
}  // namespace forge::nn
