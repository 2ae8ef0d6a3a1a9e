// Define-by-run reverse-mode autograd. Each op that sees an input requiring grad records a Node
// holding a closure over exactly what its backward reads. backward() visits nodes in decreasing
// creation order (a valid topological order, since a node's inputs always exist before it), so it
// needs no recursion and is deterministic; fan-out gradients are summed; saved state is released
// unless retain_graph is set.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "core/op_list.h"
#include "core/tensor.h"

namespace forge {

enum class Op : uint16_t {
#define FORGE_OP_ENUM(name) name,
  FORGE_DIFFERENTIABLE_OPS(FORGE_OP_ENUM) FORGE_ENGINE_NODES(FORGE_OP_ENUM)
#undef FORGE_OP_ENUM
};

const char* op_name(Op op);
/// All entries of FORGE_DIFFERENTIABLE_OPS, in order.
const std::vector<Op>& differentiable_ops();

/// Returns one gradient per input of the node (an undefined Tensor where none flows), each with the
/// shape of that input. Runs with grad mode off.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& dout)>;

struct Node {
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Releases the chain of input nodes iteratively: a 100 000-op chain must not recurse.
  ~Node();

  Op op;
  uint64_t seq;                              // creation order; inputs always have smaller seq
  std::vector<std::shared_ptr<Node>> next;   // per input; null where the input needs no grad
  std::vector<Shape> input_shapes;           // for checking what backward returns
  BackwardFn backward;                       // empty once released
  std::weak_ptr<TensorImpl> leaf;            // accumulate_grad only
};

/// Where backward puts the gradient of a leaf whose gradients live in a shared flat buffer (a
/// gradient arena, optim/grad_arena.h): the first accumulation of a backward into an undefined
/// .grad copies into `buffer` and makes it the .grad; later ones add into it in place. `ready`,
/// when set, runs after every accumulation, which is how a data-parallel run learns that a
/// gradient is complete and can start reducing it while backward goes on.
struct GradSlot {
  Tensor buffer;  ///< contiguous, with the leaf's shape and dtype
  std::function<void()> ready = {};
};
/// Routes `leaf`'s gradients into `slot` (null: back to fresh tensors per accumulation).
void set_grad_slot(const Tensor& leaf, std::shared_ptr<GradSlot> slot);

/// Runs `fn` between the nodes of every backward on this thread while set (empty: nothing). A
/// data-parallel run lets its reductions advance there: MPI moves a non-blocking operation
/// forward only inside its own calls.
void set_backward_progress(std::function<void()> fn);

/// True while operations record graph nodes (the default).
bool grad_enabled();

/// Disables recording in its scope: evaluation, teachers, reference models, optimizer updates.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Re-enables recording in its scope (used by checkpoint recomputation inside backward).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

/// Whether an op given these inputs must record a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
inline bool needs_grad(const Tensor& a) { return any_requires_grad({&a}); }
inline bool needs_grad(const Tensor& a, const Tensor& b) { return any_requires_grad({&a, &b}); }
inline bool needs_grad(const Tensor& a, const Tensor& b, const Tensor& c) {
  return any_requires_grad({&a, &b, &c});
}

/// Makes `out` the result of a recorded op over `inputs`. Call only when needs_grad(inputs...).
void record(Op op, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward);

/// The engine entry point behind Tensor::backward.
void run_backward(const Tensor& root, const Tensor& seed, bool retain_graph);

/// Runs fn(inputs) without keeping its activations; backward runs fn again with grad enabled and
/// differentiates the recomputed segment. Parameters fn captures receive their gradients too. The
/// default generator's state is restored for the recomputation, so dropout draws the same masks.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                  const std::vector<Tensor>& inputs);

/// A user-defined differentiable function: `backward` gets dout and returns one gradient per input.
/// For experiments and tests; built-in ops use record() with their own Op.
Tensor custom_function(const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                       const std::vector<Tensor>& inputs, BackwardFn backward);

}  // namespace forge
