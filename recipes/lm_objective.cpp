// The language-model objective GPT recipes share; see lm_objective.h.
#include "recipes/lm_objective.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/file_io.h"
#include "core/ops.h"
#include "data/token_dataset.h"
#include "nn/generate.h"

namespace forge {
namespace {

// The tokens of a split's file: a prepared dataset (a .h5 file or a shard directory), opened for
// streaming and validated against the tokenizer and the model's vocabulary, or a text file,
// tokenized now into memory.
struct SplitTokens {
  std::shared_ptr<const TokenSource> tokens;
  std::optional<TokenDatasetReader> dataset;             // a prepared dataset
  std::shared_ptr<const std::vector<int32_t>> text_ids;  // a text file's
};

SplitTokens load_tokens(const std::string& path, const Tokenizer& tokenizer,
                        const TokenizerInfo& info, int64_t vocab_size) {
  if (is_token_dataset_path(path)) {
    TokenDatasetReader ds = open_token_dataset_reader(path, &info, vocab_size);
    auto tokens = ds.tokens();
    return {std::move(tokens), std::move(ds), nullptr};
  }
  auto ids = std::make_shared<const std::vector<int32_t>>(
      tokenizer.encode(read_input_file(path, kCorpusInput)));
  return {std::make_shared<const MemoryTokens>(ids), std::nullopt, ids};
}

}  // namespace

LMSplits load_lm_splits(const RunConfig& config) {
  const DataConfig& d = config.data;
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(d.tokenizer, d.special_tokens);
  const TokenizerInfo info{tokenizer->name(), tokenizer->vocab_size(), vocabulary_hash(*tokenizer)};
  const int64_t V = config.model.vocab_size;
  // A data error says which split's file it is about, as the same file may serve either.
  auto keyed = [](const char* key, const auto& fn) {
    try {
      return fn();
    } catch (const Error& e) {
      if (e.code() != ExitCode::data) throw;
      throw Error(ExitCode::data, std::string(key) + ": " + e.what());
    }
  };
  auto load = [&](const char* key, const std::string& path) {
    return keyed(key, [&] { return load_tokens(path, *tokenizer, info, V); });
  };
  SplitTokens train = load("data.train", d.train);
  TokenSourceSplit split;
  if (!d.val.empty()) {
    // forge eval --data names one file for both: it is opened (and checked) once.
    split = {train.tokens, d.val == d.train ? train.tokens : load("data.val", d.val).tokens};
  } else if (train.dataset) {
    // Documents are never cut.
    split = keyed("data.train", [&] { return train.dataset->split_by_document(d.val_fraction); });
  } else {
    TokenSplit s = split_by_position(std::vector<int32_t>(*train.text_ids), d.val_fraction);
    split = {std::make_shared<const MemoryTokens>(s.train),
             std::make_shared<const MemoryTokens>(s.val)};
  }
  int64_t T = config.model.context;
  return {std::move(tokenizer), std::make_unique<LMWindows>(split.train, T),
          std::make_unique<LMWindows>(split.val, T)};
}

LMForward lm_outputs(const nn::GPT& model, const LMBatch& batch) {
  LMForward r;
  r.hidden = model.forward(batch.ids, nn::GPTOutput::hidden);
  Tensor logits = model.head(r.hidden);
  r.logits = reshape(logits, {-1, logits.size(-1)});
  r.targets = reshape(batch.targets, {-1});
  return r;
}

LMForward lm_forward(const nn::GPT& model, const LMBatch& batch) {
  LMForward r = lm_outputs(model, batch);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  ce.ignore_index = LMWindows::kIgnoreTarget;
  r.loss_sum = cross_entropy(r.logits, r.targets, ce);
  r.num_targets = count_scored(r.targets);
  return r;
}

int64_t count_scored(const Tensor& targets) {
  const Tensor flat = targets.contiguous();
  const int64_t* t = flat.data<int64_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < flat.numel(); ++i) n += t[i] != LMWindows::kIgnoreTarget;
  return n;
}

MicroBatchLoss lm_loss(const nn::GPT& model, const LMBatch& batch) {
  LMForward r = lm_forward(model, batch);
  return {r.loss_sum, r.num_targets};
}

void for_each_eval_batch(const LMWindows& val, int64_t batch_size, int64_t batches, bool full,
                         const std::function<void(const LMBatch&)>& run) {
  const int64_t windows = val.num_eval_windows();
  int64_t batches_run = 0;
  auto at = [&](int64_t first) {
    if (batches_run++ > 0 && stop_requested()) return;  // between batches: the loss needs one
    run(val.eval_batch(first, batch_size));
  };
  if (full || batches == 0 || batches * batch_size >= windows) {
    for (int64_t first = 0; first < windows; first += batch_size) at(first);
  } else {
    // Evenly spread blocks, so a partial evaluation samples the whole split, not its beginning.
    for (int64_t j = 0; j < batches; ++j)
      at(batches == 1 ? 0 : j * (windows - batch_size) / (batches - 1));
  }
}

Metrics lm_eval(const nn::GPT& model, const LMWindows& val, int64_t batch_size, int64_t batches,
                bool full) {
  double total = 0;
  int64_t targets = 0;
  for_each_eval_batch(val, batch_size, batches, full, [&](const LMBatch& batch) {
    MicroBatchLoss r = lm_loss(model, batch);
    total += r.loss_sum.item();
    targets += r.num_targets;
  });
  double loss = total / double(targets);
  return {{"loss", loss}, {"ppl", std::exp(loss)}, {"tokens", targets}};
}

std::string sample_text(nn::GPT& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const RunConfig& config) {
  nn::SamplingOptions options;
  options.max_new_tokens = config.train.sample_tokens;
  options.temperature = 0.8;
  options.top_k = 200;
  options.seed = uint64_t(config.seed);
  options.stop = stop_requested;
  options.vocab_limit = tokenizer.vocab_size();  // the sample is decoded
  const bool training = model.is_training();
  model.eval();
  std::vector<int32_t> ids = tokenizer.encode(prompt);
  std::vector<int64_t> out = nn::generate(model, {ids.begin(), ids.end()}, options);
  model.train(training);
  return "--- sample (" + std::to_string(options.max_new_tokens) + " tokens) ---\n" + prompt +
         tokenizer.decode_continuation(ids, {out.begin(), out.end()});
}

std::vector<std::vector<int64_t>> encode_prompts(const std::vector<std::string>& prompts,
                                                 const Tokenizer& tokenizer) {
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& prompt : prompts) {
    const std::vector<int32_t> encoded = tokenizer.encode(prompt);
    ids.emplace_back(encoded.begin(), encoded.end());
  }
  return ids;
}

std::string completion_records(const std::vector<std::string>& prompts,
                               const std::vector<nn::Completion>& completions,
                               const Tokenizer& tokenizer) {
  std::string jsonl;
  for (const nn::Completion& c : completions) {
    const std::string& prompt = prompts[size_t(c.prompt_index)];
    // ordered_json keeps the documented key order.
    nlohmann::ordered_json record = {
        {"prompt", prompt},
        {"prompt_index", c.prompt_index},
        {"sample_index", c.sample_index},
        {"completion", tokenizer.decode_continuation(tokenizer.encode(prompt),
                                                     {c.tokens.begin(), c.tokens.end()})},
        {"tokens", c.tokens},
        {"logprob", c.logprob},
        {"finished", c.finished}};
    jsonl += record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }
  return jsonl;
}

}  // namespace forge
