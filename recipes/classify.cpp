// classify, top to bottom: labelled records (record files whose stem is the label, or JSONL
// {"text", "label"}), a stratified split, the classifier on model.init_from's backbone (its LM
// head dropped, the new head at its init), cross-entropy over padded batches from a shuffling
// loader with a resumable cursor, and accuracy and macro-F1 on train and val lines. The final
// evaluation's confusion matrix goes to classification.json, which the report draws.
//
// The label list is part of the model: the run stores the one it used in classify.labels (config
// and checkpoints), so `forge eval` and `forge predict` map output ids back to names, and a resume
// over data with other labels fails on the data fingerprint.
#include "recipes/classify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/ops.h"
#include "data/jsonl.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "runtime/checkpoint.h"
#include "runtime/components.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

bool is_bert(const RunConfig& c) { return c.model.arch == "bert"; }

int64_t max_tokens(const RunConfig& c) {
  const int64_t m = classify_settings(c).max_len;
  return m > 0 ? m : c.model.context;
}

nn::ClassifierHeadConfig head_config(const RunConfig& c, int64_t labels) {
  const ClassifySection s = classify_settings(c);
  return {.num_labels = labels, .hidden = s.hidden, .dropout = s.dropout};
}

// How texts become rows: BERT frames them with [CLS] ... [SEP]; every row is cut at max_len.
RecordTokenizeOptions row_options(const RunConfig& c, std::vector<std::string> labels) {
  RecordTokenizeOptions o;
  if (is_bert(c)) {
    o.prepend = {"[CLS]"};
    o.append = {"[SEP]"};
  }
  o.max_len = max_tokens(c);
  o.labels = std::move(labels);
  return o;
}

struct ClassifyData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const RecordDataset> train, val;
};

ClassifyData load_data(const RunConfig& c) {
  ClassifyData data;
  data.tokenizer = make_tokenizer(c.data.tokenizer, c.data.special_tokens);
  const ClassifySection s = classify_settings(c);
  const RecordFormat format = s.records;
  const std::vector<std::string>& labels = s.labels;
  std::vector<TextRecord> records = read_labeled_records({c.data.train}, format);
  if (!labels.empty()) records = keep_labels(records, labels);
  RecordDataset all = tokenize_records(records, *data.tokenizer, row_options(c, labels));
  if (all.label_names.size() < 2)
    throw Error(ExitCode::data, quoted_path(c.data.train) + ": the records have " +
                                    std::to_string(all.label_names.size()) +
                                    " label; a classifier needs at least 2");
  if (c.data.val.empty()) {
    RecordSplit split =
        split_records_by_fraction(all, c.data.val_fraction, uint64_t(c.data.split_seed));
    data.train = split.train;
    data.val = split.val;
    return data;
  }
  // Held-out records of labels the classifier does not have are left out only when the config
  // chose its labels; otherwise they are an error (tokenize_records names the record).
  std::vector<TextRecord> val = read_labeled_records({c.data.val}, format);
  if (!labels.empty())
    std::erase_if(val, [&](const TextRecord& r) {
      return std::find(labels.begin(), labels.end(), r.label) == labels.end();
    });
  data.val = std::make_shared<const RecordDataset>(
      tokenize_records(val, *data.tokenizer, row_options(c, all.label_names)));
  data.train = std::make_shared<const RecordDataset>(std::move(all));
  return data;
}

// The config a run stores: classify.labels filled with the labels it trains, in id order.
RunConfig with_labels(const RunConfig& config, const std::vector<std::string>& labels) {
  RunConfig run = config;
  run.sections["classify.labels"] = labels;
  return run;
}

// A BERT checkpoint's segment vocabulary, read off its weights (the classify section does not
// repeat bert.type_vocab_size).
int64_t segment_vocab(const fs::path& weights, int64_t fallback) {
  if (weights.empty()) return fallback;
  for (const TensorSpec& t : read_checkpoint_info(weights).model)
    if (t.name == "seg_emb.weight" && !t.shape.empty()) return t.shape[0];
  return fallback;
}

