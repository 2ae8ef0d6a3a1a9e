// nn/ tests: Module registration and dotted names, loading by name, layers, the GPT model (names,
// counts, init, tying, train/eval, activation checkpointing, a short overfit run), PyTorch 1.13
// goldens for loss and gradients (tests/golden/gpt.txt, written by make_gpt_goldens.py), and KV-cached
// incremental decoding matching the full forward.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <numbers>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/attention.h"
#include "nn/gpt.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace forge::nn {
namespace {


GPTConfig tiny_config(bool llama = false) { return testing::tiny_gpt_config(llama); }

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const NamedTensor& n : named) out.push_back(n.name);
  return out;
}

Tensor ids_tensor(const std::vector<double>& values, int64_t B, int64_t T) {
  return from_vector(values, {B, T}, DType::i64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

Tensor lm_loss(const GPT& model, const Tensor& ids, const Tensor& targets) {
  Tensor logits = model.forward(ids);
  return cross_entropy(reshape(logits, {-1, logits.size(2)}), reshape(targets, {-1}));
}

// ---- Module ----

struct Leaf : Module {
  Leaf() {
    w = register_parameter("w", zeros({2, 3}));
    register_buffer("stat", ones({3}));
    register_buffer("table", ones({4}), /*persistent=*/false);
  }
  Tensor w;
};

struct Tree : Module {
  Tree() {
    a = register_module("a", std::make_shared<Leaf>());
    scale = register_parameter("scale", ones({1}));
    list = register_module("list", std::make_shared<ModuleList<Leaf>>());
    list->push_back(std::make_shared<Leaf>());
    list->push_back(std::make_shared<Leaf>());
  }
  std::shared_ptr<Leaf> a;
  Tensor scale;
  std::shared_ptr<ModuleList<Leaf>> list;
};

TEST(NnModule, NamesFollowRegistrationOrder) {
  Tree t;
  EXPECT_EQ(names_of(t.named_parameters()),
            (std::vector<std::string>{"a.w", "scale", "list.0.w", "list.1.w"}));
  EXPECT_EQ(names_of(t.named_buffers()),
            (std::vector<std::string>{"a.stat", "a.table", "list.0.stat", "list.0.table",
                                      "list.1.stat", "list.1.table"}));
  EXPECT_EQ(names_of(t.named_buffers(true)),
            (std::vector<std::string>{"a.stat", "list.0.stat", "list.1.stat"}));
  EXPECT_EQ(names_of(t.named_state()), (std::vector<std::string>{"a.w", "scale", "list.0.w",
                                                                  "list.1.w", "a.stat",
                                                                  "list.0.stat", "list.1.stat"}));
  std::vector<std::string> modules;
  for (auto& [name, m] : t.named_modules()) modules.push_back(name);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "a", "list", "list.0", "list.1"}));
  EXPECT_EQ(t.num_parameters(), 6 + 1 + 6 + 6);
  EXPECT_EQ(t.parameters().size(), 4u);
  EXPECT_TRUE(t.a->w.requires_grad());
  EXPECT_TRUE(t.named_parameters()[0].tensor.impl() == t.a->w.impl());  // handles, not copies
  EXPECT_THROW(t.register_parameter("scale", ones({1})), Error);  // duplicate
  EXPECT_THROW(t.register_buffer("a", ones({1})), Error);         // clashes with a child
  EXPECT_THROW(t.register_parameter("x.y", ones({1})), Error);    // dots are separators
}

