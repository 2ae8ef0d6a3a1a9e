// The decisions the ranks of a run take together, and the stop flag behind them. Every function
// here is a collective under mpirun: the ranks call it at the same points of the run, in the same
// order.
#include "runtime/rank_agreement.h"

#include <csignal>

#include "core/checksum.h"
#include "core/comm.h"

namespace forge {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }
bool g_setup_joined = false;

}  // namespace

SetupOutcome join_setup(int exit_code) {
  Comm& comm = world_comm();
  g_setup_joined = true;
  if (comm.size() == 1) return exit_code ? SetupOutcome{0, exit_code} : SetupOutcome{};
  int64_t v[2] = {exit_code, exit_code ? comm.size() - comm.rank() : 0};
  comm.allreduce_max(v, 2);
  if (v[1] == 0) return {};
  return {int(comm.size() - v[1]), int(v[0])};
}

bool setup_joined() { return g_setup_joined; }

bool stop_requested() { return g_stop_signal != 0; }

SignalScope::SignalScope() {
  g_stop_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

SignalScope::~SignalScope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  g_stop_signal = 0;
}

int64_t agree_max(int64_t value) {
  world_comm().allreduce_max(&value, 1);
  return value;
}

int agree_on_stop() {
  const int64_t signal = g_stop_signal;
  return int(world_comm().size() == 1 ? signal : agree_max(signal));
}

const char* stop_signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }
int stop_exit_code(int signal) { return signal == SIGINT ? 130 : 143; }

void check_ranks_agree(const NamedTensors& params, int64_t step) {
  Comm& comm = world_comm();
  if (comm.size() == 1) return;
  uint32_t crc = 0;
  for (const NamedTensor& p : params) {
    Tensor t = p.tensor.contiguous();
    crc = crc32(t.raw_data(), size_t(t.numel()) * dtype_size(t.dtype()), crc);
  }
  int64_t v[4] = {step, -step, int64_t(crc), -int64_t(crc)};
  comm.allreduce_max(v, 4);
  if (v[0] != -v[1])
    throw AgreedError(
        ExitCode::checkpoint,
        detail::concat("the ranks resumed from different steps (", -v[1], " to ", v[0],
                       "): every rank must see the same run directory (a shared filesystem, "
                       "docs/distributed.md)"));
  if (v[2] != -v[3])
    throw AgreedError(ExitCode::internal,
                      detail::concat("the ranks' weights differ at step ", step, " (rank ",
                                     comm.rank(), " has checksum ", crc,
                                     "): they no longer train one model"));
}

}  // namespace forge
