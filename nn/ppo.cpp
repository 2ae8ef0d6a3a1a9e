// PPO's pieces. The rollout quantities (rewards, GAE, whitening) are short loops in double over
// host vectors, with no graph: TRL detaches them too. The losses and the entropy are composites of
// existing ops; each first replaces masked positions by 0 with where(), a select, so whatever a
// padded position holds (even inf or nan) reaches neither the loss nor a gradient.
#include "nn/ppo.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {

namespace {

void check_option(bool ok, const char* who, const char* what, double value) {
  if (!ok) throw Error(ExitCode::usage, detail::concat(who, ": ", what, ", got ", value));
}

// x must be a float [B, T] tensor like `like` (same shape and dtype).
void check_like(const Tensor& x, const Tensor& like, const char* who, const char* name) {
  FORGE_CHECK(x.defined(), who, ": ", name, " is undefined");
  FORGE_CHECK(x.dim() == 2 && x.shape() == like.shape(), who, ": ", name, " must be [B, T] = ",
              shape_str(like.shape()), ", got ", shape_str(x.shape()));
  FORGE_CHECK(x.dtype() == like.dtype(), who, ": ", name, " is ", dtype_name(x.dtype()),
              " but the first input is ", dtype_name(like.dtype()));
  FORGE_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, who, ": ", name,
              " must be floating point, got ", dtype_name(x.dtype()));
}

// The mask's values (0 or 1) after checking its shape against `like` ([B, T]).
std::vector<double> mask_values(const Tensor& mask, const Tensor& like, const char* who) {
  FORGE_CHECK(mask.defined(), who, ": mask is undefined");
  FORGE_CHECK(mask.shape() == like.shape(), who, ": mask must be [B, T] = ",
              shape_str(like.shape()), ", got ", shape_str(mask.shape()));
  std::vector<double> m = mask.detach().to_vector<double>();
  const auto bad = std::find_if(m.begin(), m.end(), [](double v) { return v != 0 && v != 1; });
  FORGE_CHECK(bad == m.end(), who, ": mask[", bad - m.begin(), "] is ", *bad,
              "; a mask holds 0 or 1");
  return m;
}

// The number of response tokens, which a masked mean divides by.
double count_tokens(const std::vector<double>& m, const char* who) {
  double n = 0;
  for (double v : m) n += v;
  FORGE_CHECK(n > 0, who, ": the mask selects no token");
  return n;
}

// x where mask is 1, else 0 (a select: no gradient to, and nothing from, masked positions).
Tensor masked(const Tensor& x, const Tensor& mask) {
  return where(mask, x, zeros({}, x.dtype()));
}

std::vector<double> host(const Tensor& x) { return x.detach().to_vector<double>(); }

}  // namespace

PPORewards per_token_rewards(const Tensor& logp, const Tensor& ref_logp, const Tensor& scores,
                             const Tensor& mask, double kl_coef) {
  // [B, T], [B, T], [B], [B, T] -> [B, T], [B, T]
  const char* who = "per_token_rewards";
  check_option(std::isfinite(kl_coef) && kl_coef >= 0, who, "kl_coef must be finite and >= 0",
               kl_coef);
  FORGE_CHECK(logp.defined(), who, ": logp is undefined");
  check_like(logp, logp, who, "logp");
  check_like(ref_logp, logp, who, "ref_logp");
  const int64_t B = logp.size(0), T = logp.size(1);
  FORGE_CHECK(scores.defined() && scores.shape() == (Shape{B}) && scores.dtype() == logp.dtype(),
              who, ": scores must be [B] = [", B, "] of ", dtype_name(logp.dtype()), ", got ",
              scores.defined() ? shape_str(scores.shape()) : "undefined", " of ",
              scores.defined() ? dtype_name(scores.dtype()) : "-");
  const std::vector<double> m = mask_values(mask, logp, who);
  const std::vector<double> lp = host(logp), ref = host(ref_logp), score = host(scores);
  std::vector<double> rewards(m.size(), 0.0), kl(m.size(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t last = -1;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = size_t(b * T + t);
      if (m[i] == 0) continue;
      kl[i] = lp[i] - ref[i];
      rewards[i] = -kl_coef * kl[i];
      last = t;
    }
    FORGE_CHECK(last >= 0, who, ": row ", b, " has no response token to score");
    rewards[size_t(b * T + last)] += score[size_t(b)];
  }
  return {from_vector(rewards, {B, T}, logp.dtype()), from_vector(kl, {B, T}, logp.dtype())};
}

