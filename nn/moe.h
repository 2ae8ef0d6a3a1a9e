// A sparsely-gated mixture-of-experts feed-forward layer (Shazeer et al. 2017): a router sends each
// token to its top-k of n_experts expert MLPs and mixes their outputs by the gates. Tokens are
// grouped by expert and each expert runs as one GEMM (grouped_linear); balancing losses go to the
// step through the auxiliary-loss channel (nn/aux_loss.h). Routing is stochastic (noise, capacity)
// in training only; evaluation, generation and DeterministicRouting route each token alone.
// docs/recipes/moe.md has the formulas and the routing rules.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "nn/layers.h"

namespace forge::nn {

enum class MoEBalance { cv2, switch_loss, none };

/// model.moe.* of a gpt config.
struct MoEConfig {
  int64_t every = 0;       ///< 0: no MoE; n: blocks n-1, 2n-1, ... hold an MoE feed-forward
  int64_t n_experts = 8;
  int64_t top_k = 2;
  double ffn_mult = 4;     ///< each expert's hidden width, as GPTConfig::ffn_mult for the MLP
  bool noisy = true;       ///< H(x) = x W_g + eps * (softplus(x W_noise) + noise_eps) in training
  double noise_eps = 1e-2;
  double capacity_factor = 1.25;  ///< stochastic routing (training) only; 0 = no capacity limit
  MoEBalance balance = MoEBalance::cv2;
  double w_importance = 0.1;
  double w_load = 0.1;
  double w_switch = 0.01;
  double w_z = 0.0;        ///< router z-loss weight (ST-MoE); 0 = off
  bool operator==(const MoEConfig&) const = default;
};

/// A rule of MoEConfig that `config` breaks: the fields it reads ("top_k", "n_experts") and why,
/// in a message that names them as the config keys model.moe.<field>.
struct MoEConfigProblem {
  std::vector<std::string> fields;
  std::string message;
};
/// Every rule `config` breaks (none: consistent). The one statement of the rules: check_moe_config
/// and the config loader's cross-key checks both report these.
std::vector<MoEConfigProblem> moe_config_problems(const MoEConfig& config);
/// Throws Error(usage) with the first of moe_config_problems.
void check_moe_config(const MoEConfig& config);
/// Whether block `layer` (0-based) holds an MoE feed-forward.
bool is_moe_layer(const MoEConfig& config, int64_t layer);
/// Tokens one expert takes from `tokens` routed tokens at `factor` (0: all of them):
/// ceil(factor * tokens * top_k / n_experts), at least 1.
int64_t expert_capacity(const MoEConfig& config, double factor, int64_t tokens);

/// What the layer's pieces need besides MoEConfig (the block's sizes and init).
struct MoELayerShape {
  int64_t d_model = 0;
  int64_t hidden = 0;      ///< each expert's hidden width (mlp_hidden_size with moe.ffn_mult)
  bool swiglu = false;
  bool bias = true;
  double dropout = 0.0;
  double init_std = 0.02;
  double proj_init_std = 0.02;
};

// ---- The gating and balancing math, as the layer uses it (tests compare each with PyTorch) ----

/// KeepTopK then softmax: logits [N, E] -> gates [N, k] (softmax over the k largest logits, with
/// gradient) and their experts [N, k] i64 (largest first); with `with_next`, also `ranked`
/// [N, k+1], the k+1 largest (what topk_load's thresholds need, so the row is ranked once).
struct TopKGates {
  Tensor gates;
  Tensor experts;
  Tensor ranked;  ///< undefined unless asked for
};
TopKGates top_k_gating(const Tensor& logits, int64_t k, bool with_next = false);
/// CV(v)^2 = population variance / mean^2 of v [E] (the paper's code, plus 1e-10 on the mean^2).
Tensor cv_squared(const Tensor& v);
/// Importance(X) = sum over tokens of G(x): gates [N, k] added onto their experts [N, k] -> [E].
Tensor expert_importance(const Tensor& gates, const Tensor& experts, int64_t n_experts);
// The smooth load estimator Load(X) is the fused op topk_load (core/ops/nn.h).
/// Switch Transformer: n_experts * sum_i f_i P_i, f = `routed_share` [E] (no gradient), P the mean
/// of softmax(logits [N, E]) over tokens.
Tensor switch_balance_loss(const Tensor& logits, const Tensor& routed_share);
/// ST-MoE router z-loss: mean over tokens of logsumexp(logits [N, E])^2.
Tensor router_z_loss(const Tensor& logits);

/// One linear map per group of rows (the experts' weights stacked): "weight" [G, out, in] ~
/// N(0, init_std), "bias" [G, out] = 0 (optional). See grouped_linear (core/ops/linalg.h).
class GroupedLinear : public Module {
 public:
  GroupedLinear(int64_t groups, int64_t in_features, int64_t out_features, bool bias,
                Generator& gen, double init_std);
  /// x [M, in] with rows offsets[g] .. offsets[g+1] - 1 in group g -> [M, out].
  Tensor forward(const Tensor& x, const std::vector<int64_t>& offsets) const;

  Tensor weight;
  Tensor bias;  ///< undefined without bias
};

/// The gating network: "weight" [E, C] for the clean logits x W_g^T and, with noisy gating,
/// "noise" [E, C] for the noise scale; both start at zero, as in the paper.
class Router : public Module {
 public:
  Router(int64_t n_experts, int64_t d_model, bool noisy);

  Tensor weight;
  Tensor noise;  ///< undefined without noisy gating
};

/// [B, T, C] -> [B, T, C]: children "router", then "fc" (GELU) or "gate" and "up" (SwiGLU), and
/// "proj", each a GroupedLinear over the experts. In training the routing is stochastic: noisy
/// gating, and a token's assignment beyond its expert's capacity (claimed in the flattened batch's
/// token order) contributes nothing, the token passing through the residual. Otherwise (eval mode,
/// or deterministic routing switched on) the clean logits pick the experts and nothing is dropped,
/// so a token's output depends on that token alone, not on its batch or padding. In training,
/// under an AuxCollector, reports the balancing loss and the statistics cv_importance_l<L>,
/// cv_load_l<L>, dropped_frac_l<L> and expert_load_l<L>_e<i> (L the block index).
class MoE : public UnaryModule {
 public:
  MoE(const MoEConfig& config, const MoELayerShape& shape, int64_t layer,
      Generator& gen = default_generator());
  Tensor forward(const Tensor& x) const override;

  const MoEConfig& config() const { return config_; }
  /// Route in training as in evaluation (no noise, no capacity): what two forwards that must agree
  /// token for token need, e.g. PPO's rollout and update passes. Balancing losses still apply,
  /// except cv2's load term, which is built on the noise.
  void set_deterministic_routing(bool on) { deterministic_ = on; }
  bool deterministic_routing() const { return deterministic_; }

  std::shared_ptr<Router> router;
  std::shared_ptr<GroupedLinear> fc, gate, up, proj;
  std::shared_ptr<Dropout> drop;

 private:
  MoEConfig config_;
  int64_t layer_;
  bool deterministic_ = false;
};

/// Switches deterministic routing on in every MoE layer of `model` for its lifetime, and back to
/// what each had at the end. A model without MoE layers is left as it is.
class DeterministicRouting {
 public:
  explicit DeterministicRouting(Module& model);
  ~DeterministicRouting();
  DeterministicRouting(const DeterministicRouting&) = delete;
  DeterministicRouting& operator=(const DeterministicRouting&) = delete;

 private:
  std::vector<std::pair<MoE*, bool>> layers_;  // each layer and its setting before
};

}  // namespace forge::nn
