// HDF5 token datasets: write/read round trips on both storage widths, streaming across block
// boundaries, the split by document, and every way a file is rejected (a digest mismatch,
// corruption, truncation, not HDF5, missing metadata, another tokenizer, ids beyond the model's
// vocabulary) with exit code 3; the streaming reader against the in-memory one, and shard
// directories.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/durable_file.h"
#include "data/hdf5_io.h"
#include "data/lm_data.h"
#include "data/token_dataset.h"
#include "data/token_shards.h"
#include "tests/test_util.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const TokenizerInfo kBytes{"bytes", 256, "00000000000000ff"};

void write_dataset(const fs::path& path, const TokenizerInfo& info,
                   const std::vector<std::vector<int32_t>>& docs) {
  TokenDatasetWriter w(path, info);
  for (const auto& d : docs) w.add_document(d);
  w.finish();
}

// A dataset the test then edits as a damaged or forged file from elsewhere would be: without the
// digest sidecar the writer leaves, so readers check what is inside it.
void write_foreign_dataset(const fs::path& path, const TokenizerInfo& info,
                           const std::vector<std::vector<int32_t>>& docs) {
  write_dataset(path, info, docs);
  fs::remove(digest_path(path));
}

/// The data-error message of `fn`, failing the test if it does not throw Error(data).
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

size_t stored_token_width(const fs::path& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hid_t t = H5Dget_type(ds);
  size_t width = H5Tget_size(t);
  H5Tclose(t);
  H5Dclose(ds);
  H5Fclose(f);
  return width;
}

// The shared string-attribute reader: one string of any kind reads back; an array of strings (which
// H5Aread would write in full into a one-string buffer) and a fixed size past the bound are
// refused before any buffer is sized from them.
TEST(Hdf5Attributes, OnlyASingleStringOfBoundedSizeIsRead) {
  testing::TempDir dir;
  hdf5::quiet_hdf5();
  const std::string file = (dir.path() / "attrs.h5").string();
  // Attributes over 64 KiB need the dense attribute storage of the newer file format.
  hdf5::Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  hdf5::Hid f(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  auto add = [&](const char* name, size_t size, hsize_t count, const char* data) {
    hdf5::Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), size);
    hdf5::Hid space(count == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr),
                    H5Sclose);
    hdf5::Hid attr(H5Acreate2(f.get(), name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose);
    ASSERT_GE(H5Awrite(attr.get(), type.get(), data), 0) << name;
  };
  add("one", 5, 0, "forge");
  add("many", 5, 3, "abcdeabcdeabcde");
  const std::string big(70000, 'x');
  add("big", big.size(), 0, big.c_str());
  auto read = [&](const char* name, std::string& problem) {
    hdf5::Hid attr(H5Aopen(f.get(), name, H5P_DEFAULT), H5Aclose);
    return hdf5::read_string_attr(attr.get(), problem);
  };
  std::string problem;
  EXPECT_EQ(read("one", problem), std::optional<std::string>("forge"));
  EXPECT_EQ(read("many", problem), std::nullopt);
  EXPECT_EQ(problem, "is not a single string");
  EXPECT_EQ(read("big", problem), std::nullopt);
  EXPECT_EQ(problem, "has an implausible size (70000 bytes)");
}

TEST(TokenDataset, RoundTripsNarrowIdsWithAnEmptyDocument) {
  TempDir dir;
  fs::path path = dir.path() / "corpus.h5";
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {}, {255, 0}, {7}};
  write_dataset(path, kBytes, docs);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir.path() / "corpus.h5.tmp"));
  EXPECT_EQ(stored_token_width(path), 2u);

  TokenDataset ds = open_token_dataset(path, &kBytes, 256);
  EXPECT_EQ(*ds.tokens(), (std::vector<int32_t>{1, 2, 3, 255, 0, 7}));
  EXPECT_EQ(ds.doc_offsets(), (std::vector<int64_t>{0, 3, 3, 5, 6}));
  EXPECT_EQ(ds.num_documents(), 4);
  EXPECT_EQ(ds.num_tokens(), 6);
  EXPECT_EQ(ds.info().name, "bytes");
  EXPECT_EQ(ds.info().vocab_size, 256);
  EXPECT_EQ(ds.info().vocab_hash, "00000000000000ff");
  LMWindows windows(ds.tokens(), 4);  // usable as is
  EXPECT_EQ(windows.num_tokens(), 6);
}

