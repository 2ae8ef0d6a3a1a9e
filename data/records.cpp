// Record datasets and their loader. Both the split and every epoch's order are Fisher-Yates
// shuffles driven by Philox counters, so a permutation is a pure function of (seed, purpose,
// epoch): nothing about past batches has to be stored or replayed to continue a run.
#include "data/records.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/batch.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

// 0..n-1 shuffled by Fisher-Yates; swap i draws from Philox block i of `stream`. The modulo's
// bias is below n / 2^64, far under anything a dataset size can show.
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
    if (ec) throw Error(ExitCode::data, p.string() + ": cannot list (" + ec.message() + ")");
    if (found.empty()) throw Error(ExitCode::data, p.string() + ": no *.txt files in directory");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ExitCode::data, path.string() + ": cannot open for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw Error(ExitCode::data, path.string() + ": read error");
  return buffer.str();
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
    const std::string text = read_text(file);
    const std::string label = file.stem().string();
    for (std::string_view record : split_records(text, format))
      records.push_back({std::string(record), label});
  }
  return records;
}

RecordDataset tokenize_records(const std::vector<TextRecord>& records, const Tokenizer& tokenizer,
                               const RecordTokenizeOptions& options) {
  const std::vector<int32_t> head = special_ids(options.prepend, tokenizer);
  const std::vector<int32_t> tail = special_ids(options.append, tokenizer);
  const auto framing = static_cast<int64_t>(head.size() + tail.size());
  if (options.max_len < 0 || (options.max_len > 0 && options.max_len <= framing))
    throw Error(ExitCode::usage,
                detail::concat("max_len ", options.max_len, " leaves no room for text next to ",
                               framing, " special tokens"));
  const int64_t max_text = options.max_len > 0 ? options.max_len - framing : INT64_MAX;

  RecordDataset out;
  for (const TextRecord& r : records) out.label_names.push_back(r.label);
  std::sort(out.label_names.begin(), out.label_names.end());
  out.label_names.erase(std::unique(out.label_names.begin(), out.label_names.end()),
                        out.label_names.end());
  out.tokens.reserve(records.size());
  out.labels.reserve(records.size());
  for (const TextRecord& r : records) {
    std::vector<int32_t> text = tokenizer.encode(r.text);
    if (static_cast<int64_t>(text.size()) > max_text) text.resize(static_cast<size_t>(max_text));
    std::vector<int32_t> row = head;
    row.insert(row.end(), text.begin(), text.end());
    row.insert(row.end(), tail.begin(), tail.end());
    out.tokens.push_back(std::move(row));
    const auto label = std::lower_bound(out.label_names.begin(), out.label_names.end(), r.label);
    out.labels.push_back(static_cast<int32_t>(label - out.label_names.begin()));
  }
  return out;
}

RecordSplit split_records_by_fraction(const RecordDataset& dataset, double val_fraction,
                                      uint64_t seed) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw Error(ExitCode::usage,
                detail::concat("val_fraction must be in [0, 1), got ", val_fraction));
  const int64_t n = dataset.size();
  int64_t n_val = std::llround(static_cast<double>(n) * val_fraction);
  if (val_fraction > 0.0) {
    if (n < 2)
      throw Error(ExitCode::data, detail::concat("cannot hold out val_fraction ", val_fraction,
                                                 " of ", n, " records: need at least 2"));
    n_val = std::clamp<int64_t>(n_val, 1, n - 1);
  }
  const std::vector<int64_t> perm = philox_permutation(n, seed, rng_stream("record_split"));
  std::vector<int64_t> val(perm.begin(), perm.begin() + n_val);
  std::vector<int64_t> train(perm.begin() + n_val, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {select_rows(dataset, train), select_rows(dataset, val)};
}

std::map<std::string, int64_t> LoaderCursor::to_counters(const std::string& prefix) const {
  return {{prefix + "epoch", epoch}, {prefix + "position", position}};
}

