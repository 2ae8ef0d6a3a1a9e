// The gradients of an optimizer's parameters in one flat buffer, in parameters() order, and their
// sum over the ranks of a data-parallel run. Backward writes each gradient straight into its slot
// (core/autograd.h, GradSlot), so starting an update costs no pass over memory and scaling is one
// pass over the buffer. Under MPI the buffer is cut into buckets, from the last parameter
// backwards because backward completes gradients roughly in that order; during the last backward
// of an update a bucket starts its all-reduce as soon as all its gradients are complete, so the
// communication overlaps the rest of backward. With the optimizer state sharded (ZeRO-1), each
// rank owns a contiguous slice of the buffer: the all-reduce becomes a reduce-scatter, and after
// the update the slices of the parameters are all-gathered. docs/distributed.md describes both.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/autograd.h"
#include "core/comm.h"
#include "core/named_tensor.h"

namespace forge::optim {

/// The squares of the gradients are summed over blocks of this many elements of the flat buffer,
/// and the blocks' sums added in order: one norm whichever rank or thread summed a block.
inline constexpr int64_t kNormBlock = 4096;

/// Elements [begin, end) of a flat buffer.
struct Shard {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
/// The slice of a buffer of `total` elements that `rank` of `ranks` owns when the optimizer state
/// is sharded: contiguous, in rank order, whole kNormBlock blocks (the last rank's may end short).
Shard shard_of(int64_t total, int rank, int ranks);
/// Every rank's shard_of, by rank.
std::vector<Shard> shards_of(int64_t total, int ranks);
/// The elements a and b share (empty, at the later begin, when none).
Shard overlap(const Shard& a, const Shard& b);

class GradArena {
 public:
  /// Routes the gradients of `params` (contiguous, distinct, all f32, or all f64 in one process)
  /// into the buffer. Buckets hold
  /// about `bucket_bytes` (at least one parameter each); with `overlap` false every bucket starts
  /// after backward, which is how the time the overlap hides is measured. With `sharded` each
  /// rank reduces, scales and measures only its shard() of the buffer.
  GradArena(const NamedTensors& params, Comm& comm, int64_t bucket_bytes = 4 << 20,
            bool overlap = true, bool sharded = false);
  /// Gives the parameters back their own gradient tensors.
  ~GradArena();
  GradArena(const GradArena&) = delete;
  GradArena& operator=(const GradArena&) = delete;

  /// Starts the gradients of a new update: every .grad undefined (the next backward writes its
  /// slot), as Optimizer::zero_grad does. Reads and writes no gradient memory.
  void reset();
  /// Call before the last backward of an update: from then on, a complete bucket starts its
  /// all-reduce at once, in bucket order (every rank must start the same reductions in the same
  /// order). A no-op for one process.
  void arm();
  /// Seconds a rank spent in reduce() after its backward: `waited` in all, of which `exposed`
  /// after the last rank's backward ended (the communication overlap did not hide); the rest
  /// waited for slower ranks. `exposed` compares clocks across ranks: meaningful on one machine.
  struct Wait {
    double waited = 0, exposed = 0;
  };
  /// After the last backward: zeroes the slots no backward wrote, starts the buckets not started
  /// yet, waits for all, and gives .grad to exactly the parameters some rank's backward reached
  /// (the others stay undefined, so the optimizer skips them as it does in one process). Sharded,
  /// only this rank's shard holds the sums; the rest of the buffer is unspecified.
  Wait reduce();
  /// Every gradient *= factor (rounded to the gradients' dtype), in one pass that also returns the
  /// sum of squares of the scaled gradients: the square of their global norm, not finite when a
  /// gradient is not. Sharded, this rank scales its shard and the ranks share their blocks' sums;
  /// the norm is bitwise the unsharded one.
  double scale(double factor);
  /// Sharded, after the optimizer updated this rank's shard of the parameters: every rank gets
  /// every parameter's updated values (through the buffer, whose gradients are then spent). A
  /// no-op unsharded.
  void gather_parameters();

  const NamedTensors& parameters() const { return params_; }
  /// The flat buffer: parameter i's gradient at [offset(i), offset(i) + numel).
  const Tensor& buffer() const { return buffer_; }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  Comm& comm() const { return comm_; }
  bool sharded() const { return sharded_; }
  /// This rank's slice of the buffer: all of it unsharded.
  Shard shard() const { return shards_[size_t(comm_.rank())]; }

 private:
  struct Bucket {
    int64_t begin, end;          // element range of the buffer
    std::vector<size_t> params;  // indices into params_
    size_t pending = 0;          // parameters whose gradient the armed backward has not completed
    bool started = false;
  };
  void on_ready(size_t i);
  void start(Bucket& bucket);

  NamedTensors params_;
  Comm& comm_;
  bool overlap_, sharded_;
  std::vector<Shard> shards_;       // by rank
  std::vector<double> block_sums_;  // scale()'s, one per kNormBlock block
  Tensor buffer_;
  std::vector<int64_t> offsets_;
  std::vector<std::shared_ptr<GradSlot>> slots_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<char> completed_;  // per parameter, during the armed backward
  size_t next_bucket_ = 0;
  bool armed_ = false;
};

}  // namespace forge::optim
