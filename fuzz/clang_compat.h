// Force-included (-include) by the sanitizer and fuzz builds under clang (CMakeLists.txt).
// clang 14 rejects target_clones on function templates (core/kernels/elementwise.cpp); the per-ISA
// clones only matter for speed, so a checking build compiles the baseline version alone.
#pragma once
#define target_clones(...) hot
