#include "core/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/dtype.h"
#include "core/durable_file.h"
#include "core/file_io.h"

namespace forge {
namespace {

// The format is little-endian on disk; Forge's data is read and written by plain copies.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

using json = nlohmann::json;

// Element sizes of the dtypes the format defines. Forge reads the float ones; the others are
// still validated so that a file mixing them (a BERT's int64 position_ids buffer) opens.
size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// IEEE binary16 -> binary32, subnormals, infinities and NaNs included.
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: shift the mantissa up until its leading one is the implicit bit
    int shift = std::countl_zero(uint16_t(mantissa)) - 5;
    mantissa = (mantissa << shift) & 0x3ffu;
    bits = sign | (uint32_t(113 - shift) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(bits);
}

// IEEE binary32 -> binary16, rounded to nearest even as PyTorch's .half() rounds.
uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x47800000u) return sign | 0x7c00u;  // 2^16 and beyond, infinity included
  if (a >= 0x38800000u) {                       // a normal binary16: rebias 127 -> 15
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);  // a carry out of the mantissa is the next binade, or inf
    return sign | uint16_t(r >> 13);
  }
  // Subnormal: a count of 2^-24 (1024 of them is the smallest normal, which the bits also are);
  // scaling by 2^24 is exact, and nearbyint rounds half to even in the default rounding mode.
  return sign | uint16_t(std::nearbyint(std::bit_cast<float>(a) * 16777216.0f));
}

}  // namespace

const char* stored_float_name(StoredFloat type) {
  switch (type) {
    case StoredFloat::f32: return "F32";
    case StoredFloat::bf16: return "BF16";
    case StoredFloat::f16: return "F16";
  }
  return "?";
}

