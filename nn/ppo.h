// The numerical pieces of PPO for language models (Ziegler et al. 2019, Ouyang et al. 2022), as
// TRL's PPOTrainer writes them: per-token rewards with a KL penalty, GAE, masked whitening, the
// clipped policy and value losses, the entropy of the policy and the adaptive KL controller; and
// GRPO's (Shao et al. 2024) as TRL's GRPOTrainer writes them: group-relative advantages, the k3 KL
// estimator and the clipped loss with its three normalisations.
// Per-token tensors are [B, T] over a rollout's response positions with a response mask [B, T] of
// 0/1; the losses are composites of differentiable ops, the rollout quantities (rewards,
// advantages) plain numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace forge::nn {

// Every function below takes per-token tensors of one float dtype (f32 or f64) and shape [B, T],
// and a mask [B, T] of any dtype holding 0 or 1 (1: a response token the policy generated).
// Values at masked positions are never read: they may be anything, even nan, and get no gradient.
// Inputs of other shapes or dtypes, masks holding other values and masks selecting no token (where
// a mean is taken) throw Error(internal): the recipe builds these tensors.

/// Per-token rewards [B, T] and the per-token KL estimate logp - ref_logp [B, T], both 0 at
/// masked positions (no graph).
struct PPORewards {
  Tensor rewards, kl;
};

/// TRL's compute_rewards: rewards = -kl_coef (logp - ref_logp) at every response token, plus
/// scores[b] ([B], the reward model's score of row b) at row b's last response token. Throws
/// Error(usage) for kl_coef not finite and >= 0, Error(internal) for a row without response tokens.
PPORewards per_token_rewards(const Tensor& logp, const Tensor& ref_logp, const Tensor& scores,
                             const Tensor& mask, double kl_coef);

/// Advantages [B, T] and returns = advantages + values [B, T], both 0 at masked positions.
struct PPOAdvantages {
  Tensor advantages, returns;
};

/// Generalised advantage estimation over each row's response tokens, backwards (no graph):
/// delta_t = r_t + gamma V_next - V_t and A_t = delta_t + gamma lam A_next, where "next" is the
/// row's next response token (V_next = A_next = 0 after its last). On TRL's masks (prompt, one run
/// of response tokens, padding) this is TRL's compute_advantages at the response tokens; across a
/// hole in the mask TRL chains through the masked positions, this skips them. Throws Error(usage)
/// for gamma or lam outside [0, 1].
PPOAdvantages gae(const Tensor& rewards, const Tensor& values, const Tensor& mask, double gamma,
                  double lam);

/// TRL's masked_whiten (no graph): (x - mean) / sqrt(var + 1e-8) with the mean and the unbiased
/// variance (divided by n - 1) over the n response tokens of the whole batch; the mean is added
/// back unless shift_mean. 0 at masked positions. Needs n >= 2 (Error(internal) otherwise).
Tensor whiten(const Tensor& x, const Tensor& mask, bool shift_mean = true);

/// The clipped surrogate loss (with graph through logp_new) and its statistics, masked means
/// over the response tokens as TRL logs them.
struct PPOPolicyLoss {
  Tensor loss;             ///< 0-d
  double clip_frac = 0;    ///< share of tokens where the clipped term is the larger (TRL's)
  double approx_kl = 0;    ///< 0.5 mean((logp_new - logp_old)^2)
  double ratio_mean = 0;   ///< mean(exp(logp_new - logp_old))
};

/// TRL's policy loss: ratio = exp(logp_new - logp_old),
/// loss = mean over response tokens of max(-A ratio, -A clip(ratio, 1 - eps, 1 + eps)),
/// eps = clip_range; logp_old and advantages are constants. Throws Error(usage) for clip_range
/// not finite and >= 0.
PPOPolicyLoss ppo_policy_loss(const Tensor& logp_new, const Tensor& logp_old,
                              const Tensor& advantages, const Tensor& mask,
                              double clip_range = 0.2);

/// The clipped value loss (with graph through values_new) and the share of response tokens where
/// the clipped term is the larger (TRL's vf clipfrac).
struct PPOValueLoss {
  Tensor loss;  ///< 0-d
  double clip_frac = 0;
};

/// TRL's value loss: with v_c = clip(values_new, values_old - c, values_old + c),
/// loss = 0.5 mean over response tokens of max((values_new - R)^2, (v_c - R)^2), R the returns.
/// values_old and returns are constants. Throws Error(usage) for clip_range_value (c) not finite
/// and >= 0.
PPOValueLoss ppo_value_loss(const Tensor& values_new, const Tensor& values_old,
                            const Tensor& returns, const Tensor& mask,
                            double clip_range_value = 0.2);

/// Mean over response tokens of the entropy of softmax(logits) [B, T, V] (0-d, with graph), for an
/// entropy bonus or TRL's policy/entropy statistic. Logits at masked positions must be finite.
Tensor entropy_from_logits(const Tensor& logits, const Tensor& mask);

