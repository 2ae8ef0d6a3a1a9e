// BERT data: text into documents of sentences, the document split, pair construction (IsNext rate,
// provenance, segments, truncation), dynamic masking statistics over many draws, batching with
// padding, a GPT-2 BPE vocabulary, and the Tiny Shakespeare corpus (sizes and build time printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "data/bert_data.h"
#include "tests/test_util.h"

namespace forge {
namespace {

const std::vector<std::string> kBertSpecials = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};

const Tokenizer& bytes_tok() {
  static const ByteTokenizer tok(kBertSpecials);
  return tok;
}

template <class F>
ExitCode code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ExitCode::ok;
}

// Speaker turns of 1-4 lines of varying length (some far longer than a short max_len), like
// Tiny Shakespeare.
std::string turns(int n) {
  std::string text;
  for (int p = 0; p < n; ++p) {
    text += "Speaker " + std::to_string(p % 7) + ":\n";
    for (int l = 0; l <= (p * 7 + 3) % 4; ++l)
      text += "line " + std::to_string(p) + "." + std::to_string(l) + " " +
              std::string(size_t((p * 13 + l * 5) % 50), char('a' + (p + l) % 26)) + "\n";
    text += "\n";
  }
  return text;
}

std::shared_ptr<const SentenceCorpus> turns_corpus(int n, int64_t per_doc) {
  return std::make_shared<const SentenceCorpus>(
      build_sentence_corpus(turns(n), bytes_tok(), {.paragraphs_per_document = per_doc}));
}

// The pair before masking, rebuilt from the example's provenance.
std::vector<int32_t> unmasked(const BertPairs& pairs, const BertExample& ex) {
  const auto& t = pairs.corpus().tokens;
  const BertSpecialIds& sp = pairs.specials();
  std::vector<int32_t> ids{sp.cls};
  ids.insert(ids.end(), t.begin() + ex.a_token_begin, t.begin() + ex.a_token_end);
  ids.push_back(sp.sep);
  ids.insert(ids.end(), t.begin() + ex.b_token_begin, t.begin() + ex.b_token_end);
  ids.push_back(sp.sep);
  return ids;
}

std::string sentence_text(const SentenceCorpus& c, const Tokenizer& tok, int64_t s) {
  return tok.decode(std::vector<int32_t>(c.tokens.begin() + c.sentence_starts[size_t(s)],
                                         c.tokens.begin() + c.sentence_starts[size_t(s + 1)]));
}

