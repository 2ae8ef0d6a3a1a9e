// GPT: embeddings, pre-norm blocks, final norm and LM head, each layer initialised GPT-2 style as
// it is built; full-sequence forward (optionally checkpointing each block) and KV-cached
// incremental forward for generation.
#include "nn/gpt.h"

#include <cmath>
#include <string>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace forge::nn {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ExitCode::usage, "model config: " + message);
}

std::shared_ptr<UnaryModule> make_norm(const GPTConfig& c) {
  if (c.norm == NormType::rmsnorm) return std::make_shared<RMSNorm>(c.d_model, c.norm_eps);
  return std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.bias);
}

}  // namespace

void check_config(const GPTConfig& c) {
  auto str = [](auto v) { return std::to_string(v); };
  require(c.vocab_size > 0, "vocab_size must be positive, got " + str(c.vocab_size));
  require(c.context > 0, "context must be positive, got " + str(c.context));
  require(c.n_layers > 0, "n_layers must be positive, got " + str(c.n_layers));
  require(c.n_heads > 0, "n_heads must be positive, got " + str(c.n_heads));
  require(c.d_model > 0, "d_model must be positive, got " + str(c.d_model));
  require(c.head_dim > 0 || c.d_model % c.n_heads == 0,
          "d_model " + str(c.d_model) + " must be a multiple of n_heads " + str(c.n_heads) +
              " unless head_dim is given");
  require(c.head_dim >= 0, "head_dim must be >= 0, got " + str(c.head_dim));
  require(c.n_kv_heads >= 0 && c.n_heads % kv_heads(c) == 0,
          "n_kv_heads " + str(c.n_kv_heads) + " must divide n_heads " + str(c.n_heads));
  require(c.ffn_hidden >= 0, "ffn_hidden must be >= 0, got " + str(c.ffn_hidden));
  require(c.dropout >= 0.0 && c.dropout < 1.0, "dropout must be in [0, 1), got " + str(c.dropout));
  require(c.ffn_mult > 0 && std::llround(c.ffn_mult * double(c.d_model)) > 0,
          "ffn_mult must give a positive MLP width (ffn_mult * d_model >= 0.5), got " +
              str(c.ffn_mult) + " with d_model " + str(c.d_model));
  require(c.position != PositionType::rotary || head_dim(c) % 2 == 0,
          "rotary positions need an even head dimension, got " + str(head_dim(c)));
  require(c.rope_theta > 0.0, "rope_theta must be positive, got " + str(c.rope_theta));
  const RopeScaling& r = c.rope_scaling;
  require(r.type == RopeScalingType::none || r.factor >= 1.0,
          "rope_scaling.factor must be >= 1, got " + str(r.factor));
  require(r.type != RopeScalingType::llama3 ||
              (r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
               r.original_context > 0),
          "rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor and a positive "
          "original_context");
  require(c.norm_eps > 0.0, "norm_eps must be positive, got " + str(c.norm_eps));
  if (c.moe.every > 0) check_moe_config(c.moe);
}

int64_t kv_heads(const GPTConfig& c) { return c.n_kv_heads > 0 ? c.n_kv_heads : c.n_heads; }

int64_t head_dim(const GPTConfig& c) {
  return c.head_dim > 0 ? c.head_dim : c.d_model / c.n_heads;
}

int64_t mlp_hidden_size(const GPTConfig& c) {
  if (c.ffn_hidden > 0) return c.ffn_hidden;
  const int64_t hidden = std::llround(c.ffn_mult * double(c.d_model));
  if (c.mlp == MLPType::gelu) return hidden;
  const int64_t multiple = 8;
  return (2 * hidden / 3 + multiple - 1) / multiple * multiple;
}

MoELayerShape moe_layer_shape(const GPTConfig& c) {
  GPTConfig expert = c;
  expert.ffn_mult = c.moe.ffn_mult;
  expert.ffn_hidden = 0;
  return {.d_model = c.d_model,
          .hidden = mlp_hidden_size(expert),
          .swiglu = c.mlp == MLPType::swiglu,
          .bias = c.bias,
          .dropout = c.dropout,
          .init_std = kGPTInitStd,
          .proj_init_std = gpt_residual_init_std(c)};
}

