// Attention kernels. The f32 path works on (query block × key block) tiles: a register-blocked GEMM
// micro-kernel (built for AVX-512, AVX2+FMA and baseline x86-64, picked once at run time) forms the
// products, and vectorised loops (target_clones) do masking and the online softmax in between.
// Causal tiles above the diagonal are skipped and diagonal tiles skip their dead half, so a causal
// call does about half the work of a full one. Forward is split over (batch, head, query block),
// backward over (batch, head) so each thread owns its dK/dV; each thread takes one scratch block per
// call. Grouped-query heads read their key/value head in place; their backward writes dK/dV per
// query head and sums each group afterwards (see attention_backward). Packed rows (segments) narrow
// each query's keys to its record's [start, end): tiles wholly outside every record of a query
// block are skipped, which is where packing saves its work. oneDNN's sgemm
// (single-threaded inside our parallel region) was measured 2.4x slower per 64×64×64 tile than the
// micro-kernel: call overhead and packing dominate at this size.
#include "core/kernels/attention.h"
#include "core/kernels/isa.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/kernels/vecmath.h"

namespace forge::kernels {
namespace {

constexpr int64_t kBlockQ = 64;   // query rows per tile
constexpr int64_t kBlockK = 128;  // keys per tile; also the leading dimension of score tiles
constexpr float kInf = std::numeric_limits<float>::infinity();

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Below this many score·dimension products a call runs on one thread: waking the team costs more
// than the work, and much more when the machine is oversubscribed.
constexpr int64_t kParallelWork = int64_t(1) << 18;
bool worth_threads(const AttentionShape& n) { return n.B * n.H * n.T * n.S * n.D > kParallelWork; }

template <class T>
const T* row_ptr(const T* base, RowStrides s, int64_t b, int64_t h, int64_t i) {
  return base + b * s.b + h * s.h + i * s.row;
}

// The key/value head of query head h: groups of H / Hkv consecutive query heads share one.
int64_t kv_head(const AttentionShape& n, int64_t h) { return h / (n.H / n.Hkv); }

// Each position's record as a key range [start, end) of its packed row, from the non-decreasing
// segment ids [B, T]; empty without segments.
struct Records {
  std::vector<int64_t> start, end;
  Records(const AttentionShape& n, const int64_t* segments) {
    if (!segments) return;
    start.resize(size_t(n.B * n.T));
    end.resize(start.size());
    for (int64_t b = 0; b < n.B; ++b) {
      const int64_t* id = segments + b * n.T;
      for (int64_t t0 = 0, t1 = 0; t0 < n.T; t0 = t1) {
        for (t1 = t0 + 1; t1 < n.T && id[t1] == id[t0];) ++t1;
        assert(t1 == n.T || id[t1] > id[t0]);
        std::fill(start.begin() + b * n.T + t0, start.begin() + b * n.T + t1, t0);
        std::fill(end.begin() + b * n.T + t0, end.begin() + b * n.T + t1, t1);
      }
    }
  }
  const int64_t* starts() const { return start.empty() ? nullptr : start.data(); }
  const int64_t* ends() const { return end.empty() ? nullptr : end.data(); }
};

// ---- GEMM micro-kernel ----
// C (+)= A·B for the small products inside one tile. A(i, k) = a[i*ars + k*acs], so the same kernel
// reads A row-major (Q·Kᵀ, P·V) or transposed (Pᵀ·dO, dSᵀ·Q) without a copy; B is row-major with N a
// multiple of 16. Each MR × (NV·W) block of C stays in registers for the whole K loop.
//
// On a causal tile, entry (r, c) is live iff c <= r + delta. A band tells each group of rows to skip
// what is dead, halving the work of diagonal tiles: `columns` limits the columns computed (scores,
// dP; the caller never reads past a row's live count), `k_upto` and `k_from` limit K where A is zero
// beyond the band (P·V and dS·K read P rows; Pᵀ·dO and dSᵀ·Q read P columns).
enum class Band { none, columns, k_upto, k_from };

struct Gemm {
  int64_t M, N, K;
  const float* a;
  int64_t ars, acs;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  bool accumulate;
  Band band = Band::none;
  int64_t delta = 0;
};

template <int W>
struct Vec {
  typedef float type __attribute__((vector_size(W * sizeof(float)), aligned(sizeof(float))));
};
// Register budget: AVX-512 holds 4×4 zmm accumulators, AVX2 6×2 ymm, SSE 4×2 xmm.
constexpr int tile_rows(int w) { return w == 8 ? 6 : 4; }
constexpr int tile_vectors(int w) { return w == 16 ? 4 : 2; }

template <int W, int MR, int NV>
[[gnu::always_inline]] inline void gemm_tile(const Gemm& g, int64_t i0, int64_t j0, int64_t k0,
                                             int64_t k1) {
  using V = typename Vec<W>::type;
  const float* a = g.a + i0 * g.ars;
  const float* b = g.b + j0;
  float* c = g.c + i0 * g.ldc + j0;
  const int64_t ars = g.ars, acs = g.acs, ldb = g.ldb, ldc = g.ldc;
  V acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      acc[i][j] = g.accumulate ? *reinterpret_cast<const V*>(c + i * ldc + j * W) : V{};
  for (int64_t k = k0; k < k1; ++k) {
    V bk[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bk[j] = *reinterpret_cast<const V*>(b + k * ldb + j * W);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float ai = a[i * ars + k * acs];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] += ai * bk[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) *reinterpret_cast<V*>(c + i * ldc + j * W) = acc[i][j];
}

template <int W, int MR, int NV>
[[gnu::always_inline]] inline void gemm_column_tail(const Gemm& g, int64_t i0, int64_t j0,
                                                    int64_t nv, int64_t k0, int64_t k1) {
  if constexpr (NV > 0) {
    if (nv == NV) gemm_tile<W, MR, NV>(g, i0, j0, k0, k1);
    else gemm_column_tail<W, MR, NV - 1>(g, i0, j0, nv, k0, k1);
  }
}

// Rows [i0, i0 + MR): the band narrows N or K for this group only.
template <int W, int MR>
[[gnu::always_inline]] inline void gemm_rows(const Gemm& g, int64_t i0) {
  constexpr int NV = tile_vectors(W);
  const int64_t last = i0 + MR - 1;
  int64_t n = g.N, k0 = 0, k1 = g.K;
  if (g.band == Band::columns) n = std::clamp(round16(last + g.delta + 1), int64_t(0), g.N);
  if (g.band == Band::k_upto) k1 = std::clamp(last + g.delta + 1, int64_t(0), g.K);
  if (g.band == Band::k_from) k0 = std::clamp(i0 - g.delta, int64_t(0), g.K);
  int64_t j = 0;
  for (; j + NV * W <= n; j += NV * W) gemm_tile<W, MR, NV>(g, i0, j, k0, k1);
  gemm_column_tail<W, MR, NV - 1>(g, i0, j, (n - j) / W, k0, k1);
}

template <int W, int MR>
[[gnu::always_inline]] inline void gemm_row_tail(const Gemm& g, int64_t i0, int64_t mr) {
  if constexpr (MR > 0) {
    if (mr == MR) gemm_rows<W, MR>(g, i0);
    else gemm_row_tail<W, MR - 1>(g, i0, mr);
  }
}

template <int W>
[[gnu::always_inline]] inline void gemm_impl(const Gemm& g) {
  constexpr int MR = tile_rows(W);
  int64_t i = 0;
  for (; i + MR <= g.M; i += MR) gemm_rows<W, MR>(g, i);
  gemm_row_tail<W, MR - 1>(g, i, g.M - i);
}

// ---- transposition ----
// dst[d * ld + s] = src[s * row_stride + d] for s < ns, d < D: keys or values laid out along s, as
// the GEMM's B operand needs. W×W blocks are transposed in registers (log2 W interleave stages);
// the ragged edges go element by element.

// Source lane of output lane e when interleaving h-wide chunks of a (lanes [0, w)) and b ([w, 2w)).
constexpr int interleave_lane(int w, int h, bool high, int e) {
  const int chunk = e / (2 * h) * (2 * h), k = e % (2 * h);
  return (k < h ? chunk + k : w + chunk + k - h) + (high ? h : 0);
}

template <int W, int H, int... E>
[[gnu::always_inline]] inline void interleave_rows(typename Vec<W>::type* r, int i,
                                                   std::integer_sequence<int, E...>) {
  const auto a = r[i], b = r[i + H];
  r[i] = __builtin_shufflevector(a, b, interleave_lane(W, H, false, E)...);
  r[i + H] = __builtin_shufflevector(a, b, interleave_lane(W, H, true, E)...);
}

template <int W, int H>
[[gnu::always_inline]] inline void transpose_stages(typename Vec<W>::type* r) {
  if constexpr (H > 0) {
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i)
      if (!(i & H)) interleave_rows<W, H>(r, i, std::make_integer_sequence<int, W>());
    transpose_stages<W, H / 2>(r);
  }
}

struct Transpose {
  const float* src;
  int64_t row_stride, ns, D;
  float* dst;
  int64_t ld;
};

[[gnu::always_inline]] inline void transpose_edge(const Transpose& t, int64_t s0, int64_t s1,
                                                  int64_t d0, int64_t d1) {
  for (int64_t d = d0; d < d1; ++d)
    for (int64_t s = s0; s < s1; ++s) t.dst[d * t.ld + s] = t.src[s * t.row_stride + d];
}

template <int W>
[[gnu::always_inline]] inline void transpose_impl(const Transpose& t) {
  using V = typename Vec<W>::type;
  int64_t s0 = 0;
  for (; s0 + W <= t.ns; s0 += W) {
    int64_t d0 = 0;
    for (; d0 + W <= t.D; d0 += W) {
      V r[W];
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i)
        r[i] = *reinterpret_cast<const V*>(t.src + (s0 + i) * t.row_stride + d0);
      transpose_stages<W, W / 2>(r);
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) *reinterpret_cast<V*>(t.dst + (d0 + i) * t.ld + s0) = r[i];
    }
    transpose_edge(t, s0, s0 + W, d0, t.D);
  }
  transpose_edge(t, s0, t.ns, 0, t.D);
}

