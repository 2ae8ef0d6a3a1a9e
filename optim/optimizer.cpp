// AdamW and SGD: validation, the step loop over groups, state export/import, and the fused update
// loops. Each update is one pass over a parameter's buffers with scalar coefficients computed once
// in double; the per-element arithmetic follows torch's order of operations so f32 results match
// torch.optim to a few ulps (tests/optim/test_optim.cpp replays torch trajectories).
#include "optim/optimizer.h"

#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/kernels/optim.h"

namespace forge::optim {
namespace {

// Throws Error(usage) "<who>: <what>, got <value>" unless ok.
template <class V>
void require(bool ok, const char* who, const std::string& what, const V& value) {
  if (!ok) throw Error(ExitCode::usage, detail::concat(who, ": ", what, ", got ", value));
}

Tensor copy_as(const Tensor& src, DType dtype) {
  Tensor t = empty(src.shape(), dtype);
  t.copy_(src);
  return t;
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::vector<ParamGroup> groups, const char* who) : groups_(std::move(groups)) {
  std::unordered_set<std::string> names;
  std::unordered_set<const TensorImpl*> tensors;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    std::string group = "group " + std::to_string(gi) + " ";
    require(std::isfinite(g.lr_mult) && g.lr_mult >= 0, who, group + "lr_mult must be >= 0", g.lr_mult);
    require(std::isfinite(g.weight_decay) && g.weight_decay >= 0, who,
            group + "weight_decay must be >= 0", g.weight_decay);
    for (const NamedTensor& p : g.params) {
      FORGE_CHECK(p.tensor.defined(), who, ": parameter '", p.name, "' is an undefined tensor");
      FORGE_CHECK(names.insert(p.name).second, who, ": parameter name '", p.name,
                  "' appears more than once");
      FORGE_CHECK(tensors.insert(p.tensor.impl()).second, who, ": parameter '", p.name,
                  "' is the same tensor as an earlier parameter (tied weights belong in one group)");
      FORGE_CHECK(p.tensor.dtype() == DType::f32 || p.tensor.dtype() == DType::f64, who,
                  ": parameter '", p.name, "' must be f32 or f64, got ", dtype_name(p.tensor.dtype()));
      FORGE_CHECK(p.tensor.is_contiguous(), who, ": parameter '", p.name, "' is not contiguous (shape ",
                  shape_str(p.tensor.shape()), ")");
      ++num_params_;
    }
  }
}

void Optimizer::step(double lr) {
  FORGE_CHECK(std::isfinite(lr) && lr >= 0, name(), ": learning rate must be finite and >= 0, got ", lr);
  NoGradGuard no_grad;
  size_t index = 0;
  for (const ParamGroup& group : groups_) {
    for (const NamedTensor& p : group.params) {
      size_t i = index++;
      if (group.frozen) continue;
      Tensor grad = p.tensor.grad();
      if (!grad.defined()) continue;
      FORGE_CHECK(grad.dtype() == p.tensor.dtype(), name(), ": gradient of '", p.name, "' is ",
                  dtype_name(grad.dtype()), ", parameter is ", dtype_name(p.tensor.dtype()));
      if (!grad.is_contiguous()) grad = grad.contiguous();
      update(i, p.tensor, grad, lr * group.lr_mult, group.weight_decay);
    }
  }
  FORGE_CHECK(index == num_params_, name(), ": the groups hold ", index,
              " parameters but the optimizer was built with ", num_params_,
              " (parameter lists must not change after construction)");
}

void Optimizer::zero_grad() {
  for (const ParamGroup& group : groups_)
    for (const NamedTensor& p : group.params) {
      Tensor t = p.tensor;
      t.set_grad(Tensor());
    }
}

NamedTensors Optimizer::parameters() const {
  NamedTensors all;
  all.reserve(num_params_);
  for (const ParamGroup& group : groups_) all.insert(all.end(), group.params.begin(), group.params.end());
  return all;
}

std::vector<std::vector<const Tensor*>> Optimizer::match_state(
    const NamedTensors& state, const std::vector<StateKind>& kinds) const {
  NamedTensors params = parameters();
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].name] = i;
  std::string prefix = std::string(name()) + ".";
  std::string expected = prefix + "{";
  for (size_t k = 0; k < kinds.size(); ++k) expected += (k ? "," : "") + kinds[k].kind;
  expected += "}.<parameter>";

  std::vector<std::vector<const Tensor*>> found(params.size(),
                                                std::vector<const Tensor*>(kinds.size(), nullptr));
  for (const NamedTensor& entry : state) {
    size_t k = kinds.size(), pi = 0;
    for (size_t kk = 0; kk < kinds.size() && k == kinds.size(); ++kk) {
      std::string head = prefix + kinds[kk].kind + ".";
      if (entry.name.compare(0, head.size(), head) != 0) continue;
      auto it = index_of.find(entry.name.substr(head.size()));
      if (it != index_of.end()) k = kk, pi = it->second;
    }
    if (k == kinds.size())
      throw Error(ExitCode::checkpoint, detail::concat("optimizer state: unexpected entry '", entry.name,
                                                       "' (expected ", expected,
                                                       " for a parameter of this model)"));
    if (found[pi][k])
      throw Error(ExitCode::checkpoint,
                  detail::concat("optimizer state: duplicate entry '", entry.name, "'"));
    Shape want = kinds[k].scalar ? Shape{} : params[pi].tensor.shape();
    if (!entry.tensor.defined() || entry.tensor.shape() != want)
      throw Error(ExitCode::checkpoint,
                  detail::concat("optimizer state: '", entry.name, "' has shape ",
                                 entry.tensor.defined() ? shape_str(entry.tensor.shape()) : "(undefined)",
                                 ", expected ", shape_str(want)));
    found[pi][k] = &entry.tensor;
  }
  for (size_t pi = 0; pi < params.size(); ++pi) {
    size_t have = 0;
    for (const Tensor* t : found[pi]) have += t != nullptr;
    if (have == 0 || have == kinds.size()) continue;
    size_t present = 0, missing = 0;
    while (!found[pi][present]) ++present;
    while (found[pi][missing]) ++missing;
    throw Error(ExitCode::checkpoint,
                detail::concat("optimizer state: '", prefix, kinds[missing].kind, ".", params[pi].name,
                               "' is missing (the state has '", prefix, kinds[present].kind, ".",
                               params[pi].name, "')"));
  }
  return found;
}

