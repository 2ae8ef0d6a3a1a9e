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
#include <optional>

#include "core/checksum.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/isolate.h"
#include "data/hdf5_io.h"

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
void read_range(const Reporter& file, hid_t ds, hid_t mem_type, hsize_t at, hsize_t n, void* dst,
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

// ---------------------------------------------------------------------------------------------
// Reader.

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
  FORGE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "val_fraction must be in [0, 1), got ",
              val_fraction);
  const int64_t D = num_documents(), N = num_tokens();
  int64_t first_val = D;  // index of the first validation document
  if (val_fraction > 0.0) {
    if (D < 2)
      data_file(path_).fail(detail::concat(
          "has ", D, " document(s); splitting off validation by document", " needs at least 2"));
    // The boundary nearest to where the tail of val_fraction * N tokens starts.
    double target = double(N) * (1.0 - val_fraction);
    auto it = std::lower_bound(doc_offsets_.begin(), doc_offsets_.end() - 1, int64_t(target));
    int64_t k = int64_t(it - doc_offsets_.begin());
    if (k > 0 &&
        target - double(doc_offsets_[size_t(k - 1)]) <= double(doc_offsets_[size_t(k)]) - target)
      k -= 1;
    first_val = std::clamp<int64_t>(k, 1, D - 1);
  }
  auto start = tokens_->begin() + ptrdiff_t(doc_offsets_[size_t(first_val)]);
  return {std::make_shared<const std::vector<int32_t>>(tokens_->begin(), start),
          std::make_shared<const std::vector<int32_t>>(start, tokens_->end())};
}

