// The FORGE_TEST_* hooks of fault_injection.h, read from the environment where the run reaches
// them.
#include "runtime/fault_injection.h"

#include <csignal>
#include <cstdlib>

#include "core/comm.h"
#include "core/error.h"

namespace forge {
namespace {

// Under mpirun, FORGE_TEST_RANK=<r> limits the fault injection to rank r.
bool fault_rank() {
  const char* rank = std::getenv("FORGE_TEST_RANK");
  return !rank || std::atoi(rank) == world_comm().rank();
}

}  // namespace

void fault_point(std::string_view point) {
  const char* spec = std::getenv("FORGE_TEST_RAISE");
  if (!spec || !fault_rank()) return;
  const std::string_view s = spec;
  const size_t at = s.find('@');
  if (at == std::string_view::npos || s.substr(at + 1) != point) return;
  if (s.substr(0, at) == "ERROR")
    throw Error(ExitCode::data, detail::concat("FORGE_TEST_RAISE: an error at ", point));
  std::raise(s.substr(0, at) == "SIGINT" ? SIGINT : SIGTERM);
}

void fault_after_step(int64_t step) {
  const char* crash = std::getenv("FORGE_TEST_SIGKILL_AFTER_STEP");
  if (crash && fault_rank() && std::atoll(crash) == step) std::raise(SIGKILL);
}

}  // namespace forge
