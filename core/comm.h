// How the processes of a data-parallel run talk to each other. One process has the local
// communicator, where every operation is the identity; under mpirun, the world is MPI's
// (core/comm_mpi.cpp). The trainer and the gradient arena see only this interface;
// docs/distributed.md describes the protocol they build on it.
#pragma once

#include <cstdint>

namespace forge {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Element-wise sum over the ranks, in place; blocks until every rank has called it.
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  /// Element-wise maximum over the ranks, in place; blocks.
  virtual void allreduce_max(int64_t* data, int64_t n) = 0;
  /// Starts an in-place sum of `n` floats over the ranks and returns at once. Every rank must start
  /// the same reductions in the same order. `data` must stay untouched until wait_all().
  virtual void start_allreduce_sum(float* data, int64_t n) = 0;
  /// Starts an in-place reduce-scatter and returns at once: `data` holds the sum of `counts` (one
  /// per rank) floats, in parts by rank; once wait_all() returns, this rank's part (its count of
  /// floats after the parts of the lower ranks) holds the part's sum over the ranks and the rest of
  /// `data` is unspecified. Ordered like start_allreduce_sum; `counts` is read before it returns.
  virtual void start_reduce_scatter_sum(float* data, const int64_t* counts) = 0;
  /// In place, blocking: every rank's part of `data` (parts by rank as above) is copied to every
  /// rank.
  virtual void allgather(float* data, const int64_t* counts) = 0;
  /// Blocking: rank 0 receives every rank's `counts[rank]` floats from its `part` into `out`, one
  /// part after another in rank order; `out` is written on rank 0 only.
  virtual void gather(const float* part, const int64_t* counts, float* out) = 0;
  /// Lets the started reductions advance (MPI advances them only inside its calls).
  virtual void progress() = 0;
  /// Waits for every started reduction.
  virtual void wait_all() = 0;
};

/// The communicator of this process: the local one unless init_world_comm() joined an MPI job.
Comm& world_comm();

/// Whether this build can join an MPI job (CMake found MPI).
bool mpi_built();

/// True when this process was started by an MPI launcher (mpirun sets the job's size in the
/// environment), whether or not this build can use it.
bool launched_by_mpi();

/// Joins the MPI job this process was started in (MPI_Init_thread). Throws Error(usage) when this
/// build has no MPI or the job cannot be joined.
void init_world_comm(int* argc, char*** argv);
/// Leaves the MPI job (MPI_Finalize); nothing for the local communicator.
void finalize_world_comm();
/// Ends every process of the job with `code` (MPI_Abort): for an error on one rank that the others,
/// blocked in a collective, would otherwise wait for forever. Exits at once when local.
[[noreturn]] void abort_world_comm(int code);

}  // namespace forge
