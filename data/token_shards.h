// A sharded token dataset: a directory of forge-tokens files (docs/data-format.md) and the
// manifest.json that lists them in order with their sizes and digests. `forge prepare` writes the
// manifest last and renames the whole directory into place, so a directory without a manifest is
// never a dataset, and a shard missing, truncated or swapped since is named before training reads it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/token_dataset.h"

namespace forge {

inline constexpr const char* kShardManifestName = "manifest.json";
inline constexpr int64_t kShardManifestFormatVersion = 1;

/// One shard: a file of the directory, as the writer left it.
struct TokenShard {
  std::string file;  ///< a plain file name inside the directory
  int64_t num_tokens = 0;
  int64_t num_documents = 0;
  std::string digest;  ///< file_digest() of the shard: "crc32:<8 hex>:<bytes>"

  /// The size the digest records.
  int64_t bytes() const;
  bool operator==(const TokenShard&) const = default;
};

struct ShardManifest {
  TokenizerInfo tokenizer;
  std::vector<TokenShard> shards;  ///< in order: the dataset is their documents end to end

  int64_t num_tokens() const;
  int64_t num_documents() const;
};

/// Writes `dir`/manifest.json atomically and durably. Call after every shard is complete.
void write_shard_manifest(const std::filesystem::path& dir, const ShardManifest& manifest);

/// Whether `path` is a directory holding a manifest.json (what the readers take as a sharded
/// dataset rather than one file).
bool is_shard_directory(const std::filesystem::path& path);

/// Reads and validates `dir`/manifest.json: Error(data) "<dir>/manifest.json: ..." naming the key
/// for a missing or malformed field, a format or newer version it does not know, no shards, a file
/// name that is not a plain name inside the directory or appears twice, negative counts or totals
/// that overflow. The shards themselves are not opened (check_shard_files does that cheaply).
ShardManifest read_shard_manifest(const std::filesystem::path& dir);

/// Error(data) naming the first shard of `manifest` that is missing from `dir` or whose size is not
/// the one its digest records (truncated, or replaced), without reading the shards' contents.
void check_shard_files(const std::filesystem::path& dir, const ShardManifest& manifest);

}  // namespace forge
