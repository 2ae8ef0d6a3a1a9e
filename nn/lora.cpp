// LoRALinear's forward (base linear plus two thin matmuls, never an [out, in] temporary), merging,
// and the name-driven parts: resolving target globs against module paths (shared by inject_lora
// and the allocation-free count), and selecting trainable parameters.
#include "nn/lora.h"

#include <cmath>
#include <set>
#include <utility>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/glob.h"
#include "core/ops.h"

namespace forge::nn {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ExitCode::usage, "lora: " + message);
}

void check_values(const LoRAConfig& c) {
  require(c.rank > 0, "rank must be positive, got " + std::to_string(c.rank));
  require(std::isfinite(c.alpha) && c.alpha > 0, "alpha must be positive, got " +
                                                     std::to_string(c.alpha));
  require(c.dropout >= 0 && c.dropout < 1, "dropout must be in [0, 1), got " +
                                               std::to_string(c.dropout));
}

void check_config(const LoRAConfig& c) {
  check_values(c);
  require(!c.targets.empty(), "targets is empty: name the Linear layers to adapt");
}

// A module as target resolution sees it: its path, and its shape when it is a Linear.
struct ModuleInfo {
  std::string path;
  std::string type;  // type_name(); "Linear" for Linear layers
  bool linear = false;
  int64_t in = 0, out = 0;
};

// Hugging Face's names of the Llama family's projections, as PEFT's target_modules give them, and
// the module of a Forge block each one is. A bare name means that module in every block, as PEFT
// matches a name against the end of each module path.
constexpr std::pair<const char*, const char*> kHubNames[] = {
    {"q_proj", "attn.q"},    {"k_proj", "attn.k"},      {"v_proj", "attn.v"},
    {"o_proj", "attn.proj"}, {"gate_proj", "mlp.gate"}, {"up_proj", "mlp.up"},
    {"down_proj", "mlp.proj"}};

// The glob a target stands for: a hub name's module in every block; PEFT's "all-linear" (every
// Linear but the output layer), which are the blocks' Linears; any other pattern as written.
std::string target_glob(const std::string& pattern) {
  if (pattern == "all-linear") return "blocks.*";
  for (const auto& [hub, module] : kHubNames)
    if (pattern == hub) return std::string("*.") + module;
  return pattern;
}

// A hub name of q, k or v on a model that projects them with one matrix cannot be honoured: the
// adapter of attn.qkv would adapt all three.
void refuse_split_names_on_fused_qkv(const std::vector<ModuleInfo>& modules,
                                     const std::string& pattern) {
  if (pattern != "q_proj" && pattern != "k_proj" && pattern != "v_proj") return;
  for (const ModuleInfo& m : modules)
    if (m.linear && m.path.ends_with(".attn.qkv"))
      throw Error(ExitCode::usage,
                  "lora.targets: '" + pattern + "' is Hugging Face's name for " +
                      target_glob(pattern).substr(2) +
                      ", but this model projects q, k and v with one matrix ('" + m.path +
                      "'); set model.fused_qkv: false to adapt them apart, or target attn.qkv");
}

// The Linear modules (indices into `modules`, in model order) that some pattern matches. Every
// pattern must match at least one Linear; one that does not is an error naming what it matched.
std::vector<size_t> resolve_targets(const std::vector<ModuleInfo>& modules,
                                    const std::vector<std::string>& patterns) {
  std::vector<std::string> globs;
  for (const std::string& pattern : patterns) {
    const std::string glob = target_glob(pattern);
    globs.push_back(glob);
    const ModuleInfo* other = nullptr;
    bool any = false;
    for (const ModuleInfo& m : modules) {
      if (!glob_match(glob, m.path)) continue;
      any = any || m.linear;
      if (!m.linear && !other) other = &m;
    }
    if (any) continue;
    refuse_split_names_on_fused_qkv(modules, pattern);
    std::string message = "target '" + pattern + "'";
    if (glob != pattern) message += " ('" + glob + "')";
    message += " matches no Linear layer";
    if (other) message += " (it matches '" + other->path + "', a " + other->type + ")";
    require(false, message);
  }
  std::vector<size_t> chosen;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!modules[i].linear) continue;
    for (const std::string& glob : globs)
      if (glob_match(glob, modules[i].path)) {
        chosen.push_back(i);
        break;
      }
  }
  return chosen;
}

}  // namespace

