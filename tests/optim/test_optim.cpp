// Optimizers, clipping and name-driven groups. Trajectories of AdamW and SGD and a clip_grad_norm_
// result are replayed against PyTorch 1.13 (tests/golden/optim_goldens.txt, written by
// make_optim_goldens.py, whose init/grad formulas are mirrored below); state export/import, the
// validation messages, skipping rules, allocation-free steps and the group builder are checked
// directly.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

#include "tests/test_util.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "optim/clip.h"
#include "optim/groups.h"
#include "optim/optimizer.h"

namespace forge::optim {
namespace {

// ---- the fixture of make_optim_goldens.py ----

constexpr int kSteps = 5;
const Shape kShapes[2] = {{3, 4}, {4}};  // w (2-D, decayed), b (1-D, not decayed)

double init_value(int k, int64_t i) { return double((i * 5 + 3 + k) % 11 - 5) * 0.25; }
double grad_value(int k, int s, int64_t i) {
  return double((i * 7 + s * 13 + k * 5) % 17 - 8) * 0.0625 * double(1 + i % 3);
}
double lr_at(double base, int s) { return base * (kSteps - s) / kSteps; }

std::vector<double> values(int k, const std::function<double(int64_t)>& f) {
  std::vector<double> v(static_cast<size_t>(shape_numel(kShapes[k])));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(int64_t(i));
  return v;
}

struct Model {
  Tensor w, b;
  NamedTensors params() const { return {{"w", w}, {"b", b}}; }
};

Model make_model(DType dt = DType::f32) {
  Model m;
  m.w = from_vector(values(0, [](int64_t i) { return init_value(0, i); }), kShapes[0], dt);
  m.b = from_vector(values(1, [](int64_t i) { return init_value(1, i); }), kShapes[1], dt);
  m.w.set_requires_grad(true);
  m.b.set_requires_grad(true);
  return m;
}

// The golden runs: w at lr x1 with decay wd, b at lr x0.5 without decay.
std::vector<ParamGroup> two_groups(const Model& m, double wd) {
  return {ParamGroup{{{"w", m.w}}, 1.0, wd}, ParamGroup{{{"b", m.b}}, 0.5, 0.0}};
}

// Step s's gradients; b has none at step 2 (as in the goldens).
void set_grads(Model& m, int s, double scale = 1.0) {
  DType dt = m.w.dtype();
  m.w.set_grad(from_vector(values(0, [&](int64_t i) { return scale * grad_value(0, s, i); }), kShapes[0], dt));
  m.b.set_grad(s == 2 ? Tensor()
                      : from_vector(values(1, [&](int64_t i) { return scale * grad_value(1, s, i); }),
                                    kShapes[1], dt));
}

const testing::Goldens& goldens() {
  static const testing::Goldens table = testing::load_goldens("optim_goldens.txt");
  return table;
}

void expect_golden(const Tensor& got, const std::string& name, double rtol) {
  auto it = goldens().find(name);
  ASSERT_NE(it, goldens().end()) << "golden '" << name << "' missing from optim_goldens.txt";
  ASSERT_TRUE(got.defined()) << name;
  testing::expect_near_golden(got.to_vector<double>(), it->second, name, rtol);
}

void replay(const std::string& name, Optimizer& opt, Model& m, double base_lr, double rtol) {
  for (int s = 0; s < kSteps; ++s) {
    set_grads(m, s);
    opt.step(lr_at(base_lr, s));
    expect_golden(m.w, name + ".step" + std::to_string(s) + ".w", rtol);
    expect_golden(m.b, name + ".step" + std::to_string(s) + ".b", rtol);
  }
}

const Tensor* find(const NamedTensors& state, const std::string& name) {
  for (const NamedTensor& e : state)
    if (e.name == name) return &e.tensor;
  return nullptr;
}

// Runs fn, expecting forge::Error with `code` whose message contains `part`.
template <class F>
void expect_error(F fn, ExitCode code, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.code()), int(code)) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// ---- against PyTorch ----

TEST(AdamW, MatchesTorchTrajectory) {
  Model m = make_model();
  AdamW opt(two_groups(m, 0.1), {0.9, 0.95, 1e-8});
  replay("adamw", opt, m, 0.05, 1e-6);
  // b skipped step 2 (no grad), so its own step count is 4, as torch's state['step'].
  NamedTensors state = opt.state();
  for (std::string p : {"w", "b"})
    for (std::string kind : {"m", "v", "step"}) {
      const Tensor* t = find(state, "adamw." + kind + "." + p);
      ASSERT_NE(t, nullptr) << kind << "." << p;
      expect_golden(*t, "adamw.final." + kind + "." + p, 1e-6);
    }
}

TEST(AdamW, MatchesTorchWithLargeEpsAndDecay) {
  Model m = make_model();
  AdamW opt(two_groups(m, 0.5), {0.8, 0.999, 0.01});
  replay("adamw_eps", opt, m, 0.2, 1e-6);
}

TEST(AdamW, F64ParametersFollowTheF32Trajectory) {
  Model m = make_model(DType::f64);
  AdamW opt(two_groups(m, 0.1), {0.9, 0.95, 1e-8});
  replay("adamw", opt, m, 0.05, 1e-5);  // torch ran in f32: agreement to f32 accuracy only
}

TEST(SGD, MatchesTorchWithMomentum) {
  Model m = make_model();
  SGD opt(two_groups(m, 0.01), {0.9, false});
  replay("sgd_momentum", opt, m, 0.1, 1e-6);
}

TEST(SGD, MatchesTorchWithNesterov) {
  Model m = make_model();
  SGD opt(two_groups(m, 0.01), {0.9, true});
  replay("sgd_nesterov", opt, m, 0.1, 1e-6);
}

TEST(SGD, MatchesTorchWithoutMomentum) {
  Model m = make_model();
  SGD opt(two_groups(m, 0.05), {});
  replay("sgd_plain", opt, m, 0.1, 1e-6);
  EXPECT_TRUE(opt.state().empty());
}

TEST(Clip, MatchesTorchClipGradNorm) {
  for (auto [name, max_norm] : {std::pair{"clip", 1.0}, std::pair{"clip_loose", 100.0}}) {
    Model m = make_model();
    set_grads(m, 1, 3.0);
    double norm = clip_grad_norm(m.params(), max_norm);
    expect_golden(scalar(norm, DType::f64), std::string(name) + ".norm", 1e-6);
    expect_golden(m.w.grad(), std::string(name) + ".w", 1e-6);
    expect_golden(m.b.grad(), std::string(name) + ".b", 1e-6);
  }
}

// ---- the update loop against a plain double-precision formula, on a tensor big enough for the
// threaded path ----

TEST(AdamW, LargeTensorMatchesScalarFormula) {
  const int64_t n = 100003;
  std::vector<double> p0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    p0[size_t(i)] = std::sin(0.001 * double(i));
    g[size_t(i)] = std::cos(0.0037 * double(i)) * 0.01;
  }
  Tensor p = from_vector(p0, {n}).set_requires_grad(true);
  AdamW opt({ParamGroup{{{"p", p}}, 1.0, 0.1}}, {0.9, 0.999, 1e-8});
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999;
  std::vector<double> ref = p0, m(size_t(n), 0.0), v(size_t(n), 0.0);
  for (int t = 1; t <= 2; ++t) {
    p.set_grad(from_vector(g, {n}));
    opt.step(lr);
    for (size_t i = 0; i < size_t(n); ++i) {
      ref[i] *= 1 - lr * 0.1;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  std::vector<double> got = p.to_vector<double>();
  for (size_t i = 0; i < size_t(n); i += 997) EXPECT_NEAR(got[i], ref[i], 2e-6) << i;
}

// ---- step semantics ----

TEST(Optimizer, LrMultFrozenGroupsAndMissingGradients) {
  Tensor a = from_vector(std::vector<double>{1.0, 2.0}, {2}).set_requires_grad(true);
  Tensor b = from_vector(std::vector<double>{1.0, 2.0}, {2}).set_requires_grad(true);
  Tensor c = from_vector(std::vector<double>{1.0, 2.0}, {2}).set_requires_grad(true);
  SGD opt({ParamGroup{{{"a", a}}, 0.5, 0.0}, ParamGroup{{{"b", b}}, 1.0, 0.0, true},
           ParamGroup{{{"c", c}}, 1.0, 0.0}});
  a.set_grad(ones({2}));
  b.set_grad(ones({2}));  // frozen group: ignored even with a gradient
  opt.step(0.25);         // c has no gradient: skipped
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{0.875, 1.875}));  // 1 - 0.25*0.5*1
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  opt.groups()[1].frozen = false;
  opt.step(0.25);
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{0.75, 1.75}));
}