// ---- run-time dispatch ----
// The AVX-512 and AVX2 builds of both helpers, chosen once; baseline x86-64 gets narrow GEMM tiles
// and an element-wise transpose (4-wide shuffles lose to it).
[[gnu::target("avx512f")]] void gemm_avx512(const Gemm& g) { gemm_impl<16>(g); }
[[gnu::target("avx2,fma")]] void gemm_avx2(const Gemm& g) { gemm_impl<8>(g); }
void gemm_baseline(const Gemm& g) { gemm_impl<4>(g); }
[[gnu::target("avx512f")]] void transpose_avx512(const Transpose& t) { transpose_impl<16>(t); }
[[gnu::target("avx2,fma")]] void transpose_avx2(const Transpose& t) { transpose_impl<8>(t); }
void transpose_baseline(const Transpose& t) { transpose_edge(t, 0, t.ns, 0, t.D); }

struct Isa {
  void (*gemm)(const Gemm&);
  void (*transpose)(const Transpose&);
};
const Isa& isa() {
  static const Isa chosen = [] {
    __builtin_cpu_init();
    if (kAvx512Built && __builtin_cpu_supports("avx512f"))
      return Isa{gemm_avx512, transpose_avx512};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return Isa{gemm_avx2, transpose_avx2};
    return Isa{gemm_baseline, transpose_baseline};
  }();
  return chosen;
}
void gemm(const Gemm& g) { isa().gemm(g); }
void pack_transposed(const float* src, int64_t row_stride, int64_t ns, int64_t D, float* dst,
                     int64_t ld) {
  isa().transpose({src, row_stride, ns, D, dst, ld});
}

