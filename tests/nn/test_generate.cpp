// Batched generation (nn/generate.h): a left-padded KV cache gives each row the logits it has alone;
// generate_batch equals a one-row-at-a-time reference built on plain full forwards, token for
// token, for every batch size and mix of prompt lengths; log-probabilities are the model's own, and
// the sampling distribution's (checked by hand); completions stop at an end-of-text sequence; a
// row's draws do not depend on the other rows; ids past a vocabulary limit are never drawn; and bad
// prompts or options are refused with their exit codes. GPT-2 and LLaMA flavours both run, so
// learned and rotary positions are each checked per row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/attention.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "tests/nn/tiny_gpt.h"

namespace forge::nn {
namespace {

using Prompts = std::vector<std::vector<int64_t>>;

// The nn tests' tiny GPT with room for the longest prompt (7) plus 10 new tokens, and more ids.
std::unique_ptr<GPT> make_model(bool llama) {
  GPTConfig c = testing::tiny_gpt_config(llama);
  c.vocab_size = 23;
  c.context = 24;
  Generator gen(3);
  auto model = std::make_unique<GPT>(c, gen);
  model->eval();
  return model;
}

Tensor ids_of(const std::vector<int64_t>& ids, int64_t rows = 1) {
  Tensor t = empty({rows, int64_t(ids.size()) / rows}, DType::i64);
  std::copy(ids.begin(), ids.end(), t.data<int64_t>());
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return max(abs(a - b)).item(); }

// Prompts of lengths 3, 7, 1, 5 and 2.
Prompts mixed_prompts() {
  return {{4, 9, 1}, {2, 2, 17, 8, 0, 13, 5}, {11}, {6, 3, 21, 7, 19}, {14, 12}};
}

SamplingOptions sampling(int64_t max_new_tokens = 10) {
  SamplingOptions o;
  o.max_new_tokens = max_new_tokens;
  o.temperature = 0.9;
  o.top_k = 12;
  o.top_p = 0.95;
  o.seed = 41;
  return o;
}

bool ends_with(const std::vector<int64_t>& tokens, const std::vector<int64_t>& tail) {
  return !tail.empty() && tokens.size() >= tail.size() &&
         std::equal(tail.begin(), tail.end(), tokens.end() - int64_t(tail.size()));
}

// What generate_batch must give for sample `s` of prompt `p`: the row alone, without a cache, a
// full forward over the sequence so far for each token, and the log-probability read off
// log_softmax of that forward's raw logits.
Completion reference(const GPT& model, const Prompts& prompts, int64_t p, int64_t s,
                     const SamplingOptions& o, const std::vector<int64_t>& end_of_text = {}) {
  NoGradGuard no_grad;
  Completion c;
  c.prompt_index = p;
  c.sample_index = s;
  std::vector<int64_t> seq = prompts[size_t(p)];
  const int64_t V = model.config().vocab_size;
  for (int64_t i = 0; i < o.max_new_tokens && !c.finished; ++i) {
    Tensor logits = model.forward(ids_of(seq), GPTOutput::last_logits).contiguous();
    const int64_t token =
        sample_token(logits.data<float>(), V, o, sample_stream(p, s), uint64_t(i));
    c.logprob += log_softmax(reshape(logits, {V}), -1).to_vector<double>()[size_t(token)];
    c.tokens.push_back(token);
    seq.push_back(token);
    c.finished = ends_with(c.tokens, end_of_text);
  }
  return c;
}

void expect_same(const Completion& got, const Completion& want, const std::string& where) {
  EXPECT_EQ(got.prompt_index, want.prompt_index) << where;
  EXPECT_EQ(got.sample_index, want.sample_index) << where;
  EXPECT_EQ(got.tokens, want.tokens) << where;
  EXPECT_EQ(got.finished, want.finished) << where;
  EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << where;
}

// ---- the left-padded KV cache ----

// Rows of 3 and 6 prompt tokens left-padded into one cache, prefilled, then decoded a token at a
// time: each real position's logits equal those of the row's own full forward.
void check_left_padded_cache(bool llama) {
  const std::unique_ptr<GPT> m = make_model(llama);
  const GPT& model = *m;
  const Prompts rows = {{5, 1, 9, 3, 3, 20}, {8, 0, 4, 16, 11, 2, 6, 10, 1}};
  const int64_t length[2] = {3, 6}, L = 6;
  KVCache cache = model.make_cache(2, L + 3);
  cache.start = {L - length[0], L - length[1]};
  std::vector<int64_t> prefill(2 * L, 0);
  for (int64_t b = 0; b < 2; ++b)
    std::copy(rows[size_t(b)].begin(), rows[size_t(b)].begin() + length[b],
              prefill.begin() + (b + 1) * L - length[b]);
  Tensor first = model.forward_incremental(ids_of(prefill, 2), cache);  // [2, L, V]
  NoGradGuard no_grad;
  std::vector<Tensor> alone;
  for (const std::vector<int64_t>& row : rows) alone.push_back(model.forward(ids_of(row)));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < length[b]; ++t) {
      const int64_t slot = L - length[b] + t;
      EXPECT_LT(max_abs_diff(slice(slice(first, 0, b, b + 1), 1, slot, slot + 1),
                             slice(alone[size_t(b)], 1, t, t + 1)),
                1e-5)
          << "row " << b << ", prompt position " << t;
    }
  std::vector<int64_t> active = {0, 1};
  for (int64_t step = 0; step < 3; ++step) {
    if (step == 2) {  // row 0 leaves the batch: row 1 keeps its slots, positions and mask
      cache = select_rows(cache, {1});
      active = {1};
      EXPECT_EQ(cache.start, (std::vector<int64_t>{L - length[1]}));
    }
    std::vector<int64_t> next;
    for (int64_t b : active) next.push_back(rows[size_t(b)][size_t(length[b] + step)]);
    Tensor logits = model.forward_incremental(ids_of(next, int64_t(active.size())), cache);
    for (size_t j = 0; j < active.size(); ++j) {
      const int64_t b = active[j], t = length[b] + step;
      EXPECT_LT(max_abs_diff(slice(logits, 0, int64_t(j), int64_t(j) + 1),
                             slice(alone[size_t(b)], 1, t, t + 1)),
                1e-5)
          << "row " << b << ", decoded position " << t;
    }
  }
}

TEST(NnKVCache, LeftPaddedRowsMatchTheirOwnForwardGPT2) { check_left_padded_cache(false); }
TEST(NnKVCache, LeftPaddedRowsMatchTheirOwnForwardLlama) { check_left_padded_cache(true); }

// ---- generate_batch ----

// Every batch size, from one row at a time to all 15 rows at once, gives each (prompt, sample) the
// reference's tokens and log-probability; an end-of-text id makes some rows finish early, so
// batches shrink mid-way.
void check_matches_reference(bool llama) {
  const std::unique_ptr<GPT> m = make_model(llama);
  const GPT& model = *m;
  const Prompts prompts = mixed_prompts();
  const SamplingOptions o = sampling();
  BatchOptions b;
  b.num_samples = 3;
  b.end_of_text = {5};
  std::vector<Completion> want;
  for (int64_t p = 0; p < 5; ++p)
    for (int64_t s = 0; s < 3; ++s) want.push_back(reference(model, prompts, p, s, o, {5}));
  int64_t finished = 0;
  for (const Completion& c : want) finished += c.finished;
  EXPECT_GT(finished, 0);   // some rows leave their batch early ...
  EXPECT_LT(finished, 15);  // ... and others run to max_new_tokens
  for (int64_t batch_size : {1, 2, 4, 7, 15, 64}) {
    b.batch_size = batch_size;
    const std::vector<Completion> got = generate_batch(model, prompts, o, b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r)
      expect_same(got[r], want[r], "batch_size " + std::to_string(batch_size) + ", row " +
                                       std::to_string(r));
  }
}

TEST(NnGenerateBatch, EqualsOneRowAtATimeForEveryBatchSizeGPT2) { check_matches_reference(false); }
TEST(NnGenerateBatch, EqualsOneRowAtATimeForEveryBatchSizeLlama) { check_matches_reference(true); }

// Top-k keeps the k largest logits, ties going to the lower id, and draws among them in proportion
// to exp(logit / T): 40,000 draws of a 9-id vocabulary where ids 2, 5 and 7 tie at the top-k edge.
TEST(NnSampleToken, TopKDrawsAmongTheKLargestInProportionToTheirProbability) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, -1.0f, 3.0f, 1.0f, 0.0f, 1.0f, 2.5f};
  SamplingOptions o;
  o.temperature = 0.8;
  o.top_k = 5;  // 4, 8, 1, then 2 and 5 of the three ids at 1.0
  o.seed = 3;
  const std::vector<int64_t> kept = {4, 8, 1, 2, 5};
  double total = 0;
  for (int64_t id : kept) total += std::exp(double(logits[size_t(id)]) / o.temperature);
  const int draws = 40000;
  std::vector<int> seen(logits.size(), 0);
  for (int d = 0; d < draws; ++d)
    seen[size_t(sample_token(logits.data(), int64_t(logits.size()), o, 0, uint64_t(d)))]++;
  for (size_t id = 0; id < logits.size(); ++id) {
    const bool is_kept = std::find(kept.begin(), kept.end(), int64_t(id)) != kept.end();
    const double p = is_kept ? std::exp(double(logits[id]) / o.temperature) / total : 0.0;
    // Five standard errors of a binomial frequency.
    EXPECT_NEAR(double(seen[id]) / draws, p, 5 * std::sqrt(p * (1 - p) / draws) + 1e-12) << id;
  }
}

