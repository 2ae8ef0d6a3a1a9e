// Fused layer and loss ops (core/ops/nn.h): finite-difference checks of every op, values and
// gradients against PyTorch 1.13 (tests/golden/nn_ops.txt and kd_ops.txt, written by
// make_nn_goldens.py and make_kd_goldens.py), parity of each fast kernel with its kernels::ref
// oracle on odd shapes, input errors, and determinism of the reductions across thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "core/kernels/embedding.h"
#include "core/kernels/gating.h"
#include "core/kernels/loss.h"
#include "core/kernels/norm.h"
#include "core/kernels/softmax.h"
#include "tests/core/gradcheck.h"

namespace forge {
namespace {

using testing::randn;
using testing::randn_strided;
using In = std::vector<Tensor>;

// ---- finite-difference checks (f64) ----

FORGE_GRADCHECK(softmax, last_middle_and_strided) {
  EXPECT_GRADCHECK([](const In& v) { return softmax(v[0], -1); }, {randn({3, 5}, 1)});
  EXPECT_GRADCHECK([](const In& v) { return softmax(v[0], 1); }, {randn({2, 4, 3}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return softmax(v[0], -1); }, {randn_strided({4, 5}, 3)});
  EXPECT_GRADCHECK([](const In& v) { return softmax(v[0], 0); }, {randn_strided({3, 4}, 4)});
}

FORGE_GRADCHECK(log_softmax, last_middle_and_strided) {
  EXPECT_GRADCHECK([](const In& v) { return log_softmax(v[0], -1); }, {randn({3, 5}, 1)});
  EXPECT_GRADCHECK([](const In& v) { return log_softmax(v[0], 1); }, {randn({2, 4, 3}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return log_softmax(v[0], -1); }, {randn_strided({4, 5}, 3)});
}

FORGE_GRADCHECK(layer_norm, affine_plain_and_single_row) {
  EXPECT_GRADCHECK([](const In& v) { return layer_norm(v[0], v[1], v[2]); },
                   {randn({2, 3, 6}, 1), randn({6}, 2), randn({6}, 3)});
  EXPECT_GRADCHECK([](const In& v) { return layer_norm(v[0], Tensor(), Tensor()); },
                   {randn_strided({4, 5}, 4)});
  EXPECT_GRADCHECK([](const In& v) { return layer_norm(v[0], v[1], v[2], 1e-3); },
                   {randn({1, 7}, 5), randn({7}, 6), randn({7}, 7)});
  // Only the parameters want gradients (x is a constant): the dweight / dbias-only paths.
  Tensor x = randn({3, 4}, 8).detach();
  EXPECT_GRADCHECK([x](const In& v) { return layer_norm(x, v[0], v[1]); },
                   {randn({4}, 9), randn({4}, 10)});
  EXPECT_GRADCHECK([x](const In& v) { return layer_norm(x, Tensor(), v[0]); }, {randn({4}, 11)});
}

FORGE_GRADCHECK(rms_norm, weighted_and_plain) {
  EXPECT_GRADCHECK([](const In& v) { return rms_norm(v[0], v[1]); },
                   {randn({2, 3, 6}, 1), randn({6}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return rms_norm(v[0], Tensor(), 1e-3); },
                   {randn_strided({4, 5}, 3)});
}

FORGE_GRADCHECK(embedding, repeated_ids_and_padding) {
  Tensor ids = testing::ids({1, 4, 1, 2, 0, 2}, {2, 3});
  EXPECT_GRADCHECK([ids](const In& v) { return embedding(v[0], ids); }, {randn({5, 3}, 1)});
  // The padding row gets no gradient by definition, which finite differences cannot see: zero
  // the outputs that read it, so the check covers every other row (the padding row's exact zero
  // is tested in NNOps.EmbeddingPaddingRowGetsExactlyZeroGradient).
  Tensor keep = testing::constant({1, 1, 1, 0, 1, 0}, {2, 3, 1});
  EXPECT_GRADCHECK([ids, keep](const In& v) { return mul(embedding(v[0], ids, 2), keep); },
                   {randn({5, 3}, 2)});
}

FORGE_GRADCHECK(cross_entropy, ignore_smoothing_reductions) {
  Tensor targets = testing::ids({2, -100, 0, 4}, {4});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
    for (double smoothing : {0.0, 0.1}) {
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = smoothing;
      EXPECT_GRADCHECK([targets, o](const In& v) { return cross_entropy(v[0], targets, o); },
                       {randn({4, 5}, 1)});
    }
  CrossEntropyOptions custom_ignore;
  custom_ignore.ignore_index = 3;
  EXPECT_GRADCHECK(
      [custom_ignore](const In& v) {
        return cross_entropy(v[0], testing::ids({3, 1, 0}, {3}), custom_ignore);
      },
      {randn_strided({3, 4}, 2)});
}

FORGE_GRADCHECK(topk_load, every_input_and_k) {
  // Random logits have no ties, so the top k+1 (and the thresholds) stay put under the step.
  for (int64_t k : {1, 2, 4}) {
    Tensor clean = randn({6, 5}, 31), noisy = randn({6, 5}, 32);
    Tensor noise_std = testing::rand_uniform({6, 5}, 0.4, 1.5, 33);
    EXPECT_GRADCHECK([k](const In& v) { return topk_load(v[0], v[1], v[2], k); },
                     {clean, noisy, noise_std});
  }
  // Only the noisy logits trained (the others constant).
  Tensor clean = randn({4, 3}, 34).detach(), noise_std = add(randn({4, 3}, 35).detach(), 3.0);
  EXPECT_GRADCHECK([&](const In& v) { return topk_load(clean, v[0], noise_std, 2); },
                   {randn({4, 3}, 36)});
}

TEST(NNOps, TopkLoadTakesTheCallersRankingAndChecksIt) {
  Tensor clean = randn({5, 4}, 41).detach(), noisy = randn({5, 4}, 42).detach();
  Tensor noise_std = add(randn({5, 4}, 43).detach(), 3.0);
  Tensor ranked = topk(noisy, 3, 1).indices;
  EXPECT_EQ(topk_load(clean, noisy, noise_std, 2, ranked).to_vector<double>(),
            topk_load(clean, noisy, noise_std, 2).to_vector<double>());
  Tensor bad = ranked.clone();
  bad.data<int64_t>()[7] = 4;
  try {
    topk_load(clean, noisy, noise_std, 2, bad);
    ADD_FAILURE() << "an out-of-range ranking was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranked index 4 at position 7"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(topk_load(clean, noisy, noise_std, 2, slice(ranked, 1, 0, 2)), Error);
}

FORGE_GRADCHECK(kd_kl_div, directions_temperatures_reductions) {
  // The teacher is a constant: it gets no gradient, which finite differences would contradict.
  Tensor teacher = randn({4, 5}, 9).detach();
  Tensor targets = testing::ids({2, -100, 0, 4}, {4});
  for (bool reverse : {false, true})
    for (double temp : {1.0, 2.0, 0.5})
      for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
        KLDivOptions o{temp, reverse, -100, r};
        EXPECT_GRADCHECK(
            [teacher, targets, o](const In& v) { return kd_kl_div(v[0], teacher, targets, o); },
            {randn({4, 5}, 1)});
      }
  // Every row scored (no targets), a custom ignore_index, a strided student.
  Tensor teacher3 = randn({3, 4}, 10).detach();
  for (bool reverse : {false, true}) {
    KLDivOptions o{2.0, reverse, 3, Reduction::mean};
    EXPECT_GRADCHECK([teacher3, o](const In& v) { return kd_kl_div(v[0], teacher3, Tensor(), o); },
                     {randn_strided({3, 4}, 2)});
    EXPECT_GRADCHECK(
        [teacher3, o](const In& v) {
          return kd_kl_div(v[0], teacher3, testing::ids({3, 1, 0}, {3}), o);
        },
        {randn_strided({3, 4}, 3)});
  }
}

FORGE_GRADCHECK(cosine_similarity, broadcast) {
  EXPECT_GRADCHECK([](const In& v) { return cosine_similarity(v[0], v[1]); },
                   {randn({4, 1, 6}, 1), randn({3, 6}, 2)});
  EXPECT_GRADCHECK([](const In& v) { return cosine_similarity(v[0], v[1], 0); },
                   {randn_strided({5, 3}, 3), randn({5, 1}, 4)});
}

// ---- semantics ----

TEST(NNOps, EachOpRecordsItsOwnNode) {
  Tensor x = randn({2, 4}), w = randn({4}), b = randn({4}), table = randn({5, 4});
  Tensor ids = testing::ids({1, 3}, {2}), t = testing::ids({0, 2}, {2});
  EXPECT_EQ(softmax(x).grad_fn()->op, Op::softmax);
  EXPECT_EQ(log_softmax(x).grad_fn()->op, Op::log_softmax);
  EXPECT_EQ(layer_norm(x, w, b).grad_fn()->op, Op::layer_norm);
  EXPECT_EQ(rms_norm(x, w).grad_fn()->op, Op::rms_norm);
  EXPECT_EQ(embedding(table, ids).grad_fn()->op, Op::embedding);
  EXPECT_EQ(cross_entropy(x, t).grad_fn()->op, Op::cross_entropy);
  EXPECT_EQ(kd_kl_div(x, randn({2, 4}, 2), t).grad_fn()->op, Op::kd_kl_div);
  EXPECT_EQ(cosine_similarity(x, b).grad_fn()->op, Op::cosine_similarity);
}

TEST(NNOps, EmbeddingPaddingRowGetsExactlyZeroGradient) {
  Tensor table = randn({5, 3});
  Tensor out = embedding(table, testing::ids({2, 1, 2, 2, 4}, {5}), 2);
  out.backward(ones(out.shape(), DType::f64));
  Tensor g = table.grad();
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(g.at({2, c}), 0.0);
    EXPECT_EQ(g.at({1, c}), 1.0);
    EXPECT_EQ(g.at({0, c}), 0.0);
  }
  // The forward still gathers the padding row.
  EXPECT_EQ(out.at({0, 1}), table.at({2, 1}));
}

template <class Fn>
Error expect_data_error(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data) << e.what();
    return e;
  }
  ADD_FAILURE() << "no forge::Error thrown";
  return Error(ExitCode::ok, "");
}

TEST(NNOps, OutOfRangeIdIsADataErrorNamingIdPositionAndV) {
  Tensor table = randn({7, 2});
  std::string msg = expect_data_error([&] {
                      embedding(table, testing::ids({0, 3, 6, 9, 1, 2}, {2, 3}));
                    }).what();
  EXPECT_NE(msg.find("id 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("V = 7"), std::string::npos) << msg;
  msg = expect_data_error([&] { embedding(table, testing::ids({-1}, {1})); }).what();
  EXPECT_NE(msg.find("id -1"), std::string::npos) << msg;
}

TEST(NNOps, OutOfRangeTargetIsADataErrorNamingPositionAndValue) {
  Tensor logits = randn({3, 4});
  std::string msg = expect_data_error([&] {
                      cross_entropy(logits, testing::ids({0, -100, 4}, {3}));
                    }).what();
  EXPECT_NE(msg.find("target 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
  CrossEntropyOptions o;
  o.ignore_index = -1;  // now -100 is an ordinary (bad) target
  msg = expect_data_error([&] { cross_entropy(logits, testing::ids({0, -100, 1}, {3}), o); }).what();
  EXPECT_NE(msg.find("target -100 at position 1"), std::string::npos) << msg;
}

TEST(NNOps, FullyIgnoredBatchGivesZeroLossAndZeroGradient) {
  Tensor ignored = testing::ids({-100, -100, -100}, {3});
  for (Reduction r : {Reduction::mean, Reduction::sum}) {
    for (DType dt : {DType::f32, DType::f64}) {
      Tensor logits = randn({3, 5}).detach().to(dt).set_requires_grad(true);
      CrossEntropyOptions o;
      o.reduction = r;
      o.label_smoothing = 0.2;
      Tensor loss = cross_entropy(logits, ignored, o);
      EXPECT_EQ(loss.item(), 0.0);
      loss.backward();
      for (double g : logits.grad().to_vector<double>()) EXPECT_EQ(g, 0.0);
      for (bool reverse : {false, true}) {
        logits.set_grad(Tensor());
        Tensor teacher = randn({3, 5}, 2).detach().to(dt);
        Tensor kd = kd_kl_div(logits, teacher, ignored, KLDivOptions{2.0, reverse, -100, r});
        EXPECT_EQ(kd.item(), 0.0);
        kd.backward();
        for (double g : logits.grad().to_vector<double>()) EXPECT_EQ(g, 0.0);
      }
    }
  }
}

TEST(NNOps, CrossEntropyMeanDividesByNonIgnoredCount) {
  Tensor logits = randn({4, 6}).detach();
  Tensor t = testing::ids({1, -100, 5, -100}, {4});
  CrossEntropyOptions none, mean;
  none.reduction = Reduction::none;
  std::vector<double> rows = cross_entropy(logits, t, none).to_vector<double>();
  EXPECT_EQ(rows[1], 0.0);
  EXPECT_EQ(rows[3], 0.0);
  EXPECT_NEAR(cross_entropy(logits, t, mean).item(), (rows[0] + rows[2]) / 2, 1e-14);
}

TEST(NNOps, KDKLDivMeanDividesByScoredRowsWhoseTargetsAreNotRangeChecked) {
  Tensor s = randn({4, 6}).detach(), t = randn({4, 6}, 2).detach();
  // 99 and -7 lie outside [0, V): targets only select rows, so both rows are scored.
  Tensor targets = testing::ids({99, -100, -7, -100}, {4});
  for (bool reverse : {false, true}) {
    KLDivOptions none{2.0, reverse, -100, Reduction::none},
        mean{2.0, reverse, -100, Reduction::mean};
    std::vector<double> rows = kd_kl_div(s, t, targets, none).to_vector<double>();
    EXPECT_EQ(rows[1], 0.0);
    EXPECT_EQ(rows[3], 0.0);
    EXPECT_GT(rows[0], 0.0);
    EXPECT_GT(rows[2], 0.0);
    EXPECT_NEAR(kd_kl_div(s, t, targets, mean).item(), (rows[0] + rows[2]) / 2, 1e-14);
    // Without targets every row is scored and the same rows give the same values.
    std::vector<double> all = kd_kl_div(s, t, Tensor(), none).to_vector<double>();
    EXPECT_EQ(all[0], rows[0]);
    EXPECT_EQ(all[2], rows[2]);
    EXPECT_GT(all[1], 0.0);
    EXPECT_GT(all[3], 0.0);
  }
}

// Softmax ignores a constant added to a row, so a teacher that is the student shifted row by row
// is the same distribution: loss and gradient vanish in both directions, at any temperature.
TEST(NNOps, KDKLDivOfEqualDistributionsIsZero) {
  for (DType dt : {DType::f32, DType::f64}) {
    double tol = dt == DType::f32 ? 1e-5 : 1e-12;
    Tensor student = mul(randn({3, 50}), 3.0).detach().to(dt).set_requires_grad(true);
    Tensor teacher = add(student.detach(), testing::constant({5.0, -2.0, 40.0}, {3, 1}).to(dt));
    for (bool reverse : {false, true})
      for (double temp : {1.0, 2.0}) {
        student.set_grad(Tensor());
        Tensor loss = kd_kl_div(student, teacher, Tensor(), KLDivOptions{temp, reverse});
        EXPECT_NEAR(loss.item(), 0.0, tol) << dtype_name(dt) << " T " << temp << " " << reverse;
        loss.backward();
        for (double g : student.grad().to_vector<double>()) ASSERT_NEAR(g, 0.0, tol);
      }
  }
}

TEST(NNOps, KDKLDivTeacherGetsNoGradient) {
  Tensor student = randn({3, 5}, 1), teacher = randn({3, 5}, 2);  // both require grad
  kd_kl_div(student, teacher, Tensor()).backward();
  EXPECT_TRUE(student.grad().defined());
  EXPECT_FALSE(teacher.grad().defined());
  // With only the teacher requiring grad there is nothing to differentiate.
  EXPECT_FALSE(kd_kl_div(student.detach(), teacher, Tensor()).requires_grad());
}

TEST(NNOps, KDKLDivRejectsBadInputsNamingThem) {
  Tensor s = randn({3, 4}), t = randn({3, 4}, 2).detach();
  auto expect_bad = [](const std::string& part, const std::function<void()>& f) {
    testing::expect_error(ExitCode::internal, "kd_kl_div: " + part, f);
  };
  expect_bad("student_logits must be f32 or f64, got i64",
             [&] { kd_kl_div(testing::ids({0, 1}, {1, 2}), t, Tensor()); });
  expect_bad("teacher_logits is undefined", [&] { kd_kl_div(s, Tensor(), Tensor()); });
  expect_bad("student_logits must be [N, V] with V > 0, got [12]",
             [&] { kd_kl_div(reshape(s, {12}), reshape(t, {12}), Tensor()); });
  expect_bad("student_logits must be [N, V] with V > 0, got [3, 0]",
             [&] { kd_kl_div(zeros({3, 0}), zeros({3, 0}), Tensor()); });
  expect_bad("teacher_logits [4, 3] must have the shape of student_logits [3, 4]",
             [&] { kd_kl_div(s, reshape(t, {4, 3}), Tensor()); });
  expect_bad("teacher_logits are f32 but student_logits are f64",
             [&] { kd_kl_div(s, t.to(DType::f32), Tensor()); });
  for (double temp : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    std::ostringstream got;
    got << temp;
    expect_bad("temperature must be finite and > 0, got " + got.str(),
               [&] { kd_kl_div(s, t, Tensor(), KLDivOptions{temp}); });
  }
  expect_bad("targets must be i64, got f64",
             [&] { kd_kl_div(s, t, testing::constant({0, 1, 2}, {3})); });
  expect_bad("targets must have shape [3] to match student_logits [3, 4], got [2]",
             [&] { kd_kl_div(s, t, testing::ids({0, 1}, {2})); });
}

TEST(NNOps, SoftmaxPropagatesNonFiniteLikePyTorch) {
  double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = from_vector({1.0, -inf, 0.5, 2.0, nan, 1.0}, {2, 3}, dt);
    std::vector<double> y = softmax(x).to_vector<double>();
    EXPECT_EQ(y[1], 0.0);  // exp(-inf) is exactly 0
    EXPECT_NEAR(y[0] + y[2], 1.0, 1e-6);
    for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
    Tensor loss =
        cross_entropy(x, testing::ids({0, 0}, {2}), CrossEntropyOptions{-100, 0.0, Reduction::none});
    std::vector<double> l = loss.to_vector<double>();
    EXPECT_TRUE(std::isfinite(l[0]));
    EXPECT_TRUE(std::isnan(l[1]));
  }
}

// torch: kl_div(log_softmax(s), log_softmax(t), log_target=True) per row is [0.0913, inf, nan];
// the written-out reverse KL sum p_s (log p_s - log p_t) is [0.0757, nan, nan] (0 * -inf).
TEST(NNOps, KDKLDivPropagatesNonFiniteLikePyTorch) {
  double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor s = from_vector({1.0, 0.5, 2.0, 1.0, -inf, 0.0, 0.3, 0.2, 0.1}, {3, 3}, dt);
    Tensor t = from_vector({0.5, 1.0, 1.5, 0.0, 1.0, 2.0, nan, 0.0, 1.0}, {3, 3}, dt);
    std::vector<double> fwd =
        kd_kl_div(s, t, Tensor(), KLDivOptions{1.0, false, -100, Reduction::none})
            .to_vector<double>();
    EXPECT_NEAR(fwd[0], 0.0913, 1e-4);
    EXPECT_EQ(fwd[1], inf);
    EXPECT_TRUE(std::isnan(fwd[2]));
    std::vector<double> rev =
        kd_kl_div(s, t, Tensor(), KLDivOptions{1.0, true, -100, Reduction::none})
            .to_vector<double>();
    EXPECT_NEAR(rev[0], 0.0757, 1e-4);
    EXPECT_TRUE(std::isnan(rev[1]));
    EXPECT_TRUE(std::isnan(rev[2]));
  }
}

// ---- values against PyTorch 1.13 ----

const testing::Goldens& goldens() {
  static const testing::Goldens table = testing::load_goldens("nn_ops.txt");
  return table;
}

const std::vector<double>& golden(const std::string& name) {
  auto it = goldens().find(name);
  static const std::vector<double> missing;
  EXPECT_NE(it, goldens().end()) << "golden '" << name << "' missing from nn_ops.txt";
  return it == goldens().end() ? missing : it->second;
}

Tensor golden_tensor(const std::string& name, const Shape& shape, DType dt, bool grad) {
  Tensor t = from_vector(golden(name), shape, dt);
  if (grad) t.set_requires_grad(true);
  return t;
}

void expect_golden(const Tensor& got, const std::string& name, double rtol) {
  ASSERT_TRUE(got.defined()) << name;
  testing::expect_near_golden(got.to_vector<double>(), golden(name), name, rtol);
}

void check_against_torch(DType dt, double rtol) {
  auto seed = [&](const std::string& name, const Tensor& out) {
    return from_vector(golden(name), out.shape(), dt);
  };
  for (auto [red, key] :
       {std::pair{Reduction::mean, "ce_mean"}, std::pair{Reduction::sum, "ce_sum"},
        std::pair{Reduction::none, "ce_none"}}) {
    Tensor logits = golden_tensor("ce.logits", {5, 7}, dt, true);
    Tensor targets = golden_tensor("ce.targets", {5}, DType::i64, false);
    Tensor out = cross_entropy(logits, targets, CrossEntropyOptions{-100, 0.1, red});
    out.backward(seed(std::string(key) + ".r", out));
    expect_golden(out, std::string(key) + ".out", rtol);
    expect_golden(logits.grad(), std::string(key) + ".dlogits", rtol);
  }
  {
    Tensor x = golden_tensor("ln.x", {3, 8}, dt, true), w = golden_tensor("ln.w", {8}, dt, true),
           b = golden_tensor("ln.b", {8}, dt, true);
    Tensor out = layer_norm(x, w, b, 1e-5);
    out.backward(seed("ln.r", out));
    expect_golden(out, "ln.out", rtol);
    expect_golden(x.grad(), "ln.dx", rtol);
    expect_golden(w.grad(), "ln.dw", rtol);
    expect_golden(b.grad(), "ln.db", rtol);
  }
  {
    Tensor x = golden_tensor("rms.x", {3, 8}, dt, true), w = golden_tensor("rms.w", {8}, dt, true);
    Tensor out = rms_norm(x, w, 1e-6);
    out.backward(seed("rms.r", out));
    expect_golden(out, "rms.out", rtol);
    expect_golden(x.grad(), "rms.dx", rtol);
    expect_golden(w.grad(), "rms.dw", rtol);
  }
  {
    Tensor a = golden_tensor("cos.a", {4, 1, 6}, dt, true),
           b = golden_tensor("cos.b", {3, 6}, dt, true);
    Tensor out = cosine_similarity(a, b, -1, 1e-8);
    out.backward(seed("cos.r", out));
    expect_golden(out, "cos.out", rtol);
    expect_golden(a.grad(), "cos.da", rtol);
    expect_golden(b.grad(), "cos.db", rtol);
  }
  for (const char* key : {"sm", "lsm"}) {
    Tensor x = golden_tensor("sm.x", {2, 5, 3}, dt, true);
    Tensor out = std::string(key) == "sm" ? softmax(x, 1) : log_softmax(x, 1);
    out.backward(seed(std::string(key) + ".r", out));
    expect_golden(out, std::string(key) + ".out", rtol);
    expect_golden(x.grad(), std::string(key) + ".dx", rtol);
  }
}

TEST(NNOps, MatchesPyTorchInF64) { check_against_torch(DType::f64, 1e-10); }
TEST(NNOps, MatchesPyTorchInF32) { check_against_torch(DType::f32, 1e-5); }

// Loss and student gradient of kd_kl_div at T = 1 and 2, both directions, mean and none, with
// row 2 ignored (tests/golden/kd_ops.txt).
void check_kd_against_torch(DType dt, double rtol) {
  static const testing::Goldens table = testing::load_goldens("kd_ops.txt");
  auto values = [](const std::string& name) -> const std::vector<double>& {
    return testing::golden_values(table, name, "kd_ops.txt");
  };
  Tensor teacher = from_vector(values("kd.teacher"), {5, 19}, dt);
  Tensor targets = from_vector(values("kd.targets"), {5}, DType::i64);
  for (double temp : {1.0, 2.0})
    for (bool reverse : {false, true})
      for (Reduction r : {Reduction::mean, Reduction::none}) {
        std::string key = std::string("kd_T") + (temp == 1.0 ? "1" : "2") +
                          (reverse ? "_reverse" : "_forward") +
                          (r == Reduction::mean ? "_mean" : "_none");
        Tensor student = from_vector(values("kd.student"), {5, 19}, dt).set_requires_grad(true);
        Tensor out = kd_kl_div(student, teacher, targets, KLDivOptions{temp, reverse, -100, r});
        out.backward(from_vector(values(key + ".r"), out.shape(), dt));
        testing::expect_near_golden(out.to_vector<double>(), values(key + ".out"), key + ".out",
                                    rtol);
        testing::expect_near_golden(student.grad().to_vector<double>(), values(key + ".dstudent"),
                                    key + ".dstudent", rtol);
      }
}

TEST(NNOps, KDKLDivMatchesPyTorchInF64) { check_kd_against_torch(DType::f64, 1e-12); }
TEST(NNOps, KDKLDivMatchesPyTorchInF32) { check_kd_against_torch(DType::f32, 1e-5); }

// PyTorch 1.13 clamps each squared norm at eps^2 for the value but lets the gradient through.
TEST(NNOps, CosineSimilarityClampsTinyNormsAsPyTorch) {
  Tensor a = from_vector({1e-9, 0.0}, {1, 2}, DType::f64).set_requires_grad(true);
  Tensor b = from_vector({1e3, 0.0}, {1, 2}, DType::f64).set_requires_grad(true);
  Tensor out = cosine_similarity(a, b, 1, 1e-8);
  out.backward(ones({1}, DType::f64));
  EXPECT_NEAR(out.item(), 0.1, 1e-12);
  EXPECT_NEAR(a.grad().at({0, 0}), 9.9e7, 1e-3);  // torch: 99000000
  EXPECT_EQ(b.grad().at({0, 0}), 0.0);
}

// ---- kernel parity: fast kernels against kernels::ref ----

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = shift + scale * dist(rng);
  return v;
}

// |got - want| <= tol * max(|want|, floor * max|want|): relative, with a floor for values that
// are small next to the rest (their absolute rounding error follows the large ones).
template <class T>
void expect_near_all(const std::vector<T>& got, const std::vector<T>& want, double tol,
                     const std::string& what, double floor = 1e-2, double atol = 0.0) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (T w : want) scale = std::max(scale, std::fabs(double(w)));
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i)
    if (!(std::fabs(double(got[i]) - double(want[i])) <=
          atol + tol * std::max(std::fabs(double(want[i])), floor * scale))) {
      ADD_FAILURE() << what << "[" << i << "]: fast " << got[i] << ", ref " << want[i];
      ++failures;
    }
}

TEST(NNKernels, SoftmaxMatchesReference) {
  struct Geo {
    int64_t outer, C, inner;
  };
  for (Geo g : {Geo{1, 1, 1}, Geo{3, 7, 1}, Geo{5, 1000, 1}, Geo{2, 2500, 1}, Geo{2, 5, 3},
                Geo{3, 17, 70}, Geo{1, 3, 129}}) {
    size_t n = size_t(g.outer * g.C * g.inner);
    std::vector<float> x = random_floats(n, 1, 3.0f), dy = random_floats(n, 2);
    for (bool log : {false, true}) {
      std::string what =
          "C=" + std::to_string(g.C) + " inner=" + std::to_string(g.inner) + (log ? " log" : "");
      std::vector<float> y(n), y_ref(n), dx(n), dx_ref(n);
      kernels::softmax_forward(x.data(), y.data(), g.outer, g.C, g.inner, log);
      kernels::ref::softmax_forward(x.data(), y_ref.data(), g.outer, g.C, g.inner, log);
      // log_softmax = x - lse carries the rounding of x and lse, not of the (small) result.
      expect_near_all(y, y_ref, 2e-6, "softmax y " + what, log ? 1.0 : 1e-2);
      kernels::softmax_backward(y_ref.data(), dy.data(), dx.data(), g.outer, g.C, g.inner, log);
      kernels::ref::softmax_backward(y_ref.data(), dy.data(), dx_ref.data(), g.outer, g.C, g.inner,
                                     log);
      expect_near_all(dx, dx_ref, 2e-5, "softmax dx " + what);
    }
  }
}

TEST(NNKernels, NormsMatchReference) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {37, 768}, {100, 33}, {5, 1500}}) {
    size_t n = size_t(N * C);
    // A large offset makes a one-pass variance lose everything; the two-pass one must not.
    std::vector<float> x = random_floats(n, 3, 1.0f, 300.0f), dy = random_floats(n, 4);
    std::vector<float> w = random_floats(size_t(C), 5), b = random_floats(size_t(C), 6);
    for (bool affine : {true, false}) {
      std::string what = std::to_string(N) + "x" + std::to_string(C) + (affine ? " affine" : "");
      const float *wp = affine ? w.data() : nullptr, *bp = affine ? b.data() : nullptr;
      std::vector<float> y(n), y_ref(n), m(static_cast<size_t>(N)), m_ref(static_cast<size_t>(N)),
          r(static_cast<size_t>(N)), r_ref(static_cast<size_t>(N));
      kernels::layer_norm_forward(x.data(), wp, bp, y.data(), m.data(), r.data(), N, C, 1e-5);
      kernels::ref::layer_norm_forward(x.data(), wp, bp, y_ref.data(), m_ref.data(), r_ref.data(),
                                       N, C, 1e-5);
      expect_near_all(y, y_ref, 1e-4, "layer_norm y " + what);
      expect_near_all(r, r_ref, 1e-5, "layer_norm rstd " + what);
      std::vector<float> dx(n), dx_ref(n), dw(static_cast<size_t>(C)),
          dw_ref(static_cast<size_t>(C)), db(static_cast<size_t>(C)),
          db_ref(static_cast<size_t>(C));
      kernels::layer_norm_backward(x.data(), wp, m_ref.data(), r_ref.data(), dy.data(), dx.data(),
                                   dw.data(), db.data(), N, C);
      kernels::ref::layer_norm_backward(x.data(), wp, m_ref.data(), r_ref.data(), dy.data(),
                                        dx_ref.data(), dw_ref.data(), db_ref.data(), N, C);
      // dx of a C = 1 row is rounding noise around 0: only an absolute bound makes sense.
      double atol = C == 1 ? 1e-5 : 0.0;
      expect_near_all(dx, dx_ref, 2e-4, "layer_norm dx " + what, 1e-2, atol);
      expect_near_all(dw, dw_ref, 2e-4, "layer_norm dw " + what);
      expect_near_all(db, db_ref, 1e-5, "layer_norm db " + what);

      std::vector<float> rs(static_cast<size_t>(N)), rs_ref(static_cast<size_t>(N));
      kernels::rms_norm_forward(x.data(), wp, y.data(), rs.data(), N, C, 1e-6);
      kernels::ref::rms_norm_forward(x.data(), wp, y_ref.data(), rs_ref.data(), N, C, 1e-6);
      expect_near_all(y, y_ref, 1e-5, "rms_norm y " + what);
      kernels::rms_norm_backward(x.data(), wp, rs_ref.data(), dy.data(), dx.data(), dw.data(), N,
                                 C);
      kernels::ref::rms_norm_backward(x.data(), wp, rs_ref.data(), dy.data(), dx_ref.data(),
                                      dw_ref.data(), N, C);
      expect_near_all(dx, dx_ref, 1e-4, "rms_norm dx " + what, 1e-2, atol);
      expect_near_all(dw, dw_ref, 1e-4, "rms_norm dw " + what);
    }
  }
}

