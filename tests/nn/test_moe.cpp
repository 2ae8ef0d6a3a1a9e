// The mixture-of-experts layer (nn/moe.h): its gating and balancing math against PyTorch 1.13
// goldens (tests/golden/moe.txt, written by make_moe_goldens.py), finite-difference checks through
// the gates and the normal CDF, the grouped dispatch against a dense per-expert reference, capacity
// and overflow accounting, and what the layer reports to the auxiliary-loss channel.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"
#include "nn/aux_loss.h"
#include "nn/gpt.h"
#include "nn/moe.h"
#include "tests/core/gradcheck.h"
#include "tests/test_util.h"

namespace forge {
namespace {

const testing::Goldens& goldens() {
  static const testing::Goldens table = testing::load_goldens("moe.txt");
  return table;
}

// Golden `name` as an f64 tensor of `shape`; `grad` makes it a leaf requiring grad.
Tensor golden(const std::string& name, const Shape& shape, bool grad = false) {
  Tensor t = from_vector(testing::golden_values(goldens(), name, "moe.txt"), shape, DType::f64);
  if (grad) t.set_requires_grad(true);
  return t;
}

void expect_close(const Tensor& got, const std::string& name, double tol = 1e-10) {
  const std::vector<double>& want = testing::golden_values(goldens(), name, "moe.txt");
  std::vector<double> g = got.to(DType::f64).to_vector<double>();
  ASSERT_EQ(g.size(), want.size()) << name;
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], want[i], tol * (1 + std::fabs(want[i]))) << name << "[" << i << "]";
}

constexpr int64_t N = 7, E = 5, K = 2, C = 6;

TEST(MoEGolden, TopKGatingMatchesPyTorch) {
  Tensor noisy = golden("noisy", {N, E}, true);
  nn::TopKGates top = nn::top_k_gating(noisy, K);
  expect_close(top.gates, "gates");
  expect_close(top.experts, "experts", 0);
  sum(top.gates * golden("r_gates", {N, K})).backward();
  expect_close(noisy.grad(), "gates.dnoisy");
}

TEST(MoEGolden, ImportanceAndItsCvSquaredMatchPyTorch) {
  nn::TopKGates top = nn::top_k_gating(golden("noisy", {N, E}), K);
  Tensor importance = nn::expert_importance(top.gates, top.experts, E);
  expect_close(importance, "importance");
  expect_close(nn::cv_squared(importance), "cv2_importance");
}

TEST(MoEGolden, SmoothLoadEstimatorMatchesPyTorch) {
  Tensor clean = golden("clean", {N, E}, true), noisy = golden("noisy", {N, E}, true);
  Tensor noise_std = golden("noise_std", {N, E}, true);
  Tensor load = topk_load(clean, noisy, noise_std, K);
  expect_close(load, "load");
  sum(load * golden("r_load", {E})).backward();
  expect_close(clean.grad(), "load.dclean");
  expect_close(noisy.grad(), "load.dnoisy");
  expect_close(noise_std.grad(), "load.dnoise_std");
}

// The layer's cv2 objective from its input, with the noise draw fixed: the gradient reaches x,
// W_g and W_noise through the gates, the thresholds and the CDF.
TEST(MoEGolden, Cv2LossOfALayerMatchesPyTorch) {
  Tensor x = golden("x", {N, C}, true), w_g = golden("w_g", {E, C}, true);
  Tensor w_noise = golden("w_noise", {E, C}, true);
  Tensor clean = linear(x, w_g);
  Tensor noise_std = softplus(linear(x, w_noise)) + 0.01;
  Tensor noisy = clean + golden("eps", {N, E}) * noise_std;
  nn::TopKGates top = nn::top_k_gating(noisy, K);
  Tensor loss = nn::cv_squared(nn::expert_importance(top.gates, top.experts, E)) * 0.1 +
                nn::cv_squared(topk_load(clean, noisy, noise_std, K)) * 0.1;
  expect_close(loss, "cv2_loss");
  loss.backward();
  expect_close(x.grad(), "cv2_loss.dx", 1e-9);
  expect_close(w_g.grad(), "cv2_loss.dw_g", 1e-9);
  expect_close(w_noise.grad(), "cv2_loss.dw_noise", 1e-9);
}

