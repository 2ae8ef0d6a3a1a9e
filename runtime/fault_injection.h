// Fault injection for the tests of stopping, resuming and errors under mpirun: environment
// variables that make a run raise a signal, throw or die at a chosen point, deterministically
// instead of racing a kill against the run. Nothing happens when they are unset.
//   FORGE_TEST_RAISE=<SIGINT|SIGTERM|ERROR>@<point>  at fault_point(<point>)
//   FORGE_TEST_SIGKILL_AFTER_STEP=<step>              at fault_after_step(<step>)
//   FORGE_TEST_RANK=<r>                               under mpirun, only rank r does either
#pragma once

#include <cstdint>
#include <string_view>

namespace forge {

/// Where the run reaches `point` (setup, eval, final_eval, sample, report): raises the signal
/// FORGE_TEST_RAISE names for it, or throws Error(data) "FORGE_TEST_RAISE: an error at <point>"
/// for ERROR (an error of one rank under mpirun).
void fault_point(std::string_view point);

/// After step `step` is complete (its checkpoint, if any, written): dies by SIGKILL when it is
/// FORGE_TEST_SIGKILL_AFTER_STEP, for the kill-and-resume tests.
void fault_after_step(int64_t step);

}  // namespace forge