namespace {

// Parameters of the model, an MoE layer's experts counted in full or as the top_k a token uses.
int64_t count_parameters(const GPTConfig& c, bool active) {
  int64_t n = 0;
  for (const ParameterShape& p : gpt_parameter_shapes(c)) {
    const int64_t numel = shape_numel(p.shape);
    n += active && p.expert ? numel / c.moe.n_experts * c.moe.top_k : numel;
  }
  return n;
}

}  // namespace

std::vector<ParameterShape> gpt_parameter_shapes(const GPTConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, h = mlp_hidden_size(c);
  const int64_t q_width = c.n_heads * head_dim(c), kv_width = kv_heads(c) * head_dim(c);
  std::vector<ParameterShape> out;
  std::vector<std::string> scope = {"GPT"};  // the types of the modules above the next parameter
  auto add = [&](std::string name, Shape shape, const char* module, bool expert = false) {
    std::vector<std::string> modules = scope;
    modules.push_back(module);
    out.push_back({std::move(name), std::move(shape), expert, std::move(modules)});
  };
  auto linear = [&](const std::string& path, int64_t in, int64_t o, bool bias) {
    add(path + ".weight", {o, in}, "Linear");
    if (bias) add(path + ".bias", {o}, "Linear");
  };
  auto norm = [&](const std::string& path) {
    const char* type = c.norm == NormType::layernorm ? "LayerNorm" : "RMSNorm";
    add(path + ".weight", {C}, type);
    if (c.norm == NormType::layernorm && c.bias) add(path + ".bias", {C}, type);
  };
  add("tok_emb.weight", {V, C}, "Embedding");
  if (c.position == PositionType::learned) add("pos_emb.weight", {c.context, C}, "Embedding");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l);
    scope = {"GPT", "ModuleList<Block>", "Block"};
    norm(b + ".ln1");
    scope.push_back("SelfAttention");
    const bool qkv_bias = c.bias || c.qkv_bias;
    if (c.fused_qkv) {
      linear(b + ".attn.qkv", C, q_width + 2 * kv_width, qkv_bias);
    } else {
      linear(b + ".attn.q", C, q_width, qkv_bias);
      linear(b + ".attn.k", C, kv_width, qkv_bias);
      linear(b + ".attn.v", C, kv_width, qkv_bias);
    }
    linear(b + ".attn.proj", q_width, C, c.bias);
    scope.pop_back();
    norm(b + ".ln2");
    const std::string m = b + ".mlp";
    const bool moe = is_moe_layer(c.moe, l);
    scope.push_back(moe ? "MoE" : "MLP");
    if (moe) {
      const MoELayerShape s = moe_layer_shape(c);
      const int64_t E = c.moe.n_experts;
      add(m + ".router.weight", {E, C}, "Router");
      if (c.moe.noisy) add(m + ".router.noise", {E, C}, "Router");
      auto experts = [&](const std::string& path, int64_t in, int64_t o) {
        add(path + ".weight", {E, o, in}, "GroupedLinear", true);
        if (s.bias) add(path + ".bias", {E, o}, "GroupedLinear", true);
      };
      if (s.swiglu) {
        experts(m + ".gate", C, s.hidden);
        experts(m + ".up", C, s.hidden);
      } else {
        experts(m + ".fc", C, s.hidden);
      }
      experts(m + ".proj", s.hidden, C);
    } else {
      if (c.mlp == MLPType::gelu) {
        linear(m + ".fc", C, h, c.bias);
      } else {
        linear(m + ".gate", C, h, c.bias);
        linear(m + ".up", C, h, c.bias);
      }
      linear(m + ".proj", h, C, c.bias);
    }
  }
  scope = {"GPT"};
  norm("ln_f");
  if (!c.tie_embeddings) linear("lm_head", C, V, false);
  return out;
}

int64_t gpt_num_parameters(const GPTConfig& c) { return count_parameters(c, false); }
int64_t gpt_active_parameters(const GPTConfig& c) { return count_parameters(c, true); }

