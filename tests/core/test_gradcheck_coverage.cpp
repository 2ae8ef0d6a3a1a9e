// Guards the rule that every differentiable op has a finite-difference check, and that the checker
// itself catches a wrong backward.
#include <gtest/gtest.h>

#include <set>

#include "tests/core/gradcheck.h"

namespace forge {
namespace {

TEST(GradCheckCoverage, EveryDifferentiableOpHasACheck) {
  std::set<Op> covered;
  for (const auto& c : testing::gradcases()) covered.insert(c.op);
  for (Op op : differentiable_ops())
    EXPECT_TRUE(covered.count(op)) << "op '" << op_name(op)
                                   << "' has no FORGE_GRADCHECK case (see tests/core/gradcheck.h)";
}

TEST(GradCheckSelfTest, CatchesAWrongBackward) {
  // y = x^2 with a backward that forgets the factor 2.
  Tensor x = testing::randn({3, 2});
  auto square_wrong = [](const std::vector<Tensor>& in) {
    return custom_function([](const std::vector<Tensor>& v) { return mul(v[0], v[0]); }, in,
                           [x = in[0].detach()](const Tensor& dout) {
                             return std::vector<Tensor>{mul(dout, x)};
                           });
  };
  std::string message = testing::gradcheck(square_wrong, {x});
  EXPECT_NE(message.find("analytic"), std::string::npos) << "a wrong backward passed: " << message;
}

TEST(GradCheckSelfTest, AcceptsACorrectCustomBackward) {
  Tensor x = testing::randn({3, 2});
  auto square = [](const std::vector<Tensor>& in) {
    return custom_function([](const std::vector<Tensor>& v) { return mul(v[0], v[0]); }, in,
                           [x = in[0].detach()](const Tensor& dout) {
                             return std::vector<Tensor>{mul(dout, mul(x, 2.0))};
                           });
  };
  EXPECT_EQ(testing::gradcheck(square, {x}), "");
}

}  // namespace
}  // namespace forge