PPOAdvantages gae(const Tensor& rewards, const Tensor& values, const Tensor& mask, double gamma,
                  double lam) {
  // [B, T] x 3 -> [B, T], [B, T]
  const char* who = "gae";
  check_option(gamma >= 0 && gamma <= 1, who, "gamma must be in [0, 1]", gamma);
  check_option(lam >= 0 && lam <= 1, who, "lam must be in [0, 1]", lam);
  FORGE_CHECK(rewards.defined(), who, ": rewards is undefined");
  check_like(rewards, rewards, who, "rewards");
  check_like(values, rewards, who, "values");
  const int64_t B = rewards.size(0), T = rewards.size(1);
  const std::vector<double> m = mask_values(mask, rewards, who);
  const std::vector<double> r = host(rewards), v = host(values);
  std::vector<double> adv(m.size(), 0.0), ret(m.size(), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    double next_value = 0, next_adv = 0;  // after the row's last response token
    for (int64_t t = T - 1; t >= 0; --t) {
      const size_t i = size_t(b * T + t);
      if (m[i] == 0) continue;
      const double delta = r[i] + gamma * next_value - v[i];
      adv[i] = delta + gamma * lam * next_adv;
      ret[i] = adv[i] + v[i];
      next_value = v[i];
      next_adv = adv[i];
    }
  }
  return {from_vector(adv, {B, T}, rewards.dtype()), from_vector(ret, {B, T}, rewards.dtype())};
}

Tensor whiten(const Tensor& x, const Tensor& mask, bool shift_mean) {
  // [B, T], [B, T] -> [B, T]
  const char* who = "whiten";
  FORGE_CHECK(x.defined(), who, ": x is undefined");
  check_like(x, x, who, "x");
  const std::vector<double> m = mask_values(mask, x, who);
  const double n = count_tokens(m, who);
  FORGE_CHECK(n >= 2, who, ": the unbiased variance needs 2 tokens, the mask selects ", n);
  const std::vector<double> v = host(x);
  double mean = 0, var = 0;
  for (size_t i = 0; i < v.size(); ++i) mean += m[i] != 0 ? v[i] : 0.0;
  mean /= n;
  for (size_t i = 0; i < v.size(); ++i) var += m[i] != 0 ? (v[i] - mean) * (v[i] - mean) : 0.0;
  var = var / n * (n / (n - 1));  // TRL: masked mean of squares times the Bessel correction
  const double scale = 1 / std::sqrt(var + 1e-8);
  std::vector<double> out(v.size(), 0.0);
  for (size_t i = 0; i < v.size(); ++i)
    if (m[i] != 0) out[i] = (v[i] - mean) * scale + (shift_mean ? 0.0 : mean);
  return from_vector(out, x.shape(), x.dtype());
}

