// Token datasets on the HDF5 C API (layout: docs/data-format.md), on the HDF5 plumbing checkpoints
// use too (data/hdf5_io.h: RAII handles, HDF5's error printing silenced so users see one line,
// checked attributes), a temp file renamed into place with a digest sidecar beside it
// (core/durable_file.h), CRC-32 (zlib's) over the stored bytes. Tokens move in blocks of whole
// chunks, so neither writing nor checking a corpus needs a second copy of it in memory.
#include "data/token_dataset.h"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>

#include "core/checksum.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/isolate.h"
#include "core/kernels/parallel.h"
#include "data/hdf5_io.h"
#include "data/token_shards.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "forge-tokens";
constexpr hsize_t kTokenChunk = hsize_t(1) << 16;  // elements per HDF5 chunk (128-256 KiB)
constexpr size_t kTokenBlock = size_t(1) << 20;    // elements per write/read call: 16 chunks
constexpr hsize_t kOffsetChunk = 4096;
constexpr size_t kOffsetBlock = 1 << 16;

// ---------------------------------------------------------------------------------------------
// HDF5 plumbing.

using hdf5::file_access_plist;
using hdf5::Hid;
using hdf5::quiet_hdf5;
using hdf5::read_attr_int;
using hdf5::read_attr_str;
using hdf5::Reporter;
using hdf5::write_attr_int;
using hdf5::write_attr_str;

/// Errors about a token dataset: exit 3, the path as quoted_path prints it.
Reporter data_file(const fs::path& file) { return {quoted_path(file.string()), ExitCode::data}; }

/// An extendible 1-D chunked dataset.
Hid create_growing(const Reporter& file, hid_t parent, const char* name, hid_t type,
                   hsize_t chunk) {
  hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  Hid space(H5Screate_simple(1, &zero, &unlimited), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(dcpl.get(), 1, &chunk);
  return file.check(
      H5Dcreate2(parent, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose,
      std::string("cannot create dataset '") + name + "'");
}

/// Appends `n` elements of memory type `mem_type` at position `at` of a 1-D dataset.
void append(const Reporter& file, hid_t ds, hid_t mem_type, hsize_t at, const void* data, hsize_t n,
            const char* name) {
  if (n == 0) return;
  const std::string what = std::string("cannot write dataset '") + name + "'";
  hsize_t size = at + n;
  file.check(H5Dset_extent(ds, &size), what);
  Hid fspace(H5Dget_space(ds), H5Sclose);
  file.check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &at, nullptr, &n, nullptr), what);
  Hid mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  file.check(H5Dwrite(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data), what);
}

/// Reads elements [at, at + n) of a 1-D dataset as `mem_type`.
void read_slab(const Reporter& file, hid_t ds, hid_t mem_type, hsize_t at, hsize_t n, void* dst,
                const char* name) {
  if (n == 0) return;
  const std::string what = std::string("cannot read dataset '") + name + "' (corrupt file?)";
  Hid fspace(H5Dget_space(ds), H5Sclose);
  file.check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &at, nullptr, &n, nullptr), what);
  Hid mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  file.check(H5Dread(ds, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, dst), what);
}

std::string crc_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", unsigned(crc));
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer.

struct TokenDatasetWriter::Impl {
  fs::path path, tmp;
  Reporter out;  // errors about tmp
  TokenizerInfo info;
  bool narrow = true;  // ids stored as uint16
  Hid file, tokens, offsets;
  std::vector<int32_t> pending;         // ids not yet written
  std::vector<uint16_t> narrow_buffer;  // pending as stored, on the uint16 path
  std::vector<int64_t> pending_offsets;
  int64_t written_tokens = 0, total_tokens = 0, written_offsets = 0, num_documents = 0;
  uint32_t tokens_crc = 0, offsets_crc = 0;
  bool finished = false;

  void flush_tokens() {
    const void* data = pending.data();
    hid_t mem_type = H5T_NATIVE_INT32;
    size_t nbytes = pending.size() * sizeof(int32_t);
    if (narrow) {
      narrow_buffer.assign(pending.begin(), pending.end());
      data = narrow_buffer.data();
      mem_type = H5T_NATIVE_UINT16;
      nbytes = narrow_buffer.size() * sizeof(uint16_t);
    }
    tokens_crc = crc32(data, nbytes, tokens_crc);
    append(out, tokens.get(), mem_type, hsize_t(written_tokens), data, hsize_t(pending.size()),
           "tokens");
    written_tokens += int64_t(pending.size());
    pending.clear();
  }