NamedTensors unfuse_qkv(const NamedTensors& tensors, const GPTConfig& c) {
  const int64_t q = c.n_heads * head_dim(c), kv = kv_heads(c) * head_dim(c);
  const std::pair<const char*, int64_t> rows[] = {{"q", 0}, {"k", q}, {"v", q + kv}};
  const std::string fused = ".attn.qkv.";
  NamedTensors out;
  for (const NamedTensor& t : tensors) {
    const size_t at = t.name.find(fused);
    if (at == std::string::npos) {
      out.push_back(t);
      continue;
    }
    const std::string what = t.name.substr(at + fused.size());
    for (const auto& [part, begin] : rows) {
      const int64_t end = begin + (begin == 0 ? q : kv);
      Tensor rows_of = what == "lora_A" ? t.tensor : slice(t.tensor, 0, begin, end).contiguous();
      out.push_back({t.name.substr(0, at) + ".attn." + part + "." + what, rows_of});
    }
  }
  return out;
}

double gpt_residual_init_std(const GPTConfig& c) {
  return kGPTInitStd / std::sqrt(2.0 * double(c.n_layers));
}

MLP::MLP(const GPTConfig& c, Generator& gen) : type_(c.mlp) {
  const int64_t C = c.d_model, hidden = mlp_hidden_size(c);
  auto make_linear = [&](int64_t in, int64_t out, double init_std) {
    return std::make_shared<Linear>(in, out, c.bias, gen, init_std);
  };
  if (type_ == MLPType::gelu) {
    register_module("fc", make_linear(C, hidden, kGPTInitStd), fc);
  } else {
    register_module("gate", make_linear(C, hidden, kGPTInitStd), gate);
    register_module("up", make_linear(C, hidden, kGPTInitStd), up);
  }
  register_module("proj", make_linear(hidden, C, gpt_residual_init_std(c)), proj);
  drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
}

// x [B, T, C] -> [B, T, C]
Tensor MLP::forward(const Tensor& x) const {
  Tensor h = type_ == MLPType::gelu ? gelu(fc->forward(x), GeluApprox::tanh)
                                    : silu(gate->forward(x)) * up->forward(x);
  return drop->forward(proj->forward(h));
}

Block::Block(const GPTConfig& c, Generator& gen, int64_t layer, const RotaryTables* tables) {
  AttentionConfig a;
  a.d_model = c.d_model;
  a.n_heads = c.n_heads;
  a.n_kv_heads = kv_heads(c);
  a.head_dim = head_dim(c);
  a.context = c.context;
  a.dropout = c.dropout;
  a.bias = c.bias;
  a.qkv_bias = c.qkv_bias;
  a.fused_qkv = c.fused_qkv;
  a.rotary = c.position == PositionType::rotary;
  a.rope_theta = c.rope_theta;
  a.rope_scaling = c.rope_scaling;
  a.init_std = kGPTInitStd;
  a.proj_init_std = gpt_residual_init_std(c);
  register_module("ln1", make_norm(c), ln1);
  attn = register_module("attn", std::make_shared<SelfAttention>(a, gen, tables));
  register_module("ln2", make_norm(c), ln2);
  has_moe = is_moe_layer(c.moe, layer);
  if (has_moe)
    register_module("mlp", std::make_shared<MoE>(c.moe, moe_layer_shape(c), layer, gen), mlp);
  else
    register_module("mlp", std::make_shared<MLP>(c, gen), mlp);
}

Tensor Block::forward(const Tensor& x, KVCache* cache, size_t layer) const {
  Tensor h = x + attn->forward(ln1->forward(x), cache, layer);
  return h + mlp->forward(ln2->forward(h));
}

Tensor Block::forward(const Tensor& x, const PackedRows& packed) const {
  Tensor h = x + attn->forward(ln1->forward(x), packed);
  return h + mlp->forward(ln2->forward(h));
}

GPT::GPT(const GPTConfig& c, Generator& gen) : config_(c) {
  check_config(c);
  tok_emb = register_module(
      "tok_emb", std::make_shared<Embedding>(c.vocab_size, c.d_model, gen, kGPTInitStd));
  if (c.position == PositionType::learned)
    pos_emb = register_module(
        "pos_emb", std::make_shared<Embedding>(c.context, c.d_model, gen, kGPTInitStd));
  drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList<Block>>());
  RotaryTables tables;
  if (c.position == PositionType::rotary)
    tables = rotary_tables(c.context, head_dim(c), c.rope_theta, c.rope_scaling);
  const RotaryTables* shared = tables.cos.defined() ? &tables : nullptr;
  for (int64_t l = 0; l < c.n_layers; ++l)
    blocks->push_back(std::make_shared<Block>(c, gen, l, shared));
  register_module("ln_f", make_norm(c), ln_f);
  if (!c.tie_embeddings)
    register_module("lm_head",
                    std::make_shared<Linear>(c.d_model, c.vocab_size, false, gen, kGPTInitStd),
                    lm_head);
}

