// Streaming token datasets (data/token_source.h, TokenDatasetReader): the same training batches
// and evaluation windows as the in-memory loader for the same seed, from one file and from the same
// tokens in shards; the block cache, slices and concatenation against plain memory; ids checked as
// they are read; and every way a shard directory is refused (exit 3, naming the file).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "data/lm_data.h"
#include "data/token_dataset.h"
#include "data/token_shards.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Docs = std::vector<std::vector<int32_t>>;

const TokenizerInfo kBytes{"bytes", 256, "00000000000000ff"};

template <class F>
std::string data_error(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected Error(data)";
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// Documents of 0 to 299 ids from a fixed generator: some empty, many shorter than a window.
Docs random_docs(int n, uint32_t seed) {
  std::mt19937 g(seed);
  Docs docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(g() % 300);
    for (auto& id : d) id = int32_t(g() % 256);
  }
  return docs;
}

void write_dataset(const fs::path& path, const Docs& docs, const TokenizerInfo& info = kBytes) {
  TokenDatasetWriter w(path, info);
  for (const auto& d : docs) w.add_document(d);
  w.finish();
}

// `docs` as shards of the given document counts in `dir`, with their manifest.
void write_shards(const fs::path& dir, const Docs& docs, const std::vector<size_t>& counts) {
  fs::create_directories(dir);
  ShardManifest m;
  m.tokenizer = kBytes;
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::string name = "shard-" + std::to_string(i) + ".h5";
    Docs part(docs.begin() + ptrdiff_t(at), docs.begin() + ptrdiff_t(at + counts[i]));
    write_dataset(dir / name, part);
    int64_t tokens = 0;
    for (const auto& d : part) tokens += int64_t(d.size());
    m.shards.push_back({name, tokens, int64_t(part.size()), file_digest(dir / name, ExitCode::data)});
    at += counts[i];
  }
  ASSERT_EQ(at, docs.size());
  write_shard_manifest(dir, m);
}

std::vector<int64_t> ids_of(const LMBatch& b) { return b.ids.to_vector<int64_t>(); }
std::vector<int64_t> targets_of(const LMBatch& b) { return b.targets.to_vector<int64_t>(); }

// Windows over `a` and `b` give the same training batches over many steps and micro-batches, and
// the same evaluation windows.
void expect_same_windows(const LMWindows& a, const LMWindows& b) {
  ASSERT_EQ(a.num_tokens(), b.num_tokens());
  for (int64_t step = 0; step < 200; ++step)
    for (int64_t micro = 0; micro < 2; ++micro) {
      const LMBatch x = a.sample(4, 1337, step, micro), y = b.sample(4, 1337, step, micro);
      ASSERT_EQ(ids_of(x), ids_of(y)) << "step " << step << " micro " << micro;
      ASSERT_EQ(targets_of(x), targets_of(y)) << "step " << step << " micro " << micro;
    }
  ASSERT_EQ(a.num_eval_windows(), b.num_eval_windows());
  for (int64_t first = 0; first < a.num_eval_windows(); first += 5) {
    const LMBatch x = a.eval_batch(first, 5), y = b.eval_batch(first, 5);
    ASSERT_EQ(ids_of(x), ids_of(y)) << "eval window " << first;
    ASSERT_EQ(targets_of(x), targets_of(y)) << "eval window " << first;
  }
}