TEST(Optimizer, ZeroGradDropsEveryGradient) {
  Model m = make_model();
  AdamW opt(two_groups(m, 0.0));
  set_grads(m, 0);
  opt.zero_grad();
  EXPECT_FALSE(m.w.grad().defined());
  EXPECT_FALSE(m.b.grad().defined());
  std::vector<double> before = m.w.to_vector<double>();
  opt.step(0.1);
  EXPECT_EQ(m.w.to_vector<double>(), before);
  EXPECT_TRUE(opt.state().empty());
}

TEST(Optimizer, StepsAllocateNothingAfterTheFirst) {
  for (const char* name : {"adamw", "sgd"}) {
    Model m = make_model();
    auto opt = make_optimizer({name, 0.9, 0.999, 1e-8, 0.9, true}, two_groups(m, 0.1));
    set_grads(m, 0);
    opt->step(0.1);
    set_grads(m, 1);
    uint64_t before = allocator::stats().allocs;
    opt->step(0.1);
    opt->step(0.1);
    EXPECT_EQ(allocator::stats().allocs, before) << name;
  }
}

// ---- state export / import ----

TEST(AdamW, LoadedStateContinuesTheSameTrajectory) {
  Model straight = make_model();
  AdamW full(two_groups(straight, 0.1), {0.9, 0.95, 1e-8});
  for (int s = 0; s < kSteps; ++s) set_grads(straight, s), full.step(lr_at(0.05, s));

  Model first = make_model();
  AdamW before(two_groups(first, 0.1), {0.9, 0.95, 1e-8});
  for (int s = 0; s < 3; ++s) set_grads(first, s), before.step(lr_at(0.05, s));
  NamedTensors saved;
  for (const NamedTensor& e : before.state()) saved.push_back({e.name, e.tensor.clone()});

  Model resumed = make_model();
  {
    NoGradGuard no_grad;
    resumed.w.copy_(first.w);
    resumed.b.copy_(first.b);
  }
  AdamW after(two_groups(resumed, 0.1), {0.9, 0.95, 1e-8});
  after.load_state(saved);
  for (int s = 3; s < kSteps; ++s) set_grads(resumed, s), after.step(lr_at(0.05, s));
  EXPECT_EQ(resumed.w.to_vector<float>(), straight.w.to_vector<float>());
  EXPECT_EQ(resumed.b.to_vector<float>(), straight.b.to_vector<float>());
  EXPECT_EQ(find(after.state(), "adamw.step.b")->item(), 4.0);
}

