// The gradient arena: gradients land in one flat buffer in parameter order and equal the ones
// backward gives each tensor on its own; parameters no backward reaches keep no gradient; buckets
// are cut from the last parameter and, in a data-parallel run, start their reduction during
// backward as soon as their gradients are complete. A FakeComm (tests/fake_comm.h) plays one rank
// of a job; the real 2-rank runs are in tests/recipes/test_distributed.cpp.
#include "optim/grad_arena.h"

#include <gtest/gtest.h>

#include "core/ops.h"
#include "tests/fake_comm.h"

namespace forge::optim {
namespace {

using forge::testing::FakeComm;

struct Params {
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  Tensor b = from_vector(std::vector<float>{-1, 0.5f, 2}, {3}).set_requires_grad(true);
  Tensor c = from_vector(std::vector<float>{3, 1}, {2}).set_requires_grad(true);
  Tensor unused = from_vector(std::vector<float>{7, 7}, {2}).set_requires_grad(true);
  NamedTensors named() const { return {{"a", a}, {"b", b}, {"c", c}, {"unused", unused}}; }
};

// a is used first in forward, c last: backward completes c first and a last.
Tensor loss_of(const Params& p, float scale) {
  Tensor x = from_vector(std::vector<float>{0.5f, -1, 2}, {3});
  Tensor h = sum(mul(mul(p.a, x), scale));  // d/da = scale * x per row
  Tensor g = sum(mul(mul(p.b, p.b), h));    // d/db = 2 b h
  return sum(mul(p.c, g));                  // d/dc = g
}

std::vector<float> flat(const Tensor& t) { return t.to_vector<float>(); }

TEST(GradArena, GradientsLandInOneBufferInParameterOrderAndEqualPerTensorGradients) {
  Params reference;
  loss_of(reference, 1.0f).backward();
  loss_of(reference, 2.0f).backward();

  Params p;
  GradArena arena(p.named(), world_comm());
  loss_of(p, 1.0f).backward();
  loss_of(p, 2.0f).backward();
  float* unused_slot = arena.buffer().data<float>() + arena.offset(3);
  unused_slot[0] = unused_slot[1] = 5.0f;  // what an earlier update left there
  arena.reduce();
  for (const NamedTensor& n : p.named()) {
    if (n.name == "unused") continue;
    const Tensor want = n.name == "a" ? reference.a.grad()
                        : n.name == "b" ? reference.b.grad()
                                        : reference.c.grad();
    EXPECT_EQ(flat(n.tensor.grad()), flat(want)) << n.name;
  }
  EXPECT_EQ(arena.buffer().numel(), 6 + 3 + 2 + 2);
  EXPECT_EQ(p.b.grad().data<float>(), arena.buffer().data<float>() + arena.offset(1));
  EXPECT_EQ(p.c.grad().data<float>(), arena.buffer().data<float>() + 9);

  // No backward reached `unused`: no gradient (the optimizer skips it), and a zero slot.
  EXPECT_FALSE(p.unused.grad().defined());
  EXPECT_EQ(unused_slot[0], 0.0f);
  EXPECT_EQ(unused_slot[1], 0.0f);

  arena.scale(0.5);
  EXPECT_FLOAT_EQ(p.c.grad().data<float>()[0], 0.5f * reference.c.grad().data<float>()[0]);
  arena.reset();
  for (const NamedTensor& n : p.named()) EXPECT_FALSE(n.tensor.grad().defined()) << n.name;
  // The next backward writes the slots afresh rather than adding to what they held.
  loss_of(p, 1.0f).backward();
  Params once;
  loss_of(once, 1.0f).backward();
  EXPECT_EQ(flat(p.a.grad()), flat(once.a.grad()));
}

TEST(GradArena, SlotsNoBackwardWroteAreZeroedBeforeTheyAreSummed) {
  Params p;
  FakeComm comm(0, 2);
  GradArena arena(p.named(), comm);
  loss_of(p, 1.0f).backward();
  arena.reduce();
  arena.reset();
  // A backward that reaches only `a`: the stale values of b and c from the last update must not
  // be summed into the other rank's gradients.
  sum(p.a).backward();
  arena.reduce();
  const std::vector<float> all = flat(arena.buffer());
  for (size_t i = 6; i < all.size(); ++i) EXPECT_EQ(all[i], 0.0f) << i;
  EXPECT_FALSE(p.b.grad().defined());
  EXPECT_EQ(flat(p.a.grad()), std::vector<float>(6, 2.0f));  // 1 per element, summed over 2 ranks
}

TEST(GradArena, BucketsAreCutFromTheLastParameterAndCoverTheBuffer) {
  Params p;
  FakeComm comm(0, 2);
  GradArena arena(p.named(), comm, /*bucket_bytes=*/4 * sizeof(float));
  // From the end, a bucket takes parameters until it holds 4 elements: [unused, c], then [b, a].
  ASSERT_EQ(arena.num_buckets(), 2);
  arena.arm();
  loss_of(p, 1.0f).backward();
  arena.reduce();
  const float* base = arena.buffer().data<float>();
  ASSERT_EQ(comm.started.size(), 2u);
  EXPECT_EQ(comm.started[0].first - base, 9);
  EXPECT_EQ(comm.started[0].second, 4);
  EXPECT_EQ(comm.started[1].first - base, 0);
  EXPECT_EQ(comm.started[1].second, 9);
}

// With one bucket per parameter, b's bucket starts before backward reaches a; c's waits behind
// `unused` (never reached), which only the end of backward completes, and buckets start in
// order. Without overlap, every bucket starts after backward.
TEST(GradArena, ABucketStartsDuringBackwardOnceItsGradientsAreComplete) {
  for (bool overlap : {true, false}) {
    Params p;
    FakeComm comm(0, 2);
    GradArena arena({{"a", p.a}, {"c", p.c}, {"b", p.b}, {"unused", p.unused}}, comm,
                    /*bucket_bytes=*/1, overlap);
    std::vector<bool> a_done;
    comm.on_start = [&] { a_done.push_back(p.a.grad().defined()); };
    arena.arm();
    // Backward completes c, then b, then a; bucket order is unused, b, c, a.
    loss_of(p, 1.0f).backward();
    EXPECT_TRUE(a_done.empty()) << "overlap " << overlap << ": `unused` holds every bucket back";
    arena.reduce();
    EXPECT_EQ(a_done.size(), 4u);
    EXPECT_FALSE(p.unused.grad().defined());

    Params q;
    FakeComm comm2(0, 2);
    GradArena arena2({{"a", q.a}, {"b", q.b}, {"c", q.c}}, comm2, /*bucket_bytes=*/1, overlap);
    a_done.clear();
    comm2.on_start = [&] { a_done.push_back(q.a.grad().defined()); };
    arena2.arm();
    loss_of(q, 1.0f).backward();
    arena2.reduce();
    ASSERT_EQ(a_done.size(), 3u);
    // c's and b's buckets start before a's gradient exists only when overlapping.
    EXPECT_EQ(a_done[0], !overlap);
    EXPECT_EQ(a_done[1], !overlap);
    EXPECT_TRUE(a_done[2]);
    Params single;
    loss_of(single, 1.0f).backward();
    std::vector<float> twice = flat(single.b.grad());
    for (float& v : twice) v *= 2;
    EXPECT_EQ(flat(q.b.grad()), twice);  // the sum over the two ranks
  }
}

}  // namespace
}  // namespace forge::optim
