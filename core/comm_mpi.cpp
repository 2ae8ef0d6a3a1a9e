// The MPI communicator: MPI_COMM_WORLD of the job mpirun started. MPI is called from the main
// thread only (MPI_THREAD_FUNNELED); OpenMP threads inside kernels never touch it.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "core/error.h"

namespace forge {
namespace {

// MPI counts are ints: longer buffers go in pieces.
constexpr int64_t kMaxCount = INT_MAX / 2;

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
  void progress() override {
    if (pending_.empty()) return;
    int done = 0;
    MPI_Testall(int(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) pending_.clear();
  }
  void wait_all() override {
    if (pending_.empty()) return;
    MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE);
    pending_.clear();
  }

 private:
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;
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
