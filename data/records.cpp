// Record datasets and their loader. Both the split and every epoch's order are Fisher-Yates
// shuffles driven by Philox counters, so a permutation is a pure function of (seed, purpose,
// epoch): nothing about past batches has to be stored or replayed to continue a run.
#include "data/records.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "data/batch.h"
#include "data/jsonl.h"

namespace forge {

namespace fs = std::filesystem;

// The modulo's bias is below n / 2^64, far under anything a dataset size can show.
std::vector<int64_t> philox_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto w = philox(seed, stream, static_cast<uint64_t>(i));
    const uint64_t r = (static_cast<uint64_t>(w[0]) << 32) | w[1];
    const auto j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

namespace {

// Files named by `paths`, each directory replaced by its regular *.txt files in name order.
std::vector<fs::path> expand_directories(const std::vector<fs::path>& paths) {
  std::vector<fs::path> files;
  for (const fs::path& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      files.push_back(p);
      continue;
    }
    std::vector<fs::path> found;
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".txt") found.push_back(it->path());
    if (ec)
      throw Error(ExitCode::data, quoted_path(p.string()) + ": cannot list (" + ec.message() + ")");
    if (found.empty())
      throw Error(ExitCode::data, quoted_path(p.string()) + ": no *.txt files in directory");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string read_text(const fs::path& path) {
  return read_input_file(path.string(), kCorpusInput);
}

std::vector<int32_t> special_ids(const std::vector<std::string>& names,
                                 const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const std::string& name : names) {
    const auto id = tokenizer.special_id(name);
    if (!id)
      throw Error(ExitCode::data, detail::concat("tokenizer '", tokenizer.name(),
                                                 "' has no special token '", name, "'"));
    ids.push_back(*id);
  }
  return ids;
}

// The rows `rows` of `dataset`, in that order, with all of its label names.
std::shared_ptr<const RecordDataset> select_rows(const RecordDataset& dataset,
                                                 const std::vector<int64_t>& rows) {
  auto out = std::make_shared<RecordDataset>();
  out->label_names = dataset.label_names;
  for (int64_t r : rows) {
    out->tokens.push_back(dataset.tokens[static_cast<size_t>(r)]);
    out->labels.push_back(dataset.labels[static_cast<size_t>(r)]);
  }
  return out;
}

}  // namespace

std::vector<TextRecord> read_labeled_records(const std::vector<fs::path>& files,
                                             RecordFormat format) {
  std::vector<TextRecord> records;
  for (const fs::path& file : expand_directories(files)) {
    if (file.extension() == ".jsonl") {
      std::vector<TextRecord> more = read_labeled_jsonl(file);
      records.insert(records.end(), std::make_move_iterator(more.begin()),
                     std::make_move_iterator(more.end()));
      continue;
    }
    const std::string text = read_text(file);
    const std::string label = file.stem().string();
    for (std::string_view record : split_records(text, format))
      records.push_back({std::string(record), label});
  }
  return records;
}

std::vector<TextRecord> read_labeled_jsonl(const fs::path& file) {
  const JsonlSchema schema{"labelled", "a labelled record", {"text", "label"}};
  std::vector<TextRecord> records;
  for (const JsonlObject& o : read_jsonl_objects(file, schema)) {
    const auto label = o.value.find("label");
    std::string name;
    if (label != o.value.end() && label->is_number_integer())
      name = label->dump();
    else if (label != o.value.end() && !label->is_string())
      o.fail_field("label",
                   detail::concat("must be a string or an integer, got ", label->type_name()));
    else
      name = jsonl_nonempty_string(o, "label");
    records.push_back({jsonl_nonempty_string(o, "text"), std::move(name)});
  }
  return records;
}

std::vector<TextRecord> keep_labels(const std::vector<TextRecord>& records,
                                    const std::vector<std::string>& labels) {
  std::map<std::string, int64_t> count;
  for (const TextRecord& r : records) ++count[r.label];
  for (const std::string& label : labels)
    if (!count.count(label)) {
      std::string there;
      for (const auto& [name, n] : count) there += (there.empty() ? "" : ", ") + name;
      throw Error(ExitCode::data, detail::concat("no record has the label '", label,
                                                 "' (the data has: ", there, ")"));
    }
  std::vector<TextRecord> out;
  for (const TextRecord& r : records)
    if (std::find(labels.begin(), labels.end(), r.label) != labels.end()) out.push_back(r);
  return out;
}