TEST(MoEGolden, SwitchAndZLossesMatchPyTorch) {
  Tensor logits = golden("logits", {N, E}, true);
  Tensor share = golden("switch_share", {E});
  Tensor loss = nn::switch_balance_loss(logits, share);
  expect_close(loss, "switch_loss");
  loss.backward();
  expect_close(logits.grad(), "switch_loss.dlogits");
  Tensor logits2 = golden("logits", {N, E}, true);
  Tensor z = nn::router_z_loss(logits2);
  expect_close(z, "z_loss");
  z.backward();
  expect_close(logits2.grad(), "z_loss.dlogits");
}

TEST(MoEGradCheck, ThroughTheGatesAndTheNormalCdf) {
  Tensor clean = testing::randn({N, E}, 3), noisy = testing::randn({N, E}, 4);
  Tensor noise_std = testing::rand_uniform({N, E}, 0.3, 2.0, 5);
  EXPECT_GRADCHECK([](const auto& in) { return nn::top_k_gating(in[0], K).gates; }, {noisy});
  EXPECT_GRADCHECK(
      [](const auto& in) { return topk_load(in[0], in[1], in[2], K); },
      {clean, noisy, noise_std});
  EXPECT_GRADCHECK(
      [](const auto& in) {
        nn::TopKGates top = nn::top_k_gating(in[1], K);
        return nn::cv_squared(nn::expert_importance(top.gates, top.experts, E)) +
               nn::cv_squared(topk_load(in[0], in[1], in[2], K));
      },
      {clean, noisy, noise_std});
  EXPECT_GRADCHECK([](const auto& in) { return nn::router_z_loss(in[0]); }, {clean});
}

nn::MoELayerShape small_shape(bool swiglu) {
  return {.d_model = C, .hidden = 10, .swiglu = swiglu, .bias = true, .dropout = 0.0,
          .init_std = 0.3, .proj_init_std = 0.3};
}

// out[n] = sum over n's top k experts e of gate * expert_e(x[n]), every expert applied to every
// token with plain linear(): what the grouped dispatch must equal.
Tensor dense_reference(const nn::MoE& layer, const Tensor& x) {
  const Tensor clean = linear(x, layer.router->weight);
  nn::TopKGates top = nn::top_k_gating(clean, layer.config().top_k);
  const std::vector<int64_t> ids = top.experts.to_vector<int64_t>();
  const int64_t n = x.size(0), k = layer.config().top_k;
  Tensor out = zeros({n, x.size(1)}, x.dtype());
  for (int64_t e = 0; e < layer.config().n_experts; ++e) {
    auto apply = [e](const std::shared_ptr<nn::GroupedLinear>& g, const Tensor& in) {
      return linear(in, squeeze(slice(g->weight, 0, e, e + 1), 0),
                    squeeze(slice(g->bias, 0, e, e + 1), 0));
    };
    const Tensor h = layer.fc ? gelu(apply(layer.fc, x), GeluApprox::tanh)
                              : silu(apply(layer.gate, x)) * apply(layer.up, x);
    const Tensor y = apply(layer.proj, h);  // [n, C]
    std::vector<double> mask(size_t(n * k), 0.0);
    for (size_t i = 0; i < ids.size(); ++i) mask[i] = ids[i] == e ? 1.0 : 0.0;
    const Tensor gate = sum(top.gates * from_vector(mask, {n, k}, x.dtype()), {1}, true);
    out = out + y * gate;
  }
  return out;
}

// |a - b| <= tol (1 + max |b|) elementwise, for f32 results computed in different orders.
void expect_near_all(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  const double scale = 1 + max(abs(b)).item();
  EXPECT_LE(max(abs(a - b)).item(), tol * scale) << what;
}