TEST(SGD, LoadedStateContinuesTheSameTrajectory) {
  Model straight = make_model();
  SGD full(two_groups(straight, 0.01), {0.9, true});
  for (int s = 0; s < kSteps; ++s) set_grads(straight, s), full.step(lr_at(0.1, s));

  Model resumed = make_model();
  SGD before(two_groups(resumed, 0.01), {0.9, true});
  for (int s = 0; s < 2; ++s) set_grads(resumed, s), before.step(lr_at(0.1, s));
  NamedTensors saved = before.state();
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0].name, "sgd.momentum.w");
  SGD after(two_groups(resumed, 0.01), {0.9, true});
  after.load_state(saved);
  for (int s = 2; s < kSteps; ++s) set_grads(resumed, s), after.step(lr_at(0.1, s));
  EXPECT_EQ(resumed.w.to_vector<float>(), straight.w.to_vector<float>());
}

TEST(AdamW, LoadStateRejectsMismatchesAndChangesNothing) {
  Model m = make_model();
  AdamW opt(two_groups(m, 0.1));
  set_grads(m, 0);
  opt.step(0.1);
  NamedTensors good = opt.state();
  auto with = [&](const std::string& name, const Tensor& t) {
    NamedTensors s = good;
    for (NamedTensor& e : s)
      if (e.name == name) e.tensor = t;
    return s;
  };
  auto load = [&](const NamedTensors& s) { return [&opt, s] { opt.load_state(s); }; };

  expect_error(load(with("adamw.v.w", zeros({4, 3}))), ExitCode::checkpoint,
               "'adamw.v.w' has shape [4, 3], expected [3, 4]");
  expect_error(load(with("adamw.step.b", scalar(1.5))), ExitCode::checkpoint,
               "'adamw.step.b' must be a positive integer, got 1.5");
  NamedTensors extra = good;
  extra.push_back({"adamw.m.lm_head.weight", zeros({2})});
  expect_error(load(extra), ExitCode::checkpoint, "unexpected entry 'adamw.m.lm_head.weight'");
  NamedTensors missing(good.begin() + 1, good.end());  // adamw.m.w dropped
  expect_error(load(missing), ExitCode::checkpoint, "'adamw.m.w' is missing (the state has 'adamw.v.w')");
  NamedTensors twice = good;
  twice.push_back(good[0]);
  expect_error(load(twice), ExitCode::checkpoint, "duplicate entry 'adamw.m.w'");
  expect_error(load({{"sgd.momentum.w", zeros({3, 4})}}), ExitCode::checkpoint,
               "unexpected entry 'sgd.momentum.w' (expected adamw.{m,v,step}.<parameter>");

  // Every failed load left the state as it was; an empty state resets it.
  std::vector<float> m_before = good[0].tensor.to_vector<float>();
  EXPECT_EQ(find(opt.state(), "adamw.m.w")->to_vector<float>(), m_before);
  EXPECT_EQ(opt.state().size(), 6u);
  opt.load_state({});
  EXPECT_TRUE(opt.state().empty());
}