namespace {

/// A 1-D dataset of the given integer kind, with its length checked against the metadata.
Hid open_vector(const Reporter& file, hid_t root, const char* name, int64_t expected_length,
                hid_t* stored_type) {
  if (H5Lexists(root, name, H5P_DEFAULT) <= 0)
    file.fail(std::string("missing dataset '/") + name + "'");
  Hid ds =
      file.check(H5Dopen2(root, name, H5P_DEFAULT), H5Dclose,
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

}  // namespace

TokenDataset open_token_dataset(const fs::path& path, const TokenizerInfo* expected,
                                int64_t model_vocab_size) {
  quiet_hdf5();
  const Reporter report = data_file(path);
  std::error_code ec;
  if (!fs::exists(path, ec)) report.fail("no such token dataset");
  if (fs::is_directory(path, ec)) report.fail("is a directory, not a token dataset");
  const uint64_t file_bytes = regular_file_size(path.string(), kTokenDatasetInput);
  // A dataset `forge prepare` wrote is checked against its digest before libhdf5 parses it; one
  // from elsewhere is read once in a throwaway process first (core/isolate.h), whole: without a
  // tokenizer to compare, so that a later read with another one needs no probe of its own.
  if (!check_sidecar_digest(path, ExitCode::data)) {
    if (std::optional<std::string> crash = probe_file_once(path, [&] { open_token_dataset(path); }))
      report.fail("the HDF5 library crashed reading it (" + *crash + "): the file is corrupt");
  }
  if (H5Fis_hdf5(path.c_str()) <= 0) report.fail("not an HDF5 file (truncated or overwritten?)");
  Hid fapl = file_access_plist();
  Hid file = report.check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose,
                          "cannot open as HDF5 (truncated or corrupt file)");
  const hid_t root = file.get();

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
  TokenizerInfo info;
  info.name = read_attr_str(report, root, "tokenizer");
  info.vocab_size = read_attr_int(report, root, "vocab_size");
  info.vocab_hash = read_attr_str(report, root, "vocab_hash");
  const int64_t num_tokens = read_attr_int(report, root, "num_tokens");
  const int64_t num_documents = read_attr_int(report, root, "num_documents");
  const auto tokens_crc = uint32_t(read_attr_int(report, root, "tokens_crc32"));
  const auto offsets_crc = uint32_t(read_attr_int(report, root, "doc_offsets_crc32"));
  if (info.vocab_size <= 0 || info.vocab_size > int64_t(INT32_MAX) + 1 || num_tokens < 0 ||
      num_documents < 0 || num_documents == INT64_MAX)
    report.fail(detail::concat("implausible metadata: vocab_size ", info.vocab_size,
                               ", num_tokens ", num_tokens, ", num_documents ", num_documents));

  // The cheap, likely mistake first: a dataset prepared with another tokenizer.
  if (expected && (expected->name != info.name || expected->vocab_hash != info.vocab_hash ||
                   expected->vocab_size != info.vocab_size))
    report.fail(detail::concat("prepared with tokenizer '", info.name, "' (vocabulary size ",
                               info.vocab_size, ", hash ", info.vocab_hash,
                               ") but the model uses tokenizer '", expected->name,
                               "' (vocabulary size ", expected->vocab_size, ", hash ",
                               expected->vocab_hash, "); prepare it again with that tokenizer"));

  hid_t raw_type = -1;
  Hid offsets_ds = open_vector(report, root, "doc_offsets", num_documents + 1, &raw_type);
  Hid offsets_type(raw_type, H5Tclose);
  if (H5Tget_class(offsets_type.get()) != H5T_INTEGER || H5Tget_size(offsets_type.get()) != 8)
    report.fail("dataset '/doc_offsets' is not int64");
  check_stored(report, offsets_ds.get(), "doc_offsets", num_documents + 1, sizeof(int64_t),
               file_bytes);
  std::vector<int64_t> offsets(size_t(num_documents + 1));
  read_range(report, offsets_ds.get(), H5T_NATIVE_INT64, 0, offsets.size(), offsets.data(),
             "doc_offsets");
  uint32_t crc = crc32(offsets.data(), offsets.size() * sizeof(int64_t), 0);
  if (crc != offsets_crc)
    report.fail("checksum mismatch in dataset '/doc_offsets' (stored crc32 " +
                crc_hex(offsets_crc) + ", computed " + crc_hex(crc) + "): the file is corrupt");
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    if (offsets[d] > offsets[d + 1])
      report.fail(detail::concat("doc_offsets decrease at document ", d, " (", offsets[d], " > ",
                                 offsets[d + 1], ")"));
  if (offsets.front() != 0 || offsets.back() != num_tokens)
    report.fail(detail::concat("doc_offsets must run from 0 to num_tokens ", num_tokens, ", got ",
                               offsets.front(), " .. ", offsets.back()));

  Hid tokens_ds = open_vector(report, root, "tokens", num_tokens, &raw_type);
  Hid tokens_type(raw_type, H5Tclose);
  const size_t width = H5Tget_size(tokens_type.get());
  const bool is_u16 = width == 2 && H5Tget_sign(tokens_type.get()) == H5T_SGN_NONE;
  const bool is_i32 = width == 4 && H5Tget_sign(tokens_type.get()) == H5T_SGN_2;
  if (H5Tget_class(tokens_type.get()) != H5T_INTEGER || !(is_u16 || is_i32))
    report.fail("dataset '/tokens' must be uint16 or int32");
  check_stored(report, tokens_ds.get(), "tokens", num_tokens, width, file_bytes);

  // One pass over blocks: read as stored, checksum the stored bytes, widen, range-check. An
  // out-of-range id is reported only after the checksum passed, since corruption explains it too.
  const int64_t limit =
      model_vocab_size >= 0 ? std::min(model_vocab_size, info.vocab_size) : info.vocab_size;
  const auto limit32 = int32_t(std::min<int64_t>(limit, INT32_MAX));
  auto tokens = std::make_shared<std::vector<int32_t>>(size_t(num_tokens));
  std::vector<uint16_t> narrow(is_u16 ? std::min<size_t>(kTokenBlock, size_t(num_tokens)) : 0);
  int64_t first_bad_block = -1;
  crc = 0;
  for (size_t at = 0; at < size_t(num_tokens); at += kTokenBlock) {
    size_t n = std::min(kTokenBlock, size_t(num_tokens) - at);
    int32_t* dst = tokens->data() + at;
    if (is_u16) {
      read_range(report, tokens_ds.get(), H5T_NATIVE_UINT16, at, n, narrow.data(), "tokens");
      crc = crc32(narrow.data(), n * sizeof(uint16_t), crc);
      widen(narrow.data(), dst, n);
    } else {
      read_range(report, tokens_ds.get(), H5T_NATIVE_INT32, at, n, dst, "tokens");
      crc = crc32(dst, n * sizeof(int32_t), crc);
    }
    if (first_bad_block < 0 && any_outside(dst, n, limit32)) first_bad_block = int64_t(at);
  }
  if (crc != tokens_crc)
    report.fail("checksum mismatch in dataset '/tokens' (stored crc32 " + crc_hex(tokens_crc) +
                ", computed " + crc_hex(crc) + "): the file is corrupt");
  if (first_bad_block >= 0) {
    size_t i = size_t(first_bad_block);
    while (i < tokens->size() && (*tokens)[i] >= 0 && int64_t((*tokens)[i]) < limit) ++i;
    int32_t id = (*tokens)[i];
    if (model_vocab_size >= 0 && (id < 0 || id >= model_vocab_size))
      report.fail(detail::concat("token id ", id, " at position ", i,
                                 " is out of range for the model's vocabulary size ",
                                 model_vocab_size, " (dataset tokenizer '", info.name,
                                 "', vocabulary size ", info.vocab_size, ")"));
    report.fail(detail::concat("token id ", id, " at position ", i,
                               " is outside the dataset's own vocabulary size ", info.vocab_size,
                               " (tokenizer '", info.name, "')"));
  }
  return TokenDataset(path, std::move(info), std::move(tokens), std::move(offsets));
}

}  // namespace forge
