// The language-model objective that GPT recipes share (gpt_pretrain, finetune on text): the token
// stream of a text file or prepared dataset split into training and validation windows, summed
// next-token cross-entropy per batch, validation loss over the windows, and a sample.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data/lm_data.h"
#include "data/tokenizer.h"
#include "nn/generate.h"
#include "nn/gpt.h"
#include "runtime/config.h"
#include "runtime/metrics.h"
#include "runtime/trainer.h"

namespace forge {

struct LMSplits {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<LMWindows> train, val;
};

/// data.train (a text file, tokenized now, or a prepared dataset, a .h5 file or a shard directory,
/// validated against the tokenizer and model.vocab_size and then read from disk as the windows
/// need it) and its validation split: data.val, or the last data.val_fraction (whole documents of
/// a dataset).
LMSplits load_lm_splits(const RunConfig& config);

/// One batch through a GPT: the final hidden states [B, T, C], the logits as rows [B*T, V], their
/// targets [B*T] (LMWindows::kIgnoreTarget where nothing is scored), the summed cross-entropy (with
/// graph) and the number of scored targets.
struct LMForward {
  Tensor hidden, logits, targets, loss_sum;
  int64_t num_targets = 0;
};
LMForward lm_forward(const nn::GPT& model, const LMBatch& batch);
/// lm_forward without the loss and its count (loss_sum undefined): a distillation teacher's
/// outputs, whose own loss no training step reads.
LMForward lm_outputs(const nn::GPT& model, const LMBatch& batch);

/// How many of `targets` are scored (not LMWindows::kIgnoreTarget).
int64_t count_scored(const Tensor& targets);

/// Summed cross-entropy of a batch and its number of scored targets.
MicroBatchLoss lm_loss(const nn::GPT& model, const LMBatch& batch);

/// Calls `run` on the validation batches lm_eval scores: every window (`full`, or `batches` 0),
/// else `batches` evenly spread blocks of windows; after a stop request (stop_requested()) no
/// further batch than the first.
void for_each_eval_batch(const LMWindows& val, int64_t batch_size, int64_t batches, bool full,
                         const std::function<void(const LMBatch&)>& run);

/// Validation loss, perplexity and scored tokens: over every window (`full`, or `batches` 0), else
/// over `batches` evenly spread blocks of windows; after a stop request (stop_requested()) no
/// further batch than the first.
Metrics lm_eval(const nn::GPT& model, const LMWindows& val, int64_t batch_size, int64_t batches,
                bool full);

/// train.sample_tokens sampled after `prompt` (temperature 0.8, top-k 200, the run's seed), as
/// the end-of-run sample shows them, fewer after a stop request; the model is back in training
/// mode after.
std::string sample_text(nn::GPT& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const RunConfig& config);

/// Each prompt's ids, as nn::generate_batch takes them.
std::vector<std::vector<int64_t>> encode_prompts(const std::vector<std::string>& prompts,
                                                 const Tokenizer& tokenizer);

/// forge generate's JSON lines for `completions` of `prompts` (docs/generate.md, "The records"):
/// prompt, prompt_index, sample_index, completion (decoded; invalid UTF-8 from a byte-level sample
/// becomes U+FFFD, the exact ids are in "tokens"), tokens, logprob, finished.
std::string completion_records(const std::vector<std::string>& prompts,
                               const std::vector<nn::Completion>& completions,
                               const Tokenizer& tokenizer);

}  // namespace forge