double lora_scale(const LoRAConfig& c) {
  return c.rslora ? c.alpha / std::sqrt(double(c.rank)) : c.alpha / double(c.rank);
}

LoRALinear::LoRALinear(const Linear& base, const LoRAConfig& c, Generator& gen)
    : scale_(lora_scale(c)), dropout_(c.dropout) {
  check_values(c);
  const int64_t in = base.in_features(), out = base.out_features();
  const double bound = 1.0 / std::sqrt(double(in));
  adopt(base.weight, base.bias, uniform({c.rank, in}, -bound, bound, gen, base.weight.dtype()),
        zeros({out, c.rank}, base.weight.dtype()));
}

LoRALinear::LoRALinear(Tensor w, Tensor b, Tensor a, Tensor bb, double scale, double dropout)
    : scale_(scale), dropout_(dropout) {
  adopt(std::move(w), std::move(b), std::move(a), std::move(bb));
}

void LoRALinear::adopt(Tensor w, Tensor b, Tensor a, Tensor bb) {
  FORGE_CHECK(w.defined() && w.dim() == 2, "LoRALinear: weight must be [out, in]");
  const int64_t out = w.size(0), in = w.size(1);
  FORGE_CHECK(a.defined() && a.dim() == 2 && a.size(1) == in && a.size(0) > 0,
              "LoRALinear: lora_A must be [r, ", in, "], got ",
              a.defined() ? shape_str(a.shape()) : "undefined");
  FORGE_CHECK(bb.defined() && bb.shape() == Shape({out, a.size(0)}), "LoRALinear: lora_B must be [",
              out, ", ", a.size(0), "], got ", bb.defined() ? shape_str(bb.shape()) : "undefined");
  FORGE_CHECK(!b.defined() || b.shape() == Shape({out}), "LoRALinear: bias must be [", out,
              "], got ", b.defined() ? shape_str(b.shape()) : "");
  FORGE_CHECK(std::isfinite(scale_), "LoRALinear: scale must be finite, got ", scale_);
  FORGE_CHECK(dropout_ >= 0 && dropout_ < 1, "LoRALinear: dropout must be in [0, 1), got ",
              dropout_);
  weight = register_parameter("weight", w, /*requires_grad=*/false);
  if (b.defined()) bias = register_parameter("bias", b, /*requires_grad=*/false);
  lora_A = register_parameter("lora_A", a);
  lora_B = register_parameter("lora_B", bb);
}

// x [..., in] -> [..., out]: base, plus the branch through [..., r] (scaled there, where it is
// smallest).
Tensor LoRALinear::forward(const Tensor& x) const {
  Tensor y = linear(x, weight, bias);
  if (merged_ || !enabled_) return y;
  Tensor h = dropout_ > 0 ? dropout(x, dropout_, is_training()) : x;
  return y + linear(linear(h, lora_A) * scale_, lora_B);
}

void LoRALinear::merge() {
  if (merged_) throw Error(ExitCode::usage, "LoRALinear: merge() on a layer already merged");
  if (weight.dtype() == DType::bf16)
    throw Error(ExitCode::usage, "LoRALinear: merge() into a base weight kept in bf16 "
                                 "(model.frozen_dtype: bf16); merge into an fp32 copy of the base");
  NoGradGuard no_grad;
  weight.copy_(weight + matmul(lora_B, lora_A) * scale_);
  merged_ = true;
}

void LoRALinear::unmerge() {
  if (!merged_) throw Error(ExitCode::usage, "LoRALinear: unmerge() on a layer not merged");
  NoGradGuard no_grad;
  weight.copy_(weight - matmul(lora_B, lora_A) * scale_);
  merged_ = false;
}

void LoRALinear::set_adapters_enabled(bool on) {
  if (!on && merged_)
    throw Error(ExitCode::usage, "LoRALinear: cannot turn off adapters merged into the weight");
  enabled_ = on;
}

std::vector<std::string> inject_lora(Module& model, const LoRAConfig& config, Generator& gen) {
  check_config(config);
  std::vector<std::pair<std::string, Module*>> modules = model.named_modules();
  std::vector<ModuleInfo> infos;
  for (const auto& [path, m] : modules) {
    ModuleInfo info{path, type_name(*m)};
    info.linear = dynamic_cast<const Linear*>(m) != nullptr;
    infos.push_back(info);
  }
  std::vector<std::string> replaced;
  for (size_t i : resolve_targets(infos, config.targets)) {
    const Linear& base = dynamic_cast<const Linear&>(*modules[i].second);
    auto adapted = std::make_shared<LoRALinear>(base, config, gen);
    model.replace(infos[i].path, std::move(adapted));  // may free `base`
    replaced.push_back(infos[i].path);
  }
  return replaced;
}