void expect_dispatch_matches_dense(bool swiglu) {
  nn::MoEConfig config{.every = 1, .n_experts = E, .top_k = K};
  Generator gen(5);
  nn::MoE layer(config, small_shape(swiglu), 0, gen);
  {
    NoGradGuard no_grad;
    layer.router->weight.copy_(normal({E, C}, 0.0, 1.0, gen));  // it starts at zero
  }
  layer.eval();  // no noise, no capacity limit
  Tensor x = normal({3, 4, C}, 0.0, 1.0, gen).set_requires_grad(true);
  const Tensor r = normal({3, 4, C}, 0.0, 1.0, gen);
  const Tensor out = layer.forward(x);
  sum(out * r).backward();
  std::vector<Tensor> got = {x.grad()};
  for (const NamedTensor& p : layer.named_parameters()) got.push_back(p.tensor.grad());

  Tensor x2 = x.detach().clone().set_requires_grad(true);
  layer.zero_grad();
  const Tensor ref = dense_reference(layer, reshape(x2, {12, C}));
  expect_near_all(reshape(out, {12, C}), ref, 1e-5, "output");
  sum(ref * reshape(r, {12, C})).backward();
  std::vector<Tensor> want = {x2.grad()};
  for (const NamedTensor& p : layer.named_parameters()) want.push_back(p.tensor.grad());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // The noise scale has no gradient in eval mode, on either side.
    ASSERT_EQ(got[i].defined(), want[i].defined()) << "gradient " << i;
    if (!got[i].defined()) continue;
    expect_near_all(got[i], want[i], 1e-5, "gradient " + std::to_string(i));
  }
}

TEST(MoEDispatch, GroupedExpertsEqualADenseReferenceGelu) { expect_dispatch_matches_dense(false); }
TEST(MoEDispatch, GroupedExpertsEqualADenseReferenceSwiglu) { expect_dispatch_matches_dense(true); }

TEST(MoEDispatch, ExpertCapacityIsTheCeilingOfTheShare) {
  nn::MoEConfig c{.n_experts = 8, .top_k = 2};
  EXPECT_EQ(nn::expert_capacity(c, 1.25, 768), 240);  // 1.25 * 768 * 2 / 8
  EXPECT_EQ(nn::expert_capacity(c, 1.0, 7), 2);       // ceil(1.75)
  EXPECT_EQ(nn::expert_capacity(c, 0.01, 3), 1);      // never 0
}

// Identical tokens all prefer expert 0, then expert 1: with capacity 4 of 8 tokens, tokens 0-3
// keep both experts and tokens 4-7 are dropped by both, so their output is exactly 0 (the residual
// carries them) and half the assignments are counted as dropped.
TEST(MoEDispatch, AssignmentsOverCapacityPassThroughAndAreCounted) {
  nn::MoEConfig config{.every = 1, .n_experts = 4, .top_k = 2, .noisy = false,
                       .capacity_factor = 1.0, .balance = nn::MoEBalance::none};
  Generator gen(1);
  nn::MoE layer(config, small_shape(false), 3, gen);
  const std::vector<double> preference = {2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                           0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1};
  {
    NoGradGuard no_grad;
    layer.router->weight.copy_(from_vector(preference, {4, C}));
  }
  Tensor x = ones({1, 8, C});
  nn::AuxCollector collector;
  std::vector<float> out = layer.forward(x).to_vector<float>();
  for (int64_t n = 0; n < 8; ++n) {
    double row = 0;
    for (int64_t c = 0; c < C; ++c) row += std::fabs(out[size_t(n * C + c)]);
    if (n < 4)
      EXPECT_GT(row, 0) << "token " << n;
    else
      EXPECT_EQ(row, 0) << "token " << n;
  }
  nn::AuxReport report = collector.take();
  EXPECT_TRUE(report.losses.empty());  // balance: none
  auto stat = [&](const std::string& key) {
    auto it = report.stats.find(key);
    EXPECT_NE(it, report.stats.end()) << key;
    return it == report.stats.end() ? NAN : it->second.first / double(it->second.second);
  };
  EXPECT_DOUBLE_EQ(stat("dropped_frac_l3"), 0.5);
  EXPECT_DOUBLE_EQ(stat("expert_load_l3_e0"), 0.5);  // routed, before the capacity check
  EXPECT_DOUBLE_EQ(stat("expert_load_l3_e2"), 0.0);
  EXPECT_DOUBLE_EQ(stat("cv_load_l3"), 1.0);  // shares 1/2, 1/2, 0, 0: std 1/4 over mean 1/4
}

