// The shard manifest of a sharded token dataset: its round trip, each malformed field refused with
// the key named (exit 3), names that would leave the directory, and shard files that are missing
// or whose size is not the recorded one.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/durable_file.h"
#include "data/token_shards.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

ShardManifest two_shards(const fs::path& dir) {
  ShardManifest m;
  m.tokenizer = {"bytes", 256, "00000000000000ff"};
  for (int i = 0; i < 2; ++i) {
    const std::string name = "shard-0000" + std::to_string(i) + ".h5";
    TokenDatasetWriter w(dir / name, m.tokenizer);
    w.add_document({1, 2, 3});
    if (i == 1) w.add_document({4, 5});
    w.finish();
    m.shards.push_back({name, w.num_tokens(), w.num_documents(),
                        file_digest(dir / name, ExitCode::data)});
  }
  return m;
}

TEST(TokenShards, ManifestRoundTrips) {
  TempDir tmp;
  ShardManifest m = two_shards(tmp.path());
  EXPECT_FALSE(is_shard_directory(tmp.path()));
  write_shard_manifest(tmp.path(), m);
  EXPECT_TRUE(is_shard_directory(tmp.path()));
  ShardManifest back = read_shard_manifest(tmp.path());
  EXPECT_EQ(back.tokenizer.name, "bytes");
  EXPECT_EQ(back.tokenizer.vocab_size, 256);
  EXPECT_EQ(back.tokenizer.vocab_hash, "00000000000000ff");
  EXPECT_EQ(back.shards, m.shards);
  EXPECT_EQ(back.num_tokens(), 8);
  EXPECT_EQ(back.num_documents(), 3);
  EXPECT_GT(back.shards[0].bytes(), 0);
  check_shard_files(tmp.path(), back);
}

// Replaces the first occurrence of `from` in the manifest text.
void edit_manifest(const fs::path& dir, const std::string& from, const std::string& to) {
  std::string text = testing::read_file(dir / kShardManifestName);
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  testing::write_file(dir / kShardManifestName, text);
}

TEST(TokenShards, MalformedManifestsNameTheKey) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {"\"forge-token-shards\"", "\"forge-tokens\"", "format is not 'forge-token-shards'"},
      {"\"format_version\": 1", "\"format_version\": 7", "format_version 7 is newer"},
      {"\"vocab_size\": 256", "\"vocab_size\": -1", "vocab_size must be a non-negative integer"},
      {"\"vocab_size\": 256", "\"vocab_size\": 0", "implausible vocab_size 0"},
      {"\"num_tokens\": 3", "\"num_tokens\": \"3\"", "shards[0].num_tokens must be a non-negative"},
      {"\"file\": \"shard-00000.h5\"", "\"file\": \"../x.h5\"", "shards[0].file ../x.h5 is not a plain"},
      {"\"file\": \"shard-00001.h5\"", "\"file\": \"shard-00000.h5\"", "shards[1].file shard-00000.h5 is listed twice"},
      {"\"digest\": \"crc32:", "\"digest\": \"md5:", "shards[0].digest 'md5:"},
      {"\"num_documents\": 3", "\"num_documents\": 4", "num_tokens / num_documents (8 / 4) are not the shards' sums (8 / 3)"},
      {"\"tokenizer\": \"bytes\"", "\"tokenizer_name\": \"bytes\"", "missing key tokenizer"},
      {"\"shards\": [", "\"shards\": 5, \"x\": [", "shards must be a non-empty array"},
      {"{", "[", "not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    TempDir tmp;
    write_shard_manifest(tmp.path(), two_shards(tmp.path()));
    edit_manifest(tmp.path(), c.from, c.to);
    expect_error(ExitCode::data, "manifest.json: " + c.message,
                 [&] { read_shard_manifest(tmp.path()); });
  }
}

TEST(TokenShards, MissingOrResizedShardsAreNamed) {
  TempDir tmp;
  ShardManifest m = two_shards(tmp.path());
  const fs::path second = tmp.path() / "shard-00001.h5";
  const auto size = fs::file_size(second);
  fs::resize_file(second, size - 1);
  expect_error(ExitCode::data,
               "shard-00001.h5: " + std::to_string(size - 1) + " bytes, but manifest.json records " +
                   std::to_string(size),
               [&] { check_shard_files(tmp.path(), m); });
  expect_error(ExitCode::data, "(truncated, or replaced since)",
               [&] { check_shard_files(tmp.path(), m); });
  fs::remove(tmp.path() / "shard-00000.h5");
  expect_error(ExitCode::data, "shard-00000.h5: missing (shard 0 of 2 in manifest.json)",
               [&] { check_shard_files(tmp.path(), m); });
}

}  // namespace
}  // namespace forge
