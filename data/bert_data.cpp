// Sentence corpora and BERT pairs. Pair construction follows BERT's create_instances_from_document
// (chunk of sentences up to a target length, split at a random sentence boundary, NotNext B from
// another document, truncate the longer side) and create_masked_lm_predictions (exactly
// round(15%) of the non-special positions; 80% [MASK], 10% random, 10% kept), adapted from one
// pass over the corpus to independent draws per example.
#include "data/bert_data.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <ranges>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "data/batch.h"

namespace forge {

BertSpecialIds bert_special_ids(const Tokenizer& tokenizer) {
  const char* names[] = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};
  int32_t ids[4] = {};
  std::string missing;
  for (int k = 0; k < 4; ++k) {
    if (auto id = tokenizer.special_id(names[k])) {
      ids[k] = *id;
    } else {
      missing += missing.empty() ? "" : " ";
      missing += names[k];
    }
  }
  if (!missing.empty())
    throw Error(
        ExitCode::usage,
        detail::concat("BERT needs the special tokens [PAD] [CLS] [SEP] [MASK]; tokenizer '",
                       tokenizer.name(), "' lacks ", missing, " (build it with them as specials)"));
  return {ids[0], ids[1], ids[2], ids[3]};
}

int64_t SentenceCorpus::document_of(int64_t s) const {
  FORGE_CHECK(s >= 0 && s < num_sentences(), "document_of: sentence ", s, " out of range [0, ",
              num_sentences(), ")");
  auto after = std::upper_bound(document_starts.begin(), document_starts.end(), s);
  return int64_t(after - document_starts.begin()) - 1;
}

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\v\f") == std::string_view::npos;
}

// Calls emit(piece) for the sentences of one non-blank line (newline included). With `breaks`, a
// sentence also ends after . ! ? followed by a space; the space starts the next sentence, where
// byte-level BPE expects a word's leading space.
template <class Emit>
void line_sentences(std::string_view line, bool breaks, Emit&& emit) {
  size_t start = 0;
  if (breaks) {
    for (size_t i = 0; i + 1 < line.size(); ++i) {
      char c = line[i], next = line[i + 1];
      if ((c == '.' || c == '!' || c == '?') && (next == ' ' || next == '\t') &&
          !is_blank(line.substr(i + 1))) {
        emit(line.substr(start, i + 1 - start));
        start = i + 1;
      }
    }
  }
  emit(line.substr(start));
}

}  // namespace

SentenceCorpus build_sentence_corpus(std::string_view text, const Tokenizer& tokenizer,
                                     const DocumentOptions& options) {
  if (options.paragraphs_per_document < 1)
    throw Error(ExitCode::usage, detail::concat("paragraphs_per_document must be at least 1, got ",
                                                options.paragraphs_per_document));
  SentenceCorpus corpus;
  int64_t paragraphs = 0;  // complete paragraphs in the open document
  bool in_paragraph = false;
  auto end_paragraph = [&] {
    if (!in_paragraph) return;
    in_paragraph = false;
    if (++paragraphs == options.paragraphs_per_document) {
      corpus.document_starts.push_back(corpus.num_sentences());
      paragraphs = 0;
    }
  };
  auto add_sentence = [&](std::string_view piece) {
    std::vector<int32_t> ids = tokenizer.encode(piece);
    corpus.tokens.insert(corpus.tokens.end(), ids.begin(), ids.end());
    corpus.sentence_starts.push_back(int64_t(corpus.tokens.size()));
  };
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(pos, end - pos);
    if (is_blank(line)) {
      end_paragraph();
    } else {
      in_paragraph = true;
      line_sentences(line, options.sentence_breaks, add_sentence);
    }
    pos = end;
  }
  end_paragraph();
  if (paragraphs > 0) corpus.document_starts.push_back(corpus.num_sentences());
  return corpus;
}

namespace {

// Documents [d0, d1) of `c` as a corpus of their own.
SentenceCorpus slice_documents(const SentenceCorpus& c, int64_t d0, int64_t d1) {
  SentenceCorpus out;
  int64_t s0 = c.document_starts[size_t(d0)], s1 = c.document_starts[size_t(d1)];
  int64_t t0 = c.sentence_starts[size_t(s0)], t1 = c.sentence_starts[size_t(s1)];
  out.tokens.assign(c.tokens.begin() + t0, c.tokens.begin() + t1);
  out.sentence_starts.clear();
  for (int64_t s = s0; s <= s1; ++s)
    out.sentence_starts.push_back(c.sentence_starts[size_t(s)] - t0);
  out.document_starts.clear();
  for (int64_t d = d0; d <= d1; ++d)
    out.document_starts.push_back(c.document_starts[size_t(d)] - s0);
  return out;
}

}  // namespace