// ---- hyper-parameter validation ----

TEST(Optimizer, ValidatesHyperParametersQuotingTheValue) {
  Model m = make_model();
  expect_error([&] { AdamW(two_groups(m, 0.1), {0.9, 1.5, 1e-8}); }, ExitCode::usage,
               "adamw: beta2 must be in [0, 1), got 1.5");
  expect_error([&] { AdamW(two_groups(m, 0.1), {-0.1, 0.9, 1e-8}); }, ExitCode::usage,
               "adamw: beta1 must be in [0, 1), got -0.1");
  expect_error([&] { AdamW(two_groups(m, 0.1), {0.9, 0.99, -1}); }, ExitCode::usage,
               "adamw: eps must be >= 0, got -1");
  expect_error([&] { SGD(two_groups(m, 0.1), {-0.5, false}); }, ExitCode::usage,
               "sgd: momentum must be >= 0, got -0.5");
  expect_error([&] { SGD(two_groups(m, 0.1), {0.0, true}); }, ExitCode::usage,
               "sgd: nesterov needs momentum > 0, got 0");
  expect_error([&] { SGD(two_groups(m, -0.1)); }, ExitCode::usage,
               "sgd: group 0 weight_decay must be >= 0, got -0.1");
  expect_error([&] { SGD({ParamGroup{m.params(), -2.0}}); }, ExitCode::usage,
               "sgd: group 0 lr_mult must be >= 0, got -2");
  expect_error([&] { make_optimizer({"adam"}, two_groups(m, 0.1)); }, ExitCode::usage,
               "optimizer: unknown name 'adam' (expected adamw or sgd)");
  expect_error([&] { SGD({ParamGroup{{{"w", m.w}, {"w2", m.w}}}}); }, ExitCode::internal,
               "'w2' is the same tensor as an earlier parameter");
}

// ---- clipping and the non-finite scan ----

