// Tensor handle, factories, data movement and printing. Views and differentiable layout ops live
// in core/ops/layout.cpp; this file never records graph nodes except through the engine.
#include "core/tensor.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/kernels/copy.h"
#include "core/kernels/random.h"

namespace forge {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Storage::Storage(size_t nbytes) : data_(allocator::allocate(nbytes)), nbytes_(nbytes) {}
Storage::~Storage() { allocator::deallocate(data_, nbytes_); }

// ---- accessors ----

const Shape& Tensor::shape() const { return impl_->shape; }
const Shape& Tensor::strides() const { return impl_->strides; }
int64_t Tensor::offset() const { return impl_->offset; }
DType Tensor::dtype() const { return impl_->dtype; }
const std::shared_ptr<Storage>& Tensor::storage() const { return impl_->storage; }

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  FORGE_CHECK(d >= -n && d < n, "size: dimension ", d, " out of range for shape ",
              shape_str(shape()));
  return shape()[size_t(d < 0 ? d + n : d)];
}

int64_t Tensor::numel() const { return shape_numel(impl_->shape); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * int64_t(dtype_size(impl_->dtype));
}

template <class T>
T* Tensor::data() const {
  FORGE_CHECK(defined(), "data: undefined tensor");
  FORGE_CHECK(impl_->dtype == dtype_of<T>(), "data: tensor is ", dtype_name(impl_->dtype),
              ", accessed as ", dtype_name(dtype_of<T>()));
  return static_cast<T*>(raw_data());
}
template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template bf16* Tensor::data<bf16>() const;
template int64_t* Tensor::data<int64_t>() const;

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

// ---- autograd metadata ----

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool value) {
  FORGE_CHECK(is_leaf() || !value, "set_requires_grad: only leaf tensors can be made to require ",
              "grad (this one is the output of ", op_name(impl_->grad_fn->op), ")");
  FORGE_CHECK(!value || impl_->dtype == DType::f32 || impl_->dtype == DType::f64,
              "set_requires_grad: only f32 and f64 tensors can require grad, this one is ",
              dtype_name(impl_->dtype));
  impl_->requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const { return impl_->grad; }
void Tensor::set_grad(const Tensor& g) {
  FORGE_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient shape ",
              shape_str(g.shape()), " does not match tensor shape ", shape_str(shape()));
  impl_->grad = g;
}
const std::shared_ptr<Node>& Tensor::grad_fn() const { return impl_->grad_fn; }
bool Tensor::is_leaf() const { return impl_->grad_fn == nullptr; }

void Tensor::backward(const Tensor& seed, bool retain_graph) const {
  run_backward(*this, seed, retain_graph);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

// ---- data movement ----

namespace {
void copy_into(const Tensor& src, const Tensor& dst) {
  kernels::copy_strided(src.raw_data(), src.dtype(), src.strides().data(), dst.raw_data(),
                        dst.dtype(), dst.strides().data(), src.shape().data(), int(src.dim()));
}

void check_mutable(const Tensor& t, const char* what) {
  FORGE_CHECK(!grad_enabled() || !t.requires_grad(), what,
              ": in-place update of a tensor that requires grad; wrap it in NoGradGuard");
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  // Differentiable: the result is a new tensor whose gradient flows back unchanged.
  Tensor out = empty(shape(), dtype());
  copy_into(*this, out);
  if (needs_grad(*this)) record(Op::contiguous, out, {*this}, [](const Tensor& dout) {
      return std::vector<Tensor>{dout};
    });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype());
  copy_into(*this, out);
  if (needs_grad(*this)) record(Op::contiguous, out, {*this}, [](const Tensor& dout) {
      return std::vector<Tensor>{dout};
    });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target);
  copy_into(*this, out);
  if (needs_grad(*this)) {
    FORGE_CHECK(target == DType::f32 || target == DType::f64, "to(", dtype_name(target),
                "): only f32 and f64 carry gradients; detach() first");
    DType source = dtype();
    record(Op::cast, out, {*this}, [source](const Tensor& dout) {
      return std::vector<Tensor>{dout.to(source)};
    });
  }
  return out;
}

double Tensor::at(const Shape& index) const {
  FORGE_CHECK(int64_t(index.size()) == dim(), "at: index ", shape_str(index), " for shape ",
              shape_str(shape()));
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    FORGE_CHECK(index[d] >= 0 && index[d] < impl_->shape[d], "at: index ", shape_str(index),
                " out of range for shape ", shape_str(shape()));
    off += index[d] * impl_->strides[d];
  }
  const char* p = static_cast<const char*>(raw_data()) + off * int64_t(dtype_size(dtype()));
  switch (dtype()) {
    case DType::f32: return *reinterpret_cast<const float*>(p);
    case DType::f64: return *reinterpret_cast<const double*>(p);
    case DType::bf16: return bf16_to_f32(*reinterpret_cast<const bf16*>(p));
    case DType::i64: return double(*reinterpret_cast<const int64_t*>(p));
  }
  return 0;
}

