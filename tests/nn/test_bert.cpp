// nn/bert tests: parameter names, counts (BERT-base against PyTorch's count of HF's layout), config
// errors, initialisation and the pad row, PyTorch 1.13 goldens of a padded batch through the MLM +
// NSP loss (tests/golden/bert.txt, written by make_bert_goldens.py; post- and pre-norm), padding
// invariance, bidirectional masked attention (and a padding mask through the KV cache), activation
// checkpointing, dropout and a short overfit.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/attention.h"
#include "nn/bert.h"

namespace forge::nn {
namespace {

// The 2-layer model of the goldens.
BertConfig tiny_config(bool pre_norm = false) {
  BertConfig c;
  c.vocab_size = 13;
  c.max_positions = 9;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.d_ff = 40;
  c.dropout = 0.0;
  c.pre_norm = pre_norm;
  return c;
}

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const NamedTensor& n : named) out.push_back(n.name);
  return out;
}

Tensor i64(const std::vector<double>& values, const Shape& shape) {
  return from_vector(values, shape, DType::i64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

void expect_usage_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected one naming '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what() << " lacks " << part;
  }
}

// The recipe's loss: MLM on the gathered rows plus NSP on the pooled output.
Tensor pretraining_loss(const Bert& m, const Tensor& ids, const Tensor& segs, const Tensor& mask,
                        const Tensor& chosen, const Tensor& targets, const Tensor& nsp_labels) {
  BertOutputs out = m.forward(ids, segs, mask);
  const int64_t B = ids.size(0), T = ids.size(1), C = m.config().d_model;
  Tensor rows = index_select(reshape(out.hidden, {B * T, C}), 0, chosen);
  return cross_entropy(m.mlm_logits(rows), targets) +
         cross_entropy(m.nsp_logits(out.pooled), nsp_labels);
}

// ---- structure ----

TEST(NnBert, ParameterNamesAndOrder) {
  for (bool pre_norm : {false, true}) {
    Generator gen(0);
    Bert m(tiny_config(pre_norm), gen);
    std::vector<std::string> want{"tok_emb.weight", "pos_emb.weight", "seg_emb.weight",
                                  "emb_ln.weight", "emb_ln.bias"};
    for (int l = 0; l < 2; ++l)
      for (const char* s : {"attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                            "attn.proj.bias", "ln1.weight", "ln1.bias", "ff.fc.weight",
                            "ff.fc.bias", "ff.proj.weight", "ff.proj.bias", "ln2.weight",
                            "ln2.bias"})
        want.push_back("blocks." + std::to_string(l) + "." + s);
    if (pre_norm) {
      want.push_back("ln_f.weight");
      want.push_back("ln_f.bias");
    }
    for (const char* s : {"pooler.weight", "pooler.bias", "mlm.dense.weight", "mlm.dense.bias",
                          "mlm.ln.weight", "mlm.ln.bias", "mlm.bias", "nsp.weight", "nsp.bias"})
      want.push_back(s);
    EXPECT_EQ(names_of(m.named_parameters()), want) << "pre_norm " << pre_norm;
    EXPECT_EQ(m.named_buffers().size(), 0u);
    std::map<std::string, Shape> shapes;
    for (const NamedTensor& p : m.named_parameters()) shapes[p.name] = p.tensor.shape();
    EXPECT_EQ(shapes["blocks.1.attn.qkv.weight"], Shape({48, 16}));
    EXPECT_EQ(shapes["blocks.0.ff.fc.weight"], Shape({40, 16}));
    EXPECT_EQ(shapes["seg_emb.weight"], Shape({2, 16}));
    EXPECT_EQ(shapes["mlm.bias"], Shape({13}));
    EXPECT_EQ(shapes["nsp.weight"], Shape({2, 16}));
  }
}