// Capacity 1 per expert and four tokens whose first choices differ (t0: e0 then e1, t1: e1 then e0,
// t2: e2 then e3, t3: e3 then e2): first choices claim capacity before second ones, so every token
// keeps its first expert and loses its second. Token order alone would give t0 both e0 and e1 and
// leave t1 with nothing.
TEST(MoEDispatch, FirstChoicesClaimCapacityBeforeSecondChoices) {
  nn::MoEConfig config{.every = 1, .n_experts = 4, .top_k = 2, .noisy = false,
                       .capacity_factor = 0.5, .balance = nn::MoEBalance::none};
  Generator gen(6);
  nn::MoE layer(config, small_shape(false), 0, gen);
  // router[e][c]: token n is the one-hot feature n, so column n holds its logits.
  const std::vector<double> router = {2, 1, -1, -1, 0, 0,   // e0
                                      1, 2, -1, -1, 0, 0,   // e1
                                      -1, -1, 2, 1, 0, 0,   // e2
                                      -1, -1, 1, 2, 0, 0};  // e3
  {
    NoGradGuard no_grad;
    layer.router->weight.copy_(from_vector(router, {4, C}));
  }
  std::vector<double> onehot(size_t(4 * C), 0.0);
  for (int64_t n = 0; n < 4; ++n) onehot[size_t(n * C + n)] = 1.0;
  const Tensor x = from_vector(onehot, {1, 4, C});
  EXPECT_EQ(nn::expert_capacity(config, 0.5, 4), 1);
  nn::AuxCollector collector;
  const Tensor out = reshape(layer.forward(x), {4, C});
  // Each token's output is its first expert's alone, scaled by that expert's gate.
  const Tensor gates = nn::top_k_gating(linear(reshape(x, {4, C}), layer.router->weight), 2).gates;
  for (int64_t n = 0; n < 4; ++n) {
    const Tensor xn = slice(reshape(x, {4, C}), 0, n, n + 1);
    auto expert = [&](const std::shared_ptr<nn::GroupedLinear>& g, const Tensor& in) {
      return linear(in, squeeze(slice(g->weight, 0, n, n + 1), 0),
                    squeeze(slice(g->bias, 0, n, n + 1), 0));
    };
    const Tensor want = expert(layer.proj, gelu(expert(layer.fc, xn), GeluApprox::tanh)) *
                        gates.at({n, 0});
    expect_near_all(slice(out, 0, n, n + 1), want, 1e-6, "token " + std::to_string(n));
  }
  nn::AuxReport report = collector.take();
  EXPECT_DOUBLE_EQ(report.stats.at("dropped_frac_l0").first, 0.5);
}

TEST(MoEAux, BalancingLossesAreReportedInTrainingOnly) {
  nn::MoEConfig config{.every = 1, .n_experts = 4, .top_k = 2, .w_z = 0.01};
  Generator gen(2);
  nn::MoE layer(config, small_shape(false), 0, gen);
  Tensor x = normal({2, 5, C}, 0.0, 1.0, gen);
  {
    nn::AuxCollector collector;
    layer.forward(x);
    nn::AuxReport report = collector.take();
    ASSERT_EQ(report.losses.size(), 1u);
    EXPECT_TRUE(report.losses[0].requires_grad());
    EXPECT_GT(report.losses[0].item(), 0.0);
    EXPECT_EQ(report.stats.size(), 3u + 4u);  // cv_importance, cv_load, dropped_frac, 4 loads
  }
  layer.eval();
  nn::AuxCollector collector;
  layer.forward(x);
  nn::AuxReport report = collector.take();
  EXPECT_TRUE(report.losses.empty());
  EXPECT_TRUE(report.stats.empty());
}

// The noise is a function of the generator's state: the same state gives the same output (what
// makes a resumed run draw the noise the uninterrupted one drew), another state another one.
TEST(MoEAux, GatingNoiseFollowsTheDefaultGenerator) {
  nn::MoEConfig config{.every = 1, .n_experts = 4, .top_k = 1, .w_load = 0};
  Generator gen(3);
  nn::MoE layer(config, small_shape(false), 0, gen);
  {
    NoGradGuard no_grad;
    layer.router->noise.copy_(normal({4, C}, 0.0, 1.0, gen));
  }
  Tensor x = normal({1, 16, C}, 0.0, 1.0, gen);
  const GeneratorState saved = default_generator().state();
  std::vector<float> a = layer.forward(x).to_vector<float>();
  default_generator().set_state(saved);
  std::vector<float> b = layer.forward(x).to_vector<float>();
  std::vector<float> c = layer.forward(x).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(b, c);
}