LoaderCursor LoaderCursor::from_counters(const std::map<std::string, int64_t>& counters,
                                         const std::string& prefix) {
  auto get = [&](const std::string& key) {
    const auto it = counters.find(prefix + key);
    if (it == counters.end())
      throw Error(ExitCode::checkpoint,
                  detail::concat("checkpoint has no data cursor counter '", prefix + key, "'"));
    return it->second;
  };
  return {get("epoch"), get("position")};
}

RecordLoader::RecordLoader(std::shared_ptr<const RecordDataset> dataset, int64_t batch_size,
                           uint64_t seed, RecordLoaderOptions options)
    : dataset_(std::move(dataset)), batch_size_(batch_size), seed_(seed), options_(options) {
  if (!dataset_ || dataset_->size() == 0)
    throw Error(ExitCode::data, "record loader: the dataset has no records");
  if (batch_size_ < 1)
    throw Error(ExitCode::usage,
                detail::concat("record loader: batch_size must be at least 1, got ", batch_size_));
  if (options_.drop_last && dataset_->size() < batch_size_)
    throw Error(ExitCode::data, detail::concat("record loader: ", dataset_->size(),
                                               " records cannot fill one batch of ", batch_size_,
                                               " with drop_last"));
  enter_epoch(0);
}

bool RecordLoader::batch_fits(int64_t position) const {
  const int64_t left = dataset_->size() - position;
  return position >= 0 && left >= (options_.drop_last ? batch_size_ : 1);
}

void RecordLoader::enter_epoch(int64_t epoch) {
  order_ = epoch_order(epoch);
  cursor_ = {epoch, 0};
}

std::vector<int64_t> RecordLoader::epoch_order(int64_t epoch) const {
  FORGE_CHECK(epoch >= 0, "record loader: epoch must be non-negative, got ", epoch);
  if (!options_.shuffle) {
    std::vector<int64_t> order(static_cast<size_t>(dataset_->size()));
    std::iota(order.begin(), order.end(), int64_t{0});
    return order;
  }
  return philox_permutation(dataset_->size(), seed_,
                            rng_stream("record_shuffle", static_cast<uint64_t>(epoch)));
}

int64_t RecordLoader::batches_per_epoch() const {
  const int64_t n = dataset_->size();
  return options_.drop_last ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

RecordBatch RecordLoader::next() {
  // [B, L] with B = batch_size_ (or the rows left in the epoch), L = the longest of those rows.
  const int64_t count = std::min(batch_size_, dataset_->size() - cursor_.position);
  RecordBatch batch;
  batch.indices.assign(order_.begin() + cursor_.position,
                       order_.begin() + cursor_.position + count);
  std::vector<std::vector<int32_t>> rows;
  rows.reserve(static_cast<size_t>(count));
  batch.labels = empty({count}, DType::i64);
  int64_t* labels = batch.labels.data<int64_t>();
  for (int64_t b = 0; b < count; ++b) {
    const auto row = static_cast<size_t>(batch.indices[static_cast<size_t>(b)]);
    rows.push_back(dataset_->tokens[row]);
    labels[b] = dataset_->labels[row];
  }
  const int64_t width = longest_row(rows);
  batch.ids = pad_rows(rows, width, options_.pad_id);
  batch.mask = padding_mask(rows, width);

  cursor_.position += count;
  if (!batch_fits(cursor_.position)) enter_epoch(cursor_.epoch + 1);
  return batch;
}

void RecordLoader::restore(const LoaderCursor& cursor) {
  if (cursor.epoch < 0 || !batch_fits(cursor.position))
    throw Error(ExitCode::checkpoint,
                detail::concat("record loader: cursor (epoch ", cursor.epoch, ", position ",
                               cursor.position, ") does not start a batch of ", batch_size_,
                               " in a dataset of ", dataset_->size(), " records",
                               options_.drop_last ? " (drop_last)" : ""));
  order_ = epoch_order(cursor.epoch);
  cursor_ = cursor;
}

}  // namespace forge