TEST(NnBert, ParameterCount) {
  const int64_t V = 13, P = 9, S = 2, C = 16, L = 2, F = 40;
  const int64_t block = (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (C * F + F) + (F * C + C) + 2 * C;
  const int64_t post = (V + P + S) * C + 2 * C + L * block + (C * C + C) +
                       (C * C + C + 2 * C + V) + (2 * C + 2);
  Generator gen(0);
  EXPECT_EQ(bert_num_parameters(tiny_config()), post);
  EXPECT_EQ(Bert(tiny_config(), gen).num_parameters(), post);
  EXPECT_EQ(bert_num_parameters(tiny_config(true)), post + 2 * C);
  EXPECT_EQ(Bert(tiny_config(true), gen).num_parameters(), post + 2 * C);
  BertConfig odd = tiny_config();
  odd.type_vocab_size = 3;
  odd.n_layers = 3;
  odd.d_ff = 24;
  odd.max_positions = 5;
  EXPECT_EQ(Bert(odd, gen).num_parameters(), bert_num_parameters(odd));

  // BERT-base (uncased): PyTorch's count of HF BertForPreTraining's layout, tied decoder once.
  BertConfig base;
  base.vocab_size = 30522;
  base.max_positions = 512;
  base.d_model = 768;
  base.n_layers = 12;
  base.n_heads = 12;
  base.d_ff = 3072;
  const testing::Goldens g = testing::load_goldens("bert.txt");
  ASSERT_EQ(g.count("bert_base.num_params"), 1u);
  EXPECT_EQ(double(bert_num_parameters(base)), g.at("bert_base.num_params")[0]);
  EXPECT_EQ(bert_num_parameters(base), 110106428);
  // The encoder with pooler alone is BertModel's 109,482,240; the rest are the two heads.
  const int64_t heads = (768 * 768 + 768) + 2 * 768 + 30522 + (2 * 768 + 2);
  EXPECT_EQ(double(bert_num_parameters(base) - heads), g.at("bert_base.bert_model_num_params")[0]);
}

TEST(NnBert, ConfigErrorsNameTheField) {
  Generator gen(0);
  auto bad = [&](auto edit, const std::string& part) {
    BertConfig c = tiny_config();
    edit(c);
    expect_usage_error([&] { check_config(c); }, part);
    expect_usage_error([&] { Bert m(c, gen); }, part);
  };
  bad([](BertConfig& c) { c.n_heads = 3; }, "d_model 16 must be a positive multiple of n_heads 3");
  bad([](BertConfig& c) { c.vocab_size = 0; }, "vocab_size");
  bad([](BertConfig& c) { c.max_positions = 0; }, "max_positions");
  bad([](BertConfig& c) { c.type_vocab_size = 0; }, "type_vocab_size");
  bad([](BertConfig& c) { c.n_layers = 0; }, "n_layers");
  bad([](BertConfig& c) { c.d_ff = -1; }, "d_ff");
  bad([](BertConfig& c) { c.dropout = 1.0; }, "dropout");
  bad([](BertConfig& c) { c.norm_eps = 0.0; }, "norm_eps");
  bad([](BertConfig& c) { c.init_std = 0.0; }, "init_std");
  bad([](BertConfig& c) { c.pad_id = 13; }, "pad_id");
  EXPECT_NO_THROW(check_config(tiny_config()));

  Bert m(tiny_config(), gen);
  expect_usage_error([&] { m.forward(zeros({1, 10}, DType::i64), {}, {}); }, "max_positions 9");
  Tensor ids = zeros({2, 4}, DType::i64);
  EXPECT_THROW(m.forward(ids, zeros({2, 3}, DType::i64), {}), Error);  // segments shape
  EXPECT_THROW(m.forward(ids, zeros({2, 4}), {}), Error);              // segments dtype
  EXPECT_THROW(m.forward(ids, {}, ones({2, 5})), Error);               // mask shape
  EXPECT_THROW(m.forward(zeros({2, 4}), {}, {}), Error);               // ids dtype
  EXPECT_THROW(m.forward(ids, full({2, 4}, 2, DType::i64), {}), Error);  // segment id >= 2
  EXPECT_THROW(m.mlm_logits(zeros({3, 15})), Error);
  EXPECT_THROW(m.nsp_logits(zeros({2, 3, 16})), Error);
}

TEST(NnBert, InitStatisticsAndDeterminism) {
  BertConfig c;
  c.vocab_size = 64;
  c.max_positions = 64;
  c.d_model = 96;
  c.n_heads = 4;
  c.d_ff = 192;
  c.n_layers = 2;
  Generator g1(1337);
  Bert m(c, g1);
  auto stddev = [](const Tensor& t) { return std::sqrt(var(t, {0, 1}, false).item()); };
  std::map<std::string, Tensor> p;
  for (auto& n : m.named_parameters()) p[n.name] = n.tensor;
  // Every weight matrix is N(0, 0.02): no GPT-2 residual scaling in BERT.
  for (const char* name : {"tok_emb.weight", "pos_emb.weight", "blocks.1.attn.qkv.weight",
                           "blocks.0.attn.proj.weight", "blocks.1.ff.fc.weight",
                           "blocks.0.ff.proj.weight", "pooler.weight", "mlm.dense.weight"})
    EXPECT_NEAR(stddev(p[name]), 0.02, 0.06 * 0.02) << name;
  for (const char* name : {"emb_ln.bias", "blocks.0.attn.qkv.bias", "blocks.1.ff.proj.bias",
                           "pooler.bias", "mlm.bias", "nsp.bias", "mlm.ln.bias"})
    EXPECT_EQ(max(abs(p[name])).item(), 0.0) << name;
  for (const char* name : {"emb_ln.weight", "blocks.1.ln1.weight", "blocks.0.ln2.weight",
                           "mlm.ln.weight"}) {
    EXPECT_EQ(min(p[name]).item(), 1.0) << name;
    EXPECT_EQ(max(p[name]).item(), 1.0) << name;
  }
  Generator a(7), b(7), other(8);
  Bert m1(tiny_config(), a), m2(tiny_config(), b), m3(tiny_config(), other);
  auto p1 = m1.named_parameters(), p2 = m2.named_parameters(), p3 = m3.named_parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    EXPECT_EQ(max_abs_diff(p1[i].tensor, p2[i].tensor), 0.0) << p1[i].name;
    if (p1[i].tensor.dim() == 2) {
      EXPECT_GT(max_abs_diff(p1[i].tensor, p3[i].tensor), 0.0) << p1[i].name;
    }
  }
}