TEST(MoEConfig, InconsistentSettingsNameTheField) {
  auto message = [](nn::MoEConfig c) {
    try {
      nn::check_moe_config(c);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::usage);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.n_experts = 4, .top_k = 5}).find("top_k"), std::string::npos);
  EXPECT_NE(message({.n_experts = 4, .top_k = 4}).find("top_k < n_experts"), std::string::npos);
  EXPECT_NE(message({.noisy = false}).find("noisy"), std::string::npos);
  EXPECT_EQ(message({.noisy = false, .w_load = 0}), "");
  // Every broken rule, with the fields it reads: the config loader blames their keys.
  const std::vector<nn::MoEConfigProblem> problems =
      nn::moe_config_problems({.n_experts = 4, .top_k = 5, .w_z = -1});
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_EQ(problems[0].fields, (std::vector<std::string>{"top_k", "n_experts"}));
  EXPECT_EQ(problems[0].message, "model.moe.top_k (5) must be <= model.moe.n_experts (4)");
  EXPECT_EQ(problems[1].fields, (std::vector<std::string>{"w_z"}));
  EXPECT_EQ(problems[1].message, "model.moe.w_z must be >= 0, got -1");
  EXPECT_EQ(problems[2].fields, (std::vector<std::string>{"top_k", "balance", "w_load"}));
}

// A GPT of vocabulary 64, context 16, width 16 and 2 heads, with the given MoE blocks.
nn::GPTConfig moe_gpt_config(int64_t n_layers, const nn::MoEConfig& moe) {
  nn::GPTConfig g;
  g.vocab_size = 64;
  g.context = 16;
  g.d_model = 16;
  g.n_layers = n_layers;
  g.n_heads = 2;
  g.moe = moe;
  return g;
}

// Every second block holds the MoE; the parameter count of the built model is what
// gpt_num_parameters predicts, and the active count holds top_k of n_experts experts.
TEST(MoEGPT, EverySecondBlockIsAnMoEAndParametersAreCounted) {
  const nn::GPTConfig g =
      moe_gpt_config(4, {.every = 2, .n_experts = 4, .top_k = 2, .ffn_mult = 2});
  Generator gen(4);
  nn::GPT model(g, gen);
  EXPECT_FALSE((*model.blocks)[0]->has_moe);
  EXPECT_TRUE((*model.blocks)[1]->has_moe);
  EXPECT_FALSE((*model.blocks)[2]->has_moe);
  EXPECT_TRUE((*model.blocks)[3]->has_moe);
  EXPECT_EQ(model.num_parameters(), nn::gpt_num_parameters(g));
  nn::GPTConfig dense = g;
  dense.moe.every = 0;
  // top_k = 2 experts of half the MLP's width: the dense model's MLPs, plus per MoE block its
  // router (weight and noise, [4, 16] each) and the second expert's output bias.
  EXPECT_EQ(nn::gpt_active_parameters(g), nn::gpt_num_parameters(dense) + 2 * (2 * 4 * 16 + 16));
  Tensor ids = from_vector(std::vector<double>(32, 5.0), {2, 16}, DType::i64);
  EXPECT_EQ(model.forward(ids).shape(), (Shape{2, 16, 64}));
}

