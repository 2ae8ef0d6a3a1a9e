// LoRA and module replacement: Module::replace (forward follows the swap, errors name the path),
// LoRALinear against PyTorch 1.13 goldens (tests/golden/lora.txt, written by make_lora_goldens.py)
// and by finite differences, inject_lora on GPT and BERT (starts at the base bitwise, names kept,
// target errors), trainable selection, merge/unmerge, and the allocation-free parameter count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/core/gradcheck.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/bert.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "nn/module.h"

namespace forge::nn {
namespace {

using testing::exit_code_of;

GPTConfig tiny_gpt(bool llama = false) { return testing::tiny_gpt_config(llama); }

// A Llama-shaped tiny GPT as the hub's checkpoints have it: q, k and v apart, 2 query heads
// sharing 1 key/value head.
GPTConfig llama_gqa() {
  GPTConfig c = tiny_gpt(true);
  c.fused_qkv = false;
  c.n_kv_heads = 1;
  return c;
}

const std::vector<std::string> kHubTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};

LoRAConfig lora_config(std::vector<std::string> targets, int64_t rank = 4) {
  LoRAConfig c;
  c.rank = rank;
  c.alpha = 8;
  c.targets = std::move(targets);
  return c;
}

Tensor some_ids() { return from_vector({1, 4, 7, 2, 9, 0, 3, 3, 5, 10, 8, 6}, {2, 6}, DType::i64); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const NamedTensor& n : named) out.push_back(n.name);
  return out;
}

// The message of the forge::Error `f` throws, with its code checked.
std::string error_of(const std::function<void()>& f, ExitCode code = ExitCode::usage) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

// Every lora_B gets N(0, 0.1) values, so the low-rank branch is not zero.
void randomize_lora_B(Module& model, uint64_t seed) {
  Generator gen(seed);
  NoGradGuard no_grad;
  for (NamedTensor& p : model.named_parameters())
    if (p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".lora_B") == 0)
      p.tensor.copy_(normal(p.tensor.shape(), 0.0, 0.1, gen));
}

struct Zero : UnaryModule {
  Tensor forward(const Tensor& x) const override { return x * 0.0; }
};

// ---- Module::replace ----

TEST(LoRAReplace, ForwardUsesTheNewModule) {
  Generator g1(5), g2(5);
  GPT swapped(tiny_gpt(), g1), zeroed(tiny_gpt(), g2);
  swapped.eval();
  swapped.replace("blocks.1.attn.proj", std::make_shared<Zero>());
  {
    NoGradGuard no_grad;
    for (NamedTensor& p : zeroed.named_parameters())
      if (p.name.rfind("blocks.1.attn.proj.", 0) == 0) p.tensor.copy_(zeros(p.tensor.shape()));
  }
  EXPECT_EQ(max_abs_diff(swapped.forward(some_ids()), zeroed.forward(some_ids())), 0.0);
  // The old module's parameters are gone; the rest keep their names and order.
  std::vector<std::string> want;
  for (const std::string& n : names_of(zeroed.named_parameters()))
    if (n.rfind("blocks.1.attn.proj.", 0) != 0) want.push_back(n);
  EXPECT_EQ(names_of(swapped.named_parameters()), want);
  // The new module takes on the model's training mode.
  EXPECT_FALSE(swapped.find_module("blocks.1.attn.proj")->is_training());
}

