// Hugging Face's safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({"<tensor>": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then
// the raw little-endian data, offsets relative to its start. A file from elsewhere is untrusted:
// the whole header is validated against the file's length before any tensor is read or any
// buffer is sized from it, so a hostile file can neither make Forge read out of bounds nor
// allocate more than the file holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/named_tensor.h"

namespace forge {

/// The largest header read (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeader = uint64_t(100) << 20;

/// One tensor of a header: data_offsets are [begin, end) within the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  ///< as spelled in the file: "F32", "BF16", "I64", ...
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// An opened, validated safetensors file. Errors are Error(`code`) with one line naming the file
/// and, where one is at fault, the tensor.
class SafetensorsFile {
 public:
  /// Reads and validates the header: a JSON object; known dtypes; non-negative shapes; each
  /// tensor's byte count equal to its element count times its dtype's size (overflow-checked);
  /// the tensors tiling the data section exactly, without gaps or overlaps, to the file's end.
  explicit SafetensorsFile(std::filesystem::path path, ExitCode code = ExitCode::checkpoint);

  const std::filesystem::path& path() const { return path_; }
  /// In data order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// nullptr when the file has no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;
  /// The tensor as f32 (F32 as stored; F16, BF16 and F64 converted). Error for a missing name,
  /// another dtype, or a file that changed since it was opened.
  Tensor read_f32(const std::string& name) const;

 private:
  std::filesystem::path path_;
  ExitCode code_;
  uint64_t data_start_ = 0;
  uint64_t file_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// The float type a file's tensors are stored in: F32 as they are, or BF16 or F16 rounded to
/// nearest even (an f32 beyond F16's range, |x| >= 65520, becomes an infinity).
enum class StoredFloat { f32, bf16, f16 };
/// As the format spells it: "F32", "BF16", "F16".
const char* stored_float_name(StoredFloat type);

/// Writes `tensors` (f32, any layout; written contiguous) as `stored` with `metadata` in the
/// header, atomically and durably (core/durable_file.h). Names must be unique and not
/// "__metadata__".
void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata, ExitCode code,
                       StoredFloat stored = StoredFloat::f32);

}  // namespace forge
