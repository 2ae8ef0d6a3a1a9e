// The engine. Gradients flow along Node::next edges; a leaf that requires grad owns one
// accumulate_grad node (held weakly by the leaf, strongly by its consumers) that adds into .grad.
#include "core/autograd.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "core/kernels/elementwise.h"
#include "core/ops.h"

namespace forge {
namespace {

thread_local bool grad_mode = true;
thread_local std::function<void()> backward_progress;
std::atomic<uint64_t> next_seq{0};

std::shared_ptr<Node> new_node(Op op) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->seq = next_seq.fetch_add(1, std::memory_order_relaxed);
  return node;
}

// The node that receives the gradient of `t`: its producer, or its leaf accumulator.
std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return impl->grad_fn;
  std::shared_ptr<Node> acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = new_node(Op::accumulate_grad);
    acc->leaf = t.impl_ptr();
    acc->input_shapes = {t.shape()};
    impl->grad_accumulator = acc;
  }
  return acc;
}

// True when `g` is the only handle to a dense buffer of its own, so a leaf can adopt it.
bool sole_owner(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.offset() == 0 &&
         g.is_contiguous();
}

// buffer += g, both dense with the same shape and dtype.
void add_into(Tensor& buffer, const Tensor& g) {
  const Shape& shape = buffer.shape();
  const Shape strides = contiguous_strides(shape);
  const int ndim = int(shape.size());
  if (buffer.dtype() == DType::f32)
    kernels::binary_forward(kernels::Binary::add, buffer.data<float>(), strides.data(),
                            g.data<float>(), strides.data(), buffer.data<float>(), shape.data(), ndim);
  else
    kernels::binary_forward(kernels::Binary::add, buffer.data<double>(), strides.data(),
                            g.data<double>(), strides.data(), buffer.data<double>(), shape.data(),
                            ndim);
}

void accumulate_leaf(Node& node, Tensor g) {
  std::shared_ptr<TensorImpl> leaf = node.leaf.lock();
  if (!leaf) return;  // the tensor is gone; nobody can read its gradient
  Tensor t(leaf);
  if (const std::shared_ptr<GradSlot> slot = leaf->grad_slot) {
    Tensor& buffer = slot->buffer;
    if (!leaf->grad.defined()) {
      buffer.copy_(g);
      leaf->grad = buffer;
    } else if (leaf->grad.impl() == buffer.impl()) {
      Tensor dense = g.dtype() == buffer.dtype() ? g.contiguous() : g.to(buffer.dtype());
      add_into(buffer, dense);
    } else {
      buffer.copy_(add(leaf->grad, g));  // someone replaced .grad (set_grad): adopt it again
      leaf->grad = buffer;
    }
    if (slot->ready) slot->ready();
    return;
  }
  if (!leaf->grad.defined()) {
    // Adopt the buffer when nothing else can see it; otherwise copy, since `g` may alias a
    // tensor another node still reads (add passes one dout to both inputs).
    if (g.dtype() != t.dtype())
      leaf->grad = g.to(t.dtype());
    else
      leaf->grad = sole_owner(g) ? std::move(g) : g.clone();
  } else {
    leaf->grad = add(leaf->grad, g);
  }
}

}  // namespace

Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending = std::move(next);
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    // Only the last owner unlinks; the node then dies here with no children left to recurse into.
    if (n && n.use_count() == 1) {
      for (auto& child : n->next) pending.push_back(std::move(child));
      n->next.clear();
    }
  }
}

const char* op_name(Op op) {
  switch (op) {
#define FORGE_OP_NAME(name) \
  case Op::name:            \
    return #name;
    FORGE_DIFFERENTIABLE_OPS(FORGE_OP_NAME) FORGE_ENGINE_NODES(FORGE_OP_NAME)
#undef FORGE_OP_NAME
  }
  return "?";
}

const std::vector<Op>& differentiable_ops() {
  static const std::vector<Op> ops = {
#define FORGE_OP_LIST(name) Op::name,
      FORGE_DIFFERENTIABLE_OPS(FORGE_OP_LIST)
#undef FORGE_OP_LIST
  };
  return ops;
}

void set_grad_slot(const Tensor& leaf, std::shared_ptr<GradSlot> slot) {
  FORGE_CHECK(!slot || (slot->buffer.shape() == leaf.shape() && slot->buffer.dtype() == leaf.dtype() &&
                        slot->buffer.is_contiguous()),
              "set_grad_slot: the buffer must be contiguous with the leaf's shape and dtype");
  leaf.impl()->grad_slot = std::move(slot);
}

void set_backward_progress(std::function<void()> fn) { backward_progress = std::move(fn); }