// ---- AdamW ----

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), "adamw"), options_(options), state_(num_params_) {
  require(options.beta1 >= 0 && options.beta1 < 1, "adamw", "beta1 must be in [0, 1)", options.beta1);
  require(options.beta2 >= 0 && options.beta2 < 1, "adamw", "beta2 must be in [0, 1)", options.beta2);
  require(std::isfinite(options.eps) && options.eps >= 0, "adamw", "eps must be >= 0", options.eps);
}

void AdamW::update(size_t index, const Tensor& param, const Tensor& grad, double lr,
                   double weight_decay) {
  ParamState& s = state_[index];
  if (!s.m.defined()) {
    s.m = zeros(param.shape(), param.dtype());
    s.v = zeros(param.shape(), param.dtype());
  }
  update_elements(++s.step, lr, weight_decay, param, grad, 0, s.m, s.v);
}

void AdamW::update_elements(int64_t t, double lr, double weight_decay, const Tensor& param,
                            const Tensor& grad, int64_t begin, Tensor& m, Tensor& v) const {
  double bc1 = 1.0 - std::pow(options_.beta1, double(t));
  double bc2 = 1.0 - std::pow(options_.beta2, double(t));
  auto run = [&](auto zero) {
    using T = decltype(zero);
    kernels::AdamWCoeffs<T> c{T(1.0 - lr * weight_decay), T(options_.beta1), T(1.0 - options_.beta1),
                     T(options_.beta2), T(1.0 - options_.beta2), T(std::sqrt(bc2)), T(options_.eps),
                     T(-lr / bc1)};
    kernels::adamw_update<T>(param.data<T>() + begin, grad.data<T>() + begin, m.data<T>(),
                             v.data<T>(), m.numel(), c);
  };
  if (param.dtype() == DType::f32) run(0.0f);
  else run(0.0);
}