TEST(NnModule, TrainEvalPropagates) {
  Tree t;
  t.eval();
  for (auto& [name, m] : t.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  t.list->train();
  EXPECT_FALSE(t.is_training());
  EXPECT_FALSE(t.a->is_training());
  EXPECT_TRUE((*t.list)[1]->is_training());
}

TEST(NnModule, LoadNamedCopiesAndValidates) {
  Tree t;
  NamedTensors src;
  for (const NamedTensor& s : t.named_state()) src.push_back({s.name, full(s.tensor.shape(), 7.0)});
  t.load_named(src);
  EXPECT_EQ(t.list->operator[](1)->w.at({1, 2}), 7.0);
  EXPECT_EQ(t.named_buffers()[0].tensor.at({0}), 7.0);  // persistent buffer loaded
  EXPECT_EQ(t.named_buffers()[1].tensor.at({0}), 1.0);  // derived buffer untouched

  auto expect_error = [&](NamedTensors bad, bool strict, const std::vector<std::string>& parts) {
    try {
      t.load_named(bad, strict);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::checkpoint);
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  };
  NamedTensors wrong_shape = src;
  wrong_shape[2].tensor = full({3, 2}, 1.0);
  wrong_shape[0].tensor = full({2, 3}, 9.0);  // valid, but must not be copied: the load fails
  expect_error(wrong_shape, true, {"list.0.w", "[3, 2]", "[2, 3]"});
  EXPECT_EQ(t.a->w.at({0, 0}), 7.0);
  NamedTensors wrong_dtype = src;
  wrong_dtype[1].tensor = full({1}, 1.0, DType::f64);
  expect_error(wrong_dtype, true, {"scale", "f64", "f32"});
  NamedTensors missing(src.begin() + 1, src.end());
  expect_error(missing, true, {"a.w", "missing"});
  NamedTensors extra = src;
  extra.push_back({"b.w", zeros({1})});
  expect_error(extra, true, {"b.w", "unexpected"});
  EXPECT_NO_THROW(t.load_named(extra, /*strict=*/false));
}

// ---- layers ----

TEST(NnLayers, ForwardMatchesOps) {
  Generator gen(3);
  Linear lin(4, 5, true, gen);
  EXPECT_EQ(names_of(lin.named_parameters()), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_LE(max(abs(lin.weight)).item(), 0.5);  // U(-1/sqrt(4), 1/sqrt(4))
  Tensor x = normal({2, 3, 4}, 0, 1, gen);
  EXPECT_EQ(max_abs_diff(lin.forward(x), linear(x, lin.weight, lin.bias)), 0.0);
  Linear nobias(4, 5, false, gen);
  EXPECT_EQ(nobias.named_parameters().size(), 1u);
  Linear gpt_style(200, 300, true, gen, 0.02);
  EXPECT_NEAR(std::sqrt(var(gpt_style.weight, {0, 1}).item()), 0.02, 0.0005);
  EXPECT_EQ(max(abs(gpt_style.bias)).item(), 0.0);

  LayerNorm ln(4);
  Tensor y = ln.forward(x);
  EXPECT_NEAR(mean(y, {2}).at({1, 2}), 0.0, 1e-6);
  RMSNorm rms(4, 1e-6);
  Tensor r = rms.forward(x);
  EXPECT_NEAR(mean(r * r, {2}).at({0, 1}), 1.0, 1e-4);

  Dropout drop(0.5);
  Tensor big = ones({1000});
  Tensor dropped = drop.forward(big);
  EXPECT_GT(max_abs_diff(dropped, big), 0.5);  // training: some zeros, survivors doubled
  drop.eval();
  EXPECT_EQ(max_abs_diff(drop.forward(big), big), 0.0);
}

// ---- GPT structure ----

TEST(NnGPT, ParameterNamesAndOrder) {
  Generator gen(0);
  GPT gpt2(tiny_config(), gen);
  std::vector<std::string> want{"tok_emb.weight", "pos_emb.weight"};
  for (int l = 0; l < 2; ++l)
    for (const char* s : {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias",
                          "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias",
                          "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"})
      want.push_back("blocks." + std::to_string(l) + "." + s);
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");
  EXPECT_EQ(names_of(gpt2.named_parameters()), want);

  GPT llama(tiny_config(true), gen);
  std::vector<std::string> want_llama{"tok_emb.weight"};
  for (int l = 0; l < 2; ++l)
    for (const char* s : {"ln1.weight", "attn.qkv.weight", "attn.proj.weight", "ln2.weight",
                          "mlp.gate.weight", "mlp.up.weight", "mlp.proj.weight"})
      want_llama.push_back("blocks." + std::to_string(l) + "." + s);
  want_llama.push_back("ln_f.weight");
  EXPECT_EQ(names_of(llama.named_parameters()), want_llama);
  EXPECT_EQ(llama.named_buffers(true).size(), 0u);  // rotary tables are derived, not saved
  EXPECT_EQ(llama.named_buffers().size(), 4u);

  GPTConfig untied = tiny_config();
  untied.tie_embeddings = false;
  GPT u(untied, gen);
  EXPECT_EQ(u.named_parameters().back().name, "lm_head.weight");
  EXPECT_EQ(u.named_parameters().back().tensor.shape(), Shape({11, 16}));
}

TEST(NnGPT, ParameterCount) {
  const int64_t V = 11, P = 8, C = 16, L = 2, h = 48;
  Generator gen(0);
  GPTConfig c = tiny_config();
  // GPT-2: embeddings, per block 2 LayerNorms + qkv + proj + fc + proj (with biases), ln_f.
  const int64_t gpt2 = V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_EQ(GPT(c, gen).num_parameters(), gpt2);
  EXPECT_EQ(gpt_num_parameters(c), gpt2);
  c.tie_embeddings = false;
  EXPECT_EQ(GPT(c, gen).num_parameters(), gpt2 + V * C);
  // LLaMA: no positions or biases, RMSNorm weights only, SwiGLU with hidden 48.
  GPTConfig l = tiny_config(true);
  EXPECT_EQ(mlp_hidden_size(l), h);
  const int64_t llama = V * C + L * (2 * C + 4 * C * C + 3 * C * h) + C;
  EXPECT_EQ(GPT(l, gen).num_parameters(), llama);
  EXPECT_EQ(gpt_num_parameters(l), llama);
  for (bool bias : {false, true})
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm})
      for (MLPType mlp : {MLPType::gelu, MLPType::swiglu}) {
        GPTConfig m = tiny_config();
        m.bias = bias;
        m.norm = norm;
        m.mlp = mlp;
        EXPECT_EQ(GPT(m, gen).num_parameters(), gpt_num_parameters(m));
      }
  GPTConfig big;
  big.d_model = 768;
  big.mlp = MLPType::swiglu;
  EXPECT_EQ(mlp_hidden_size(big), 2048);
  big.d_model = 128;
  EXPECT_EQ(mlp_hidden_size(big), 344);  // 2/3 * 512 = 341 -> 344
}

