// Text files -> an HDF5 token dataset (data/token_dataset.h). Each input splits into documents
// one of three ways: the whole file, '%'-separated records (the fortunes format) or one record per
// line; documents stay separate in the dataset so splits never cut one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace forge {

enum class RecordFormat { file, percent, lines };

/// "file", "percent" or "lines"; throws Error(usage) listing the choices otherwise.
RecordFormat parse_record_format(const std::string& name);

/// The documents of `text` under `format` (empty records are dropped).
std::vector<std::string_view> split_records(std::string_view text, RecordFormat format);

struct PrepareStats {
  int64_t files = 0, documents = 0, tokens = 0, bytes = 0;
};

/// Tokenizes `inputs` into `output`, encoding documents on every OpenMP thread (the tokenizer's
/// encode() is called concurrently) and writing them in input order, so the dataset holds the same
/// tokens whatever the thread count. `progress(bytes_done, bytes_total)` is called as documents
/// are written. Nothing that exists is replaced unless asked: Error(usage) when `output` is one of
/// the inputs, exists as anything but a regular file, or exists at all without `overwrite`; checked
/// before anything is written. Throws Error(data) naming an input that is missing, not a regular
/// file (a FIFO, a device) or unreadable.
PrepareStats prepare_dataset(const Tokenizer& tokenizer, const std::vector<std::filesystem::path>& inputs,
                             RecordFormat format, const std::filesystem::path& output,
                             const std::function<void(int64_t, int64_t)>& progress = {},
                             bool overwrite = false);

}  // namespace forge
