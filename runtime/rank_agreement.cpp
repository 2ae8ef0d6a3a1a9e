// The decisions the ranks of a run take together, and the stop flag behind them. Every function
// here is a collective under mpirun: the ranks call it at the same points of the run, in the same
// order.
#include "runtime/rank_agreement.h"

#include <algorithm>
#include <csignal>
#include <limits>

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

// Rank 0's hash of each key is spread by a maximum (the others offer the lowest value), then a
// second maximum tells rank 0 the lowest rank and the keys that differ from it.
void check_ranks_resolved_one_config(
    const std::vector<std::pair<std::string, std::string>>& keys) {
  Comm& comm = world_comm();
  if (comm.size() == 1) return;
  const int64_t n = int64_t(keys.size());
  int64_t count[2] = {n, -n};
  comm.allreduce_max(count, 2);
  FORGE_CHECK(count[0] == -count[1], "the ranks' configs have ", -count[1], " to ", count[0],
              " keys: the ranks run different builds of forge");
  std::vector<int64_t> hashes(size_t(n), std::numeric_limits<int64_t>::min());
  std::vector<int64_t> mine(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string text = keys[i].first + '\n' + keys[i].second;
    mine[i] = int64_t(fnv1a64(text.data(), text.size()) >> 1);
    if (comm.rank() == 0) hashes[i] = mine[i];
  }
  comm.allreduce_max(hashes.data(), n);
  // size - the lowest rank that differs: [0] over all keys, [i + 1] at key i.
  const int64_t me = comm.size() - comm.rank();
  std::vector<int64_t> differs(size_t(n) + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i)
    if (mine[i] != hashes[i]) differs[0] = differs[i + 1] = me;
  comm.allreduce_max(differs.data(), n + 1);
  if (differs[0] == 0) return;
  const size_t key =
      size_t(std::find(differs.begin() + 1, differs.end(), differs[0]) - differs.begin() - 1);
  throw AgreedError(
      ExitCode::usage,
      detail::concat("rank ", comm.size() - differs[0], " resolved another config than rank 0 (",
                     keys[key].first, ": ", keys[key].second,
                     " on rank 0): start every rank with the same config and overrides"));
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
