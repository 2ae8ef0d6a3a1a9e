// The instruction sets of Forge's own kernels: a build with -DFORGE_MAX_ISA=avx2 must hold no
// AVX-512 version of any of them, or "the AVX2 path" that it tests and benchmarks is not the one
// AVX2-only CPUs take.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "core/kernels/isa.h"

namespace forge {
namespace {

// GCC names each clone of a target_clones function "<symbol>.<isa>", and the binary's symbol
// table keeps those names (it is not stripped).
int64_t count_avx512_clones(const std::string& binary) {
  std::ifstream in(binary, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string needle(".avx512f\0", 9);
  int64_t n = 0;
  for (size_t at = bytes.find(needle); at != std::string::npos; at = bytes.find(needle, at + 1))
    ++n;
  return n;
}

TEST(KernelIsa, Avx512ClonesExistExactlyWhenTheBuildAllowsThem) {
#ifdef target_clones
  GTEST_SKIP() << "this build compiles one version of each kernel (fuzz/clang_compat.h)";
#endif
  const int64_t clones = count_avx512_clones(FORGE_BINARY);
  if (kernels::kAvx512Built)
    EXPECT_GT(clones, 50);
  else
    EXPECT_EQ(clones, 0);
}

}  // namespace
}  // namespace forge
