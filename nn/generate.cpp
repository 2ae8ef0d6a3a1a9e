// Sampling. Filtering works on a sorted copy of the logits of one position: O(V log V) per token,
// small next to the forward pass for the vocabularies Forge trains. Batched generation left-pads
// prompts in one KV cache (nn/attention.h) and samples the rows of a step on all threads.
#include "nn/generate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/kernels/parallel.h"
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
  if (o.vocab_limit < 0)
    throw Error(ExitCode::usage, detail::concat("sampling: vocab_limit must be >= 0, got ",
                                                o.vocab_limit));
}

uint64_t sample_stream(int64_t prompt, int64_t sample) {
  // rng_stream mixes the step in bijectively, so distinct (prompt, sample) below 2^32 each never
  // share a stream.
  return rng_stream("sample", (uint64_t(prompt) << 32) | uint64_t(sample));
}

namespace {

// The ids sampling may draw: the first vocab_limit of the model's `vocab` when set.
int64_t drawable(int64_t vocab, const SamplingOptions& o) {
  return o.vocab_limit > 0 ? std::min(vocab, o.vocab_limit) : vocab;
}

// What sample_token draws from: candidates `order` by descending logit, the first `keep` of them
// with unnormalised probabilities `p` summing to `total`.
struct Candidates {
  std::vector<int64_t> order;
  std::vector<double> p;
  size_t keep;
  double total;
};

Candidates candidates(const float* logits, int64_t model_vocab, const SamplingOptions& o) {
  const int64_t vocab = drawable(model_vocab, o);
  // Candidates by descending logit, ties by id: a total order, so an unstable sort (no buffer to
  // allocate, unlike stable_sort) gives the one deterministic order. With top-k only the first k
  // need their place (a partial sort: O(V log k) for GPT-2's 50257 ids, not O(V log V)).
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  size_t keep = o.top_k > 0 ? std::min(size_t(o.top_k), order.size()) : order.size();
  auto before = [&](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (keep < order.size())
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), before);
  else
    std::sort(order.begin(), order.end(), before);
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
  return {std::move(order), std::move(p), keep, total};
}

}  // namespace

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, uint64_t stream,
                     uint64_t draw) {
  if (o.temperature == 0.0)
    return int64_t(std::max_element(logits, logits + drawable(vocab, o)) - logits);
  const Candidates c = candidates(logits, vocab, o);
  auto w = philox(o.seed, stream, draw);
  double u = uniform_from_bits(w[0], w[1]) * c.total, acc = 0;
  for (size_t i = 0; i < c.keep; ++i) {
    acc += c.p[i];
    if (u < acc) return c.order[i];
  }
  return c.order[c.keep - 1];
}

double sampling_log_probability(const float* logits, int64_t vocab, const SamplingOptions& o,
                                int64_t token) {
  constexpr double kNever = -std::numeric_limits<double>::infinity();
  if (o.temperature == 0.0)
    return std::max_element(logits, logits + drawable(vocab, o)) - logits == token ? 0.0 : kNever;
  const Candidates c = candidates(logits, vocab, o);
  for (size_t i = 0; i < c.keep; ++i)
    if (c.order[i] == token) return std::log(c.p[i] / c.total);
  return kNever;
}

namespace {

// `what` names the prompt in messages ("the prompt", "prompt 3").
void check_prompt(const std::vector<int64_t>& prompt, int64_t vocab, const std::string& what) {
  if (prompt.empty()) throw Error(ExitCode::usage, "generate: " + what + " encodes to no tokens");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab)
      throw Error(ExitCode::data, detail::concat("generate: ", what, ": token ", prompt[i],
                                                 " at position ", i,
                                                 " is outside the vocabulary [0, ", vocab, ")"));
}

// ids [n] as an i64 tensor of `shape` (n elements).
Tensor ids_tensor(const int64_t* ids, const Shape& shape) {
  Tensor t = empty(shape, DType::i64);
  std::copy(ids, ids + t.numel(), t.data<int64_t>());
  return t;
}

}  // namespace