// ---- per-thread scratch ----

// One zero-initialised allocation carved into 64-byte aligned buffers. It comes from the caching
// allocator: a fresh malloc of this size is an mmap whose page faults cost more than the kernel.
class Scratch {
 public:
  explicit Scratch(const std::vector<int64_t>& sizes) {
    int64_t total = 16;
    for (int64_t s : sizes) total += round16(s);
    bytes_ = size_t(total) * sizeof(float);
    base_ = static_cast<float*>(allocator::allocate(bytes_));
    std::memset(base_, 0, bytes_);
    int64_t offset = 0;
    for (int64_t s : sizes) {
      parts_.push_back(base_ + offset);
      offset += round16(s);
    }
  }
  ~Scratch() { allocator::deallocate(base_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* operator[](size_t i) const { return parts_[i]; }

 private:
  size_t bytes_;
  float* base_;
  std::vector<float*> parts_;
};

// ---- f32 tiled kernel ----

struct Ctx {
  AttentionShape n;
  bool causal;
  float scale;
  const uint8_t* mask;         // [B, S] or null
  const int64_t *start, *end;  // [B, T]: each query's record, keys [start, end); or null
  int64_t off;                 // S - T: query t sees keys s <= t + off when causal
  int64_t Dp, Sp;              // D and S rounded up to 16 (padded scratch rows and columns)
  const float *q, *k, *v;
  RowStrides qs, ks, vs;
};

// Whether the padding mask lets a key block attend all, some or none of its keys.
enum class Keys { all, some, none };
Keys classify_keys(const uint8_t* mask, int64_t s0, int64_t sk) {
  if (!mask) return Keys::all;
  int64_t on = 0;
  for (int64_t s = 0; s < sk; ++s) on += mask[s0 + s] != 0;
  return on == sk ? Keys::all : (on == 0 ? Keys::none : Keys::some);
}

[[gnu::always_inline]] inline void mask_scores(float* sr, const uint8_t* mask, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) sr[c] = mask[c] ? sr[c] : -kInf;
}

// Scores of keys before column `first` (an earlier record's, in a packed row) become -inf.
[[gnu::always_inline]] inline void hide_before(float* sr, int64_t first, int64_t n) {
  std::fill(sr, sr + std::clamp(first, int64_t(0), n), -kInf);
}

// e^x for softmax arguments (scores minus their max or log-sum-exp, so x <= ~0); x < -87
// (including masked -inf) gives exactly 0 rather than vm::exp's smallest normal.
[[gnu::always_inline]] inline float softmax_exp(float x) { return x < -87.0f ? 0.0f : vm::exp(x); }

// p = exp(s - shift) in place over n scores (masked -inf becomes exactly 0); returns the sum.
[[gnu::always_inline]] inline float exp_scores(float* sr, int64_t n, float shift) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) {
    const float p = softmax_exp(sr[c] - shift);
    sr[c] = p;
    sum += p;
  }
  return sum;
}

struct ForwardBuffers {
  float *kt, *vp;        // the head's keys transposed [D, Sp] and values [S, Dp]
  float *qs, *s, *o;     // scaled queries [Bq, Dp], score tile [Bq, Bk], output accumulator [Bq, Dp]
  float *m, *l;          // running max and sum of each row
  int64_t head, packed;  // keys [0, packed) of key/value head `head` (b * Hkv + kv head) are packed
};

