// Selection and moment reductions. Along a contiguous axis (inner == 1) each row is scanned with
// vectorised loops; along a strided axis (inner > 1) whole inner rows are updated at once so the
// loads stay contiguous. Work is split over rows (or chunks of columns) so every output element is
// produced by one thread and results do not depend on the thread count.
#include "core/kernels/reduce.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include <omp.h>

namespace forge::kernels {
namespace {

constexpr int64_t kParallelGrain = 32768;
constexpr int64_t kColumnChunk = 256;  // inner columns one unit of work owns (strided reductions)
constexpr int64_t kBlock = 512;        // row elements per block of the max/min scan

// True when a ranks strictly before b in a max (largest) or min ordering; NaN ranks first in both.
template <class T>
inline bool beats(T a, T b, bool largest) {
  if (a != a) return b == b;
  return largest ? a > b : a < b;
}

// Max or min of a dense row segment and its first position (the first NaN, if any): block
// extremes in one vectorised pass, then a scan of the single block that first reached the result.
template <class T, bool Largest>
FORGE_CLONES
std::pair<T, int64_t> segment_extreme(const T* x, int64_t n) {
  T m = x[0];
  int64_t block = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t e = std::min(n, b + kBlock);
    T bm = x[b];
    int nan = 0;
    if constexpr (Largest) {
#pragma omp simd reduction(max : bm) reduction(| : nan)
      for (int64_t j = b; j < e; ++j) {
        bm = x[j] > bm ? x[j] : bm;
        nan |= x[j] != x[j];
      }
    } else {
#pragma omp simd reduction(min : bm) reduction(| : nan)
      for (int64_t j = b; j < e; ++j) {
        bm = x[j] < bm ? x[j] : bm;
        nan |= x[j] != x[j];
      }
    }
    if (nan) {
      int64_t j = b;
      while (x[j] == x[j]) ++j;
      return {x[j], j};
    }
    if (Largest ? bm > m : bm < m) {
      m = bm;
      block = b;
    }
  }
  int64_t j = block;
  while (!(x[j] == m)) ++j;
  return {m, j};
}

// One row; a long row (`parallel`) is cut into one segment per thread and the first segment
// holding a NaN, else the first holding the best value, wins: exactly the serial answer.
template <class T, bool Largest>
void row_extreme(const T* x, int64_t n, bool parallel, T* out, int64_t* arg) {
  std::pair<T, int64_t> r;
  if (!parallel) {
    r = segment_extreme<T, Largest>(x, n);
  } else {
    int threads = omp_get_max_threads();
    int64_t seg = (n + threads - 1) / threads;
    std::vector<std::pair<T, int64_t>> parts(static_cast<size_t>(threads), {T(0), -1});
#pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; ++t) {
      int64_t b = t * seg, e = std::min(n, b + seg);
      if (b >= e) continue;
      parts[size_t(t)] = segment_extreme<T, Largest>(x + b, e - b);
      parts[size_t(t)].second += b;
    }
    r = parts[0];
    for (size_t t = 1; t < parts.size() && r.first == r.first; ++t)
      if (parts[t].second >= 0 && beats(parts[t].first, r.first, Largest)) r = parts[t];
  }
  if (out) *out = r.first;
  if (arg) *arg = r.second;
}

// Max or min over the middle axis for w columns: x points at the first column of row 0, rows are
// `inner` apart; best and arg receive the w results.
template <class T>
FORGE_CLONES
void column_extreme(const T* x, int64_t n, int64_t inner, int64_t w, bool largest, T* best,
                    int64_t* arg) {
  for (int64_t i = 0; i < w; ++i) {
    best[i] = x[i];
    arg[i] = 0;
  }
  for (int64_t j = 1; j < n; ++j) {
    const T* row = x + j * inner;
    if (largest) {
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) {
        bool take = row[i] > best[i] || (row[i] != row[i] && best[i] == best[i]);
        best[i] = take ? row[i] : best[i];
        arg[i] = take ? j : arg[i];
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < w; ++i) {
        bool take = row[i] < best[i] || (row[i] != row[i] && best[i] == best[i]);
        best[i] = take ? row[i] : best[i];
        arg[i] = take ? j : arg[i];
      }
    }
  }
}

