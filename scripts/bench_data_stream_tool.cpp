// The C++ side of scripts/bench_data_stream.sh: writes a synthetic token dataset (random bytes-
// tokenizer ids stored as uint16, documents of 64 to 4095 ids) as one file or as a shard directory,
// the way forge prepare leaves them (digest sidecars, manifest last), and times the validation a
// training run does when it opens one.
//   bench_data_stream_tool write OUT TOKENS [SHARD_TOKENS]   (a directory when SHARD_TOKENS is given)
//   bench_data_stream_tool text OUT TOKENS                   (the ids of `write OUT TOKENS` as bytes)
//   bench_data_stream_tool open PATH                         (prints open_s=S tokens=N files=F)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/token_dataset.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using namespace forge;

namespace {

// A fixed 64-bit LCG: the same ids for `write` and `text` at any size.
struct Ids {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  uint32_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  }
  // The next document, its ids truncated to what is left of `left`.
  void document(std::vector<int32_t>& doc, int64_t left) {
    doc.resize(size_t(std::min<int64_t>(64 + next() % 4032, left)));
    for (int32_t& id : doc) id = int32_t(next() & 0xff);
  }
};

TokenizerInfo bytes_info() {
  auto t = make_tokenizer("bytes");
  return {t->name(), t->vocab_size(), vocabulary_hash(*t)};
}

int write(const fs::path& out, int64_t tokens, int64_t shard_tokens) {
  Ids ids;
  std::vector<int32_t> doc;
  const TokenizerInfo info = bytes_info();
  if (shard_tokens <= 0) {
    TokenDatasetWriter w(out, info);
    for (int64_t left = tokens; left > 0; left -= int64_t(doc.size())) {
      ids.document(doc, left);
      w.add_document(doc);
    }
    w.finish();
    return 0;
  }
  fs::create_directories(out);
  ShardManifest m;
  m.tokenizer = info;
  for (int64_t left = tokens; left > 0;) {
    const std::string name = "shard-" + std::to_string(m.shards.size()) + ".h5";
    TokenDatasetWriter w(out / name, info);
    for (int64_t in_shard = std::min(shard_tokens, left); in_shard > 0;
         in_shard -= int64_t(doc.size())) {
      ids.document(doc, in_shard);
      w.add_document(doc);
    }
    w.finish();
    left -= w.num_tokens();
    m.shards.push_back({name, w.num_tokens(), w.num_documents(),
                        read_first_line(digest_path(out / name))});
    std::fprintf(stderr, "\rbench_data_stream_tool: %zu shards, %.1f GB", m.shards.size(),
                 double(tokens - left) * 2e-9);
  }
  std::fprintf(stderr, "\n");
  write_shard_manifest(out, m);
  return 0;
}

int text(const fs::path& out, int64_t tokens) {
  Ids ids;
  std::vector<int32_t> doc;
  std::ofstream f(out, std::ios::binary);
  for (int64_t left = tokens; left > 0; left -= int64_t(doc.size())) {
    ids.document(doc, left);
    std::string bytes(doc.begin(), doc.end());
    f << bytes;
  }
  return f ? 0 : 1;
}

int open(const fs::path& path) {
  const TokenizerInfo info = bytes_info();
  const auto t0 = std::chrono::steady_clock::now();
  TokenDatasetReader r = open_token_dataset_reader(path, &info, 256);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("open_s=%.2f tokens=%lld files=%lld\n", s, (long long)r.num_tokens(),
              (long long)r.num_files());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "write" && (argc == 4 || argc == 5))
      return write(argv[2], std::atoll(argv[3]), argc == 5 ? std::atoll(argv[4]) : 0);
    if (mode == "text" && argc == 4) return text(argv[2], std::atoll(argv[3]));
    if (mode == "open" && argc == 3) return open(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_data_stream_tool: %s\n", e.what());
    return int(e.code());
  }
  std::fprintf(stderr,
               "usage: bench_data_stream_tool write OUT TOKENS [SHARD_TOKENS] | text OUT TOKENS | "
               "open PATH\n");
  return 2;
}
