// The losses of preference training, as TRL writes them (docs/recipes/preference.md): a sequence's
// summed response log-probability, DPO with its sigmoid, IPO and hinge variants, ORPO and SimPO
// (which compare no reference), and the Bradley-Terry loss of a reward model. All are composites
// of differentiable ops, so they need no backward of their own, and all return one loss per pair:
// the recipe sums or averages them like any other per-example loss, and TRL's batch loss is their
// mean.
#pragma once

#include "core/tensor.h"

namespace forge::nn {

/// Summed log-probability of each row's targets: logits [N, T, V] (float), targets i64 [N, T] ->
/// [N], out[n] = sum over t with targets[n][t] != -100 of log_softmax(logits[n][t])[targets[n][t]]
/// (0 for a row without targets). One fused cross-entropy, so no [N, T, V] log-softmax is kept.
/// Throws Error(data) for a target outside [0, V) that is not -100.
Tensor sequence_logprobs(const Tensor& logits, const Tensor& targets);

/// The same per position: [N, T], out[n][t] = log_softmax(logits[n][t])[targets[n][t]], 0 where
/// the target is -100 (PPO's per-token log-probabilities).
Tensor token_logprobs(const Tensor& logits, const Tensor& targets);

enum class DPOLossType {
  sigmoid,  ///< DPO (Rafailov et al. 2023), with conservative label smoothing
  ipo,      ///< IPO (Azar et al. 2023) on per-token averaged log-probabilities, as TRL does it
  hinge,    ///< SLiC's hinge (Zhao et al. 2023)
  orpo,     ///< ORPO (Hong et al. 2024), TRL's ORPOTrainer: no reference
  simpo,    ///< SimPO (Meng et al. 2024), TRL's CPOTrainer with loss_type simpo: no reference
};

/// Whether a loss compares the policy with a reference (sigmoid, ipo, hinge) or not (orpo, simpo).
bool needs_reference(DPOLossType type);

struct DPOOptions {
  double beta = 0.1;  ///< TRL's default; > 0 (IPO's tau, ORPO's lambda)
  /// eps in [0, 0.5): the chance a label is flipped (cDPO); sigmoid and simpo only
  double label_smoothing = 0.0;
  DPOLossType loss_type = DPOLossType::sigmoid;
  double simpo_gamma = 0.5;  ///< SimPO's target margin gamma (TRL's simpo_gamma), finite
};

/// The four log-probabilities of B pairs ([B] each, one float dtype), summed over each response's
/// tokens (sequence_logprobs). The reference's are constants: dpo_loss never differentiates them;
/// orpo and simpo do not read them (they may be undefined). The token counts ([B], any dtype, each
/// > 0; PreferenceBatch::target_counts) are read by ipo, orpo and simpo. chosen_nll, read by orpo
/// only, is a scalar of the policy's dtype: TRL's ORPO NLL term, the mean negative log-likelihood
/// over every token of the batch's chosen rows after the first, prompt included.
struct DPOLogProbs {
  Tensor policy_chosen, policy_rejected;
  Tensor reference_chosen{}, reference_rejected{};
  Tensor chosen_tokens{}, rejected_tokens{};
  Tensor chosen_nll{};
};

/// Per-pair losses [B] and TRL's implicit rewards [B] (no graph): rewards/chosen is
/// beta (pi_c - ref_c), rewards/rejected beta (pi_r - ref_r) (orpo and simpo: beta times the
/// policy's per-token average, as TRL logs them); their difference is rewards/margins and
/// (chosen > rejected) rewards/accuracies. log_odds [B] (orpo only, no graph) is ORPO's log odds
/// ratio, whose mean TRL logs as log_odds_chosen and the mean of its log sigmoid as
/// log_odds_ratio.
struct DPOResult {
  Tensor losses, chosen_rewards, rejected_rewards;
  Tensor log_odds{};
};

/// With h = (pi_c - pi_r) - (ref_c - ref_r) (TRL's logits) and z = beta h:
///   sigmoid: -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)
///   ipo:     (h - 1 / (2 beta))^2, where every log-probability (policy and reference) is first
///            divided by its response's token count, as TRL averages them for IPO; the rewards
///            are then computed from those averages too, as TRL logs them
///   hinge:   relu(1 - z)
/// and, on the policy's per-token averages a_c = pi_c / |y_c|, a_r = pi_r / |y_r| alone:
///   orpo:    nll + beta * -log sigmoid(o), o = (a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r)),
///            nll = chosen_nll (every pair carries the batch's, so the pairs' mean is TRL's loss)
///   simpo:   -(1 - eps) log sigmoid(s) - eps log sigmoid(-s), s = beta (a_c - a_r) - gamma
/// Throws Error(usage) for beta not finite and > 0, label_smoothing outside [0, 0.5) or nonzero
/// with another loss than sigmoid or simpo, simpo_gamma not finite, missing or non-positive token
/// counts with ipo, orpo or simpo, a missing chosen_nll with orpo; Error(internal) for inputs of
/// other shapes or dtypes.
DPOResult dpo_loss(const DPOLogProbs& logps, const DPOOptions& options = {});

/// The reward model's Bradley-Terry loss per pair (TRL's RewardTrainer): chosen and rejected
/// rewards [B] (one float dtype), margin [B] or undefined (0) ->
///   -log sigmoid(r_c - r_r - margin) + center_rewards_coefficient (r_c + r_r)^2,
/// whose mean is TRL's loss (its centring term is c mean((r_c + r_r)^2)). Throws Error(usage) for
/// a negative or non-finite coefficient, Error(internal) for mismatched shapes or dtypes.
Tensor bradley_terry_loss(const Tensor& chosen, const Tensor& rejected, const Tensor& margin = {},
                          double center_rewards_coefficient = 0.0);

}  // namespace forge::nn