  void flush_offsets() {
    offsets_crc =
        crc32(pending_offsets.data(), pending_offsets.size() * sizeof(int64_t), offsets_crc);
    append(out, offsets.get(), H5T_NATIVE_INT64, hsize_t(written_offsets), pending_offsets.data(),
           hsize_t(pending_offsets.size()), "doc_offsets");
    written_offsets += int64_t(pending_offsets.size());
    pending_offsets.clear();
  }
};

TokenDatasetWriter::TokenDatasetWriter(const fs::path& path, TokenizerInfo info)
    : impl_(std::make_unique<Impl>()) {
  quiet_hdf5();
  Impl& w = *impl_;
  w.path = path;
  w.tmp = fs::path(path.string() + ".tmp");
  w.out = data_file(w.tmp);
  if (info.vocab_size <= 0 || info.vocab_size > int64_t(INT32_MAX) + 1)
    data_file(path).fail("vocab_size must be in [1, 2^31], got " + std::to_string(info.vocab_size));
  w.narrow = info.vocab_size <= 65536;
  w.info = std::move(info);
  Hid fapl = file_access_plist();
  w.file = w.out.check(H5Fcreate(w.tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                       "cannot create (directory missing or not writable?)");
  w.tokens = create_growing(w.out, w.file.get(), "tokens", w.narrow ? H5T_STD_U16LE : H5T_STD_I32LE,
                            kTokenChunk);
  w.offsets = create_growing(w.out, w.file.get(), "doc_offsets", H5T_STD_I64LE, kOffsetChunk);
  w.pending.reserve(kTokenBlock);
  w.pending_offsets.push_back(0);
}

TokenDatasetWriter::~TokenDatasetWriter() {
  if (!impl_ || impl_->finished) return;
  impl_->tokens.reset();
  impl_->offsets.reset();
  impl_->file.reset();
  std::error_code ec;
  fs::remove(impl_->tmp, ec);
}

void TokenDatasetWriter::add_document(const std::vector<int32_t>& ids) {
  Impl& w = *impl_;
  FORGE_CHECK(!w.finished, "TokenDatasetWriter::add_document after finish() on ", w.path.string());
  const int64_t vocab = w.info.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      data_file(w.path).fail(detail::concat(
          "document ", w.num_documents, ", position ", i, ": token id ", ids[i],
          " is outside the vocabulary [0, ", vocab, ") of tokenizer '", w.info.name, "'"));
  for (size_t i = 0; i < ids.size();) {
    size_t n = std::min(ids.size() - i, kTokenBlock - w.pending.size());
    w.pending.insert(w.pending.end(), ids.begin() + ptrdiff_t(i), ids.begin() + ptrdiff_t(i + n));
    i += n;
    if (w.pending.size() == kTokenBlock) w.flush_tokens();
  }
  w.total_tokens += int64_t(ids.size());
  w.num_documents += 1;
  w.pending_offsets.push_back(w.total_tokens);
  if (w.pending_offsets.size() >= kOffsetBlock) w.flush_offsets();
}

void TokenDatasetWriter::finish() {
  Impl& w = *impl_;
  FORGE_CHECK(!w.finished, "TokenDatasetWriter::finish called twice on ", w.path.string());
  w.flush_tokens();
  w.flush_offsets();
  hid_t root = w.file.get();
  write_attr_str(w.out, root, "format", kFormat);
  write_attr_int(w.out, root, "format_version", H5T_STD_I64LE, kTokenDatasetFormatVersion);
  write_attr_str(w.out, root, "tokenizer", w.info.name);
  write_attr_int(w.out, root, "vocab_size", H5T_STD_I64LE, w.info.vocab_size);
  write_attr_str(w.out, root, "vocab_hash", w.info.vocab_hash);
  write_attr_int(w.out, root, "num_tokens", H5T_STD_I64LE, w.total_tokens);
  write_attr_int(w.out, root, "num_documents", H5T_STD_I64LE, w.num_documents);
  write_attr_int(w.out, root, "tokens_crc32", H5T_STD_U32LE, w.tokens_crc);
  write_attr_int(w.out, root, "doc_offsets_crc32", H5T_STD_U32LE, w.offsets_crc);
  w.tokens.reset();
  w.offsets.reset();
  hid_t id = w.file.release();
  w.out.check(H5Fclose(id), "cannot close (disk full?)");
  fsync_path(w.tmp, false, ExitCode::data);
  // The sidecar of a file this one replaces (prepare --force) would call the new file damaged.
  std::error_code ec;
  fs::remove(digest_path(w.path), ec);
  rename_durably(w.tmp, w.path, ExitCode::data);
  write_digest_sidecar(w.path, ExitCode::data);
  w.finished = true;
}

int64_t TokenDatasetWriter::num_documents() const { return impl_->num_documents; }
int64_t TokenDatasetWriter::num_tokens() const { return impl_->total_tokens; }

// Reader.

namespace {

/// A 1-D dataset of the given integer kind, with its length checked against the metadata.
Hid open_vector(const Reporter& file, hid_t root, const char* name, int64_t expected_length,
                hid_t* stored_type) {
  if (H5Lexists(root, name, H5P_DEFAULT) <= 0)
    file.fail(std::string("missing dataset '/") + name + "'");
  // No HDF5 chunk cache: reads go through the reader's own bounded cache (token_source.h), and
  // one open shard must not hold a megabyte of its own.
  Hid dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
  H5Pset_chunk_cache(dapl.get(), 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT);
  Hid ds =
      file.check(H5Dopen2(root, name, dapl.get()), H5Dclose,
                 std::string("cannot open dataset '/") + name + "' (corrupt, or not a dataset)");
  Hid space(H5Dget_space(ds.get()), H5Sclose);
  hsize_t length = 0;
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    file.fail(std::string("dataset '/") + name + "' is not 1-D");
  H5Sget_simple_extent_dims(space.get(), &length, nullptr);
  if (int64_t(length) != expected_length)
    file.fail(detail::concat("dataset '/", name, "' has ", length, " elements, the metadata says ",
                             expected_length));
  *stored_type = H5Dget_type(ds.get());
  return ds;
}

// An unfiltered dataset keeps every element in the file, so a length it declares beyond the bytes
// the file stores for it is a forged header; checked before the length is allocated.
void check_stored(const Reporter& file, hid_t ds, const char* name, int64_t length,
                  size_t element_bytes, uint64_t file_bytes) {
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (H5Pget_nfilters(dcpl.get()) > 0) return;
  const auto declared = static_cast<unsigned __int128>(length) * element_bytes;
  const uint64_t stored = H5Dget_storage_size(ds);
  if (declared > stored || declared > file_bytes)
    file.fail(detail::concat("dataset '/", name, "' declares ", length, " elements (",
                             uint64_t(std::min<unsigned __int128>(declared, UINT64_MAX)),
                             " bytes) but the file stores ", stored, " bytes of it (", file_bytes,
                             " bytes in all): truncated or forged"));
}

/// Stored uint16 ids to the in-memory int32.
template <class T>
void widen(const T* src, int32_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = int32_t(src[i]);
}

/// Whether any id is outside [0, limit): a branch-free reduction the compiler vectorises.
bool any_outside(const int32_t* p, size_t n, int32_t limit) {
  int32_t lo = 0, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  return lo < 0 || hi >= limit;
}

std::string describe(const TokenizerInfo& t) {
  return detail::concat("'", t.name, "' (vocabulary size ", t.vocab_size, ", hash ", t.vocab_hash,
                        ")");
}

bool same_tokenizer(const TokenizerInfo& a, const TokenizerInfo& b) {
  return a.name == b.name && a.vocab_hash == b.vocab_hash && a.vocab_size == b.vocab_size;
}

// The metadata of a file: its root attributes, checked for plausibility.
struct FileMetadata {
  TokenizerInfo info;
  int64_t num_tokens = 0, num_documents = 0;
  uint32_t tokens_crc = 0, offsets_crc = 0;
};

FileMetadata read_metadata(const Reporter& report, hid_t root) {
  std::string format = read_attr_str(report, root, "format");
  if (format != kFormat)
    report.fail("not a forge token dataset (attribute 'format' is '" + format + "', expected '" +
                kFormat + "')");
  int64_t version = read_attr_int(report, root, "format_version");
  if (version > kTokenDatasetFormatVersion)
    report.fail(detail::concat("format_version ", version,
                               " is newer than this build of forge reads (",
                               kTokenDatasetFormatVersion, "); upgrade forge"));
  if (version < 1) report.fail(detail::concat("unknown format_version ", version));
  FileMetadata m;
  m.info.name = read_attr_str(report, root, "tokenizer");
  m.info.vocab_size = read_attr_int(report, root, "vocab_size");
  m.info.vocab_hash = read_attr_str(report, root, "vocab_hash");
  m.num_tokens = read_attr_int(report, root, "num_tokens");
  m.num_documents = read_attr_int(report, root, "num_documents");
  m.tokens_crc = uint32_t(read_attr_int(report, root, "tokens_crc32"));
  m.offsets_crc = uint32_t(read_attr_int(report, root, "doc_offsets_crc32"));
  if (m.info.vocab_size <= 0 || m.info.vocab_size > int64_t(INT32_MAX) + 1 || m.num_tokens < 0 ||
      m.num_documents < 0 || m.num_documents == INT64_MAX)
    report.fail(detail::concat("implausible metadata: vocab_size ", m.info.vocab_size,
                               ", num_tokens ", m.num_tokens, ", num_documents ",
                               m.num_documents));
  return m;
}

Hid open_hdf5(const Reporter& report, const fs::path& path) {
  if (H5Fis_hdf5(path.c_str()) <= 0) report.fail("not an HDF5 file (truncated or overwritten?)");
  Hid fapl = file_access_plist();
  return report.check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose,
                      "cannot open as HDF5 (truncated or corrupt file)");
}

// One forge-tokens file, open and validated: its metadata, and its ids read in ranges on demand,
// each range checked against the vocabulary (the model's when smaller than the file's).
class TokenFile final : public TokenSource {
 public:
  TokenFile(fs::path path, Hid file, FileMetadata meta, Hid tokens, Hid offsets, bool narrow,
            int64_t model_vocab_size)
      : path_(std::move(path)),
        report_(data_file(path_)),
        file_(std::move(file)),
        meta_(std::move(meta)),
        tokens_(std::move(tokens)),
        offsets_(std::move(offsets)),
        narrow_(narrow),
        model_vocab_size_(model_vocab_size) {}

  int64_t size() const override { return meta_.num_tokens; }
  const FileMetadata& meta() const { return meta_; }
  const fs::path& path() const { return path_; }
  bool narrow() const { return narrow_; }

  /// doc_offsets[d], d in [0, num_documents]: one element read.
  int64_t document_start(int64_t d) const {
    int64_t v = 0;
    read_slab(report_, offsets_.get(), H5T_NATIVE_INT64, hsize_t(d), 1, &v, "doc_offsets");
    return v;
  }
  /// All of doc_offsets.
  std::vector<int64_t> doc_offsets() const {
    std::vector<int64_t> v(size_t(meta_.num_documents + 1));
    for (size_t at = 0; at < v.size(); at += kOffsetBlock)
      read_slab(report_, offsets_.get(), H5T_NATIVE_INT64, at,
                 std::min(kOffsetBlock, v.size() - at), v.data() + at, "doc_offsets");
    return v;
  }

  /// Ids must be below the model's vocabulary size when given, and the file's own.
  int64_t limit() const {
    return model_vocab_size_ >= 0 ? std::min(model_vocab_size_, meta_.info.vocab_size)
                                  : meta_.info.vocab_size;
  }
  bool any_bad(const int32_t* p, int64_t n) const {
    return any_outside(p, size_t(n), int32_t(std::min<int64_t>(limit(), INT32_MAX)));
  }

  /// Error(data) for the first id of p[0, n) (file positions from `at`) outside [0, limit), if any.
  void check_ids(const int32_t* p, int64_t n, int64_t at) const {
    if (!any_bad(p, n)) return;
    int64_t i = 0;
    while (p[i] >= 0 && int64_t(p[i]) < limit()) ++i;
    const int32_t id = p[i];
    if (model_vocab_size_ >= 0 && (id < 0 || id >= model_vocab_size_))
      report_.fail(detail::concat("token id ", id, " at position ", at + i,
                                  " is out of range for the model's vocabulary size ",
                                  model_vocab_size_, " (dataset tokenizer '", meta_.info.name,
                                  "', vocabulary size ", meta_.info.vocab_size, ")"));
    report_.fail(detail::concat("token id ", id, " at position ", at + i,
                                " is outside the dataset's own vocabulary size ",
                                meta_.info.vocab_size, " (tokenizer '", meta_.info.name, "')"));
  }

  /// Reads every id once in blocks as stored: their CRC-32 against tokens_crc32, then their range
  /// (an out-of-range id is reported only after the checksum passed: corruption explains it too).
  void check_contents() const {
    const size_t n_all = size_t(meta_.num_tokens);
    std::vector<uint16_t> narrow(narrow_ ? std::min(kTokenBlock, n_all) : 0);
    std::vector<int32_t> wide(std::min(kTokenBlock, n_all));
    int64_t first_bad_block = -1;
    uint32_t crc = 0;
    for (size_t at = 0; at < n_all; at += kTokenBlock) {
      const size_t n = std::min(kTokenBlock, n_all - at);
      if (narrow_) {
        read_slab(report_, tokens_.get(), H5T_NATIVE_UINT16, at, n, narrow.data(), "tokens");
        crc = crc32(narrow.data(), n * sizeof(uint16_t), crc);
        widen(narrow.data(), wide.data(), n);
      } else {
        read_slab(report_, tokens_.get(), H5T_NATIVE_INT32, at, n, wide.data(), "tokens");
        crc = crc32(wide.data(), n * sizeof(int32_t), crc);
      }
      if (first_bad_block < 0 && any_bad(wide.data(), int64_t(n))) first_bad_block = int64_t(at);
    }
    if (crc != meta_.tokens_crc)
      report_.fail("checksum mismatch in dataset '/tokens' (stored crc32 " +
                   crc_hex(meta_.tokens_crc) + ", computed " + crc_hex(crc) +
                   "): the file is corrupt");
    if (first_bad_block >= 0) {
      const size_t n = std::min(kTokenBlock, n_all - size_t(first_bad_block));
      read_slab(report_, tokens_.get(), H5T_NATIVE_INT32, hsize_t(first_bad_block), n,
                 wide.data(), "tokens");
      check_ids(wide.data(), int64_t(n), first_bad_block);
    }
  }

 private:
  void read_range(int64_t at, int64_t n, int32_t* dst) const override {
    read_slab(report_, tokens_.get(), H5T_NATIVE_INT32, hsize_t(at), hsize_t(n), dst,
                      "tokens");
    check_ids(dst, n, at);
  }

  fs::path path_;
  Reporter report_;
  Hid file_;
  FileMetadata meta_;
  Hid tokens_, offsets_;
  bool narrow_;
  int64_t model_vocab_size_;
};

// Opens and validates one file. Its bytes are checked once: against its digest (the caller
// checked the manifest's: `digest_checked`), or its `.digest` sidecar when there is one, which
// covers every byte, tokens included, so the ids are then only range-checked as they are read; a
// file without one is read whole in a throwaway process first (core/isolate.h), then its tokens
// once more here, checksummed and range-checked. `expected` is compared with the file's
// tokenizer, `expected_is` naming where it comes from.
std::shared_ptr<TokenFile> open_file(const fs::path& path, const TokenizerInfo* expected,
                                     const std::string& expected_is, int64_t model_vocab_size,
                                     bool digest_checked) {
  quiet_hdf5();
  const Reporter report = data_file(path);
  std::error_code ec;
  if (!fs::exists(path, ec)) report.fail("no such token dataset");
  if (fs::is_directory(path, ec)) report.fail("is a directory, not a token dataset");
  const uint64_t file_bytes = regular_file_size(path.string(), kTokenDatasetInput);
  const bool verified = digest_checked || check_sidecar_digest(path, ExitCode::data);
  if (!verified) {
    if (std::optional<std::string> crash =
            probe_file_once(path, [&] { open_file(path, nullptr, "", -1, false); }))
      report.fail("the HDF5 library crashed reading it (" + *crash + "): the file is corrupt");
  }
  Hid file = open_hdf5(report, path);
  const hid_t root = file.get();
  FileMetadata meta = read_metadata(report, root);
  // The cheap, likely mistake first: a dataset prepared with another tokenizer.
  if (expected && !same_tokenizer(*expected, meta.info))
    report.fail("prepared with tokenizer " + describe(meta.info) + " but " + expected_is +
                " tokenizer " + describe(*expected) + "; prepare it again with that tokenizer");

  hid_t raw_type = -1;
  Hid offsets_ds = open_vector(report, root, "doc_offsets", meta.num_documents + 1, &raw_type);
  Hid offsets_type(raw_type, H5Tclose);
  if (H5Tget_class(offsets_type.get()) != H5T_INTEGER || H5Tget_size(offsets_type.get()) != 8)
    report.fail("dataset '/doc_offsets' is not int64");
  check_stored(report, offsets_ds.get(), "doc_offsets", meta.num_documents + 1, sizeof(int64_t),
               file_bytes);
  // Streamed in blocks: checksum, order and end points, without holding the offsets.
  std::vector<int64_t> block(std::min(kOffsetBlock, size_t(meta.num_documents + 1)));
  uint32_t crc = 0;
  int64_t previous = 0;
  for (size_t at = 0; at < size_t(meta.num_documents + 1); at += kOffsetBlock) {
    const size_t n = std::min(kOffsetBlock, size_t(meta.num_documents + 1) - at);
    read_slab(report, offsets_ds.get(), H5T_NATIVE_INT64, at, n, block.data(), "doc_offsets");
    crc = crc32(block.data(), n * sizeof(int64_t), crc);
    if (at == 0 && block[0] != 0)
      report.fail(detail::concat("doc_offsets must run from 0 to num_tokens ", meta.num_tokens,
                                 ", got ", block[0], " at the start"));
    for (size_t i = 0; i < n; ++i) {
      if (block[i] < previous)
        report.fail(detail::concat("doc_offsets decrease at document ", at + i - 1, " (",
                                   previous, " > ", block[i], ")"));
      previous = block[i];
    }
  }
  if (crc != meta.offsets_crc)
    report.fail("checksum mismatch in dataset '/doc_offsets' (stored crc32 " +
                crc_hex(meta.offsets_crc) + ", computed " + crc_hex(crc) +
                "): the file is corrupt");
  if (previous != meta.num_tokens)
    report.fail(detail::concat("doc_offsets must run from 0 to num_tokens ", meta.num_tokens,
                               ", got 0 .. ", previous));

  Hid tokens_ds = open_vector(report, root, "tokens", meta.num_tokens, &raw_type);
  Hid tokens_type(raw_type, H5Tclose);
  const size_t width = H5Tget_size(tokens_type.get());
  const bool is_u16 = width == 2 && H5Tget_sign(tokens_type.get()) == H5T_SGN_NONE;
  const bool is_i32 = width == 4 && H5Tget_sign(tokens_type.get()) == H5T_SGN_2;
  if (H5Tget_class(tokens_type.get()) != H5T_INTEGER || !(is_u16 || is_i32))
    report.fail("dataset '/tokens' must be uint16 or int32");
  check_stored(report, tokens_ds.get(), "tokens", meta.num_tokens, width, file_bytes);
  auto f = std::make_shared<TokenFile>(path, std::move(file), std::move(meta),
                                       std::move(tokens_ds), std::move(offsets_ds), is_u16,
                                       model_vocab_size);
  if (!verified) f->check_contents();
  return f;
}

// Ids move to and from disk in blocks of this many through a cache of this many blocks (16 MiB).
constexpr int64_t kCacheBlock = 8192;
constexpr int64_t kCacheBlocks = 512;

}  // namespace