// The log-probability is the model's own (temperature 1, unfiltered): one full forward over prompt
// + completion, log_softmax, summed at the completion's tokens; the sampling log-probability is
// that of the tempered, top-k and top-p distribution the tokens were drawn from, read off the same
// forward's logits with sampling_log_probability.
TEST(NnGenerateBatch, LogprobsAreTheModelsAndTheSamplingDistributions) {
  const std::unique_ptr<GPT> m = make_model(false);
  const GPT& model = *m;
  const Prompts prompts = mixed_prompts();
  SamplingOptions o = sampling(12);
  o.temperature = 0.5;
  o.top_k = 3;
  o.top_p = 0.9;
  BatchOptions b;
  b.num_samples = 2;
  b.batch_size = 4;
  NoGradGuard no_grad;
  for (const Completion& c : generate_batch(model, prompts, o, b)) {
    std::vector<int64_t> seq = prompts[size_t(c.prompt_index)];
    const int64_t P = int64_t(seq.size());
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
    const Tensor logits = model.forward(ids_of(seq)).contiguous();  // [1, T, V]
    const std::vector<double> lp = log_softmax(logits, -1).contiguous().to_vector<double>();
    const int64_t V = logits.size(2);
    double want = 0, want_sampling = 0;
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int64_t at = (P - 1 + int64_t(i)) * V;
      want += lp[size_t(at + c.tokens[i])];
      want_sampling += sampling_log_probability(logits.data<float>() + at, V, o, c.tokens[i]);
    }
    EXPECT_NEAR(c.logprob, want, 1e-4) << "prompt " << c.prompt_index << " sample "
                                       << c.sample_index;
    EXPECT_NEAR(c.sampling_logprob, want_sampling, 1e-4) << "prompt " << c.prompt_index;
    EXPECT_LT(c.logprob, 0.0);
  }
}

