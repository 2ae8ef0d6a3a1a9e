// Preference losses from existing ops: sequence log-probabilities through the fused cross-entropy
// (its backward rebuilds the softmax from a saved log-sum-exp per position), DPO's variants, ORPO,
// SimPO and the Bradley-Terry loss from elementwise ops on [B] vectors.
#include "nn/preference.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

namespace {

// The log-probability of every target [N, T] (0 where it is -100); errors name `who`.
Tensor logprobs_at_targets(const Tensor& logits, const Tensor& targets, const char* who) {
  // [N, T, V], [N, T] -> [N, T]
  FORGE_CHECK(logits.defined() && logits.dim() == 3, who, ": logits must be [N, T, V], got ",
              logits.defined() ? shape_str(logits.shape()) : "undefined");
  FORGE_CHECK(targets.defined() && targets.dtype() == DType::i64, who, ": targets must be i64");
  const int64_t N = logits.size(0), T = logits.size(1), V = logits.size(2);
  FORGE_CHECK(targets.shape() == (Shape{N, T}), who, ": targets ", shape_str(targets.shape()),
              " must be [N, T] = ", shape_str({N, T}));
  CrossEntropyOptions per_position;
  per_position.reduction = Reduction::none;  // ignored positions give 0
  const Tensor nll =
      cross_entropy(reshape(logits, {N * T, V}), reshape(targets, {N * T}), per_position);
  return neg(reshape(nll, {N, T}));
}

}  // namespace

Tensor token_logprobs(const Tensor& logits, const Tensor& targets) {
  return logprobs_at_targets(logits, targets, "token_logprobs");
}

Tensor sequence_logprobs(const Tensor& logits, const Tensor& targets) {
  return sum(logprobs_at_targets(logits, targets, "sequence_logprobs"), {1});
}

namespace {

void check_pair(const Tensor& x, const Tensor& like, const char* who, const char* name) {
  FORGE_CHECK(x.defined(), who, ": ", name, " is undefined");
  FORGE_CHECK(x.dim() == 1 && x.shape() == like.shape(), who, ": ", name, " must be [B] = ",
              shape_str(like.shape()), ", got ", shape_str(x.shape()));
  FORGE_CHECK(x.dtype() == like.dtype(), who, ": ", name, " is ", dtype_name(x.dtype()),
              " but the first input is ", dtype_name(like.dtype()));
  FORGE_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, who, ": ", name,
              " must be floating point, got ", dtype_name(x.dtype()));
}

void check_option(bool ok, const char* what, double value) {
  if (!ok) throw Error(ExitCode::usage, detail::concat("dpo: ", what, ", got ", value));
}

const char* loss_name(DPOLossType type) {
  switch (type) {
    case DPOLossType::sigmoid: return "sigmoid";
    case DPOLossType::ipo: return "ipo";
    case DPOLossType::hinge: return "hinge";
    case DPOLossType::orpo: return "orpo";
    case DPOLossType::simpo: return "simpo";
  }
  return "?";
}

// x / counts, counts converted to x's dtype; every count must be positive.
Tensor per_token(const Tensor& x, const Tensor& counts, const char* name, DPOLossType type) {
  if (!counts.defined())
    throw Error(ExitCode::usage, detail::concat("dpo: the ", loss_name(type), " loss needs ", name,
                                                " (token counts to average over)"));
  FORGE_CHECK(counts.shape() == x.shape(), "dpo: ", name, " must be ", shape_str(x.shape()),
              ", got ", shape_str(counts.shape()));
  const Tensor c = counts.to(x.dtype());
  const std::vector<double> values = c.to_vector<double>();
  const auto bad = std::find_if(values.begin(), values.end(), [](double v) { return !(v > 0); });
  if (bad != values.end())
    throw Error(ExitCode::usage,
                detail::concat("dpo: ", name, "[", bad - values.begin(), "] is ", *bad,
                               "; a response needs at least one scored token"));
  return x / c;
}

// -(1 - eps) log sigmoid(z) - eps log sigmoid(-z): the sigmoid loss, conservative for eps > 0.
Tensor smoothed_sigmoid_loss(const Tensor& z, double eps) {
  Tensor losses = -(1 - eps) * log_sigmoid(z);
  if (eps > 0) losses = losses - eps * log_sigmoid(-z);
  return losses;
}

