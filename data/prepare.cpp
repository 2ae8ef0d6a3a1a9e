// One document at a time: the corpus is read file by file and never held tokenized in memory; the
// writer streams ids into the dataset.
#include "data/prepare.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
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
  for (const fs::path& in : inputs) {
    const std::string text = read_input_file(in.string(), kCorpusInput);
    for (std::string_view doc : split_records(text, format)) {
      std::vector<int32_t> ids = tokenizer.encode(doc);
      writer.add_document(ids);
      stats.documents++;
      stats.tokens += int64_t(ids.size());
      if (progress) progress(stats.bytes + int64_t(doc.data() + doc.size() - text.data()), total);
    }
    stats.files++;
    stats.bytes += int64_t(text.size());
  }
  writer.finish();
  if (progress) progress(total, total);
  return stats;
}

}  // namespace forge
