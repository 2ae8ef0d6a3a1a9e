// The `bert:` section (see bert_config.h); defaults follow BERT's pretraining (two segments, 15%
// of tokens masked).
#include "runtime/bert_config.h"

namespace forge {

ConfigSection bert_section() {
  return {
      "bert",
      "what only BERT recipes read: segments, masking, documents and evaluation pairs",
      {section_key(
           "bert.type_vocab_size",
           integer_key(2, "[1, 1024]").aka({"n_segments", "num_token_types"}).fixes_architecture(),
           "number of segment (token-type) embeddings"),
       section_key("bert.mask_prob",
                   number_key(0.15, "(0, 1)").aka({"mlm_probability", "masking_prob"}),
                   "share of non-special tokens chosen for masked-LM"),
       section_key("bert.eval_pairs", integer_key(2048, "[1, 1000000000]"),
                   "sentence pairs of the validation documents scored by the final evaluation"),
       section_key("bert.paragraphs_per_document", integer_key(1, ">= 1"),
                   "consecutive blank-line paragraphs that form one document (lines are "
                   "sentences)"),
       section_key("bert.sentence_breaks", boolean_key(false),
                   "a sentence also ends after . ! or ? and a space (prose with a paragraph "
                   "per line)")}};
}

BertSection bert_settings(const RunConfig& config) {
  return {.type_vocab_size = config.get<int64_t>("bert.type_vocab_size"),
          .mask_prob = config.get<double>("bert.mask_prob"),
          .eval_pairs = config.get<int64_t>("bert.eval_pairs"),
          .paragraphs_per_document = config.get<int64_t>("bert.paragraphs_per_document"),
          .sentence_breaks = config.get<bool>("bert.sentence_breaks")};
}

}  // namespace forge
