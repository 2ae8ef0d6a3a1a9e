// Matmul kernels. Every call first normalises its geometry (size-1 dims dropped, mergeable batch
// dims merged, a batch that B broadcasts folded into M), so e.g. [B, T, K] @ [K, N] becomes one
// 2-D GEMM and equivalent geometries share one cached oneDNN primitive. f32 strided operands go to
// oneDNN as strided memory descriptors; only layouts oneDNN refuses (no unit stride in the matrix
// dims, overlapping dims, a batch dim both operands broadcast) are copied to dense scratch. Grouped
// GEMMs use primitives whose ragged dim is a runtime dimension, so new group sizes reuse them. f64
// uses a row-parallel loop, ref a plain triple loop.
#include "core/kernels/matmul.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <unordered_map>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/kernels/copy.h"

namespace forge::kernels {
namespace {

// oneDNN takes at most 12 dims; deeper batches (never seen in practice) are looped over.
constexpr size_t kMaxBatch = 10;

// The dim a grouped GEMM's groups split. Its size changes nearly every call (tokens routed to an
// expert), so its primitive leaves that dim to execution time: one primitive per geometry would
// put oneDNN's JIT on the hot path and flood the cache.
enum class Ragged { none, m, k };

// A geometry after normalisation. C is dense [batch..., m, n].
struct Problem {
  std::vector<int64_t> batch, a_bs, b_bs;
  int64_t m, n, k;
  int64_t a_rs, a_cs, b_rs, b_cs;  // A: row (M) and column (K) strides; B: row (K) and column (N)
  Ragged ragged = Ragged::none;
};

// The stride of a size-1 dim is meaningless; pick one that makes the matrix look plain, so
// oneDNN sees a unit stride and the cache key does not depend on it.
void fix_unit_dims(int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  if (cols == 1) cs = rs == 1 ? std::max<int64_t>(rows, 1) : 1;
  if (rows == 1) rs = cs == 1 ? std::max<int64_t>(cols, 1) : 1;
}

// Row- or column-major with a leading dimension covering the other dim: the layouts a GEMM takes.
bool plain_matrix(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && rs >= cols) || (rs == 1 && cs >= rows);
}

Problem normalise(const MatmulGeometry& g) {
  const size_t nb = g.batch.size();
  assert(g.a_strides.size() == nb + 2 && g.b_strides.size() == nb + 2);
  Problem p;
  p.m = g.m, p.n = g.n, p.k = g.k;
  p.a_rs = g.a_strides[nb], p.a_cs = g.a_strides[nb + 1];
  p.b_rs = g.b_strides[nb], p.b_cs = g.b_strides[nb + 1];
  fix_unit_dims(p.m, p.k, p.a_rs, p.a_cs);
  fix_unit_dims(p.k, p.n, p.b_rs, p.b_cs);
  for (size_t d = 0; d < nb; ++d) {
    if (g.batch[d] == 1) continue;
    int64_t sa = g.a_strides[d], sb = g.b_strides[d];
    // Merge into the previous (outer) kept dim when both operands continue its stride chain.
    if (!p.batch.empty() && p.a_bs.back() == sa * g.batch[d] && p.b_bs.back() == sb * g.batch[d]) {
      p.batch.back() *= g.batch[d];
      p.a_bs.back() = sa, p.b_bs.back() = sb;
      continue;
    }
    p.batch.push_back(g.batch[d]);
    p.a_bs.push_back(sa);
    p.b_bs.push_back(sb);
  }
  // A batch dim that B broadcasts and whose A stride continues A's rows is just more rows of A
  // (kept unless it would turn a layout oneDNN takes into one it does not).
  while (!p.batch.empty() && p.b_bs.back() == 0 && (p.m == 1 || p.a_bs.back() == p.a_rs * p.m)) {
    int64_t m = p.m * p.batch.back(), rs = p.m == 1 ? p.a_bs.back() : p.a_rs, cs = p.a_cs;
    fix_unit_dims(m, p.k, rs, cs);
    if (!plain_matrix(m, p.k, rs, cs) && plain_matrix(p.m, p.k, p.a_rs, p.a_cs)) break;
    p.m = m, p.a_rs = rs, p.a_cs = cs;
    p.batch.pop_back(), p.a_bs.pop_back(), p.b_bs.pop_back();
  }
  return p;
}

int64_t batch_count(const Problem& p) {
  int64_t n = 1;
  for (int64_t b : p.batch) n *= b;
  return n;
}

// Element offsets of A and B for each flat batch index (row-major over p.batch).
void batch_offsets(const Problem& p, std::vector<int64_t>& a_off, std::vector<int64_t>& b_off) {
  int64_t count = batch_count(p);
  a_off.assign(size_t(count), 0);
  b_off.assign(size_t(count), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i;
    for (size_t d = p.batch.size(); d-- > 0;) {
      int64_t idx = rem % p.batch[d];
      rem /= p.batch[d];
      a_off[size_t(i)] += idx * p.a_bs[d];
      b_off[size_t(i)] += idx * p.b_bs[d];
    }
  }
}

// C = beta·C + bias (the whole result when K == 0).
template <class T>
void init_rows(T* c, int64_t rows, int64_t n, const T* bias, float beta) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      T prior = beta == 0.f ? T(0) : T(beta) * c[r * n + j];
      c[r * n + j] = prior + (bias ? bias[j] : T(0));
    }
}

