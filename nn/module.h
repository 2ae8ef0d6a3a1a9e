// Module: the container every layer and model derives from. It registers parameters, buffers and
// child modules by name, so named_parameters() yields stable dotted names in registration order
// ("blocks.3.attn.qkv.weight") — the names optimizer groups, freezing, LoRA and checkpoints key on
// (docs/architecture.md). Forward signatures differ per layer, so forward is not virtual here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/named_tensor.h"
#include "core/tensor.h"

namespace forge::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Modules are held by shared_ptr and their parameters are handles; copying one would alias
  // tensors silently.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Registers a leaf (requires_grad set as given) and returns the same handle.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  /// Registers state that is not trained. Persistent buffers are saved and loaded with the
  /// parameters; non-persistent ones (e.g. rotary tables) are derived and rebuilt instead.
  Tensor register_buffer(const std::string& name, Tensor tensor, bool persistent = true);
  /// Registers a child under `name` and returns it, typed.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module, nullptr, nullptr);
    return module;
  }
  /// Registers a child that replace() may swap for any other I: `slot` (the member of this module
  /// that forward reads) is set to `module` now and re-pointed on replacement, so forward pays
  /// nothing for the indirection. Modules never move (copy is deleted), so the slot stays valid.
  template <class I, class M>
  void register_module(const std::string& name, std::shared_ptr<M> module,
                       std::shared_ptr<I>& slot) {
    static_assert(std::is_base_of_v<I, M>, "register_module: the slot must hold a base of M");
    slot = module;
    add_child(name, std::move(module), &typeid(I), [&slot](const std::shared_ptr<Module>& m) {
      std::shared_ptr<I> typed = std::dynamic_pointer_cast<I>(m);
      if (!typed) return false;
      slot = std::move(typed);
      return true;
    });
  }

  /// Swaps the child at dotted `path` ("blocks.0.attn.qkv") for `module`, which takes on this
  /// model's training mode; the parent's forward uses it from then on. Throws Error(usage) naming
  /// the path when it does not exist, when its parent holds it as a concrete type (not replaceable),
  /// or when `module` is not of the interface the parent needs.
  void replace(const std::string& path, std::shared_ptr<Module> module);
  /// The descendant at dotted `path`, or nullptr when there is none ("" is this module).
  Module* find_module(const std::string& path);

  /// Dotted names of this module's and all descendants' parameters, in registration order.
  NamedTensors named_parameters() const;
  /// Likewise for buffers; persistent_only leaves out derived ones.
  NamedTensors named_buffers(bool persistent_only = false) const;
  std::vector<Tensor> parameters() const;
  /// Direct children, in registration order.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  /// This module ("") and every descendant with its dotted path, depth first, in registration order.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// Total number of parameter elements (trainable or not).
  int64_t num_parameters() const;

  /// Sets training mode here and in every descendant (dropout is active only in training).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Drops every parameter's accumulated gradient.
  void zero_grad();

  /// What load_named() copies: parameters followed by persistent buffers (checkpoint contents).
  NamedTensors named_state() const;
  /// Copies `source` into this module's state by name. Names, shapes and dtypes are all validated
  /// before anything is copied; a missing, unexpected (when strict) or mismatched entry throws
  /// Error(ExitCode::checkpoint) naming it and both shapes or dtypes.
  void load_named(const NamedTensors& source, bool strict = true);

 private:
  enum class Kind { parameter, buffer, module };
  struct Entry {
    Kind kind;
    std::string name;
    Tensor tensor;                    // parameter or buffer
    bool persistent = true;           // buffer
    std::shared_ptr<Module> module;   // child
    const std::type_info* slot_type = nullptr;  // replaceable child: the interface its slot holds
    std::function<bool(const std::shared_ptr<Module>&)> rebind;  // re-points the slot, or false
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module,
                 const std::type_info* slot_type,
                 std::function<bool(const std::shared_ptr<Module>&)> rebind);
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, Kind kind, bool persistent_only, NamedTensors& out) const;

  std::vector<Entry> entries_;  // registration order across all kinds
  bool training_ = true;
};

/// A readable class name for error messages ("Linear", "SelfAttention"; namespaces dropped).
std::string type_name(const std::type_info& type);
inline std::string type_name(const Module& m) { return type_name(typeid(m)); }

/// Children named "0", "1", ... (the blocks of a transformer), typed.
template <class M>
class ModuleList : public Module {
 public:
  /// Registers `module` under the next index and returns it.
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
    return items_.back();
  }
  const std::shared_ptr<M>& operator[](size_t i) const { return items_.at(i); }
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace forge::nn