// Two-pass variance of one dense row, accumulated in f64.
template <class T>
FORGE_CLONES
void row_var(const T* x, int64_t n, int64_t correction, T* var, T* mean) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += double(x[j]);
  double mu = s / double(n), q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t j = 0; j < n; ++j) {
    double d = double(x[j]) - mu;
    q += d * d;
  }
  *var = T(q / double(n - correction));
  *mean = T(mu);
}

// Two-pass variance over the middle axis for columns [i0, i1) of one outer block.
template <class T>
FORGE_CLONES
void column_var(const T* x, int64_t n, int64_t inner, int64_t i0, int64_t i1,
                int64_t correction, T* var, T* mean) {
  double s[kColumnChunk] = {}, q[kColumnChunk] = {};
  int64_t w = i1 - i0;
  for (int64_t j = 0; j < n; ++j) {
    const T* row = x + j * inner + i0;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) s[i] += double(row[i]);
  }
  for (int64_t i = 0; i < w; ++i) s[i] /= double(n);
  for (int64_t j = 0; j < n; ++j) {
    const T* row = x + j * inner + i0;
#pragma omp simd
    for (int64_t i = 0; i < w; ++i) {
      double d = double(row[i]) - s[i];
      q[i] += d * d;
    }
  }
  for (int64_t i = 0; i < w; ++i) {
    var[i0 + i] = T(q[i] / double(n - correction));
    mean[i0 + i] = T(s[i]);
  }
}

// Runs body(o, i0, i1) over every outer block and chunk of inner columns, in parallel when the
// whole reduction is large enough to pay for the threads.
template <class Body>
void for_column_chunks(int64_t outer, int64_t n, int64_t inner, Body body) {
  int64_t chunks = (inner + kColumnChunk - 1) / kColumnChunk, units = outer * chunks;
#pragma omp parallel for schedule(static) if (outer * n * inner > kParallelGrain && units > 1)
  for (int64_t u = 0; u < units; ++u) {
    int64_t o = u / chunks, c = u % chunks;
    body(o, c * kColumnChunk, std::min(inner, (c + 1) * kColumnChunk));
  }
}

}  // namespace

template <class T>
void extreme_dim(const T* x, int64_t outer, int64_t n, int64_t inner, bool largest, T* out,
                 int64_t* arg) {
  if (inner == 1) {
    auto row = [&](int64_t o, bool split) {
      T* po = out ? out + o : nullptr;
      int64_t* pa = arg ? arg + o : nullptr;
      if (largest)
        row_extreme<T, true>(x + o * n, n, split, po, pa);
      else
        row_extreme<T, false>(x + o * n, n, split, po, pa);
    };
    if (outer == 1) {  // one long row: the threads split it
      row(0, n > kParallelGrain);
      return;
    }
#pragma omp parallel for schedule(static) if (outer * n > kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) row(o, false);
    return;
  }
  for_column_chunks(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    // Both outputs are needed as running state; write to scratch when the caller skipped one.
    T best_buf[kColumnChunk];
    int64_t arg_buf[kColumnChunk];
    T* best = out ? out + o * inner + i0 : best_buf;
    int64_t* pa = arg ? arg + o * inner + i0 : arg_buf;
    column_extreme(x + o * n * inner + i0, n, inner, i1 - i0, largest, best, pa);
  });
}

template <class T>
void spread_to_ties(const T* x, int64_t n, T value, T g, T* dx) {
  bool nan = value != value;
  int64_t count = 0;
#pragma omp simd reduction(+ : count)
  for (int64_t i = 0; i < n; ++i) count += nan ? x[i] != x[i] : x[i] == value;
  T share = g / T(count);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = (nan ? x[i] != x[i] : x[i] == value) ? share : T(0);
}

template <class T>
void var_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t correction, T* var,
             T* mean) {
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (outer * n > kParallelGrain && outer > 1)
    for (int64_t o = 0; o < outer; ++o) row_var(x + o * n, n, correction, var + o, mean + o);
    return;
  }
  for_column_chunks(outer, n, inner, [&](int64_t o, int64_t i0, int64_t i1) {
    column_var(x + o * n * inner, n, inner, i0, i1, correction, var + o * inner,
               mean + o * inner);
  });
}