// ---- f64 (and any T) loop path ----

template <class T>
void matmul_loop(const Problem& p, const T* a, const T* b, const T* bias, T* c, float beta) {
  std::vector<int64_t> a_off, b_off;
  batch_offsets(p, a_off, b_off);
  const int64_t rows = batch_count(p) * p.m;
#pragma omp parallel for schedule(static) if (rows * p.n * p.k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t bi = r / p.m, i = r % p.m;
    T* crow = c + r * p.n;
    init_rows(crow, 1, p.n, bias, beta);
    const T* arow = a + a_off[size_t(bi)] + i * p.a_rs;
    const T* bmat = b + b_off[size_t(bi)];
    for (int64_t q = 0; q < p.k; ++q) {
      const T av = arow[q * p.a_cs];
      const T* brow = bmat + q * p.b_rs;
      for (int64_t j = 0; j < p.n; ++j) crow[j] += av * brow[j * p.b_cs];
    }
  }
}

// ---- f32 oneDNN path ----

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// oneDNN dims and strides of one operand: broadcast batch dims become size 1 (oneDNN's broadcast
// rule) with a stride past everything inside them, which oneDNN's overlap check accepts.
void operand_desc(const Problem& p, bool is_a, memory::dims& dims, memory::dims& strides) {
  const std::vector<int64_t>& bs = is_a ? p.a_bs : p.b_bs;
  const size_t nb = p.batch.size();
  dims.assign(nb + 2, 1);
  strides.assign(nb + 2, 0);
  dims[nb] = is_a ? p.m : p.k, dims[nb + 1] = is_a ? p.k : p.n;
  strides[nb] = is_a ? p.a_rs : p.b_rs, strides[nb + 1] = is_a ? p.a_cs : p.b_cs;
  int64_t extent = std::max(dims[nb] * strides[nb], dims[nb + 1] * strides[nb + 1]);
  for (size_t d = nb; d-- > 0;) {
    if (bs[d] != 0) dims[d] = p.batch[d], strides[d] = bs[d];
    else strides[d] = extent;
    extent = std::max(extent, dims[d] * strides[d]);
  }
}

// oneDNN refuses strided descriptors whose dims may overlap: sorted by stride, each stride must
// reach past the previous dim's whole span (the check in memory_desc_init_by_strides).
bool no_overlap(const memory::dims& dims, const memory::dims& strides) {
  std::vector<size_t> order(dims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (strides[x] != strides[y]) return strides[x] < strides[y];
    return dims[x] != dims[y] ? dims[x] < dims[y] : x < y;
  });
  int64_t min_stride = 1;
  for (size_t d : order) {
    if (strides[d] < min_stride) return false;
    min_stride = strides[d] * dims[d];
  }
  return true;
}