namespace {

// Special ids of the framing and the room left for text.
struct Framing {
  std::vector<int32_t> head, tail;
  int64_t max_text = INT64_MAX;
};

Framing framing(const Tokenizer& tokenizer, const RecordTokenizeOptions& options) {
  Framing f{special_ids(options.prepend, tokenizer), special_ids(options.append, tokenizer)};
  const auto specials = static_cast<int64_t>(f.head.size() + f.tail.size());
  if (options.max_len < 0 || (options.max_len > 0 && options.max_len <= specials))
    throw Error(ExitCode::usage,
                detail::concat("max_len ", options.max_len, " leaves no room for text next to ",
                               specials, " special tokens"));
  if (options.max_len > 0) f.max_text = options.max_len - specials;
  return f;
}

std::vector<int32_t> encode_framed(const std::string& text, const Tokenizer& tokenizer,
                                   const Framing& f) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  if (static_cast<int64_t>(ids.size()) > f.max_text) ids.resize(static_cast<size_t>(f.max_text));
  std::vector<int32_t> row = f.head;
  row.insert(row.end(), ids.begin(), ids.end());
  row.insert(row.end(), f.tail.begin(), f.tail.end());
  return row;
}

}  // namespace

std::vector<int32_t> encode_record(const std::string& text, const Tokenizer& tokenizer,
                                   const RecordTokenizeOptions& options) {
  return encode_framed(text, tokenizer, framing(tokenizer, options));
}

RecordDataset tokenize_records(const std::vector<TextRecord>& records, const Tokenizer& tokenizer,
                               const RecordTokenizeOptions& options) {
  const Framing f = framing(tokenizer, options);
  RecordDataset out;
  std::map<std::string, int32_t> id_of;
  if (options.labels.empty()) {
    for (const TextRecord& r : records) id_of[r.label] = 0;
    for (auto& [name, id] : id_of) {
      id = static_cast<int32_t>(out.label_names.size());
      out.label_names.push_back(name);
    }
  } else {
    out.label_names = options.labels;
    for (size_t i = 0; i < options.labels.size(); ++i)
      id_of[options.labels[i]] = static_cast<int32_t>(i);
  }
  out.tokens.reserve(records.size());
  out.labels.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const auto label = id_of.find(records[i].label);
    if (label == id_of.end())
      throw Error(ExitCode::data, detail::concat("record ", i, " has the label '", records[i].label,
                                                 "', which is not one of the ",
                                                 options.labels.size(), " labels given"));
    out.tokens.push_back(encode_framed(records[i].text, tokenizer, f));
    out.labels.push_back(label->second);
  }
  return out;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> split_rows_by_fraction(
    int64_t n, double val_fraction, uint64_t seed, std::string_view purpose) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(ExitCode::usage,
                detail::concat("val_fraction must be in [0, 1), got ", val_fraction));
  int64_t n_val = std::llround(static_cast<double>(n) * val_fraction);
  if (val_fraction > 0.0) {
    if (n < 2)
      throw Error(ExitCode::data, detail::concat("cannot hold out val_fraction ", val_fraction,
                                                 " of ", n, " records: need at least 2"));
    n_val = std::clamp<int64_t>(n_val, 1, n - 1);
  }
  const std::vector<int64_t> perm = philox_permutation(n, seed, rng_stream(purpose));
  std::vector<int64_t> val(perm.begin(), perm.begin() + n_val);
  std::vector<int64_t> train(perm.begin() + n_val, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::move(train), std::move(val)};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> split_rows_stratified(
    const std::vector<std::string>& labels, double val_fraction, uint64_t seed) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(ExitCode::usage,
                detail::concat("val_fraction must be in [0, 1), got ", val_fraction));
  std::map<std::string, std::vector<int64_t>> rows_of;
  for (size_t i = 0; i < labels.size(); ++i) rows_of[labels[i]].push_back(int64_t(i));
  std::vector<int64_t> train, val;
  for (const auto& [label, rows] : rows_of) {
    const auto n = static_cast<int64_t>(rows.size());
    int64_t n_val = std::llround(static_cast<double>(n) * val_fraction);
    if (val_fraction > 0.0) n_val = n < 2 ? 0 : std::clamp<int64_t>(n_val, 1, n - 1);
    const std::vector<int64_t> perm =
        philox_permutation(n, seed, rng_stream("record_split/" + label));
    for (int64_t k = 0; k < n; ++k)
      (k < n_val ? val : train).push_back(rows[static_cast<size_t>(perm[static_cast<size_t>(k)])]);
  }
  if (val_fraction > 0.0 && val.empty())
    throw Error(ExitCode::data,
                detail::concat("cannot hold out val_fraction ", val_fraction, " of ", labels.size(),
                               " records: no label has two records or more"));
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::move(train), std::move(val)};
}