// gpt_parameter_shapes lists what the built model holds, name by name and in order, with the type
// of every module on each name's path, across the architecture switches and with MoE blocks (noisy
// or not, GELU or SwiGLU experts).
TEST(NnGPT, ParameterShapesAreTheBuiltModelsParameters) {
  Generator gen(0);
  auto expect_listed = [&](const GPTConfig& c) {
    GPT model(c, gen);
    const NamedTensors built = model.named_parameters();
    const std::vector<ParameterShape> listed = gpt_parameter_shapes(c);
    ASSERT_EQ(listed.size(), built.size());
    for (size_t i = 0; i < built.size(); ++i) {
      EXPECT_EQ(listed[i].name, built[i].name);
      EXPECT_EQ(listed[i].shape, built[i].tensor.shape()) << built[i].name;
      std::vector<std::string> path_types;
      for (size_t dot = 0; dot != std::string::npos; dot = built[i].name.find('.', dot + 1))
        path_types.push_back(type_name(*model.find_module(built[i].name.substr(0, dot))));
      EXPECT_EQ(listed[i].modules, path_types) << built[i].name;
      const bool expert = c.moe.every > 0 && built[i].name.find(".mlp.") != std::string::npos &&
                          built[i].name.find(".router.") == std::string::npos &&
                          built[i].tensor.size(0) == c.moe.n_experts;
      EXPECT_EQ(listed[i].expert, expert) << built[i].name;
    }
  };
  for (bool bias : {false, true})
    for (NormType norm : {NormType::layernorm, NormType::rmsnorm})
      for (MLPType mlp : {MLPType::gelu, MLPType::swiglu})
        for (PositionType position : {PositionType::learned, PositionType::rotary})
          for (bool tie : {false, true}) {
            GPTConfig c = tiny_config();
            c.bias = bias;
            c.norm = norm;
            c.mlp = mlp;
            c.position = position;
            c.tie_embeddings = tie;
            expect_listed(c);
            GPTConfig hub = c;  // the hub's Llama layout: GQA, q/k/v apart, own head width
            hub.n_heads = 4;
            hub.n_kv_heads = 2;
            hub.head_dim = 6;
            hub.fused_qkv = bias;
            hub.qkv_bias = !bias;
            hub.ffn_hidden = 24;
            expect_listed(hub);
            for (bool noisy : {false, true}) {
              c.moe = {.every = 2, .n_experts = 3, .top_k = 2, .ffn_mult = 2, .noisy = noisy};
              if (!noisy) c.moe.w_load = 0;  // the load loss needs the noise
              expect_listed(c);
            }
          }
}