// One query block of one head: out rows [t0, t0 + tq) and their lse.
FORGE_CLONES
void forward_block(const Ctx& c, int64_t bh, int64_t qb, ForwardBuffers& w, float* out, float* lse) {
  const int64_t b = bh / c.n.H, h = bh % c.n.H, hk = kv_head(c.n, h);
  const int64_t T = c.n.T, S = c.n.S, D = c.n.D, Dp = c.Dp, Sp = c.Sp;
  const int64_t t0 = qb * kBlockQ, tq = std::min(kBlockQ, T - t0);
  // Causal rows stop at t + off, and packed rows at their record's end, so later key blocks are
  // skipped outright; records start no earlier than the first row's, so earlier ones are too.
  int64_t s_end = c.causal ? std::clamp(t0 + tq + c.off, int64_t(0), S) : S;
  const int64_t* start = c.start ? c.start + b * T : nullptr;
  const int64_t* end = c.end ? c.end + b * T : nullptr;
  if (end) s_end = std::min(s_end, end[t0 + tq - 1]);
  const int64_t s_begin = start ? start[t0] / kBlockK * kBlockK : 0;
  const uint8_t* mask = c.mask ? c.mask + b * S : nullptr;

  // Query heads of one group reuse the packed keys and values of their shared head.
  if (w.head != b * c.n.Hkv + hk) {
    w.head = b * c.n.Hkv + hk;
    w.packed = 0;
  }
  const int64_t s_need = std::min(S, (s_end + kBlockK - 1) / kBlockK * kBlockK);
  if (s_need > w.packed) {
    pack_transposed(row_ptr(c.k, c.ks, b, hk, w.packed), c.ks.row, s_need - w.packed, D,
                    w.kt + w.packed, Sp);
    for (int64_t s = w.packed; s < s_need; ++s)
      std::memcpy(w.vp + s * Dp, row_ptr(c.v, c.vs, b, hk, s), size_t(D) * sizeof(float));
  }
  w.packed = std::max(w.packed, s_need);

  for (int64_t r = 0; r < tq; ++r) {
    const float* qr = row_ptr(c.q, c.qs, b, h, t0 + r);
    float* dst = w.qs + r * Dp;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) dst[d] = qr[d] * c.scale;
  }
  std::fill(w.o, w.o + tq * Dp, 0.f);
  std::fill(w.m, w.m + tq, -kInf);
  std::fill(w.l, w.l + tq, 0.f);
  const Band band_cols = c.causal ? Band::columns : Band::none;
  const Band band_k_upto = c.causal ? Band::k_upto : Band::none;

  for (int64_t s0 = s_begin; s0 < s_end; s0 += kBlockK) {
    const int64_t sk = std::min(kBlockK, S - s0);
    const Keys keys = classify_keys(mask, s0, sk);
    if (keys == Keys::none) continue;
    const int64_t delta = t0 + c.off - s0;
    gemm({tq, round16(sk), D, w.qs, Dp, 1, w.kt + s0, Sp, w.s, kBlockK, false, band_cols, delta});
    for (int64_t r = 0; r < tq; ++r) {
      float* sr = w.s + r * kBlockK;
      int64_t n = c.causal ? std::clamp(t0 + r + c.off - s0 + 1, int64_t(0), sk) : sk;
      if (end) {
        n = std::clamp(end[t0 + r] - s0, int64_t(0), n);
        hide_before(sr, start[t0 + r] - s0, n);
      }
      if (keys == Keys::some) mask_scores(sr, mask + s0, n);
      float mx = -kInf;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < n; ++j) mx = sr[j] > mx ? sr[j] : mx;
      if (mx == -kInf) {  // nothing to attend in this tile: contributes zero
        std::fill(sr, sr + sk, 0.f);
        continue;
      }
      // Online softmax: rescale what earlier tiles accumulated to the new running max.
      const float m_new = std::max(w.m[r], mx);
      const float alpha = w.m[r] == -kInf ? 0.f : std::exp(w.m[r] - m_new);
      const float sum = exp_scores(sr, n, m_new);
      std::fill(sr + n, sr + sk, 0.f);
      w.l[r] = w.l[r] * alpha + sum;
      w.m[r] = m_new;
      if (alpha != 1.f) {
        float* orow = w.o + r * Dp;
#pragma omp simd
        for (int64_t d = 0; d < Dp; ++d) orow[d] *= alpha;
      }
    }
    gemm({tq, Dp, sk, w.s, kBlockK, 1, w.vp + s0 * Dp, Dp, w.o, Dp, true, band_k_upto, delta});
  }

  for (int64_t r = 0; r < tq; ++r) {
    const int64_t t = t0 + r;
    float* orow = out + (bh * T + t) * D;
    if (w.l[r] > 0.f) {
      const float inv = 1.f / w.l[r];
      const float* acc = w.o + r * Dp;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) orow[d] = acc[d] * inv;
      lse[bh * T + t] = w.m[r] + std::log(w.l[r]);
    } else {
      std::fill(orow, orow + D, 0.f);
      lse[bh * T + t] = kInf;
    }
  }
}

void forward_f32(const Ctx& c, float* out, float* lse) {
  const int64_t heads = c.n.B * c.n.H, blocks = (c.n.T + kBlockQ - 1) / kBlockQ;
  if (heads * blocks == 0) return;
  const int64_t chunk = heads >= 8 ? blocks : 1;
#pragma omp parallel if (worth_threads(c.n))
  {
    Scratch s({c.n.D * c.Sp, c.n.S * c.Dp, kBlockQ * c.Dp, kBlockQ * kBlockK, kBlockQ * c.Dp,
               kBlockQ, kBlockQ});
    ForwardBuffers w{s[0], s[1], s[2], s[3], s[4], s[5], s[6], -1, 0};
    // With enough heads a chunk is one whole head, whose keys then pack once; dynamic because
    // causal query blocks differ in cost (and threads get descheduled on a busy machine).
#pragma omp for schedule(dynamic, chunk)
    for (int64_t task = 0; task < heads * blocks; ++task)
      forward_block(c, task / blocks, task % blocks, w, out, lse);
  }
}

struct BackwardBuffers {
  float *qs, *dop, *dq, *di;  // the head's scaled queries, dO, dQ accumulator [T, Dp]; D_i [T]
  float *kt, *vt, *kp;        // one key block: Kᵀ and Vᵀ [D, Bk], K [Bk, Dp]
  float *p, *ds;              // probability and dS tiles [Bq, Bk]
  float *dk, *dv;             // the key block's accumulators [Bk, Dp]
};

