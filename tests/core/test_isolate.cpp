// run_isolated (core/isolate.h): a probe that dies takes only its forked child with it, and the
// parent learns how; a probe that returns or throws is no news; turned off, nothing runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <stdexcept>

#include "core/isolate.h"

namespace forge {
namespace {

TEST(Isolate, AProbeThatReturnsOrThrowsIsNoNews) {
  EXPECT_EQ(run_isolated([] {}), std::nullopt);
  EXPECT_EQ(run_isolated([] { throw std::runtime_error("bad file"); }), std::nullopt);
}

TEST(Isolate, AProbeThatDiesIsReportedAndThisProcessGoesOn) {
  std::optional<std::string> how = run_isolated([] { std::raise(SIGKILL); });
  ASSERT_TRUE(how.has_value());
  EXPECT_EQ(how->rfind("killed by signal 9 (", 0), 0u) << *how;
  how = run_isolated([] { ::_exit(7); });
  ASSERT_TRUE(how.has_value());
  EXPECT_EQ(*how, "exit status 7");
}

TEST(Isolate, TurnedOffItRunsNothing) {
  set_process_isolation(false);
  // Run in this process, the probe would kill the test binary.
  std::optional<std::string> how = run_isolated([] { std::raise(SIGKILL); });
  set_process_isolation(true);
  EXPECT_EQ(how, std::nullopt);
}

}  // namespace
}  // namespace forge