// The distribution sample_token draws from, by hand: logits / 0.8 are 3.75 (id 4), 3.125 (8),
// 2.5 (1), 1.25 (2 and 5), ...; top-k 5 keeps those five; their weights relative to the top are
// 1, e^-0.625, e^-1.25, e^-2.5, e^-2.5 (total 1.9860); top-p 0.8 stops once 0.8 x 1.9860 = 1.589
// is reached, after 1 + 0.5353 + 0.2865 = 1.8218: ids 4, 8 and 1 remain, renormalised.
TEST(NnSampleToken, SamplingLogProbabilityIsThatOfTheTemperedTruncatedDistribution) {
  const std::vector<float> logits = {0.5f, 2.0f, 1.0f, -1.0f, 3.0f, 1.0f, 0.0f, 1.0f, 2.5f};
  const int64_t V = int64_t(logits.size());
  SamplingOptions o;
  o.temperature = 0.8;
  o.top_k = 5;
  o.top_p = 0.8;
  const double total = 1 + std::exp(-0.625) + std::exp(-1.25);
  EXPECT_NEAR(sampling_log_probability(logits.data(), V, o, 4), -std::log(total), 1e-12);
  EXPECT_NEAR(sampling_log_probability(logits.data(), V, o, 8), -0.625 - std::log(total), 1e-12);
  EXPECT_NEAR(sampling_log_probability(logits.data(), V, o, 1), -1.25 - std::log(total), 1e-12);
  for (int64_t never : {2, 5, 0, 3})  // cut by top-p (2, 5) or top-k (0, 3)
    EXPECT_EQ(sampling_log_probability(logits.data(), V, o, never),
              -std::numeric_limits<double>::infinity())
        << never;
  // Unfiltered: log_softmax(logits / T).
  o.top_k = 0;
  o.top_p = 1.0;
  double all = 0;
  for (float l : logits) all += std::exp(double(l) / 0.8);
  EXPECT_NEAR(sampling_log_probability(logits.data(), V, o, 3), -1.0 / 0.8 - std::log(all), 1e-12);
  // Greedy: certain of the argmax.
  o.temperature = 0.0;
  EXPECT_EQ(sampling_log_probability(logits.data(), V, o, 4), 0.0);
  EXPECT_EQ(sampling_log_probability(logits.data(), V, o, 8), -std::numeric_limits<double>::infinity());
}

