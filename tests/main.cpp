// Test entry point: installs the recipes and foreign checkpoint layouts as the forge binary does,
// registers the gradient-check cases as tests, runs everything and ends with the plain
// "N passed, N failed" line that CI reads.
#include <gtest/gtest.h>

#include <cstdio>

#include "formats/hf_model.h"
#include "recipes/catalog.h"
#include "tests/core/gradcheck.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  forge::install_catalog(forge::forge_catalog());
  forge::install_foreign_layout(forge::hf_model_layout());
  forge::testing::register_gradcase_tests();
  int rc = RUN_ALL_TESTS();
  const auto& unit = *::testing::UnitTest::GetInstance();
  std::printf("%d passed, %d failed\n", unit.successful_test_count(), unit.failed_test_count());
  return rc;
}