int64_t first_validation_document(int64_t num_documents, int64_t num_tokens, double val_fraction,
                                  const std::function<int64_t(int64_t)>& document_start,
                                  const fs::path& path) {
  FORGE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction must be in [0, 1), got ",
              val_fraction);
  const int64_t D = num_documents;
  if (val_fraction == 0.0) return D;
  if (D < 2)
    data_file(path).fail(detail::concat(
        "has ", D, " document(s); splitting off validation by document", " needs at least 2"));
  // The boundary nearest to where the tail of val_fraction * N tokens starts: the first of
  // starts 0 .. D - 1 at or after it, or the one before when that is nearer.
  const double target = double(num_tokens) * (1.0 - val_fraction);
  int64_t lo = 0, hi = D;  // the answer k is in [lo, hi]: start(k) >= target, start(k-1) < target
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (document_start(mid) < int64_t(target))
      lo = mid + 1;
    else
      hi = mid;
  }
  int64_t k = lo;
  if (k > 0) {
    const double before = double(document_start(k - 1));
    const double at = double(k < D ? document_start(k) : num_tokens);
    if (target - before <= at - target) k -= 1;
  }
  return std::clamp<int64_t>(k, 1, D - 1);
}

TokenDataset::TokenDataset(fs::path path, TokenizerInfo info,
                           std::shared_ptr<const std::vector<int32_t>> tokens,
                           std::vector<int64_t> doc_offsets)
    : path_(std::move(path)),
      info_(std::move(info)),
      tokens_(std::move(tokens)),
      doc_offsets_(std::move(doc_offsets)) {
  FORGE_CHECK(!doc_offsets_.empty() && doc_offsets_.front() == 0 &&
                  doc_offsets_.back() == int64_t(tokens_->size()),
              "TokenDataset: doc_offsets must run from 0 to the token count ", tokens_->size());
}