// Greedy decoding makes the completion known in advance: a two-token end-of-text taken from its
// middle ends it right there (the two tokens kept), and a sequence it never generates lets it run.
TEST(NnGenerateBatch, StopsAfterTheEndOfTextSequence) {
  const std::unique_ptr<GPT> m = make_model(false);
  const GPT& model = *m;
  SamplingOptions o = sampling(12);
  o.temperature = 0.0;
  const Prompts prompts = {{4, 9, 1}};
  BatchOptions b;
  const std::vector<int64_t> full = generate_batch(model, prompts, o, b)[0].tokens;
  ASSERT_EQ(full.size(), 12u);
  b.end_of_text = {full[4], full[5]};
  const size_t first = size_t(std::search(full.begin(), full.end(), b.end_of_text.begin(),
                                          b.end_of_text.end()) - full.begin());
  const Completion c = generate_batch(model, prompts, o, b)[0];
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.tokens, std::vector<int64_t>(full.begin(), full.begin() + int64_t(first) + 2));
  EXPECT_NEAR(c.logprob, reference(model, prompts, 0, 0, o, b.end_of_text).logprob, 1e-4);
  b.end_of_text = {22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22};  // longer than any sample
  const Completion unstopped = generate_batch(model, prompts, o, b)[0];
  EXPECT_FALSE(unstopped.finished);
  EXPECT_EQ(unstopped.tokens, full);
}

// A row's tokens depend on (seed, prompt index, sample index) only: more prompts after it, other
// batch sizes and more samples per prompt leave it unchanged, while another seed or sample index
// changes it. Sample 0 of prompt 0 draws as the single-prompt generate() does.
TEST(NnGenerateBatch, DrawsDoNotDependOnTheOtherRows) {
  const std::unique_ptr<GPT> m = make_model(true);
  const GPT& model = *m;
  const SamplingOptions o = sampling();
  Prompts few = mixed_prompts();
  few.resize(2);
  BatchOptions b;
  b.num_samples = 2;
  b.batch_size = 1;
  const std::vector<Completion> alone = generate_batch(model, few, o, b);
  b.num_samples = 4;
  b.batch_size = 6;
  const std::vector<Completion> crowded = generate_batch(model, mixed_prompts(), o, b);
  for (size_t r = 0; r < alone.size(); ++r) {
    const Completion& c = alone[r];
    expect_same(crowded[size_t(c.prompt_index * 4 + c.sample_index)], c, std::to_string(r));
  }
  EXPECT_NE(alone[0].tokens, alone[1].tokens);  // two samples of one prompt differ
  SamplingOptions reseeded = o;
  reseeded.seed = 42;
  EXPECT_NE(generate_batch(model, few, reseeded, b)[0].tokens, alone[0].tokens);
  EXPECT_EQ(generate(model, few[0], o), alone[0].tokens);
}

TEST(NnGenerateBatch, RefusesPromptsThatDoNotFitAndBadOptions) {
  const std::unique_ptr<GPT> m = make_model(false);
  const GPT& model = *m;
  const SamplingOptions o = sampling();  // 10 new tokens, context 24
  BatchOptions b;
  auto code = [&](const Prompts& prompts, const SamplingOptions& s, const BatchOptions& opts) {
    try {
      generate_batch(model, prompts, s, opts);
    } catch (const Error& e) {
      return e.code();
    }
    return ExitCode::ok;
  };
  const std::vector<int64_t> fits(14, 1), too_long(15, 1);
  EXPECT_EQ(code({fits}, o, b), ExitCode::ok);
  EXPECT_EQ(code({fits, too_long}, o, b), ExitCode::usage);
  EXPECT_EQ(code({fits, {}}, o, b), ExitCode::usage);
  EXPECT_EQ(code({{1, 23}}, o, b), ExitCode::data);
  BatchOptions bad = b;
  bad.num_samples = 0;
  EXPECT_EQ(code({fits}, o, bad), ExitCode::usage);
  bad = b;
  bad.batch_size = 0;
  EXPECT_EQ(code({fits}, o, bad), ExitCode::usage);
  bad = b;
  bad.end_of_text = {-1};
  EXPECT_EQ(code({fits}, o, bad), ExitCode::usage);
  SamplingOptions none = o;
  none.max_new_tokens = 0;
  const std::vector<Completion> empty = generate_batch(model, {fits}, none, b);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_TRUE(empty[0].tokens.empty());
  try {
    generate_batch(model, {fits, too_long}, o, b);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1 is 15 tokens"), std::string::npos) << e.what();
  }
  // 3 x 2^32 completions do not fit in memory: a usage error naming the option, not a failed
  // allocation (an internal error).
  bad = b;
  bad.num_samples = int64_t(1) << 32;
  EXPECT_EQ(code({fits, fits, fits}, o, bad), ExitCode::usage);
  try {
    generate_batch(model, {fits, fits, fits}, o, bad);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 prompts x --num-samples 4294967296"),
              std::string::npos)
        << e.what();
  }
}