// Deterministic routing in training is evaluation's routing: the same output token for token, no
// noise drawn, nothing dropped even where the training capacity would drop half the assignments;
// the guard sets it on every MoE layer and puts back what each had.
TEST(MoERouting, DeterministicRoutingInTrainingRoutesAsEvaluation) {
  nn::MoEConfig config{.every = 1, .n_experts = 4, .top_k = 2, .capacity_factor = 1.0,
                       .w_load = 0};
  Generator gen(8);
  nn::MoE layer(config, small_shape(false), 0, gen);
  {
    NoGradGuard no_grad;
    // All tokens prefer experts 0 and 1, so capacity 1.0 drops half the assignments; a noise
    // scale that would reorder them if it were drawn.
    layer.router->weight.copy_(from_vector(std::vector<double>{2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                                               0, 0, 0, 0, 0, 0, -1, -1, -1, -1,
                                                               -1, -1},
                                           {4, C}));
    layer.router->noise.copy_(full({4, C}, 3.0));
  }
  const Tensor x = ones({2, 4, C});
  layer.eval();
  const std::vector<float> evaluated = layer.forward(x).to_vector<float>();
  layer.train();
  const GeneratorState before = default_generator().state();
  nn::AuxCollector collector;
  std::vector<float> deterministic;
  {
    nn::DeterministicRouting routing(layer);
    EXPECT_TRUE(layer.deterministic_routing());
    deterministic = layer.forward(x).to_vector<float>();
  }
  EXPECT_FALSE(layer.deterministic_routing());
  EXPECT_EQ(deterministic, evaluated);
  EXPECT_EQ(default_generator().state(), before);  // no noise drawn
  nn::AuxReport report = collector.take();
  EXPECT_EQ(report.stats.at("dropped_frac_l0").first, 0.0);
  // The importance loss still trains the router; the load term, built on the noise, is off.
  ASSERT_EQ(report.losses.size(), 1u);
  EXPECT_TRUE(report.losses[0].requires_grad());
  EXPECT_NE(layer.forward(x).to_vector<float>(), evaluated);  // stochastic again
}

// A GPT whose MoE blocks all send every token to the same two of 8 experts (ln2's bias dominates
// the router's input), so any capacity limit claimed across the batch would drop assignments.
std::unique_ptr<nn::GPT> skewed_moe_gpt() {
  const nn::GPTConfig g =
      moe_gpt_config(2, {.every = 1, .n_experts = 8, .top_k = 2, .ffn_mult = 2});
  Generator gen(9);
  auto model = std::make_unique<nn::GPT>(g, gen);
  NoGradGuard no_grad;
  for (NamedTensor p : model->named_parameters()) {
    if (p.name.ends_with(".ln2.bias")) p.tensor.copy_(full({g.d_model}, 4.0));
    if (p.name.ends_with(".router.weight")) p.tensor.copy_(normal(p.tensor.shape(), 0.0, 1.0, gen));
  }
  model->eval();
  return model;
}

// Evaluation and generation route without capacity: a row's logits alone equal its logits behind
// other rows in one forward, and left-padded in a KV-cache batch as generation runs it.
TEST(MoERouting, ARowsLogitsDoNotDependOnItsBatchOrLeftPadding) {
  const std::unique_ptr<nn::GPT> gpt = skewed_moe_gpt();
  const nn::GPT& model = *gpt;
  auto row = [](int64_t n, uint64_t seed) {
    std::vector<double> ids;
    uint64_t state = seed;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      ids.push_back(double((state >> 33) % 64));
    }
    return ids;
  };
  const std::vector<double> mine = row(10, 1), other = row(10, 2), longer = row(13, 3);
  const Tensor alone = model.forward(from_vector(mine, {1, 10}, DType::i64));  // [1, 10, V]

  std::vector<double> two = other;
  two.insert(two.end(), mine.begin(), mine.end());
  const Tensor behind = model.forward(from_vector(two, {2, 10}, DType::i64));
  expect_near_all(slice(behind, 0, 1, 2), alone, 1e-5, "behind another row");

  // Generation's layout: rows right-aligned at slot 13, mine last and padded by 3 slots.
  const int64_t L = 13;
  std::vector<double> padded(size_t(2 * L), 0.0);
  std::copy(longer.begin(), longer.end(), padded.begin());
  std::copy(mine.begin(), mine.end(), padded.begin() + 2 * L - 10);
  nn::KVCache cache = model.make_cache(2, L);
  cache.start = {0, L - 10};
  const Tensor batched =
      model.forward_incremental(from_vector(padded, {2, L}, DType::i64), cache);  // [2, L, V]
  expect_near_all(slice(slice(batched, 0, 1, 2), 1, L - 10, L), alone, 1e-5, "left-padded");
}

}  // namespace
}  // namespace forge