TEST(NNKernels, CrossEntropyMatchesReference) {
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {4, 7}, {9, 3000}, {3, 1025}}) {
    size_t n = size_t(N * V);
    std::vector<float> x = random_floats(n, 7, 4.0f, 10.0f), scale = random_floats(size_t(N), 8);
    std::vector<int64_t> t(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) t[size_t(i)] = i % 3 == 1 ? -100 : (i * 7919) % V;
    for (double smoothing : {0.0, 0.1}) {
      std::string what =
          std::to_string(N) + "x" + std::to_string(V) + " eps " + std::to_string(smoothing);
      std::vector<float> loss(static_cast<size_t>(N)), loss_ref(static_cast<size_t>(N)),
          lse(static_cast<size_t>(N)), lse_ref(static_cast<size_t>(N));
      kernels::cross_entropy_forward(x.data(), t.data(), loss.data(), lse.data(), N, V, -100,
                                     smoothing);
      kernels::ref::cross_entropy_forward(x.data(), t.data(), loss_ref.data(), lse_ref.data(), N, V,
                                          -100, smoothing);
      expect_near_all(loss, loss_ref, 1e-5, "ce loss " + what);
      expect_near_all(lse, lse_ref, 1e-6, "ce lse " + what);
      std::vector<float> d(n), d_ref(n);
      kernels::cross_entropy_backward(x.data(), t.data(), lse_ref.data(), scale.data(), d.data(), N,
                                      V, -100, smoothing);
      kernels::ref::cross_entropy_backward(x.data(), t.data(), lse_ref.data(), scale.data(),
                                           d_ref.data(), N, V, -100, smoothing);
      expect_near_all(d, d_ref, 1e-5, "ce dlogits " + what);
    }
  }
}