// Confusion counts of a batch as "cm_<truth>_<predicted>" sums (non-zero cells only).
void count_predictions(const Tensor& logits, const Tensor& labels,
                       std::map<std::string, double>& sums) {
  const std::vector<int64_t> predicted = argmax(logits.detach(), -1).to_vector<int64_t>();
  const std::vector<int64_t> truth = labels.to_vector<int64_t>();
  for (size_t i = 0; i < truth.size(); ++i)
    sums["cm_" + std::to_string(truth[i]) + "_" + std::to_string(predicted[i])] += 1;
}

Confusion confusion_from_sums(const std::vector<std::string>& labels,
                              const std::map<std::string, double>& sums) {
  Confusion m(labels);
  for (const auto& [key, value] : sums) {
    long long t = 0, p = 0;
    int end = 0;
    if (std::sscanf(key.c_str(), "cm_%lld_%lld%n", &t, &p, &end) != 2 || size_t(end) != key.size())
      continue;
    m.add(t, p, int64_t(std::llround(value)));
  }
  return m;
}

// Rows [first, first + count) of `dataset` in order (count clipped at the end): evaluation and
// prediction walk a dataset this way.
RecordBatch rows_from(const RecordDataset& dataset, int64_t first, int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t r = first; r < std::min(dataset.size(), first + count); ++r) rows.push_back(r);
  return RecordLoader::make_batch(dataset, std::move(rows));
}

Metrics eval_metrics(const ClassifierEval& e) {
  return {{"loss", e.loss}, {"acc", e.confusion.accuracy()}, {"macro_f1", e.confusion.macro_f1()}};
}

MemoryEstimate estimate_classify(const RunConfig& config) {
  const std::vector<std::string> listed = classify_settings(config).labels;
  const nn::ClassifierHeadConfig head =
      head_config(config, std::max<int64_t>(2, int64_t(listed.size())));
  int64_t params = 0;
  const int64_t C = config.model.d_model;
  if (is_bert(config)) {
    nn::BertConfig b = bert_config(config);
    nn::check_config(b);
    params = nn::bert_num_parameters(b) + C * head.num_labels + head.num_labels;
  } else {
    nn::GPTConfig g = gpt_config(config.model);
    nn::check_config(g);
    params = nn::gpt_backbone_parameters(g) + 3 * C * head.hidden + head.hidden +
             head.hidden * head.num_labels + head.num_labels;
  }
  // Activations scale with the padded row: a GPT runs a long text as whole windows of context.
  RunConfig rows = config;
  const int64_t T = config.model.context, L = max_tokens(config);
  rows.model.context = is_bert(config) ? L : (L + T - 1) / T * T;
  return estimate_memory(rows, params, params, 0.0);
}

void check_classify(ConfigChecker& checker) {
  check_model_family(checker);
  const RunConfig& c = checker.config();
  const ClassifySection s = classify_settings(c);
  if (is_bert(c)) {
    const auto& specials = c.data.special_tokens;
    const bool framed = std::find(specials.begin(), specials.end(), "[CLS]") != specials.end() &&
                        std::find(specials.begin(), specials.end(), "[SEP]") != specials.end();
    checker.cross({"data.special_tokens", "model.arch"}, framed,
                  "data.special_tokens: a BERT classifier reads [CLS] text [SEP]; list both");
    checker.cross({"classify.max_len", "model.context"},
                  s.max_len <= c.model.context,
                  "classify.max_len: a BERT reads at most model.context tokens (" +
                      std::to_string(c.model.context) + ")");
  }
  const std::vector<std::string>& labels = s.labels;
  std::vector<std::string> sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  checker.cross(
      {"classify.labels"},
      labels.size() != 1 && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
      "classify.labels: list two or more distinct labels, or none for every label of "
      "the data");
}

std::unique_ptr<nn::SequenceClassifier> load_classifier(const RunConfig& stored,
                                                        const fs::path& file) {
  const std::vector<std::string> labels = classify_settings(stored).labels;
  if (labels.size() < 2)
    throw Error(ExitCode::checkpoint,
                quoted_path(file.string()) + ": the stored config lists no classify.labels");
  Generator init(uint64_t(stored.seed), rng_stream("init"));
  auto model = build_classifier(stored, int64_t(labels.size()), file, init);
  init_from_checkpoint(*model, file);
  model->eval();
  return model;
}

