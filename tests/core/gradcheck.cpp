// The gradient checker: analytic gradients from one backward with a random seed gradient, numeric
// ones from central differences on each input element, all in f64.
#include "tests/core/gradcheck.h"

#include <cmath>
#include <cstdio>

namespace forge::testing {
namespace {

// Address of element `flat` (row-major over the shape) of a possibly strided f64 tensor.
double* element(const Tensor& t, int64_t flat) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    int64_t n = t.shape()[size_t(d)];
    off += (flat % n) * t.strides()[size_t(d)];
    flat /= n;
  }
  return t.data<double>() + off;
}

double weighted_sum(const Fn& f, const std::vector<Tensor>& inputs, const Tensor& weights) {
  NoGradGuard no_grad;
  return sum(mul(f(inputs), weights)).item();
}

}  // namespace

std::string gradcheck(const Fn& f, const std::vector<Tensor>& inputs, GradCheckOptions options) {
  for (const Tensor& t : inputs) {
    if (!t.requires_grad()) continue;
    if (t.dtype() != DType::f64) return "gradcheck: inputs that require grad must be f64";
    if (!t.is_leaf()) return "gradcheck: inputs that require grad must be leaves";
    t.impl()->grad = Tensor();
  }
  Tensor out = f(inputs);
  if (!out.requires_grad()) return "gradcheck: output does not require grad";
  Generator gen(12345);
  Tensor weights = normal(out.shape(), 0.0, 1.0, gen, DType::f64);
  out.backward(weights);

  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    Tensor analytic = x.grad();
    for (int64_t j = 0; j < x.numel(); ++j) {
      double* p = element(x, j);
      double saved = *p;
      *p = saved + options.eps;
      double plus = weighted_sum(f, inputs, weights);
      *p = saved - options.eps;
      double minus = weighted_sum(f, inputs, weights);
      *p = saved;
      double numeric = (plus - minus) / (2 * options.eps);
      double got = analytic.defined() ? *element(analytic.contiguous(), j) : 0.0;
      if (!(std::fabs(got - numeric) <= options.atol + options.rtol * std::fabs(numeric))) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "input %zu (shape %s) element %lld: analytic %.10g, numeric %.10g", i,
                      shape_str(x.shape()).c_str(), (long long)j, got, numeric);
        return buf;
      }
    }
  }
  return "";
}

Tensor randn(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return normal(shape, 0.0, 1.0, gen, DType::f64).set_requires_grad(true);
}

Tensor randn_strided(const Shape& shape, uint64_t seed) {
  if (shape.size() < 2) return randn(shape, seed);
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Generator gen(seed);
  Tensor base = normal(swapped, 0.0, 1.0, gen, DType::f64);
  Tensor view = transpose(base, -1, -2).detach();
  return view.set_requires_grad(true);
}

Tensor rand_uniform(const Shape& shape, double low, double high, uint64_t seed) {
  Generator gen(seed);
  return uniform(shape, low, high, gen, DType::f64).set_requires_grad(true);
}

Tensor constant(const std::vector<double>& values, const Shape& shape) {
  return from_vector(values, shape, DType::f64);
}

namespace {
std::vector<GradCase>& registry() {
  static std::vector<GradCase> cases;
  return cases;
}

class GradCaseTest : public ::testing::Test {
 public:
  explicit GradCaseTest(void (*body)()) : body_(body) {}
  void TestBody() override { body_(); }

 private:
  void (*body_)();
};
}  // namespace

bool register_gradcase(Op op, const char* name, const char* file, int line, void (*body)()) {
  registry().push_back({op, name, file, line, body});
  return true;
}

const std::vector<GradCase>& gradcases() { return registry(); }

void register_gradcase_tests() {
  for (const GradCase& c : registry()) {
    void (*body)() = c.body;
    ::testing::RegisterTest("GradCheck", c.name.c_str(), nullptr, nullptr, c.file, c.line,
                            [body]() -> ::testing::Test* { return new GradCaseTest(body); });
  }
}

}  // namespace forge::testing