TEST(TokenDataset, RoundTripsWideIds) {
  TempDir dir;
  fs::path path = dir.path() / "wide.h5";
  TokenizerInfo info{"big", 70000, "abc"};
  write_dataset(path, info, {{0, 65535, 65536, 69999}, {12345}});
  EXPECT_EQ(stored_token_width(path), 4u);
  TokenDataset ds = open_token_dataset(path, &info, 70000);
  EXPECT_EQ(*ds.tokens(), (std::vector<int32_t>{0, 65535, 65536, 69999, 12345}));
  EXPECT_EQ(ds.doc_offsets(), (std::vector<int64_t>{0, 4, 5}));
}

TEST(TokenDataset, RoundTripsAnEmptyCorpus) {
  TempDir dir;
  fs::path path = dir.path() / "empty.h5";
  write_dataset(path, kBytes, {});
  TokenDataset ds = open_token_dataset(path);
  EXPECT_EQ(ds.num_tokens(), 0);
  EXPECT_EQ(ds.doc_offsets(), (std::vector<int64_t>{0}));
}

// More tokens and documents than one write block holds, so appends, checksums and reads cross
// block and chunk boundaries.
TEST(TokenDataset, StreamsManyDocuments) {
  TempDir dir;
  fs::path path = dir.path() / "many.h5";
  const int D = 70000;
  std::vector<int32_t> all;
  std::vector<int64_t> offsets = {0};
  {
    TokenDatasetWriter w(path, kBytes);
    for (int d = 0; d < D; ++d) {
      std::vector<int32_t> doc(size_t((d * 7) % 41));
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t((d * 31 + int(i)) % 256);
      w.add_document(doc);
      all.insert(all.end(), doc.begin(), doc.end());
      offsets.push_back(int64_t(all.size()));
    }
    EXPECT_EQ(w.num_documents(), D);
    EXPECT_EQ(w.num_tokens(), int64_t(all.size()));
    EXPECT_FALSE(fs::exists(path));  // only the temp file exists until finish()
    w.finish();
  }
  ASSERT_GT(all.size(), size_t(1) << 20);
  TokenDataset ds = open_token_dataset(path, &kBytes, 256);
  EXPECT_EQ(*ds.tokens(), all);
  EXPECT_EQ(ds.doc_offsets(), offsets);
}

TEST(TokenDataset, SplitsByWholeDocuments) {
  TempDir dir;
  fs::path path = dir.path() / "split.h5";
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 10; ++d) docs.push_back(std::vector<int32_t>(10, d));
  write_dataset(path, kBytes, docs);
  TokenDataset ds = open_token_dataset(path);

  TokenSplit s = ds.split_by_document(0.2);
  EXPECT_EQ(s.train->size(), 80u);
  EXPECT_EQ(s.val->size(), 20u);
  EXPECT_EQ(s.val->front(), 8);
  EXPECT_EQ(s.train->back(), 7);
  // 0.23 of 100 tokens: the nearest boundary is still after document 7.
  EXPECT_EQ(ds.split_by_document(0.23).val->size(), 20u);
  EXPECT_EQ(ds.split_by_document(0.27).val->size(), 30u);
  // A tiny fraction still puts one document on the validation side; zero puts none.
  EXPECT_EQ(ds.split_by_document(0.001).val->size(), 10u);
  EXPECT_EQ(ds.split_by_document(0.0).val->size(), 0u);
  EXPECT_EQ(ds.split_by_document(0.0).train->size(), 100u);

  // One long last document: validation never cuts it, and training keeps the rest.
  fs::path skewed = dir.path() / "skewed.h5";
  write_dataset(skewed, kBytes, {{1, 1}, {2, 2}, std::vector<int32_t>(50, 3)});
  TokenSplit k = open_token_dataset(skewed).split_by_document(0.1);
  EXPECT_EQ(*k.train, (std::vector<int32_t>{1, 1, 2, 2}));
  EXPECT_EQ(k.val->size(), 50u);

  fs::path single = dir.path() / "single.h5";
  write_dataset(single, kBytes, {{1, 2, 3}});
  std::string msg = data_error([&] { open_token_dataset(single).split_by_document(0.1); });
  EXPECT_HAS(msg, single.string());
}

