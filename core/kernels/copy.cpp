// Rows of the innermost dimension are the unit of work: each thread unravels the row index once,
// then walks the row with plain strides (a memcpy when both sides are dense and dtypes agree, a
// vector loop for dense f32 <-> bf16).
#include "core/kernels/copy.h"

#include <bit>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/kernels/isa.h"

namespace forge::kernels {
namespace {

// The scalar conversions of core/dtype.h as integer arithmetic over a row, so that each target
// clone vectorises them; bitwise the same results.
FORGE_CLONES void narrow(const float* src, bf16* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const auto u = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x40u;
    dst[i].bits = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

FORGE_CLONES void widen(const bf16* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(src[i].bits) << 16);
}

template <class T>
inline double load(const T* p) { return double(*p); }
template <>
inline double load<bf16>(const bf16* p) { return bf16_to_f32(*p); }
template <class T>
inline void store(T* p, double v) { *p = T(v); }
template <>
inline void store<bf16>(bf16* p, double v) { *p = f32_to_bf16(float(v)); }

template <class S, class D>
void copy_rows(const S* src, const int64_t* ss, D* dst, const int64_t* ds, const int64_t* shape,
               int ndim, bool parallel) {
  if (ndim == 0) {
    store(dst, load(src));
    return;
  }
  int64_t inner = shape[ndim - 1], s_in = ss[ndim - 1], d_in = ds[ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d < ndim - 1; ++d) rows *= shape[d];
  if (inner == 0 || rows == 0) return;
#pragma omp parallel for schedule(static) if (parallel && rows * inner > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t so = 0, dofs = 0, rem = r;
    for (int d = ndim - 2; d >= 0; --d) {
      int64_t i = rem % shape[d];
      rem /= shape[d];
      so += i * ss[d];
      dofs += i * ds[d];
    }
    const S* s = src + so;
    D* o = dst + dofs;
    if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) {
      if (s_in == 1 && d_in == 1) {
        narrow(s, o, inner);
        continue;
      }
    }
    if constexpr (std::is_same_v<S, bf16> && std::is_same_v<D, float>) {
      if (s_in == 1 && d_in == 1) {
        widen(s, o, inner);
        continue;
      }
    }
    if constexpr (std::is_same_v<S, D>) {
      if (s_in == 1 && d_in == 1) {
        std::memcpy(o, s, size_t(inner) * sizeof(S));
        continue;
      }
      for (int64_t j = 0; j < inner; ++j) o[j * d_in] = s[j * s_in];
    } else {
      for (int64_t j = 0; j < inner; ++j) store(o + j * d_in, load(s + j * s_in));
    }
  }
}

template <class S>
void copy_from(const S* src, const int64_t* ss, void* dst, DType dt, const int64_t* ds,
               const int64_t* shape, int ndim, bool parallel) {
  switch (dt) {
    case DType::f32: return copy_rows(src, ss, static_cast<float*>(dst), ds, shape, ndim, parallel);
    case DType::f64: return copy_rows(src, ss, static_cast<double*>(dst), ds, shape, ndim, parallel);
    case DType::bf16: return copy_rows(src, ss, static_cast<bf16*>(dst), ds, shape, ndim, parallel);
    case DType::i64:
      return copy_rows(src, ss, static_cast<int64_t*>(dst), ds, shape, ndim, parallel);
  }
}

void dispatch(const void* src, DType st, const int64_t* ss, void* dst, DType dt, const int64_t* ds,
              const int64_t* shape, int ndim, bool parallel) {
  switch (st) {
    case DType::f32:
      return copy_from(static_cast<const float*>(src), ss, dst, dt, ds, shape, ndim, parallel);
    case DType::f64:
      return copy_from(static_cast<const double*>(src), ss, dst, dt, ds, shape, ndim, parallel);
    case DType::bf16:
      return copy_from(static_cast<const bf16*>(src), ss, dst, dt, ds, shape, ndim, parallel);
    case DType::i64:
      return copy_from(static_cast<const int64_t*>(src), ss, dst, dt, ds, shape, ndim, parallel);
  }
}

}  // namespace

void copy_strided(const void* src, DType src_dtype, const int64_t* src_strides, void* dst,
                  DType dst_dtype, const int64_t* dst_strides, const int64_t* shape, int ndim) {
  dispatch(src, src_dtype, src_strides, dst, dst_dtype, dst_strides, shape, ndim, true);
}

namespace ref {
void copy_strided(const void* src, DType src_dtype, const int64_t* src_strides, void* dst,
                  DType dst_dtype, const int64_t* dst_strides, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  std::vector<int64_t> idx(size_t(ndim), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t so = 0, dofs = 0;
    for (int d = 0; d < ndim; ++d) {
      so += idx[d] * src_strides[d];
      dofs += idx[d] * dst_strides[d];
    }
    const char* s = static_cast<const char*>(src) + so * int64_t(dtype_size(src_dtype));
    char* o = static_cast<char*>(dst) + dofs * int64_t(dtype_size(dst_dtype));
    const int64_t one = 1;
    dispatch(s, src_dtype, &one, o, dst_dtype, &one, nullptr, 0, false);
    for (int d = ndim - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace ref

void fill(void* dst, DType dtype, int64_t n, double value) {
  switch (dtype) {
    case DType::f32: {
      float v = float(value), *p = static_cast<float*>(dst);
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::f64: {
      double* p = static_cast<double*>(dst);
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
    case DType::bf16: {
      bf16 v = f32_to_bf16(float(value)), *p = static_cast<bf16*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::i64: {
      int64_t v = int64_t(value), *p = static_cast<int64_t*>(dst);
#pragma omp parallel for simd if (n > 65536)
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
  }
}

}  // namespace forge::kernels
