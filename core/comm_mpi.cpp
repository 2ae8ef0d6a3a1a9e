// The MPI communicator: MPI_COMM_WORLD of the job mpirun started. MPI is called from the main
// thread only (MPI_THREAD_FUNNELED); OpenMP threads inside kernels never touch it.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/error.h"

namespace forge {
namespace {

// MPI counts are ints: longer buffers go in pieces.
constexpr int64_t kMaxCount = INT_MAX / 2;

// A buffer in parts by rank (`counts`), cut into pieces of at most kMaxCount floats: calls
// piece(first, counts, displacements) for each, with every rank's share of the piece relative to
// its first element.
template <class F>
void for_each_piece(int ranks, const int64_t* counts, F&& piece) {
  std::vector<int64_t> begin(size_t(ranks) + 1, 0);
  for (int r = 0; r < ranks; ++r) begin[r + 1] = begin[r] + counts[r];
  for (int64_t lo = 0; lo < begin[ranks]; lo += kMaxCount) {
    const int64_t hi = std::min(begin[ranks], lo + kMaxCount);
    std::vector<int> c(static_cast<size_t>(ranks)), d(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      const int64_t a = std::clamp(begin[r], lo, hi), b = std::clamp(begin[r + 1], lo, hi);
      c[r] = int(b - a);
      d[r] = int(a - lo);
    }
    piece(lo, std::move(c), std::move(d));
  }
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(double* data, int64_t n) override {
    for (int64_t i = 0; i < n; i += kMaxCount)
      MPI_Allreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_DOUBLE, MPI_SUM,
                    MPI_COMM_WORLD);
  }
  void allreduce_max(int64_t* data, int64_t n) override {
    for (int64_t i = 0; i < n; i += kMaxCount)
      MPI_Allreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_INT64_T, MPI_MAX,
                    MPI_COMM_WORLD);
  }
  void start_allreduce_sum(float* data, int64_t n) override {
    for (int64_t i = 0; i < n; i += kMaxCount) {
      pending_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, data + i, int(std::min(kMaxCount, n - i)), MPI_FLOAT, MPI_SUM,
                     MPI_COMM_WORLD, &pending_.back());
    }
  }
  void start_reduce_scatter_sum(float* data, const int64_t* counts) override {
    for_each_piece(size_, counts, [&](int64_t first, std::vector<int> c, std::vector<int> d) {
      pending_.emplace_back();
      // A non-blocking collective reads its counts until it completes.
      const std::vector<int>& kept = counts_.emplace_back(std::move(c));
      MPI_Ireduce_scatter(MPI_IN_PLACE, data + first, kept.data(), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD, &pending_.back());
      // In place, MPI leaves this rank's sum at the start of the piece, not at its own place.
      if (kept[rank_] > 0 && d[rank_] > 0)
        moves_.push_back({data + first + d[rank_], data + first, kept[rank_]});
    });
  }
  void allgather(float* data, const int64_t* counts) override {
    for_each_piece(size_, counts, [&](int64_t first, std::vector<int> c, std::vector<int> d) {
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data + first, c.data(), d.data(),
                     MPI_FLOAT, MPI_COMM_WORLD);
    });
  }
  void gather(const float* part, const int64_t* counts, float* out) override {
    int64_t mine = 0;  // where this rank's part starts in the whole
    for (int r = 0; r < rank_; ++r) mine += counts[r];
    for_each_piece(size_, counts, [&](int64_t first, std::vector<int> c, std::vector<int> d) {
      MPI_Gatherv(c[rank_] > 0 ? part + (first + d[rank_] - mine) : part, c[rank_], MPI_FLOAT,
                  rank_ == 0 ? out + first : nullptr, c.data(), d.data(), MPI_FLOAT, 0,
                  MPI_COMM_WORLD);
    });
  }
  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    MPI_Testall(int(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) finish();
  }
  void wait_all() override {
    if (pending_.empty()) return;
    MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE);
    finish();
  }

 private:
  struct Move {
    float* to;
    const float* from;
    int64_t n;
  };
  void finish() {
    for (const Move& m : moves_) std::memmove(m.to, m.from, size_t(m.n) * sizeof(float));
    moves_.clear();
    counts_.clear();
    pending_.clear();
  }

  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;
  std::deque<std::vector<int>> counts_;  // of the reduce-scatters under way
  std::vector<Move> moves_;              // their results, once complete
};

}  // namespace

std::unique_ptr<Comm> join_mpi_job(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw Error(ExitCode::usage, "cannot join the MPI job (MPI_Init_thread failed)");
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw Error(ExitCode::usage, "the MPI library does not allow OpenMP threads beside MPI "
                                 "(MPI_THREAD_FUNNELED)");
  }
  return std::make_unique<MpiComm>();
}

void leave_mpi_job() { MPI_Finalize(); }

void abort_mpi_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace forge
