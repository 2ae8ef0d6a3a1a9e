// A communicator for unit tests of the data-parallel code in one process: it plays one rank of a
// job whose other ranks hold the same values, so a sum over the ranks is a multiplication by
// their number, and it records the reductions it was asked to start.
#pragma once

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "core/comm.h"

namespace forge::testing {

class FakeComm final : public Comm {
 public:
  FakeComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(double* data, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) data[i] *= size_;
  }
  void allreduce_max(int64_t*, int64_t) override {}
  void start_allreduce_sum(float* data, int64_t n) override {
    started.push_back({data, n});
    pending_.push_back({data, n});
    if (on_start) on_start();
  }
  // This rank's part of the sum, as the other ranks' equal parts make it.
  void start_reduce_scatter_sum(float* data, const int64_t* counts) override {
    int64_t first = 0;
    for (int r = 0; r < rank_; ++r) first += counts[r];
    started.push_back({data + first, counts[rank_]});
    pending_.push_back({data + first, counts[rank_]});
    if (on_start) on_start();
  }
  void allgather(float*, const int64_t*) override {}
  // Only this rank's part is known: it lands at its place.
  void gather(const float* part, const int64_t* counts, float* out) override {
    int64_t first = 0;
    for (int r = 0; r < rank_; ++r) first += counts[r];
    if (out) std::copy(part, part + counts[rank_], out + first);
  }
  void progress() override {}
  void wait_all() override {
    for (auto [data, n] : pending_)
      for (int64_t i = 0; i < n; ++i) data[i] *= float(size_);
    pending_.clear();
  }

  std::vector<std::pair<float*, int64_t>> started;  ///< every start_allreduce_sum, in order
  std::function<void()> on_start;                   ///< runs inside each start

 private:
  int rank_, size_;
  std::vector<std::pair<float*, int64_t>> pending_;
};

}  // namespace forge::testing
