// How the ranks of a data-parallel run take decisions together (docs/distributed.md): whether every
// rank's set-up succeeded, the stop request all of them act on, and whether they still train one
// model. Trivial in one process. The stop request itself is a SIGINT or SIGTERM that arrived while
// run_training held the handlers this file installs.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/named_tensor.h"

namespace forge {

/// Under mpirun, the first collective of a run: every rank says whether its set-up (config, data,
/// models, the checkpoint to resume) succeeded, with 0 or its error's exit code. run_training
/// calls it once set up; main() calls it when set-up threw on this rank, so that the ranks still
/// setting up do not wait for it forever. Set-up errors are usually the same on every rank: the
/// lowest failing rank reports, the others end quietly with the highest exit code. Trivial in one
/// process.
struct SetupOutcome {
  int failed_rank = -1;  ///< the lowest rank whose set-up failed, or -1
  int exit_code = 0;
};
SetupOutcome join_setup(int exit_code);
/// Under mpirun, right after join_setup: whether every rank resolved the same config, given as
/// (key, printed value) in schema order. Ranks started with different configs (an edited file, an
/// override on one rank) would train apart until the weight check ends them as an internal error;
/// this ends them at set-up with AgreedError(usage) naming the lowest rank that differs from rank 0
/// and the first key. Trivial in one process.
void check_ranks_resolved_one_config(const std::vector<std::pair<std::string, std::string>>& keys);
/// Whether this process has passed join_setup: an error after it is this rank's own.
bool setup_joined();
/// An error every rank of a data-parallel run raises at the same point, after agreeing on it (the
/// ranks' weights differ, they resumed different steps): rank 0 reports it and every rank ends
/// normally with its code, rather than one rank ending the job under the others.
class AgreedError : public Error {
 public:
  using Error::Error;
};
/// Thrown on the ranks whose set-up succeeded when another's failed: end with `exit_code`,
/// printing nothing (the failing rank reported).
struct PeerSetupFailed {
  int exit_code;
};

/// True once SIGINT or SIGTERM arrived during run_training. Loops that can take long (evaluation
/// over many batches, sampling) poll it and return early; the trainer then writes a checkpoint and
/// exits 130 / 143. Always false outside run_training (`forge eval` keeps the default handlers).
bool stop_requested();

/// Installs the SIGINT/SIGTERM handlers behind stop_requested() for its lifetime, restoring the
/// previous ones after; a stop request outlives neither.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

/// The largest of the ranks' values: how the ranks take one decision.
int64_t agree_max(int64_t value);

/// The stop request the run acts on: the signal, or 0. A signal may reach one rank only (kill, a
/// scheduler) and at any moment: the ranks call this at the same points of the run and adopt the
/// strongest request any of them saw, so that every decision to stop is taken by all of them after
/// the same step.
int agree_on_stop();
/// "SIGINT" or "SIGTERM", and the exit code of a run it stopped: 130 or 143.
const char* stop_signal_name(int signal);
int stop_exit_code(int signal);

/// The ranks apply the same updates to the same weights: a checksum of every trained tensor,
/// compared across ranks, catches a divergence (a rank that resumed another checkpoint, a kernel
/// that is not deterministic) before the run trains N different models in silence. Throws
/// AgreedError(checkpoint) when the ranks are at different steps, AgreedError(internal) when the
/// weights differ.
void check_ranks_agree(const NamedTensors& params, int64_t step);

}  // namespace forge
