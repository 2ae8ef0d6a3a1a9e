// The BERT objective that BERT recipes share (bert_pretrain, distill): documents of sentences
// split into training and validation pairs, summed MLM and NSP cross-entropy per batch with the
// counts behind the logged accuracies, and evaluation on the fixed validation pairs. Their `bert:`
// section is runtime/bert_config.h's.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "data/bert_data.h"
#include "data/tokenizer.h"
#include "nn/bert.h"
#include "runtime/bert_config.h"
#include "runtime/config.h"
#include "runtime/metrics.h"
#include "runtime/registry.h"

namespace forge {

/// The pair format's rule for `recipe`'s check: data.special_tokens holds [PAD] [CLS] [SEP] [MASK].
void check_bert_specials(ConfigChecker& checker, const std::string& recipe);

struct BertData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<BertPairs> train, val;
};

/// data.train's documents (a text file: lines are sentences) and the validation documents
/// (data.val, or the last data.val_fraction), as pair samplers with dynamic masking.
BertData load_bert_data(const RunConfig& config);

/// One batch through a BERT with both heads: the summed MLM and NSP losses (with graph), the
/// model's outputs and MLM logits of the chosen positions, and the sums behind the logged metrics
/// (mlm_loss, mlm_correct, mlm_count, nsp_loss, nsp_correct, nsp_count).
struct PairLosses {
  Tensor mlm_sum, nsp_sum;
  nn::BertOutputs outputs;
  Tensor mlm_logits;  ///< [chosen positions, V]
  std::map<std::string, double> sums;
};
PairLosses pair_losses(const nn::Bert& model, const BertBatch& batch);

/// mlm_loss, mlm_acc, nsp_loss, nsp_acc from summed PairLosses::sums.
Metrics pair_metrics(const std::map<std::string, double>& sums);

/// How many rows of `logits` [N, V] have their argmax at `targets` [N].
int64_t count_equal(const Tensor& logits, const Tensor& targets);

/// Calls `run` on the batches of the first `pairs` validation pairs (the fixed evaluation set, so
/// every evaluation of a run and `forge eval` later score the same pairs with the same masks);
/// after a stop request (stop_requested()) no further batch than the first.
void for_each_eval_pair_batch(const BertPairs& val, uint64_t seed, int64_t batch_size,
                              int64_t pairs, const std::function<void(const BertBatch&)>& run);

/// The validation metrics of bert_pretrain from summed PairLosses::sums over `pairs` pairs: loss
/// (mean MLM + mean NSP), the pair_metrics, mlm_ppl and pairs.
Metrics bert_eval_metrics(const std::map<std::string, double>& sums, int64_t pairs);

/// bert_eval_metrics of `model` over the first `pairs` validation pairs.
Metrics bert_eval(const nn::Bert& model, const BertPairs& val, uint64_t seed, int64_t batch_size,
                  int64_t pairs);

/// The pairs an evaluation scores: all bert.eval_pairs for the final one (`full`) and when
/// train.eval_batches is 0, else at most eval_batches batches of them.
int64_t bert_eval_pair_count(const RunConfig& config, bool full);

}  // namespace forge
