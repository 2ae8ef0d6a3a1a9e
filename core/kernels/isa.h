// Forge's own vector loops are compiled once per instruction set, and the widest one the CPU has
// is picked at load time (GCC's target_clones), so one binary runs on any x86-64. A build
// configured with -DFORGE_MAX_ISA=avx2 leaves the AVX-512 versions out: on an AVX-512 machine it
// runs, tests and benchmarks the path that AVX2-only CPUs take (FORGE_ISA=avx2 in
// scripts/setup.sh builds it in build-avx2 and limits oneDNN the same way).
#pragma once

#include <string>

#if defined(FORGE_MAX_ISA_AVX2)
#define FORGE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FORGE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace forge::kernels {

#if defined(FORGE_MAX_ISA_AVX2)
inline constexpr bool kAvx512Built = false;
#else
inline constexpr bool kAvx512Built = true;
#endif

/// The instruction set that Forge's own loops run with here: "avx512f", "avx2" or "x86-64" (the
/// widest one both the CPU and this build have, the choice target_clones makes).
const char* kernel_isa();

/// oneDNN's version and the instruction set it runs with (ONEDNN_MAX_CPU_ISA can lower it), e.g.
/// "oneDNN 2.6.3, avx512_core".
std::string onednn_description();

}  // namespace forge::kernels