// Whether oneDNN takes the operand as it is: a unit stride in one matrix dim (what its GEMM
// needs) and no overlap. Otherwise (stride-2 slices, expanded rows, as_strided windows) it is
// copied to dense scratch.
bool onednn_takes(const Problem& p, bool is_a) {
  const bool plain = is_a ? plain_matrix(p.m, p.k, p.a_rs, p.a_cs)
                          : plain_matrix(p.k, p.n, p.b_rs, p.b_cs);
  if (!plain) return false;
  memory::dims dims, strides;
  operand_desc(p, is_a, dims, strides);
  return no_overlap(dims, strides);
}

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ uint64_t(x)) * 1099511628211ull;
    return size_t(h);
  }
};

struct Descs {
  memory::desc a, b, bias, c;
};

// oneDNN descriptors of p's operands (bias empty without one); with `open`, p's ragged dim is
// DNNL_RUNTIME_DIM_VAL. Strides stay fixed (groups are blocks of shared buffers) and in the key.
Descs describe(const Problem& p, bool has_bias, bool open, memory::data_type ab) {
  const size_t nd = p.batch.size() + 2;
  memory::dims a_dims, a_strides, b_dims, b_strides;
  operand_desc(p, true, a_dims, a_strides);
  operand_desc(p, false, b_dims, b_strides);
  memory::dims c_dims(p.batch.begin(), p.batch.end());
  c_dims.push_back(p.m);
  c_dims.push_back(p.n);
  memory::dims c_strides(nd);
  int64_t s = 1;
  for (size_t d = nd; d-- > 0;) c_strides[d] = s, s *= c_dims[d];
  memory::dims bias_dims(nd, 1);
  bias_dims[nd - 1] = p.n;
  memory::dims bias_strides(nd, p.n);
  bias_strides[nd - 1] = 1;
  if (open && p.ragged == Ragged::m) a_dims[nd - 2] = c_dims[nd - 2] = DNNL_RUNTIME_DIM_VAL;
  if (open && p.ragged == Ragged::k) a_dims[nd - 1] = b_dims[nd - 2] = DNNL_RUNTIME_DIM_VAL;

  auto f32 = memory::data_type::f32;
  Descs d{memory::desc(a_dims, ab, a_strides), memory::desc(b_dims, ab, b_strides), {},
          memory::desc(c_dims, f32, c_strides)};
  if (has_bias) d.bias = memory::desc(bias_dims, f32, bias_strides);
  return d;
}

struct Primitive {
  dnnl::matmul prim;
  Descs md;
  memory::desc scratchpad;  // ragged primitives: the scratchpad each call brings (user mode)
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Primitive>, KeyHash> map;
  uint64_t hits = 0, misses = 0;
};

Cache& cache() {
  static Cache c;
  return c;
}

// Generation with a growing KV cache makes a new shape per step; past this many the cache is
// cleared rather than grown without bound.
constexpr size_t kMaxCached = 4096;

