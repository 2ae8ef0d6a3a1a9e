// Name-driven group construction: parse block indices, decide each parameter's lr multiplier,
// decay and freezing, then merge parameters with equal settings into groups.
#include "optim/groups.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"

namespace forge::optim {
namespace {

template <class V>
void require(bool ok, const std::string& what, const V& value) {
  if (!ok) throw Error(ExitCode::usage, detail::concat("optimizer: ", what, ", got ", value));
}

}  // namespace

std::optional<int64_t> block_index(const std::string& name) {
  const std::string key = "blocks.";
  for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    size_t i = at + key.size(), end = i;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == i || end == name.size() || name[end] != '.' || end - i > 9) continue;
    return std::stoll(name.substr(i, end - i));
  }
  return std::nullopt;
}

LayerMap layer_map(const std::vector<NamedTensor>& params) {
  LayerMap map;
  std::vector<std::optional<int64_t>> index(params.size());
  size_t first_block = params.size();
  for (size_t i = 0; i < params.size(); ++i) {
    index[i] = block_index(params[i].name);
    if (!index[i]) continue;
    map.n_blocks = std::max(map.n_blocks, *index[i] + 1);
    first_block = std::min(first_block, i);
  }
  map.layer.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    map.layer[i] = index[i] ? *index[i] : i < first_block ? -1 : map.n_blocks;
  return map;
}

double layer_lr_mult(int64_t layer, int64_t n_blocks, double layer_lr_decay) {
  return std::pow(layer_lr_decay, -double(std::max<int64_t>(0, n_blocks - 1 - layer)));
}

int64_t unfreeze_step(int64_t layer, int64_t n_blocks, int64_t unfreeze_every) {
  return (n_blocks - layer) * unfreeze_every;
}

bool is_frozen(int64_t layer, int64_t step, int64_t n_blocks, int64_t unfreeze_every) {
  return step < unfreeze_step(layer, n_blocks, unfreeze_every);
}

std::vector<ParamGroup> build_param_groups(const std::vector<NamedTensor>& params,
                                           const GroupSpec& spec) {
  require(std::isfinite(spec.weight_decay) && spec.weight_decay >= 0, "weight_decay must be >= 0",
          spec.weight_decay);
  require(std::isfinite(spec.layer_lr_decay) && spec.layer_lr_decay >= 1,
          "layer_lr_decay must be >= 1 (the factor dividing the lr per block going down; 1 = off)",
          spec.layer_lr_decay);
  require(spec.unfreeze_every >= 0, "unfreeze_every must be >= 0", spec.unfreeze_every);
  LayerMap map = layer_map(params);
  if (spec.layer_lr_decay != 1.0 || spec.unfreeze_every > 0)
    require(map.n_blocks > 0,
            "layer_lr_decay and unfreeze_every need parameters named blocks.<i>.*, but none is",
            params.empty() ? std::string("no parameters") : "e.g. '" + params[0].name + "'");
  auto matches_any = [&](const std::string& pattern) {
    return std::any_of(params.begin(), params.end(),
                       [&](const NamedTensor& p) { return glob_match(pattern, p.name); });
  };
  for (const std::string& pattern : spec.freeze)
    require(matches_any(pattern), "freeze pattern matches no parameter", "'" + pattern + "'");
  for (const auto& [pattern, factor] : spec.lr_scale) {
    require(std::isfinite(factor) && factor > 0, "an lr scale must be > 0", factor);
    require(matches_any(pattern), "lr scale pattern matches no parameter", "'" + pattern + "'");
  }

  std::vector<ParamGroup> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    const NamedTensor& p = params[i];
    bool pinned = false;  // frozen by pattern, for the whole run
    for (const std::string& pattern : spec.freeze) pinned = pinned || glob_match(pattern, p.name);
    ParamGroup want;
    want.lr_mult = layer_lr_mult(map.layer[i], map.n_blocks, spec.layer_lr_decay);
    for (const auto& [pattern, factor] : spec.lr_scale)
      if (glob_match(pattern, p.name)) {
        want.lr_mult *= factor;
        break;
      }
    want.weight_decay = (p.tensor.dim() >= 2 || spec.decay_1d) ? spec.weight_decay : 0.0;
    want.trainable_from = pinned ? 0 : unfreeze_step(map.layer[i], map.n_blocks, spec.unfreeze_every);
    want.frozen = pinned || want.trainable_from > 0;
    if (want.frozen) {
      Tensor t = p.tensor;
      t.set_requires_grad(false);
      t.set_grad(Tensor());
    }
    ParamGroup* home = nullptr;
    for (ParamGroup& g : groups)
      if (g.lr_mult == want.lr_mult && g.weight_decay == want.weight_decay && g.frozen == want.frozen &&
          g.trainable_from == want.trainable_from)
        home = &g;
    if (!home) home = &groups.emplace_back(want);
    home->params.push_back(p);
  }
  return groups;
}

bool apply_unfreezing(std::vector<ParamGroup>& groups, int64_t step) {
  bool changed = false;
  for (ParamGroup& g : groups) {
    if (g.trainable_from <= 0) continue;
    bool frozen = step < g.trainable_from;
    if (frozen == g.frozen) continue;
    changed = true;
    g.frozen = frozen;
    for (NamedTensor& p : g.params) {
      p.tensor.set_requires_grad(!frozen);
      if (frozen) p.tensor.set_grad(Tensor());
    }
  }
  return changed;
}

}  // namespace forge::optim
