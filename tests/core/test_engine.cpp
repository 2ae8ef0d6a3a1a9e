// Autograd engine behaviour: fan-out, shared weights, accumulation, no-grad, detach, deep graphs,
// retain_graph, freeing of saved tensors, gradient checkpointing and steady-state allocation.
#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "core/ops.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

Tensor vec(std::vector<double> v) {
  int64_t n = int64_t(v.size());
  return from_vector(v, {n}, DType::f64).set_requires_grad(true);
}

TEST(Engine, FanOutSumsGradients) {
  Tensor x = vec({1.0, -2.0, 3.0});
  Tensor y = sum(add(mul(x, x), x));  // d/dx = 2x + 1
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3.0, -3.0, 7.0}));
}

TEST(Engine, SharedWeightReceivesBothUses) {
  Tensor w = vec({0.5, 2.0});
  Tensor a = from_vector(std::vector<double>{1.0, 2.0}, {2}, DType::f64);
  Tensor b = from_vector(std::vector<double>{10.0, 20.0}, {2}, DType::f64);
  Tensor loss = add(sum(mul(w, a)), sum(mul(tanh(mul(w, b)), 0.0)));  // second use, zero weight
  loss = add(loss, sum(mul(w, b)));
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{11.0, 22.0}));
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = vec({1.0, 2.0});
  sum(mul(x, 3.0)).backward();
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6.0, 6.0}));
  x.set_grad(Tensor());
  sum(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1.0, 1.0}));
}

TEST(Engine, LeafAdoptsAnUnsharedGradientButCopiesAnAliasedOne) {
  Tensor x = vec({1.0, 2.0});
  exp(x).backward(ones({2}, DType::f64));  // exp's gradient buffer is fresh: adopted, no copy
  EXPECT_EQ(x.grad().to_vector<double>()[0], std::exp(1.0));
  // add hands the same dout to both inputs; each leaf must end up with a buffer of its own.
  Tensor a = vec({1.0}), b = vec({2.0});
  Tensor seed = from_vector(std::vector<double>{3.0}, {1}, DType::f64);
  add(a, b).backward(seed);
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  EXPECT_FALSE(a.grad().shares_storage(seed));
  {
    NoGradGuard g;
    a.grad().fill_(0.0);
  }
  EXPECT_EQ(b.grad().item(), 3.0);
  EXPECT_EQ(seed.item(), 3.0);
}

TEST(Engine, RequiresGradPropagates) {
  Tensor a = from_vector(std::vector<double>{1.0}, {1}, DType::f64);
  Tensor b = vec({2.0});
  EXPECT_FALSE(exp(a).requires_grad());
  EXPECT_TRUE(add(a, b).requires_grad());
  EXPECT_TRUE(add(a, b).grad_fn() != nullptr);
  EXPECT_EQ(op_name(add(a, b).grad_fn()->op), std::string("add"));
  EXPECT_TRUE(b.is_leaf());
  EXPECT_FALSE(add(a, b).is_leaf());
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor x = vec({1.0, 2.0});
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Tensor y = exp(x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(exp(x).requires_grad());
}

TEST(Engine, DetachStopsGradientButSharesStorage) {
  Tensor x = vec({1.0, 2.0});
  Tensor d = x.detach();
  EXPECT_TRUE(d.shares_storage(x));
  EXPECT_FALSE(d.requires_grad());
  Tensor y = sum(add(mul(x, d), x));  // d is a constant: dy/dx = d + 1
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 3.0}));
}

TEST(Engine, DeepChainNeitherOverflowsTheStackInBackwardNorOnDestruction) {
  Tensor x = vec({0.0});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = add(y, 1e-3);
  sum(y).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 1.0);
  y = Tensor();  // destroys a 100 000-node chain
  SUCCEED();
}

TEST(Engine, DeepChainWithRetainedGraphDestroys) {
  Tensor x = vec({0.5});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = mul(y, 1.0);
  y.backward(ones({1}, DType::f64), /*retain_graph=*/true);
  EXPECT_DOUBLE_EQ(x.grad().item(), 1.0);
}

TEST(Engine, RetainGraphAllowsASecondBackward) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = sum(exp(x));
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 2 * std::exp(1.0), 1e-12);
  EXPECT_NEAR(g[1], 2 * std::exp(2.0), 1e-12);
  try {
    y.backward();
    FAIL() << "a third backward through a freed graph must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, SavedTensorsAreFreedAfterBackward) {
  Tensor x = normal({1 << 18}, 0, 1, default_generator()).set_requires_grad(true);
  Tensor loss = sum(exp(x));  // exp saves its 1 MiB output
  size_t before = allocator::stats().current_bytes;
  loss.backward();
  x.set_grad(Tensor());
  size_t after = allocator::stats().current_bytes;
  EXPECT_LE(after + (size_t(1) << 20), before) << "exp's saved output is still alive";
}

TEST(Engine, SeedGradientForNonScalarOutputs) {
  Tensor x = vec({1.0, 2.0, 3.0});
  Tensor y = mul(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  EXPECT_THROW(y.backward(ones({2}, DType::f64)), Error);
  y.backward(from_vector(std::vector<double>{1.0, 0.0, -1.0}, {3}, DType::f64));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 0.0, -2.0}));
}