SafetensorsFile::SafetensorsFile(std::filesystem::path path, ExitCode code)
    : path_(std::move(path)), code_(code) {
  const std::string where = quoted_path(path_.string());
  auto fail = [&](const std::string& what) { throw Error(code_, where + ": " + what); };
  const InputKind kind{"safetensors file", uint64_t(-1), code_};
  file_size_ = regular_file_size(path_.string(), kind);
  std::ifstream in(path_, std::ios::binary);
  if (!in) fail("cannot open it");
  if (file_size_ < 8) fail("not a safetensors file: " + std::to_string(file_size_) + " bytes");
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  if (!in) fail("cannot read the header length");
  if (header_size > kSafetensorsMaxHeader || header_size > file_size_ - 8)
    fail("not a safetensors file: header length " + std::to_string(header_size) + " in a file of " +
         std::to_string(file_size_) + " bytes");
  std::string text(header_size, '\0');
  in.read(text.data(), std::streamsize(header_size));
  if (!in) fail("cannot read the header");
  data_start_ = 8 + header_size;
  const uint64_t data_size = file_size_ - data_start_;

  json header;
  try {
    header = parse_bounded_json(text, /*allow_exceptions=*/false);
  } catch (const JsonTooDeep& e) {
    fail(std::string("the header is not valid JSON: ") + e.what());
  }
  if (header.is_discarded()) fail("the header is not valid JSON");
  if (!header.is_object()) fail("the header is not a JSON object");
  // Named, not structured, bindings: clang's OpenMP mode cannot capture the latter in `bad`.
  for (auto& item : header.items()) {
    const std::string& name = item.key();
    const json& value = item.value();
    if (name == "__metadata__") {
      if (!value.is_object()) fail("__metadata__ is not an object");
      for (auto& [key, item] : value.items()) {
        if (!item.is_string()) fail("__metadata__." + key + " is not a string");
        metadata_[key] = item.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail("tensor '" + name + "': " + what); };
    if (!value.is_object()) bad("not an object");
    for (auto& [key, _] : value.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        bad("unknown field '" + key + "'");
    auto dtype = value.find("dtype");
    auto shape = value.find("shape");
    auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) bad("dtype missing or not a string");
    if (shape == value.end() || !shape->is_array()) bad("shape missing or not an array");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
      bad("data_offsets is not a pair of non-negative integers");
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = dtype->get<std::string>();
    const size_t element = dtype_bytes(entry.dtype);
    if (element == 0) bad("unknown dtype '" + entry.dtype + "'");
    uint64_t bytes = element;
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) bad("the shape holds something other than sizes");
      uint64_t n = d.get<uint64_t>();
      if (n > uint64_t(INT64_MAX) || __builtin_mul_overflow(bytes, n, &bytes))
        bad("its shape overflows");
      entry.shape.push_back(int64_t(n));
    }
    entry.begin = (*offsets)[0].get<uint64_t>();
    entry.end = (*offsets)[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size)
      bad("data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
          ") lie outside the " + std::to_string(data_size) + " data bytes");
    if (entry.end - entry.begin != bytes)
      bad("data_offsets hold " + std::to_string(entry.end - entry.begin) + " bytes, but " +
          entry.dtype + " " + shape_str(entry.shape) + " needs " + std::to_string(bytes));
    entries_.push_back(std::move(entry));
  }
  // The tensors must tile the data section: a gap or an overlap means the header lies about
  // where tensors are, and trailing bytes that no tensor owns mean a damaged or foreign file.
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
                   });
  uint64_t expected = 0;
  for (const SafetensorsEntry& e : entries_) {
    if (e.begin != expected)
      fail("tensor '" + e.name + "' starts at data byte " + std::to_string(e.begin) +
           ", expected " + std::to_string(expected) + " (tensors must not overlap or leave gaps)");
    expected = e.end;
  }
  if (expected != data_size)
    fail("the tensors end at data byte " + std::to_string(expected) + ", but the file holds " +
         std::to_string(data_size));
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::read_f32(const std::string& name) const {
  const std::string where = quoted_path(path_.string());
  const SafetensorsEntry* entry = find(name);
  if (!entry) throw Error(code_, where + ": no tensor '" + name + "'");
  auto fail = [&](const std::string& what) {
    throw Error(code_, where + ": tensor '" + name + "': " + what);
  };
  if (entry->dtype != "F32" && entry->dtype != "F16" && entry->dtype != "BF16" &&
      entry->dtype != "F64")
    fail("dtype " + entry->dtype + " is not a floating-point type Forge reads");
  std::error_code ec;
  if (std::filesystem::file_size(path_, ec) != file_size_ || ec)
    fail("the file changed size since it was opened");
  std::string bytes(entry->end - entry->begin, '\0');
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(data_start_ + entry->begin));
  in.read(bytes.data(), std::streamsize(bytes.size()));
  if (!in) fail("cannot read its data");
  Tensor out = empty(entry->shape);
  float* dst = out.data<float>();
  const int64_t n = out.numel();
  const char* src = bytes.data();
  if (entry->dtype == "F32") {
    std::memcpy(dst, src, bytes.size());
  } else if (entry->dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      dst[i] = float(v);
    }
  } else {
    const bool half = entry->dtype == "F16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      dst[i] = half ? f16_to_f32(v) : bf16_to_f32(bf16{v});
    }
  }
  return out;
}

void write_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata, ExitCode code,
                       StoredFloat stored) {
  const uint64_t width = stored == StoredFloat::f32 ? 4 : 2;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw Error(ExitCode::internal, "write_safetensors: duplicate or reserved name " + t.name);
    if (t.tensor.dtype() != DType::f32)
      throw Error(ExitCode::internal, "write_safetensors: " + t.name + " is not f32");
    const uint64_t bytes = uint64_t(t.tensor.numel()) * width;
    header[t.name] = {{"dtype", stored_float_name(stored)},
                      {"shape", t.tensor.shape()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Padding the header with spaces (valid JSON whitespace) aligns the data to 8 bytes, as the
  // reference writer does, so readers may map it and view tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string content(8 + text.size() + offset, '\0');
  const uint64_t header_size = text.size();
  std::memcpy(content.data(), &header_size, 8);
  std::memcpy(content.data() + 8, text.data(), text.size());
  char* data = content.data() + 8 + text.size();
  for (const NamedTensor& t : tensors) {
    Tensor c = t.tensor.contiguous();
    const float* src = c.data<float>();
    const int64_t n = c.numel();
    if (stored == StoredFloat::f32) {
      std::memcpy(data, src, size_t(n) * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t v =
            stored == StoredFloat::bf16 ? f32_to_bf16(src[i]).bits : f32_to_f16(src[i]);
        std::memcpy(data + 2 * i, &v, 2);
      }
    }
    data += size_t(n) * width;
  }
  write_file_atomic(path, content, code);
}

}  // namespace forge
