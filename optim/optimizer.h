// Optimizers over parameter groups: the Optimizer interface, AdamW and SGD with torch.optim
// semantics, and their state as named tensors for checkpoints. Parameters arrive as NamedTensors
// (never Modules, docs/architecture.md); each group carries its own lr multiplier, weight decay and
// frozen flag, which is how names become per-layer learning rates and freezing (optim/groups.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/named_tensor.h"

namespace forge::optim {

/// Parameters that share hyper-parameters. A group's learning rate is step(lr)'s lr * lr_mult.
struct ParamGroup {
  std::vector<NamedTensor> params;
  double lr_mult = 1.0;
  double weight_decay = 0.0;
  /// Frozen groups get no update (and build_param_groups turns their requires_grad off).
  bool frozen = false;
  /// Gradual unfreezing: when > 0, apply_unfreezing sets frozen = (step < trainable_from). Groups
  /// with 0 keep whatever `frozen` says (a frozen one stays frozen for the whole run).
  int64_t trainable_from = 0;
};

/// Base of all optimizers. State tensors are allocated once, at a parameter's first update, so a
/// step allocates nothing; updates are fused loops writing the parameter storage in place.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update with learning rate lr * group.lr_mult. Frozen groups and parameters whose grad is
  /// undefined are skipped (they keep their state untouched, as in torch).
  void step(double lr);
  /// Drops every gradient (set_grad(Tensor())): the next backward writes fresh ones, and step()
  /// skips parameters no backward reached.
  void zero_grad();

  /// The optimizer state as named tensors for a checkpoint: live handles (copy for a snapshot),
  /// only for parameters that have been updated at least once. Names are "<name()>.<kind>.<param>".
  virtual NamedTensors state() const = 0;
  /// Replaces the whole state with `state` (as returned by state()). Validates every name and shape
  /// before changing anything; throws Error(checkpoint) naming the first mismatch.
  virtual void load_state(const NamedTensors& state) = 0;

  /// "adamw" or "sgd": the prefix of the state names.
  virtual const char* name() const = 0;

  /// Groups may be edited between steps (lr_mult, weight_decay, frozen), but not their parameter
  /// lists: state is indexed by position.
  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  /// Every parameter of every group, in group order.
  NamedTensors parameters() const;

 protected:
  /// Validates the groups (unique names and tensors, contiguous f32/f64, lr_mult and weight_decay
  /// >= 0); `who` prefixes messages.
  Optimizer(std::vector<ParamGroup> groups, const char* who);

  /// Updates parameter `index` (position in parameters()) with the contiguous gradient `grad`.
  virtual void update(size_t index, const Tensor& param, const Tensor& grad, double lr,
                      double weight_decay) = 0;

  /// What one state entry per parameter looks like: kind "m" with the parameter's shape, or a 0-d
  /// scalar such as "step".
  struct StateKind {
    std::string kind;
    bool scalar;
  };
  /// Validates `state` against the parameters: every entry must be "<name()>.<kind>.<param>" for a
  /// known kind and parameter, with the right shape, no duplicates, and each parameter must have
  /// either all kinds or none. Returns, per parameter, the entry of each kind (null when absent).
  std::vector<std::vector<const Tensor*>> match_state(const NamedTensors& state,
                                                      const std::vector<StateKind>& kinds) const;

  std::vector<ParamGroup> groups_;
  size_t num_params_ = 0;
};

/// torch.optim.AdamW's hyper-parameters (weight decay lives in the groups). amsgrad is not offered.
struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

/// AdamW exactly as torch.optim.AdamW (1.13, amsgrad off): per parameter, with t its own step count,
///   p -= lr*wd*p;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
///   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
/// The decoupled decay comes first, on the pre-update parameter. t counts the parameter's own
/// updates (torch's state['step']), so a group unfrozen late gets a fresh bias correction.
/// State: adamw.m.<param>, adamw.v.<param>, adamw.step.<param> (0-d i64).
class AdamW : public Optimizer {
 public:
  /// Throws Error(usage) quoting the bad value, e.g. "adamw: beta2 must be in [0, 1), got 1.5".
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});

  NamedTensors state() const override;
  void load_state(const NamedTensors& state) override;
  const char* name() const override { return "adamw"; }
  const AdamWOptions& options() const { return options_; }

 protected:
  void update(size_t index, const Tensor& param, const Tensor& grad, double lr,
              double weight_decay) override;
  /// The update of `param`'s contiguous elements [begin, begin + m.numel()) from the same
  /// elements of `grad`, with m and v holding just those elements and t the update's step count:
  /// the loop behind AdamW and its sharded form (optim/sharded_adamw.h).
  void update_elements(int64_t t, double lr, double weight_decay, const Tensor& param,
                       const Tensor& grad, int64_t begin, Tensor& m, Tensor& v) const;
  /// match_state for AdamW's kinds m, v, step (in that order), every step a positive integer.
  std::vector<std::vector<const Tensor*>> match_adamw_state(const NamedTensors& state) const;

 private:
  struct ParamState {
    Tensor m, v;  // undefined until the first update
    int64_t step = 0;
  };
  AdamWOptions options_;
  std::vector<ParamState> state_;
};

/// torch.optim.SGD's hyper-parameters (dampening is always 0; weight decay lives in the groups).
struct SGDOptions {
  double momentum = 0.0;
  bool nesterov = false;
};

/// SGD exactly as torch.optim.SGD with dampening 0: per parameter,
///   g += wd*p;  buf = g on the first update, else buf = momentum*buf + g;
///   g = nesterov ? g + momentum*buf : buf;  p -= lr*g
/// (weight decay is L2 added to the gradient, not decoupled). With momentum 0 it keeps no state.
/// State: sgd.momentum.<param>.
class SGD : public Optimizer {
 public:
  /// Throws Error(usage) for momentum < 0 or nesterov without momentum.
  explicit SGD(std::vector<ParamGroup> groups, SGDOptions options = {});

  NamedTensors state() const override;
  void load_state(const NamedTensors& state) override;
  const char* name() const override { return "sgd"; }

 protected:
  void update(size_t index, const Tensor& param, const Tensor& grad, double lr,
              double weight_decay) override;

 private:
  SGDOptions options_;
  std::vector<Tensor> momentum_;  // undefined until the first update
};

/// The `optimizer:` config keys an optimizer is built from (groups carry lr_mult and decay).
struct OptimizerSpec {
  std::string name = "adamw";  // adamw | sgd
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.0;
  bool nesterov = false;
};

/// AdamW or SGD by name; throws Error(usage) for an unknown name or a bad hyper-parameter.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, std::vector<ParamGroup> groups);

}  // namespace forge::optim