namespace {

// The clipped surrogate per token and its statistics, for PPO's loss and GRPO's: with
// ratio = exp(logp_new - logp_old), max(-A ratio, -A clip(ratio, 1 - low, 1 + high)), 0 at masked
// positions. Clipped tokens are those where the clipped term is the larger (TRL's clipfrac, and
// GRPO's is_low_clipped | is_high_clipped).
struct Surrogate {
  Tensor per_token;
  double tokens = 0, clip_frac = 0, approx_kl = 0, ratio_mean = 0;
};

Surrogate surrogate(const Tensor& logp_new, const Tensor& logp_old, const Tensor& advantages,
                    const Tensor& mask, double low, double high, const char* who) {
  FORGE_CHECK(logp_new.defined(), who, ": logp_new is undefined");
  check_like(logp_new, logp_new, who, "logp_new");
  check_like(logp_old, logp_new, who, "logp_old");
  check_like(advantages, logp_new, who, "advantages");
  const std::vector<double> m = mask_values(mask, logp_new, who);
  const double n = count_tokens(m, who);
  const Tensor log_ratio = masked(logp_new, mask) - masked(logp_old.detach(), mask);
  const Tensor ratio = exp(log_ratio);  // 1 at masked positions
  const Tensor a = masked(advantages.detach(), mask);
  const Tensor unclipped = -a * ratio;
  const Tensor clipped = -a * clamp(ratio, 1 - low, 1 + high);
  Surrogate out;
  out.per_token = maximum(unclipped, clipped);
  out.tokens = n;
  const std::vector<double> u = host(unclipped), c = host(clipped), lr = host(log_ratio),
                            r = host(ratio);
  double clipped_tokens = 0, squares = 0, ratios = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i] == 0) continue;
    clipped_tokens += c[i] > u[i];
    squares += lr[i] * lr[i];
    ratios += r[i];
  }
  out.clip_frac = clipped_tokens / n;
  out.approx_kl = 0.5 * squares / n;
  out.ratio_mean = ratios / n;
  return out;
}

}  // namespace

PPOPolicyLoss ppo_policy_loss(const Tensor& logp_new, const Tensor& logp_old,
                              const Tensor& advantages, const Tensor& mask, double clip_range) {
  // [B, T] x 4 -> 0-d
  const char* who = "ppo_policy_loss";
  check_option(std::isfinite(clip_range) && clip_range >= 0, who,
               "clip_range must be finite and >= 0", clip_range);
  const Surrogate s =
      surrogate(logp_new, logp_old, advantages, mask, clip_range, clip_range, who);
  return {sum(s.per_token) / s.tokens, s.clip_frac, s.approx_kl, s.ratio_mean};
}

PPOValueLoss ppo_value_loss(const Tensor& values_new, const Tensor& values_old,
                            const Tensor& returns, const Tensor& mask, double clip_range_value) {
  // [B, T] x 4 -> 0-d
  const char* who = "ppo_value_loss";
  const double c = clip_range_value;
  check_option(std::isfinite(c) && c >= 0, who, "clip_range_value must be finite and >= 0", c);
  FORGE_CHECK(values_new.defined(), who, ": values_new is undefined");
  check_like(values_new, values_new, who, "values_new");
  check_like(values_old, values_new, who, "values_old");
  check_like(returns, values_new, who, "returns");
  const std::vector<double> m = mask_values(mask, values_new, who);
  const double n = count_tokens(m, who);
  const Tensor v = masked(values_new, mask);
  const Tensor old = masked(values_old.detach(), mask);
  const Tensor ret = masked(returns.detach(), mask);
  // TRL's clip_by_value: max(min(v, old + c), old - c).
  const Tensor v_clipped = maximum(minimum(v, old + c), old - c);
  const Tensor unclipped = pow(v - ret, 2.0);
  const Tensor clipped = pow(v_clipped - ret, 2.0);
  PPOValueLoss out;
  out.loss = 0.5 * sum(maximum(unclipped, clipped)) / n;
  const std::vector<double> u = host(unclipped), cl = host(clipped);
  double clipped_tokens = 0;
  for (size_t i = 0; i < m.size(); ++i) clipped_tokens += m[i] != 0 && cl[i] > u[i];
  out.clip_frac = clipped_tokens / n;
  return out;
}

