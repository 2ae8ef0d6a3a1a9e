// Recipe bert_pretrain: a BERT encoder trained with masked-LM plus next-sentence prediction on
// sentence pairs built from the documents of a text corpus.
#pragma once

#include <string>

#include "recipes/config.h"
#include "recipes/registry.h"

namespace forge {

/// The `bert:` section (RunConfig::sections) as typed values.
struct BertSettings {
  int64_t type_vocab_size = 0;
  double mask_prob = 0;
  int64_t eval_pairs = 0;
  int64_t paragraphs_per_document = 0;
  bool sentence_breaks = false;
};
BertSettings bert_settings(const RunConfig& config);

/// The `bert:` section: keys only the BERT recipe reads.
ConfigSection bert_section();

/// bert_pretrain for the registry.
RecipeSpec bert_pretrain_recipe();

/// Trains per `config` (the run directory of README.md); returns the process exit code.
int train_bert(const RunConfig& config);

/// `forge eval` for a BERT run: MLM accuracy, loss and perplexity, NSP accuracy and loss on the
/// validation documents' fixed evaluation pairs.
int eval_bert(const RunConfig& config, const std::string& checkpoint_file);

}  // namespace forge