TEST(TokenStream, BatchesEqualTheInMemoryLoaderFromOneFileAndFromShards) {
  testing::TempDir dir;
  const Docs docs = random_docs(4000, 5);
  write_dataset(dir.path() / "all.h5", docs);
  write_shards(dir.path() / "shards", docs, {1000, 0, 1700, 1300});
  const int64_t T = 32;
  const TokenDataset memory = open_token_dataset(dir.path() / "all.h5", &kBytes, 256);
  for (const fs::path& p : {dir.path() / "all.h5", dir.path() / "shards"}) {
    SCOPED_TRACE(p.string());
    const TokenDatasetReader stream = open_token_dataset_reader(p, &kBytes, 256);
    EXPECT_EQ(stream.num_tokens(), memory.num_tokens());
    EXPECT_EQ(stream.num_documents(), memory.num_documents());
    for (int64_t d = 0; d <= memory.num_documents(); d += 97)
      EXPECT_EQ(stream.document_start(d), memory.doc_offsets()[size_t(d)]) << d;
    EXPECT_EQ(stream.document_start(memory.num_documents()), memory.num_tokens());
    for (double f : {0.0, 0.001, 0.1, 0.37, 0.9}) {
      const TokenSplit m = memory.split_by_document(f);
      const TokenSourceSplit s = stream.split_by_document(f);
      ASSERT_EQ(s.train->size(), int64_t(m.train->size())) << f;
      ASSERT_EQ(s.val->size(), int64_t(m.val->size())) << f;
    }
    const TokenSplit m = memory.split_by_document(0.1);
    const TokenSourceSplit s = stream.split_by_document(0.1);
    expect_same_windows(LMWindows(m.train, T), LMWindows(s.train, T));
    expect_same_windows(LMWindows(m.val, T), LMWindows(s.val, T));
    // The whole dataset, as data.val names it: windows cross every shard boundary.
    expect_same_windows(LMWindows(memory.tokens(), T), LMWindows(stream.tokens(), T));
  }
  // The identity a resumed run compares: from the metadata as from the opened dataset, and
  // another for other contents.
  const TokenDatasetReader one = open_token_dataset_reader(dir.path() / "all.h5");
  EXPECT_EQ(one.identity(), read_token_dataset_identity(dir.path() / "all.h5"));
  EXPECT_EQ(open_token_dataset_reader(dir.path() / "shards").identity(),
            read_token_dataset_identity(dir.path() / "shards"));
  EXPECT_EQ(one.identity().num_tokens, memory.num_tokens());
  Docs changed = docs;
  changed[7][0] ^= 1;
  write_dataset(dir.path() / "changed.h5", changed);
  EXPECT_NE(read_token_dataset_identity(dir.path() / "changed.h5"), one.identity());
}

TEST(TokenStream, CachedSlicedAndConcatenatedReadsEqualMemory) {
  std::mt19937 g(3);
  auto all = std::make_shared<std::vector<int32_t>>(1000);
  for (auto& x : *all) x = int32_t(g() % 1000);
  auto part = [&](int64_t begin, int64_t end) {
    return std::make_shared<const MemoryTokens>(std::make_shared<const std::vector<int32_t>>(
        all->begin() + begin, all->begin() + end));
  };
  // Parts of unequal sizes, one empty; a cache of 3 blocks of 7 ids evicts all the time.
  const auto joined = concatenate_tokens({part(0, 10), part(10, 10), part(10, 611), part(611, 1000)});
  const auto cached = cache_tokens(joined, 7, 3);
  const auto sliced = slice_tokens(cached, 100, 900);
  for (int i = 0; i < 3000; ++i) {
    const int64_t n = int64_t(g() % 40), at = int64_t(g() % uint32_t(1000 - n));
    std::vector<int32_t> a(static_cast<size_t>(n)), b(a);
    cached->read(at, n, a.data());
    ASSERT_EQ(a, std::vector<int32_t>(all->begin() + at, all->begin() + at + n)) << at << "+" << n;
    joined->read(at, n, b.data());
    ASSERT_EQ(a, b);
    if (at + n <= 800) {
      sliced->read(at, n, a.data());
      ASSERT_EQ(a, std::vector<int32_t>(all->begin() + 100 + at, all->begin() + 100 + at + n));
    }
  }
}

// A file whose digest vouches for its bytes is not read whole at open: an id beyond the model's
// vocabulary is found when a window reads the block holding it, as the same one line (exit 3)
// naming the position.
TEST(TokenStream, IdsAreRangeCheckedAsTheyAreRead) {
  testing::TempDir dir;
  const TokenizerInfo gpt2{"gpt2", 50257, "h"};
  write_dataset(dir.path() / "ids.h5", {{1, 2, 3, 4, 5, 6}, {7, 8, 50000, 9, 10, 11}}, gpt2);
  const TokenDatasetReader r = open_token_dataset_reader(dir.path() / "ids.h5", &gpt2, 1000);
  LMWindows windows(r.tokens(), 3);
  const std::string msg = data_error([&] { windows.eval_batch(0, 1); });
  EXPECT_HAS(msg, (dir.path() / "ids.h5").string() + ": token id 50000 at position 8 ");
  EXPECT_HAS(msg, "vocabulary size 1000");
}

class ShardDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    docs_ = random_docs(30, 9);
    write_shards(shards(), docs_, {10, 10, 10});
  }
  fs::path shards() const { return dir_.path() / "shards"; }
  fs::path shard(int i) const { return shards() / ("shard-" + std::to_string(i) + ".h5"); }
  std::string open_error() {
    return data_error([&] { open_token_dataset_reader(shards(), &kBytes, 256); });
  }
  // Replaces shard 1 by `docs` written with `info`, the manifest updated to its digest only, so
  // that what the manifest lists about the shard's contents is checked, not its bytes.
  void replace_shard(const Docs& docs, const TokenizerInfo& info) {
    write_dataset(shard(1), docs, info);
    ShardManifest m = read_shard_manifest(shards());
    m.shards[1].digest = file_digest(shard(1), ExitCode::data);
    write_shard_manifest(shards(), m);
  }

  testing::TempDir dir_;
  Docs docs_;
};

TEST_F(ShardDirectory, OpensAsOneDataset) {
  const TokenDatasetReader r = open_token_dataset_reader(shards(), &kBytes, 256);
  EXPECT_EQ(r.num_files(), 3);
  EXPECT_EQ(r.num_documents(), 30);
}

TEST_F(ShardDirectory, AMissingShardIsNamed) {
  fs::remove(shard(2));
  EXPECT_HAS(open_error(), shard(2).string() + ": missing (shard 2 of 3");
}

TEST_F(ShardDirectory, ATruncatedOrAlteredShardIsNamed) {
  std::string bytes = testing::read_file(shard(1));
  testing::write_file(shard(1), bytes.substr(0, bytes.size() - 100));
  EXPECT_HAS(open_error(), shard(1).string() + ": ");
  EXPECT_HAS(open_error(), "(truncated, or replaced since)");
  bytes[bytes.size() / 2] ^= 0x10;  // same size, other bytes
  testing::write_file(shard(1), bytes);
  EXPECT_HAS(open_error(), shard(1).string() + ": digest crc32:");
}

TEST_F(ShardDirectory, AShardOfAnotherTokenizerIsNamed) {
  replace_shard(Docs(docs_.begin() + 10, docs_.begin() + 20), {"bytes", 256, "0000000000000aaa"});
  const std::string msg = open_error();
  EXPECT_HAS(msg, shard(1).string() + ": prepared with tokenizer 'bytes' (vocabulary size 256, "
                                      "hash 0000000000000aaa) but ");
  EXPECT_HAS(msg, "manifest.json lists tokenizer 'bytes' (vocabulary size 256, hash 00000000000000ff)");
}

TEST_F(ShardDirectory, AShardOfAnotherIdTypeIsNamed) {
  replace_shard(Docs(docs_.begin() + 10, docs_.begin() + 20), {"bytes", 70000, "00000000000000ff"});
  EXPECT_HAS(open_error(), shard(1).string() + ": stores ids as int32, but " +
                               shard(0).string() + " as uint16");
}

TEST_F(ShardDirectory, CountsOtherThanTheManifestListsAreNamed) {
  replace_shard(Docs(docs_.begin() + 10, docs_.begin() + 19), kBytes);
  EXPECT_HAS(open_error(), shard(1).string() + ": holds ");
  EXPECT_HAS(open_error(), "documents, but");
}

TEST_F(ShardDirectory, AManifestOfAnotherTokenizerIsRefusedFirst) {
  const TokenizerInfo gpt2{"gpt2", 50257, "h"};
  const std::string msg =
      data_error([&] { open_token_dataset_reader(shards(), &gpt2, 50257); });
  EXPECT_HAS(msg, (shards() / "manifest.json").string() + ": prepared with tokenizer 'bytes'");
  EXPECT_HAS(msg, "but the model uses tokenizer 'gpt2'");
}

}  // namespace
}  // namespace forge