std::shared_ptr<const Primitive> get_primitive(const Problem& p, bool has_bias, float beta,
                                               memory::data_type ab) {
  // A ragged dim is no part of the key: one primitive serves all its sizes.
  const int64_t m = p.ragged == Ragged::m ? DNNL_RUNTIME_DIM_VAL : p.m;
  const int64_t k = p.ragged == Ragged::k ? DNNL_RUNTIME_DIM_VAL : p.k;
  std::vector<int64_t> key = {m, p.n, k, p.a_rs, p.a_cs, p.b_rs, p.b_cs, int64_t(has_bias),
                              int64_t(ab)};
  uint32_t beta_bits;
  std::memcpy(&beta_bits, &beta, 4);
  key.push_back(beta_bits);
  for (size_t d = 0; d < p.batch.size(); ++d) {
    key.push_back(p.batch[d]);
    key.push_back(p.a_bs[d]);
    key.push_back(p.b_bs[d]);
  }
  Cache& cc = cache();
  std::lock_guard<std::mutex> lock(cc.mu);
  auto it = cc.map.find(key);
  if (it != cc.map.end()) {
    ++cc.hits;
    return it->second;
  }
  ++cc.misses;
  auto prim = std::make_shared<Primitive>();
  prim->md = describe(p, has_bias, true, ab);
  dnnl::primitive_attr attr;
  // Numerics stay f32: no implicit bf16 down-conversion even if DNNL_DEFAULT_FPMATH_MODE says so.
  attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
  if (beta != 0.f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  // Grouped GEMMs run their groups concurrently (grouped_matmul): a ragged primitive takes its
  // scratchpad from each call instead of the library's shared one.
  if (p.ragged != Ragged::none) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const Descs& md = prim->md;
  auto desc = has_bias ? dnnl::matmul::desc(md.a, md.b, md.bias, md.c)
                       : dnnl::matmul::desc(md.a, md.b, md.c);
  dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  if (p.ragged != Ragged::none) prim->scratchpad = pd.scratchpad_desc();
  prim->prim = dnnl::matmul(pd);
  if (cc.map.size() >= kMaxCached) cc.map.clear();
  cc.map.emplace(std::move(key), prim);
  return prim;
}

// A batch dim along which both operands broadcast: oneDNN wants a real size on one side of it.
bool shared_broadcast(const Problem& p) {
  for (size_t d = 0; d < p.batch.size(); ++d)
    if (p.a_bs[d] == 0 && p.b_bs[d] == 0) return true;
  return false;
}

// Copies one operand to dense [batch..., rows, cols] scratch of `dst_type` and rewrites its
// strides in `p` to match. Dims it broadcasts stay broadcast, except that A is expanded along dims
// B broadcasts too. Returns the scratch block (caller frees with its byte size).
void* densify(Problem& p, bool is_a, const void* src, DType src_type, DType dst_type,
              size_t& nbytes) {
  std::vector<int64_t>& bs = is_a ? p.a_bs : p.b_bs;
  int64_t& rs = is_a ? p.a_rs : p.b_rs;
  int64_t& cs = is_a ? p.a_cs : p.b_cs;
  const int64_t rows = is_a ? p.m : p.k, cols = is_a ? p.k : p.n;
  const size_t nd = p.batch.size() + 2;
  std::vector<int64_t> shape(nd), src_strides(nd), dst_strides(nd);
  for (size_t d = 0; d < p.batch.size(); ++d) {
    bool keep_broadcast = bs[d] == 0 && !(is_a && p.b_bs[d] == 0);
    shape[d] = keep_broadcast ? 1 : p.batch[d];
    src_strides[d] = bs[d];
  }
  shape[nd - 2] = rows, shape[nd - 1] = cols;
  src_strides[nd - 2] = rs, src_strides[nd - 1] = cs;
  int64_t total = 1;
  for (size_t d = nd; d-- > 0;) dst_strides[d] = total, total *= shape[d];
  nbytes = size_t(total) * dtype_size(dst_type);
  void* dst = allocator::allocate(nbytes);
  copy_strided(src, src_type, src_strides.data(), dst, dst_type, dst_strides.data(), shape.data(),
               int(nd));
  for (size_t d = 0; d < p.batch.size(); ++d) bs[d] = shape[d] == 1 ? 0 : dst_strides[d];
  rs = dst_strides[nd - 2], cs = 1;
  fix_unit_dims(rows, cols, rs, cs);
  return dst;
}

// A and B are f32, or bf16 (oneDNN multiplies them exactly and sums in f32); C and bias are f32.
void matmul_onednn(Problem p, const void* a, const void* b, DType ab, const float* bias, float* c,
                   float beta) {
  size_t a_bytes = 0, b_bytes = 0;
  void* a_copy = onednn_takes(p, true) && !shared_broadcast(p)
                     ? nullptr
                     : densify(p, true, a, ab, ab, a_bytes);
  void* b_copy = onednn_takes(p, false) ? nullptr : densify(p, false, b, ab, ab, b_bytes);
  const auto type = ab == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto prim = get_primitive(p, bias != nullptr, beta, type);
  // An open dim needs this call's size in the descriptors the memory objects carry.
  const Descs md =
      p.ragged == Ragged::none ? prim->md : describe(p, bias != nullptr, false, type);
  dnnl::engine& eng = cpu_engine();
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(md.a, eng, const_cast<void*>(a_copy ? a_copy : a))},
      {DNNL_ARG_WEIGHTS, memory(md.b, eng, const_cast<void*>(b_copy ? b_copy : b))},
      {DNNL_ARG_DST, memory(md.c, eng, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(md.bias, eng, const_cast<float*>(bias)));
  const size_t scratch_bytes = prim->scratchpad.get_size();
  void* scratch = scratch_bytes ? allocator::allocate(scratch_bytes) : nullptr;
  if (scratch) args.emplace(DNNL_ARG_SCRATCHPAD, memory(prim->scratchpad, eng, scratch));
  dnnl::stream& s = cpu_stream();
  prim->prim.execute(s, args);
  s.wait();
  if (scratch) allocator::deallocate(scratch, scratch_bytes);
  if (a_copy) allocator::deallocate(a_copy, a_bytes);
  if (b_copy) allocator::deallocate(b_copy, b_bytes);
}

// Without bf16 instructions the same numbers come from an f32 GEMM of the operands widened: every
// product of two bf16 values is exact in f32, so only the order of the f32 sums can differ.
void matmul_bf16_widened(Problem p, const bf16* a, const bf16* b, const float* bias, float* c,
                         float beta) {
  size_t a_bytes = 0, b_bytes = 0;
  void* wa = densify(p, true, a, DType::bf16, DType::f32, a_bytes);
  void* wb = densify(p, false, b, DType::bf16, DType::f32, b_bytes);
  matmul_onednn(p, wa, wb, DType::f32, bias, c, beta);
  allocator::deallocate(wa, a_bytes);
  allocator::deallocate(wb, b_bytes);
}

// Runs `run` on each problem left after peeling leading batch dims beyond oneDNN's rank limit.
template <class In, class Out, class Run>
void for_each_subproblem(Problem p, const In* a, const In* b, Out* c, Run run) {
  if (p.batch.size() <= kMaxBatch) return run(p, a, b, c);
  const int64_t outer = p.batch.front(), sa = p.a_bs.front(), sb = p.b_bs.front();
  p.batch.erase(p.batch.begin()), p.a_bs.erase(p.a_bs.begin()), p.b_bs.erase(p.b_bs.begin());
  const int64_t c_step = batch_count(p) * p.m * p.n;
  for (int64_t i = 0; i < outer; ++i)
    for_each_subproblem(p, a + i * sa, b + i * sb, c + i * c_step, run);
}

// The body of kernels::matmul for a normalised problem.
template <class T>
void solve(const Problem& p, const T* a, const T* b, const T* bias, T* c, float beta) {
  const int64_t count = batch_count(p);
  if (count == 0 || p.m == 0 || p.n == 0) return;
  if (p.k == 0) return init_rows(c, count * p.m, p.n, bias, beta);
  if constexpr (std::is_same_v<T, float>) {
    for_each_subproblem(p, a, b, c, [&](const Problem& q, const T* qa, const T* qb, T* qc) {
      matmul_onednn(q, qa, qb, DType::f32, bias, qc, beta);
    });
  } else {
    matmul_loop(p, a, b, bias, c, beta);
  }
}

}  // namespace

