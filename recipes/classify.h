// Recipe classify: a text classifier on a pretrained GPT (ULMFiT's concat-pooling head) or BERT
// (the [CLS] pooler), trained with cross-entropy on labelled records, with ULMFiT's discriminative
// learning rates, slanted triangular schedule and gradual unfreezing as optimizer and schedule keys
// (docs/recipes/classify.md).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/records.h"
#include "nn/classifier.h"
#include "runtime/config.h"
#include "runtime/confusion.h"
#include "runtime/registry.h"
#include "runtime/trainer.h"

namespace forge {

RecipeSpec classify_recipe();
ConfigSection classify_section();

/// The classify: section, a field a key of classify_section (its docs and defaults are there).
struct ClassifySection {
  std::vector<std::string> labels;
  RecordFormat records{};
  int64_t max_len{};
  int64_t hidden{};
  double dropout{};
};
/// What `config` says in its classify: section.
ClassifySection classify_settings(const RunConfig& config);

/// The classifier a classify config describes, with `labels` outputs, initialised from `gen`.
/// `weights` (a checkpoint the model will load, or empty) supplies what the config does not say
/// about a BERT's shape (its segment vocabulary).
std::unique_ptr<nn::SequenceClassifier> build_classifier(const RunConfig& config, int64_t labels,
                                                         const std::filesystem::path& weights,
                                                         Generator& gen);

/// Summed cross-entropy over a batch of records, its size, and its confusion counts in `sums`
/// (train_metrics turns them into acc and macro_f1).
MicroBatchLoss classify_loss(const nn::SequenceClassifier& model, const RecordBatch& batch);

/// Mean loss and the confusion matrix over the first `rows` records of `dataset` (all when 0), in
/// batches of `batch_size`. Stops early when a stop is requested.
struct ClassifierEval {
  double loss = 0;
  Confusion confusion;
};
ClassifierEval evaluate_classifier(const nn::SequenceClassifier& model,
                                   const RecordDataset& dataset, int64_t batch_size, int64_t rows);

}  // namespace forge