// All gradients of one query head; dk and dv are per query head, [B, H, S, D]. Key blocks outside,
// query blocks inside, so dK and dV of a key block finish in scratch while dQ accumulates over key
// blocks.
FORGE_CLONES
void backward_head(const Ctx& c, int64_t bh, const BackwardBuffers& w, const float* out,
                   const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const int64_t b = bh / c.n.H, h = bh % c.n.H, hk = kv_head(c.n, h);
  const int64_t T = c.n.T, S = c.n.S, D = c.n.D, Dp = c.Dp;
  const float* lse_h = lse + bh * T;
  const uint8_t* mask = c.mask ? c.mask + b * S : nullptr;
  const int64_t* start = c.start ? c.start + b * T : nullptr;
  const int64_t* end = c.end ? c.end + b * T : nullptr;
  const bool want_ds = dq || dk;

  for (int64_t t = 0; t < T; ++t) {
    const float* qr = row_ptr(c.q, c.qs, b, h, t);
    const float* orow = out + (bh * T + t) * D;
    const float* gr = dout + (bh * T + t) * D;
    float* qd = w.qs + t * Dp;
    float* gd = w.dop + t * Dp;
    float di = 0.f;
#pragma omp simd reduction(+ : di)
    for (int64_t d = 0; d < D; ++d) {
      qd[d] = qr[d] * c.scale;
      gd[d] = gr[d];
      di += gr[d] * orow[d];
    }
    w.di[t] = di;  // D_i = rowsum(dO ∘ O) = Σ_s P·dP, the softmax backward's row term
  }
  if (dq) std::fill(w.dq, w.dq + T * Dp, 0.f);

  for (int64_t s0 = 0; s0 < S; s0 += kBlockK) {
    const int64_t sk = std::min(kBlockK, S - s0);
    // Queries that can see these keys: causal ones from s0 - off, packed ones within the records
    // of the block's first and last keys (T == S there).
    int64_t t_first = c.causal ? std::max<int64_t>(0, s0 - c.off) : 0, t_end = T;
    if (start) {
      t_first = std::max(t_first, start[s0]);
      t_end = end[s0 + sk - 1];
    }
    const Keys keys = classify_keys(mask, s0, sk);
    float* dk_out = dk ? dk + (bh * S + s0) * D : nullptr;
    float* dv_out = dv ? dv + (bh * S + s0) * D : nullptr;
    if (t_first >= t_end || keys == Keys::none) {  // no query sees these keys
      if (dk_out) std::fill(dk_out, dk_out + sk * D, 0.f);
      if (dv_out) std::fill(dv_out, dv_out + sk * D, 0.f);
      continue;
    }
    const float* k0 = row_ptr(c.k, c.ks, b, hk, s0);
    pack_transposed(k0, c.ks.row, sk, D, w.kt, kBlockK);
    if (want_ds) pack_transposed(row_ptr(c.v, c.vs, b, hk, s0), c.vs.row, sk, D, w.vt, kBlockK);
    if (dq)
      for (int64_t s = 0; s < sk; ++s)
        std::memcpy(w.kp + s * Dp, k0 + s * c.ks.row, size_t(D) * sizeof(float));
    std::fill(w.dk, w.dk + sk * Dp, 0.f);
    std::fill(w.dv, w.dv + sk * Dp, 0.f);

    for (int64_t t0 = t_first / kBlockQ * kBlockQ; t0 < t_end; t0 += kBlockQ) {
      const int64_t tq = std::min(kBlockQ, T - t0), delta = t0 + c.off - s0;
      const Band band_cols = c.causal ? Band::columns : Band::none;
      const Band band_k_upto = c.causal ? Band::k_upto : Band::none;
      const Band band_k_from = c.causal ? Band::k_from : Band::none;
      // Keys [0, live(r)) of the tile can carry probability for row r.
      auto live = [&](int64_t r) {
        if (lse_h[t0 + r] == kInf) return int64_t(0);  // empty row: no probability, no gradient
        const int64_t n = c.causal ? std::clamp(r + delta + 1, int64_t(0), sk) : sk;
        return end ? std::clamp(end[t0 + r] - s0, int64_t(0), n) : n;
      };
      // P = exp(Q·Kᵀ·scale - lse), the forward's probabilities recomputed.
      gemm({tq, round16(sk), D, w.qs + t0 * Dp, Dp, 1, w.kt, kBlockK, w.p, kBlockK, false,
            band_cols, delta});
      for (int64_t r = 0; r < tq; ++r) {
        float* pr = w.p + r * kBlockK;
        const int64_t n = live(r);
        if (start) hide_before(pr, start[t0 + r] - s0, n);
        if (keys == Keys::some) mask_scores(pr, mask + s0, n);
        exp_scores(pr, n, lse_h[t0 + r]);
        std::fill(pr + n, pr + sk, 0.f);
      }
      // dV += Pᵀ·dO  (from out = P·V)
      if (dv)
        gemm({sk, Dp, tq, w.p, 1, kBlockK, w.dop + t0 * Dp, Dp, w.dv, Dp, true, band_k_from, delta});
      if (!want_ds) continue;
      // dP = dO·Vᵀ; dS = P ∘ (dP - D_i)  (softmax backward)
      gemm({tq, round16(sk), D, w.dop + t0 * Dp, Dp, 1, w.vt, kBlockK, w.ds, kBlockK, false,
            band_cols, delta});
      for (int64_t r = 0; r < tq; ++r) {
        float* dsr = w.ds + r * kBlockK;
        const float* pr = w.p + r * kBlockK;
        const float di = w.di[t0 + r];
        const int64_t n = live(r);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (dsr[j] - di);
        std::fill(dsr + n, dsr + sk, 0.f);
      }
      // dQ += dS·K, dK += dSᵀ·(Q·scale)  (from scores = Q·Kᵀ·scale; dQ's scale is applied at the end)
      if (dq)
        gemm({tq, Dp, sk, w.ds, kBlockK, 1, w.kp, Dp, w.dq + t0 * Dp, Dp, true, band_k_upto, delta});
      if (dk)
        gemm({sk, Dp, tq, w.ds, 1, kBlockK, w.qs + t0 * Dp, Dp, w.dk, Dp, true, band_k_from, delta});
    }
    for (int64_t s = 0; s < sk; ++s) {
      if (dk_out) std::memcpy(dk_out + s * D, w.dk + s * Dp, size_t(D) * sizeof(float));
      if (dv_out) std::memcpy(dv_out + s * D, w.dv + s * Dp, size_t(D) * sizeof(float));
    }
  }
  if (dq) {
    for (int64_t t = 0; t < T; ++t) {
      float* dst = dq + (bh * T + t) * D;
      const float* acc = w.dq + t * Dp;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] = acc[d] * c.scale;
    }
  }
}