// A model whose vocabulary is padded past its tokenizer's: with vocab_limit set, no sampler
// (greedy, top-k, top-p, batched or one prompt) draws an id at or past it, even where such an id
// has the largest logit, and the sampling distribution gives it probability 0.
TEST(NnSampleToken, NeverDrawsIdsPastTheVocabularyLimit) {
  const std::vector<float> logits = {0.5f, 1.0f, 0.0f, 4.0f, 5.0f};  // ids 3 and 4 lead
  SamplingOptions o;
  o.vocab_limit = 3;
  o.temperature = 0.0;
  EXPECT_EQ(sample_token(logits.data(), 5, o, 0, 0), 1);
  EXPECT_EQ(sampling_log_probability(logits.data(), 5, o, 1), 0.0);
  for (double temperature : {0.7, 2.0})
    for (int64_t top_k : {0, 2})
      for (double top_p : {1.0, 0.5}) {
        o.temperature = temperature;
        o.top_k = top_k;
        o.top_p = top_p;
        for (uint64_t d = 0; d < 200; ++d)
          EXPECT_LT(sample_token(logits.data(), 5, o, 0, d), 3) << temperature << " " << top_k;
        EXPECT_EQ(sampling_log_probability(logits.data(), 5, o, 4),
                  -std::numeric_limits<double>::infinity());
      }
  // Past the model's own vocabulary the limit changes nothing.
  SamplingOptions all = o;
  all.vocab_limit = 0;
  o.vocab_limit = 99;
  for (uint64_t d = 0; d < 20; ++d)
    EXPECT_EQ(sample_token(logits.data(), 5, o, 0, d), sample_token(logits.data(), 5, all, 0, d));

  const std::unique_ptr<GPT> model = make_model(false);  // 23 ids
  SamplingOptions s = sampling();
  s.temperature = 2.0;
  s.top_k = 0;
  s.top_p = 1.0;
  s.vocab_limit = 4;
  BatchOptions b;
  b.num_samples = 8;
  for (const Completion& c : generate_batch(*model, mixed_prompts(), s, b))
    for (int64_t token : c.tokens) EXPECT_LT(token, 4);
  for (int64_t token : generate(*model, {4, 9, 1}, s)) EXPECT_LT(token, 4);
  s.vocab_limit = -1;
  EXPECT_THROW(check_sampling(s), Error);
}

// check_prompts is what generate_batch checks, callable with a config's context and vocabulary
// before a model exists.
TEST(NnGenerateBatch, CheckPromptsRefusesWhatGenerateBatchRefuses) {
  SamplingOptions o = sampling();  // 10 new tokens
  auto code = [&](const Prompts& prompts) {
    try {
      check_prompts(prompts, 24, 23, o);
    } catch (const Error& e) {
      return e.code();
    }
    return ExitCode::ok;
  };
  EXPECT_EQ(code({std::vector<int64_t>(14, 1)}), ExitCode::ok);
  EXPECT_EQ(code({std::vector<int64_t>(15, 1)}), ExitCode::usage);
  EXPECT_EQ(code({{}}), ExitCode::usage);
  EXPECT_EQ(code({{1, 23}}), ExitCode::data);
  o.max_new_tokens = std::numeric_limits<int64_t>::max();  // no overflow past the context
  EXPECT_EQ(code({{1}}), ExitCode::usage);
}

}  // namespace
}  // namespace forge::nn
