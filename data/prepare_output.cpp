// PreparedOutput (data/prepare_output.h): shards go through TokenDatasetWriter into the hidden
// directory, the manifest last, then one rename(2) (RENAME_EXCHANGE when replacing) publishes it.
#include "data/prepare_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/output_path.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhat = "prepare: --output";

std::string shard_file_name(size_t index) {
  char name[32];
  std::snprintf(name, sizeof name, "shard-%05zu.h5", index);
  return name;
}

// Whether `dir` is a shard dataset holding nothing but what prepare writes there, so that
// replacing it (--force) deletes nothing else.
bool holds_only_shards(const fs::path& dir) {
  if (!is_shard_directory(dir)) return false;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool shard = name.rfind("shard-", 0) == 0 &&
                       (name.ends_with(".h5") || name.ends_with(".h5.digest"));
    if ((!shard && name != kShardManifestName) || !fs::is_regular_file(it->symlink_status(ec)))
      return false;
  }
  return !ec;
}

[[noreturn]] void refuse(const fs::path& output, const std::string& why) {
  throw Error(ExitCode::usage,
              std::string(kWhat) + " " + quoted_path(output.string()) + ": " + why);
}

fs::path parent_of(const fs::path& path) {
  return path.parent_path().empty() ? fs::path(".") : path.parent_path();
}

// `.NAME.TAG-PID` beside `path`: hidden, and of this process alone.
fs::path hidden_sibling(const fs::path& path, const char* tag) {
  std::string name = ".";
  name.append(path.filename().string()).append(".").append(tag).append("-");
  name.append(std::to_string(::getpid()));
  return parent_of(path) / name;
}

// renameat2 with `flags`, or plain rename(2) where the file system knows no flags (EINVAL):
// replacing then takes two renames, leaving a moment with no output, never a partial one.
void publish(const fs::path& from, const fs::path& to, bool replace) {
  auto fail = [&](int err) {
    throw Error(ExitCode::data, quoted_path(to.string()) + ": cannot move " +
                                    quoted_path(from.string()) + " into place (" +
                                    std::strerror(err) + ")");
  };
  const fs::path old = hidden_sibling(to, "old");
  const unsigned flags = replace ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags) != 0) {
    if (errno != EINVAL) fail(errno);
    if (replace && ::rename(to.c_str(), old.c_str()) != 0) fail(errno);
    if (::rename(from.c_str(), to.c_str()) != 0) fail(errno);
  }
  // What was replaced now sits at `from` (exchanged) or `old`.
  std::error_code ec;
  if (replace) {
    fs::remove_all(from, ec);
    fs::remove_all(old, ec);
  }
}

}  // namespace

void check_prepare_output(const fs::path& output, const std::vector<fs::path>& inputs,
                          bool shards, bool overwrite) {
  check_output_path(kWhat, output, inputs, shards ? OutputShape::directory : OutputShape::file);
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(output, ec));
  if (exists && !overwrite) refuse(output, "exists (pass --force to replace it)");
  if (!shards) {
    // TokenDatasetWriter creates OUTPUT.tmp first: never one of the inputs.
    check_output_path(kWhat, output.string() + ".tmp", inputs, OutputShape::file);
    return;
  }
  if (!fs::is_directory(parent_of(output), ec))
    refuse(output, "no directory " + quoted_path(parent_of(output).string()));
  if (exists && !holds_only_shards(output))
    refuse(output, "is not a shard directory forge prepare wrote (it holds other files or no " +
                       std::string(kShardManifestName) + "); choose another output");
}

PreparedOutput::PreparedOutput(fs::path output, TokenizerInfo info, int64_t shard_tokens)
    : output_(std::move(output)), info_(std::move(info)), shard_tokens_(shard_tokens) {
  manifest_.tokenizer = info_;
  std::error_code ec;
  if (shard_tokens_ == 0) {
    // A link left at the temp name would have the writer truncate whatever it points to.
    const fs::path tmp = output_.string() + ".tmp";
    if (fs::is_symlink(tmp, ec)) fs::remove(tmp, ec);
    writer_ = std::make_unique<TokenDatasetWriter>(output_, info_);
    return;
  }
  // Only a prepare of this process id, killed, can have left this name: no live one owns it.
  partial_ = hidden_sibling(output_, "partial");
  fs::remove_all(partial_, ec);
  if (!fs::create_directory(partial_, ec))
    throw Error(ExitCode::data, quoted_path(partial_.string()) + ": cannot create (" +
                                    (ec ? ec.message() : "exists") + ")");
}

PreparedOutput::~PreparedOutput() {
  if (finished_) return;
  writer_.reset();
  std::error_code ec;
  if (!partial_.empty()) fs::remove_all(partial_, ec);
}

void PreparedOutput::open_shard() {
  writer_ = std::make_unique<TokenDatasetWriter>(
      partial_ / shard_file_name(manifest_.shards.size()), info_);
}

void PreparedOutput::add_document(const std::vector<int32_t>& ids) {
  if (!writer_) open_shard();
  writer_->add_document(ids);
  if (shard_tokens_ > 0 && writer_->num_tokens() >= shard_tokens_) close_shard();
}

void PreparedOutput::close_shard() {
  const std::string name = shard_file_name(manifest_.shards.size());
  writer_->finish();
  TokenShard shard{name, writer_->num_tokens(), writer_->num_documents(),
                   read_first_line(digest_path(partial_ / name))};
  writer_.reset();
  if (shard.bytes() < 0)
    throw Error(ExitCode::data, quoted_path(digest_path(partial_ / name).string()) +
                                    ": not the digest the writer just wrote");
  manifest_.shards.push_back(std::move(shard));
}

void PreparedOutput::finish() {
  if (shard_tokens_ == 0) {
    writer_->finish();
    finished_ = true;
    return;
  }
  if (!writer_ && manifest_.shards.empty()) open_shard();
  if (writer_) close_shard();
  write_shard_manifest(partial_, manifest_);
  std::error_code ec;
  publish(partial_, output_, fs::exists(fs::symlink_status(output_, ec)));
  fsync_path(parent_of(output_), true, ExitCode::data);
  finished_ = true;
}

}  // namespace forge