RecordSplit split_records_by_fraction(const RecordDataset& dataset, double val_fraction,
                                      uint64_t seed) {
  std::vector<std::string> labels;
  labels.reserve(dataset.labels.size());
  for (int32_t l : dataset.labels) labels.push_back(dataset.label_names[static_cast<size_t>(l)]);
  const auto [train, val] = split_rows_stratified(labels, val_fraction, seed);
  return {select_rows(dataset, train), select_rows(dataset, val)};
}

uint64_t fingerprint_rows(const std::vector<std::vector<int32_t>>& rows, uint64_t h) {
  const auto n = static_cast<uint64_t>(rows.size());
  h = fnv1a64(&n, sizeof n, h);
  for (const auto& row : rows) {
    const uint64_t len = row.size();
    h = fnv1a64(&len, sizeof len, h);
    h = fnv1a64(row.data(), row.size() * sizeof(int32_t), h);
  }
  return h;
}

uint64_t fingerprint(const RecordDataset& dataset) {
  uint64_t h = fingerprint_rows(dataset.tokens);
  h = fnv1a64(dataset.labels.data(), dataset.labels.size() * sizeof(int32_t), h);
  for (const std::string& name : dataset.label_names) h = fnv1a64(name.c_str(), name.size() + 1, h);
  return h;
}

namespace {

std::string fingerprint_mismatch(uint64_t saved, uint64_t now) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "the training data changed since this checkpoint (fingerprint %016llx vs %016llx)",
                static_cast<unsigned long long>(saved), static_cast<unsigned long long>(now));
  return std::string(buf) + ": use a new output_dir or train.resume: never";
}

}  // namespace

std::map<std::string, int64_t> LoaderCursor::to_counters(const std::string& prefix) const {
  return {{prefix + "epoch", epoch},
          {prefix + "position", position},
          {prefix + "fingerprint", std::bit_cast<int64_t>(fingerprint)}};
}

LoaderCursor LoaderCursor::from_counters(const std::map<std::string, int64_t>& counters,
                                         const std::string& prefix,
                                         uint64_t expected_fingerprint) {
  auto get = [&](const std::string& key) {
    const auto it = counters.find(prefix + key);
    if (it == counters.end())
      throw Error(ExitCode::checkpoint,
                  detail::concat("checkpoint has no data cursor counter '", prefix + key, "'"));
    return it->second;
  };
  const auto saved = std::bit_cast<uint64_t>(get("fingerprint"));
  if (saved != expected_fingerprint)
    throw Error(ExitCode::checkpoint, fingerprint_mismatch(saved, expected_fingerprint));
  return {get("epoch"), get("position"), saved};
}

EpochSampler::EpochSampler(std::string name, int64_t num_rows, int64_t batch_size, uint64_t seed,
                           bool shuffle, bool drop_last, uint64_t fingerprint)
    : name_(std::move(name)),
      num_rows_(num_rows),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle),
      drop_last_(drop_last) {
  if (num_rows_ <= 0)
    throw Error(ExitCode::data, name_ + " loader: the dataset has no records");
  if (batch_size_ < 1)
    throw Error(ExitCode::usage,
                detail::concat(name_, " loader: batch_size must be at least 1, got ", batch_size_));
  if (drop_last_ && num_rows_ < batch_size_)
    throw Error(ExitCode::data, detail::concat(name_, " loader: ", num_rows_,
                                               " records cannot fill one batch of ", batch_size_,
                                               " with drop_last"));
  cursor_.fingerprint = fingerprint;
  enter_epoch(0);
}