std::vector<int64_t> generate(const GPT& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options,
                              const std::function<bool(int64_t token)>& ends) {
  check_sampling(options);
  const int64_t context = model.config().context, vocab = model.config().vocab_size;
  check_prompt(prompt, vocab, "the prompt");
  NoGradGuard no_grad;
  std::vector<int64_t> tokens = prompt, out;
  KVCache cache = model.make_cache(1);
  auto as_tensor = [](const int64_t* ids, int64_t n) { return ids_tensor(ids, {1, n}); };
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
    int64_t next =
        sample_token(row.data<float>(), vocab, options, sample_stream(0, 0), uint64_t(i));
    tokens.push_back(next);
    out.push_back(next);
    if (ends && ends(next)) break;
    if (i + 1 < options.max_new_tokens && int64_t(tokens.size()) <= context)
      logits = model.forward_incremental(as_tensor(&next, 1), cache, GPTOutput::last_logits);
  }
  return out;
}

void check_batch(const BatchOptions& o) {
  // Each bound keeps (prompt, sample) inside sample_stream's 32 bits.
  if (o.num_samples < 1 || o.num_samples > (int64_t(1) << 32))
    throw Error(ExitCode::usage,
                detail::concat("--num-samples must be in [1, 2^32], got ", o.num_samples));
  if (o.batch_size < 1)
    throw Error(ExitCode::usage, detail::concat("--batch-size must be >= 1, got ", o.batch_size));
}

namespace {

// log softmax(logits)[token] over V raw logits, in f64 (a completion's sum stays exact enough).
double log_probability(const float* logits, int64_t vocab, int64_t token) {
  const double top = *std::max_element(logits, logits + vocab);
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) total += std::exp(double(logits[v]) - top);
  return double(logits[token]) - top - std::log(total);
}

bool ends_with(const std::vector<int64_t>& tokens, const std::vector<int64_t>& tail) {
  return !tail.empty() && tokens.size() >= tail.size() &&
         std::equal(tail.begin(), tail.end(), tokens.end() - int64_t(tail.size()));
}

// Decodes completions `rows` (indices into `out`, prompt-major) as one batch; false when
// sampling.stop asked to end.
bool decode_rows(const GPT& model, const std::vector<std::vector<int64_t>>& prompts,
                 std::vector<int64_t> rows, const SamplingOptions& sampling,
                 const BatchOptions& options, std::vector<Completion>& out) {
  const int64_t V = model.config().vocab_size;
  // Prefill each distinct prompt once (a prompt's rows are adjacent), right-aligned at slot L.
  std::vector<int64_t> distinct, row_prompt;
  for (int64_t r : rows) {
    const int64_t p = out[size_t(r)].prompt_index;
    if (distinct.empty() || distinct.back() != p) distinct.push_back(p);
    row_prompt.push_back(int64_t(distinct.size()) - 1);
  }
  int64_t L = 0;
  for (int64_t p : distinct) L = std::max(L, int64_t(prompts[size_t(p)].size()));
  const int64_t U = int64_t(distinct.size());
  std::vector<int64_t> ids(size_t(U * L), 0);
  // The last sampled token is never fed back, hence max_new_tokens - 1 slots after the prompts.
  KVCache cache = model.make_cache(U, L + sampling.max_new_tokens - 1);
  for (int64_t u = 0; u < U; ++u) {
    const std::vector<int64_t>& prompt = prompts[size_t(distinct[size_t(u)])];
    cache.start.push_back(L - int64_t(prompt.size()));
    std::copy(prompt.begin(), prompt.end(), ids.begin() + (u + 1) * L - int64_t(prompt.size()));
  }
  Tensor logits =
      model.forward_incremental(ids_tensor(ids.data(), {U, L}), cache, GPTOutput::last_logits);
  if (U < int64_t(rows.size())) {
    cache = select_rows(cache, row_prompt);
    logits = index_select(logits, 0, ids_tensor(row_prompt.data(), {int64_t(rows.size())}));
  }
  std::vector<int64_t> next(rows.size());
  for (int64_t i = 0; i < sampling.max_new_tokens; ++i) {
    if (sampling.stop && sampling.stop()) return false;
    Tensor step = logits.contiguous();  // [B, 1, V]
    const float* l = step.data<float>();
    kernels::parallel_for(int64_t(rows.size()), [&](int64_t b) {
      Completion& c = out[size_t(rows[size_t(b)])];
      const float* row = l + b * V;
      const uint64_t stream = sample_stream(c.prompt_index, c.sample_index);
      const int64_t token = sample_token(row, V, sampling, stream, uint64_t(i));
      c.logprob += log_probability(row, V, token);
      c.sampling_logprob += sampling_log_probability(row, V, sampling, token);
      c.tokens.push_back(token);
      c.finished = ends_with(c.tokens, options.end_of_text);
      next[size_t(b)] = token;
    });
    // Finished rows leave the batch, so they cost nothing more.
    std::vector<int64_t> keep;
    for (size_t b = 0; b < rows.size(); ++b)
      if (!out[size_t(rows[b])].finished) keep.push_back(int64_t(b));
    if (keep.empty() || i + 1 == sampling.max_new_tokens) break;
    if (keep.size() < rows.size()) {
      cache = select_rows(cache, keep);
      std::vector<int64_t> kept_rows, kept_next;
      for (int64_t b : keep) {
        kept_rows.push_back(rows[size_t(b)]);
        kept_next.push_back(next[size_t(b)]);
      }
      rows = std::move(kept_rows);
      next = std::move(kept_next);
    }
    logits = model.forward_incremental(ids_tensor(next.data(), {int64_t(rows.size()), 1}), cache,
                                       GPTOutput::last_logits);
  }
  return true;
}

}  // namespace