TEST(LoRAReplace, ErrorsNameThePath) {
  Generator gen(0);
  GPT m(tiny_gpt(), gen);
  auto zero = std::make_shared<Zero>();
  EXPECT_NE(error_of([&] { m.replace("blocks.9.attn.qkv", zero); }).find("'blocks.9.attn.qkv'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.replace("blocks.0.attn.qkvx", zero); }).find("not a module"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m.replace("", zero); }).find("not a module"), std::string::npos);
  // The parent holds attention as a SelfAttention (its forward takes a cache): not replaceable.
  std::string held = error_of([&] { m.replace("blocks.0.attn", zero); });
  EXPECT_NE(held.find("'blocks.0.attn'"), std::string::npos) << held;
  EXPECT_NE(held.find("SelfAttention"), std::string::npos) << held;
  // A slot needing a UnaryModule refuses a module that is not one.
  std::string type = error_of([&] { m.replace("blocks.0.attn.qkv", std::make_shared<Module>()); });
  EXPECT_NE(type.find("needs a UnaryModule, got a Module"), std::string::npos) << type;
  EXPECT_NE(error_of([&] { m.replace("ln_f", nullptr); }).find("null"), std::string::npos);
  // Nothing was swapped by the failed calls.
  EXPECT_NE(dynamic_cast<Linear*>(m.find_module("blocks.0.attn.qkv")), nullptr);
}

// ---- LoRALinear ----

struct GoldenLoRA {
  Tensor x, w, b, a, bb;
};

GoldenLoRA golden_inputs(const testing::Goldens& g, DType dtype) {
  auto t = [&](const std::string& name, const Shape& shape, bool grad) {
    Tensor v = from_vector(testing::golden_values(g, "lora." + name, "lora.txt"), shape, dtype);
    v.set_requires_grad(grad);
    return v;
  };
  return {t("x", {2, 3, 5}, true), t("w", {6, 5}, false), t("b", {6}, false), t("a", {4, 5}, true),
          t("bb", {6, 4}, true)};
}

TEST(LoRALinear, MatchesPyTorch) {
  const testing::Goldens g = testing::load_goldens("lora.txt");
  for (DType dtype : {DType::f64, DType::f32}) {
    for (bool rs : {false, true}) {
      const std::string v = rs ? "rslora" : "lora";
      LoRAConfig c = lora_config({"*"});
      c.rslora = rs;
      GoldenLoRA in = golden_inputs(g, dtype);
      LoRALinear layer(in.w, in.b, in.a, in.bb, lora_scale(c));
      Tensor y = layer.forward(in.x);
      Tensor r = from_vector(testing::golden_values(g, v + ".r", "lora.txt"), y.shape(), dtype);
      sum(y * r).backward();
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
      auto want = [&](const std::string& k) { return testing::golden_values(g, v + "." + k, "lora.txt"); };
      testing::expect_near_golden(y.to_vector<double>(), want("y"), v + ".y", tol);
      testing::expect_near_golden(in.x.grad().to_vector<double>(), want("dx"), v + ".dx", tol);
      testing::expect_near_golden(layer.lora_A.grad().to_vector<double>(), want("da"), v + ".da", tol);
      testing::expect_near_golden(layer.lora_B.grad().to_vector<double>(), want("dbb"), v + ".dbb",
                                  tol);
      EXPECT_FALSE(layer.weight.grad().defined());
      layer.merge();
      testing::expect_near_golden(layer.weight.to_vector<double>(), want("merged_w"),
                                  v + ".merged_w", tol);
    }
  }
}

TEST(LoRALinear, GradCheck) {
  for (bool with_bias : {true, false}) {
    Tensor x = testing::randn({2, 3, 5}, 1), a = testing::randn({3, 5}, 2),
           b = testing::randn({4, 3}, 3);
    Tensor w = testing::randn({4, 5}, 4).detach(), bias = testing::randn({4}, 5).detach();
    LoRALinear layer(w, with_bias ? bias : Tensor(), a, b, 1.7);
    EXPECT_GRADCHECK([&](const std::vector<Tensor>&) { return layer.forward(x); }, {x, a, b});
  }
}

TEST(LoRALinear, InitEqualsBaseAndWrapsItsTensors) {
  Generator gen(3);
  Linear base(5, 7, true, gen);
  Generator lg(9);
  LoRALinear layer(base, lora_config({"*"}, 3), lg);
  EXPECT_EQ(layer.weight.impl(), base.weight.impl());
  EXPECT_EQ(layer.bias.impl(), base.bias.impl());
  EXPECT_FALSE(layer.weight.requires_grad());
  EXPECT_FALSE(layer.bias.requires_grad());
  EXPECT_TRUE(layer.lora_A.requires_grad());
  EXPECT_EQ(layer.lora_A.shape(), Shape({3, 5}));
  EXPECT_EQ(layer.lora_B.shape(), Shape({7, 3}));
  EXPECT_DOUBLE_EQ(layer.scale(), 8.0 / 3.0);
  EXPECT_EQ(names_of(layer.named_parameters()),
            (std::vector<std::string>{"weight", "bias", "lora_A", "lora_B"}));
  // A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0.
  double lo = 1, hi = -1;
  for (double v : layer.lora_A.to_vector<double>()) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -1 / std::sqrt(5.0));
  EXPECT_LE(hi, 1 / std::sqrt(5.0));
  EXPECT_LT(lo, -0.1);
  EXPECT_GT(hi, 0.1);
  for (double v : layer.lora_B.to_vector<double>()) EXPECT_EQ(v, 0.0);
  Tensor x = normal({4, 5}, 0, 1, gen);
  EXPECT_EQ(max_abs_diff(layer.forward(x), base.forward(x)), 0.0);
}

TEST(LoRALinear, DropoutOnlyOnTheBranchInput) {
  Generator gen(3);
  Linear base(8, 8, true, gen);
  LoRAConfig c = lora_config({"*"});
  c.dropout = 0.5;
  LoRALinear layer(base, c, gen);
  Tensor x = normal({64, 8}, 0, 1, gen);
  // B = 0: the base path is never dropped, in training too.
  EXPECT_EQ(max_abs_diff(layer.forward(x), base.forward(x)), 0.0);
  {
    NoGradGuard no_grad;
    layer.lora_B.copy_(normal(layer.lora_B.shape(), 0.0, 0.5, gen));
  }
  Tensor branch = linear(linear(x, layer.lora_A) * layer.scale(), layer.lora_B);
  layer.eval();
  EXPECT_LT(max_abs_diff(layer.forward(x), base.forward(x) + branch), 1e-5);
  layer.train();
  EXPECT_GT(max_abs_diff(layer.forward(x), base.forward(x) + branch), 1e-2);
}

TEST(LoRALinear, MergeUnmergeRestoreAndMisuseIsAnError) {
  Generator gen(4);
  GPT m(tiny_gpt(), gen);
  const Tensor before = m.forward(some_ids());
  std::vector<std::vector<double>> w0;
  for (const NamedTensor& p : m.named_parameters()) w0.push_back(p.tensor.to_vector<double>());
  inject_lora(m, lora_config({"*.attn.qkv", "*.mlp.fc"}), gen);
  randomize_lora_B(m, 7);
  const Tensor unmerged = m.forward(some_ids());
  EXPECT_GT(max_abs_diff(unmerged, before), 1e-3);  // the adapters do something
  merge_lora(m);
  auto* qkv = dynamic_cast<LoRALinear*>(m.find_module("blocks.0.attn.qkv"));
  ASSERT_NE(qkv, nullptr);
  EXPECT_TRUE(qkv->merged());
  EXPECT_GT(max_abs_diff(qkv->weight, from_vector(w0[4], qkv->weight.shape())), 1e-4);
  EXPECT_LT(max_abs_diff(m.forward(some_ids()), unmerged), 1e-5);
  EXPECT_EQ(exit_code_of([&] { qkv->merge(); }), ExitCode::usage);
  EXPECT_EQ(exit_code_of([&] { merge_lora(m); }), ExitCode::usage);
  unmerge_lora(m);
  EXPECT_FALSE(qkv->merged());
  size_t k = 0;
  for (const NamedTensor& p : m.named_parameters()) {
    if (p.name.find(".lora_") != std::string::npos) continue;
    EXPECT_LT(max_abs_diff(p.tensor, from_vector(w0[k++], p.tensor.shape())), 1e-6) << p.name;
  }
  EXPECT_EQ(k, w0.size());
  EXPECT_LT(max_abs_diff(m.forward(some_ids()), unmerged), 1e-6);
  EXPECT_EQ(exit_code_of([&] { qkv->unmerge(); }), ExitCode::usage);
  Generator g2(4);
  GPT plain(tiny_gpt(), g2);
  EXPECT_NE(error_of([&] { merge_lora(plain); }).find("no LoRA layers"), std::string::npos);
}

// ---- inject_lora ----

TEST(LoRAInject, StartsAtTheBaseBitwiseAndKeepsBaseNames) {
  for (bool llama : {false, true}) {
    Generator gen(11);
    GPT m(tiny_gpt(llama), gen);
    const Tensor before = m.forward(some_ids());
    const std::vector<std::string> base_names = names_of(m.named_parameters());
    Generator lg(1);
    std::vector<std::string> replaced =
        inject_lora(m, lora_config({"*.attn.qkv", "*.attn.proj", "*.mlp.*"}), lg);
    std::vector<std::string> want_paths, want_names;
    for (int l = 0; l < 2; ++l) {
      const std::string b = "blocks." + std::to_string(l) + ".";
      for (const char* s : {"attn.qkv", "attn.proj"}) want_paths.push_back(b + s);
      if (llama) {
        for (const char* s : {"mlp.gate", "mlp.up", "mlp.proj"}) want_paths.push_back(b + s);
      } else {
        for (const char* s : {"mlp.fc", "mlp.proj"}) want_paths.push_back(b + s);
      }
    }
    EXPECT_EQ(replaced, want_paths);
    // Base names unchanged and in order; each adapted layer adds lora_A, lora_B after its own.
    for (const std::string& n : base_names) {
      want_names.push_back(n);
      const bool last_of_layer = n.size() > 5 && (llama ? n.compare(n.size() - 7, 7, ".weight") == 0
                                                        : n.compare(n.size() - 5, 5, ".bias") == 0);
      const std::string path = n.substr(0, n.rfind('.'));
      if (last_of_layer && std::find(want_paths.begin(), want_paths.end(), path) != want_paths.end()) {
        want_names.push_back(path + ".lora_A");
        want_names.push_back(path + ".lora_B");
      }
    }
    EXPECT_EQ(names_of(m.named_parameters()), want_names);
    for (const std::string& p : replaced)
      EXPECT_NE(dynamic_cast<LoRALinear*>(m.find_module(p)), nullptr) << p;
    EXPECT_EQ(max_abs_diff(m.forward(some_ids()), before), 0.0) << (llama ? "llama" : "gpt2");
  }
}

// PEFT's target_modules as a Llama's hub directory names them: each bare name is its module in
// every block, the same adapters (same draws) as the Forge globs; all-linear is every Linear but
// the output layer. q_proj, k_proj and v_proj on a fused attn.qkv are refused, naming the key.
TEST(LoRAInject, HubNamesAdaptTheirModuleInEveryBlock) {
  auto adapted = [](const GPTConfig& c, const std::vector<std::string>& targets) {
    Generator gen(5);
    GPT m(c, gen);
    Generator lg(1);
    std::vector<std::string> paths = inject_lora(m, lora_config(targets), lg);
    std::vector<std::vector<float>> adapters;
    for (const NamedTensor& p : m.named_parameters())
      if (p.name.ends_with(".lora_A")) adapters.push_back(p.tensor.to_vector<float>());
    return std::make_pair(paths, adapters);
  };
  const GPTConfig llama = llama_gqa();
  const auto hub = adapted(llama, kHubTargets);
  const auto globs = adapted(llama, {"*.attn.q", "*.attn.k", "*.attn.v", "*.attn.proj",
                                     "*.mlp.gate", "*.mlp.up", "*.mlp.proj"});
  std::vector<std::string> want;
  for (const char* b : {"blocks.0.", "blocks.1."})
    for (const char* s : {"attn.q", "attn.k", "attn.v", "attn.proj", "mlp.gate", "mlp.up",
                          "mlp.proj"})
      want.push_back(std::string(b) + s);
  EXPECT_EQ(hub.first, want);
  EXPECT_EQ(hub.second, globs.second);
  EXPECT_EQ(adapted(llama, {"v_proj", "q_proj"}).first,
            (std::vector<std::string>{"blocks.0.attn.q", "blocks.0.attn.v", "blocks.1.attn.q",
                                      "blocks.1.attn.v"}));
  GPTConfig untied = llama;
  untied.tie_embeddings = false;
  EXPECT_EQ(adapted(untied, {"all-linear"}).first, want);  // not lm_head
  // The default targets: every projection of attention and the MLP, fused or not.
  const std::vector<std::string> fallback = {"*.attn.*", "*.mlp.*"};
  EXPECT_EQ(adapted(llama, fallback).first, want);
  EXPECT_EQ(adapted(tiny_gpt(), fallback).first,
            adapted(tiny_gpt(), {"*.attn.qkv", "*.attn.proj", "*.mlp.*"}).first);

  // A fused model has no attn.q to adapt apart: exit 2 naming the key and both ways out, from
  // injection and from the count `forge validate` prints alike.
  const GPTConfig fused = tiny_gpt(true);
  for (const std::string name : {"q_proj", "k_proj", "v_proj"}) {
    Generator gen(0);
    GPT m(fused, gen);
    const std::string injected = error_of([&] { inject_lora(m, lora_config({name}), gen); });
    EXPECT_EQ(error_of([&] { lora_parameter_count(fused, lora_config({name})); }), injected);
    for (const std::string& part :
         std::vector<std::string>{"lora.targets: '" + name + "'", "model.fused_qkv: false",
                                  "target attn.qkv", "'blocks.0.attn.qkv'"})
      EXPECT_NE(injected.find(part), std::string::npos) << injected;
  }
  EXPECT_EQ(adapted(fused, {"o_proj"}).first,
            (std::vector<std::string>{"blocks.0.attn.proj", "blocks.1.attn.proj"}));
  const std::string gelu =
      error_of([&] { lora_parameter_count(tiny_gpt(), lora_config({"up_proj"})); });
  EXPECT_NE(gelu.find("target 'up_proj' ('*.mlp.up') matches no Linear layer"), std::string::npos)
      << gelu;
}

// A LoRA policy's DPO reference: with its adapters off the model is its base, bitwise, whatever
// the adapters hold; they come back on at the end of the scope.
TEST(LoRAInject, AdaptersOffIsTheBaseBitwise) {
  Generator gen(11);
  GPT m(tiny_gpt(false), gen);
  const Tensor base = m.forward(some_ids());
  Generator lg(1);
  inject_lora(m, lora_config({"*.attn.qkv", "*.mlp.*"}), lg);
  {
    NoGradGuard no_grad;
    for (NamedTensor p : m.named_parameters())
      if (p.name.ends_with(".lora_B")) p.tensor.copy_(full(p.tensor.shape(), 0.05, p.tensor.dtype()));
  }
  const Tensor adapted = m.forward(some_ids());
  ASSERT_GT(max_abs_diff(adapted, base), 1e-3);
  {
    AdaptersDisabled off(m);
    EXPECT_EQ(max_abs_diff(m.forward(some_ids()), base), 0.0);
  }
  EXPECT_EQ(max_abs_diff(m.forward(some_ids()), adapted), 0.0);

  merge_lora(m);
  EXPECT_NE(error_of([&] { AdaptersDisabled off(m); }).find("merged"), std::string::npos);
  unmerge_lora(m);  // restores W up to rounding; the failed guard turned nothing off
  EXPECT_LT(max_abs_diff(m.forward(some_ids()), adapted), 1e-6);
  Generator pg(2);
  GPT plain(tiny_gpt(false), pg);
  EXPECT_NE(error_of([&] { AdaptersDisabled off(plain); }).find("no LoRA layers"),
            std::string::npos);
}

TEST(LoRAInject, SameSeedSameAdapters) {
  auto adapters = [](uint64_t seed) {
    Generator gen(0);
    GPT m(tiny_gpt(), gen);
    Generator lg(seed);
    inject_lora(m, lora_config({"*.qkv", "*.proj"}), lg);
    std::vector<double> all;
    for (const NamedTensor& p : m.named_parameters())
      if (p.name.find("lora_A") != std::string::npos)
        for (double v : p.tensor.to_vector<double>()) all.push_back(v);
    return all;
  };
  EXPECT_EQ(adapters(1), adapters(1));
  EXPECT_NE(adapters(1), adapters(2));
  // Distinct layers draw distinct values (the generator advances in module order).
  std::vector<double> a = adapters(1);
  EXPECT_NE(std::vector<double>(a.begin(), a.begin() + 8),
            std::vector<double>(a.begin() + 4 * 16, a.begin() + 4 * 16 + 8));
}

TEST(LoRAInject, BertFeedForwardAndHeads) {
  BertConfig c;
  c.vocab_size = 13;
  c.max_positions = 9;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 40;
  c.dropout = 0.0;
  Generator gen(2);
  Bert m(c, gen);
  Tensor ids = from_vector({1, 4, 7, 2, 9, 0, 3, 3, 5, 10}, {2, 5}, DType::i64);
  BertOutputs before = m.forward(ids, Tensor(), Tensor());
  std::vector<std::string> replaced =
      inject_lora(m, lora_config({"blocks.*.ff.*", "pooler", "mlm.dense"}), gen);
  EXPECT_EQ(replaced, (std::vector<std::string>{"blocks.0.ff.fc", "blocks.0.ff.proj",
                                                "blocks.1.ff.fc", "blocks.1.ff.proj", "pooler",
                                                "mlm.dense"}));
  randomize_lora_B(m, 3);
  BertOutputs after = m.forward(ids, Tensor(), Tensor());
  EXPECT_GT(max_abs_diff(after.hidden, before.hidden), 1e-4);  // the swapped layers are used
  EXPECT_GT(max_abs_diff(after.pooled, before.pooled), 1e-4);
  EXPECT_GT(max_abs_diff(m.mlm_logits(after.hidden), m.mlm_logits(before.hidden)), 1e-4);
}

TEST(LoRAInject, TargetErrorsNameThePattern) {
  Generator gen(0);
  GPT m(tiny_gpt(), gen);
  std::string none = error_of([&] { inject_lora(m, lora_config({"*.qkv", "*.nothing"}), gen); });
  EXPECT_NE(none.find("'*.nothing' matches no Linear"), std::string::npos) << none;
  std::string other = error_of([&] { inject_lora(m, lora_config({"blocks.0.attn"}), gen); });
  EXPECT_NE(other.find("'blocks.0.attn' matches no Linear layer (it matches 'blocks.0.attn', a "
                       "SelfAttention)"),
            std::string::npos)
      << other;
  std::string norm = error_of([&] { inject_lora(m, lora_config({"*.ln?"}), gen); });
  EXPECT_NE(norm.find("a LayerNorm"), std::string::npos) << norm;
  EXPECT_EQ(exit_code_of([&] { inject_lora(m, lora_config({}), gen); }), ExitCode::usage);
  EXPECT_EQ(exit_code_of([&] { inject_lora(m, lora_config({"*.qkv"}, 0), gen); }), ExitCode::usage);
  // Errors come before any swap: the model is untouched.
  EXPECT_NE(dynamic_cast<Linear*>(m.find_module("blocks.0.attn.qkv")), nullptr);
  // A layer already adapted is no longer a Linear.
  inject_lora(m, lora_config({"*.qkv"}), gen);
  std::string twice = error_of([&] { inject_lora(m, lora_config({"*.qkv"}), gen); });
  EXPECT_NE(twice.find("a LoRALinear"), std::string::npos) << twice;
}

// The elements of the adapters inject_lora(GPT(c), lc) adds.
int64_t injected_adapter_count(const GPTConfig& c, const LoRAConfig& lc) {
  Generator gen(0);
  GPT m(c, gen);
  inject_lora(m, lc, gen);
  int64_t n = 0;
  for (const NamedTensor& p : m.named_parameters())
    if (p.name.find(".lora_") != std::string::npos) n += p.tensor.numel();
  return n;
}

TEST(LoRAInject, ParameterCountFromConfigMatchesInjection) {
  GPTConfig untied = tiny_gpt();
  untied.tie_embeddings = false;
  GPTConfig llama = llama_gqa(), llama_untied = llama_gqa();
  llama_untied.tie_embeddings = false;
  for (const GPTConfig& c : {tiny_gpt(), tiny_gpt(true), untied, llama, llama_untied}) {
    const bool fused = c.fused_qkv;
    for (const std::vector<std::string>& targets :
         {std::vector<std::string>{fused ? "*.attn.qkv" : "*.attn.q", "*.attn.proj"},
          std::vector<std::string>{"*"}, std::vector<std::string>{"blocks.1.mlp.*", "lm_head"},
          std::vector<std::string>{"*.attn.*", "*.mlp.*"}, std::vector<std::string>{"all-linear"},
          std::vector<std::string>{"k_proj", "o_proj", "down_proj", "lm_head"}, kHubTargets}) {
      if (targets.back() == "lm_head" && c.tie_embeddings) continue;
      if (targets[0].ends_with("_proj") && (fused || c.mlp != MLPType::swiglu)) continue;
      const LoRAConfig lc = lora_config(targets, 3);
      EXPECT_EQ(lora_parameter_count(c, lc), injected_adapter_count(c, lc)) << targets[0];
    }
  }
  // Grouped-query attention: k and v project d_model 16 to one head of 8.
  EXPECT_EQ(lora_parameter_count(llama, lora_config({"k_proj", "v_proj"}, 3)),
            2 * 2 * 3 * (16 + 8));
  GPTConfig big;  // GPT-2 124M: counted, not built
  big.vocab_size = 50257;
  big.context = 1024;
  big.d_model = 768;
  big.n_layers = 12;
  big.n_heads = 12;
  EXPECT_EQ(lora_parameter_count(big, lora_config({"*.attn.qkv"}, 8)), 12 * 8 * (768 + 3 * 768));
  std::string other = error_of([&] { lora_parameter_count(tiny_gpt(), lora_config({"*.attn"})); });
  EXPECT_NE(other.find("(it matches 'blocks.0.attn', a SelfAttention)"), std::string::npos) << other;
  std::string norm = error_of([&] { lora_parameter_count(tiny_gpt(true), lora_config({"ln_f"})); });
  EXPECT_NE(norm.find("a RMSNorm"), std::string::npos) << norm;
}

// An MoE base: its expert layers are GroupedLinear and its routers Router, not Linear, so the count
// from the config adapts the dense blocks only, as inject_lora does, and refuses what it refuses
// with the same message.
TEST(LoRAInject, ParameterCountOfAnMoEBaseMatchesInjection) {
  GPTConfig c = tiny_gpt();
  c.moe = {.every = 2, .n_experts = 3, .top_k = 2, .ffn_mult = 2};  // block 1 is an MoE
  for (const std::vector<std::string>& targets :
       {std::vector<std::string>{"*.mlp.fc"}, std::vector<std::string>{"*"},
        std::vector<std::string>{"*.mlp.*", "*.attn.qkv"}}) {
    const LoRAConfig lc = lora_config(targets, 3);
    EXPECT_EQ(lora_parameter_count(c, lc), injected_adapter_count(c, lc)) << targets[0];
  }
  GPTConfig all = c;
  all.moe.every = 1;  // no dense MLP left
  for (const std::string target : {"*.mlp.fc", "*.router"}) {
    Generator gen(0);
    GPT m(all, gen);
    const std::string injected = error_of([&] { inject_lora(m, lora_config({target}), gen); });
    const std::string counted = error_of([&] { lora_parameter_count(all, lora_config({target})); });
    EXPECT_EQ(counted, injected);
    EXPECT_NE(counted.find(target == "*.router" ? "a Router" : "a GroupedLinear"),
              std::string::npos)
        << counted;
  }
}

// ---- select_trainable ----

TEST(LoRATrainable, OnlySelectedParametersGetGradients) {
  Generator gen(6);
  GPT m(tiny_gpt(), gen);
  inject_lora(m, lora_config({"*.attn.qkv", "*.mlp.fc"}), gen);
  randomize_lora_B(m, 8);
  NamedTensors selected =
      select_trainable(m.named_parameters(), {"*.lora_A", "*.lora_B", "ln_f.*"});
  EXPECT_EQ(selected.size(), 2u * 2 * 2 + 2);
  Tensor logits = m.forward(some_ids());
  cross_entropy(reshape(logits, {-1, 11}), reshape(some_ids(), {-1})).backward();
  for (const NamedTensor& p : m.named_parameters()) {
    const bool trainable = p.name.find(".lora_") != std::string::npos || p.name.rfind("ln_f.", 0) == 0;
    EXPECT_EQ(p.tensor.requires_grad(), trainable) << p.name;
    EXPECT_EQ(p.tensor.grad().defined(), trainable) << p.name;
    if (trainable) {
      EXPECT_GT(max_abs_diff(p.tensor.grad(), zeros_like(p.tensor)), 0.0) << p.name;
    }
  }
  std::string none = error_of([&] { select_trainable(m.named_parameters(), {"*.lora_C"}); });
  EXPECT_NE(none.find("'*.lora_C' matches no parameter"), std::string::npos) << none;
}

// A LoRA base kept in bf16: every frozen Linear weight and the embedding tables convert in place
// (norms, biases and the adapters stay f32), the model's output is the bf16 computation
// of the same weights, and backward still reaches the adapters.
TEST(KeepFrozenInBf16, ConvertsTheFrozenMatricesInPlaceAndTheModelStillTrains) {
  Generator gen(4);
  GPT m(tiny_gpt(), gen);
  inject_lora(m, lora_config({"*.attn.qkv", "*.mlp.fc"}), gen);
  randomize_lora_B(m, 7);
  select_trainable(m.named_parameters(), {"*.lora_*"});
  Tensor fp32_bf16_products;
  {
    MatmulPrecisionScope bf16(MatmulPrecision::bf16);
    fp32_bf16_products = m.forward(some_ids());
  }
  const Tensor fp32 = m.forward(some_ids());
  int64_t want = 0;
  for (const NamedTensor& p : m.named_parameters())
    if (!p.tensor.requires_grad() && p.tensor.dim() == 2) want += p.tensor.numel();
  EXPECT_EQ(keep_frozen_in_bf16(m), want);
  for (const NamedTensor& p : m.named_parameters()) {
    const bool narrowed = !p.tensor.requires_grad() && p.tensor.dim() == 2;
    EXPECT_EQ(p.tensor.dtype(), narrowed ? DType::bf16 : DType::f32) << p.name;
  }
  auto* qkv = dynamic_cast<LoRALinear*>(m.find_module("blocks.0.attn.qkv"));
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->weight.dtype(), DType::bf16);  // the member sees what the registry holds
  // In fp32 mode the bf16 weights multiply in bf16 and the adapters in f32; against every product
  // in bf16 that differs only in the adapters' rounding, against fp32 only by bf16's.
  const Tensor narrowed = m.forward(some_ids());
  EXPECT_LT(max_abs_diff(narrowed, fp32_bf16_products), 2e-2);
  EXPECT_GT(max_abs_diff(narrowed, fp32), 1e-5);
  EXPECT_LT(max_abs_diff(narrowed, fp32), 5e-2);
  sum(narrowed).backward();
  EXPECT_TRUE(qkv->lora_A.grad().defined());
  EXPECT_FALSE(qkv->weight.grad().defined());
  EXPECT_EQ(exit_code_of([&] { merge_lora(m); }), ExitCode::usage);  // no merge into bf16
}

}  // namespace
}  // namespace forge::nn
