// Tensor: a cheap handle (shared ownership) to a strided view of storage, plus the autograd
// metadata (requires_grad, grad, the node that produced it). Views share storage; ops that need
// dense input call contiguous(), which copies only when the layout demands it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace forge {

using Shape = std::vector<int64_t>;

/// "[2, 3, 4]"
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
/// Row-major strides of a dense tensor with this shape.
Shape contiguous_strides(const Shape& shape);

/// Owns one block from the caching allocator.
class Storage {
 public:
  explicit Storage(size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

 private:
  void* data_;
  size_t nbytes_;
};

struct Node;
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t offset() const;
  DType dtype() const;
  int64_t dim() const { return int64_t(shape().size()); }
  /// Size of dimension `d`; negative `d` counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const;
  bool is_contiguous() const;

  /// Pointer to the first element (storage + offset); checks that T matches the dtype.
  template <class T>
  T* data() const;
  void* raw_data() const;
  const std::shared_ptr<Storage>& storage() const;

  // Autograd.
  bool requires_grad() const;
  /// Marks a leaf as a parameter-like tensor whose gradient backward() accumulates.
  Tensor& set_requires_grad(bool value);
  /// Accumulated gradient of a leaf (undefined until a backward reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& g);
  const std::shared_ptr<Node>& grad_fn() const;
  bool is_leaf() const;
  /// Reverse-mode pass from this tensor. `seed` defaults to 1 for a scalar and is required otherwise.
  void backward(const Tensor& seed = {}, bool retain_graph = false) const;
  /// Same storage, no history, requires_grad false.
  Tensor detach() const;

  // Data movement.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  /// The value of a one-element tensor.
  double item() const;
  /// Element at a multi-index (slow; for tests and printing).
  double at(const Shape& index) const;
  template <class T>
  std::vector<T> to_vector() const;

  // In-place updates outside autograd (optimizers, initialisation). Refused on tensors that are
  // part of a graph while grad mode is on, because a saved tensor would silently change.
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);
  Tensor& zero_() { return fill_(0.0); }
  /// Converts the values to `dtype` in new dense storage that this tensor's impl then holds, so
  /// every handle to it (a module's member and its registry entry) sees the new type; views taken
  /// before keep the old storage. For tensors that are neither trained nor part of a graph: a
  /// frozen weight kept in bf16 (nn::keep_frozen_in_bf16).
  Tensor& retype_(DType dtype);
  /// As retype_, but the new storage is left uninitialised: for a frozen weight that a file is
  /// about to fill, so that its values are never held in the type it was built in.
  Tensor& reset_storage_(DType dtype);

  /// Multi-line, numpy-like rendering with shape and dtype; long tensors are summarised.
  std::string str() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True when both handles view the same storage.
  bool shares_storage(const Tensor& other) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct GradSlot;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;  // in elements
  DType dtype = DType::f32;
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  std::weak_ptr<Node> grad_accumulator;  // a leaf's single AccumulateGrad node, created lazily
  std::shared_ptr<GradSlot> grad_slot;   // set by a gradient arena (core/autograd.h)
};

// Factories. dtype defaults to f32.
Tensor empty(const Shape& shape, DType dtype = DType::f32);
Tensor zeros(const Shape& shape, DType dtype = DType::f32);
Tensor ones(const Shape& shape, DType dtype = DType::f32);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
Tensor scalar(double value, DType dtype = DType::f32);
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
/// 0, 1, ..., n-1
Tensor arange(int64_t n, DType dtype = DType::f32);
/// A tensor holding `values` (row-major) with the given shape.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32);
Tensor from_vector(const std::vector<float>& values, const Shape& shape);
/// A view of `base`'s storage with explicit geometry (no autograd history).
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

// Seeded initialisers (counter-based: the same values for any number of threads).
Tensor uniform(const Shape& shape, double low, double high, Generator& gen = default_generator(),
               DType dtype = DType::f32);
Tensor normal(const Shape& shape, double mean, double std, Generator& gen = default_generator(),
              DType dtype = DType::f32);
/// Normal(mean, std) restricted to [low, high] by inverse-CDF sampling (exact, no rejection).
Tensor trunc_normal(const Shape& shape, double mean, double std, double low, double high,
                    Generator& gen = default_generator(), DType dtype = DType::f32);

/// While one lives on this thread, the initialisers above return uninitialised tensors and draw
/// nothing (like transformers' no_init_weights): for building a model whose every value a file
/// then overwrites, so that building it neither spends the draws nor writes the memory. Pages never
/// written are not resident, so a 1B-parameter model built this way and narrowed to bf16 before
/// its file is read never occupies its f32 size.
class SkipInitScope {
 public:
  SkipInitScope();
  ~SkipInitScope();
  SkipInitScope(const SkipInitScope&) = delete;
  SkipInitScope& operator=(const SkipInitScope&) = delete;

 private:
  bool previous_;
};

}  // namespace forge
