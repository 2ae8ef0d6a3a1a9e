// The BERT objective BERT recipes share; see bert_objective.h. Pairs and masks are functions of
// (seed, step), so the recipes resume exactly without a data cursor.
#include "recipes/bert_objective.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/file_io.h"
#include "core/ops.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

std::string read_text(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".h5")
    throw Error(ExitCode::data, quoted_path(path) +
                                    ": BERT recipes read text files (sentences are lines); token "
                                    "datasets keep no sentence boundaries");
  return read_input_file(path, kCorpusInput);
}

double mean_mlm_loss(const std::map<std::string, double>& s) {
  return s.at("mlm_loss") / s.at("mlm_count");
}
double mean_nsp_loss(const std::map<std::string, double>& s) {
  return s.at("nsp_loss") / s.at("nsp_count");
}

}  // namespace

void check_bert_specials(ConfigChecker& checker, const std::string& recipe) {
  const std::vector<std::string>& specials = checker.config().data.special_tokens;
  std::string missing;
  for (const char* token : {"[PAD]", "[CLS]", "[SEP]", "[MASK]"})
    if (std::find(specials.begin(), specials.end(), token) == specials.end())
      missing += std::string(missing.empty() ? "" : ", ") + token;
  checker.cross({"data.special_tokens", "recipe"}, missing.empty(),
                "data.special_tokens: recipe " + recipe +
                    " needs [PAD], [CLS], [SEP] and [MASK]; missing " + missing);
}

BertData load_bert_data(const RunConfig& config) {
  const DataConfig& d = config.data;
  const BertSection bert = bert_settings(config);
  BertData data;
  data.tokenizer = make_tokenizer(d.tokenizer, d.special_tokens);
  DocumentOptions documents;
  documents.paragraphs_per_document = bert.paragraphs_per_document;
  documents.sentence_breaks = bert.sentence_breaks;
  SentenceCorpus train = build_sentence_corpus(read_text(d.train), *data.tokenizer, documents);
  SentenceCorpus val;
  if (d.val.empty())
    std::tie(train, val) = split_documents(train, d.val_fraction);
  else
    val = build_sentence_corpus(read_text(d.val), *data.tokenizer, documents);
  if (val.num_documents() == 0)
    throw Error(ExitCode::usage, "BERT recipes evaluate on validation documents: set data.val "
                                 "or data.val_fraction > 0");
  BertPairOptions pairs;
  pairs.max_len = config.model.context;
  pairs.mask_prob = bert.mask_prob;
  const BertSpecialIds specials = bert_special_ids(*data.tokenizer);
  const auto V = int32_t(config.model.vocab_size);
  auto sampler = [&](SentenceCorpus corpus) {
    // NotNext segments come from a distant part of the corpus, at least a quarter of it away: a
    // nearby run of turns is often the same scene with the same speakers, which makes "another
    // document" indistinguishable from the next one (NSP then stays at chance).
    pairs.min_notnext_distance = std::max<int64_t>(1, corpus.num_documents() / 4);
    return std::make_unique<BertPairs>(std::make_shared<const SentenceCorpus>(std::move(corpus)),
                                       specials, V, pairs);
  };
  data.train = sampler(std::move(train));
  data.val = sampler(std::move(val));
  return data;
}

int64_t count_equal(const Tensor& logits, const Tensor& targets) {
  std::vector<int64_t> predicted = argmax(logits, -1).to_vector<int64_t>();
  std::vector<int64_t> wanted = targets.to_vector<int64_t>();
  int64_t n = 0;
  for (size_t i = 0; i < wanted.size(); ++i) n += predicted[i] == wanted[i];
  return n;
}

PairLosses pair_losses(const nn::Bert& model, const BertBatch& batch) {
  PairLosses r;
  r.outputs = model.forward(batch.ids, batch.segments, batch.attention_mask);
  const int64_t C = r.outputs.hidden.size(-1);
  // The V-wide MLM head runs on the chosen positions only (~15% of the tokens).
  Tensor rows = index_select(reshape(r.outputs.hidden, {-1, C}), 0, batch.mlm_positions);
  r.mlm_logits = model.mlm_logits(rows);
  Tensor nsp_logits = model.nsp_logits(r.outputs.pooled);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  r.mlm_sum = cross_entropy(r.mlm_logits, batch.mlm_targets, ce);
  r.nsp_sum = cross_entropy(nsp_logits, batch.nsp_labels, ce);
  NoGradGuard no_grad;
  r.sums = {{"mlm_loss", r.mlm_sum.item()},
            {"mlm_correct", double(count_equal(r.mlm_logits, batch.mlm_targets))},
            {"mlm_count", double(batch.num_mlm_targets())},
            {"nsp_loss", r.nsp_sum.item()},
            {"nsp_correct", double(count_equal(nsp_logits, batch.nsp_labels))},
            {"nsp_count", double(batch.nsp_labels.numel())}};
  return r;
}

Metrics pair_metrics(const std::map<std::string, double>& s) {
  return {{"mlm_loss", mean_mlm_loss(s)},
          {"mlm_acc", s.at("mlm_correct") / s.at("mlm_count")},
          {"nsp_loss", mean_nsp_loss(s)},
          {"nsp_acc", s.at("nsp_correct") / s.at("nsp_count")}};
}

void for_each_eval_pair_batch(const BertPairs& val, uint64_t seed, int64_t batch_size,
                              int64_t pairs, const std::function<void(const BertBatch&)>& run) {
  // A stop request ends the loop between batches; the metrics need at least one.
  for (int64_t first = 0; first < pairs && (first == 0 || !stop_requested()); first += batch_size)
    run(val.eval_batch(seed, first, std::min(batch_size, pairs - first)));
}

Metrics bert_eval_metrics(const std::map<std::string, double>& sums, int64_t pairs) {
  Metrics m = {{"loss", mean_mlm_loss(sums) + mean_nsp_loss(sums)}};
  for (Metric& metric : pair_metrics(sums)) m.push_back(std::move(metric));
  m.push_back({"mlm_ppl", std::exp(mean_mlm_loss(sums))});
  m.push_back({"pairs", pairs});
  return m;
}

Metrics bert_eval(const nn::Bert& model, const BertPairs& val, uint64_t seed, int64_t batch_size,
                  int64_t pairs) {
  std::map<std::string, double> sums;
  for_each_eval_pair_batch(val, seed, batch_size, pairs, [&](const BertBatch& batch) {
    for (const auto& [key, value] : pair_losses(model, batch).sums) sums[key] += value;
  });
  return bert_eval_metrics(sums, pairs);
}

int64_t bert_eval_pair_count(const RunConfig& config, bool full) {
  const int64_t eval_pairs = bert_settings(config).eval_pairs;
  if (full || config.train.eval_batches == 0) return eval_pairs;
  return std::min(eval_pairs, config.train.eval_batches * config.train.batch_size);
}

}  // namespace forge