// ffn_mult is a double rounded like BERT's d_ff: 2.5 gives 2.5 * d_model, not 2 * d_model.
TEST(NnGPT, FractionalFfnMultRoundsLikeBert) {
  GPTConfig c = tiny_config();
  c.ffn_mult = 2.5;
  EXPECT_EQ(mlp_hidden_size(c), 40);
  Generator gen(0);
  GPT m(c, gen);
  EXPECT_EQ(dynamic_cast<Linear&>(*m.find_module("blocks.0.mlp.fc")).weight.shape(),
            Shape({40, 16}));
  EXPECT_EQ(m.num_parameters(), gpt_num_parameters(c));
  c.mlp = MLPType::swiglu;
  EXPECT_EQ(mlp_hidden_size(c), 32);  // 2/3 of 40 = 26, up to a multiple of 8
  c.ffn_mult = 0.01;                  // rounds to a 0-wide MLP
  EXPECT_THROW(check_config(c), Error);
}

TEST(NnGPT, ConfigErrorsAreUsageErrors) {
  Generator gen(0);
  GPTConfig c = tiny_config();
  c.n_heads = 3;
  try {
    GPT bad(c, gen);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    EXPECT_NE(std::string(e.what()).find("n_heads 3"), std::string::npos) << e.what();
  }
  c = tiny_config(true);
  c.d_model = 18;  // head dim 9: rotary needs pairs
  EXPECT_THROW(GPT(c, gen), Error);
  GPT ok(tiny_config(), gen);
  try {
    ok.forward(zeros({1, 9}, DType::i64));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
  }
}

TEST(NnGPT, InitStatisticsAndDeterminism) {
  GPTConfig c;
  c.vocab_size = 64;
  c.d_model = 96;
  c.n_layers = 4;
  c.context = 16;
  Generator g1(1337);
  GPT m(c, g1);
  auto stddev = [](const Tensor& t) { return std::sqrt(var(t, {0, 1}, false).item()); };
  std::map<std::string, Tensor> p;
  for (auto& n : m.named_parameters()) p[n.name] = n.tensor;
  // Sample std of >= 9216 draws is within 1% of the truth; 4% leaves room without hiding a
  // wrong scale (the residual and plain scales differ by sqrt(8)).
  const double residual = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(stddev(p["blocks.2.attn.proj.weight"]), residual, 0.04 * residual);
  EXPECT_NEAR(stddev(p["blocks.0.mlp.proj.weight"]), residual, 0.04 * residual);
  EXPECT_NEAR(stddev(p["blocks.1.attn.qkv.weight"]), 0.02, 0.04 * 0.02);
  EXPECT_NEAR(stddev(p["blocks.3.mlp.fc.weight"]), 0.02, 0.04 * 0.02);
  EXPECT_NEAR(stddev(p["tok_emb.weight"]), 0.02, 0.04 * 0.02);
  EXPECT_NEAR(stddev(p["pos_emb.weight"]), 0.02, 0.08 * 0.02);  // only 1536 draws
  EXPECT_EQ(max(abs(p["blocks.1.attn.qkv.bias"])).item(), 0.0);
  EXPECT_EQ(max(abs(p["blocks.3.mlp.proj.bias"])).item(), 0.0);
  EXPECT_EQ(min(p["blocks.1.ln2.weight"]).item(), 1.0);
  EXPECT_EQ(max(p["ln_f.weight"]).item(), 1.0);

  for (bool llama : {false, true}) {
    Generator a(7), b(7), other(8);
    GPT m1(tiny_config(llama), a), m2(tiny_config(llama), b), m3(tiny_config(llama), other);
    auto p1 = m1.named_parameters(), p2 = m2.named_parameters(), p3 = m3.named_parameters();
    for (size_t i = 0; i < p1.size(); ++i) {
      EXPECT_EQ(max_abs_diff(p1[i].tensor, p2[i].tensor), 0.0) << p1[i].name;
      if (p1[i].tensor.dim() == 2) {
        EXPECT_GT(max_abs_diff(p1[i].tensor, p3[i].tensor), 0.0) << p1[i].name;
      }
    }
  }
}