TEST(NnBert, PadRowStartsAtZeroAndGetsNoLookupGradient) {
  BertConfig c = tiny_config();
  c.pad_id = 0;
  Generator gen(3);
  Bert m(c, gen);
  Tensor w = m.tok_emb->weight;
  EXPECT_EQ(max(abs(slice(w, 0, 0, 1))).item(), 0.0);
  EXPECT_GT(max(abs(slice(w, 0, 1, 2))).item(), 0.0);
  Tensor ids = i64({1, 5, 0, 0, 2, 0, 7, 3}, {2, 4});
  // Lookups only (no tied decoder): the pad row, though looked up three times, stays without grad.
  sum(m.forward(ids, {}, {}).hidden * normal({2, 4, 16}, 0, 1, gen)).backward();
  Tensor g = w.grad();
  EXPECT_EQ(max(abs(slice(g, 0, 0, 1))).item(), 0.0);
  EXPECT_GT(max(abs(slice(g, 0, 5, 6))).item(), 0.0);
  // Through the tied MLM decoder it is an output class like any other.
  m.zero_grad();
  sum(m.mlm_logits(normal({3, 16}, 0, 1, gen)) * normal({3, 13}, 0, 1, gen)).backward();
  EXPECT_GT(max(abs(slice(w.grad(), 0, 0, 1))).item(), 0.0);
}

// ---- goldens against PyTorch ----

const testing::Goldens& goldens() {
  static const testing::Goldens table = testing::load_goldens("bert.txt");
  return table;
}

const std::vector<double>& golden(const std::string& name) {
  return testing::golden_values(goldens(), name, "bert.txt");
}

