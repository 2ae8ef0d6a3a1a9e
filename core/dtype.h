// Element types. f32 trains, f64 exists so gradient checks can use finite differences precisely,
// bf16 is a storage type for mixed precision (compute happens in f32 after conversion), i64 holds
// token ids and indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace forge {

enum class DType : uint8_t { f32, f64, bf16, i64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i64: return 8;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
  }
  return "?";
}

/// bfloat16 storage: the upper half of an IEEE f32, rounded to nearest even on conversion.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::i64; }

}  // namespace forge

/// Runs the statement with `scalar_t` bound to float or double according to `dtype`; compute
/// kernels exist for these two only (bf16 tensors are converted first).
#define FORGE_DISPATCH_FLOAT(dtype, opname, ...)                                      \
  [&] {                                                                               \
    switch (dtype) {                                                                  \
      case ::forge::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }     \
      case ::forge::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }    \
      default:                                                                        \
        throw ::forge::Error(::forge::ExitCode::internal,                             \
                             std::string(opname) + ": unsupported dtype " +           \
                                 ::forge::dtype_name(dtype) + " (convert with .to())"); \
    }                                                                                 \
  }()