TEST(TokenDataset, DetectsCorruptTokens) {
  TempDir dir;
  fs::path path = dir.path() / "corrupt.h5";
  std::vector<int32_t> doc;
  for (int i = 0; i < 200; ++i) doc.push_back(1000 + i);
  write_foreign_dataset(path, {"t", 2000, "h"}, {doc});
  std::string bytes = testing::read_file(path);
  const char pattern[] = {char(0xe8), char(0x03), char(0xe9), char(0x03)};  // 1000, 1001 as u16
  size_t at = bytes.find(std::string(pattern, 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 40] ^= 0x01;  // still a valid id: only the checksum can tell
  testing::write_file(path, bytes);
  std::string msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string());
  EXPECT_HAS(msg, "checksum mismatch in dataset '/tokens'");
}

// Readers compare a dataset with the digest its writer left beside it before libhdf5 parses a
// byte: a damaged file is refused without being parsed. Rewriting a dataset replaces its digest.
TEST(TokenDataset, TheWritersDigestIsCheckedBeforeParsing) {
  TempDir dir;
  fs::path path = dir.path() / "digest.h5";
  std::vector<int32_t> doc;
  for (int i = 0; i < 200; ++i) doc.push_back(1000 + i);
  write_dataset(path, {"t", 2000, "h"}, {{1, 2, 3}});
  write_dataset(path, {"t", 2000, "h"}, {doc});
  EXPECT_EQ(testing::read_file(digest_path(path)), file_digest(path, ExitCode::data) + "\n");
  EXPECT_EQ(open_token_dataset(path).num_tokens(), 200);
  std::string bytes = testing::read_file(path);
  const char pattern[] = {char(0xe8), char(0x03), char(0xe9), char(0x03)};  // 1000, 1001 as u16
  size_t at = bytes.find(std::string(pattern, 4));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 40] ^= 0x01;
  testing::write_file(path, bytes);
  std::string msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string() + ": digest crc32:");
  EXPECT_HAS(msg, "recorded in " + digest_path(path).string() + ": the file is damaged");
}

TEST(TokenDataset, RejectsTruncatedAndNonHdf5Files) {
  TempDir dir;
  fs::path path = dir.path() / "cut.h5";
  write_foreign_dataset(path, kBytes, {std::vector<int32_t>(5000, 65)});
  std::string bytes = testing::read_file(path);
  testing::write_file(path, bytes.substr(0, bytes.size() / 2));
  std::string msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string() + ": ");

  fs::path text = dir.path() / "notes.h5";
  testing::write_file(text, "just some text, not a dataset\n");
  msg = data_error([&] { open_token_dataset(text); });
  EXPECT_HAS(msg, text.string() + ": not an HDF5 file");

  msg = data_error([&] { open_token_dataset(dir.path() / "missing.h5"); });
  EXPECT_HAS(msg, "no such token dataset");
}

// Sets integer attribute `name` of the file's root.
void set_root_attr(hid_t f, const char* name, int64_t value) {
  hid_t attr = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(attr, 0);
  ASSERT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(attr);
}

