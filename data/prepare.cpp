// Files are read one at a time into batches of documents; each batch is encoded on every core
// (OpenMP; a large document in parts its tokenizer may encode apart) and written in input order,
// so the dataset holds what one thread writes, and memory holds one batch's text and ids rather
// than the corpus.
#include "data/prepare.h"

#include <deque>
#include <exception>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/kernels/parallel.h"
#include "data/token_dataset.h"

namespace forge {

namespace fs = std::filesystem;

RecordFormat parse_record_format(const std::string& name) {
  if (name == "file") return RecordFormat::file;
  if (name == "percent") return RecordFormat::percent;
  if (name == "lines") return RecordFormat::lines;
  throw Error(ExitCode::usage,
              "--records: expected file, percent or lines, got '" + name + "'");
}

std::vector<std::string_view> split_records(std::string_view text, RecordFormat format) {
  std::vector<std::string_view> docs;
  auto keep = [&docs](std::string_view d) {
    if (d.find_first_not_of(" \t\r\n") != std::string_view::npos) docs.push_back(d);
  };
  if (format == RecordFormat::file) {
    keep(text);
    return docs;
  }
  // Lines, or records ended by a line holding only '%' (the record keeps its final newline).
  size_t begin = 0, pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (format == RecordFormat::lines) {
      keep(line);
    } else if (line == "%" || line == "%\r") {
      keep(text.substr(begin, pos - begin));
      begin = std::min(end + 1, text.size());
    }
    pos = end + 1;
  }
  if (format == RecordFormat::percent) keep(text.substr(begin));
  return docs;
}

namespace {

// Text per thread in a batch: enough that every core has documents to take (dynamic scheduling
// evens out their lengths), little enough that a batch's text and ids stay a small fraction of
// memory. A batch ends with the file that fills it, however large.
constexpr int64_t kBatchBytesPerThread = int64_t(4) << 20;

// Documents waiting to be encoded: views into the files' texts, which the batch owns (in a deque:
// adding a text never moves the others, whose short strings a move would relocate).
struct Batch {
  std::deque<std::string> texts;
  std::vector<std::string_view> docs;
  std::vector<int64_t> done;  // bytes of input behind each document, for progress
  int64_t bytes = 0;
};

// A document longer than this goes to the threads in parts of about this size, cut where its
// tokenizer allows (Tokenizer::independent_cuts), so one large file also spreads over the cores.
constexpr size_t kPartBytes = size_t(256) << 10;

// Encodes the batch's documents (or their parts) in parallel, then writes them in order. An
// exception is rethrown for the first part that failed, as a serial loop would meet it.
void encode_and_write(const Tokenizer& tokenizer, Batch& batch, TokenDatasetWriter& writer,
                      PrepareStats& stats, int64_t total,
                      const std::function<void(int64_t, int64_t)>& progress) {
  std::vector<std::string_view> parts;
  std::vector<size_t> first_part;  // document i is parts [first_part[i], first_part[i + 1])
  for (std::string_view doc : batch.docs) {
    first_part.push_back(parts.size());
    size_t begin = 0;
    if (doc.size() > kPartBytes)
      for (size_t cut : tokenizer.independent_cuts(doc, kPartBytes)) {
        parts.push_back(doc.substr(begin, cut - begin));
        begin = cut;
      }
    parts.push_back(doc.substr(begin));
  }
  first_part.push_back(parts.size());

  const int64_t n = int64_t(parts.size());
  std::vector<std::vector<int32_t>> ids(parts.size());
  std::vector<std::exception_ptr> errors(parts.size());
  kernels::parallel_for(n, [&](int64_t i) {
    try {
      ids[size_t(i)] = tokenizer.encode(parts[size_t(i)]);
    } catch (...) {
      errors[size_t(i)] = std::current_exception();
    }
  });
  std::vector<int32_t> doc_ids;
  for (size_t d = 0; d < batch.docs.size(); ++d) {
    doc_ids.clear();
    for (size_t p = first_part[d]; p < first_part[d + 1]; ++p) {
      if (errors[p]) std::rethrow_exception(errors[p]);
      doc_ids.insert(doc_ids.end(), ids[p].begin(), ids[p].end());
      std::vector<int32_t>().swap(ids[p]);
    }
    writer.add_document(doc_ids);
    stats.documents++;
    stats.tokens += int64_t(doc_ids.size());
    if (progress) progress(batch.done[d], total);
  }
  batch = Batch();
}

}  // namespace

PrepareStats prepare_dataset(const Tokenizer& tokenizer, const std::vector<fs::path>& inputs,
                             RecordFormat format, const fs::path& output,
                             const std::function<void(int64_t, int64_t)>& progress,
                             bool overwrite) {
  PrepareStats stats;
  int64_t total = 0;
  std::error_code ec;
  const fs::file_status out_status = fs::status(output, ec);
  for (const fs::path& in : inputs) {
    const fs::file_status status = fs::status(in, ec);
    if (!fs::exists(status))
      throw Error(ExitCode::data, quoted_path(in.string()) + ": no such file");
    // A FIFO or a device would block or never end; only files have a size to read.
    if (!fs::is_regular_file(status))
      throw Error(ExitCode::data, quoted_path(in.string()) + ": not a regular file");
    if (fs::exists(out_status) && fs::equivalent(in, output, ec))
      throw Error(ExitCode::usage, quoted_path(output.string()) +
                                       ": the output is also an input; choose "
                                       "another --output");
    auto size = fs::file_size(in, ec);
    if (ec)
      throw Error(ExitCode::data,
                  quoted_path(in.string()) + ": cannot read (" + ec.message() + ")");
    total += int64_t(size);
  }
  if (fs::exists(out_status) && !fs::is_regular_file(out_status))
    throw Error(ExitCode::usage,
                quoted_path(output.string()) + ": exists and is not a regular file");
  if (fs::exists(out_status) && !overwrite)
    throw Error(ExitCode::usage,
                quoted_path(output.string()) + ": exists (pass --force to replace it)");
  TokenDatasetWriter writer(output,
                            {tokenizer.name(), tokenizer.vocab_size(), vocabulary_hash(tokenizer)});
  const int64_t batch_bytes = kBatchBytesPerThread * kernels::max_threads();
  Batch batch;
  for (const fs::path& in : inputs) {
    batch.texts.push_back(read_input_file(in.string(), kCorpusInput));
    const std::string& text = batch.texts.back();
    for (std::string_view doc : split_records(text, format)) {
      batch.docs.push_back(doc);
      batch.done.push_back(stats.bytes + int64_t(doc.data() + doc.size() - text.data()));
    }
    stats.files++;
    stats.bytes += int64_t(text.size());
    batch.bytes += int64_t(text.size());
    if (batch.bytes >= batch_bytes)
      encode_and_write(tokenizer, batch, writer, stats, total, progress);
  }
  encode_and_write(tokenizer, batch, writer, stats, total, progress);
  writer.finish();
  if (progress) progress(total, total);
  return stats;
}

}  // namespace forge