struct KLControllerOptions {
  double init_kl_coef = 0.2;  ///< TRL's default; finite and >= 0
  /// false: the coefficient stays init_kl_coef (TRL's FixedKLController)
  bool adaptive = true;
  double target = 6.0;        ///< the KL (nats per sequence) to steer to; finite and > 0
  double horizon = 10000.0;   ///< in samples; finite and > 0
};

/// The KL coefficient of the per-token rewards, adapted as Ziegler et al. (2019) and TRL do:
/// e = clip(current_kl / target - 1, -0.2, 0.2); value *= 1 + e n_steps / horizon. Its whole
/// state is value(): checkpoint that double and hand it back to restore().
class KLController {
 public:
  /// Throws Error(usage) for options out of range (target and horizon checked when adaptive).
  explicit KLController(const KLControllerOptions& options = {});
  double value() const { return value_; }
  /// One update after a rollout of n_steps samples (TRL passes the batch size) whose mean KL is
  /// current_kl; nothing when not adaptive. Throws Error(numerical) for a non-finite current_kl,
  /// Error(internal) for negative n_steps.
  void update(double current_kl, int64_t n_steps);
  /// Sets the coefficient saved from value(); throws Error(checkpoint) unless finite and >= 0.
  void restore(double value);

 private:
  KLControllerOptions options_;
  double value_;
};

// ---- GRPO ----------------------------------------------------------------------------------------

/// TRL's group-relative advantages of `rewards` in consecutive groups of `group_size` (a prompt's
/// completions): A = r - mean(group), divided by std(group) + 1e-4 when `scale` (the unbiased std,
/// torch's); scale false is Dr. GRPO. Throws Error(internal) unless the size is a multiple of
/// group_size >= 1.
std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t group_size,
                                     bool scale);

/// Online rejection sampling's advantages: 1 for a reward >= threshold (kept), else 0.
std::vector<double> rejection_advantages(const std::vector<double>& rewards, double threshold);

/// How many groups of `group_size` consecutive rewards are all equal (their advantages all 0).
int64_t zero_variance_groups(const std::vector<double>& rewards, int64_t group_size);

/// The k3 estimator of KL(pi || ref) per token (Schulman 2020), TRL's:
/// exp(ref_logp - logp) - (ref_logp - logp) - 1, >= 0, with graph through logp; 0 at masked
/// positions. ref_logp is a constant.
Tensor k3_kl(const Tensor& logp, const Tensor& ref_logp, const Tensor& mask);

/// How grpo_loss divides the sum of its per-token losses (TRL's loss_type).
enum class GRPOLossType {
  grpo,     ///< by each completion's length, then the mean over completions (the paper)
  dapo,     ///< by the response tokens of the whole update (DAPO; TRL's "dapo")
  dr_grpo,  ///< by completions x max_completion_length, a constant (Dr. GRPO)
};

struct GRPOLossOptions {
  double epsilon = 0.2;       ///< the ratio's lower clip: 1 - epsilon
  double epsilon_high = 0.2;  ///< its upper clip: 1 + epsilon_high (DAPO's clip-higher: 0.28)
  double beta = 0.0;          ///< weight of the k3 KL to the reference; 0: no reference needed
  GRPOLossType type = GRPOLossType::dapo;
  int64_t max_completion_length = 0;  ///< dr_grpo's constant
};

/// GRPO's loss of a batch as a sum and what it is divided by, so that micro-batches accumulate:
/// loss_sum / units over one batch is TRL's loss, and summed over the micro-batches of an update
/// before the division it is TRL's loss of the whole update (dapo counts its tokens).
struct GRPOLoss {
  Tensor loss_sum;        ///< 0-d, with graph through logp_new
  int64_t units = 0;      ///< completions (grpo, dr_grpo) or response tokens (dapo)
  double clip_frac = 0;   ///< share of response tokens where the clipped term is the larger
  double kl = 0;          ///< token mean of k3 (0 when beta is 0)
  double ratio_mean = 0;  ///< token mean of exp(logp_new - logp_old)
};

/// TRL's GRPO loss per token, -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A) +
/// beta k3, with ratio = exp(logp_new - logp_old) and A = advantages[b] ([B]) at every response
/// token of row b; normalised as options.type says. logp_old, ref_logp and the advantages are
/// constants; ref_logp is read only when beta > 0. Throws Error(usage) for an epsilon or beta not
/// finite and >= 0, or dr_grpo without max_completion_length >= 1.
GRPOLoss grpo_loss(const Tensor& logp_new, const Tensor& logp_old, const Tensor& ref_logp,
                   const Tensor& advantages, const Tensor& mask, const GRPOLossOptions& options);

}  // namespace forge::nn
