// The MoE layer in three parts: the router (noisy logits, top-k, softmax over the kept ones), the
// dispatch (assignments checked against capacity on the host and grouped by expert, so that each
// expert is one GEMM over its rows), and the balancing losses and statistics reported to the step;
// also the config's rules and the guard that makes training route as evaluation does.
#include "nn/moe.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "nn/aux_loss.h"

namespace forge::nn {
namespace {

Tensor index_tensor(const std::vector<int64_t>& values) {
  Tensor t = empty({int64_t(values.size())}, DType::i64);
  if (!values.empty())
    std::memcpy(t.data<int64_t>(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

double coefficient_of_variation(const std::vector<double>& v) {
  double mean = 0, sq = 0;
  for (double x : v) mean += x / double(v.size());
  for (double x : v) sq += (x - mean) * (x - mean) / double(v.size());
  return mean > 0 ? std::sqrt(sq) / mean : 0.0;
}

// The assignments of one forward after the capacity check, grouped by expert.
struct Routing {
  std::vector<int64_t> tokens;   // [M] the token of each kept assignment
  std::vector<int64_t> slots;    // [M] n * k + j: its gate in the flattened [N, k] gates
  std::vector<int64_t> offsets;  // [E + 1] expert e holds rows offsets[e] .. offsets[e+1] - 1
  std::vector<int64_t> routed;   // [E] assignments per expert before the capacity check
  int64_t dropped = 0;
};

// top [N, k] expert ids, row-major; capacity 0 = unlimited.
Routing route(const std::vector<int64_t>& top, int64_t N, int64_t k, int64_t E,
              int64_t capacity) {
  Routing r;
  r.routed.assign(size_t(E), 0);
  std::vector<int64_t> kept_per_expert(size_t(E), 0);
  std::vector<uint8_t> kept(size_t(N * k), 0);
  // First choices claim capacity before second choices (GShard's priority), each in token order,
  // so a token loses its less important expert first.
  for (int64_t j = 0; j < k; ++j)
    for (int64_t n = 0; n < N; ++n) {
      const size_t e = size_t(top[size_t(n * k + j)]);
      ++r.routed[e];
      if (capacity == 0 || kept_per_expert[e] < capacity) {
        kept[size_t(n * k + j)] = 1;
        ++kept_per_expert[e];
      } else {
        ++r.dropped;
      }
    }
  r.offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    r.offsets[size_t(e + 1)] = r.offsets[size_t(e)] + kept_per_expert[size_t(e)];
  const int64_t M = r.offsets.back();
  r.tokens.resize(size_t(M));
  r.slots.resize(size_t(M));
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (int64_t slot = 0; slot < N * k; ++slot) {
    if (!kept[size_t(slot)]) continue;
    const int64_t row = next[size_t(top[size_t(slot)])]++;
    r.tokens[size_t(row)] = slot / k;
    r.slots[size_t(row)] = slot;
  }
  return r;
}

}  // namespace

std::vector<MoEConfigProblem> moe_config_problems(const MoEConfig& c) {
  std::vector<MoEConfigProblem> out;
  auto rule = [&](bool ok, std::vector<std::string> fields, std::string message) {
    if (!ok) out.push_back({std::move(fields), std::move(message)});
  };
  auto at_least = [&](const char* field, double value, double bound) {
    rule(value >= bound, {field},
         detail::concat("model.moe.", field, " must be >= ", bound, ", got ", value));
  };
  at_least("every", double(c.every), 0);
  at_least("n_experts", double(c.n_experts), 1);
  at_least("top_k", double(c.top_k), 1);
  rule(c.top_k <= c.n_experts, {"top_k", "n_experts"},
       detail::concat("model.moe.top_k (", c.top_k, ") must be <= model.moe.n_experts (",
                      c.n_experts, ")"));
  rule(c.ffn_mult > 0, {"ffn_mult"},
       detail::concat("model.moe.ffn_mult must be positive, got ", c.ffn_mult));
  at_least("noise_eps", c.noise_eps, 0);
  at_least("capacity_factor", c.capacity_factor, 0);
  at_least("w_importance", c.w_importance, 0);
  at_least("w_load", c.w_load, 0);
  at_least("w_switch", c.w_switch, 0);
  at_least("w_z", c.w_z, 0);
  if (c.balance == MoEBalance::cv2 && c.w_load > 0) {
    rule(c.noisy, {"noisy", "balance", "w_load"},
         "model.moe.balance 'cv2' with w_load > 0 needs model.moe.noisy: true (the smooth load "
         "estimator is the probability that the gating noise keeps an expert in the top k); set "
         "w_load: 0 or noisy: true");
    rule(c.top_k < c.n_experts, {"top_k", "balance", "w_load"},
         detail::concat("model.moe.balance 'cv2' with w_load > 0 needs top_k < n_experts (every "
                        "expert is always chosen otherwise), got top_k ",
                        c.top_k, " of ", c.n_experts));
  }
  return out;
}

void check_moe_config(const MoEConfig& c) {
  const std::vector<MoEConfigProblem> problems = moe_config_problems(c);
  if (!problems.empty()) throw Error(ExitCode::usage, problems.front().message);
}

bool is_moe_layer(const MoEConfig& c, int64_t layer) {
  return c.every > 0 && (layer + 1) % c.every == 0;
}

int64_t expert_capacity(const MoEConfig& c, double factor, int64_t tokens) {
  if (factor <= 0) return tokens * c.top_k;
  const double share = factor * double(tokens * c.top_k) / double(c.n_experts);
  return std::max<int64_t>(1, int64_t(std::ceil(share)));
}

// CV^2 as the paper's code (tensor2tensor's cv_squared) computes it: the population variance over
// the experts divided by the squared mean, with an epsilon for an all-zero vector.
Tensor cv_squared(const Tensor& v) {
  Tensor m = mean(v);
  return var(v, {0}, /*unbiased=*/false) / (m * m + 1e-10);
}

TopKGates top_k_gating(const Tensor& logits, int64_t k, bool with_next) {
  const Tensor ranked = topk(logits.detach(), with_next ? k + 1 : k, 1).indices;
  const Tensor experts = with_next ? slice(ranked, 1, 0, k).contiguous() : ranked;  // [N, k]
  return {softmax(gather(logits, 1, experts), -1), experts, with_next ? ranked : Tensor()};
}

Tensor expert_importance(const Tensor& gates, const Tensor& experts, int64_t n_experts) {
  const int64_t Nk = gates.numel();
  return index_add(zeros({n_experts}, gates.dtype()), 0, reshape(experts, {Nk}),
                   reshape(gates, {Nk}));
}

Tensor switch_balance_loss(const Tensor& logits, const Tensor& routed_share) {
  const Tensor p = mean(softmax(logits, -1), {0});  // [E]
  return sum(routed_share.detach() * p) * double(logits.size(1));
}

Tensor router_z_loss(const Tensor& logits) {
  const Tensor m = max(logits.detach(), 1, /*keepdim=*/true);             // [N, 1]
  const Tensor lse = log(sum(exp(logits - m), {1}, /*keepdim=*/true)) + m;  // [N, 1]
  return mean(lse * lse);
}

GroupedLinear::GroupedLinear(int64_t groups, int64_t in_features, int64_t out_features,
                             bool with_bias, Generator& gen, double init_std) {
  FORGE_CHECK(groups > 0 && in_features > 0 && out_features > 0,
              "GroupedLinear: sizes must be positive, got ", groups, " x ", out_features, " x ",
              in_features);
  weight = register_parameter(
      "weight", normal({groups, out_features, in_features}, 0.0, init_std, gen));
  if (with_bias) bias = register_parameter("bias", zeros({groups, out_features}));
}

Tensor GroupedLinear::forward(const Tensor& x, const std::vector<int64_t>& offsets) const {
  return grouped_linear(x, weight, bias, offsets);
}

Router::Router(int64_t n_experts, int64_t d_model, bool noisy) {
  weight = register_parameter("weight", zeros({n_experts, d_model}));
  if (noisy) noise = register_parameter("noise", zeros({n_experts, d_model}));
}

MoE::MoE(const MoEConfig& c, const MoELayerShape& s, int64_t layer, Generator& gen)
    : config_(c), layer_(layer) {
  check_moe_config(c);
  FORGE_CHECK(s.d_model > 0 && s.hidden > 0, "MoE: sizes must be positive, got d_model ",
              s.d_model, ", hidden ", s.hidden);
  const int64_t E = c.n_experts, C = s.d_model, H = s.hidden;
  router = register_module("router", std::make_shared<Router>(E, C, c.noisy));
  auto experts = [&](int64_t in, int64_t out, double init_std) {
    return std::make_shared<GroupedLinear>(E, in, out, s.bias, gen, init_std);
  };
  if (s.swiglu) {
    gate = register_module("gate", experts(C, H, s.init_std));
    up = register_module("up", experts(C, H, s.init_std));
  } else {
    fc = register_module("fc", experts(C, H, s.init_std));
  }
  proj = register_module("proj", experts(H, C, s.proj_init_std));
  drop = register_module("drop", std::make_shared<Dropout>(s.dropout));
}

// x [B, T, C] -> [B, T, C]
Tensor MoE::forward(const Tensor& x) const {
  const int64_t C = x.size(-1), E = config_.n_experts, k = config_.top_k;
  const Tensor xf = reshape(x, {-1, C});  // [N, C]
  const int64_t N = xf.size(0);
  const bool training = is_training();
  // Noise and capacity make a token's route depend on a draw and on the tokens before it in the
  // batch: wanted in training, never in evaluation or generation (nor when asked not to).
  const bool stochastic = training && !deterministic_;

  // Gating: H(x) = x W_g + eps * (softplus(x W_noise) + noise_eps), eps ~ N(0, 1) in training,
  // drawn from the generator the trainer seeds per forward (so a resumed run draws the same).
  const Tensor clean = linear(xf, router->weight);  // [N, E]
  Tensor logits = clean, noise_std;
  if (router->noise.defined() && stochastic) {
    noise_std = softplus(linear(xf, router->noise)) + config_.noise_eps;
    logits = clean + normal({N, E}, 0.0, 1.0, default_generator(), x.dtype()) * noise_std;
  }
  const bool smooth_load = training && aux_collecting() && config_.balance == MoEBalance::cv2 &&
                           config_.w_load > 0 && noise_std.defined();
  const TopKGates top = top_k_gating(logits, k, smooth_load);  // [N, k] each

  const std::vector<int64_t> ids = top.experts.to_vector<int64_t>();
  const double factor = stochastic ? config_.capacity_factor : 0.0;
  const Routing r = route(ids, N, k, E, factor > 0 ? expert_capacity(config_, factor, N) : 0);
  const Tensor tokens = index_tensor(r.tokens), slots = index_tensor(r.slots);

  // Dispatch: each expert's rows as one GEMM, outputs weighted by their gates and added back.
  const Tensor xs = index_select(xf, 0, tokens);  // [M, C]
  const Tensor h = fc ? gelu(fc->forward(xs, r.offsets), GeluApprox::tanh)
                      : silu(gate->forward(xs, r.offsets)) * up->forward(xs, r.offsets);
  const Tensor g = index_select(reshape(top.gates, {N * k}), 0, slots);  // [M]
  const Tensor ys = proj->forward(h, r.offsets) * unsqueeze(g, 1);       // [M, C]
  const Tensor out = index_add(zeros({N, C}, x.dtype()), 0, tokens, ys);  // [N, C]

  if (training && aux_collecting()) {
    std::vector<double> routed_share(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      routed_share[size_t(e)] = double(r.routed[size_t(e)]) / double(N * k);
    const Tensor importance = expert_importance(top.gates, top.experts, E);  // [E]
    Tensor loss;
    auto add = [&](const Tensor& term) { loss = loss.defined() ? loss + term : term; };
    if (config_.balance == MoEBalance::cv2) {
      if (config_.w_importance > 0) add(cv_squared(importance) * config_.w_importance);
      if (smooth_load)
        add(cv_squared(topk_load(clean, logits, noise_std, k, top.ranked)) * config_.w_load);
    } else if (config_.balance == MoEBalance::switch_loss) {
      add(switch_balance_loss(logits, from_vector(routed_share, {E}, x.dtype())) *
          config_.w_switch);
    }
    if (config_.w_z > 0) add(router_z_loss(clean) * config_.w_z);
    if (loss.defined() && grad_enabled()) report_aux_loss(loss);

    const std::string layer = "_l" + std::to_string(layer_);
    const std::vector<double> imp = importance.detach().to(DType::f64).to_vector<double>();
    report_aux_stat("cv_importance" + layer, coefficient_of_variation(imp));
    report_aux_stat("cv_load" + layer, coefficient_of_variation(routed_share));
    report_aux_stat("dropped_frac" + layer, double(r.dropped) / double(N * k));
    for (int64_t e = 0; e < E; ++e)
      report_aux_stat("expert_load" + layer + "_e" + std::to_string(e), routed_share[size_t(e)]);
  }
  return drop->forward(reshape(out, x.shape()));
}

DeterministicRouting::DeterministicRouting(Module& model) {
  for (auto& [path, m] : model.named_modules())
    if (auto* moe = dynamic_cast<MoE*>(m)) {
      layers_.emplace_back(moe, moe->deterministic_routing());
      moe->set_deterministic_routing(true);
    }
}

DeterministicRouting::~DeterministicRouting() {
  for (auto& [moe, before] : layers_) moe->set_deterministic_routing(before);
}

}  // namespace forge::nn