TEST(Clip, LeavesGradientsAloneUnlessTheNormExceedsMax) {
  Tensor a = from_vector(std::vector<double>{3.0, 0.0}, {2}).set_requires_grad(true);
  Tensor b = from_vector(std::vector<double>{0.0}, {1}).set_requires_grad(true);
  Tensor c = from_vector(std::vector<double>{0.0}, {1}).set_requires_grad(true);  // no grad
  a.set_grad(from_vector(std::vector<double>{3.0, 0.0}, {2}));
  b.set_grad(from_vector(std::vector<double>{4.0}, {1}));
  NamedTensors ps = {{"a", a}, {"b", b}, {"c", c}};
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 0.0), 5.0);  // max_norm 0: measure only
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 5.0), 5.0);  // not above max: untouched
  EXPECT_EQ(b.grad().item(), 4.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);
  EXPECT_NEAR(b.grad().item(), 4.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(clip_grad_norm(ps, 0.0), 1.0, 1e-6);
  EXPECT_FALSE(c.grad().defined());
}

TEST(Clip, NonFiniteNormLeavesGradientsForTheNanPolicy) {
  Tensor a = from_vector(std::vector<double>{1.0, 2.0}, {2}).set_requires_grad(true);
  Tensor b = from_vector(std::vector<double>{1.0, 2.0, 3.0}, {3}).set_requires_grad(true);
  Tensor c = from_vector(std::vector<double>{1.0}, {1}).set_requires_grad(true);
  NamedTensors ps = {{"a", a}, {"b", b}, {"c", c}};
  EXPECT_EQ(first_nonfinite_grad(ps), std::nullopt);  // no gradients at all
  a.set_grad(from_vector(std::vector<double>{1.0, -2.0}, {2}));
  b.set_grad(from_vector(std::vector<double>{0.0, INFINITY, 1.0}, {3}));
  c.set_grad(from_vector(std::vector<double>{NAN}, {1}));
  EXPECT_EQ(first_nonfinite_grad(ps), std::optional<std::string>("b"));
  EXPECT_EQ(first_nonfinite_grad({{"a", a}, {"c", c}}), std::optional<std::string>("c"));
  EXPECT_EQ(first_nonfinite_grad({{"a", a}}), std::nullopt);
  EXPECT_TRUE(std::isnan(clip_grad_norm(ps, 1.0)));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1.0, -2.0}));
}

// ---- groups from names ----

NamedTensors gpt_params(int n_blocks) {
  NamedTensors ps;
  auto add = [&](const std::string& name, Shape shape) {
    ps.push_back({name, zeros(shape).set_requires_grad(true)});
  };
  add("tok_emb.weight", {16, 4});
  add("pos_emb.weight", {8, 4});
  for (int i = 0; i < n_blocks; ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    add(b + "ln1.weight", {4});
    add(b + "attn.qkv.weight", {12, 4});
    add(b + "attn.qkv.bias", {12});
  }
  add("ln_f.weight", {4});
  add("ln_f.bias", {4});
  return ps;
}

// name -> (lr_mult, weight_decay, frozen) over all groups.
std::map<std::string, std::tuple<double, double, bool>> settings(const std::vector<ParamGroup>& gs) {
  std::map<std::string, std::tuple<double, double, bool>> out;
  for (const ParamGroup& g : gs)
    for (const NamedTensor& p : g.params) out[p.name] = {g.lr_mult, g.weight_decay, g.frozen};
  return out;
}

