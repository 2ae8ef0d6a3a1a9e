// The shard manifest of data/token_shards.h: written with nlohmann-json, read through the bounded
// parser with every field checked before it is used.
#include "data/token_shards.h"

#include <limits>

#include "core/bounded_json.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"

namespace forge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kManifestFormat = "forge-token-shards";
// Millions of shards would still fit; a larger file is not a manifest Forge wrote.
constexpr InputKind kManifestInput{"shard manifest", 256 * kMiB, ExitCode::data};

// The byte count of a "crc32:<8 hex>:<bytes>" digest, or -1 when it is not one.
int64_t digest_bytes(const std::string& digest) {
  if (digest.size() < 16 || digest.rfind("crc32:", 0) != 0 || digest[14] != ':') return -1;
  for (size_t i = 6; i < 14; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(digest[i]))) return -1;
  const std::string count = digest.substr(15);
  if (count.empty() || count.size() > 18) return -1;
  for (char c : count)
    if (c < '0' || c > '9') return -1;
  return std::stoll(count);
}

struct ManifestReader {
  std::string name;  // "<dir>/manifest.json", quoted for messages

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ExitCode::data, name + ": " + what);
  }
  const json& field(const json& object, const char* key, const std::string& where) const {
    auto it = object.find(key);
    if (it == object.end()) fail("missing key " + where + key);
    return *it;
  }
  std::string string(const json& object, const char* key, const std::string& where = "") const {
    const json& v = field(object, key, where);
    if (!v.is_string()) fail(where + key + " must be a string");
    return v.get<std::string>();
  }
  int64_t count(const json& object, const char* key, const std::string& where = "") const {
    const json& v = field(object, key, where);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
        v.get<int64_t>() < 0)
      fail(where + key + " must be a non-negative integer");
    return v.get<int64_t>();
  }
};

}  // namespace

int64_t TokenShard::bytes() const { return digest_bytes(digest); }

int64_t ShardManifest::num_tokens() const {
  int64_t n = 0;
  for (const TokenShard& s : shards) n += s.num_tokens;
  return n;
}

int64_t ShardManifest::num_documents() const {
  int64_t n = 0;
  for (const TokenShard& s : shards) n += s.num_documents;
  return n;
}

void write_shard_manifest(const fs::path& dir, const ShardManifest& manifest) {
  json shards = json::array();
  for (const TokenShard& s : manifest.shards)
    shards.push_back({{"file", s.file},
                      {"num_tokens", s.num_tokens},
                      {"num_documents", s.num_documents},
                      {"digest", s.digest}});
  json j = {{"format", kManifestFormat},
            {"format_version", kShardManifestFormatVersion},
            {"tokenizer", manifest.tokenizer.name},
            {"vocab_size", manifest.tokenizer.vocab_size},
            {"vocab_hash", manifest.tokenizer.vocab_hash},
            {"num_tokens", manifest.num_tokens()},
            {"num_documents", manifest.num_documents()},
            {"shards", std::move(shards)}};
  write_file_atomic(dir / kShardManifestName, j.dump(1) + "\n", ExitCode::data);
}

bool is_shard_directory(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / kShardManifestName, ec);
}

ShardManifest read_shard_manifest(const fs::path& dir) {
  const fs::path file = dir / kShardManifestName;
  const ManifestReader r{quoted_path(file.string())};
  const std::string text = read_input_file(file.string(), kManifestInput);
  json j;
  try {
    j = parse_bounded_json(text);
  } catch (const json::exception& e) {
    r.fail(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) r.fail("must be a JSON object");
  if (r.string(j, "format") != kManifestFormat)
    r.fail("format is not '" + std::string(kManifestFormat) + "'");
  const int64_t version = r.count(j, "format_version");
  if (version > kShardManifestFormatVersion)
    r.fail(detail::concat("format_version ", version, " is newer than this build of forge reads (",
                          kShardManifestFormatVersion, "); upgrade forge"));
  if (version < 1) r.fail(detail::concat("unknown format_version ", version));

  ShardManifest m;
  m.tokenizer.name = r.string(j, "tokenizer");
  m.tokenizer.vocab_size = r.count(j, "vocab_size");
  m.tokenizer.vocab_hash = r.string(j, "vocab_hash");
  if (m.tokenizer.vocab_size == 0 || m.tokenizer.vocab_size > int64_t(INT32_MAX) + 1)
    r.fail(detail::concat("implausible vocab_size ", m.tokenizer.vocab_size));
  const json& shards = r.field(j, "shards", "");
  if (!shards.is_array() || shards.empty()) r.fail("shards must be a non-empty array");
  std::vector<std::string> names;
  int64_t tokens = 0, documents = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string where = "shards[" + std::to_string(i) + "].";
    if (!shards[i].is_object()) r.fail(where.substr(0, where.size() - 1) + " must be an object");
    TokenShard s;
    s.file = r.string(shards[i], "file", where);
    // A name that leaves the directory would let a manifest point training at any file.
    if (s.file.empty() || s.file == "." || s.file == ".." ||
        s.file.find_first_of("/\\") != std::string::npos || s.file.find('\0') != std::string::npos)
      r.fail(where + "file " + quoted_path(s.file) + " is not a plain file name in the directory");
    for (const std::string& seen : names)
      if (seen == s.file) r.fail(where + "file " + quoted_path(s.file) + " is listed twice");
    names.push_back(s.file);
    s.num_tokens = r.count(shards[i], "num_tokens", where);
    s.num_documents = r.count(shards[i], "num_documents", where);
    s.digest = r.string(shards[i], "digest", where);
    if (s.bytes() < 0)
      r.fail(where + "digest '" + s.digest + "' is not crc32:<8 hex digits>:<bytes>");
    if (s.num_tokens > std::numeric_limits<int64_t>::max() - tokens ||
        s.num_documents > std::numeric_limits<int64_t>::max() - documents)
      r.fail(where + "num_tokens or num_documents overflows the total");
    tokens += s.num_tokens;
    documents += s.num_documents;
    m.shards.push_back(std::move(s));
  }
  if (r.count(j, "num_tokens") != tokens || r.count(j, "num_documents") != documents)
    r.fail(detail::concat("num_tokens / num_documents (", j["num_tokens"].dump(), " / ",
                          j["num_documents"].dump(), ") are not the shards' sums (", tokens, " / ",
                          documents, ")"));
  return m;
}

void check_shard_files(const fs::path& dir, const ShardManifest& manifest) {
  for (size_t i = 0; i < manifest.shards.size(); ++i) {
    const TokenShard& s = manifest.shards[i];
    const fs::path file = dir / s.file;
    const std::string name = quoted_path(file.string());
    std::error_code ec;
    const fs::file_status status = fs::status(file, ec);
    if (!fs::exists(status))
      throw Error(ExitCode::data, detail::concat(name, ": missing (shard ", i, " of ",
                                                 manifest.shards.size(), " in ",
                                                 kShardManifestName, ")"));
    if (!fs::is_regular_file(status))
      throw Error(ExitCode::data, name + ": not a regular file");
    const auto size = int64_t(fs::file_size(file, ec));
    if (ec) throw Error(ExitCode::data, name + ": cannot read (" + ec.message() + ")");
    if (size != s.bytes())
      throw Error(ExitCode::data,
                  detail::concat(name, ": ", size, " bytes, but ", kShardManifestName,
                                 " records ", s.bytes(), " (truncated, or replaced since)"));
  }
}

}  // namespace forge