void check_prompts(const std::vector<std::vector<int64_t>>& prompts, int64_t context, int64_t vocab,
                   const SamplingOptions& sampling) {
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int64_t>& prompt = prompts[p];
    check_prompt(prompt, vocab, detail::concat("prompt ", p));
    if (sampling.max_new_tokens > context - int64_t(prompt.size()))  // no overflow for any N
      throw Error(ExitCode::usage,
                  detail::concat("generate: prompt ", p, " is ", prompt.size(),
                                 " tokens, and with --max-new-tokens ", sampling.max_new_tokens,
                                 " its sample would pass the model context ", context,
                                 " (shorten it or lower --max-new-tokens)"));
  }
}

std::vector<Completion> generate_batch(const GPT& model,
                                       const std::vector<std::vector<int64_t>>& prompts,
                                       const SamplingOptions& sampling,
                                       const BatchOptions& options) {
  check_sampling(sampling);
  check_batch(options);
  const int64_t context = model.config().context, vocab = model.config().vocab_size;
  const int64_t P = int64_t(prompts.size()), K = options.num_samples;
  if (P >= (int64_t(1) << 32))
    throw Error(ExitCode::usage, detail::concat("generate: ", P, " prompts, at most 2^32 - 1"));
  for (int64_t v : options.end_of_text)
    if (v < 0 || v >= vocab)
      throw Error(ExitCode::usage, detail::concat("generate: end-of-text token ", v,
                                                  " is outside the vocabulary [0, ", vocab, ")"));
  check_prompts(prompts, context, vocab, sampling);
  // All P * K completions are held at once: a count whose records alone exceed the machine's
  // physical memory is a request to lower, refused before allocating (a failed allocation would
  // be an internal error, and under AddressSanitizer an abort).
  auto too_many = [&] {
    return Error(ExitCode::usage,
                 detail::concat("generate: ", P, " prompts x --num-samples ", K,
                                " completions do not fit in memory (lower --num-samples or split "
                                "the prompts)"));
  };
  const double physical = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (double(P) * double(K) * double(sizeof(Completion)) > physical) throw too_many();
  std::vector<Completion> out(size_t(P * K));
  for (int64_t r = 0; r < P * K; ++r) {
    out[size_t(r)].prompt_index = r / K;
    out[size_t(r)].sample_index = r % K;
  }
  if (sampling.max_new_tokens == 0) return out;
  NoGradGuard no_grad;
  // Longest prompts first, so a batch pads little; a stable order keeps a prompt's rows adjacent.
  std::vector<int64_t> order(out.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return prompts[size_t(a / K)].size() > prompts[size_t(b / K)].size();
  });
  int64_t tokens = 0;
  for (size_t first = 0; first < order.size(); first += size_t(options.batch_size)) {
    const size_t last = std::min(order.size(), first + size_t(options.batch_size));
    std::vector<int64_t> rows(order.begin() + int64_t(first), order.begin() + int64_t(last));
    if (!decode_rows(model, prompts, rows, sampling, options, out)) return out;
    for (int64_t r : rows) tokens += int64_t(out[size_t(r)].tokens.size());
    if (options.progress) options.progress(int64_t(last), int64_t(out.size()), tokens);
  }
  return out;
}

}  // namespace forge::nn