TEST(NnGPT, TiedHeadSharesTokenEmbedding) {
  Generator gen(5);
  GPT m(tiny_config(), gen);
  EXPECT_EQ(m.lm_head, nullptr);
  Tensor ids = ids_tensor({1, 2, 3, 1, 2, 3}, 2, 3);  // token 10 never appears in the input
  Tensor h = m.forward(ids, GPTOutput::hidden);
  EXPECT_EQ(max_abs_diff(m.forward(ids), matmul(h, transpose(m.tok_emb->weight, 0, 1))), 0.0);
  sum(m.forward(ids)).backward();
  Tensor g = m.tok_emb->weight.grad();
  // Row 10 gets gradient only through the head, so the head really is tok_emb.weight.
  EXPECT_GT(std::fabs(g.at({10, 0})) + std::fabs(g.at({10, 5})), 0.0);
}

TEST(NnGPT, DropoutOnlyInTraining) {
  Generator gen(7);
  GPTConfig c = tiny_config();
  c.dropout = 0.3;
  GPT m(c, gen);
  Tensor ids = ids_tensor({1, 2, 3, 4, 5, 6}, 2, 3);
  Tensor a = m.forward(ids), b = m.forward(ids);
  EXPECT_GT(max_abs_diff(a, b), 1e-4);  // different masks
  m.eval();
  Tensor e1 = m.forward(ids), e2 = m.forward(ids);
  EXPECT_EQ(max_abs_diff(e1, e2), 0.0);
  Generator gen0(7);
  GPTConfig c0 = c;
  c0.dropout = 0.0;
  GPT plain(c0, gen0);  // same weights: dropout draws nothing at init
  EXPECT_LT(max_abs_diff(plain.forward(ids), e1), 1e-6);
}

TEST(NnGPT, ActivationCheckpointingMatches) {
  for (bool llama : {false, true}) {
    GPTConfig c = tiny_config(llama);
    c.dropout = 0.2;  // the recomputation must replay the same masks
    Generator gen(11);
    GPT m(c, gen);
    Tensor ids = ids_tensor({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, 2, 6);
    Tensor targets = ids_tensor({2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2}, 2, 6);
    std::vector<double> losses;
    std::vector<std::vector<Tensor>> grads;
    for (bool ckpt : {false, true}) {
      m.set_activation_checkpointing(ckpt);
      // ln_f reads the last block's output: a checkpoint node when checkpointing is on.
      Tensor h = m.forward(ids, GPTOutput::hidden);
      EXPECT_EQ(h.grad_fn()->next[0]->op == Op::checkpoint, ckpt);
      m.zero_grad();
      manual_seed(99);
      Tensor loss = lm_loss(m, ids, targets);
      loss.backward();
      losses.push_back(loss.item());
      std::vector<Tensor> g;
      for (const Tensor& p : m.parameters()) g.push_back(p.grad());
      grads.push_back(g);
    }
    EXPECT_EQ(losses[0], losses[1]);
    for (size_t i = 0; i < grads[0].size(); ++i) {
      ASSERT_TRUE(grads[1][i].defined()) << i;
      EXPECT_LT(max_abs_diff(grads[0][i], grads[1][i]), 1e-7) << m.named_parameters()[i].name;
    }
  }
}

TEST(NnGPT, OverfitsFixedBatchWithSGD) {
  Generator gen(21);
  GPT m(tiny_config(), gen);
  Tensor ids = ids_tensor({1, 5, 2, 7, 3, 9, 4, 0, 6, 6, 8, 1, 10, 2, 3, 4}, 2, 8);
  Tensor targets = ids_tensor({5, 2, 7, 3, 9, 4, 0, 1, 6, 8, 1, 10, 2, 3, 4, 5}, 2, 8);
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    m.zero_grad();
    Tensor loss = lm_loss(m, ids, targets);
    loss.backward();
    losses.push_back(loss.item());
    NoGradGuard no_grad;
    for (Tensor p : m.parameters()) p.copy_(p - p.grad() * 0.2);
  }
  EXPECT_NEAR(losses[0], std::log(11.0), 0.05);  // small init: near-uniform predictions
  EXPECT_LT(losses.back(), 0.5 * losses[0]) << "first " << losses[0] << ", last " << losses.back();
}

