// Test entry point: registers the gradient-check cases as tests, runs everything and ends with the
// plain "N passed, N failed" line that CI reads.
#include <gtest/gtest.h>

#include <cstdio>

#include "tests/core/gradcheck.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  forge::testing::register_gradcase_tests();
  int rc = RUN_ALL_TESTS();
  const auto& unit = *::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed\n", unit.successful_test_count(), unit.failed_test_count());
  return rc;
}