TEST(TokenDataset, DeclaredLengthsBeyondTheFileAreRejectedBeforeAllocating) {
  TempDir dir;
  fs::path path = dir.path() / "forged.h5";
  write_foreign_dataset(path, kBytes, {{1, 2}});
  // A consistent header declaring 2^40 tokens, the tokens dataset extended (never written, so
  // no storage): reading it would first allocate 4 TiB.
  const int64_t huge = int64_t(1) << 40;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t ds = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hsize_t n = hsize_t(huge);
  ASSERT_GE(H5Dset_extent(ds, &n), 0);
  H5Dclose(ds);
  const int64_t offsets[2] = {0, huge};
  ds = H5Dopen2(f, "doc_offsets", H5P_DEFAULT);
  ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets), 0);
  H5Dclose(ds);
  set_root_attr(f, "num_tokens", huge);
  set_root_attr(f, "doc_offsets_crc32", int64_t(crc32(offsets, sizeof offsets)));
  H5Fclose(f);
  std::string msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string() + ": dataset '/tokens' declares 1099511627776 elements");

  // The same for the document offsets, which are read first.
  write_foreign_dataset(path, kBytes, {{1, 2}});
  f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ds = H5Dopen2(f, "doc_offsets", H5P_DEFAULT);
  ASSERT_GE(H5Dset_extent(ds, &n), 0);
  H5Dclose(ds);
  set_root_attr(f, "num_documents", huge - 1);
  H5Fclose(f);
  msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string() + ": dataset '/doc_offsets' declares 1099511627776 elements");
}

TEST(TokenDataset, RejectsMissingMetadataAndOtherFormats) {
  TempDir dir;
  fs::path path = dir.path() / "meta.h5";
  write_foreign_dataset(path, kBytes, {{1, 2}});
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete(f, "vocab_hash"), 0);
  H5Fclose(f);
  std::string msg = data_error([&] { open_token_dataset(path); });
  EXPECT_HAS(msg, path.string() + ": missing attribute 'vocab_hash'");

  fs::path other = dir.path() / "other.h5";
  f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  msg = data_error([&] { open_token_dataset(other); });
  EXPECT_HAS(msg, other.string() + ": missing attribute 'format'");
}

TEST(TokenDataset, NamesBothTokenizersOnMismatch) {
  TempDir dir;
  fs::path path = dir.path() / "gpt2.h5";
  TokenizerInfo gpt2{"gpt2", 50257, "1234abcd"};
  write_dataset(path, gpt2, {{50256, 0}});
  std::string msg = data_error([&] { open_token_dataset(path, &kBytes); });
  EXPECT_HAS(msg, path.string());
  EXPECT_HAS(msg, "'gpt2' (vocabulary size 50257");
  EXPECT_HAS(msg, "'bytes' (vocabulary size 256");
  // Same name, different vocabulary content.
  TokenizerInfo retrained{"gpt2", 50257, "99999999"};
  msg = data_error([&] { open_token_dataset(path, &retrained); });
  EXPECT_HAS(msg, "hash 1234abcd");
  EXPECT_HAS(msg, "hash 99999999");
}

TEST(TokenDataset, NamesTheFirstIdBeyondTheModelVocabulary) {
  TempDir dir;
  fs::path path = dir.path() / "ids.h5";
  TokenizerInfo gpt2{"gpt2", 50257, "h"};
  write_dataset(path, gpt2, {{1, 2, 3}, {4, 50000, 5, 50001}});
  std::string msg = data_error([&] { open_token_dataset(path, &gpt2, 1000); });
  EXPECT_HAS(msg, path.string() + ": token id 50000 at position 4 ");
  EXPECT_HAS(msg, "vocabulary size 1000");
  EXPECT_NO_THROW(open_token_dataset(path, &gpt2, 50002));
}