namespace {

template <class F>
void for_each_lora(Module& model, const char* what, F f) {
  bool any = false;
  for (auto& [path, m] : model.named_modules())
    if (auto* lora = dynamic_cast<LoRALinear*>(m)) {
      f(*lora);
      any = true;
    }
  if (!any) throw Error(ExitCode::usage, std::string(what) + ": the model has no LoRA layers");
}

}  // namespace

int64_t keep_frozen_in_bf16(Module& model, FrozenValues values) {
  int64_t converted = 0;
  auto narrow = [&](Tensor& weight) {
    if (weight.requires_grad() || weight.dtype() != DType::f32) return;
    if (values == FrozenValues::convert)
      weight.retype_(DType::bf16);
    else
      weight.reset_storage_(DType::bf16);
    converted += weight.numel();
  };
  for (auto& [path, m] : model.named_modules()) {
    if (auto* l = dynamic_cast<Linear*>(m)) narrow(l->weight);
    else if (auto* l = dynamic_cast<LoRALinear*>(m)) narrow(l->weight);
    else if (auto* e = dynamic_cast<Embedding*>(m)) narrow(e->weight);
  }
  // The f32 blocks would otherwise wait in the allocator's cache for sizes a LoRA step never asks
  // for, and the run would hold both copies.
  allocator::empty_cache();
  return converted;
}

void merge_lora(Module& model) {
  for_each_lora(model, "merge_lora", [](LoRALinear& l) { l.merge(); });
}

void unmerge_lora(Module& model) {
  for_each_lora(model, "unmerge_lora", [](LoRALinear& l) { l.unmerge(); });
}

AdaptersDisabled::AdaptersDisabled(Module& model) {
  for_each_lora(model, "AdaptersDisabled", [&](LoRALinear& l) {
    if (l.merged())
      throw Error(ExitCode::usage, "AdaptersDisabled: a LoRA layer is merged into its weight");
    layers_.push_back(&l);
  });
  for (LoRALinear* l : layers_) l->set_adapters_enabled(false);
}

AdaptersDisabled::~AdaptersDisabled() {
  for (LoRALinear* l : layers_) l->set_adapters_enabled(true);
}

NamedTensors select_trainable(const NamedTensors& params, const std::vector<std::string>& include) {
  for (const std::string& pattern : include) {
    bool any = false;
    for (const NamedTensor& p : params) any = any || glob_match(pattern, p.name);
    if (!any)
      throw Error(ExitCode::usage,
                  "select_trainable: pattern '" + pattern + "' matches no parameter");
  }
  NamedTensors selected;
  for (const NamedTensor& p : params) {
    bool on = false;
    for (const std::string& pattern : include) on = on || glob_match(pattern, p.name);
    Tensor t = p.tensor;
    t.set_requires_grad(on);
    if (on) {
      selected.push_back(p);
    } else {
      t.set_grad(Tensor());
    }
  }
  return selected;
}

int64_t lora_parameter_count(const GPTConfig& c, const LoRAConfig& config) {
  check_config(config);
  // The modules GPT(c) registers, from its parameter list: each parameter's module and the ones
  // above it, in model order (modules without parameters, the Dropouts, are never targets).
  std::vector<ModuleInfo> m;
  std::set<std::string> seen;
  for (const ParameterShape& p : gpt_parameter_shapes(c)) {
    std::string path;
    for (size_t depth = 0, at = 0; depth < p.modules.size(); ++depth) {
      if (depth > 0) {
        const size_t dot = p.name.find('.', at);
        path = p.name.substr(0, dot);
        at = dot + 1;
      }
      if (!seen.insert(path).second) continue;
      ModuleInfo info{path, p.modules[depth]};
      info.linear = info.type == "Linear";
      if (info.linear) {  // a Linear registers its weight [out, in] first
        info.out = p.shape[0];
        info.in = p.shape[1];
      }
      m.push_back(info);
    }
  }
  int64_t n = 0;
  for (size_t i : resolve_targets(m, config.targets)) n += config.rank * (m[i].in + m[i].out);
  return n;
}

}  // namespace forge::nn