// ORPO (TRL's ORPOTrainer.odds_ratio_loss plus its NLL) and SimPO (CPOTrainer.cpo_loss with
// loss_type simpo) on per-token averages ac, ar.
DPOResult reference_free_loss(const Tensor& ac, const Tensor& ar, const Tensor& chosen_nll,
                              const DPOOptions& options) {
  const double beta = options.beta;
  DPOResult r{Tensor(), (beta * ac).detach(), (beta * ar).detach(), Tensor()};
  if (options.loss_type == DPOLossType::simpo) {
    r.losses = smoothed_sigmoid_loss(beta * (ac - ar) - options.simpo_gamma,
                                     options.label_smoothing);
    return r;
  }
  if (!chosen_nll.defined())
    throw Error(ExitCode::usage, "dpo: the orpo loss needs chosen_nll (its NLL term)");
  FORGE_CHECK(chosen_nll.numel() == 1 && chosen_nll.dtype() == ac.dtype(),
              "dpo: chosen_nll must be a scalar of ", dtype_name(ac.dtype()), ", got ",
              shape_str(chosen_nll.shape()), " ", dtype_name(chosen_nll.dtype()));
  // log(1 - exp(a)) as TRL 0.8-0.11 writes it (log1p(-exp(a))): in float32 it keeps about
  // 1e-7 / |a| of relative precision, so an average within 1e-3 of 0 loses digits.
  const Tensor log_odds = (ac - ar) - (log(1 - exp(ac)) - log(1 - exp(ar)));
  r.losses = reshape(chosen_nll, {}) - beta * log_sigmoid(log_odds);
  r.log_odds = log_odds.detach();
  return r;
}

}  // namespace

bool needs_reference(DPOLossType type) {
  return type != DPOLossType::orpo && type != DPOLossType::simpo;
}

DPOResult dpo_loss(const DPOLogProbs& logps, const DPOOptions& options) {
  const double beta = options.beta, eps = options.label_smoothing;
  const DPOLossType type = options.loss_type;
  check_option(std::isfinite(beta) && beta > 0, "beta must be finite and > 0", beta);
  check_option(eps >= 0 && eps < 0.5, "label_smoothing must be in [0, 0.5)", eps);
  check_option(eps == 0 || type == DPOLossType::sigmoid || type == DPOLossType::simpo,
               "label_smoothing applies to the sigmoid and simpo losses only", eps);
  check_option(std::isfinite(options.simpo_gamma), "simpo_gamma must be finite",
               options.simpo_gamma);
  const Tensor& first = logps.policy_chosen;
  FORGE_CHECK(first.defined(), "dpo: policy_chosen is undefined");
  check_pair(first, first, "dpo", "policy_chosen");
  check_pair(logps.policy_rejected, first, "dpo", "policy_rejected");
  Tensor pc = logps.policy_chosen, pr = logps.policy_rejected;
  if (type != DPOLossType::sigmoid && type != DPOLossType::hinge) {
    // TRL averages every log-probability over its response's tokens for these.
    pc = per_token(pc, logps.chosen_tokens, "chosen_tokens", type);
    pr = per_token(pr, logps.rejected_tokens, "rejected_tokens", type);
  }
  if (!needs_reference(type)) return reference_free_loss(pc, pr, logps.chosen_nll, options);
  check_pair(logps.reference_chosen, first, "dpo", "reference_chosen");
  check_pair(logps.reference_rejected, first, "dpo", "reference_rejected");
  Tensor rc = logps.reference_chosen.detach(), rr = logps.reference_rejected.detach();
  if (type == DPOLossType::ipo) {
    rc = per_token(rc, logps.chosen_tokens, "chosen_tokens", type);
    rr = per_token(rr, logps.rejected_tokens, "rejected_tokens", type);
  }
  const Tensor h = (pc - pr) - (rc - rr);
  Tensor losses;
  switch (type) {
    case DPOLossType::sigmoid:
      losses = smoothed_sigmoid_loss(beta * h, eps);
      break;
    case DPOLossType::ipo:
      losses = pow(h - 1 / (2 * beta), 2.0);
      break;
    case DPOLossType::hinge:
      losses = relu(1 - beta * h);
      break;
    case DPOLossType::orpo:
    case DPOLossType::simpo:
      break;
  }
  return {losses, (beta * (pc - rc)).detach(), (beta * (pr - rr)).detach()};
}

Tensor bradley_terry_loss(const Tensor& chosen, const Tensor& rejected, const Tensor& margin,
                          double center_rewards_coefficient) {
  const double c = center_rewards_coefficient;
  if (!(std::isfinite(c) && c >= 0))
    throw Error(ExitCode::usage,
                detail::concat("reward loss: center_rewards_coefficient must be finite and >= 0, ",
                               "got ", c));
  FORGE_CHECK(chosen.defined(), "reward loss: chosen is undefined");
  check_pair(chosen, chosen, "reward loss", "chosen");
  check_pair(rejected, chosen, "reward loss", "rejected");
  Tensor diff = chosen - rejected;
  if (margin.defined()) {
    check_pair(margin, chosen, "reward loss", "margin");
    diff = diff - margin;
  }
  Tensor losses = -log_sigmoid(diff);
  if (c > 0) losses = losses + c * pow(chosen + rejected, 2.0);
  return losses;
}

}  // namespace forge::nn