void backward_f32(const Ctx& c, const float* out, const float* dout, const float* lse, float* dq,
                  float* dk, float* dv) {
  const int64_t heads = c.n.B * c.n.H, T = c.n.T, Dp = c.Dp;
  if (heads == 0) return;
#pragma omp parallel if (worth_threads(c.n))
  {
    Scratch s({T * Dp, T * Dp, dq ? T * Dp : 0, T, c.n.D * kBlockK, c.n.D * kBlockK,
               kBlockK * Dp, kBlockQ * kBlockK, kBlockQ * kBlockK, kBlockK * Dp, kBlockK * Dp});
    BackwardBuffers w{s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10]};
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < heads; ++bh) backward_head(c, bh, w, out, dout, lse, dq, dk, dv);
  }
}

Ctx make_ctx(const AttentionShape& n, const AttentionParams& p, const Records& records,
             const float* q, RowStrides qs, const float* k, RowStrides ks, const float* v,
             RowStrides vs) {
  return Ctx{n, p.causal, float(p.scale), p.key_mask, records.starts(), records.ends(), n.S - n.T,
             round16(n.D), round16(n.S), q, k, v, qs, ks, vs};
}

// ---- f64, and f32 decode steps: the same algorithm unblocked, one query row at a time ----

// The keys [begin, end) query t of row b may attend before the padding mask: causal ones end at
// t + S - T, a packed row's at its record's bounds.
std::pair<int64_t, int64_t> key_range(const AttentionShape& n, const AttentionParams& p,
                                      const Records& records, int64_t b, int64_t t) {
  int64_t begin = 0, end = p.causal ? std::clamp(t + n.S - n.T + 1, int64_t(0), n.S) : n.S;
  if (const int64_t* starts = records.starts()) {
    begin = starts[b * n.T + t];
    end = std::min(end, records.ends()[b * n.T + t]);
  }
  return {begin, end};
}

template <class T>
void simple_forward(const AttentionShape& n, const AttentionParams& p, const Records& records,
                    const T* q, RowStrides qs, const T* k, RowStrides ks, const T* v, RowStrides vs,
                    T* out, T* lse) {
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t D = n.D, S = n.S;
#pragma omp parallel if (worth_threads(n))
  {
    std::vector<T> score(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < n.B * n.H; ++bh) {
      const int64_t b = bh / n.H, h = bh % n.H, hk = kv_head(n, h);
      for (int64_t t = 0; t < n.T; ++t) {
        const T* qr = row_ptr(q, qs, b, h, t);
        T* orow = out + (bh * n.T + t) * D;
        const auto [begin, end] = key_range(n, p, records, b, t);
        T mx = -inf;
        for (int64_t s = begin; s < end; ++s) {
          if (p.key_mask && !p.key_mask[b * S + s]) {
            score[size_t(s)] = -inf;
            continue;
          }
          const T* kr = row_ptr(k, ks, b, hk, s);
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
          score[size_t(s)] = dot * T(p.scale);
          mx = std::max(mx, score[size_t(s)]);
        }
        std::fill(orow, orow + D, T(0));
        if (mx == -inf) {
          lse[bh * n.T + t] = inf;
          continue;
        }
        T sum = 0;
        for (int64_t s = begin; s < end; ++s) {
          if (score[size_t(s)] == -inf) continue;
          const T e = std::exp(score[size_t(s)] - mx);
          const T* vr = row_ptr(v, vs, b, hk, s);
          sum += e;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) orow[d] += e * vr[d];
        }
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) orow[d] /= sum;
        lse[bh * n.T + t] = mx + std::log(sum);
      }
    }
  }
}