void check_golden(const std::string& variant, bool pre_norm) {
  Generator gen(0);
  Bert m(tiny_config(pre_norm), gen);
  m.load_named(testing::formula_weights(m.named_parameters()));
  const int64_t B = 2, T = 7, C = 16;
  Tensor ids = i64(golden("ids"), {B, T}), segs = i64(golden("segments"), {B, T});
  Tensor mask = i64(golden("mask"), {B, T}), chosen = i64(golden("chosen"), {4});
  BertOutputs out = m.forward(ids, segs, mask);
  testing::expect_near_golden(out.hidden.to_vector<double>(), golden(variant + ".hidden"),
                              variant + ".hidden", 2e-5);
  testing::expect_near_golden(out.pooled.to_vector<double>(), golden(variant + ".pooled"),
                              variant + ".pooled", 2e-5);
  Tensor mlm = m.mlm_logits(index_select(reshape(out.hidden, {B * T, C}), 0, chosen));
  Tensor nsp = m.nsp_logits(out.pooled);
  testing::expect_near_golden(mlm.to_vector<double>(), golden(variant + ".mlm_logits"),
                              variant + ".mlm_logits", 2e-5);
  testing::expect_near_golden(nsp.to_vector<double>(), golden(variant + ".nsp_logits"),
                              variant + ".nsp_logits", 2e-5);
  Tensor loss = cross_entropy(mlm, i64(golden("mlm_targets"), {4})) +
                cross_entropy(nsp, i64(golden("nsp_labels"), {2}));
  loss.backward();
  const double want_loss = golden(variant + ".loss")[0];
  EXPECT_NEAR(loss.item(), want_loss, 1e-5 * want_loss) << variant;

  testing::expect_grads_near_golden(m.named_parameters(), goldens(), "bert.txt", variant);
}

TEST(NnBert, MatchesPyTorchPostNorm) { check_golden("post", false); }
TEST(NnBert, MatchesPyTorchPreNorm) { check_golden("pre", true); }

// ---- masking ----