std::pair<SentenceCorpus, SentenceCorpus> split_documents(const SentenceCorpus& corpus,
                                                          double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(ExitCode::usage,
                detail::concat("val_fraction must be in [0, 1), got ", val_fraction));
  const int64_t n = corpus.num_documents();
  int64_t n_val = int64_t(std::llround(double(n) * val_fraction));
  if (val_fraction > 0.0) n_val = std::max<int64_t>(n_val, 1);
  if (n - n_val < 2 || n_val == 1)
    throw Error(ExitCode::data,
                detail::concat("the corpus has ", n, " documents: val_fraction ", val_fraction,
                               " leaves ", n - n_val, " for training and ", n_val,
                               " for validation, and each side needs at least 2 (NotNext pairs "
                               "take B from another document); use fewer paragraphs per document"));
  return {slice_documents(corpus, 0, n - n_val), slice_documents(corpus, n - n_val, n)};
}

BertPairs::BertPairs(std::shared_ptr<const SentenceCorpus> corpus, BertSpecialIds specials,
                     int32_t vocab_size, const BertPairOptions& options)
    : corpus_(std::move(corpus)), specials_(specials), vocab_size_(vocab_size), options_(options) {
  FORGE_CHECK(corpus_ != nullptr, "BertPairs: null corpus");
  const BertPairOptions& o = options_;
  auto usage = [](bool ok, const auto&... what) {
    if (!ok) throw Error(ExitCode::usage, detail::concat(what...));
  };
  usage(o.max_len >= 5, "BERT max_len must be at least 5 ([CLS] A [SEP] B [SEP]), got ", o.max_len);
  usage(o.short_seq_prob >= 0.0 && o.short_seq_prob <= 1.0,
        "short_seq_prob must be in [0, 1], got ", o.short_seq_prob);
  usage(o.mask_prob > 0.0 && o.mask_prob <= 1.0, "mask_prob must be in (0, 1], got ", o.mask_prob);
  usage(o.mask_token_prob >= 0.0 && o.random_token_prob >= 0.0 &&
            o.mask_token_prob + o.random_token_prob <= 1.0 + 1e-12,
        "mask_token_prob and random_token_prob must be >= 0 with sum <= 1, got ", o.mask_token_prob,
        " and ", o.random_token_prob);
  usage(o.min_notnext_distance >= 1, "min_notnext_distance must be at least 1, got ",
        o.min_notnext_distance);

  sorted_specials_ = {specials.pad, specials.cls, specials.sep, specials.mask};
  std::sort(sorted_specials_.begin(), sorted_specials_.end());
  sorted_specials_.erase(std::unique(sorted_specials_.begin(), sorted_specials_.end()),
                         sorted_specials_.end());
  for (int32_t id : sorted_specials_)
    usage(id >= 0 && id < vocab_size, "BERT special id ", id, " is outside the vocabulary [0, ",
          vocab_size, ")");
  usage(vocab_size > int32_t(sorted_specials_.size()), "the vocabulary of ", vocab_size,
        " ids has no token besides the specials");

  const SentenceCorpus& c = *corpus_;
  auto data = [](bool ok, const auto&... what) {
    if (!ok) throw Error(ExitCode::data, detail::concat(what...));
  };
  const int64_t n_docs = c.num_documents(), n_sent = c.num_sentences();
  FORGE_CHECK(n_docs >= 0 && n_sent >= 0 && c.sentence_starts.front() == 0 &&
                  c.document_starts.front() == 0 &&
                  c.sentence_starts.back() == int64_t(c.tokens.size()) &&
                  c.document_starts.back() == n_sent,
              "BertPairs: inconsistent SentenceCorpus offsets (", c.tokens.size(), " tokens, ",
              n_sent, " sentences, ", n_docs, " documents)");
  for (int64_t d = 0; d < n_docs; ++d)
    data(c.document_starts[size_t(d + 1)] > c.document_starts[size_t(d)], "document ", d,
         " has no sentences");
  for (int64_t s = 0; s < n_sent; ++s)
    data(c.sentence_starts[size_t(s + 1)] > c.sentence_starts[size_t(s)], "sentence ", s,
         " has no tokens");
  for (size_t i = 0; i < c.tokens.size(); ++i)
    data(c.tokens[i] >= 0 && c.tokens[i] < vocab_size, "token ", i, " of the corpus has id ",
         c.tokens[i], ", outside the vocabulary [0, ", vocab_size, ")");
  data(n_docs >= std::max<int64_t>(2, 2 * o.min_notnext_distance), "the corpus has ", n_docs,
       " documents; NotNext pairs at least min_notnext_distance = ", o.min_notnext_distance,
       " documents apart need at least ", std::max<int64_t>(2, 2 * o.min_notnext_distance));
  num_pair_starts_ = n_sent - n_docs;
  data(num_pair_starts_ > 0,
       "no document of the corpus has two sentences, so no sentence pair "
       "can be formed; group more paragraphs per document");
}