// ids [B, T] -> hidden [B, T, C] after ln_f; positions start at the cache's length, or are the
// packed rows' own.
Tensor GPT::hidden_states(const Tensor& ids, KVCache* cache, const PackedRows* packed) const {
  FORGE_CHECK(ids.dim() == 2 && ids.dtype() == DType::i64 && ids.size(1) > 0,
              "GPT: ids must be a non-empty [B, T] i64 tensor, got ", shape_str(ids.shape()), " ",
              dtype_name(ids.dtype()));
  const int64_t T = ids.size(1), pos0 = cache ? cache->length : 0;
  if (pos0 + T > config_.context)
    throw Error(ExitCode::usage, detail::concat("GPT: positions up to ", pos0 + T,
                                                " exceed the model context ", config_.context));
  if (packed)
    FORGE_CHECK(packed->positions.defined() && packed->positions.shape() == ids.shape() &&
                    packed->segments.defined() && packed->segments.shape() == ids.shape(),
                "GPT: packed positions and segments must be ", shape_str(ids.shape()),
                " like the ids");
  Tensor x = tok_emb->forward(ids);  // [B, T, C]
  if (pos_emb && packed)
    x = x + pos_emb->forward(packed->positions);  // [B, T, C]: positions within each record
  else if (pos_emb && cache && cache->padded())
    x = x + pos_emb->forward(cache->positions(T));  // [B, T, C]: each row's own positions
  else if (pos_emb)
    x = x + widened(slice(pos_emb->weight, 0, pos0, pos0 + T));  // [T, C] broadcasts over B
  x = drop->forward(x);
  for (size_t l = 0; l < blocks->size(); ++l) {
    const std::shared_ptr<Block>& block = (*blocks)[l];
    if (checkpointing_ && !cache && grad_enabled() && !block->has_moe) {
      // The recomputation runs in backward, after the caller's PackedRows is gone: hold a copy.
      x = checkpoint(
          [block, rows = packed ? *packed : PackedRows{}](const std::vector<Tensor>& in) {
            return rows.segments.defined() ? block->forward(in[0], rows) : block->forward(in[0]);
          },
          {x});
    } else if (packed) {
      x = block->forward(x, *packed);
    } else {
      x = block->forward(x, cache, l);
    }
  }
  return ln_f->forward(x);
}

Tensor GPT::head(const Tensor& hidden) const {
  return lm_head ? lm_head->forward(hidden) : linear(hidden, tok_emb->weight);
}

Tensor GPT::output(const Tensor& hidden, GPTOutput what) const {
  switch (what) {
    case GPTOutput::hidden: return hidden;
    case GPTOutput::last_logits: return head(slice(hidden, 1, hidden.size(1) - 1, hidden.size(1)));
    case GPTOutput::logits: break;
  }
  return head(hidden);
}

Tensor GPT::forward(const Tensor& ids, GPTOutput what) const {
  return output(hidden_states(ids, nullptr, nullptr), what);
}

Tensor GPT::forward(const Tensor& ids, const PackedRows& packed, GPTOutput what) const {
  return output(hidden_states(ids, nullptr, &packed), what);
}

KVCache GPT::make_cache(int64_t batch, int64_t capacity) const {
  return make_kv_cache(config_.n_layers, batch, kv_heads(config_),
                       capacity > 0 ? capacity : config_.context, head_dim(config_));
}

Tensor GPT::forward_incremental(const Tensor& ids_new, KVCache& cache, GPTOutput what) const {
  FORGE_CHECK(int64_t(cache.k.size()) == config_.n_layers, "GPT: cache has ", cache.k.size(),
              " layers, the model ", config_.n_layers, " (build it with make_cache)");
  NoGradGuard no_grad;
  Tensor out = output(hidden_states(ids_new, &cache, nullptr), what);
  cache.length += ids_new.size(1);
  return out;
}

}  // namespace forge::nn