bool EpochSampler::batch_fits(int64_t position) const {
  const int64_t left = num_rows_ - position;
  return position >= 0 && left >= (drop_last_ ? batch_size_ : 1);
}

void EpochSampler::enter_epoch(int64_t epoch) {
  order_ = epoch_order(epoch);
  cursor_.epoch = epoch;
  cursor_.position = 0;
}

std::vector<int64_t> EpochSampler::epoch_order(int64_t epoch) const {
  FORGE_CHECK(epoch >= 0, name_, " loader: epoch must be non-negative, got ", epoch);
  if (!shuffle_) {
    std::vector<int64_t> order(static_cast<size_t>(num_rows_));
    std::iota(order.begin(), order.end(), int64_t{0});
    return order;
  }
  return philox_permutation(num_rows_, seed_,
                            rng_stream(name_ + "_shuffle", static_cast<uint64_t>(epoch)));
}

int64_t EpochSampler::batches_per_epoch() const {
  return drop_last_ ? num_rows_ / batch_size_ : (num_rows_ + batch_size_ - 1) / batch_size_;
}

std::vector<int64_t> EpochSampler::next() {
  const int64_t count = std::min(batch_size_, num_rows_ - cursor_.position);
  std::vector<int64_t> rows(order_.begin() + cursor_.position,
                            order_.begin() + cursor_.position + count);
  cursor_.position += count;
  if (!batch_fits(cursor_.position)) enter_epoch(cursor_.epoch + 1);
  return rows;
}

std::vector<int64_t> EpochSampler::rows_at(int64_t first, int64_t count) const {
  if (first < 0 || first >= num_rows_ || count < 1)
    throw Error(ExitCode::usage, detail::concat(name_, " loader: no batch of ", count, " at row ",
                                                first, " of ", num_rows_));
  std::vector<int64_t> rows(static_cast<size_t>(std::min(count, num_rows_ - first)));
  std::iota(rows.begin(), rows.end(), first);
  return rows;
}

void EpochSampler::restore(const LoaderCursor& cursor) {
  if (cursor.fingerprint != cursor_.fingerprint)
    throw Error(ExitCode::checkpoint,
                fingerprint_mismatch(cursor.fingerprint, cursor_.fingerprint));
  if (cursor.epoch < 0 || !batch_fits(cursor.position))
    throw Error(ExitCode::checkpoint,
                detail::concat(name_, " loader: cursor (epoch ", cursor.epoch, ", position ",
                               cursor.position, ") does not start a batch of ", batch_size_,
                               " in a dataset of ", num_rows_, " records",
                               drop_last_ ? " (drop_last)" : ""));
  order_ = epoch_order(cursor.epoch);
  cursor_ = cursor;
}

RecordLoader::RecordLoader(std::shared_ptr<const RecordDataset> dataset, int64_t batch_size,
                           uint64_t seed, RecordLoaderOptions options)
    : dataset_(loader_dataset(std::move(dataset), "record")),
      options_(options),
      sampler_("record", dataset_->size(), batch_size, seed, options.shuffle, options.drop_last,
               fingerprint(*dataset_)) {}

RecordBatch RecordLoader::next() { return make_batch(*dataset_, sampler_.next(), options_.pad_id); }

RecordBatch RecordLoader::make_batch(const RecordDataset& dataset, std::vector<int64_t> rows,
                                     int32_t pad_id) {
  // [B, L] with L = the longest of the rows.
  RecordBatch batch;
  batch.indices = std::move(rows);
  const auto count = static_cast<int64_t>(batch.indices.size());
  std::vector<std::vector<int32_t>> tokens;
  tokens.reserve(static_cast<size_t>(count));
  batch.labels = empty({count}, DType::i64);
  int64_t* labels = batch.labels.data<int64_t>();
  for (int64_t b = 0; b < count; ++b) {
    const auto row = static_cast<size_t>(batch.indices[static_cast<size_t>(b)]);
    tokens.push_back(dataset.tokens.at(row));
    labels[b] = dataset.labels[row];
  }
  const int64_t width = longest_row(tokens);
  batch.ids = pad_rows(tokens, width, pad_id);
  batch.mask = padding_mask(tokens, width);
  return batch;
}

}  // namespace forge
