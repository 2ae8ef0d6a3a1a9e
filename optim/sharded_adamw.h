// AdamW with its state sharded over the ranks of a data-parallel run (ZeRO stage 1): each rank
// keeps m and v for its slice of the flat parameters (optim::shard_of, the gradient arena's
// layout) and updates only that slice; the gradient arena reduce-scatters the gradients before and
// all-gathers the parameters after (docs/distributed.md). Checkpoints see AdamW's whole state under
// AdamW's names, so a run moves between sharded and unsharded and between numbers of ranks.
#pragma once

#include <functional>
#include <vector>

#include "core/comm.h"
#include "optim/grad_arena.h"
#include "optim/optimizer.h"

namespace forge::optim {

class ShardedAdamW final : public AdamW {
 public:
  /// The groups and options of `adamw` (whose own state is not used) over `comm`'s ranks. Every
  /// parameter must be f32.
  ShardedAdamW(const AdamW& adamw, Comm& comm);

  /// Collective (every rank calls it): on rank 0, AdamW's whole state, gathered from the ranks
  /// (copies, not live handles); empty on the other ranks.
  NamedTensors state() const override;
  /// Collective, as state(), one tensor at a time: rank 0 calls `take` with each tensor of the
  /// whole state in state()'s order (a checkpoint writes it and lets it go, so no rank ever holds
  /// the whole state); the other ranks send their slices and never call it.
  void gather_state(const std::function<void(const NamedTensor&)>& take) const;
  /// AdamW's whole state (any checkpoint's), validated as AdamW validates it; this rank keeps its
  /// slice.
  void load_state(const NamedTensors& state) override;
  /// This rank's elements of the flat parameters, in parameters() order.
  Shard shard() const { return shards_[size_t(comm_.rank())]; }

 protected:
  /// The update of this rank's slice of `param` (the rest waits for
  /// GradArena::gather_parameters); every rank counts the step of every parameter it updates.
  void update(size_t index, const Tensor& param, const Tensor& grad, double lr,
              double weight_decay) override;

 private:
  // Parameter i's elements of the flat parameters on `rank`.
  Shard piece(size_t i, int rank) const;

  struct Slice {
    Tensor m, v;  // this rank's piece of the parameter; undefined when empty or before an update
    int64_t step = 0;
  };
  Comm& comm_;
  std::vector<int64_t> offsets_;  // of each parameter in the flat parameters
  std::vector<Shard> shards_;     // by rank
  std::vector<Slice> slices_;
};

}  // namespace forge::optim