TEST(BertData, ParagraphsGroupIntoDocumentsOfLineSentences) {
  const std::string text = "A:\nx y\n\nB:\nz\n\n\nC:\nw [MASK]\n  \t\nD:\nv";
  SentenceCorpus c = build_sentence_corpus(text, bytes_tok(), {.paragraphs_per_document = 2});
  EXPECT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.num_sentences(), 8);
  EXPECT_EQ(c.document_starts, (std::vector<int64_t>{0, 4, 8}));
  std::vector<std::string> sentences;
  for (int64_t s = 0; s < c.num_sentences(); ++s)
    sentences.push_back(sentence_text(c, bytes_tok(), s));
  EXPECT_EQ(sentences, (std::vector<std::string>{"A:\n", "x y\n", "B:\n", "z\n", "C:\n",
                                                 "w [MASK]\n", "D:\n", "v"}));
  // The special token's text becomes its id (one token), as everywhere else.
  EXPECT_EQ(c.sentence_starts[6] - c.sentence_starts[5], 4);
  EXPECT_EQ(c.document_of(3), 0);
  EXPECT_EQ(c.document_of(4), 1);

  SentenceCorpus three = build_sentence_corpus(text, bytes_tok(), {.paragraphs_per_document = 3});
  EXPECT_EQ(three.document_starts, (std::vector<int64_t>{0, 6, 8}));
  EXPECT_EQ(build_sentence_corpus("\n \n", bytes_tok(), {}).num_documents(), 0);

  SentenceCorpus prose = build_sentence_corpus("One. Two! Three?\nMr.X said 3.5 so. \n\nNext.",
                                               bytes_tok(), {.sentence_breaks = true});
  std::vector<std::string> pieces;
  for (int64_t s = 0; s < prose.num_sentences(); ++s)
    pieces.push_back(sentence_text(prose, bytes_tok(), s));
  EXPECT_EQ(pieces, (std::vector<std::string>{"One.", " Two!", " Three?\n", "Mr.X said 3.5 so. \n",
                                              "Next."}));
  EXPECT_EQ(prose.document_starts, (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(
      code_of([] { build_sentence_corpus("a", bytes_tok(), {.paragraphs_per_document = 0}); }),
      ExitCode::usage);
}

TEST(BertData, SplitDocumentsTakesTheTail) {
  SentenceCorpus c = *turns_corpus(40, 4);  // 10 documents
  ASSERT_EQ(c.num_documents(), 10);
  auto [train, val] = split_documents(c, 0.2);
  EXPECT_EQ(train.num_documents(), 8);
  EXPECT_EQ(val.num_documents(), 2);
  EXPECT_EQ(train.num_sentences() + val.num_sentences(), c.num_sentences());
  std::vector<int32_t> joined = train.tokens;
  joined.insert(joined.end(), val.tokens.begin(), val.tokens.end());
  EXPECT_EQ(joined, c.tokens);
  EXPECT_EQ(val.sentence_starts.front(), 0);
  EXPECT_EQ(val.sentence_starts.back(), int64_t(val.tokens.size()));
  EXPECT_EQ(val.document_starts.front(), 0);
  EXPECT_EQ(val.document_starts.back(), val.num_sentences());
  int64_t s0 = c.document_starts[8];
  for (int64_t s = 0; s < val.num_sentences(); ++s)
    EXPECT_EQ(sentence_text(val, bytes_tok(), s), sentence_text(c, bytes_tok(), s0 + s));
  EXPECT_EQ(split_documents(c, 0.0).second.num_documents(), 0);
  EXPECT_EQ(code_of([&] { split_documents(c, 0.1); }), ExitCode::data);   // 1 validation document
  EXPECT_EQ(code_of([&] { split_documents(c, 0.85); }), ExitCode::data);  // 1 training document
  EXPECT_EQ(code_of([&] { split_documents(c, 1.0); }), ExitCode::usage);
}

TEST(BertData, SpecialIdsNameWhatIsMissing) {
  BertSpecialIds ids = bert_special_ids(bytes_tok());
  EXPECT_EQ(ids.pad, 256);
  EXPECT_EQ(ids.cls, 257);
  EXPECT_EQ(ids.sep, 258);
  EXPECT_EQ(ids.mask, 259);
  try {
    bert_special_ids(ByteTokenizer({"[CLS]", "[PAD]", "[SEP]"}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::usage);
    EXPECT_NE(std::string(e.what()).find("lacks [MASK]"), std::string::npos) << e.what();
  }
}

TEST(BertData, PairsAreClsASepBSepWithSegmentsAndFit) {
  BertPairOptions opt{.max_len = 40};
  BertPairs pairs(turns_corpus(200, 8), bert_special_ids(bytes_tok()), 260, opt);
  const auto& c = pairs.corpus();
  const BertSpecialIds sp = pairs.specials();
  for (uint64_t i = 0; i < 500; ++i) {
    BertExample ex = pairs.example(5, rng_stream("test", 0), i);
    std::vector<int32_t> ids = unmasked(pairs, ex);
    const size_t la = size_t(ex.a_token_end - ex.a_token_begin);
    ASSERT_LE(ids.size(), 40u);
    ASSERT_EQ(ex.ids.size(), ids.size());
    ASSERT_EQ(ex.segments.size(), ids.size());
    EXPECT_EQ(ex.ids[0], sp.cls);
    EXPECT_EQ(ex.ids[la + 1], sp.sep);
    EXPECT_EQ(ex.ids.back(), sp.sep);
    for (size_t t = 0; t < ids.size(); ++t) ASSERT_EQ(ex.segments[t], t < la + 2 ? 0 : 1) << t;
    // Each side is non-empty and lies inside the sentences it was drawn from; A is whole sentences
    // of one document.
    EXPECT_LT(ex.a_token_begin, ex.a_token_end);
    EXPECT_LT(ex.b_token_begin, ex.b_token_end);
    EXPECT_LT(ex.a_sentence_begin, ex.a_sentence_end);
    EXPECT_LT(ex.b_sentence_begin, ex.b_sentence_end);
    EXPECT_GE(ex.a_token_begin, c.sentence_starts[size_t(ex.a_sentence_begin)]);
    EXPECT_LE(ex.a_token_end, c.sentence_starts[size_t(ex.a_sentence_end)]);
    EXPECT_GE(ex.b_token_begin, c.sentence_starts[size_t(ex.b_sentence_begin)]);
    EXPECT_LE(ex.b_token_end, c.sentence_starts[size_t(ex.b_sentence_end)]);
    EXPECT_EQ(c.document_of(ex.a_sentence_begin), c.document_of(ex.a_sentence_end - 1));
    EXPECT_EQ(c.document_of(ex.b_sentence_begin), c.document_of(ex.b_sentence_end - 1));
  }
}

TEST(BertData, IsNextHalfTheTimeFollowsANotNextComesFromAfar) {
  // max_len longer than any document, so nothing is truncated: an IsNext B then starts where A
  // ends.
  BertPairOptions opt{.max_len = 4096, .min_notnext_distance = 3};
  BertPairs pairs(turns_corpus(300, 6), bert_special_ids(bytes_tok()), 260, opt);
  const auto& c = pairs.corpus();
  const int n = 4000;
  // A starts uniformly over the sentences that have a successor in their document, numbered
  // s - document_of(s).
  const int64_t n_starts = c.num_sentences() - c.num_documents();
  int is_next = 0, first_half = 0;
  for (uint64_t i = 0; i < n; ++i) {
    BertExample ex = pairs.example(11, rng_stream("bert_pairs", 2), i);
    int64_t da = c.document_of(ex.a_sentence_begin), db = c.document_of(ex.b_sentence_begin);
    ASSERT_LT(ex.a_sentence_begin + 1, c.document_starts[size_t(da + 1)]);
    first_half += 2 * (ex.a_sentence_begin - da) < n_starts;
    if (ex.nsp_label == 0) {
      ++is_next;
      ASSERT_EQ(ex.b_sentence_begin, ex.a_sentence_end);
      ASSERT_EQ(db, da);
      ASSERT_EQ(ex.b_token_begin, ex.a_token_end);
    } else {
      ASSERT_EQ(ex.nsp_label, 1);
      ASSERT_GE(std::abs(db - da), 3) << "documents " << da << " and " << db;
    }
  }
  EXPECT_NEAR(double(is_next) / n, 0.5, 0.03);  // 4 sigma
  EXPECT_NEAR(double(first_half) / n, 0.5, 0.03);
}

TEST(BertData, TruncationTrimsTheLongerSideToFit) {
  // Every third turn has a line far longer than max_len.
  std::string text;
  for (int p = 0; p < 60; ++p) {
    text += "S";
    text += std::to_string(p) + ":\n" + std::string(p % 3 == 0 ? 300 : 5 + p % 11, 'x') +
            "\nend " + std::to_string(p) + "\n\n";
  }
  auto corpus = std::make_shared<const SentenceCorpus>(
      build_sentence_corpus(text, bytes_tok(), {.paragraphs_per_document = 2}));
  const int64_t M = 29;  // max_len 32 - 3
  BertPairs pairs(corpus, bert_special_ids(bytes_tok()), 260, {.max_len = 32});
  int truncated = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    BertExample ex = pairs.example(3, 0, i);
    const auto& ss = corpus->sentence_starts;
    int64_t a = ss[size_t(ex.a_sentence_end)] - ss[size_t(ex.a_sentence_begin)];
    int64_t b = ss[size_t(ex.b_sentence_end)] - ss[size_t(ex.b_sentence_begin)];
    int64_t ka = ex.a_token_end - ex.a_token_begin, kb = ex.b_token_end - ex.b_token_begin;
    ASSERT_LE(int64_t(ex.ids.size()), 32);
    if (a + b <= M) {
      ASSERT_EQ(ka, a);
      ASSERT_EQ(kb, b);
      continue;
    }
    ++truncated;
    ASSERT_EQ(ka + kb, M);
    // Only the longer side loses tokens until both are even: the shorter is whole, or they differ
    // by at most one.
    ASSERT_TRUE((a <= b && ka == a) || (b <= a && kb == b) || std::abs(ka - kb) <= 1)
        << a << " " << b << " -> " << ka << " " << kb;
    // A loses its front and B its back: the junction where B continues A is never cut.
    ASSERT_EQ(ex.a_token_end, ss[size_t(ex.a_sentence_end)]);
    ASSERT_EQ(ex.b_token_begin, ss[size_t(ex.b_sentence_begin)]);
  }
  EXPECT_GT(truncated, 500);
}

TEST(BertData, MaskingStatistics) {
  // Literal special tokens in the text are specials in the corpus: never masking candidates.
  std::string text = turns(150);
  for (size_t at = 100; at < text.size(); at += 97) text.insert(at, at % 2 ? "[MASK]" : "[CLS]");
  auto corpus = std::make_shared<const SentenceCorpus>(
      build_sentence_corpus(text, bytes_tok(), {.paragraphs_per_document = 5}));
  BertPairs pairs(corpus, bert_special_ids(bytes_tok()), 260, {.max_len = 64});
  const std::set<int32_t> specials = {256, 257, 258, 259};
  int64_t candidates = 0, chosen = 0, masked = 0, replaced = 0, kept = 0, special_in_text = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    BertExample ex = pairs.example(7, rng_stream("bert_pairs", 9), i);
    std::vector<int32_t> orig = unmasked(pairs, ex);
    int64_t n_cand = 0;
    for (int32_t id : orig) n_cand += specials.count(id) ? 0 : 1;
    special_in_text += int64_t(orig.size()) - 3 - n_cand;
    const int64_t k = int64_t(ex.mlm_positions.size());
    ASSERT_EQ(k, std::max<int64_t>(1, std::llround(0.15 * double(n_cand))));
    ASSERT_EQ(ex.mlm_targets.size(), ex.mlm_positions.size());
    candidates += n_cand;
    chosen += k;
    std::vector<bool> is_chosen(orig.size(), false);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = ex.mlm_positions[size_t(j)];
      if (j > 0) {
        ASSERT_LT(ex.mlm_positions[size_t(j - 1)], p);
      }
      is_chosen[size_t(p)] = true;
      ASSERT_EQ(ex.mlm_targets[size_t(j)], orig[size_t(p)]);
      ASSERT_EQ(specials.count(orig[size_t(p)]), 0u) << "special token chosen at " << p;
      const int32_t now = ex.ids[size_t(p)];
      if (now == 259) {
        ++masked;
      } else if (now != orig[size_t(p)]) {
        ++replaced;
        ASSERT_EQ(specials.count(now), 0u) << "random replacement " << now << " is special";
        ASSERT_TRUE(now >= 0 && now < 260);
      } else {
        ++kept;
      }
    }
    for (size_t t = 0; t < orig.size(); ++t) {
      if (!is_chosen[t]) {
        ASSERT_EQ(ex.ids[t], orig[t]) << "unchosen position " << t << " changed";
      }
    }
  }
  EXPECT_GT(special_in_text, 200);  // the literal specials do reach pairs
  const double c = double(chosen);
  EXPECT_NEAR(c / double(candidates), 0.15, 0.005);
  // ~25k chosen positions: 0.01 is over 4 sigma for every share. A random token equal to the
  // original (1 in 256) counts as kept.
  EXPECT_NEAR(masked / c, 0.8, 0.01);
  EXPECT_NEAR(replaced / c, 0.1 * 255 / 256, 0.01);
  EXPECT_NEAR(kept / c, 0.1 + 0.1 / 256, 0.01);

  // A corpus of special tokens only has no candidates: no targets rather than an error.
  auto all_special =
      std::make_shared<const SentenceCorpus>(SentenceCorpus{.tokens = {259, 257, 258, 256},
                                                            .sentence_starts = {0, 1, 2, 3, 4},
                                                            .document_starts = {0, 2, 4}});
  BertPairs none(all_special, bert_special_ids(bytes_tok()), 260, {});
  BertBatch b = none.sample(2, 1, 0);
  EXPECT_EQ(b.num_mlm_targets(), 0);
  EXPECT_EQ(b.mlm_positions.shape(), (Shape{0}));
}