TokenSplit TokenDataset::split_by_document(double val_fraction) const {
  const int64_t first_val =
      first_validation_document(num_documents(), num_tokens(), val_fraction,
                                [&](int64_t d) { return doc_offsets_[size_t(d)]; }, path_);
  auto start = tokens_->begin() + ptrdiff_t(doc_offsets_[size_t(first_val)]);
  return {std::make_shared<const std::vector<int32_t>>(tokens_->begin(), start),
          std::make_shared<const std::vector<int32_t>>(start, tokens_->end())};
}

TokenDataset open_token_dataset(const fs::path& path, const TokenizerInfo* expected,
                                int64_t model_vocab_size) {
  std::shared_ptr<TokenFile> f =
      open_file(path, expected, "the model uses", model_vocab_size, false);
  auto tokens = std::make_shared<std::vector<int32_t>>(size_t(f->size()));
  for (int64_t at = 0; at < f->size(); at += int64_t(kTokenBlock)) {
    const int64_t n = std::min(int64_t(kTokenBlock), f->size() - at);
    f->read(at, n, tokens->data() + at);
  }
  return TokenDataset(path, f->meta().info, std::move(tokens), f->doc_offsets());
}

// ---------------------------------------------------------------------------------------------
// Streaming reader.

struct TokenDatasetReader::Impl {
  fs::path path;
  TokenizerInfo info;
  std::vector<std::shared_ptr<TokenFile>> files;  // the shards in order, or the one file
  std::vector<int64_t> token_starts, doc_starts;  // prefix sums over files, files.size() + 1
  std::shared_ptr<const TokenSource> tokens;