Tensor entropy_from_logits(const Tensor& logits, const Tensor& mask) {
  // [B, T, V], [B, T] -> 0-d
  const char* who = "entropy_from_logits";
  FORGE_CHECK(logits.defined() && logits.dim() == 3, who, ": logits must be [B, T, V], got ",
              logits.defined() ? shape_str(logits.shape()) : "undefined");
  FORGE_CHECK(logits.dtype() == DType::f32 || logits.dtype() == DType::f64, who,
              ": logits must be floating point, got ", dtype_name(logits.dtype()));
  const Tensor per_token = zeros({logits.size(0), logits.size(1)}, logits.dtype());
  const std::vector<double> m = mask_values(mask, per_token, who);
  const double n = count_tokens(m, who);
  // H = -sum_v p_v log p_v, with p = exp(log_softmax): one normalisation, output-based backwards.
  const Tensor logp = log_softmax(logits, -1);
  const Tensor entropy = -sum(exp(logp) * logp, {2});
  return sum(masked(entropy, mask)) / n;
}

KLController::KLController(const KLControllerOptions& options) : options_(options) {
  const char* who = "kl controller";
  check_option(std::isfinite(options.init_kl_coef) && options.init_kl_coef >= 0, who,
               "init_kl_coef must be finite and >= 0", options.init_kl_coef);
  if (options.adaptive) {
    check_option(std::isfinite(options.target) && options.target > 0, who,
                 "target must be finite and > 0", options.target);
    check_option(std::isfinite(options.horizon) && options.horizon > 0, who,
                 "horizon must be finite and > 0", options.horizon);
  }
  value_ = options.init_kl_coef;
}

void KLController::update(double current_kl, int64_t n_steps) {
  if (!std::isfinite(current_kl))
    throw Error(ExitCode::numerical,
                detail::concat("kl controller: the current KL is ", current_kl));
  FORGE_CHECK(n_steps >= 0, "kl controller: n_steps must be >= 0, got ", n_steps);
  if (!options_.adaptive) return;
  // TRL's AdaptiveKLController.update, operation for operation.
  const double proportional_error = std::clamp(current_kl / options_.target - 1, -0.2, 0.2);
  const double mult = 1 + proportional_error * double(n_steps) / options_.horizon;
  value_ *= mult;
}

void KLController::restore(double value) {
  if (!(std::isfinite(value) && value >= 0))
    throw Error(ExitCode::checkpoint,
                detail::concat("kl controller: a saved kl_coef must be finite and >= 0, got ",
                               value));
  value_ = value;
}

// ---- GRPO ----------------------------------------------------------------------------------------

std::vector<double> group_advantages(const std::vector<double>& rewards, int64_t group_size,
                                     bool scale) {
  // [N] -> [N], N = groups x group_size
  FORGE_CHECK(group_size >= 1 && rewards.size() % size_t(group_size) == 0,
              "group_advantages: ", rewards.size(), " rewards do not form groups of ", group_size);
  const size_t G = size_t(group_size);
  std::vector<double> out(rewards.size());
  for (size_t first = 0; first < rewards.size(); first += G) {
    double mean = 0, var = 0;
    for (size_t i = first; i < first + G; ++i) mean += rewards[i];
    mean /= double(G);
    for (size_t i = first; i < first + G; ++i) var += (rewards[i] - mean) * (rewards[i] - mean);
    // torch.std: unbiased, and nan for a group of one, as TRL would divide by.
    const double std = G > 1 ? std::sqrt(var / double(G - 1)) : std::nan("");
    for (size_t i = first; i < first + G; ++i)
      out[i] = scale ? (rewards[i] - mean) / (std + 1e-4) : rewards[i] - mean;
  }
  return out;
}

std::vector<double> rejection_advantages(const std::vector<double>& rewards, double threshold) {
  std::vector<double> out;
  for (double r : rewards) out.push_back(r >= threshold ? 1.0 : 0.0);
  return out;
}