bool grad_enabled() { return grad_mode; }
NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(grad_mode) { grad_mode = true; }
EnableGradGuard::~EnableGradGuard() { grad_mode = previous_; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_mode) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record(Op op, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn backward) {
  // Edges first: a leaf's accumulator created here must get a smaller seq than this node.
  std::vector<std::shared_ptr<Node>> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) next.push_back(gradient_edge(t));
  auto node = new_node(op);
  node->next = std::move(next);
  node->input_shapes.reserve(inputs.size());
  for (const Tensor& t : inputs) node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
  node->backward = std::move(backward);
  // `out` may be a view sharing another tensor's impl fields; give it its own metadata.
  TensorImpl* impl = out.impl();
  FORGE_CHECK(impl->grad_fn == nullptr && !impl->requires_grad,
              "record: output of ", op_name(op), " already has autograd history");
  impl->grad_fn = std::move(node);
  impl->requires_grad = true;
}

void run_backward(const Tensor& root, const Tensor& seed, bool retain_graph) {
  FORGE_CHECK(root.defined(), "backward: undefined tensor");
  FORGE_CHECK(root.requires_grad(), "backward: tensor does not require grad (no input of the ",
              "computation had requires_grad, or it ran under NoGradGuard)");
  Tensor droot = seed;
  if (!droot.defined()) {
    FORGE_CHECK(root.numel() == 1, "backward: a seed gradient is required for a non-scalar output ",
                "of shape ", shape_str(root.shape()));
    droot = ones(root.shape(), root.dtype());
  }
  FORGE_CHECK(droot.shape() == root.shape(), "backward: seed shape ", shape_str(droot.shape()),
              " differs from output shape ", shape_str(root.shape()));

  std::shared_ptr<Node> start = gradient_edge(root);
  // Collect every node reachable from the root with an explicit stack (graphs can be 1e5+ deep).
  std::vector<Node*> order;
  std::unordered_map<Node*, Tensor> grads;
  {
    std::vector<Node*> stack = {start.get()};
    std::unordered_map<Node*, bool> seen = {{start.get(), true}};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      order.push_back(n);
      for (const auto& next : n->next)
        if (next && seen.emplace(next.get(), true).second) stack.push_back(next.get());
    }
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->seq > b->seq; });

  NoGradGuard no_grad;
  grads[start.get()] = droot;
  for (Node* node : order) {
    auto it = grads.find(node);
    if (it == grads.end()) continue;  // no gradient reached this node
    Tensor dout = std::move(it->second);
    grads.erase(it);
    if (node->op == Op::accumulate_grad) {
      accumulate_leaf(*node, std::move(dout));
      continue;
    }
    FORGE_CHECK(node->backward, "backward: the graph through ", op_name(node->op),
                " was already freed; pass retain_graph=true to the first backward() to run it twice");
    std::vector<Tensor> dinputs = node->backward(dout);
    if (!retain_graph) node->backward = nullptr;
    if (backward_progress) backward_progress();
    FORGE_CHECK(dinputs.size() == node->next.size(), "backward of ", op_name(node->op), " returned ",
                dinputs.size(), " gradients for ", node->next.size(), " inputs");
    for (size_t i = 0; i < dinputs.size(); ++i) {
      Node* next = node->next[i].get();
      if (!next || !dinputs[i].defined()) continue;
      FORGE_CHECK(dinputs[i].shape() == node->input_shapes[i], "backward of ", op_name(node->op),
                  ": gradient for input ", i, " has shape ", shape_str(dinputs[i].shape()),
                  ", expected ", shape_str(node->input_shapes[i]));
      auto [slot, inserted] = grads.try_emplace(next, dinputs[i]);
      if (!inserted) slot->second = add(slot->second, dinputs[i]);  // fan-out sums
    }
  }
}

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                  const std::vector<Tensor>& inputs) {
  GeneratorState rng_state = default_generator().state();
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  // Parameters captured by fn also need the recomputation, so record whenever grad mode is on.
  if (!grad_enabled() || !out.defined()) return out;
  out = out.detach();
  std::vector<Tensor> saved;
  std::vector<bool> wants;
  for (const Tensor& t : inputs) {
    saved.push_back(t.detach());
    wants.push_back(t.requires_grad());
  }
  record(Op::checkpoint, out, inputs, [fn, saved, wants, rng_state](const Tensor& dout) {
    std::vector<Tensor> replay;
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor t = saved[i].detach();
      if (wants[i]) t.set_requires_grad(true);
      replay.push_back(t);
    }
    GeneratorState after = default_generator().state();
    default_generator().set_state(rng_state);
    Tensor recomputed;
    {
      EnableGradGuard grad_on;
      recomputed = fn(replay);
    }
    default_generator().set_state(after);
    std::vector<Tensor> dinputs(saved.size());
    if (recomputed.requires_grad()) {
      recomputed.backward(dout);
      for (size_t i = 0; i < replay.size(); ++i)
        if (wants[i]) dinputs[i] = replay[i].grad();
    }
    return dinputs;
  });
  return out;
}

Tensor custom_function(const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                       const std::vector<Tensor>& inputs, BackwardFn backward) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = forward(inputs);
  }
  bool any = false;
  for (const Tensor& t : inputs) any = any || needs_grad(t);
  if (any) {
    out = out.detach();
    record(Op::custom, out, inputs, std::move(backward));
  }
  return out;
}

}  // namespace forge
