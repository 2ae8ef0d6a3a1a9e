// HDF5 token datasets: write/read round trips on both storage widths, streaming across block
// boundaries, the split by document, and every way a file is rejected (a digest mismatch,
// corruption, truncation, not HDF5, missing metadata, another tokenizer, ids beyond the model's
// vocabulary) with exit code 3.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/durable_file.h"
#include "data/hdf5_io.h"
#include "data/token_dataset.h"
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

}  // namespace
}  // namespace forge