int64_t zero_variance_groups(const std::vector<double>& rewards, int64_t group_size) {
  FORGE_CHECK(group_size >= 1 && rewards.size() % size_t(group_size) == 0,
              "zero_variance_groups: ", rewards.size(), " rewards do not form groups of ",
              group_size);
  int64_t n = 0;
  for (size_t first = 0; first < rewards.size(); first += size_t(group_size))
    n += std::all_of(rewards.begin() + long(first), rewards.begin() + long(first) + group_size,
                     [&](double r) { return r == rewards[first]; });
  return n;
}

Tensor k3_kl(const Tensor& logp, const Tensor& ref_logp, const Tensor& mask) {
  // [B, T] x 3 -> [B, T]
  const char* who = "k3_kl";
  FORGE_CHECK(logp.defined(), who, ": logp is undefined");
  check_like(logp, logp, who, "logp");
  check_like(ref_logp, logp, who, "ref_logp");
  mask_values(mask, logp, who);
  const Tensor d = masked(ref_logp.detach(), mask) - masked(logp, mask);  // 0 at masked positions
  return exp(d) - d - 1.0;
}

GRPOLoss grpo_loss(const Tensor& logp_new, const Tensor& logp_old, const Tensor& ref_logp,
                   const Tensor& advantages, const Tensor& mask, const GRPOLossOptions& o) {
  // [B, T], [B, T], [B, T], [B], [B, T] -> 0-d
  const char* who = "grpo_loss";
  check_option(std::isfinite(o.epsilon) && o.epsilon >= 0, who,
               "epsilon must be finite and >= 0", o.epsilon);
  check_option(std::isfinite(o.epsilon_high) && o.epsilon_high >= 0, who,
               "epsilon_high must be finite and >= 0", o.epsilon_high);
  check_option(std::isfinite(o.beta) && o.beta >= 0, who, "beta must be finite and >= 0", o.beta);
  check_option(o.type != GRPOLossType::dr_grpo || o.max_completion_length >= 1, who,
               "dr_grpo needs max_completion_length >= 1", double(o.max_completion_length));
  FORGE_CHECK(logp_new.defined() && logp_new.dim() == 2, who, ": logp_new must be [B, T]");
  const int64_t B = logp_new.size(0), T = logp_new.size(1);
  FORGE_CHECK(advantages.defined() && advantages.shape() == (Shape{B}), who,
              ": advantages must be [B] = [", B, "], got ",
              advantages.defined() ? shape_str(advantages.shape()) : "undefined");
  // Each row's advantage at each of its positions, as TRL's advantages.unsqueeze(1) broadcasts.
  std::vector<double> per_token;
  for (double a : host(advantages)) per_token.insert(per_token.end(), size_t(T), a);
  const Surrogate s = surrogate(logp_new, logp_old, from_vector(per_token, {B, T}, logp_new.dtype()),
                                mask, o.epsilon, o.epsilon_high, who);
  Tensor loss = s.per_token;
  GRPOLoss out;
  if (o.beta > 0) {
    const Tensor kl = k3_kl(logp_new, ref_logp, mask);
    loss = loss + o.beta * kl;
    out.kl = sum(kl).item() / s.tokens;
  }
  const std::vector<double> m = host(mask);
  switch (o.type) {
    case GRPOLossType::grpo: {
      std::vector<double> lengths(size_t(B), 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) lengths[size_t(b)] += m[size_t(b * T + t)];
      for (double& n : lengths) n = 1 / std::max(1.0, n);
      out.loss_sum = sum(sum(loss, {1}) * from_vector(lengths, {B}, loss.dtype()));
      out.units = B;
      break;
    }
    case GRPOLossType::dapo:
      out.loss_sum = sum(loss);
      out.units = int64_t(s.tokens);
      break;
    case GRPOLossType::dr_grpo:
      out.loss_sum = sum(loss) / double(o.max_completion_length);
      out.units = B;
      break;
  }
  out.clip_frac = s.clip_frac;
  out.ratio_mean = s.ratio_mean;
  return out;
}

}  // namespace forge::nn