TEST(BertData, BatchesArePureFunctionsOfSeedStepMicroAndPadded) {
  // Most pairs fill max_len; short targets make the rows of a batch differ in length.
  BertPairs pairs(turns_corpus(200, 8), bert_special_ids(bytes_tok()), 260,
                  {.max_len = 128, .short_seq_prob = 0.5});
  auto vec = [](const Tensor& t) { return t.to_vector<int64_t>(); };
  BertBatch a = pairs.sample(8, 42, 5, 1), b = pairs.sample(8, 42, 5, 1);
  for (const auto& [x, y] :
       std::vector<std::pair<Tensor, Tensor>>{{a.ids, b.ids},
                                              {a.segments, b.segments},
                                              {a.attention_mask, b.attention_mask},
                                              {a.mlm_positions, b.mlm_positions},
                                              {a.mlm_targets, b.mlm_targets},
                                              {a.nsp_labels, b.nsp_labels}})
    EXPECT_EQ(vec(x), vec(y));
  EXPECT_NE(vec(a.ids), vec(pairs.sample(8, 42, 6, 1).ids));
  EXPECT_NE(vec(a.ids), vec(pairs.sample(8, 42, 5, 0).ids));
  EXPECT_NE(vec(a.ids), vec(pairs.sample(8, 43, 5, 1).ids));

  // The batch is the examples of stream ("bert_pairs", step) at micro * B + b, padded.
  const int64_t B = 8, L = a.ids.size(1);
  ASSERT_EQ(a.ids.shape(), (Shape{B, L}));
  ASSERT_EQ(a.segments.shape(), (Shape{B, L}));
  ASSERT_EQ(a.attention_mask.shape(), (Shape{B, L}));
  ASSERT_EQ(a.nsp_labels.shape(), (Shape{B}));
  auto ids = vec(a.ids), seg = vec(a.segments), mask = vec(a.attention_mask);
  std::vector<int64_t> positions, targets;
  int64_t longest = 0;
  for (int64_t r = 0; r < B; ++r) {
    BertExample ex = pairs.example(42, rng_stream("bert_pairs", 5), uint64_t(B + r));
    const int64_t n = int64_t(ex.ids.size());
    longest = std::max(longest, n);
    for (int64_t t = 0; t < L; ++t) {
      const size_t i = size_t(r * L + t);
      EXPECT_EQ(mask[i], t < n ? 1 : 0) << r << "," << t;
      EXPECT_EQ(ids[i], t < n ? ex.ids[size_t(t)] : 256);
      EXPECT_EQ(seg[i], t < n ? ex.segments[size_t(t)] : 0);
    }
    for (size_t j = 0; j < ex.mlm_positions.size(); ++j) {
      positions.push_back(r * L + ex.mlm_positions[j]);
      targets.push_back(ex.mlm_targets[j]);
    }
    EXPECT_EQ(a.nsp_labels.to_vector<int64_t>()[size_t(r)], ex.nsp_label);
  }
  EXPECT_EQ(L, longest);
  EXPECT_LT(*std::min_element(mask.begin(), mask.end()), 1);  // some row is padded
  EXPECT_EQ(vec(a.mlm_positions), positions);
  EXPECT_EQ(vec(a.mlm_targets), targets);
  EXPECT_EQ(a.num_mlm_targets(), int64_t(targets.size()));

  // Evaluation pair i depends on (seed, i) only.
  BertBatch e = pairs.eval_batch(42, 0, 6), e3 = pairs.eval_batch(42, 3, 1);
  EXPECT_EQ(vec(pairs.eval_batch(42, 0, 6).ids), vec(e.ids));
  BertExample third = pairs.example(42, rng_stream("bert_eval", 3), 0);
  EXPECT_EQ(vec(e3.ids), std::vector<int64_t>(third.ids.begin(), third.ids.end()));
  auto e_ids = vec(e.ids);
  const int64_t Le = e.ids.size(1);
  EXPECT_EQ(std::vector<int64_t>(e_ids.begin() + 3 * Le,
                                 e_ids.begin() + 3 * Le + int64_t(third.ids.size())),
            vec(e3.ids));
}

