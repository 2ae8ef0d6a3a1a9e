// bert_pretrain, top to bottom: documents of sentences (held-out documents for validation), the
// pair sampler with dynamic masking, the model, then the objective: MLM cross-entropy averaged over
// the chosen positions plus NSP cross-entropy averaged over the pairs, and evaluation on a fixed
// set of validation pairs. Pairs and masks are functions of (seed, step), so resume is exact
// without a data cursor.
#include "recipes/bert_pretrain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "core/ops.h"
#include "data/bert_data.h"
#include "data/tokenizer.h"
#include "nn/bert.h"
#include "recipes/checkpoint.h"
#include "recipes/components.h"
#include "recipes/trainer.h"

namespace forge {
namespace {

struct BertData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<BertPairs> train, val;
};

std::string read_text(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".h5")
    throw Error(ExitCode::data, quoted_path(path) +
                                    ": bert_pretrain reads text files (sentences are lines); "
                                    "token datasets keep no sentence boundaries");
  return read_input_file(path, kCorpusInput);
}

BertData load_data(const RunConfig& config) {
  const DataConfig& d = config.data;
  const BertSettings bert = bert_settings(config);
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
    throw Error(ExitCode::usage, "bert_pretrain evaluates on validation documents: set data.val "
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

// Summed MLM and NSP losses of one batch, with the counts and correct predictions behind the
// logged accuracies.
struct PairLosses {
  Tensor mlm_sum, nsp_sum;
  std::map<std::string, double> sums;
};

PairLosses pair_losses(const nn::Bert& model, const BertBatch& batch) {
  nn::BertOutputs out = model.forward(batch.ids, batch.segments, batch.attention_mask);
  const int64_t C = out.hidden.size(-1);
  // The V-wide MLM head runs on the chosen positions only (~15% of the tokens).
  Tensor rows = index_select(reshape(out.hidden, {-1, C}), 0, batch.mlm_positions);
  Tensor mlm_logits = model.mlm_logits(rows);
  Tensor nsp_logits = model.nsp_logits(out.pooled);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  PairLosses r;
  r.mlm_sum = cross_entropy(mlm_logits, batch.mlm_targets, ce);
  r.nsp_sum = cross_entropy(nsp_logits, batch.nsp_labels, ce);
  NoGradGuard no_grad;
  r.sums = {{"mlm_loss", r.mlm_sum.item()},
            {"mlm_correct", double(count_equal(mlm_logits, batch.mlm_targets))},
            {"mlm_count", double(batch.num_mlm_targets())},
            {"nsp_loss", r.nsp_sum.item()},
            {"nsp_correct", double(count_equal(nsp_logits, batch.nsp_labels))},
            {"nsp_count", double(batch.nsp_labels.numel())}};
  return r;
}

double mean_mlm_loss(const std::map<std::string, double>& s) {
  return s.at("mlm_loss") / s.at("mlm_count");
}
double mean_nsp_loss(const std::map<std::string, double>& s) {
  return s.at("nsp_loss") / s.at("nsp_count");
}

Metrics pair_metrics(const std::map<std::string, double>& s) {
  return {{"mlm_loss", mean_mlm_loss(s)},
          {"mlm_acc", s.at("mlm_correct") / s.at("mlm_count")},
          {"nsp_loss", mean_nsp_loss(s)},
          {"nsp_acc", s.at("nsp_correct") / s.at("nsp_count")}};
}

// The validation pairs: the first `pairs` of the fixed evaluation set, so every evaluation of a
// run (and `forge eval` later) scores the same pairs with the same masks.
Metrics bert_eval(const nn::Bert& model, const BertPairs& val, uint64_t seed, int64_t batch_size,
                  int64_t pairs) {
  std::map<std::string, double> sums;
  // A stop request ends the loop between batches; the metrics need at least one.
  for (int64_t first = 0; first < pairs && (first == 0 || !stop_requested()); first += batch_size) {
    PairLosses r =
        pair_losses(model, val.eval_batch(seed, first, std::min(batch_size, pairs - first)));
    for (const auto& [key, value] : r.sums) sums[key] += value;
  }
  Metrics m = {{"loss", mean_mlm_loss(sums) + mean_nsp_loss(sums)}};
  for (Metric& metric : pair_metrics(sums)) m.push_back(std::move(metric));
  m.push_back({"mlm_ppl", std::exp(mean_mlm_loss(sums))});
  m.push_back({"pairs", pairs});
  return m;
}

// Rules of the recipe besides the bert family's (components.h): the pair format needs its specials.
void check_bert_pretrain(ConfigChecker& checker) {
  check_model_family(checker);
  const std::vector<std::string>& specials = checker.config().data.special_tokens;
  std::string missing;
  for (const char* token : {"[PAD]", "[CLS]", "[SEP]", "[MASK]"})
    if (std::find(specials.begin(), specials.end(), token) == specials.end())
      missing += std::string(missing.empty() ? "" : ", ") + token;
  checker.cross({"data.special_tokens", "recipe"}, missing.empty(),
                "data.special_tokens: recipe bert_pretrain needs [PAD], [CLS], [SEP] and [MASK]; "
                "missing " + missing);
}

// The MLM head runs on the chosen positions only (~mask_prob of the tokens).
MemoryEstimate estimate_bert(const RunConfig& config) {
  nn::BertConfig b = bert_config(config);
  nn::check_config(b);
  int64_t params = nn::bert_num_parameters(b);
  double tokens = double(config.train.batch_size * config.model.context);
  return estimate_memory(config, params, params, tokens * bert_settings(config).mask_prob);
}

}  // namespace

BertSettings bert_settings(const RunConfig& c) {
  return {.type_vocab_size = c.get<int64_t>("bert.type_vocab_size"),
          .mask_prob = c.get<double>("bert.mask_prob"),
          .eval_pairs = c.get<int64_t>("bert.eval_pairs"),
          .paragraphs_per_document = c.get<int64_t>("bert.paragraphs_per_document"),
          .sentence_breaks = c.get<bool>("bert.sentence_breaks")};
}

ConfigSection bert_section() {
  return {
      "bert",
      "what only BERT pre-training reads: segments, masking, documents and evaluation pairs",
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

RecipeSpec bert_pretrain_recipe() {
  return {.name = "bert_pretrain",
          .doc = "a BERT encoder pre-trained with masked-LM plus next-sentence prediction",
          .families = {"bert"},
          .sections = {"bert"},
          .check = check_bert_pretrain,
          .train = train_bert,
          .eval = [](const RunConfig& config, const std::filesystem::path& checkpoint) {
            return eval_bert(config, checkpoint.string());
          },
          .estimate = estimate_bert};
}

int train_bert(const RunConfig& config) {
  BertData data = load_data(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::Bert model(bert_config(config), init);
  init_weights(model, config);
  model.set_activation_checkpointing(config.train.activation_checkpointing);
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, model.named_parameters());

  const int64_t B = config.train.batch_size, accum = config.train.grad_accum;
  const auto seed = uint64_t(config.seed);
  // The loss is mean MLM over all chosen positions of the step plus mean NSP over its pairs. The
  // trainer divides summed losses by summed targets (here: pairs), so each micro-batch scales its
  // MLM sum by pairs / chosen positions of the whole step, which needs the step's batches first.
  std::vector<BertBatch> step_batches;
  double mlm_scale = 0.0;
  Recipe recipe;
  recipe.tokens_per_step = B * config.model.context * accum;
  recipe.micro_batch = [&](int64_t step, int64_t micro) {
    if (micro == 0) {
      step_batches.clear();
      int64_t chosen = 0;
      for (int64_t m = 0; m < accum; ++m) {
        step_batches.push_back(data.train->sample(B, seed, step, m));
        chosen += step_batches.back().num_mlm_targets();
      }
      mlm_scale = double(B * accum) / double(std::max<int64_t>(chosen, 1));
    }
    PairLosses r = pair_losses(model, step_batches[size_t(micro)]);
    return MicroBatchLoss{add(mul(r.mlm_sum, mlm_scale), r.nsp_sum), B, std::move(r.sums)};
  };
  recipe.train_metrics = pair_metrics;
  const int64_t eval_pairs = bert_settings(config).eval_pairs;
  recipe.evaluate = [&](bool full) {
    int64_t pairs = full || config.train.eval_batches == 0
                        ? eval_pairs
                        : std::min(eval_pairs, config.train.eval_batches * B);
    return bert_eval(model, *data.val, seed, B, pairs);
  };
  return run_training(config, model, *optimizer, recipe);
}

int eval_bert(const RunConfig& config, const std::string& checkpoint_file) {
  LoadedBert loaded = load_bert(checkpoint_file);
  BertData data = load_data(config);
  NoGradGuard no_grad;
  Metrics m = bert_eval(*loaded.model, *data.val, uint64_t(config.seed), config.train.batch_size,
                        bert_settings(config).eval_pairs);
  print_eval(checkpoint_file, loaded.step, m);
  return 0;
}

}  // namespace forge
