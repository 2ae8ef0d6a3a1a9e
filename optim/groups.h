// Building optimizer groups from parameter names (docs/architecture.md: names are the interface):
// weight decay or not, discriminative (layer-wise) learning rates, freezing by glob pattern,
// gradual unfreezing.
//
// Layers. A parameter named "blocks.<i>.*" (at the start of the name or after a '.', e.g.
// "encoder.blocks.3.attn.qkv.weight") is in block i; with L = 1 + the largest block index, a
// parameter without a block index is "below" (layer -1) when registered before the first block
// parameter (embeddings) and "above" (layer L) otherwise (final norm, head). The registration order
// is the order of the NamedTensors given, as nn's named_parameters() yields them.
//
// Discriminative learning rates (ULMFiT, Howard & Ruder 2018 §3.2): with decay D (e.g. 2.6), each
// block below the top divides the rate by D once more: block i gets lr_mult 1/D^(L-1-i), the
// embeddings 1/D^L, and everything above the blocks 1 (the same as the top block).
//
// Gradual unfreezing (ULMFiT §3.3), every N steps: at step 0 only the layers above the blocks
// train; at step k*N the top k blocks have been unfrozen as well (block i from step (L-i)*N), and
// the embeddings from step (L+1)*N on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/glob.h"
#include "optim/optimizer.h"

namespace forge::optim {

/// The `optimizer:` config keys that act on names.
struct GroupSpec {
  double weight_decay = 0.0;
  /// Decay 1-D tensors (biases, norm gains) too; by default only tensors with dim() >= 2 decay.
  bool decay_1d = false;
  /// The ULMFiT factor D >= 1 (config optimizer.layer_lr_decay): each layer going down trains at
  /// 1/D the rate of the layer above it (see above); 1 = off. Values below 1 are refused.
  double layer_lr_decay = 1.0;
  /// Glob patterns on names ('*' any run of characters, dots included; '?' one character):
  /// matching parameters never train.
  std::vector<std::string> freeze = {};
  /// 0 = off; otherwise unfreeze one more layer from the top every this many steps (see above).
  int64_t unfreeze_every = 0;
  /// (glob pattern, factor): a matching parameter's lr_mult is multiplied by the factor of the
  /// first pattern it matches, on top of its layer's; LoRA+ trains B this way
  /// (runtime/lora_config.h).
  std::vector<std::pair<std::string, double>> lr_scale = {};
};

/// i when the name contains "blocks.<i>." at its start or after a '.'.
std::optional<int64_t> block_index(const std::string& name);

/// Each parameter's layer (-1 below the blocks, i in block i, n_blocks above), in input order.
struct LayerMap {
  std::vector<int64_t> layer;
  int64_t n_blocks = 0;
};
LayerMap layer_map(const std::vector<NamedTensor>& params);

/// lr multiplier of a layer: decay^-max(0, n_blocks-1-layer), i.e. block i gets 1/D^(L-1-i), the
/// embeddings (layer -1) 1/D^L, and layers above the blocks 1.
double layer_lr_mult(int64_t layer, int64_t n_blocks, double layer_lr_decay);
/// First step at which a layer trains under gradual unfreezing: (n_blocks-layer)*unfreeze_every
/// (0 when unfreeze_every is 0).
int64_t unfreeze_step(int64_t layer, int64_t n_blocks, int64_t unfreeze_every);
/// Whether a layer is still frozen at `step` under gradual unfreezing.
bool is_frozen(int64_t layer, int64_t step, int64_t n_blocks, int64_t unfreeze_every);

/// fnmatch-style match of the whole name (core/glob.h; here for optim's callers).
using forge::glob_match;

/// Splits params into groups of equal (lr_mult, weight_decay, frozen, trainable_from), in order of
/// first appearance. Parameters frozen at step 0 (by pattern or by gradual unfreezing) get
/// requires_grad(false), so backward skips them. Throws Error(usage) for a bad value, a freeze or
/// lr_scale pattern that matches no parameter, or layer options without any "blocks.<i>."
/// parameter.
std::vector<ParamGroup> build_param_groups(const std::vector<NamedTensor>& params,
                                           const GroupSpec& spec);

/// Gradual unfreezing at `step` (call before each step's forward, also after a resume): every
/// group with trainable_from > 0 becomes frozen iff step < trainable_from, with requires_grad
/// following (a frozen group's gradients are dropped). Returns whether any group changed.
bool apply_unfreezing(std::vector<ParamGroup>& groups, int64_t step);

}  // namespace forge::optim