template <class T>
void matmul(const MatmulGeometry& g, const T* a, const T* b, const T* bias, T* c, float beta) {
  solve(normalise(g), a, b, bias, c, beta);
}

namespace {
// Each group is a plain 2-D problem at its offsets, marked ragged so that on oneDNN all groups, and
// all later calls whatever their group sizes, share one primitive; `solve_group` multiplies one.
template <class In, class Out, class Solve>
void for_each_group(const GroupedMatmulGeometry& g, const In* a, const In* b, const Out* bias,
                    Out* c, Solve solve_group) {
  assert(!(g.ragged_k && bias));
  const int64_t groups = int64_t(g.offsets.size()) - 1;
  auto group = [&](int64_t i) {
    const int64_t r0 = g.offsets[size_t(i)], len = g.offsets[size_t(i) + 1] - r0;
    MatmulGeometry one{{}, g.m, g.n, g.k, {g.a_strides[0], g.a_strides[1]},
                       {g.b_strides[0], g.b_strides[1]}};
    (g.ragged_k ? one.k : one.m) = len;
    Problem p = normalise(one);
    p.ragged = g.ragged_k ? Ragged::k : Ragged::m;
    const In* ga = a + r0 * g.a_strides[g.ragged_k ? 1 : 0];
    const In* gb = g.ragged_k ? b + r0 * g.b_strides[0] : b + i * g.b_group_stride;
    Out* gc = c + (g.ragged_k ? i * g.m * g.n : r0 * g.n);
    solve_group(p, ga, gb, bias ? bias + i * g.n : nullptr, gc);
  };
  // With several groups per thread, the groups run side by side, each GEMM on one thread (oneDNN
  // runs a primitive single-threaded inside a parallel region; each thread has its own stream and
  // ragged primitives their own scratchpad): a group's few hundred rows split over all threads
  // waste more than they gain (8 groups of [192, 128] x [128, 256], forward and backward: 2.05 ms
  // one after another, 1.80 side by side, 1.73 for one [1536, 128] x [128, 256]).
  if (groups >= 2 * int64_t(omp_get_max_threads())) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < groups; ++i) group(i);
  } else {
    for (int64_t i = 0; i < groups; ++i) group(i);
  }
}
}  // namespace

