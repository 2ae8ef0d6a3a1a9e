// BERT pretraining data: text as documents of sentences, and `[CLS] A [SEP] B [SEP]` pairs for
// next-sentence prediction with dynamically masked tokens for the masked-LM loss. Pairs and masks
// are drawn on the fly from the counter-based generator: the batch of any step is a pure function
// of (seed, step, micro), each use of a sample draws new masks, and a resumed run replays nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"

namespace forge {

struct BertSpecialIds {
  int32_t pad, cls, sep, mask;
};
/// The ids of [PAD] [CLS] [SEP] [MASK] in `tokenizer`; Error(usage) naming the missing token(s)
/// (the tokenizer must be built with them as specials).
BertSpecialIds bert_special_ids(const Tokenizer& tokenizer);

/// A corpus as documents of sentences, flattened: the tokens of every sentence back to back, so a
/// run of consecutive sentences is one contiguous token range.
struct SentenceCorpus {
  std::vector<int32_t> tokens;
  std::vector<int64_t> sentence_starts{0};  // size n_sentences + 1 (offsets into tokens)
  std::vector<int64_t> document_starts{0};  // size n_documents + 1 (offsets into sentences)
  int64_t num_documents() const { return int64_t(document_starts.size()) - 1; }
  int64_t num_sentences() const { return int64_t(sentence_starts.size()) - 1; }
  /// The document holding sentence `s`.
  int64_t document_of(int64_t s) const;
};

struct DocumentOptions {
  /// Consecutive blank-line paragraphs grouped into one document (Tiny Shakespeare: a paragraph is
  /// one speaker turn and has no scene markers, so a run of ~30 turns stands in for a scene).
  int64_t paragraphs_per_document = 1;
  /// Sentences are the non-empty lines of a paragraph; with this set a line also breaks after
  /// '.', '!' or '?' followed by a space (prose that puts a whole paragraph on one line).
  bool sentence_breaks = false;
};

/// Splits `text` into documents of sentences and tokenizes each sentence separately (no specials
/// added). Lines holding only whitespace separate paragraphs and belong to no sentence. A sentence
/// keeps its line's trailing newline, so the model sees line breaks (speaker names in Shakespeare
/// end with one) and the sentences of a paragraph concatenate back to its exact text.
SentenceCorpus build_sentence_corpus(std::string_view text, const Tokenizer& tokenizer,
                                     const DocumentOptions& options);

/// Documents [0, n - n_val) and [n - n_val, n) with n_val = round(n * val_fraction) (at least 1
/// when val_fraction > 0). Error(data) if training, or a non-empty validation side, has fewer than
/// 2 documents (NotNext needs another document); val_fraction = 0 gives an empty validation side.
std::pair<SentenceCorpus, SentenceCorpus> split_documents(const SentenceCorpus& corpus,
                                                          double val_fraction);

struct BertPairOptions {
  int64_t max_len = 128;        // total incl. [CLS] and 2x [SEP]
  double short_seq_prob = 0.1;  // as BERT: sometimes a shorter target length
  double mask_prob = 0.15;
  double mask_token_prob = 0.8, random_token_prob = 0.1;  // the remaining 0.1 keep the token
  int64_t min_notnext_distance = 1;  // NotNext documents are at least this many documents from A's
};

struct BertBatch {
  Tensor ids;             // i64 [B, L] (L = longest pair in the batch), [PAD] after the pair
  Tensor segments;        // i64 [B, L], 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding
  Tensor attention_mask;  // i64 [B, L] 1 real 0 pad (data/batch.h padding_mask)
  Tensor mlm_positions;   // i64 [N] flat indices b*L + t of the chosen positions, increasing
  Tensor mlm_targets;     // i64 [N] the original token at each chosen position
  Tensor nsp_labels;      // i64 [B]: 0 = IsNext, 1 = NotNext (HF convention)
  int64_t num_mlm_targets() const { return mlm_targets.numel(); }
};

/// One unpadded pair with its masks, and where its segments came from.
struct BertExample {
  std::vector<int32_t> ids;            // [CLS] A [SEP] B [SEP], masked
  std::vector<int32_t> segments;       // 0 over [CLS] A [SEP], 1 over B [SEP]
  std::vector<int64_t> mlm_positions;  // chosen positions in ids, increasing
  std::vector<int32_t> mlm_targets;    // the original token at each
  int32_t nsp_label = 0;               // 0 = IsNext, 1 = NotNext
  // Sentences [begin, end) each segment was drawn from, and the corpus token range [begin, end)
  // each kept after truncation.
  int64_t a_sentence_begin = 0, a_sentence_end = 0, b_sentence_begin = 0, b_sentence_end = 0;
  int64_t a_token_begin = 0, a_token_end = 0, b_token_begin = 0, b_token_end = 0;
};

class BertPairs {
 public:
  /// Error(usage) for options out of range; Error(data) for a corpus that cannot make pairs (no
  /// document of two sentences, too few documents for min_notnext_distance, empty sentences or
  /// tokens outside [0, vocab_size)).
  BertPairs(std::shared_ptr<const SentenceCorpus> corpus, BertSpecialIds specials,
            int32_t vocab_size, const BertPairOptions& options);

  /// Batch `micro` of training step `step`: pairs and masks are a pure function of
  /// (seed, step, micro), example b drawn from philox(seed, rng_stream("bert_pairs", step), ...)
  /// at index micro * batch_size + b, so the same call always gives the same batch (resume stays
  /// exact) while each step draws new pairs and new masks (dynamic masking).
  BertBatch sample(int64_t batch_size, uint64_t seed, int64_t step, int64_t micro = 0) const;
  /// A fixed evaluation set: pair i (and its mask) depends only on (seed, i), stream
  /// rng_stream("bert_eval", i) at index 0, so every evaluation scores the same pairs.
  BertBatch eval_batch(uint64_t seed, int64_t first, int64_t count) const;

  /// The single-example function under both: the pair drawn from Philox (seed, stream) at
  /// example index `index` (< 2^32; each example owns the counters index * 2^32 + k).
  BertExample example(uint64_t seed, uint64_t stream, uint64_t index) const;
  /// Pads examples into a batch (the layout documented on BertBatch).
  BertBatch collate(const std::vector<BertExample>& examples) const;

  const SentenceCorpus& corpus() const { return *corpus_; }
  const BertSpecialIds& specials() const { return specials_; }
  const BertPairOptions& options() const { return options_; }

 private:
  std::shared_ptr<const SentenceCorpus> corpus_;
  BertSpecialIds specials_;
  int32_t vocab_size_;
  BertPairOptions options_;
  std::vector<int32_t> sorted_specials_;  // distinct special ids, increasing
  int64_t num_pair_starts_;               // sentences that have a successor in their document
};

}  // namespace forge
