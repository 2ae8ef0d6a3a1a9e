// Sampling. Filtering works on a sorted copy of the logits of one position: O(V log V) per token,
// small next to the forward pass for the vocabularies Forge trains.
#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/ops.h"

namespace forge::nn {

void check_sampling(const SamplingOptions& o) {
  if (o.max_new_tokens < 0)
    throw Error(ExitCode::usage, detail::concat("--max-new-tokens must be >= 0, got ", o.max_new_tokens));
  if (!(o.temperature >= 0))
    throw Error(ExitCode::usage, detail::concat("--temperature must be >= 0, got ", o.temperature));
  if (o.top_k < 0) throw Error(ExitCode::usage, detail::concat("--top-k must be >= 0, got ", o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw Error(ExitCode::usage, detail::concat("--top-p must be in (0, 1], got ", o.top_p));
}

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, uint64_t draw) {
  if (o.temperature == 0.0) return int64_t(std::max_element(logits, logits + vocab) - logits);
  // Candidates by descending logit (ties by id, so the order is deterministic).
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  size_t keep = o.top_k > 0 ? std::min(size_t(o.top_k), order.size()) : order.size();
  std::vector<double> p(keep);
  double top = double(logits[order[0]]) / o.temperature, total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp(double(logits[order[i]]) / o.temperature - top);
  if (o.top_p < 1.0) {
    double mass = 0;
    size_t n = 0;
    while (n < keep && mass < o.top_p * total) mass += p[n++];
    keep = std::max<size_t>(n, 1);
    total = mass;
  }
  auto w = philox(o.seed, rng_stream("sample"), draw);
  double u = uniform_from_bits(w[0], w[1]) * total, acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<int64_t> generate(const GPT& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options) {
  check_sampling(options);
  if (prompt.empty()) throw Error(ExitCode::usage, "generate: the prompt encodes to no tokens");
  NoGradGuard no_grad;
  const int64_t context = model.config().context, vocab = model.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw Error(ExitCode::data, detail::concat("generate: prompt token ", prompt[i], " at position ",
                                                 i, " is outside the vocabulary [0, ", vocab, ")"));
  std::vector<int64_t> tokens = prompt, out;
  KVCache cache = model.make_cache(1);
  auto as_tensor = [](const int64_t* ids, int64_t n) {
    Tensor t = empty({1, n}, DType::i64);
    std::copy(ids, ids + n, t.data<int64_t>());
    return t;
  };
  Tensor logits;
  if (int64_t(tokens.size()) <= context)
    logits = model.forward_incremental(as_tensor(tokens.data(), int64_t(tokens.size())), cache,
                                       GPTOutput::last_logits);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (options.stop && options.stop()) break;
    int64_t n = int64_t(tokens.size());
    if (n > context) {
      logits = model.forward(as_tensor(tokens.data() + (n - context), context), GPTOutput::last_logits);
    }
    Tensor row = logits.contiguous();
    int64_t next = sample_token(row.data<float>(), vocab, options, uint64_t(i));
    tokens.push_back(next);
    out.push_back(next);
    if (i + 1 < options.max_new_tokens && int64_t(tokens.size()) <= context)
      logits = model.forward_incremental(as_tensor(&next, 1), cache, GPTOutput::last_logits);
  }
  return out;
}

}  // namespace forge::nn
