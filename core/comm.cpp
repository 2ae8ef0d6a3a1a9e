// The local communicator and the process's world. The MPI side lives in core/comm_mpi.cpp, which
// the build compiles only when CMake finds MPI (FORGE_HAVE_MPI).
#include "core/comm.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace forge {

#ifdef FORGE_HAVE_MPI
// core/comm_mpi.cpp
std::unique_ptr<Comm> join_mpi_job(int* argc, char*** argv);
void leave_mpi_job();
[[noreturn]] void abort_mpi_job(int code);
#endif

namespace {

class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(double*, int64_t) override {}
  void allreduce_max(int64_t*, int64_t) override {}
  void start_allreduce_sum(float*, int64_t) override {}
  void start_reduce_scatter_sum(float*, const int64_t*) override {}
  void allgather(float*, const int64_t*) override {}
  void gather(const float* part, const int64_t* counts, float* out) override {
    if (part != out) std::memcpy(out, part, size_t(counts[0]) * sizeof(float));
  }
  void progress() override {}
  void wait_all() override {}
};

std::unique_ptr<Comm> make_local_comm() { return std::make_unique<LocalComm>(); }

std::unique_ptr<Comm>& world() {
  static std::unique_ptr<Comm> comm = make_local_comm();
  return comm;
}
bool g_joined = false;

}  // namespace

Comm& world_comm() { return *world(); }

bool launched_by_mpi() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx and PMI launchers (srun, MPICH) the others.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name)) return true;
  return false;
}

bool mpi_built() {
#ifdef FORGE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

void init_world_comm(int* argc, char*** argv) {
#ifdef FORGE_HAVE_MPI
  world() = join_mpi_job(argc, argv);
  g_joined = true;
#else
  (void)argc;
  (void)argv;
  throw Error(ExitCode::usage,
              "this process was started by mpirun, but this forge was built without MPI "
              "(install libopenmpi-dev and rebuild: scripts/forge does both)");
#endif
}

void finalize_world_comm() {
#ifdef FORGE_HAVE_MPI
  if (g_joined) {
    world() = make_local_comm();
    g_joined = false;
    leave_mpi_job();
  }
#endif
}

void abort_world_comm(int code) {
#ifdef FORGE_HAVE_MPI
  if (g_joined) abort_mpi_job(code);
#endif
  std::_Exit(code);
}

}  // namespace forge