TEST(TokenDataset, WriterRejectsOutOfRangeIds) {
  TempDir dir;
  fs::path path = dir.path() / "bad.h5";
  TokenDatasetWriter w(path, kBytes);
  w.add_document({1, 2});
  std::string msg = data_error([&] { w.add_document({3, 4, 256}); });
  EXPECT_HAS(msg, "document 1, position 2: token id 256");
  msg = data_error([&] { w.add_document({-1}); });
  EXPECT_HAS(msg, "token id -1");
  w.add_document({5});  // the rejected documents left nothing behind
  w.finish();
  TokenDataset ds = open_token_dataset(path);
  EXPECT_EQ(*ds.tokens(), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(ds.num_documents(), 2);
}

TEST(TokenDataset, AbandonedWriterLeavesNoFile) {
  TempDir dir;
  fs::path path = dir.path() / "abandoned.h5";
  {
    TokenDatasetWriter w(path, kBytes);
    w.add_document({1, 2, 3});
    EXPECT_TRUE(fs::exists(dir.path() / "abandoned.h5.tmp"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir.path() / "abandoned.h5.tmp"));
}


// ---------------------------------------------------------------------------------------------
// Streaming (data/token_source.h, TokenDatasetReader): the same training batches and evaluation
// windows as the in-memory loader for the same seed, from one file and from the same tokens in
// shards; the block cache, slices and concatenation against plain memory; ids checked as they are
// read; and every way a shard directory is refused (exit 3, naming the file).

using Documents = std::vector<std::vector<int32_t>>;

// Documents of 0 to 299 ids from a fixed generator: some empty, many shorter than a window.
Documents random_docs(int n, uint32_t seed) {
  std::mt19937 g(seed);
  Documents docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(g() % 300);
    for (auto& id : d) id = int32_t(g() % 256);
  }
  return docs;
}

// `docs` as shards of the given document counts in `dir`, with their manifest.
void write_shards(const fs::path& dir, const Documents& docs, const std::vector<size_t>& counts) {
  fs::create_directories(dir);
  ShardManifest m;
  m.tokenizer = kBytes;
  size_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::string name = "shard-" + std::to_string(i) + ".h5";
    Documents part(docs.begin() + ptrdiff_t(at), docs.begin() + ptrdiff_t(at + counts[i]));
    write_dataset(dir / name, kBytes, part);
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
  const Documents docs = random_docs(4000, 5);
  write_dataset(dir.path() / "all.h5", kBytes, docs);
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
  Documents changed = docs;
  changed[7][0] ^= 1;
  write_dataset(dir.path() / "changed.h5", kBytes, changed);
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
  write_dataset(dir.path() / "ids.h5", gpt2, {{1, 2, 3, 4, 5, 6}, {7, 8, 50000, 9, 10, 11}});
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
  void replace_shard(const Documents& docs, const TokenizerInfo& info) {
    write_dataset(shard(1), info, docs);
    ShardManifest m = read_shard_manifest(shards());
    m.shards[1].digest = file_digest(shard(1), ExitCode::data);
    write_shard_manifest(shards(), m);
  }

  testing::TempDir dir_;
  Documents docs_;
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
  replace_shard(Documents(docs_.begin() + 10, docs_.begin() + 20), {"bytes", 256, "0000000000000aaa"});
  const std::string msg = open_error();
  EXPECT_HAS(msg, shard(1).string() + ": prepared with tokenizer 'bytes' (vocabulary size 256, "
                                      "hash 0000000000000aaa) but ");
  EXPECT_HAS(msg, "manifest.json lists tokenizer 'bytes' (vocabulary size 256, hash 00000000000000ff)");
}

TEST_F(ShardDirectory, AShardOfAnotherIdTypeIsNamed) {
  replace_shard(Documents(docs_.begin() + 10, docs_.begin() + 20), {"bytes", 70000, "00000000000000ff"});
  EXPECT_HAS(open_error(), shard(1).string() + ": stores ids as int32, but " +
                               shard(0).string() + " as uint16");
}

TEST_F(ShardDirectory, CountsOtherThanTheManifestListsAreNamed) {
  replace_shard(Documents(docs_.begin() + 10, docs_.begin() + 19), kBytes);
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
