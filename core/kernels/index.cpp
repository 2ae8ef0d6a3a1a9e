// Concatenation and axis gather / scatter-add. Work is split over output rows (copies) or over
// (outer block, chunk of inner columns) (scatter-add), so no two threads write the same element and
// the order of additions into any element is the same for every thread count.
#include "core/kernels/index.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <omp.h>

#include "core/dtype.h"

namespace forge::kernels {
namespace {

constexpr int64_t kParallelGrain = 32768;   // elements
constexpr int64_t kParallelBytes = 262144;  // bytes moved before copies go parallel
constexpr int64_t kMinColumns = 16;         // narrowest column range a scatter-add unit owns

inline int64_t index_at(const int64_t* index, const AxisIndex& g, int64_t o, int64_t j,
                        int64_t i) {
  return index[o * g.index_strides[0] + j * g.index_strides[1] + i * g.index_strides[2]];
}

}  // namespace

void cat_rows(const void* const* xs, const int64_t* row_bytes, int count, int64_t outer,
              void* out) {
  std::vector<int64_t> start(size_t(count) + 1, 0);
  for (int t = 0; t < count; ++t) start[size_t(t) + 1] = start[size_t(t)] + row_bytes[t];
  int64_t row = start[size_t(count)], units = outer * count;
  char* dst = static_cast<char*>(out);
#pragma omp parallel for schedule(static) if (outer * row > kParallelBytes && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t o = u / count;
    int t = int(u % count);
    const char* src = static_cast<const char*>(xs[t]) + o * row_bytes[t];
    // An empty input may have no storage at all, and memcpy from null is undefined even for 0 bytes.
    if (row_bytes[t] > 0) std::memcpy(dst + o * row + start[size_t(t)], src, size_t(row_bytes[t]));
  }
}

int64_t first_out_of_range(const int64_t* index, int64_t count, int64_t limit) {
  for (int64_t p = 0; p < count; ++p)
    if (index[p] < 0 || index[p] >= limit) return p;
  return -1;
}

template <class T>
void gather_axis(const T* x, const int64_t* index, const AxisIndex& g, T* out) {
  const int64_t* is = g.index_strides;
  if (g.inner == 1) {  // a single indexed load per output: no per-element bookkeeping
#pragma omp parallel for schedule(static) if (g.outer * g.m > kParallelGrain && g.outer > 1)
    for (int64_t o = 0; o < g.outer; ++o) {
      const T* xo = x + o * g.n;
      const int64_t* io = index + o * is[0];
      T* po = out + o * g.m;
      for (int64_t j = 0; j < g.m; ++j) po[j] = xo[io[j * is[1]]];
    }
    return;
  }
  int64_t units = g.outer * g.m;
#pragma omp parallel for schedule(static) if (units * g.inner > kParallelGrain && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t o = u / g.m, j = u % g.m;
    const T* xo = x + o * g.n * g.inner;
    T* po = out + u * g.inner;
    if (is[2] == 0) {  // one index for the whole row: a row copy
      std::memcpy(static_cast<void*>(po), xo + index_at(index, g, o, j, 0) * g.inner,
                  size_t(g.inner) * sizeof(T));
    } else {
      const int64_t* pi = index + o * is[0] + j * is[1];
      for (int64_t i = 0; i < g.inner; ++i) po[i] = xo[pi[i * is[2]] * g.inner + i];
    }
  }
}

template <class T>
void scatter_add_axis(const T* dout, const int64_t* index, const AxisIndex& g, T* dx) {
  const int64_t* is = g.index_strides;
  bool parallel = g.outer * g.m * g.inner > kParallelGrain;
  if (g.inner == 1) {
#pragma omp parallel for schedule(static) if (parallel && g.outer > 1)
    for (int64_t o = 0; o < g.outer; ++o) {
      T* dxo = dx + o * g.n;
      const int64_t* io = index + o * is[0];
      const T* pd = dout + o * g.m;
      for (int64_t j = 0; j < g.m; ++j) dxo[io[j * is[1]]] += pd[j];
    }
    return;
  }
  // A unit owns columns [i0, i1) of one outer block and walks j in order; with few outer blocks
  // the columns are cut finer so every thread gets work.
  int64_t threads = omp_get_max_threads();
  int64_t cuts = std::clamp<int64_t>((4 * threads + g.outer - 1) / g.outer, 1,
                                     (g.inner + kMinColumns - 1) / kMinColumns);
  int64_t width = (g.inner + cuts - 1) / cuts, units = g.outer * cuts;
#pragma omp parallel for schedule(static) if (parallel && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t o = u / cuts, i0 = (u % cuts) * width;
    int64_t i1 = std::min(g.inner, i0 + width);
    T* dxo = dx + o * g.n * g.inner;
    for (int64_t j = 0; j < g.m; ++j) {
      const T* pd = dout + (o * g.m + j) * g.inner;
      if (is[2] == 0) {
        T* row = dxo + index_at(index, g, o, j, 0) * g.inner;
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) row[i] += pd[i];
      } else {
        const int64_t* pi = index + o * is[0] + j * is[1];
        for (int64_t i = i0; i < i1; ++i) dxo[pi[i * is[2]] * g.inner + i] += pd[i];
      }
    }
  }
}

namespace ref {

void cat_rows(const void* const* xs, const int64_t* row_bytes, int count, int64_t outer,
              void* out) {
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o)
    for (int t = 0; t < count; ++t) {
      const char* src = static_cast<const char*>(xs[t]) + o * row_bytes[t];
      for (int64_t b = 0; b < row_bytes[t]; ++b) *dst++ = src[b];
    }
}

template <class T>
void gather_axis(const T* x, const int64_t* index, const AxisIndex& g, T* out) {
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t j = 0; j < g.m; ++j)
      for (int64_t i = 0; i < g.inner; ++i)
        out[(o * g.m + j) * g.inner + i] =
            x[(o * g.n + index_at(index, g, o, j, i)) * g.inner + i];
}

template <class T>
void scatter_add_axis(const T* dout, const int64_t* index, const AxisIndex& g, T* dx) {
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t j = 0; j < g.m; ++j)
      for (int64_t i = 0; i < g.inner; ++i)
        dx[(o * g.n + index_at(index, g, o, j, i)) * g.inner + i] +=
            dout[(o * g.m + j) * g.inner + i];
}

}  // namespace ref

#define FORGE_INSTANTIATE_GATHER(T)                                                \
  template void gather_axis<T>(const T*, const int64_t*, const AxisIndex&, T*);    \
  template void ref::gather_axis<T>(const T*, const int64_t*, const AxisIndex&, T*);
#define FORGE_INSTANTIATE_SCATTER(T)                                                    \
  template void scatter_add_axis<T>(const T*, const int64_t*, const AxisIndex&, T*);    \
  template void ref::scatter_add_axis<T>(const T*, const int64_t*, const AxisIndex&, T*);
FORGE_INSTANTIATE_GATHER(float)
FORGE_INSTANTIATE_GATHER(double)
FORGE_INSTANTIATE_GATHER(int64_t)
FORGE_INSTANTIATE_GATHER(bf16)
FORGE_INSTANTIATE_SCATTER(float)
FORGE_INSTANTIATE_SCATTER(double)
#undef FORGE_INSTANTIATE_GATHER
#undef FORGE_INSTANTIATE_SCATTER

}  // namespace forge::kernels