// ---- goldens against PyTorch ----

const testing::Goldens& goldens() {
  static const testing::Goldens table = testing::load_goldens("gpt.txt");
  return table;
}

const std::vector<double>& golden(const std::string& name) {
  return testing::golden_values(goldens(), name, "gpt.txt");
}

void check_golden(const std::string& variant, const GPTConfig& config) {
  Generator gen(0);
  GPT m(config, gen);
  m.load_named(testing::formula_weights(m.named_parameters()));
  Tensor ids = ids_tensor(golden("ids"), 2, 8), targets = ids_tensor(golden("targets"), 2, 8);
  Tensor logits = m.forward(ids);
  std::vector<double> want_logits = golden(variant + ".logits"), got = logits.to_vector<double>();
  ASSERT_EQ(got.size(), want_logits.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want_logits[i], 2e-5) << variant << " logits[" << i << "]";
  Tensor loss = cross_entropy(reshape(logits, {-1, 11}), reshape(targets, {-1}));
  loss.backward();
  const double want_loss = golden(variant + ".loss")[0];
  EXPECT_NEAR(loss.item(), want_loss, 1e-5 * want_loss) << variant;

  testing::expect_grads_near_golden(m.named_parameters(), goldens(), "gpt.txt", variant);
}

TEST(NnGPT, MatchesPyTorchGPT2) { check_golden("gpt2", tiny_config(false)); }
TEST(NnGPT, MatchesPyTorchLlama) { check_golden("llama", tiny_config(true)); }
TEST(NnGPT, MatchesPyTorchLlamaWithGroupedQueriesAndScaledRotary) {
  check_golden("llama_gqa", testing::tiny_llama_gqa_config());
}

// ---- rotary and KV cache ----

TEST(NnRotary, DotProductDependsOnRelativePosition) {
  RotaryTables tables = rotary_tables(16, 8, 10000.0);
  Generator gen(4);
  Tensor q = normal({1, 1, 1, 8}, 0, 1, gen, DType::f32), k = normal({1, 1, 1, 8}, 0, 1, gen);
  auto dot = [&](int64_t m, int64_t n) {
    return sum(apply_rotary(q, tables, m) * apply_rotary(k, tables, n)).item();
  };
  EXPECT_NEAR(dot(3, 1), dot(9, 7), 1e-5);
  EXPECT_NEAR(dot(0, 0), sum(q * k).item(), 1e-5);  // position 0 is the identity
  EXPECT_GT(std::fabs(dot(3, 1) - dot(3, 2)), 1e-4);
  // Rotation keeps norms.
  EXPECT_NEAR(sum(apply_rotary(q, tables, 5) * apply_rotary(q, tables, 5)).item(),
              sum(q * q).item(), 1e-5);
}

// The tables hold context x head_dim floats: for a hub model's 128k context, 32 MiB a layer. One
// set serves every layer.
TEST(NnRotary, TheLayersShareOneSetOfTables) {
  Generator gen(0);
  GPT m(testing::tiny_llama_gqa_config(), gen);
  std::set<const void*> storage;
  for (const NamedTensor& b : m.named_buffers()) storage.insert(b.tensor.data<float>());
  EXPECT_EQ(m.named_buffers().size(), 4u);  // rope_cos and rope_sin of 2 layers
  EXPECT_EQ(storage.size(), 2u);
}