template <class T>
void check_kd_kl_div_kernels(double tol) {
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {4, 7}, {5, 17}, {9, 3000}, {3, 1025}}) {
    size_t n = size_t(N * V);
    std::vector<float> s32 = random_floats(n, 21, 4.0f, 10.0f),
                       t32 = random_floats(n, 22, 3.0f, -5.0f),
                       scale32 = random_floats(size_t(N), 23);
    std::vector<T> s(s32.begin(), s32.end()), t(t32.begin(), t32.end()),
        scale(scale32.begin(), scale32.end());
    std::vector<int64_t> targets(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) targets[size_t(i)] = i % 3 == 1 ? -100 : i;
    for (bool all_scored : {false, true})
      for (double temp : {1.0, 2.0})
        for (bool reverse : {false, true}) {
          std::string what = std::to_string(N) + "x" + std::to_string(V) + " T " +
                             std::to_string(temp) + (reverse ? " reverse" : "") +
                             (all_scored ? " all scored" : "");
          const int64_t* tp = all_scored ? nullptr : targets.data();
          size_t rows = static_cast<size_t>(N);
          // Outputs start at 7: the fast kernel must write every row, ignored ones too.
          std::vector<T> kl(rows, T(7)), kl_ref(rows), ls(rows), ls_ref(rows), lt(rows),
              lt_ref(rows);
          kernels::kd_kl_div_forward(s.data(), t.data(), tp, kl.data(), ls.data(), lt.data(), N, V,
                                     -100, temp, reverse);
          kernels::ref::kd_kl_div_forward(s.data(), t.data(), tp, kl_ref.data(), ls_ref.data(),
                                          lt_ref.data(), N, V, -100, temp, reverse);
          expect_near_all(kl, kl_ref, tol, "kd kl " + what);
          expect_near_all(ls, ls_ref, tol, "kd lse_s " + what);
          expect_near_all(lt, lt_ref, tol, "kd lse_t " + what);
          std::vector<T> d(n, T(7)), d_ref(n);
          kernels::kd_kl_div_backward(s.data(), t.data(), tp, ls_ref.data(), lt_ref.data(),
                                      kl_ref.data(), scale.data(), d.data(), N, V, -100, temp,
                                      reverse);
          kernels::ref::kd_kl_div_backward(s.data(), t.data(), tp, ls_ref.data(), lt_ref.data(),
                                           kl_ref.data(), scale.data(), d_ref.data(), N, V, -100,
                                           temp, reverse);
          // Reverse KL's factor (log p_s - log p_t) - KL subtracts terms of ~20 nats on these
          // unrelated rows, which f32 holds to ~1e-6 absolute only.
          expect_near_all(d, d_ref, reverse ? 10 * tol : tol, "kd dstudent " + what);
        }
  }
}