template <class T>
void grouped_matmul(const GroupedMatmulGeometry& g, const T* a, const T* b, const T* bias, T* c) {
  for_each_group(g, a, b, bias, c,
                 [](const Problem& p, const T* ga, const T* gb, const T* gbias, T* gc) {
                   solve(p, ga, gb, gbias, gc, 0.f);
                 });
}

void grouped_matmul_bf16(const GroupedMatmulGeometry& g, const bf16* a, const bf16* b,
                         const float* bias, float* c, Bf16Kernel kernel) {
  const bool native = kernel == Bf16Kernel::native || (kernel == Bf16Kernel::best && bf16_native());
  for_each_group(g, a, b, bias, c,
                 [&](const Problem& p, const bf16* ga, const bf16* gb, const float* gbias,
                     float* gc) {
                   if (p.m == 0 || p.n == 0) return;
                   if (p.k == 0) return init_rows(gc, p.m, p.n, gbias, 0.f);
                   if (native) matmul_onednn(p, ga, gb, DType::bf16, gbias, gc, 0.f);
                   else matmul_bf16_widened(p, ga, gb, gbias, gc, 0.f);
                 });
}

bool bf16_native() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto bf16_bits = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16_bits) == bf16_bits;
}

void matmul_bf16(const MatmulGeometry& g, const bf16* a, const bf16* b, const float* bias, float* c,
                 float beta, Bf16Kernel kernel) {
  const Problem p = normalise(g);
  const int64_t count = batch_count(p);
  if (count == 0 || p.m == 0 || p.n == 0) return;
  if (p.k == 0) return init_rows(c, count * p.m, p.n, bias, beta);
  const bool native = kernel == Bf16Kernel::native || (kernel == Bf16Kernel::best && bf16_native());
  for_each_subproblem(p, a, b, c, [&](const Problem& q, const bf16* qa, const bf16* qb, float* qc) {
    if (native) matmul_onednn(q, qa, qb, DType::bf16, bias, qc, beta);
    else matmul_bf16_widened(q, qa, qb, bias, qc, beta);
  });
}

