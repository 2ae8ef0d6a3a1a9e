// The sharded AdamW of train.shard_optimizer on each rank of a 2-rank job (tests/fake_comm.h plays
// the rank): it updates exactly its slice of the flat parameters, bitwise as AdamW updates those
// elements, loads its slice of AdamW's whole state, and gathers its part back under AdamW's names.
// The real 2-rank runs are in tests/recipes/test_distributed.cpp.
#include "optim/sharded_adamw.h"

#include <gtest/gtest.h>

#include "tests/fake_comm.h"

namespace forge::optim {
namespace {

using forge::testing::FakeComm;

TEST(Shard, SlicesAreWholeNormBlocksInRankOrder) {
  EXPECT_EQ(shard_of(10000, 0, 2).end, 4096);  // 3 blocks: 1 for rank 0, 2 for rank 1
  EXPECT_EQ(shard_of(10000, 1, 2).begin, 4096);
  EXPECT_EQ(shard_of(10000, 1, 2).end, 10000);
  EXPECT_EQ(shard_of(100, 0, 2).size(), 0);  // one block: the last rank's
  EXPECT_EQ(shard_of(100, 1, 2).size(), 100);
  EXPECT_EQ(shard_of(9 * kNormBlock, 2, 3).begin, 6 * kNormBlock);
  EXPECT_EQ(overlap({0, 10}, {20, 30}).size(), 0);
  EXPECT_EQ(overlap({0, 10}, {5, 30}).begin, 5);
}

// a, b, c hold 3000, 5000 and 2000 elements: rank 0 owns [0, 4096) (a and the start of b), rank 1
// the rest. Two groups: decay with lr multiplier 1, no decay with multiplier 0.5.
struct Model {
  explicit Model(uint64_t seed) {
    Generator gen(seed);
    a = normal({30, 100}, 0, 1, gen);
    b = normal({5000}, 0, 1, gen);
    c = normal({20, 100}, 0, 1, gen);
  }
  std::vector<ParamGroup> groups() const {
    return {ParamGroup{{{"a", a}, {"b", b}}, 1.0, 0.1}, ParamGroup{{{"c", c}}, 0.5, 0.0}};
  }
  Tensor a, b, c;
};

void set_grads(const Model& m, uint64_t seed) {
  Generator gen(seed);
  for (Tensor t : {m.a, m.b, m.c}) t.set_grad(normal(t.shape(), 0, 1, gen));
}

std::vector<float> flat(const Model& m) {
  std::vector<float> all;
  for (const Tensor& t : {m.a, m.b, m.c}) {
    const std::vector<float> v = t.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

TEST(ShardedAdamW, EachRankUpdatesItsSliceAsAdamWDoesAndLoadsItsSliceOfTheState) {
  for (int rank : {0, 1}) {
    Model full(1), sharded(1);
    const std::vector<float> before = flat(sharded);
    AdamW reference(full.groups(), {0.9, 0.99, 1e-8});
    FakeComm comm(rank, 2);
    ShardedAdamW optimizer(AdamW(sharded.groups(), {0.9, 0.99, 1e-8}), comm);
    const Shard mine = optimizer.shard();
    EXPECT_EQ(mine.begin, rank == 0 ? 0 : 4096);
    for (uint64_t step = 0; step < 3; ++step) {
      set_grads(full, 10 + step);
      set_grads(sharded, 10 + step);
      reference.step(1e-2);
      optimizer.step(1e-2);
    }
    const std::vector<float> want = flat(full), got = flat(sharded);
    for (int64_t i = 0; i < int64_t(got.size()); ++i) {
      const bool owned = i >= mine.begin && i < mine.end;
      ASSERT_EQ(got[size_t(i)], owned ? want[size_t(i)] : before[size_t(i)])
          << "rank " << rank << ", element " << i;
    }

    // The whole state of AdamW loads as this rank's slice: the next update is AdamW's again.
    Model resumed(1);
    for (auto [to, from] : {std::pair{resumed.a, full.a}, std::pair{resumed.b, full.b},
                            std::pair{resumed.c, full.c}})
      to.copy_(from);
    ShardedAdamW loaded(AdamW(resumed.groups(), {0.9, 0.99, 1e-8}), comm);
    loaded.load_state(reference.state());
    set_grads(full, 20);
    set_grads(resumed, 20);
    reference.step(1e-2);
    loaded.step(1e-2);
    const std::vector<float> again = flat(full), next = flat(resumed);
    for (int64_t i = mine.begin; i < mine.end; ++i)
      ASSERT_EQ(next[size_t(i)], again[size_t(i)]) << "rank " << rank << ", element " << i;

    // Gathered, the state has AdamW's names and step counts, and this rank's part of m and v.
    const NamedTensors state = loaded.state(), whole = reference.state();
    if (rank != 0) {
      EXPECT_TRUE(state.empty());
      continue;
    }
    ASSERT_EQ(state.size(), whole.size());
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_EQ(state[k].name, whole[k].name);
      EXPECT_EQ(state[k].tensor.shape(), whole[k].tensor.shape()) << state[k].name;
    }
    EXPECT_EQ(state[2].tensor.item(), 4.0);  // adamw.step.a
    EXPECT_EQ(state[0].tensor.to_vector<float>(), whole[0].tensor.to_vector<float>());  // adamw.m.a
  }
}

TEST(ShardedAdamW, OneProcessIsAdamW) {
  Model full(2), sharded(2);
  AdamW reference(full.groups());
  ShardedAdamW optimizer(AdamW(sharded.groups()), world_comm());
  for (uint64_t step = 0; step < 2; ++step) {
    set_grads(full, step);
    set_grads(sharded, step);
    reference.step(1e-2);
    optimizer.step(1e-2);
  }
  EXPECT_EQ(flat(full), flat(sharded));
  const NamedTensors a = reference.state(), b = optimizer.state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_EQ(a[k].tensor.to_vector<float>(), b[k].tensor.to_vector<float>()) << a[k].name;
}

}  // namespace
}  // namespace forge::optim