TEST(NNKernels, KDKLDivMatchesReferenceF32) { check_kd_kl_div_kernels<float>(1e-5); }
TEST(NNKernels, KDKLDivMatchesReferenceF64) { check_kd_kl_div_kernels<double>(1e-12); }

template <class T>
void check_topk_load_kernels(double tol) {
  for (auto [N, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 2, 1}, {7, 5, 2}, {300, 8, 2},
                         {64, 16, 4}}) {
    const size_t n = size_t(N * E);
    std::vector<float> c32 = random_floats(n, 41, 3.0f), x32 = random_floats(n, 42, 3.0f),
                       s32 = random_floats(n, 43), d32 = random_floats(size_t(E), 44);
    std::vector<T> clean(c32.begin(), c32.end()), noisy(x32.begin(), x32.end()), noise(n),
        dload(d32.begin(), d32.end());
    for (size_t i = 0; i < n; ++i) noise[i] = T(0.3 + std::fabs(s32[i]));
    Tensor noisy_t = from_vector(std::vector<double>(noisy.begin(), noisy.end()), {N, E});
    const std::vector<int64_t> top = topk(noisy_t, k + 1, 1).indices.template to_vector<int64_t>();
    const std::string what = std::to_string(N) + "x" + std::to_string(E) + " k " +
                             std::to_string(k);
    const size_t experts = static_cast<size_t>(E);
    std::vector<T> z(n, T(7)), z_ref(n), load(experts, T(7)), load_ref(experts);
    kernels::topk_load_forward(clean.data(), noisy.data(), noise.data(), top.data(), N, E, k,
                               z.data(), load.data());
    kernels::ref::topk_load_forward(clean.data(), noisy.data(), noise.data(), top.data(), N, E, k,
                                    z_ref.data(), load_ref.data());
    expect_near_all(z, z_ref, tol, "topk_load z " + what);
    expect_near_all(load, load_ref, tol, "topk_load load " + what);
    // Gradient buffers start at 7: the kernel must write (dnoisy: clear) every element.
    std::vector<T> dc(n, T(7)), dn(n, T(7)), ds(n, T(7)), dc_ref(n), dn_ref(n), ds_ref(n);
    kernels::topk_load_backward(noise.data(), top.data(), z_ref.data(), dload.data(), N, E, k,
                                dc.data(), dn.data(), ds.data());
    kernels::ref::topk_load_backward(noise.data(), top.data(), z_ref.data(), dload.data(), N, E, k,
                                     dc_ref.data(), dn_ref.data(), ds_ref.data());
    expect_near_all(dc, dc_ref, tol, "topk_load dclean " + what);
    expect_near_all(dn, dn_ref, tol, "topk_load dnoisy " + what);
    expect_near_all(ds, ds_ref, tol, "topk_load dnoise_std " + what);
  }
}