MatmulCacheStats matmul_cache_stats() {
  Cache& cc = cache();
  std::lock_guard<std::mutex> lock(cc.mu);
  return {cc.map.size(), cc.hits, cc.misses};
}

template void matmul<float>(const MatmulGeometry&, const float*, const float*, const float*, float*,
                            float);
template void matmul<double>(const MatmulGeometry&, const double*, const double*, const double*,
                             double*, float);
template void grouped_matmul<float>(const GroupedMatmulGeometry&, const float*, const float*,
                                    const float*, float*);
template void grouped_matmul<double>(const GroupedMatmulGeometry&, const double*, const double*,
                                     const double*, double*);

namespace ref {

template <class T>
void matmul(const MatmulGeometry& g, const T* a, const T* b, const T* bias, T* c, float beta) {
  const size_t nb = g.batch.size();
  int64_t count = 1;
  for (int64_t s : g.batch) count *= s;
  for (int64_t bi = 0; bi < count; ++bi) {
    int64_t a_off = 0, b_off = 0, rem = bi;
    for (size_t d = nb; d-- > 0;) {
      int64_t idx = rem % g.batch[d];
      rem /= g.batch[d];
      a_off += idx * g.a_strides[d];
      b_off += idx * g.b_strides[d];
    }
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0.0;
        for (int64_t q = 0; q < g.k; ++q)
          acc += double(a[a_off + i * g.a_strides[nb] + q * g.a_strides[nb + 1]]) *
                 double(b[b_off + q * g.b_strides[nb] + j * g.b_strides[nb + 1]]);
        T& out = c[(bi * g.m + i) * g.n + j];
        if (bias) acc += double(bias[j]);
        if (beta != 0.f) acc += double(beta) * double(out);
        out = T(acc);
      }
  }
}

template <class T>
void grouped_matmul(const GroupedMatmulGeometry& g, const T* a, const T* b, const T* bias, T* c) {
  const int64_t groups = int64_t(g.offsets.size()) - 1;
  const int64_t *as = g.a_strides, *bs = g.b_strides;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t r0 = g.offsets[size_t(i)], r1 = g.offsets[size_t(i) + 1];
    if (g.ragged_k) {
      for (int64_t row = 0; row < g.m; ++row)
        for (int64_t col = 0; col < g.n; ++col) {
          double acc = 0.0;
          for (int64_t q = r0; q < r1; ++q)
            acc += double(a[row * as[0] + q * as[1]]) * double(b[q * bs[0] + col * bs[1]]);
          c[(i * g.m + row) * g.n + col] = T(acc);
        }
    } else {
      const T* bg = b + i * g.b_group_stride;
      for (int64_t row = r0; row < r1; ++row)
        for (int64_t col = 0; col < g.n; ++col) {
          double acc = bias ? double(bias[i * g.n + col]) : 0.0;
          for (int64_t q = 0; q < g.k; ++q)
            acc += double(a[row * as[0] + q * as[1]]) * double(bg[q * bs[0] + col * bs[1]]);
          c[row * g.n + col] = T(acc);
        }
    }
  }
}

template void matmul<float>(const MatmulGeometry&, const float*, const float*, const float*, float*,
                            float);
template void matmul<double>(const MatmulGeometry&, const double*, const double*, const double*,
                             double*, float);
template void grouped_matmul<float>(const GroupedMatmulGeometry&, const float*, const float*,
                                    const float*, float*);
template void grouped_matmul<double>(const GroupedMatmulGeometry&, const double*, const double*,
                                     const double*, double*);

}  // namespace ref

}  // namespace forge::kernels
