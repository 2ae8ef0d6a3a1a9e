// Module registration, dotted-name traversal and loading state by name. All traversals walk
// entries_ in registration order, so names and their order are a pure function of how a model was
// built — checkpoints and optimizer groups rely on that.
#include "nn/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string_view>

#include "core/autograd.h"
#include "core/error.h"

namespace forge::nn {

void Module::check_new_name(const std::string& name) const {
  FORGE_CHECK(!name.empty() && name.find('.') == std::string::npos,
              "Module: name '", name, "' must be non-empty and contain no '.'");
  for (const Entry& e : entries_)
    FORGE_CHECK(e.name != name, "Module: name '", name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name);
  FORGE_CHECK(tensor.defined(), "Module: parameter '", name, "' is undefined");
  FORGE_CHECK(tensor.is_leaf(), "Module: parameter '", name, "' must be a leaf (detach() it)");
  tensor.set_requires_grad(requires_grad);
  entries_.push_back({Kind::parameter, name, tensor, true, nullptr, nullptr, nullptr});
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor, bool persistent) {
  check_new_name(name);
  FORGE_CHECK(tensor.defined(), "Module: buffer '", name, "' is undefined");
  entries_.push_back({Kind::buffer, name, tensor, persistent, nullptr, nullptr, nullptr});
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module,
                       const std::type_info* slot_type,
                       std::function<bool(const std::shared_ptr<Module>&)> rebind) {
  check_new_name(name);
  FORGE_CHECK(module != nullptr, "Module: child '", name, "' is null");
  entries_.push_back(
      {Kind::module, name, Tensor(), true, std::move(module), slot_type, std::move(rebind)});
}

std::string type_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : type.name();
  std::free(demangled);
  for (std::string_view ns : {"forge::nn::", "forge::"})
    for (size_t at; (at = name.find(ns)) != std::string::npos;) name.erase(at, ns.size());
  return name;
}

Module* Module::find_module(const std::string& path) {
  Module* m = this;
  size_t begin = 0;
  while (m && begin <= path.size() && !path.empty()) {
    const size_t dot = std::min(path.find('.', begin), path.size());
    const std::string part = path.substr(begin, dot - begin);
    Module* next = nullptr;
    for (const Entry& e : m->entries_)
      if (e.kind == Kind::module && e.name == part) next = e.module.get();
    m = next;
    begin = dot + 1;
  }
  return m;
}

void Module::replace(const std::string& path, std::shared_ptr<Module> module) {
  auto fail = [&](const std::string& why) {
    throw Error(ExitCode::usage, "Module::replace: '" + path + "' " + why);
  };
  const size_t dot = path.rfind('.');
  const std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
  const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
  Module* parent = find_module(parent_path);
  if (path.empty() || !parent) fail("is not a module of this model");
  auto it = std::find_if(parent->entries_.begin(), parent->entries_.end(), [&](const Entry& e) {
    return e.kind == Kind::module && e.name == name;
  });
  if (it == parent->entries_.end()) fail("is not a module of this model");
  if (!module) fail("cannot be replaced by null");
  if (!it->rebind)
    fail("is held by its parent as a " + type_name(*it->module) + " and cannot be replaced");
  if (!it->rebind(module))
    fail("needs a " + type_name(*it->slot_type) + ", got a " + type_name(*module));
  it->module = std::move(module);
  it->module->train(parent->is_training());
}

void Module::collect(const std::string& prefix, Kind kind, bool persistent_only,
                     NamedTensors& out) const {
  for (const Entry& e : entries_) {
    if (e.kind == Kind::module) {
      e.module->collect(prefix + e.name + ".", kind, persistent_only, out);
    } else if (e.kind == kind && (!persistent_only || e.persistent)) {
      out.push_back({prefix + e.name, e.tensor});
    }
  }
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", Kind::parameter, false, out);
  return out;
}

NamedTensors Module::named_buffers(bool persistent_only) const {
  NamedTensors out;
  collect("", Kind::buffer, persistent_only, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (NamedTensor& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const Entry& e : entries_)
    if (e.kind == Kind::module) out.emplace_back(e.name, e.module);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const Entry& e : entries_) {
    if (e.kind != Kind::module) continue;
    for (auto& [name, m] : e.module->named_modules())
      out.emplace_back(name.empty() ? e.name : e.name + "." + name, m);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const NamedTensor& p : named_parameters()) n += p.tensor.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (Entry& e : entries_)
    if (e.kind == Kind::module) e.module->train(on);
}

void Module::zero_grad() {
  for (NamedTensor& p : named_parameters()) p.tensor.set_grad(Tensor());
}

NamedTensors Module::named_state() const {
  NamedTensors out = named_parameters();
  collect("", Kind::buffer, true, out);
  return out;
}

void Module::load_named(const NamedTensors& source, bool strict) {
  auto fail = [](const std::string& message) { throw Error(ExitCode::checkpoint, message); };
  std::map<std::string, const Tensor*> given;
  for (const NamedTensor& s : source)
    if (!given.emplace(s.name, &s.tensor).second) fail("checkpoint: '" + s.name + "' appears twice");
  NamedTensors mine = named_state();
  // Validate everything first: a failed load must leave the model untouched.
  std::map<std::string, bool> known;
  for (const NamedTensor& m : mine) {
    known[m.name] = true;
    auto it = given.find(m.name);
    if (it == given.end()) fail("checkpoint: parameter '" + m.name + "' is missing");
    const Tensor& src = *it->second;
    if (src.shape() != m.tensor.shape())
      fail("checkpoint: parameter '" + m.name + "' has shape " + shape_str(src.shape()) +
           " in the checkpoint but " + shape_str(m.tensor.shape()) + " in the model");
    if (src.dtype() != m.tensor.dtype())
      fail("checkpoint: parameter '" + m.name + "' has dtype " + dtype_name(src.dtype()) +
           " in the checkpoint but " + dtype_name(m.tensor.dtype()) + " in the model");
  }
  if (strict)
    for (const NamedTensor& s : source)
      if (!known.count(s.name))
        fail("checkpoint: unexpected parameter '" + s.name + "' (shape " + shape_str(s.tensor.shape()) +
             ") is not in the model");
  NoGradGuard no_grad;
  for (NamedTensor& m : mine) m.tensor.copy_(*given.at(m.name));
}

}  // namespace forge::nn
