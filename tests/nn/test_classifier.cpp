// Sequence classifiers (nn/classifier.h): concat pooling against PyTorch goldens
// (tests/golden/classifier.txt, written by make_classifier_goldens.py) and finite differences,
// padding that changes nothing, long texts as windows of the context, parameter names a language
// model's checkpoint loads into, and the BERT head.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "core/ops.h"
#include "nn/classifier.h"
#include "tests/core/gradcheck.h"
#include "tests/nn/tiny_gpt.h"
#include "tests/test_util.h"

namespace forge {
namespace {

constexpr const char* kFile = "classifier.txt";

std::vector<double> values(const Tensor& t) {
  return t.to(DType::f64).contiguous().to_vector<double>();
}

TEST(ConcatPool, HeadMatchesPyTorchGoldens) {
  const testing::Goldens g = testing::load_goldens(kFile);
  auto golden = [&](const std::string& name) {
    return testing::golden_values(g, "head." + name, kFile);
  };
  const int64_t B = 3, L = 5, C = 4, H = 6, K = 3;
  Tensor hidden = from_vector(golden("hidden"), {B, L, C}, DType::f64);
  hidden.set_requires_grad(true);
  const Tensor mask = from_vector(golden("mask"), {B, L}, DType::i64);

  Generator gen(1);
  nn::GPTConfig config = testing::tiny_gpt_config();
  config.d_model = C;
  config.n_heads = 1;
  nn::GPTClassifier model(config, {.num_labels = K, .hidden = H, .dropout = 0.5}, gen);
  model.eval();
  // The head's Linear layers read their own members; point them at the f64 goldens.
  model.fc->weight = from_vector(golden("fc_w"), {H, 3 * C}, DType::f64);
  model.fc->bias = from_vector(golden("fc_b"), {H}, DType::f64);
  model.out->weight = from_vector(golden("out_w"), {K, H}, DType::f64);
  model.out->bias = from_vector(golden("out_b"), {K}, DType::f64);
  for (Tensor* t : {&model.fc->weight, &model.fc->bias, &model.out->weight, &model.out->bias})
    t->set_requires_grad(true);

  const Tensor pooled = nn::concat_pool(hidden, mask);
  const Tensor logits = model.head_logits(pooled);
  const Tensor labels = from_vector(golden("labels"), {B}, DType::i64);
  const Tensor loss = cross_entropy(logits, labels);
  loss.backward();
  const double tol = 1e-12;
  testing::expect_near_golden(values(pooled), golden("pooled"), "pooled", tol);
  testing::expect_near_golden(values(logits), golden("logits"), "logits", tol);
  testing::expect_near_golden(values(loss), golden("loss"), "loss", tol);
  testing::expect_near_golden(values(hidden.grad()), golden("d_hidden"), "d_hidden", tol);
  testing::expect_near_golden(values(model.fc->weight.grad()), golden("d_fc_w"), "d_fc_w", tol);
  testing::expect_near_golden(values(model.fc->bias.grad()), golden("d_fc_b"), "d_fc_b", tol);
  testing::expect_near_golden(values(model.out->weight.grad()), golden("d_out_w"), "d_out_w", tol);
  testing::expect_near_golden(values(model.out->bias.grad()), golden("d_out_b"), "d_out_b", tol);
}

TEST(ConcatPool, GradientsMatchFiniteDifferences) {
  const Tensor mask = testing::ids({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 5});
  const Tensor hidden = testing::randn({2, 5, 3}, 7);
  EXPECT_EQ(
      testing::gradcheck([&](const auto& in) { return nn::concat_pool(in[0], mask); }, {hidden}),
      "");
}

TEST(ConcatPool, PaddingTakesNoPart) {
  // The same real tokens with more padding, whatever the padding holds, pool the same.
  const Tensor real = testing::randn({2, 3, 4}, 3).detach();
  const Tensor mask3 = testing::ids({1, 1, 1, 1, 1, 0}, {2, 3});
  Tensor padded = cat({real, full({2, 4, 4}, 1e6, DType::f64)}, 1);
  const Tensor mask7 = testing::ids({1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 7});
  EXPECT_EQ(values(nn::concat_pool(real, mask3)), values(nn::concat_pool(padded, mask7)));
  // h_last is the last real token, max and mean only over real ones.
  const std::vector<double> pooled = values(nn::concat_pool(real, mask3));
  const std::vector<double> h = values(real);
  EXPECT_EQ(pooled[0], h[2 * 4 + 0]);            // row 0: 3 real tokens, last at t = 2
  EXPECT_EQ(pooled[12 + 0], h[12 + 1 * 4 + 0]);  // row 1: 2 real tokens, last at t = 1
  EXPECT_DOUBLE_EQ(pooled[12 + 8], (h[12 + 0] + h[12 + 4]) / 2);  // row 1's mean, channel 0
}

TEST(ConcatPool, RefusesEmptyRowsAndPaddingBeforeATextEnds) {
  const Tensor hidden = testing::randn({2, 3, 2}, 1).detach();
  EXPECT_EQ(testing::exit_code_of([&] {
              nn::concat_pool(hidden, testing::ids({1, 1, 0, 0, 0, 0}, {2, 3}));
            }),
            ExitCode::usage);
  EXPECT_EQ(testing::exit_code_of([&] {
              nn::concat_pool(hidden, testing::ids({1, 0, 1, 1, 1, 1}, {2, 3}));
            }),
            ExitCode::usage);
}

nn::GPTClassifier tiny_classifier(uint64_t seed = 5) {
  Generator gen(seed);
  return nn::GPTClassifier(testing::tiny_gpt_config(), {.num_labels = 3, .hidden = 7}, gen);
}

TEST(GPTClassifier, NamesAreTheBackbonesWithoutTheLMHeadPlusTheHead) {
  nn::GPTClassifier model = tiny_classifier();
  Generator gen(5);
  nn::GPT gpt(testing::tiny_gpt_config(), gen);
  std::vector<std::string> names, backbone;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  for (const auto& [name, t] : gpt.named_parameters()) backbone.push_back(name);
  backbone.insert(backbone.end(),
                  {"head.fc.weight", "head.fc.bias", "head.out.weight", "head.out.bias"});
  EXPECT_EQ(names, backbone);  // the head last: above the blocks for layer-wise rates
  // The backbone draws its init as a GPT of the same seed does.
  EXPECT_EQ(values(model.named_parameters()[0].tensor), values(gpt.named_parameters()[0].tensor));

  nn::GPTConfig untied = testing::tiny_gpt_config();
  untied.tie_embeddings = false;
  Generator g2(5);
  nn::GPTClassifier no_lm_head(untied, {.num_labels = 3}, g2);
  for (const auto& [name, t] : no_lm_head.named_parameters()) EXPECT_NE(name, "lm_head.weight");
}

TEST(GPTClassifier, PaddingChangesNothing) {
  nn::GPTClassifier model = tiny_classifier();
  model.eval();
  NoGradGuard no_grad;
  const Tensor ids = testing::ids({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
  const Tensor mask = testing::ids({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 5});
  const Tensor more_ids = testing::ids({3, 1, 4, 1, 5, 7, 7, 9, 2, 6, 8, 8, 8, 8}, {2, 7});
  const Tensor more_mask = testing::ids({1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 7});
  const std::vector<double> a = values(model.forward(ids, mask)),
                            b = values(model.forward(more_ids, more_mask));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
}

TEST(LastToken, PicksEachRowsLastRealTokenAndPassesGradients) {
  const Tensor hidden = testing::randn({2, 4, 3}, 9);
  const Tensor mask = testing::ids({1, 1, 1, 0, 1, 1, 1, 1}, {2, 4});
  const std::vector<double> h = values(hidden), last = values(nn::last_token(hidden, mask));
  ASSERT_EQ(last.size(), 6u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(last[size_t(c)], h[size_t(2 * 3 + c)]);           // row 0: t = 2
    EXPECT_EQ(last[size_t(3 + c)], h[size_t(12 + 3 * 3 + c)]);  // row 1: t = 3
  }
  EXPECT_EQ(
      testing::gradcheck([&](const auto& in) { return nn::last_token(in[0], mask); }, {hidden}),
      "");
}

TEST(GPTRewardModel, ValuesAreTheHeadAtEveryPositionAndTheRewardAtTheLast) {
  Generator gen(6);
  nn::GPTRewardModel model(testing::tiny_gpt_config(), gen);
  model.eval();
  NoGradGuard no_grad;
  const Tensor ids = testing::ids({3, 1, 4, 1, 5, 9, 2, 6, 0, 0}, {2, 5});
  const Tensor mask = testing::ids({1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
  ASSERT_EQ(model.values(ids).shape(), (Shape{2, 5}));
  const std::vector<double> v = values(model.values(ids));
  const std::vector<double> r = values(model.rewards(ids, mask));
  EXPECT_NEAR(v[4], r[0], 1e-6);  // row 0's last position is its last real token
  EXPECT_NEAR(v[7], r[1], 1e-6);  // row 1's is position 2
  // Causal attention: position t of a row does not see what follows, padding included.
  const std::vector<double> prefix = values(model.values(testing::ids({9, 2, 6}, {1, 3})));
  for (size_t t = 0; t < 3; ++t) EXPECT_NEAR(v[5 + t], prefix[t], 1e-6) << t;
}

TEST(GPTRewardModel, AScalarOnTheLastRealTokenThatPaddingDoesNotChange) {
  Generator gen(5);
  nn::GPTRewardModel model(testing::tiny_gpt_config(), gen);
  Generator g2(5);
  nn::GPT gpt(testing::tiny_gpt_config(), g2);
  std::vector<std::string> names, backbone;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  for (const auto& [name, t] : gpt.named_parameters()) backbone.push_back(name);
  backbone.push_back("head.score.weight");  // no bias, as Hugging Face's score head
  EXPECT_EQ(names, backbone);

  model.eval();
  NoGradGuard no_grad;
  const Tensor ids = testing::ids({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
  const Tensor mask = testing::ids({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 5});
  const std::vector<double> r = values(model.rewards(ids, mask));
  ASSERT_EQ(r.size(), 2u);
  // Row 1 alone, unpadded: the same reward.
  const std::vector<double> alone =
      values(model.rewards(testing::ids({9, 2}, {1, 2}), testing::ids({1, 1}, {1, 2})));
  EXPECT_NEAR(r[1], alone[0], 1e-6);
  // The reward is the score head on the backbone's final hidden state at the last real token.
  const std::vector<double> h = values(gpt.forward(ids, nn::GPTOutput::hidden));
  const std::vector<double> w = values(model.score->weight);
  const int64_t C = testing::tiny_gpt_config().d_model;
  double expect = 0;
  for (int64_t c = 0; c < C; ++c) expect += w[size_t(c)] * h[size_t(4 * C + c)];  // row 0, t = 4
  EXPECT_NEAR(r[0], expect, 1e-5);
  // A row longer than the context is refused rather than cut.
  const int64_t T = testing::tiny_gpt_config().context;
  const Tensor long_ids = zeros({1, T + 1}, DType::i64);
  testing::expect_error(ExitCode::internal, "do not fit the context",
                        [&] { model.rewards(long_ids, full({1, T + 1}, 1, DType::i64)); });
}

TEST(GPTClassifier, ALongTextRunsAsWindowsOfTheContextPooledTogether) {
  nn::GPTClassifier model = tiny_classifier();
  model.eval();
  NoGradGuard no_grad;
  const int64_t T = testing::tiny_gpt_config().context;  // 8
  // A text of 19 tokens: windows of 8, 8 and 3 (the last padded to 8).
  std::vector<double> text;
  for (int i = 0; i < 19; ++i) text.push_back(double((i * 7 + 3) % 11));
  const Tensor ids = testing::ids(text, {1, 19});
  const Tensor mask = ones({1, 19}, DType::i64);
  const std::vector<double> got = values(model.features(ids, mask));

  // By hand: each window through the backbone on its own, hidden states concatenated, pooled.
  std::vector<Tensor> parts;
  for (int64_t w = 0; w < 3; ++w) {
    const int64_t n = std::min<int64_t>(T, 19 - w * T);
    const Tensor window = slice(ids, 1, w * T, w * T + n);
    parts.push_back(model.backbone().forward(window, nn::GPTOutput::hidden));
  }
  const std::vector<double> want = values(nn::concat_pool(cat(parts, 1), mask));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

// In a batch, a short row's windows after its text are left out of the backbone's batch and
// come back as zeros (nn/classifier.cpp): each row's features and the parameters' gradients are
// those of the rows run one at a time, unpadded.
TEST(GPTClassifier, WindowsOfPaddingOnlyChangeNeitherFeaturesNorGradients) {
  nn::GPTClassifier model = tiny_classifier();
  model.eval();
  const int64_t L = 19;  // 3 windows of 8 for row 0; row 1 has 5 tokens, its 1 window only
  std::vector<double> ids_v, mask_v, long_text, short_text;
  for (int64_t i = 0; i < L; ++i) {
    long_text.push_back(double((i * 7 + 3) % 11));
    ids_v.push_back(long_text.back());
    mask_v.push_back(1);
  }
  for (int64_t i = 0; i < L; ++i) {
    if (i < 5) short_text.push_back(double((i * 5 + 2) % 11));
    ids_v.push_back(i < 5 ? short_text.back() : 0.0);
    mask_v.push_back(i < 5 ? 1 : 0);
  }
  auto gradients = [&](const Tensor& loss) {
    for (Tensor p : model.parameters()) p.set_grad(Tensor());
    loss.backward();
    std::vector<double> g;
    for (const Tensor& p : model.parameters()) {
      const std::vector<double> v =
          p.grad().defined() ? values(p.grad()) : std::vector<double>(size_t(p.numel()));
      g.insert(g.end(), v.begin(), v.end());
    }
    return g;
  };
  // A weighted sum, so that the two rows' features count differently.
  auto loss_of = [](const Tensor& features, double weight) {
    return sum(mul(features, weight));
  };
  const Tensor batch = model.features(testing::ids(ids_v, {2, L}), testing::ids(mask_v, {2, L}));
  const std::vector<double> got = values(batch);
  const std::vector<double> got_grad =
      gradients(add(loss_of(slice(batch, 0, 0, 1), 1.0), loss_of(slice(batch, 0, 1, 2), -2.0)));

  const Tensor one = model.features(testing::ids(long_text, {1, L}), ones({1, L}, DType::i64));
  const Tensor two = model.features(testing::ids(short_text, {1, 5}), ones({1, 5}, DType::i64));
  std::vector<double> want = values(one);
  for (double v : values(two)) want.push_back(v);
  const std::vector<double> want_grad = gradients(add(loss_of(one, 1.0), loss_of(two, -2.0)));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  ASSERT_EQ(got_grad.size(), want_grad.size());
  for (size_t i = 0; i < got_grad.size(); ++i) EXPECT_NEAR(got_grad[i], want_grad[i], 1e-4) << i;
}

TEST(GPTClassifier, RefusesBadHeadSizes) {
  Generator gen(1);
  for (nn::ClassifierHeadConfig bad :
       {nn::ClassifierHeadConfig{.num_labels = 1}, nn::ClassifierHeadConfig{.hidden = 0},
        nn::ClassifierHeadConfig{.dropout = 1.0}})
    EXPECT_EQ(
        testing::exit_code_of([&] { nn::GPTClassifier(testing::tiny_gpt_config(), bad, gen); }),
        ExitCode::usage);
}

TEST(BertClassifier, IsTheTanhPoolerOnCLSThenALinearAndIgnoresPadding) {
  nn::BertConfig config;
  config.vocab_size = 13;
  config.max_positions = 8;
  config.d_model = 8;
  config.n_layers = 1;
  config.n_heads = 2;
  config.d_ff = 16;
  Generator gen(3);
  nn::BertClassifier model(config, {.num_labels = 4}, gen);
  std::set<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.insert(name);
  EXPECT_TRUE(names.count("pooler.weight"));
  EXPECT_TRUE(names.count("head.out.weight"));
  for (const std::string& name : names) {
    EXPECT_FALSE(name.starts_with("mlm.")) << name;
    EXPECT_FALSE(name.starts_with("nsp.")) << name;
  }
  model.eval();
  NoGradGuard no_grad;
  const Tensor ids = testing::ids({1, 5, 6, 2, 1, 7, 2, 0}, {2, 4});
  const Tensor mask = testing::ids({1, 1, 1, 1, 1, 1, 1, 0}, {2, 4});
  const Tensor logits = model.forward(ids, mask);
  const nn::BertOutputs bert = model.backbone().forward(ids, Tensor(), mask);
  const std::vector<double> want = values(model.out->forward(bert.pooled));
  EXPECT_EQ(values(logits), want);
  const Tensor more_ids = testing::ids({1, 7, 2, 0, 0, 0}, {1, 6});
  const Tensor more_mask = testing::ids({1, 1, 1, 0, 0, 0}, {1, 6});
  const std::vector<double> row1 = values(model.forward(more_ids, more_mask));
  for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(row1[k], want[4 + k], 1e-6);
}

}  // namespace
}  // namespace forge
