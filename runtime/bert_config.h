// The `bert:` config section: what only BERT models and recipes read (segments, masking, documents
// and evaluation pairs). It lives in the runtime beside lora: because the runtime builds a BERT
// (bert_config in components.h) and the Hugging Face export writes its segment vocabulary.
#pragma once

#include <cstdint>

#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

ConfigSection bert_section();

/// The bert: section, a field a key of bert_section (its docs and defaults are there).
struct BertSection {
  int64_t type_vocab_size{};
  double mask_prob{};
  int64_t eval_pairs{};
  int64_t paragraphs_per_document{};
  bool sentence_breaks{};
};
/// What `config` says in its bert: section.
BertSection bert_settings(const RunConfig& config);

}  // namespace forge