TEST(BertData, CorporaThatCannotMakePairsAreErrors) {
  const BertSpecialIds sp = bert_special_ids(bytes_tok());
  auto single_lines = std::make_shared<const SentenceCorpus>(
      build_sentence_corpus("a\n\nb\n\nc\n", bytes_tok(), {}));
  EXPECT_EQ(code_of([&] { BertPairs(single_lines, sp, 260, {}); }), ExitCode::data);
  auto four_docs = turns_corpus(8, 2);
  EXPECT_NO_THROW(BertPairs(four_docs, sp, 260, {.min_notnext_distance = 2}));
  EXPECT_EQ(code_of([&] { BertPairs(four_docs, sp, 260, {.min_notnext_distance = 3}); }),
            ExitCode::data);
  EXPECT_EQ(code_of([&] { BertPairs(four_docs, sp, 258, {}); }), ExitCode::usage);
  EXPECT_EQ(code_of([&] { BertPairs(four_docs, sp, 260, {.max_len = 4}); }), ExitCode::usage);
  EXPECT_EQ(code_of([&] { BertPairs(four_docs, sp, 260, {.mask_token_prob = 0.95}); }),
            ExitCode::usage);
  auto bad = std::make_shared<SentenceCorpus>(*four_docs);
  bad->tokens[3] = 300;
  EXPECT_EQ(code_of([&] { BertPairs(bad, sp, 260, {}); }), ExitCode::data);
}

