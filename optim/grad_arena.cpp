// The gradient arena (optim/grad_arena.h): slots, buckets and the reduction protocol of
// docs/distributed.md.
#include "optim/grad_arena.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/kernels/optim.h"

namespace forge::optim {

Shard shard_of(int64_t total, int rank, int ranks) {
  const int64_t blocks = (total + kNormBlock - 1) / kNormBlock;
  auto edge = [&](int r) { return std::min(total, blocks * r / ranks * kNormBlock); };
  return {edge(rank), edge(rank + 1)};
}

std::vector<Shard> shards_of(int64_t total, int ranks) {
  std::vector<Shard> shards;
  for (int r = 0; r < ranks; ++r) shards.push_back(shard_of(total, r, ranks));
  return shards;
}

Shard overlap(const Shard& a, const Shard& b) {
  const int64_t begin = std::max(a.begin, b.begin);
  return {begin, std::max(begin, std::min(a.end, b.end))};
}

GradArena::GradArena(const NamedTensors& params, Comm& comm, int64_t bucket_bytes, bool overlap,
                     bool sharded)
    : params_(params), comm_(comm), overlap_(overlap), sharded_(sharded) {
  int64_t total = 0;
  const DType dtype = params_.empty() ? DType::f32 : params_[0].tensor.dtype();
  // f64 parameters are for gradient checks in one process; MPI sums f32.
  FORGE_CHECK(dtype == DType::f32 || (dtype == DType::f64 && comm_.size() == 1),
              "GradArena: parameters must be f32 (or f64 in one process)");
  for (const NamedTensor& p : params_) {
    FORGE_CHECK(p.tensor.dtype() == dtype && p.tensor.is_contiguous(), "GradArena: parameter '",
                p.name, "' must be contiguous ", dtype_name(dtype), " like the first");
    offsets_.push_back(total);
    total += p.tensor.numel();
  }
  buffer_ = zeros({total}, dtype);
  shards_ = sharded_ ? shards_of(total, comm_.size())
                     : std::vector<Shard>(size_t(comm_.size()), Shard{0, total});
  block_sums_.assign(size_t((total + kNormBlock - 1) / kNormBlock), 0.0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    auto slot = std::make_shared<GradSlot>();
    slot->buffer = make_view(buffer_, p.shape(), contiguous_strides(p.shape()), offsets_[i]);
    if (comm_.size() > 1) slot->ready = [this, i] { on_ready(i); };
    set_grad_slot(p, slot);
    slots_.push_back(std::move(slot));
  }
  // Backward completes the last parameters first: buckets are cut from the end.
  bucket_of_.resize(params_.size());
  const int64_t bucket_elements = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
  for (size_t k = params_.size(); k-- > 0;) {
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_elements) {
      const int64_t end = k + 1 < params_.size() ? offsets_[k + 1] : total;
      buckets_.push_back({end, end, {}});
    }
    Bucket& b = buckets_.back();
    b.begin = offsets_[k];
    b.params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
  }
  completed_.assign(params_.size(), 0);
  reset();
}

GradArena::~GradArena() {
  if (armed_) set_backward_progress(nullptr);
  for (const NamedTensor& p : params_) set_grad_slot(p.tensor, nullptr);
}

void GradArena::reset() {
  for (NamedTensor p : params_) p.tensor.set_grad(Tensor());
}

void GradArena::arm() {
  if (comm_.size() == 1) return;
  std::fill(completed_.begin(), completed_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.started = false;
  }
  next_bucket_ = 0;
  armed_ = true;
  set_backward_progress([this] { comm_.progress(); });
}

void GradArena::on_ready(size_t i) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[i]];
  // A parameter used inside two checkpointed segments gets two accumulations in one backward; the
  // second would miss a reduction already under way.
  FORGE_CHECK(!b.started, "GradArena: '", params_[i].name,
              "' received more gradient after its all-reduce started (a parameter shared between "
              "recomputed segments?)");
  if (!completed_[i]) {
    completed_[i] = 1;
    b.pending--;
  }
  if (overlap_)
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0)
      start(buckets_[next_bucket_++]);
  comm_.progress();
}

void GradArena::start(Bucket& bucket) {
  bucket.started = true;
  float* data = buffer_.data<float>() + bucket.begin;
  if (!sharded_) {
    comm_.start_allreduce_sum(data, bucket.end - bucket.begin);
    return;
  }
  std::vector<int64_t> counts;
  for (const Shard& s : shards_) counts.push_back(overlap(s, {bucket.begin, bucket.end}).size());
  comm_.start_reduce_scatter_sum(data, counts.data());
}

GradArena::Wait GradArena::reduce() {
  if (!armed_) arm();  // a rank that ran no backward still takes part in every reduction
  armed_ = false;
  set_backward_progress(nullptr);
  std::vector<int64_t> reached(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    reached[i] = params_[i].tensor.grad().defined();
    if (!reached[i]) {
      const size_t bytes = dtype_size(buffer_.dtype());
      std::memset(static_cast<char*>(buffer_.raw_data()) + size_t(offsets_[i]) * bytes, 0,
                  size_t(params_[i].tensor.numel()) * bytes);
    }
  }
  if (comm_.size() == 1) return {};
  using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for a machine's ranks
  const Clock::time_point backward_end = Clock::now();
  while (next_bucket_ < buckets_.size()) start(buckets_[next_bucket_++]);
  comm_.wait_all();
  const Clock::time_point done = Clock::now();
  // One reduction agrees on which parameters any rank reached and when the last backward ended.
  reached.push_back(backward_end.time_since_epoch().count());
  comm_.allreduce_max(reached.data(), int64_t(reached.size()));
  const Clock::time_point last_end{Clock::duration(reached.back())};
  reached.pop_back();
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i].tensor;
    if (reached[i] && !p.grad().defined()) p.set_grad(slots_[i]->buffer);
  }
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  return {seconds(done - backward_end), std::max(0.0, seconds(done - last_end))};
}

double GradArena::scale(double factor) {
  const Shard s = shard();
  double* sums = block_sums_.data() + s.begin / kNormBlock;
  const bool share = sharded_ && comm_.size() > 1;
  if (share) std::fill(block_sums_.begin(), block_sums_.end(), 0.0);
  if (buffer_.dtype() == DType::f32)
    kernels::scale_block_sum_squares(buffer_.data<float>() + s.begin, s.size(), float(factor),
                                     kNormBlock, sums);
  else
    kernels::scale_block_sum_squares(buffer_.data<double>() + s.begin, s.size(), factor,
                                     kNormBlock, sums);
  // Every block's sum comes from one rank and zeros from the others: the sum is exact.
  if (share) comm_.allreduce_sum(block_sums_.data(), int64_t(block_sums_.size()));
  double total = 0;
  for (double x : block_sums_) total += x;
  return total;
}

void GradArena::gather_parameters() {
  if (!sharded_ || comm_.size() == 1) return;
  float* buffer = buffer_.data<float>();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Shard mine = overlap(shard(), {offsets_[i], offsets_[i] + params_[i].tensor.numel()});
    std::memcpy(buffer + mine.begin, params_[i].tensor.data<float>() + (mine.begin - offsets_[i]),
                size_t(mine.size()) * sizeof(float));
  }
  std::vector<int64_t> counts;
  for (const Shard& s : shards_) counts.push_back(s.size());
  comm_.allgather(buffer, counts.data());
  for (size_t i = 0; i < params_.size(); ++i)
    std::memcpy(params_[i].tensor.data<float>(), buffer + offsets_[i],
                size_t(params_[i].tensor.numel()) * sizeof(float));
}

}  // namespace forge::optim
