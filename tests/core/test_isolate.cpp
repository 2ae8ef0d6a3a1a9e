// run_isolated (core/isolate.h): a probe that dies takes only its forked child with it, and the
// parent learns how; a probe that returns or throws is no news; a file's probe that survived is
// not run again for the same version of the file; turned off, nothing runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <stdexcept>

#include "core/isolate.h"
#include "tests/test_util.h"

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

// The probe of a file runs once per version of the file; one that died is not remembered.
TEST(Isolate, AFileIsProbedOncePerVersion) {
  testing::TempDir dir;
  const std::filesystem::path file = dir.path() / "data.h5", log = dir.path() / "probes.txt";
  testing::write_file(file, "one");
  auto probe = [&] { std::ofstream(log, std::ios::app) << "probe\n"; };
  EXPECT_EQ(probe_file_once(file, probe), std::nullopt);
  EXPECT_EQ(probe_file_once(file, probe), std::nullopt);
  EXPECT_EQ(testing::read_file(log), "probe\n");
  testing::write_file(file, "another");
  EXPECT_EQ(probe_file_once(file, probe), std::nullopt);
  EXPECT_EQ(testing::read_file(log), "probe\nprobe\n");
  auto dies = [] { std::raise(SIGKILL); };
  const std::filesystem::path other = dir.path() / "other.h5";
  testing::write_file(other, "x");
  EXPECT_NE(probe_file_once(other, dies), std::nullopt);
  EXPECT_NE(probe_file_once(other, dies), std::nullopt);
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