TEST(BertData, WorksWithGpt2Bpe) {
  auto tok = make_tokenizer("gpt2", kBertSpecials);
  const BertSpecialIds sp = bert_special_ids(*tok);
  EXPECT_EQ(sp.pad, 50257);
  EXPECT_EQ(sp.mask, 50260);
  const std::string text = turns(120);
  auto corpus = std::make_shared<const SentenceCorpus>(
      build_sentence_corpus(text, *tok, {.paragraphs_per_document = 6}));
  EXPECT_EQ(corpus->num_documents(), 20);
  std::string rebuilt;  // sentences decode to the text without its blank lines
  for (int64_t s = 0; s < corpus->num_sentences(); ++s) rebuilt += sentence_text(*corpus, *tok, s);
  std::string expected;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos) + 1;
    if (end - pos > 1) expected += text.substr(pos, end - pos);
    pos = end;
  }
  EXPECT_EQ(rebuilt, expected);
  BertPairs pairs(corpus, sp, tok->vocab_size(), {.max_len = 32, .min_notnext_distance = 2});
  int64_t replaced = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    BertExample ex = pairs.example(1, 0, i);
    std::vector<int32_t> orig = unmasked(pairs, ex);
    ASSERT_LE(ex.ids.size(), 32u);
    EXPECT_EQ(ex.ids.front(), sp.cls);
    EXPECT_EQ(ex.ids.back(), sp.sep);
    for (size_t j = 0; j < ex.mlm_positions.size(); ++j) {
      const int32_t now = ex.ids[size_t(ex.mlm_positions[j])];
      ASSERT_LT(ex.mlm_targets[j], 50257);
      ASSERT_EQ(ex.mlm_targets[j], orig[size_t(ex.mlm_positions[j])]);
      if (now != sp.mask && now != ex.mlm_targets[j]) {
        ++replaced;
        ASSERT_TRUE(now >= 0 && now < 50257) << now;
      }
    }
  }
  EXPECT_GT(replaced, 20);
  BertBatch batch = pairs.sample(4, 1, 0);
  EXPECT_EQ(batch.ids.size(0), 4);
  EXPECT_LE(batch.ids.size(1), 32);
}