int eval_classify(const RunConfig& config, const fs::path& checkpoint, const CommandOptions&) {
  const RunConfig stored = stored_config(checkpoint);
  std::unique_ptr<nn::SequenceClassifier> model = load_classifier(stored, checkpoint);
  // The run's own labels, so that ids mean what they meant in training.
  const std::vector<std::string> labels = classify_settings(stored).labels;
  ClassifyData data = load_data(with_labels(config, labels));
  NoGradGuard no_grad;
  ClassifierEval e = evaluate_classifier(*model, *data.val, config.train.batch_size, 0);
  print_eval(checkpoint.string(), read_checkpoint_info(checkpoint).step, eval_metrics(e));
  std::printf("\n%s", e.confusion.to_text().c_str());
  return 0;
}

int predict_classify(const RunConfig& stored, const fs::path& checkpoint, const fs::path& input) {
  // Each non-blank line, or the "text" of each JSONL record (a "label" is allowed and ignored).
  const std::vector<std::string> texts =
      read_texts(input, {"input", "an input record", {"text", "label"}}, "text");
  std::unique_ptr<nn::SequenceClassifier> model = load_classifier(stored, checkpoint);
  const std::vector<std::string> labels = classify_settings(stored).labels;
  std::unique_ptr<Tokenizer> tokenizer =
      make_tokenizer(stored.data.tokenizer, stored.data.special_tokens);
  const RecordTokenizeOptions options = row_options(stored, {});
  RecordDataset rows;
  rows.label_names = labels;
  for (const std::string& text : texts) {
    rows.tokens.push_back(encode_record(text, *tokenizer, options));
    rows.labels.push_back(0);  // unknown; make_batch needs a value
  }
  NoGradGuard no_grad;
  const int64_t B = stored.train.batch_size, n = rows.size();
  for (int64_t first = 0; first < n; first += B) {
    const RecordBatch batch = rows_from(rows, first, B);
    const Tensor probs = softmax(model->forward(batch.ids, batch.mask), -1);
    const std::vector<float> p = probs.contiguous().to_vector<float>();
    const auto K = int64_t(labels.size());
    for (int64_t b = 0; b < int64_t(batch.indices.size()); ++b) {
      const float* row = p.data() + b * K;
      const int64_t best = std::max_element(row, row + K) - row;
      std::printf("%s\t%.4f\n", labels[size_t(best)].c_str(), double(row[best]));
    }
  }
  return 0;
}

int train_classify(const RunConfig& config) {
  ClassifyData data = load_data(config);
  const RunConfig run = with_labels(config, data.train->label_names);
  const auto num_labels = int64_t(data.train->label_names.size());
  const fs::path source =
      config.model.init_from.empty() ? fs::path() : resolve_checkpoint(config.model.init_from);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  std::unique_ptr<nn::SequenceClassifier> model = build_classifier(run, num_labels, source, init);
  model->set_activation_checkpointing(config.train.activation_checkpointing);
  // The backbone comes from the source; its LM (or MLM and NSP) heads are not used, and the new
  // head keeps its init unless the source is a classifier of the same shape. A resume then
  // overwrites all of it with the run's own checkpoint.
  if (!source.empty())
    init_from_checkpoint(
        *model, source,
        {.allow_missing = {"head.*"}, .allow_unexpected = {"lm_head.*", "mlm.*", "nsp.*"}});
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(run, model->named_parameters());

  const int64_t B = config.train.batch_size;
  RecordLoader loader(data.train, B, uint64_t(config.seed));
  double mean_tokens = 0;
  for (const auto& row : data.train->tokens) mean_tokens += double(row.size());
  mean_tokens /= double(std::max<int64_t>(1, data.train->size()));

  Recipe recipe;
  recipe.tokens_per_step = int64_t(std::llround(mean_tokens * double(B * config.train.grad_accum)));
  recipe.micro_batch = [&](int64_t, int64_t) { return classify_loss(*model, loader.next()); };
  recipe.skip_micro_batch = [&](int64_t, int64_t) { loader.skip(); };
  recipe.train_metrics = [&](const std::map<std::string, double>& sums) -> Metrics {
    const Confusion m = confusion_from_sums(data.train->label_names, sums);
    return {{"acc", m.accuracy()}, {"macro_f1", m.macro_f1()}};
  };
  recipe.evaluate = [&](bool full) {
    const int64_t rows = full || config.train.eval_batches == 0 ? 0 : config.train.eval_batches * B;
    ClassifierEval e = evaluate_classifier(*model, *data.val, B, rows);
    if (full && !stop_requested())
      write_file_atomic(confusion_path(config.output_dir), e.confusion.to_json(), ExitCode::usage);
    return eval_metrics(e);
  };
  recipe.data_state = [&] { return loader.cursor().to_counters("data."); };
  recipe.restore_data_state = [&](const DataState& state) {
    loader.restore(LoaderCursor::from_counters(state, "data.", fingerprint(*data.train)));
  };
  return run_training(run, *model, *optimizer, recipe);
}

}  // namespace

