// The C++ side of scripts/bench_data_stream.sh: writes a synthetic token dataset (random bytes-
// tokenizer ids stored as uint16, documents of 64 to 4095 ids) as one file or as a shard directory,
// the way forge prepare leaves them (digest sidecars, manifest last), and times the validation a
// training run does when it opens one.
//   bench_data_stream_tool write OUT TOKENS [SHARD_TOKENS]   (a directory when SHARD_TOKENS is given)
//   bench_data_stream_tool text OUT TOKENS                   (the ids of `write OUT TOKENS` as bytes)
//   bench_data_stream_tool open PATH                         (prints open_s=S tokens=N files=F)
//   bench_data_stream_tool sample DATASET TEXT T B STEPS     (microseconds per batch of B windows
//                                                             of T over each: stream_us=, memory_us=;
//                                                             TEXT "-": the dataset alone)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "data/lm_data.h"
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

// Training batches drawn from the streamed dataset and from the same ids in memory (a text file
// read as bytes), the two alternating; the batches must be equal.
int sample(const fs::path& dataset, const fs::path& text, int64_t T, int64_t B, int64_t steps) {
  const TokenizerInfo info = bytes_info();
  LMWindows stream(open_token_dataset_reader(dataset, &info, 256).tokens(), T);
  const bool compare = text != "-";
  auto ids = std::make_shared<const std::vector<int32_t>>(
      compare ? read_byte_tokens(text) : std::vector<int32_t>(size_t(T + 1)));
  LMWindows memory(ids, T);
  double stream_s = 0, memory_s = 0;
  for (int64_t step = 0; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    const LMBatch a = stream.sample(B, 1337, step);
    auto t1 = std::chrono::steady_clock::now();
    const LMBatch b = memory.sample(B, 1337, step);
    auto t2 = std::chrono::steady_clock::now();
    stream_s += std::chrono::duration<double>(t1 - t0).count();
    memory_s += std::chrono::duration<double>(t2 - t1).count();
    if (compare && a.ids.to_vector<int64_t>() != b.ids.to_vector<int64_t>()) {
      std::fprintf(stderr, "bench_data_stream_tool: batch %lld differs\n", (long long)step);
      return 1;
    }
  }
  std::printf("stream_us=%.1f", stream_s * 1e6 / double(steps));
  if (compare) std::printf(" memory_us=%.1f", memory_s * 1e6 / double(steps));
  std::printf("\n");
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
    if (mode == "sample" && argc == 7)
      return sample(argv[2], argv[3], std::atoll(argv[4]), std::atoll(argv[5]), std::atoll(argv[6]));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_data_stream_tool: %s\n", e.what());
    return int(e.code());
  }
  std::fprintf(stderr,
               "usage: bench_data_stream_tool write OUT TOKENS [SHARD_TOKENS] | text OUT TOKENS | "
               "open PATH | sample DATASET TEXT T B STEPS\n");
  return 2;
}