template <class T>
void topk_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest,
              T* values, int64_t* indices) {
  if (k == 0) return;
  int64_t columns = outer * inner;
  auto before = [largest](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    if (beats(a.first, b.first, largest)) return true;
    if (beats(b.first, a.first, largest)) return false;
    return a.second < b.second;
  };
#pragma omp parallel if (outer * n * inner > kParallelGrain && columns > 1)
  {
    // One heap per thread, reused by its columns: a router's rows are only a few experts long, and
    // an allocation per row cost more than the selection.
    std::vector<std::pair<T, int64_t>> heap;
    heap.reserve(size_t(k));
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < columns; ++c) {
      int64_t o = c / inner, i = c % inner;
      const T* col = x + o * n * inner + i;
      // A heap of the k best so far whose front is the worst of them: most candidates are rejected
      // by one comparison with the front. Scanning in j order settles ties for the lower j.
      heap.clear();
      for (int64_t j = 0; j < n; ++j) {
        T v = col[j * inner];
        if (int64_t(heap.size()) < k) {
          heap.emplace_back(v, j);
          std::push_heap(heap.begin(), heap.end(), before);
        } else if (beats(v, heap.front().first, largest)) {
          std::pop_heap(heap.begin(), heap.end(), before);
          heap.back() = {v, j};
          std::push_heap(heap.begin(), heap.end(), before);
        }
      }
      std::sort_heap(heap.begin(), heap.end(), before);
      for (int64_t r = 0; r < k; ++r) {
        values[(o * k + r) * inner + i] = heap[size_t(r)].first;
        indices[(o * k + r) * inner + i] = heap[size_t(r)].second;
      }
    }
  }
}

namespace ref {

template <class T>
void extreme_dim(const T* x, int64_t outer, int64_t n, int64_t inner, bool largest, T* out,
                 int64_t* arg) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < n; ++j)
        if (beats(x[(o * n + j) * inner + i], x[(o * n + best) * inner + i], largest)) best = j;
      if (out) out[o * inner + i] = x[(o * n + best) * inner + i];
      if (arg) arg[o * inner + i] = best;
    }
}

template <class T>
void spread_to_ties(const T* x, int64_t n, T value, T g, T* dx) {
  auto tie = [value](T v) { return v == value || (v != v && value != value); };
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += tie(x[i]);
  for (int64_t i = 0; i < n; ++i) dx[i] = tie(x[i]) ? g / T(count) : T(0);
}

template <class T>
void var_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t correction, T* var,
             T* mean) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0, q = 0;
      for (int64_t j = 0; j < n; ++j) s += double(x[(o * n + j) * inner + i]);
      double mu = s / double(n);
      for (int64_t j = 0; j < n; ++j) {
        double d = double(x[(o * n + j) * inner + i]) - mu;
        q += d * d;
      }
      var[o * inner + i] = T(q / double(n - correction));
      mean[o * inner + i] = T(mu);
    }
}

template <class T>
void topk_dim(const T* x, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest,
              T* values, int64_t* indices) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return x[(o * n + j) * inner + i]; };
      std::iota(order.begin(), order.end(), int64_t(0));
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return beats(at(a), at(b), largest); });
      for (int64_t r = 0; r < k; ++r) {
        values[(o * k + r) * inner + i] = at(order[size_t(r)]);
        indices[(o * k + r) * inner + i] = order[size_t(r)];
      }
    }
}

}  // namespace ref

#define FORGE_INSTANTIATE(T)                                                                     \
  template void extreme_dim<T>(const T*, int64_t, int64_t, int64_t, bool, T*, int64_t*);         \
  template void spread_to_ties<T>(const T*, int64_t, T, T, T*);                                  \
  template void var_dim<T>(const T*, int64_t, int64_t, int64_t, int64_t, T*, T*);                \
  template void topk_dim<T>(const T*, int64_t, int64_t, int64_t, int64_t, bool, T*, int64_t*);   \
  template void ref::extreme_dim<T>(const T*, int64_t, int64_t, int64_t, bool, T*, int64_t*);    \
  template void ref::spread_to_ties<T>(const T*, int64_t, T, T, T*);                             \
  template void ref::var_dim<T>(const T*, int64_t, int64_t, int64_t, int64_t, T*, T*);           \
  template void ref::topk_dim<T>(const T*, int64_t, int64_t, int64_t, int64_t, bool, T*,         \
                                 int64_t*);
FORGE_INSTANTIATE(float)
FORGE_INSTANTIATE(double)
#undef FORGE_INSTANTIATE

}  // namespace forge::kernels