  void index() {
    token_starts = {0};
    doc_starts = {0};
    std::vector<std::shared_ptr<const TokenSource>> parts;
    for (const auto& f : files) {
      token_starts.push_back(token_starts.back() + f->size());
      doc_starts.push_back(doc_starts.back() + f->meta().num_documents);
      parts.push_back(f);
    }
    tokens = cache_tokens(concatenate_tokens(std::move(parts)), kCacheBlock, kCacheBlocks);
  }
};

TokenDatasetReader::TokenDatasetReader(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const fs::path& TokenDatasetReader::path() const { return impl_->path; }
const TokenizerInfo& TokenDatasetReader::info() const { return impl_->info; }
int64_t TokenDatasetReader::num_tokens() const { return impl_->token_starts.back(); }
int64_t TokenDatasetReader::num_documents() const { return impl_->doc_starts.back(); }
int64_t TokenDatasetReader::num_files() const { return int64_t(impl_->files.size()); }
const std::shared_ptr<const TokenSource>& TokenDatasetReader::tokens() const {
  return impl_->tokens;
}

int64_t TokenDatasetReader::document_start(int64_t d) const {
  const Impl& m = *impl_;
  FORGE_CHECK(d >= 0 && d <= num_documents(), "document_start: document ", d, " of ",
              num_documents());
  if (d == num_documents()) return num_tokens();
  // The file holding document d: the last whose first document is at or before it.
  const size_t i =
      size_t(std::upper_bound(m.doc_starts.begin(), m.doc_starts.end() - 1, d) -
             m.doc_starts.begin()) - 1;
  return m.token_starts[i] + m.files[i]->document_start(d - m.doc_starts[i]);
}

TokenSourceSplit TokenDatasetReader::split_by_document(double val_fraction) const {
  const int64_t first_val = first_validation_document(
      num_documents(), num_tokens(), val_fraction, [&](int64_t d) { return document_start(d); },
      impl_->path);
  const int64_t at = document_start(first_val);
  return {slice_tokens(tokens(), 0, at), slice_tokens(tokens(), at, num_tokens())};
}

TokenDatasetIdentity TokenDatasetReader::identity() const {
  TokenDatasetIdentity id{num_tokens(), num_documents(), 0};
  for (const auto& f : impl_->files) {
    const uint32_t crcs[2] = {f->meta().tokens_crc, f->meta().offsets_crc};
    id.crc32 = crc32(crcs, sizeof crcs, id.crc32);
  }
  return id;
}

std::string TokenDatasetIdentity::describe() const {
  return detail::concat(num_tokens, " tokens in ", num_documents, " documents, content crc32 ",
                        crc_hex(crc32));
}

bool is_token_dataset_path(const fs::path& path) {
  return path.extension() == ".h5" || is_shard_directory(path);
}

TokenDatasetReader open_token_dataset_reader(const fs::path& path, const TokenizerInfo* expected,
                                             int64_t model_vocab_size) {
  auto impl = std::make_shared<TokenDatasetReader::Impl>();
  impl->path = path;
  if (!is_shard_directory(path)) {
    impl->files.push_back(
        open_file(path, expected, "the model uses", model_vocab_size, false));
    impl->info = impl->files[0]->meta().info;
    impl->index();
    return TokenDatasetReader(std::move(impl));
  }
  const ShardManifest manifest = read_shard_manifest(path);
  const fs::path manifest_file = path / kShardManifestName;
  const std::string listed = quoted_path(manifest_file.string());
  if (expected && !same_tokenizer(*expected, manifest.tokenizer))
    throw Error(ExitCode::data, listed + ": prepared with tokenizer " +
                                    describe(manifest.tokenizer) + " but the model uses tokenizer " +
                                    describe(*expected) + "; prepare it again with that tokenizer");
  check_shard_files(path, manifest);
  // The digest pass reads every byte of the dataset: the shards on every core, the first failure
  // in manifest order reported.
  std::vector<std::exception_ptr> errors(manifest.shards.size());
  kernels::parallel_for(int64_t(errors.size()), [&](int64_t i) {
    try {
      const TokenShard& s = manifest.shards[size_t(i)];
      check_digest(path / s.file, s.digest, manifest_file.string(), ExitCode::data);
    } catch (...) {
      errors[size_t(i)] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  impl->info = manifest.tokenizer;
  for (size_t i = 0; i < manifest.shards.size(); ++i) {
    const TokenShard& s = manifest.shards[i];
    std::shared_ptr<TokenFile> f = open_file(path / s.file, nullptr, "", model_vocab_size, true);
    const Reporter report = data_file(f->path());
    if (i > 0 && f->narrow() != impl->files[0]->narrow())
      report.fail(detail::concat("stores ids as ", f->narrow() ? "uint16" : "int32", ", but ",
                                 quoted_path(impl->files[0]->path().string()), " as ",
                                 f->narrow() ? "int32" : "uint16",
                                 ": the shards of a dataset share one type"));
    if (!same_tokenizer(f->meta().info, manifest.tokenizer))
      report.fail("prepared with tokenizer " + describe(f->meta().info) + " but " + listed +
                  " lists tokenizer " + describe(manifest.tokenizer));
    if (f->meta().num_tokens != s.num_tokens || f->meta().num_documents != s.num_documents)
      report.fail(detail::concat("holds ", f->meta().num_tokens, " tokens in ",
                                 f->meta().num_documents, " documents, but ", listed, " lists ",
                                 s.num_tokens, " in ", s.num_documents));
    impl->files.push_back(std::move(f));
  }
  impl->index();
  return TokenDatasetReader(std::move(impl));
}

TokenDatasetIdentity read_token_dataset_identity(const fs::path& path) {
  quiet_hdf5();
  std::vector<fs::path> files;
  if (is_shard_directory(path)) {
    for (const TokenShard& s : read_shard_manifest(path).shards) files.push_back(path / s.file);
  } else {
    files.push_back(path);
  }
  TokenDatasetIdentity id{0, 0, 0};
  for (const fs::path& file : files) {
    const Reporter report = data_file(file);
    Hid h = open_hdf5(report, file);
    const FileMetadata meta = read_metadata(report, h.get());
    id.num_tokens += meta.num_tokens;
    id.num_documents += meta.num_documents;
    const uint32_t crcs[2] = {meta.tokens_crc, meta.offsets_crc};
    id.crc32 = crc32(crcs, sizeof crcs, id.crc32);
  }
  return id;
}

}  // namespace forge