TEST(NNKernels, TopkLoadMatchesReferenceF32) { check_topk_load_kernels<float>(1e-5); }
TEST(NNKernels, TopkLoadMatchesReferenceF64) { check_topk_load_kernels<double>(1e-12); }

TEST(NNKernels, EmbeddingMatchesReference) {
  int64_t V = 50, C = 37, n = 300;
  std::vector<float> w = random_floats(size_t(V * C), 9), dout = random_floats(size_t(n * C), 10);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = (i * i + 3) % V;
  std::vector<float> out(static_cast<size_t>(n * C)), out_ref(static_cast<size_t>(n * C));
  kernels::embedding_forward(w.data(), ids.data(), out.data(), n, C);
  kernels::ref::embedding_forward(w.data(), ids.data(), out_ref.data(), n, C);
  EXPECT_EQ(out, out_ref);
  std::vector<float> dw(size_t(V * C), 1.0f), dw_ref(static_cast<size_t>(V * C));
  kernels::embedding_backward(dout.data(), ids.data(), dw.data(), n, V, C, 3);
  kernels::ref::embedding_backward(dout.data(), ids.data(), dw_ref.data(), n, V, C, 3);
  EXPECT_EQ(dw, dw_ref);  // same additions in the same order: bitwise equal
}

// Gradient reductions must not depend on how many threads run them.
TEST(NNKernels, ReductionsAreTheSameForAnyThreadCount) {
  int64_t N = 300, C = 200, V = 500;  // large enough for every kernel to go parallel
  std::vector<float> x = random_floats(size_t(N * C), 11), dy = random_floats(size_t(N * C), 12);
  std::vector<float> w = random_floats(size_t(C), 13);
  std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      y(static_cast<size_t>(N * C));
  kernels::layer_norm_forward(x.data(), w.data(), w.data(), y.data(), mean.data(), rstd.data(), N,
                              C, 1e-5);
  std::vector<int64_t> ids(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = (i * 13) % 97;  // repeated ids
  auto run = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> dx(static_cast<size_t>(N * C)), dw(static_cast<size_t>(C)),
        db(static_cast<size_t>(C)), demb(static_cast<size_t>(V * C));
    kernels::layer_norm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(),
                                 dw.data(), db.data(), N, C);
    kernels::embedding_backward(dy.data(), ids.data(), demb.data(), N, V, C, -1);
    omp_set_num_threads(saved);
    return std::vector<std::vector<float>>{dx, dw, db, demb};
  };
  EXPECT_EQ(run(1), run(2));
  EXPECT_EQ(run(1), run(3));
}

}  // namespace
}  // namespace forge