namespace {

// The random draws of one example: Philox blocks (seed, stream, index * 2^32 + k), k = 0, 1, ...
class ExampleRng {
 public:
  ExampleRng(uint64_t seed, uint64_t stream, uint64_t index)
      : seed_(seed), stream_(stream), next_(index << 32) {}
  uint32_t word() {
    if (used_ == 4) {
      block_ = philox(seed_, stream_, next_++);
      used_ = 0;
    }
    return block_[size_t(used_++)];
  }
  /// Uniform in [0, n) (modulo bias below n / 2^64).
  int64_t below(int64_t n) {
    uint64_t hi = word(), lo = word();
    return int64_t(((hi << 32) | lo) % uint64_t(n));
  }
  double uniform() {
    uint32_t hi = word(), lo = word();
    return uniform_from_bits(hi, lo);
  }

 private:
  uint64_t seed_, stream_, next_;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

}  // namespace

BertExample BertPairs::example(uint64_t seed, uint64_t stream, uint64_t index) const {
  FORGE_CHECK(index < (uint64_t(1) << 32), "BertPairs::example: index ", index, " >= 2^32");
  const SentenceCorpus& c = *corpus_;
  const BertPairOptions& o = options_;
  ExampleRng rng(seed, stream, index);
  auto token_at = [&](int64_t s) { return c.sentence_starts[size_t(s)]; };
  const int64_t max_tokens = o.max_len - 3;
  int64_t target = max_tokens;
  if (rng.uniform() < o.short_seq_prob) target = 2 + rng.below(max_tokens - 1);

  // A's first sentence: uniform over sentences that have a successor in their document, so every
  // part of the corpus starts pairs at the same rate (as BERT's pass over all documents; uniform
  // documents would oversample short ones).
  const int64_t r = rng.below(num_pair_starts_);
  auto docs = std::views::iota(int64_t(0), c.num_documents());
  const int64_t doc = *std::ranges::partition_point(
      docs, [&](int64_t d) { return c.document_starts[size_t(d + 1)] - (d + 1) <= r; });
  const int64_t first =
      c.document_starts[size_t(doc)] + (r - (c.document_starts[size_t(doc)] - doc));
  // The chunk: sentences until the target length, but at least two so that A and an IsNext B both
  // exist; BERT instead forces NotNext on a one-sentence chunk, which skews the label balance.
  const int64_t doc_end = c.document_starts[size_t(doc + 1)];
  int64_t end = first;
  while (end < doc_end) {
    ++end;
    if (token_at(end) - token_at(first) >= target && end - first >= 2) break;
  }
  const int64_t a_end = first + 1 + rng.below(end - first - 1);

  BertExample ex;
  ex.nsp_label = rng.uniform() < 0.5 ? 0 : 1;
  ex.a_sentence_begin = first;
  ex.a_sentence_end = a_end;
  if (ex.nsp_label == 0) {
    ex.b_sentence_begin = a_end;
    ex.b_sentence_end = end;
  } else {
    // B from a document at least min_notnext_distance away, from a random sentence on, up to the
    // length A left over (at least one sentence).
    const int64_t n = c.num_documents(), dist = o.min_notnext_distance;
    const int64_t left = std::max<int64_t>(0, doc - dist + 1),
                  right = std::max<int64_t>(0, n - (doc + dist));
    int64_t other = rng.below(left + right);
    if (other >= left) other = doc + dist + (other - left);
    const int64_t o0 = c.document_starts[size_t(other)], o1 = c.document_starts[size_t(other + 1)];
    const int64_t b_first = o0 + rng.below(o1 - o0);
    const int64_t b_target = target - (token_at(a_end) - token_at(first));
    int64_t b_end = b_first;
    while (b_end < o1) {
      ++b_end;
      if (token_at(b_end) - token_at(b_first) >= b_target) break;
    }
    ex.b_sentence_begin = b_first;
    ex.b_sentence_end = b_end;
  }

  // Truncate the longer segment one token at a time until the pair fits; both sides keep at least
  // one token since max_tokens >= 2. Unlike BERT, which cuts either end at random, A loses its
  // front and B its back: the A|B junction, where an IsNext pair continues the text, stays intact
  // (measured on Tiny Shakespeare: with random ends NSP stayed at chance for 1,250 steps).
  int64_t a0 = token_at(ex.a_sentence_begin), a1 = token_at(ex.a_sentence_end);
  int64_t b0 = token_at(ex.b_sentence_begin), b1 = token_at(ex.b_sentence_end);
  while ((a1 - a0) + (b1 - b0) > max_tokens) {
    if (a1 - a0 > b1 - b0)
      ++a0;
    else
      --b1;
  }
  ex.a_token_begin = a0, ex.a_token_end = a1, ex.b_token_begin = b0, ex.b_token_end = b1;

  const int64_t len = (a1 - a0) + (b1 - b0) + 3;
  ex.ids.reserve(size_t(len));
  ex.ids.push_back(specials_.cls);
  ex.ids.insert(ex.ids.end(), c.tokens.begin() + a0, c.tokens.begin() + a1);
  ex.ids.push_back(specials_.sep);
  ex.ids.insert(ex.ids.end(), c.tokens.begin() + b0, c.tokens.begin() + b1);
  ex.ids.push_back(specials_.sep);
  ex.segments.assign(size_t(len), 1);
  std::fill(ex.segments.begin(), ex.segments.begin() + (a1 - a0) + 2, 0);

  // Masking: candidates are the positions holding a non-special id, which excludes [CLS] and [SEP]
  // and any special token the text itself encoded to.
  auto is_special = [&](int32_t id) {
    return std::binary_search(sorted_specials_.begin(), sorted_specials_.end(), id);
  };
  std::vector<int64_t> cand;
  for (int64_t t = 0; t < len; ++t)
    if (!is_special(ex.ids[size_t(t)])) cand.push_back(t);
  const int64_t n_cand = int64_t(cand.size());
  const int64_t k =
      n_cand == 0
          ? 0
          : std::min(n_cand, std::max<int64_t>(1, std::llround(double(n_cand) * o.mask_prob)));
  for (int64_t i = 0; i < k; ++i)
    std::swap(cand[size_t(i)], cand[size_t(i + rng.below(n_cand - i))]);
  std::sort(cand.begin(), cand.begin() + k);
  const int32_t n_plain = vocab_size_ - int32_t(sorted_specials_.size());
  for (int64_t i = 0; i < k; ++i) {
    const int64_t p = cand[size_t(i)];
    int32_t& id = ex.ids[size_t(p)];
    ex.mlm_positions.push_back(p);
    ex.mlm_targets.push_back(id);
    const double u = rng.uniform();
    if (u < o.mask_token_prob) {
      id = specials_.mask;
    } else if (u < o.mask_token_prob + o.random_token_prob) {
      // The r-th non-special id: step over the specials at or below it, in increasing order.
      int32_t replacement = int32_t(rng.below(n_plain));
      for (int32_t sp : sorted_specials_) replacement += replacement >= sp ? 1 : 0;
      id = replacement;
    }
  }
  return ex;
}

BertBatch BertPairs::collate(const std::vector<BertExample>& examples) const {
  std::vector<std::vector<int32_t>> ids, segments;
  int64_t n_targets = 0;
  for (const BertExample& ex : examples) {
    ids.push_back(ex.ids);
    segments.push_back(ex.segments);
    n_targets += int64_t(ex.mlm_targets.size());
  }
  const int64_t B = int64_t(examples.size()), L = longest_row(ids);
  BertBatch batch;
  batch.ids = pad_rows(ids, L, specials_.pad);
  batch.segments = pad_rows(segments, L, 0);
  batch.attention_mask = padding_mask(ids, L);
  batch.mlm_positions = empty({n_targets}, DType::i64);
  batch.mlm_targets = empty({n_targets}, DType::i64);
  batch.nsp_labels = empty({B}, DType::i64);
  int64_t* pos = batch.mlm_positions.data<int64_t>();
  int64_t* tgt = batch.mlm_targets.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const BertExample& ex = examples[size_t(b)];
    for (size_t i = 0; i < ex.mlm_positions.size(); ++i) {
      *pos++ = b * L + ex.mlm_positions[i];
      *tgt++ = ex.mlm_targets[i];
    }
    batch.nsp_labels.data<int64_t>()[b] = ex.nsp_label;
  }
  return batch;
}

BertBatch BertPairs::sample(int64_t batch_size, uint64_t seed, int64_t step, int64_t micro) const {
  FORGE_CHECK(batch_size > 0 && micro >= 0 && step >= 0, "BertPairs::sample: batch_size ",
              batch_size, ", step ", step, ", micro ", micro);
  const uint64_t stream = rng_stream("bert_pairs", uint64_t(step));
  std::vector<BertExample> examples;
  for (int64_t b = 0; b < batch_size; ++b)
    examples.push_back(example(seed, stream, uint64_t(micro * batch_size + b)));
  return collate(examples);
}

BertBatch BertPairs::eval_batch(uint64_t seed, int64_t first, int64_t count) const {
  FORGE_CHECK(first >= 0 && count > 0, "BertPairs::eval_batch: first ", first, ", count ", count);
  std::vector<BertExample> examples;
  for (int64_t i = first; i < first + count; ++i)
    examples.push_back(example(seed, rng_stream("bert_eval", uint64_t(i)), 0));
  return collate(examples);
}

}  // namespace forge