// dk and dv per query head, [B, H, S, D], as backward_head writes them.
template <class T>
void simple_backward(const AttentionShape& n, const AttentionParams& p, const Records& records,
                     const T* q, RowStrides qs, const T* k, RowStrides ks, const T* v,
                     RowStrides vs, const T* out, const T* dout, const T* lse, T* dq, T* dk,
                     T* dv) {
  const int64_t D = n.D, S = n.S, T_ = n.T;
  const T scale = T(p.scale);
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t bh = 0; bh < n.B * n.H; ++bh) {
    const int64_t b = bh / n.H, h = bh % n.H, hk = kv_head(n, h);
    if (dq) std::fill(dq + bh * T_ * D, dq + (bh + 1) * T_ * D, T(0));
    if (dk) std::fill(dk + bh * S * D, dk + (bh + 1) * S * D, T(0));
    if (dv) std::fill(dv + bh * S * D, dv + (bh + 1) * S * D, T(0));
    for (int64_t t = 0; t < T_; ++t) {
      const T L = lse[bh * T_ + t];
      if (std::isinf(L)) continue;
      const T* qr = row_ptr(q, qs, b, h, t);
      const T* gr = dout + (bh * T_ + t) * D;
      const T* orow = out + (bh * T_ + t) * D;
      T di = 0;
      for (int64_t d = 0; d < D; ++d) di += gr[d] * orow[d];
      const auto [begin, end] = key_range(n, p, records, b, t);
      for (int64_t s = begin; s < end; ++s) {
        if (p.key_mask && !p.key_mask[b * S + s]) continue;
        const T* kr = row_ptr(k, ks, b, hk, s);
        const T* vr = row_ptr(v, vs, b, hk, s);
        T score = 0, dp = 0;
        for (int64_t d = 0; d < D; ++d) score += qr[d] * kr[d], dp += gr[d] * vr[d];
        const T prob = std::exp(score * scale - L);
        const T ds = prob * (dp - di) * scale;
        if (dv)
          for (int64_t d = 0; d < D; ++d) dv[(bh * S + s) * D + d] += prob * gr[d];
        if (dq)
          for (int64_t d = 0; d < D; ++d) dq[(bh * T_ + t) * D + d] += ds * kr[d];
        if (dk)
          for (int64_t d = 0; d < D; ++d) dk[(bh * S + s) * D + d] += ds * qr[d];
      }
    }
  }
}

// Uninitialised per-query-head gradients [B, H, S, D] from the caching allocator (the kernels
// overwrite every element); empty when n is 0.
template <class T>
class HeadGrads {
 public:
  explicit HeadGrads(size_t n)
      : bytes_(n * sizeof(T)), data_(n ? static_cast<T*>(allocator::allocate(bytes_)) : nullptr) {}
  ~HeadGrads() {
    if (data_) allocator::deallocate(data_, bytes_);
  }
  HeadGrads(const HeadGrads&) = delete;
  HeadGrads& operator=(const HeadGrads&) = delete;
  T* data() const { return data_; }

 private:
  size_t bytes_;
  T* data_;
};

// out [B, Hkv, S, D] = the sum of per_head [B, H, S, D] over each group of H / Hkv query heads.
// Threads take pieces of a key/value head's [S, D] (so one or two such heads still use every core)
// and add the group's heads to them in head order, streaming through contiguous rows.
template <class T>
void sum_groups(const AttentionShape& n, const T* per_head, T* out) {
  constexpr int64_t kPiece = 4096;
  const int64_t G = n.H / n.Hkv, block = n.S * n.D, pieces = (block + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (worth_threads(n))
  for (int64_t task = 0; task < n.B * n.Hkv * pieces; ++task) {
    const int64_t kv = task / pieces, i0 = task % pieces * kPiece;
    const int64_t len = std::min(kPiece, block - i0);
    const T* src = per_head + kv * G * block + i0;
    T* dst = out + kv * block + i0;
    std::copy(src, src + len, dst);
    for (int64_t g = 1; g < G; ++g) {
      const T* head = src + g * block;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) dst[i] += head[i];
    }
  }
}

}  // namespace

template <class T>
void attention_forward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                       const T* k, RowStrides ks, const T* v, RowStrides vs, T* out, T* lse) {
  // One query a head (a decode step through a KV cache) takes the unblocked path: packing the
  // head's keys and values into tiles would cost as much as attending to them.
  const Records records(n, p.segments);
  if constexpr (std::is_same_v<T, float>)
    if (n.T > 1) return forward_f32(make_ctx(n, p, records, q, qs, k, ks, v, vs), out, lse);
  simple_forward(n, p, records, q, qs, k, ks, v, vs, out, lse);
}

template <class T>
void attention_backward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                        const T* k, RowStrides ks, const T* v, RowStrides vs, const T* out,
                        const T* dout, const T* lse, T* dq, T* dk, T* dv) {
  const Records records(n, p.segments);
  auto per_query_head = [&](T* dk_heads, T* dv_heads) {
    if constexpr (std::is_same_v<T, float>)
      backward_f32(make_ctx(n, p, records, q, qs, k, ks, v, vs), out, dout, lse, dq, dk_heads,
                   dv_heads);
    else
      simple_backward(n, p, records, q, qs, k, ks, v, vs, out, dout, lse, dq, dk_heads, dv_heads);
  };
  if (n.Hkv == n.H) return per_query_head(dk, dv);
  // Grouped heads: every query head's share of dK and dV goes to its own buffer and each group is
  // summed once all are done. Threads still own whole query heads (as many tasks as multi-head
  // attention; splitting by key/value head would idle cores when there are one or two), and the
  // sum runs in head order whatever the thread count.
  const size_t per_head = size_t(n.B * n.H * n.S * n.D);
  HeadGrads<T> dk_heads(dk ? per_head : 0), dv_heads(dv ? per_head : 0);
  per_query_head(dk_heads.data(), dv_heads.data());
  if (dk) sum_groups(n, dk_heads.data(), dk);
  if (dv) sum_groups(n, dv_heads.data(), dv);
}

// Explicit instantiations of the fast kernels (here) and of the references (in namespace ref).
#define FORGE_INSTANTIATE_ATTENTION(T)                                                           \
  template void attention_forward<T>(const AttentionShape&, const AttentionParams&, const T*,    \
                                     RowStrides, const T*, RowStrides, const T*, RowStrides, T*, \
                                     T*);                                                        \
  template void attention_backward<T>(const AttentionShape&, const AttentionParams&, const T*,   \
                                      RowStrides, const T*, RowStrides, const T*, RowStrides,    \
                                      const T*, const T*, const T*, T*, T*, T*);
