// Finite-difference gradient checking in f64, and the registry that ties every differentiable op
// to at least one check.
//
// How to add an op: add it to FORGE_DIFFERENTIABLE_OPS (core/op_list.h), record its node with that
// Op, then add a case here-style in the op group's test file:
//
//   FORGE_GRADCHECK(exp, broadcast_free) {
//     auto x = testing::randn({3, 4});
//     EXPECT_GRADCHECK([](const auto& in) { return exp(in[0]); }, {x});
//   }
//
// GradCheckCoverage.EveryDifferentiableOpHasACheck fails until the new op has a case.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"

namespace forge::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradCheckOptions {
  double eps = 1e-6;   ///< central-difference step
  double atol = 1e-5;  ///< |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-4;
};

/// Compares the analytic gradient of sum(f(inputs) * R) (R a fixed random tensor) with central
/// differences, for every input that requires grad. Returns "" on success, else a description of
/// the first mismatching element.
std::string gradcheck(const Fn& f, const std::vector<Tensor>& inputs, GradCheckOptions options = {});

/// f64 leaf requiring grad, values N(0, 1), from a generator seeded by `seed`.
Tensor randn(const Shape& shape, uint64_t seed = 1);
/// Same values as randn but laid out transposed in memory (the last two dims swapped), so the
/// leaf is a non-contiguous view.
Tensor randn_strided(const Shape& shape, uint64_t seed = 1);
/// f64 leaf requiring grad, uniform in [low, high).
Tensor rand_uniform(const Shape& shape, double low, double high, uint64_t seed = 1);
/// f64 tensor without grad (targets, masks).
Tensor constant(const std::vector<double>& values, const Shape& shape);
/// i64 tensor (ids, targets, indices).
inline Tensor ids(const std::vector<double>& values, const Shape& shape) {
  return from_vector(values, shape, DType::i64);
}

struct GradCase {
  Op op;
  std::string name;
  const char* file;
  int line;
  void (*body)();
};
bool register_gradcase(Op op, const char* name, const char* file, int line, void (*body)());
const std::vector<GradCase>& gradcases();
/// Registers every case as a GoogleTest test GradCheck.<op>_<case> (called from main).
void register_gradcase_tests();

}  // namespace forge::testing

#define EXPECT_GRADCHECK(f, ...)                                                       \
  do {                                                                                 \
    std::string forge_gc_msg = ::forge::testing::gradcheck(f, __VA_ARGS__);            \
    EXPECT_TRUE(forge_gc_msg.empty()) << forge_gc_msg;                                 \
  } while (0)

#define FORGE_GRADCHECK(op_id, case_name)                                                 \
  static void forge_gradcase_##op_id##_##case_name();                                     \
  [[maybe_unused]] static const bool forge_gradcase_reg_##op_id##_##case_name =           \
      ::forge::testing::register_gradcase(::forge::Op::op_id, #op_id "_" #case_name,      \
                                          __FILE__, __LINE__,                             \
                                          &forge_gradcase_##op_id##_##case_name);         \
  static void forge_gradcase_##op_id##_##case_name()