std::unique_ptr<nn::SequenceClassifier> build_classifier(const RunConfig& config, int64_t labels,
                                                         const fs::path& weights, Generator& gen) {
  const nn::ClassifierHeadConfig head = head_config(config, labels);
  if (is_bert(config)) {
    nn::BertConfig b = bert_config(config);
    b.type_vocab_size = segment_vocab(weights, b.type_vocab_size);
    return std::make_unique<nn::BertClassifier>(b, head, gen);
  }
  return std::make_unique<nn::GPTClassifier>(gpt_config(config.model), head, gen);
}

MicroBatchLoss classify_loss(const nn::SequenceClassifier& model, const RecordBatch& batch) {
  const Tensor logits = model.forward(batch.ids, batch.mask);
  CrossEntropyOptions ce;
  ce.reduction = Reduction::sum;
  MicroBatchLoss out{cross_entropy(logits, batch.labels, ce), batch.labels.size(0)};
  count_predictions(logits, batch.labels, out.sums);
  return out;
}

ClassifierEval evaluate_classifier(const nn::SequenceClassifier& model,
                                   const RecordDataset& dataset, int64_t batch_size, int64_t rows) {
  const int64_t n = rows > 0 ? std::min(rows, dataset.size()) : dataset.size();
  ClassifierEval e{0.0, Confusion(dataset.label_names)};
  double total = 0;
  int64_t seen = 0;
  for (int64_t first = 0; first < n && (first == 0 || !stop_requested()); first += batch_size) {
    MicroBatchLoss r =
        classify_loss(model, rows_from(dataset, first, std::min(batch_size, n - first)));
    total += r.loss_sum.item();
    seen += r.num_targets;
    e.confusion.merge(confusion_from_sums(dataset.label_names, r.sums));
  }
  e.loss = total / double(std::max<int64_t>(seen, 1));
  return e;
}

ConfigSection classify_section() {
  return {
      "classify",
      "labelled records and the classification head of the classify recipe",
      {section_key("classify.labels", string_list_key().fixes_architecture(),
                   "the classes, in the order of their ids; [] = every label of data.train, "
                   "sorted (the run stores the list it used)"),
       section_key("classify.records", choice_key("percent", {"percent", "lines", "file"}),
                   "how the files of data.train split into records: '%' lines (the fortunes "
                   "format), lines, or whole files; a file's stem is its records' label "
                   "(.jsonl files hold {\"text\", \"label\"} records instead)"),
       section_key("classify.max_len", integer_key(0, "[0, 1000000]"),
                   "tokens kept of a text (BERT's [CLS] and [SEP] included), the rest cut; 0 = "
                   "model.context. A GPT reads a longer text as windows of model.context tokens, "
                   "pooled together"),
       section_key("classify.hidden", integer_key(50, "[1, 65536]").fixes_architecture(),
                   "GPT head: width of the layer between concat pooling and the output"),
       section_key("classify.dropout", number_key(0.1, "[0, 1)"),
                   "dropout before the head's last Linear")}};
}

ClassifySection classify_settings(const RunConfig& config) {
  return {.labels = config.get<std::vector<std::string>>("classify.labels"),
          .records = parse_record_format(config.get<std::string>("classify.records")),
          .max_len = config.get<int64_t>("classify.max_len"),
          .hidden = config.get<int64_t>("classify.hidden"),
          .dropout = config.get<double>("classify.dropout")};
}

RecipeSpec classify_recipe() {
  return {.name = "classify",
          .doc = "a text classifier on a pretrained GPT (concat pooling) or BERT ([CLS] pooler)",
          .families = {"gpt", "bert"},
          .sections = {"classify"},
          .check = check_classify,
          .train = train_classify,
          .eval = eval_classify,
          .estimate = estimate_classify,
          .predict = predict_classify,
          .data_directories = true};
}

}  // namespace forge