NamedTensors AdamW::state() const {
  NamedTensors params = parameters(), out;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamState& s = state_[i];
    if (!s.m.defined()) continue;
    out.push_back({"adamw.m." + params[i].name, s.m});
    out.push_back({"adamw.v." + params[i].name, s.v});
    out.push_back({"adamw.step." + params[i].name, scalar(double(s.step), DType::i64)});
  }
  return out;
}

std::vector<std::vector<const Tensor*>> AdamW::match_adamw_state(const NamedTensors& state) const {
  auto found = match_state(state, {{"m", false}, {"v", false}, {"step", true}});
  NamedTensors params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!found[i][2]) continue;
    double step = found[i][2]->item();
    if (!(step >= 1 && step == std::floor(step) && step < 9007199254740992.0))
      throw Error(ExitCode::checkpoint, detail::concat("optimizer state: 'adamw.step.", params[i].name,
                                                       "' must be a positive integer, got ", step));
  }
  return found;
}

void AdamW::load_state(const NamedTensors& state) {
  auto found = match_adamw_state(state);
  NamedTensors params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    ParamState& s = state_[i];
    s = ParamState{};
    if (!found[i][0]) continue;
    s.m = copy_as(*found[i][0], params[i].tensor.dtype());
    s.v = copy_as(*found[i][1], params[i].tensor.dtype());
    s.step = int64_t(found[i][2]->item());
  }
}

// ---- SGD ----

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups), "sgd"), options_(options), momentum_(num_params_) {
  require(std::isfinite(options.momentum) && options.momentum >= 0, "sgd", "momentum must be >= 0",
          options.momentum);
  require(!options.nesterov || options.momentum > 0, "sgd", "nesterov needs momentum > 0",
          options.momentum);
}

void SGD::update(size_t index, const Tensor& param, const Tensor& grad, double lr, double weight_decay) {
  auto run = [&](auto zero) {
    using T = decltype(zero);
    if (options_.momentum == 0) {
      kernels::sgd_update<T>(param.data<T>(), grad.data<T>(), param.numel(), T(weight_decay), T(-lr));
      return;
    }
    Tensor& buf = momentum_[index];
    bool first = !buf.defined();
    if (first) buf = zeros(param.shape(), param.dtype());
    kernels::sgd_momentum_update<T>(param.data<T>(), grad.data<T>(), buf.data<T>(), param.numel(),
                         T(weight_decay), T(-lr), T(options_.momentum), first, options_.nesterov);
  };
  if (param.dtype() == DType::f32) run(0.0f);
  else run(0.0);
}

NamedTensors SGD::state() const {
  NamedTensors params = parameters(), out;
  for (size_t i = 0; i < params.size(); ++i)
    if (momentum_[i].defined()) out.push_back({"sgd.momentum." + params[i].name, momentum_[i]});
  return out;
}

void SGD::load_state(const NamedTensors& state) {
  auto found = match_state(state, {{"momentum", false}});
  NamedTensors params = parameters();
  for (size_t i = 0; i < params.size(); ++i)
    momentum_[i] = found[i][0] ? copy_as(*found[i][0], params[i].tensor.dtype()) : Tensor();
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<ParamGroup> groups) {
  if (spec.name == "adamw")
    return std::make_unique<AdamW>(std::move(groups), AdamWOptions{spec.beta1, spec.beta2, spec.eps});
  if (spec.name == "sgd")
    return std::make_unique<SGD>(std::move(groups), SGDOptions{spec.momentum, spec.nesterov});
  throw Error(ExitCode::usage,
              detail::concat("optimizer: unknown name '", spec.name, "' (expected adamw or sgd)"));
}

}  // namespace forge::optim