FORGE_INSTANTIATE_ATTENTION(float)
FORGE_INSTANTIATE_ATTENTION(double)

// ---- reference: each softmax row materialised in double ----

namespace ref {
namespace {

bool attends(const AttentionShape& n, const AttentionParams& p, int64_t b, int64_t t, int64_t s) {
  if (p.causal && s > t + n.S - n.T) return false;
  if (p.segments && p.segments[b * n.T + s] != p.segments[b * n.T + t]) return false;
  return !p.key_mask || p.key_mask[b * n.S + s] != 0;
}

// Probabilities of query (b, h, t) over all S keys (0 where masked); false if no key is attendable.
template <class T>
bool softmax_row(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                 const T* k, RowStrides ks, int64_t b, int64_t h, int64_t t,
                 std::vector<double>& prob, double& lse) {
  const T* qr = row_ptr(q, qs, b, h, t);
  const int64_t hk = h / (n.H / n.Hkv);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t s = 0; s < n.S; ++s) {
    if (!attends(n, p, b, t, s)) continue;
    const T* kr = row_ptr(k, ks, b, hk, s);
    double dot = 0;
    for (int64_t d = 0; d < n.D; ++d) dot += double(qr[d]) * double(kr[d]);
    prob[size_t(s)] = dot * p.scale;
    mx = std::max(mx, prob[size_t(s)]);
  }
  if (std::isinf(mx)) return false;
  double sum = 0;
  for (int64_t s = 0; s < n.S; ++s) {
    prob[size_t(s)] = attends(n, p, b, t, s) ? std::exp(prob[size_t(s)] - mx) : 0.0;
    sum += prob[size_t(s)];
  }
  for (double& x : prob) x /= sum;
  lse = mx + std::log(sum);
  return true;
}

}  // namespace

template <class T>
void attention_forward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                       const T* k, RowStrides ks, const T* v, RowStrides vs, T* out, T* lse) {
  std::vector<double> prob(static_cast<size_t>(n.S));
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h)
      for (int64_t t = 0; t < n.T; ++t) {
        const int64_t row = (b * n.H + h) * n.T + t, hk = h / (n.H / n.Hkv);
        double row_lse = 0;
        const bool any = softmax_row(n, p, q, qs, k, ks, b, h, t, prob, row_lse);
        lse[row] = any ? T(row_lse) : std::numeric_limits<T>::infinity();
        for (int64_t d = 0; d < n.D; ++d) {
          double acc = 0;
          if (any)
            for (int64_t s = 0; s < n.S; ++s)
              acc += prob[size_t(s)] * double(row_ptr(v, vs, b, hk, s)[d]);
          out[row * n.D + d] = T(acc);
        }
      }
}

template <class T>
void attention_backward(const AttentionShape& n, const AttentionParams& p, const T* q, RowStrides qs,
                        const T* k, RowStrides ks, const T* v, RowStrides vs, const T*,
                        const T* dout, const T*, T* dq, T* dk, T* dv) {
  const int64_t D = n.D;
  std::vector<double> gq(static_cast<size_t>(n.B * n.H * n.T * D), 0.0);
  std::vector<double> gk(static_cast<size_t>(n.B * n.Hkv * n.S * D), 0.0), gv(gk.size(), 0.0);
  std::vector<double> prob(static_cast<size_t>(n.S)), dprob(static_cast<size_t>(n.S));
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.H; ++h)
      for (int64_t t = 0; t < n.T; ++t) {
        double unused = 0;
        if (!softmax_row(n, p, q, qs, k, ks, b, h, t, prob, unused)) continue;
        const int64_t row = (b * n.H + h) * n.T + t, hk = h / (n.H / n.Hkv), kv = b * n.Hkv + hk;
        const T* g = dout + row * D;
        const T* qr = row_ptr(q, qs, b, h, t);
        // out = Σ_s P_s v_s  →  dP_s = dout·v_s, dV_s += P_s dout
        double pdp = 0;
        for (int64_t s = 0; s < n.S; ++s) {
          const T* vr = row_ptr(v, vs, b, hk, s);
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += double(g[d]) * double(vr[d]);
          dprob[size_t(s)] = dp;
          pdp += prob[size_t(s)] * dp;
          for (int64_t d = 0; d < D; ++d)
            gv[size_t((kv * n.S + s) * D + d)] += prob[size_t(s)] * double(g[d]);
        }
        // P = softmax(scores)  →  dscores = P ∘ (dP - Σ P∘dP); scores = q·k·scale
        for (int64_t s = 0; s < n.S; ++s) {
          const double ds = prob[size_t(s)] * (dprob[size_t(s)] - pdp) * p.scale;
          const T* kr = row_ptr(k, ks, b, hk, s);
          for (int64_t d = 0; d < D; ++d) {
            gq[size_t(row * D + d)] += ds * double(kr[d]);
            gk[size_t((kv * n.S + s) * D + d)] += ds * double(qr[d]);
          }
        }
      }
  if (dq) std::transform(gq.begin(), gq.end(), dq, [](double x) { return T(x); });
  if (dk) std::transform(gk.begin(), gk.end(), dk, [](double x) { return T(x); });
  if (dv) std::transform(gv.begin(), gv.end(), dv, [](double x) { return T(x); });
}

FORGE_INSTANTIATE_ATTENTION(float)
FORGE_INSTANTIATE_ATTENTION(double)
#undef FORGE_INSTANTIATE_ATTENTION

}  // namespace ref

}  // namespace forge::kernels