TEST(BertData, TinyShakespeareCorpus) {
  const std::string text = testing::read_file("data/samples/tinyshakespeare.txt");
  ASSERT_GT(text.size(), 1000000u);
  auto t0 = std::chrono::steady_clock::now();
  SentenceCorpus c = build_sentence_corpus(text, bytes_tok(), {.paragraphs_per_document = 30});
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  int64_t blank = 0, paragraphs = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size() - 1) + 1;
    if (text[pos] == '\n')
      ++blank;
    else if (pos == 0 || text[pos - 2] == '\n')
      ++paragraphs;
    pos = end;
  }
  // Every byte but the blank lines' newlines is a token; a document is 30 turns.
  EXPECT_EQ(int64_t(c.tokens.size()), int64_t(text.size()) - blank);
  EXPECT_EQ(c.num_documents(), (paragraphs + 29) / 30);
  EXPECT_EQ(c.num_sentences(), int64_t(std::count(text.begin(), text.end(), '\n')) - blank +
                                   (text.back() == '\n' ? 0 : 1));
  auto [train, val] = split_documents(c, 0.1);
  EXPECT_EQ(val.num_documents(), std::llround(double(c.num_documents()) * 0.1));
  std::printf(
      "[ shakespeare ] %lld paragraphs, %lld documents (%lld train, %lld val), %lld "
      "sentences, %.1f tokens per sentence, built in %.0f ms\n",
      (long long)paragraphs, (long long)c.num_documents(), (long long)train.num_documents(),
      (long long)val.num_documents(), (long long)c.num_sentences(),
      double(c.tokens.size()) / double(c.num_sentences()), ms);
  BertPairs pairs(std::make_shared<const SentenceCorpus>(std::move(val)),
                  bert_special_ids(bytes_tok()), 260, {.min_notnext_distance = 4});
  BertBatch b = pairs.eval_batch(1337, 0, 32);
  EXPECT_EQ(b.ids.size(0), 32);
  EXPECT_LE(b.ids.size(1), 128);
}

}  // namespace
}  // namespace forge