// A batch of two sequences (lengths 5 and 3) alone, then with 4 extra padded positions holding
// arbitrary ids and segments: nothing real may move.
TEST(NnBert, PaddingDoesNotChangeRealPositions) {
  for (bool pre_norm : {false, true}) {
    BertConfig c = tiny_config(pre_norm);
    c.max_positions = 12;
    c.d_model = 32;
    c.n_heads = 4;
    Generator gen(5);
    Bert m(c, gen);
    m.eval();
    const int64_t C = c.d_model;
    Tensor ids = i64({1, 4, 7, 2, 9, 1, 3, 8, 0, 0}, {2, 5});
    Tensor segs = i64({0, 0, 1, 1, 1, 0, 1, 1, 0, 0}, {2, 5});
    Tensor mask = i64({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
    Tensor ids_p = i64({1, 4, 7, 2, 9, 12, 5, 11, 6, 1, 3, 8, 10, 2, 4, 9, 3, 7}, {2, 9});
    Tensor segs_p = i64({0, 0, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 0, 1, 1}, {2, 9});
    Tensor mask_p = i64({1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0}, {2, 9});
    BertOutputs a = m.forward(ids, segs, mask), b = m.forward(ids_p, segs_p, mask_p);
    for (auto [row, len] : {std::pair<int64_t, int64_t>{0, 5}, {1, 3}}) {
      Tensor ha = slice(slice(a.hidden, 0, row, row + 1), 1, 0, len);
      Tensor hb = slice(slice(b.hidden, 0, row, row + 1), 1, 0, len);
      EXPECT_LT(max_abs_diff(ha, hb), 1e-5) << "row " << row << " pre_norm " << pre_norm;
      EXPECT_LT(max_abs_diff(m.mlm_logits(ha), m.mlm_logits(hb)), 1e-5) << "row " << row;
    }
    EXPECT_LT(max_abs_diff(a.pooled, b.pooled), 1e-5) << "pre_norm " << pre_norm;
    // The mask matters: without it the padded batch's real positions do move.
    BertOutputs unmasked = m.forward(ids_p, segs_p, Tensor());
    EXPECT_GT(max_abs_diff(unmasked.pooled, b.pooled), 1e-3);
    EXPECT_EQ(b.hidden.shape(), Shape({2, 9, C}));
  }
}

// Bidirectional: an earlier position sees a later token (GPT's causal mask would hide it).
TEST(NnBert, AttentionIsBidirectional) {
  Generator gen(9);
  Bert m(tiny_config(), gen);
  m.eval();
  Tensor a = m.forward(i64({1, 2, 3, 4}, {1, 4}), {}, {}).hidden;
  Tensor b = m.forward(i64({1, 2, 3, 9}, {1, 4}), {}, {}).hidden;
  EXPECT_GT(max_abs_diff(slice(a, 1, 0, 1), slice(b, 1, 0, 1)), 1e-4);
  // Undefined segments are segment 0 everywhere.
  EXPECT_EQ(max_abs_diff(a, m.forward(i64({1, 2, 3, 4}, {1, 4}), zeros({1, 4}, DType::i64),
                                      ones({1, 4})).hidden),
            0.0);
}

// SelfAttention with causal = false and a key-padding mask equals softmax(q kᵀ/√D + mask) v built
// from plain ops; the default stays causal.
TEST(NnSelfAttention, BidirectionalWithPaddingMatchesPlainOps) {
  const int64_t B = 2, T = 5, C = 8, H = 2, D = 4;
  AttentionConfig a;
  a.d_model = C;
  a.n_heads = H;
  a.context = T;
  a.causal = false;
  Generator gen(2);
  SelfAttention attn(a, gen);
  Tensor x = normal({B, T, C}, 0, 1, gen);
  Tensor mask = i64({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {B, T});
  Tensor got = attn.forward(x, mask);
  const Linear& qkv_layer = dynamic_cast<const Linear&>(*attn.qkv);
  const Linear& proj_layer = dynamic_cast<const Linear&>(*attn.proj);
  std::vector<Tensor> qkv = split(linear(x, qkv_layer.weight, qkv_layer.bias), C, 2);
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
  Tensor att = matmul(heads(qkv[0]), transpose(heads(qkv[1]), 2, 3)) / std::sqrt(double(D));
  Tensor padded = from_vector(std::vector<double>{0, 0, 0, 0, 0, 0, 0, 1, 1, 1}, {B, 1, 1, T});
  att = softmax(masked_fill(att, padded, -INFINITY), -1);  // [B, 1, 1, S] broadcasts
  Tensor y = reshape(transpose(matmul(att, heads(qkv[2])), 1, 2), {B, T, C});
  EXPECT_LT(max_abs_diff(got, linear(y, proj_layer.weight, proj_layer.bias)), 1e-5);

  AttentionConfig causal = a;
  causal.causal = true;
  EXPECT_TRUE(AttentionConfig().causal);
  Generator gen2(2);
  SelfAttention decoder(causal, gen2);  // same weights
  Tensor y_causal = decoder.forward(x);
  EXPECT_GT(max_abs_diff(slice(y_causal, 1, 0, 1), slice(attn.forward(x), 1, 0, 1)), 1e-4);
  EXPECT_LT(max_abs_diff(slice(y_causal, 1, 4, 5), slice(attn.forward(x), 1, 4, 5)), 1e-5);
}

// A causal layer with a left-padded row decodes through the KV cache (mask over the whole prefix)
// exactly as its full forward computes.
TEST(NnSelfAttention, PaddingMaskWithKVCacheMatchesFullForward) {
  AttentionConfig a;
  a.d_model = 8;
  a.n_heads = 2;
  a.context = 6;
  Generator gen(4);
  SelfAttention attn(a, gen);
  Tensor x = normal({2, 6, 8}, 0, 1, gen);
  Tensor mask = i64({1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1}, {2, 6});
  NoGradGuard no_grad;
  Tensor full = attn.forward(x, mask);
  KVCache cache = make_kv_cache(1, 2, 2, 6, 4);
  Tensor prefill = attn.forward(slice(x, 1, 0, 3), slice(mask, 1, 0, 3), &cache, 0);
  EXPECT_LT(max_abs_diff(prefill, slice(full, 1, 0, 3)), 1e-6);
  cache.length = 3;
  for (int64_t t = 3; t < 6; ++t) {
    Tensor step = attn.forward(slice(x, 1, t, t + 1), slice(mask, 1, 0, t + 1), &cache, 0);
    EXPECT_LT(max_abs_diff(step, slice(full, 1, t, t + 1)), 1e-6) << "position " << t;
    cache.length = t + 1;
  }
  EXPECT_GT(max_abs_diff(full, attn.forward(x)), 1e-3);  // the mask did something
}

// ---- training behaviour ----

TEST(NnBert, ActivationCheckpointingMatches) {
  for (bool pre_norm : {false, true}) {
    BertConfig c = tiny_config(pre_norm);
    c.dropout = 0.2;  // the recomputation must replay the same masks
    Generator gen(11);
    Bert m(c, gen);
    Tensor ids = i64({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, {2, 6});
    Tensor segs = i64({0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1}, {2, 6});
    Tensor mask = i64({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
    Tensor chosen = i64({1, 4, 8}, {3}), targets = i64({5, 0, 12}, {3}), nsp = i64({1, 0}, {2});
    std::vector<double> losses;
    std::vector<std::vector<Tensor>> grads;
    for (bool ckpt : {false, true}) {
      m.set_activation_checkpointing(ckpt);
      EXPECT_EQ(m.activation_checkpointing(), ckpt);
      Tensor h = m.forward(ids, segs, mask).hidden;
      // Post-norm: the last block ends in its ln2, whose input is the checkpoint node; pre-norm:
      // ln_f reads the checkpoint node.
      const Node* last = h.grad_fn().get();
      if (!pre_norm) {
        EXPECT_EQ(last->op == Op::checkpoint, ckpt);
      } else {
        EXPECT_EQ(last->next[0]->op == Op::checkpoint, ckpt);
      }
      m.zero_grad();
      manual_seed(99);
      Tensor loss = pretraining_loss(m, ids, segs, mask, chosen, targets, nsp);
      loss.backward();
      losses.push_back(loss.item());
      std::vector<Tensor> g;
      for (const Tensor& p : m.parameters()) g.push_back(p.grad());
      grads.push_back(g);
    }
    EXPECT_EQ(losses[0], losses[1]);
    for (size_t i = 0; i < grads[0].size(); ++i) {
      ASSERT_TRUE(grads[1][i].defined()) << m.named_parameters()[i].name;
      EXPECT_LT(max_abs_diff(grads[0][i], grads[1][i]), 1e-7) << m.named_parameters()[i].name;
    }
  }
}

TEST(NnBert, DropoutOnlyInTraining) {
  BertConfig c = tiny_config();
  c.dropout = 0.3;
  Generator gen(7);
  Bert m(c, gen);
  Tensor ids = i64({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_GT(max_abs_diff(m.forward(ids, {}, {}).hidden, m.forward(ids, {}, {}).hidden), 1e-4);
  m.eval();
  Tensor e = m.forward(ids, {}, {}).hidden;
  EXPECT_EQ(max_abs_diff(e, m.forward(ids, {}, {}).hidden), 0.0);
  Generator gen0(7);
  c.dropout = 0.0;
  Bert plain(c, gen0);  // same weights: dropout draws nothing at init
  EXPECT_LT(max_abs_diff(plain.forward(ids, {}, {}).hidden, e), 1e-6);
}

TEST(NnBert, OverfitsFixedBatchWithSGD) {
  Generator gen(21);
  Bert m(tiny_config(), gen);
  Tensor ids = i64({1, 5, 2, 7, 3, 9, 4, 12, 1, 6, 8, 11, 10, 2, 0, 0}, {2, 8});
  Tensor segs = i64({0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0}, {2, 8});
  Tensor mask = i64({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 8});
  Tensor chosen = i64({2, 5, 9, 12}, {4}), targets = i64({3, 8, 4, 11}, {4});
  Tensor nsp = i64({0, 1}, {2});
  std::vector<double> losses;
  for (int step = 0; step < 25; ++step) {
    m.zero_grad();
    Tensor loss = pretraining_loss(m, ids, segs, mask, chosen, targets, nsp);
    loss.backward();
    losses.push_back(loss.item());
    NoGradGuard no_grad;
    for (Tensor p : m.parameters()) p.copy_(p - p.grad() * 0.2);
  }
  // Small init: near-uniform MLM (log 13) and NSP (log 2) predictions.
  EXPECT_NEAR(losses[0], std::log(13.0) + std::log(2.0), 0.1);
  EXPECT_LT(losses.back(), 0.5 * losses[0]) << "first " << losses[0] << ", last " << losses.back();
}

}  // namespace
}  // namespace forge::nn