TEST(Groups, BlockIndexAndGlob) {
  EXPECT_EQ(block_index("blocks.3.attn.qkv.weight"), 3);
  EXPECT_EQ(block_index("encoder.blocks.12.mlp.fc.bias"), 12);
  EXPECT_EQ(block_index("myblocks.3.w"), std::nullopt);
  EXPECT_EQ(block_index("blocks.x.w"), std::nullopt);
  EXPECT_EQ(block_index("blocks.3"), std::nullopt);
  EXPECT_EQ(block_index("tok_emb.weight"), std::nullopt);
  EXPECT_TRUE(glob_match("tok_emb.*", "tok_emb.weight"));
  EXPECT_TRUE(glob_match("blocks.0.*", "blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(glob_match("blocks.0.*", "blocks.10.attn.qkv.weight"));
  EXPECT_TRUE(glob_match("blocks.?.attn.*", "blocks.7.attn.proj.bias"));
  EXPECT_FALSE(glob_match("blocks.?.attn.*", "blocks.17.attn.proj.bias"));
  EXPECT_TRUE(glob_match("*.bias", "blocks.1.attn.qkv.bias"));
  EXPECT_TRUE(glob_match("*a*b*c", "xaxxbxbxc"));
  EXPECT_FALSE(glob_match("*a*b*c", "xaxxbxbxcd"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("ln_f.weight", "ln_f.weigh"));
  EXPECT_TRUE(glob_match_any({"*.lora_A", "*.lora_B"}, "blocks.0.attn.q.lora_B"));
  EXPECT_FALSE(glob_match_any({"*.lora_A", "*.lora_B"}, "blocks.0.attn.q.weight"));
  EXPECT_FALSE(glob_match_any({}, "anything"));
}

TEST(Groups, DecayOnlyOnMatricesUnlessDecay1d) {
  NamedTensors ps = gpt_params(2);
  auto s = settings(build_param_groups(ps, {.weight_decay = 0.1}));
  EXPECT_EQ(std::get<1>(s["tok_emb.weight"]), 0.1);
  EXPECT_EQ(std::get<1>(s["blocks.1.attn.qkv.weight"]), 0.1);
  EXPECT_EQ(std::get<1>(s["blocks.1.attn.qkv.bias"]), 0.0);
  EXPECT_EQ(std::get<1>(s["ln_f.weight"]), 0.0);
  EXPECT_EQ(build_param_groups(ps, {.weight_decay = 0.1}).size(), 2u);  // decay, no decay
  s = settings(build_param_groups(ps, {.weight_decay = 0.1, .decay_1d = true}));
  EXPECT_EQ(std::get<1>(s["ln_f.weight"]), 0.1);
}

TEST(Groups, LayerwiseLearningRates) {
  // L = 3 blocks, decay 2: block i gets 1/2^(2-i); embeddings 1/2^3; ln_f (above) 1.
  NamedTensors ps = gpt_params(3);
  LayerMap map = layer_map(ps);
  EXPECT_EQ(map.n_blocks, 3);
  EXPECT_EQ(map.layer.front(), -1);
  EXPECT_EQ(map.layer.back(), 3);
  auto s = settings(build_param_groups(ps, {.layer_lr_decay = 2.0}));
  EXPECT_EQ(std::get<0>(s["tok_emb.weight"]), 0.125);
  EXPECT_EQ(std::get<0>(s["pos_emb.weight"]), 0.125);
  EXPECT_EQ(std::get<0>(s["blocks.0.attn.qkv.weight"]), 0.25);
  EXPECT_EQ(std::get<0>(s["blocks.1.ln1.weight"]), 0.5);
  EXPECT_EQ(std::get<0>(s["blocks.2.attn.qkv.bias"]), 1.0);
  EXPECT_EQ(std::get<0>(s["ln_f.bias"]), 1.0);
  EXPECT_NEAR(layer_lr_mult(0, 4, 2.6), 1 / (2.6 * 2.6 * 2.6), 1e-15);
  expect_error([] { build_param_groups({{"w", zeros({2, 2})}}, {.layer_lr_decay = 2.6}); }, ExitCode::usage,
               "need parameters named blocks.<i>.*, but none is, got e.g. 'w'");
  expect_error([&] { build_param_groups(ps, {.layer_lr_decay = 0.8}); }, ExitCode::usage,
               "optimizer: layer_lr_decay must be >= 1 (the factor dividing the lr per block going "
               "down; 1 = off), got 0.8");
}

TEST(Groups, FreezePatterns) {
  NamedTensors ps = gpt_params(2);
  auto groups = build_param_groups(ps, {.weight_decay = 0.1, .freeze = {"tok_emb.*", "blocks.0.*"}});
  auto s = settings(groups);
  EXPECT_TRUE(std::get<2>(s["tok_emb.weight"]));
  EXPECT_TRUE(std::get<2>(s["blocks.0.attn.qkv.bias"]));
  EXPECT_FALSE(std::get<2>(s["pos_emb.weight"]));
  EXPECT_FALSE(std::get<2>(s["blocks.1.ln1.weight"]));
  EXPECT_FALSE(ps[0].tensor.requires_grad());  // tok_emb: backward skips it
  EXPECT_TRUE(ps[1].tensor.requires_grad());
  // Pattern-frozen groups stay frozen whatever the step.
  EXPECT_FALSE(apply_unfreezing(groups, 1000000));
  EXPECT_TRUE(std::get<2>(settings(groups)["tok_emb.weight"]));
  expect_error([&] { build_param_groups(ps, {.freeze = {"tok_embb.*"}}); }, ExitCode::usage,
               "freeze pattern matches no parameter, got 'tok_embb.*'");
}

TEST(Groups, LrScaleMultipliesTheLayersRateOfMatchingParameters) {
  NamedTensors ps = gpt_params(2);
  // The first matching pattern wins: ln_f.weight takes 4, not 3.
  auto s = settings(build_param_groups(
      ps, {.layer_lr_decay = 2.0, .lr_scale = {{"*.qkv.*", 16.0}, {"ln_f.weight", 4.0},
                                               {"ln_f.*", 3.0}}}));
  EXPECT_EQ(std::get<0>(s["blocks.0.attn.qkv.weight"]), 8.0);  // 1/2 * 16
  EXPECT_EQ(std::get<0>(s["blocks.1.attn.qkv.bias"]), 16.0);
  EXPECT_EQ(std::get<0>(s["blocks.0.ln1.weight"]), 0.5);
  EXPECT_EQ(std::get<0>(s["ln_f.weight"]), 4.0);
  EXPECT_EQ(std::get<0>(s["ln_f.bias"]), 3.0);
  EXPECT_EQ(std::get<0>(s["tok_emb.weight"]), 0.25);
  expect_error([&] { build_param_groups(ps, {.lr_scale = {{"*.lora_B", 16.0}}}); },
               ExitCode::usage, "lr scale pattern matches no parameter, got '*.lora_B'");
  expect_error([&] { build_param_groups(ps, {.lr_scale = {{"ln_f.*", 0.0}}}); }, ExitCode::usage,
               "an lr scale must be > 0, got 0");
}

TEST(Groups, GradualUnfreezingSchedule) {
  // L = 2, every 10 steps: layers from the top are ln_f (2), block 1, block 0, embeddings (-1).
  EXPECT_FALSE(is_frozen(2, 0, 2, 10));
  EXPECT_TRUE(is_frozen(1, 9, 2, 10));
  EXPECT_FALSE(is_frozen(1, 10, 2, 10));
  EXPECT_TRUE(is_frozen(0, 19, 2, 10));
  EXPECT_FALSE(is_frozen(0, 20, 2, 10));
  EXPECT_TRUE(is_frozen(-1, 29, 2, 10));
  EXPECT_FALSE(is_frozen(-1, 30, 2, 10));
  EXPECT_FALSE(is_frozen(-1, 0, 2, 0));  // off

  NamedTensors ps = gpt_params(2);
  GroupSpec spec;
  spec.unfreeze_every = 10;
  spec.freeze = {"pos_emb.*"};
  auto groups = build_param_groups(ps, spec);
  auto trainable = [&] {
    std::vector<std::string> names;
    for (const ParamGroup& g : groups)
      for (const NamedTensor& p : g.params)
        if (!g.frozen) {
          names.push_back(p.name);
          EXPECT_TRUE(p.tensor.requires_grad()) << p.name;
        } else {
          EXPECT_FALSE(p.tensor.requires_grad()) << p.name;
        }
    return names.size();
  };
  EXPECT_EQ(trainable(), 2u);  // ln_f.weight, ln_f.bias
  EXPECT_FALSE(apply_unfreezing(groups, 9));
  EXPECT_TRUE(apply_unfreezing(groups, 10));
  EXPECT_EQ(trainable(), 5u);  // + blocks.1.*
  EXPECT_TRUE(apply_unfreezing(groups, 25));
  EXPECT_EQ(trainable(), 8u);  // + blocks.0.*
  EXPECT_TRUE(apply_unfreezing(groups, 30));
  EXPECT_EQ(trainable(), 9u);  // + tok_emb; pos_emb stays frozen by pattern
  EXPECT_TRUE(apply_unfreezing(groups, 0));  // a resume at an earlier step refreezes
  EXPECT_EQ(trainable(), 2u);
}

}  // namespace
}  // namespace forge::optim