void check_incremental(const GPTConfig& c) {
  Generator gen(17);
  GPT m(c, gen);
  m.eval();
  Tensor ids = ids_tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, 2, 8);
  Tensor full_logits = m.forward(ids);  // [2, 8, 11]
  KVCache cache = m.make_cache(2);
  EXPECT_EQ(cache.capacity(), 8);
  for (int64_t t = 0; t < 8; ++t) {
    Tensor step = m.forward_incremental(slice(ids, 1, t, t + 1).contiguous(), cache);
    EXPECT_FALSE(step.requires_grad());
    EXPECT_LT(max_abs_diff(step, slice(full_logits, 1, t, t + 1)), 1e-5) << "position " << t;
  }
  EXPECT_EQ(cache.length, 8);
  EXPECT_THROW(m.forward_incremental(slice(ids, 1, 0, 1).contiguous(), cache), Error);  // full
  // A prompt in one chunk, then single tokens, from a reset cache.
  cache.reset();
  Tensor prefill = m.forward_incremental(slice(ids, 1, 0, 5).contiguous(), cache);
  EXPECT_LT(max_abs_diff(prefill, slice(full_logits, 1, 0, 5)), 1e-5);
  Tensor rest = m.forward_incremental(slice(ids, 1, 5, 7).contiguous(), cache);
  EXPECT_LT(max_abs_diff(rest, slice(full_logits, 1, 5, 7)), 1e-5);
  Tensor last = m.forward_incremental(slice(ids, 1, 7, 8).contiguous(), cache,
                                      GPTOutput::last_logits);
  EXPECT_LT(max_abs_diff(last, slice(full_logits, 1, 7, 8)), 1e-5);
  EXPECT_LT(max_abs_diff(m.forward(ids, GPTOutput::last_logits), slice(full_logits, 1, 7, 8)),
            1e-6);
}

TEST(NnKVCache, IncrementalMatchesFullForwardGPT2) { check_incremental(tiny_config(false)); }
TEST(NnKVCache, IncrementalMatchesFullForwardLlama) { check_incremental(tiny_config(true)); }
TEST(NnKVCache, IncrementalMatchesFullForwardWithGroupedQueries) {
  const GPTConfig c = testing::tiny_llama_gqa_config();
  check_incremental(c);
  // The cache holds the key/value heads only: half of what 4 heads would take.
  Generator gen(0);
  KVCache cache = GPT(c, gen).make_cache(3);
  EXPECT_EQ(cache.k[0].shape(), Shape({3, 2, 8, 6}));
  EXPECT_EQ(cache.v[1].shape(), Shape({3, 2, 8, 6}));
}

// Llama 3.1's rope_scaling by hand: wavelength 2 pi / f against original_context / low (16) and
// original_context / high (4) with factor 4 and head dimension 6 (f = 1, 10000^(-1/3),
// 10000^(-2/3)); linear divides every frequency.
TEST(NnRotary, ScaledFrequenciesFollowTransformers) {
  const RopeScaling llama3 = testing::tiny_llama_gqa_config().rope_scaling;
  const std::vector<double> plain = rotary_frequencies(6, 10000.0);
  const std::vector<double> scaled = rotary_frequencies(6, 10000.0, llama3);
  ASSERT_EQ(scaled.size(), 3u);
  // Wavelength 2 pi lies between 4 and 16: blended with smooth = (16 / 2 pi - 1) / 3.
  const double smooth = (16.0 / (2 * std::numbers::pi) - 1.0) / 3.0;
  EXPECT_NEAR(scaled[0], (1 - smooth) * plain[0] / 4 + smooth * plain[0], 1e-15);
  EXPECT_NEAR(scaled[1], plain[1] / 4, 1e-18);  // wavelength 135 > 16: stretched
  EXPECT_NEAR(scaled[2], plain[2] / 4, 1e-18);
  const std::vector<double> linear =
      rotary_frequencies(6, 10000.0, {.type = RopeScalingType::linear, .factor = 2});
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(linear[i], plain[i] / 2);
  // Moved bounds move a frequency between bands: with original_context 2 (bounds 2 and 0.5) the
  // wavelength 2 pi of f = 1 is long, so f is stretched; with low_freq_factor 0.1 (bounds 160 and
  // 4) wavelength 135 is in the blended band, so it is stretched by less than factor 4.
  RopeScaling keep = llama3;
  keep.original_context = 2;
  EXPECT_NEAR(rotary_frequencies(6, 10000.0, keep)[0], plain[0] / 4, 1e-15);
  keep.original_context = 16;
  keep.low_freq_factor = 0.1;
  EXPECT_GT(rotary_frequencies(6, 10000.0, keep)[1], plain[1] / 4);
}

TEST(NnKVCache, RefusesToRecordAGraph) {
  Generator gen(1);
  GPT m(tiny_config(), gen);
  KVCache cache = m.make_cache(1);
  Tensor x = zeros({1, 2, 16});
  x.set_requires_grad(true);
  EXPECT_THROW((*m.blocks)[0]->attn->forward(x, &cache, 0), Error);
}

}  // namespace
}  // namespace forge::nn