TEST(Engine, BackwardIsBitwiseDeterministic) {
  auto grads = [] {
    Generator g(3);
    Tensor x = normal({64, 33}, 0, 1, g).set_requires_grad(true);
    Tensor h = x;
    for (int i = 0; i < 5; ++i) h = add(h, mul(tanh(h), sigmoid(h)));
    sum(mul(h, h)).backward();
    return x.grad().to_vector<float>();
  };
  EXPECT_EQ(grads(), grads());
}

TEST(Engine, InPlaceUpdateOfATensorThatRequiresGradIsRefused) {
  Tensor x = vec({1.0});
  EXPECT_THROW(x.fill_(2.0), Error);
  NoGradGuard guard;
  x.fill_(2.0);
  EXPECT_EQ(x.item(), 2.0);
}

TEST(Engine, OnlyLeavesCanBeMadeToRequireGrad) {
  Tensor y = exp(vec({1.0}));
  EXPECT_THROW(y.set_requires_grad(true), Error);
}

// A residual block that, like a transformer block, saves several activations per output:
// h + w2 * sigmoid(u) * tanh(u) with u = gelu(h * w1).
Tensor block(const Tensor& h, const Tensor& w1, const Tensor& w2) {
  Tensor u = gelu(mul(h, w1));
  return add(h, mul(w2, mul(sigmoid(u), tanh(u))));
}

struct StackResult {
  std::vector<double> dx, dw;
  size_t peak_bytes;
};

StackResult run_stack(bool use_checkpoint, double dropout_p = 0.0) {
  Generator g(11);
  Tensor x = normal({64, 4096}, 0, 1, g).set_requires_grad(true);
  std::vector<Tensor> w1, w2;
  for (int i = 0; i < 8; ++i) {
    w1.push_back(normal({4096}, 0, 0.5, g).set_requires_grad(true));
    w2.push_back(normal({4096}, 0, 0.5, g).set_requires_grad(true));
  }
  manual_seed(99);
  allocator::reset_peak();
  size_t base = allocator::stats().current_bytes;
  Tensor h = x;
  for (int i = 0; i < 8; ++i) {
    auto fn = [&, i](const std::vector<Tensor>& in) {
      return dropout(block(in[0], w1[size_t(i)], w2[size_t(i)]), dropout_p, true);
    };
    h = use_checkpoint ? checkpoint(fn, {h}) : fn({h});
  }
  Tensor loss = sum(mul(h, h));
  loss.backward();
  size_t peak = allocator::stats().peak_bytes - base;
  std::vector<double> dw;
  for (auto& w : w1) {
    auto v = w.grad().to_vector<double>();
    dw.insert(dw.end(), v.begin(), v.end());
  }
  return {x.grad().to_vector<double>(), dw, peak};
}

TEST(Engine, CheckpointGivesTheSameGradientsWithLessPeakMemory) {
  StackResult plain = run_stack(false), ckpt = run_stack(true);
  ASSERT_EQ(plain.dx.size(), ckpt.dx.size());
  for (size_t i = 0; i < plain.dx.size(); ++i) ASSERT_EQ(plain.dx[i], ckpt.dx[i]) << i;
  for (size_t i = 0; i < plain.dw.size(); ++i) ASSERT_EQ(plain.dw[i], ckpt.dw[i]) << i;
  std::printf("[ info ] 8-block stack peak memory: %.1f MiB plain, %.1f MiB checkpointed\n",
              plain.peak_bytes / 1048576.0, ckpt.peak_bytes / 1048576.0);
  EXPECT_LT(double(ckpt.peak_bytes), 0.5 * double(plain.peak_bytes));
}

TEST(Engine, CheckpointReplaysDropoutMasks) {
  StackResult plain = run_stack(false, 0.2), ckpt = run_stack(true, 0.2);
  for (size_t i = 0; i < plain.dx.size(); ++i) ASSERT_EQ(plain.dx[i], ckpt.dx[i]) << i;
}

TEST(Engine, SteadyStateTrainingStepDoesNotHitMalloc) {
  Generator g(5);
  Tensor w = normal({256, 64}, 0, 1, g).set_requires_grad(true);
  Tensor x = normal({256, 64}, 0, 1, g);
  auto step = [&] {
    Tensor loss = mean(mul(gelu(mul(x, w)), sigmoid(w)));
    loss.backward();
    NoGradGuard no_grad;
    w.copy_(sub(w, mul(w.grad(), 0.1)));
    w.set_grad(Tensor());
  };
  step();
  step();
  uint64_t before = allocator::stats().system_allocs;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(allocator::stats().system_allocs, before);
}

FORGE_GRADCHECK(checkpoint, residual_block) {
  Tensor x = testing::randn({3, 4}, 1), w1 = testing::randn({4}, 2), w2 = testing::randn({4}, 3);
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return checkpoint([&](const std::vector<Tensor>& v) { return block(v[0], in[1], in[2]); },
                          {in[0]});
      },
      {x, w1, w2});
}

}  // namespace
}  // namespace forge