double Tensor::item() const {
  FORGE_CHECK(numel() == 1, "item: tensor has ", numel(), " elements, shape ", shape_str(shape()));
  return at(Shape(size_t(dim()), 0));
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = to(dtype_of<T>()).contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

Tensor& Tensor::fill_(double value) {
  check_mutable(*this, "fill_");
  if (is_contiguous()) {
    kernels::fill(raw_data(), dtype(), numel(), value);
  } else {
    Tensor src = full({1}, value, dtype());
    Tensor view = make_view(src, shape(), Shape(shape().size(), 0), 0);
    copy_into(view, *this);
  }
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_mutable(*this, "copy_");
  FORGE_CHECK(src.shape() == shape(), "copy_: source shape ", shape_str(src.shape()),
              " differs from destination shape ", shape_str(shape()));
  copy_into(src, *this);
  return *this;
}

namespace {
void require_frozen_leaf(const Tensor& t, const char* what) {
  FORGE_CHECK(!t.requires_grad() && t.is_leaf(), what, ": only a tensor that is neither trained "
              "nor the output of an op changes its dtype in place");
}

void hold_storage(TensorImpl& impl, const Tensor& dense) {
  impl.storage = dense.storage();
  impl.offset = 0;
  impl.strides = contiguous_strides(impl.shape);
  impl.dtype = dense.dtype();
}
}  // namespace

Tensor& Tensor::retype_(DType target) {
  require_frozen_leaf(*this, "retype_");
  if (target != dtype()) hold_storage(*impl_, to(target));
  return *this;
}

Tensor& Tensor::reset_storage_(DType target) {
  require_frozen_leaf(*this, "reset_storage_");
  hold_storage(*impl_, empty(shape(), target));
  return *this;
}

// ---- printing ----

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  const Shape& s = shape();
  constexpr int64_t edge = 3;  // elements shown at each end of a long dimension
  Shape index(s.size(), 0);
  auto fmt = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return std::string(buf);
  };
  std::function<void(size_t, int)> render = [&](size_t d, int indent) {
    if (d == s.size()) {
      out << fmt(at(index));
      return;
    }
    out << "[";
    int64_t n = s[d];
    bool cut = n > 2 * edge;
    for (int64_t i = 0; i < n; ++i) {
      if (cut && i == edge) {
        out << (d + 1 == s.size() ? "..., " : "...,\n" + std::string(size_t(indent + 1), ' '));
        i = n - edge;
      }
      index[d] = i;
      render(d + 1, indent + 1);
      if (i + 1 < n) out << (d + 1 == s.size() ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
    }
    out << "]";
  };
  out << "tensor(";
  render(0, 7);
  out << ", shape=" << shape_str(s) << ", dtype=" << dtype_name(dtype());
  if (requires_grad()) out << ", requires_grad";
  out << ")";
  return out.str();
}

// ---- factories ----

Tensor empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) FORGE_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  kernels::fill(t.raw_data(), dtype, t.numel(), value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor scalar(double value, DType dtype) { return full({}, value, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype()); }

Tensor arange(int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return from_vector(v, {n}, dtype);
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  FORGE_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
              " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  const int64_t one = 1, n = int64_t(values.size());
  kernels::copy_strided(values.data(), DType::f64, &one, t.raw_data(), dtype, &one, &n, 1);
  return t;
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape) {
  FORGE_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
              " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::f32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

namespace {
thread_local bool skip_init = false;

template <class Fill>
Tensor random_tensor(const Shape& shape, DType dtype, Generator& gen, uint64_t blocks, Fill fill) {
  FORGE_CHECK(dtype == DType::f32 || dtype == DType::f64,
              "random initialisers produce f32 or f64; convert with .to()");
  Tensor t = empty(shape, dtype);
  if (skip_init) return t;
  GeneratorState state = gen.state();
  uint64_t first = gen.advance(blocks);
  FORGE_DISPATCH_FLOAT(dtype, "random", [&] { fill(t.data<scalar_t>(), state, first); });
  return t;
}
}  // namespace

Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype) {
  int64_t n = shape_numel(shape);
  return random_tensor(shape, dtype, gen, kernels::uniform_blocks(n), [&](auto* p, auto& s, auto f) {
    kernels::fill_uniform(p, n, low, high, s, f);
  });
}

Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype) {
  int64_t n = shape_numel(shape);
  return random_tensor(shape, dtype, gen, kernels::normal_blocks(n), [&](auto* p, auto& s, auto f) {
    kernels::fill_normal(p, n, mean, std, s, f);
  });
}

Tensor trunc_normal(const Shape& shape, double mean, double std, double low, double high,
                    Generator& gen, DType dtype) {
  FORGE_CHECK(low < high && std > 0, "trunc_normal: need low < high and std > 0, got [", low, ", ",
              high, "] and std ", std);
  int64_t n = shape_numel(shape);
  return random_tensor(shape, dtype, gen, kernels::uniform_blocks(n), [&](auto* p, auto& s, auto f) {
    kernels::fill_trunc_normal(p, n, mean, std, low, high, s, f);
  });
}

SkipInitScope::SkipInitScope() : previous_(skip_init) { skip_init = true; }

SkipInitScope::~SkipInitScope() { skip_init = previous_; }

}  // namespace forge
